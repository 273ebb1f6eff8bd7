"""What ``ppo-eqx train`` spends before its first iteration, part by part (issue 50): the interpreter's start, the
imports, the checks of the plan, the devices, the run directory, the writers, the envs and first state, the compile.
The supervised run prints it once compiled. No jax here."""

import os
import time
from pathlib import Path

PARTS = {
    "python": "python",
    "flags": "flags",
    "imports": "imports",
    "plan": "checks",
    "devices": "devices",
    "run_dir": "run directory",
    "writers": "writers",
    "trainer": "envs and first state",
    "compile": "compile",
}
"""The parts, in order, and how the line names them."""


def process_age(stat: Path = Path("/proc/self/stat"), uptime: Path = Path("/proc/uptime")) -> float:
    """Seconds since this process started (Linux's ``/proc``: its start in clock ticks after boot, beside the
    uptime); 0.0 where they cannot be read."""
    try:
        start_ticks = int(stat.read_text().rsplit(")", 1)[1].split()[19])
        return max(0.0, float(uptime.read_text().split()[0]) - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return 0.0


class Stopwatch:
    """Laps of one command: ``lap(part)`` adds the time since the last lap to ``part`` (a key of ``PARTS``)."""

    def __init__(self) -> None:
        self.restart()

    def restart(self) -> None:
        """From now on, with the interpreter's start before it as the part ``python`` (0 where it is not this
        process's start: a command run again in one process)."""
        self.parts: dict[str, float] = {}
        self.last = time.perf_counter()

    def started_with_process(self) -> None:
        self.parts["python"] = process_age()

    def lap(self, part: str) -> None:
        if part not in PARTS:
            raise ValueError(f"part={part!r}; allowed: {', '.join(PARTS)}")
        now = time.perf_counter()
        self.parts[part] = self.parts.get(part, 0.0) + now - self.last
        self.last = now

    def seconds(self) -> dict[str, float]:
        """Each part's seconds, in ``PARTS``'s order, and their sum as ``total``."""
        ordered = {part: self.parts[part] for part in PARTS if part in self.parts}
        return {**ordered, "total": sum(ordered.values())}

    def line(self) -> str:
        """``first iteration after 12.3 s: python 0.4, flags 0.1, ...``."""
        seconds = self.seconds()
        parts = ", ".join(f"{PARTS[part]} {value:.1f}" for part, value in seconds.items() if part != "total")
        return f"first iteration after {seconds['total']:.1f} s: {parts}"


STARTUP = Stopwatch()
"""The stopwatch of the command this process runs (``command_line.main`` restarts it)."""
