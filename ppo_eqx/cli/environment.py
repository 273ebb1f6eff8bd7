"""The environment variables that jax and XLA read, checked before anything is written or read as a checkpoint,
each failure one line naming the variable (exit 2). No jax at the top: ``main`` starts the probe before it imports
a command.

``XLA_FLAGS`` is parsed by XLA's C++ when jax makes its first backend, and a bad flag ends the process there
(``abort``, XLA's own lines on stderr): no Python code can catch it. So when ``XLA_FLAGS`` is set, a short child
(``import jax; jax.devices()``, on the CPU backend) makes a backend first (``XlaFlagsProbe``); it runs while this
process imports jax and plans the run, and is waited for before this process makes its own backend. About a
second of CPU, only when ``XLA_FLAGS`` is set and this process has no backend yet.

``JAX_PLATFORMS`` that names a platform this machine lacks makes jax raise on its first backend use (a bare
``AssertionError`` for ``cuda`` without an NVIDIA GPU): ``check_backend`` makes that use, once, and refuses.
"""

import math
import os
import re
import subprocess
import sys
from typing import Any

from ..errors import UsageError

PROBE_TIMEOUT_S = 120.0
_XLA_LINE = re.compile(r"^([EF])\d{4} [\d:.]+\s+\d+ [\w.]+:\d+\] (.*)$")
"""A line that XLA's logging writes: severity, date, time, thread, file:line, message."""


def _backend_started() -> bool:
    """Whether jax has made its backends in this process already (then XLA_FLAGS has been parsed and accepted)."""
    if "jax" not in sys.modules:
        return False
    from jax._src import xla_bridge

    return xla_bridge.backends_are_initialized()


def _refusal(output: str) -> str:
    """What XLA said about XLA_FLAGS: its first error line, else its fatal one, else the last line."""
    found = {}
    for line in output.splitlines():
        match = _XLA_LINE.match(line.strip())
        if match:
            found.setdefault(match.group(1), match.group(2))
    lines = [line for line in output.splitlines() if line.strip()]
    return found.get("E") or found.get("F") or (lines[-1] if lines else "it ended the process")


class XlaFlagsProbe:
    """``XLA_FLAGS`` tried in a child process (started at once; ``check`` waits for it)."""

    def __init__(self) -> None:
        self.flags = os.environ.get("XLA_FLAGS")
        self._child: subprocess.Popen[str] | None = None
        if self.flags and not _backend_started():
            self._child = subprocess.Popen(
                [sys.executable, "-c", "import jax; jax.devices()"],
                env={**os.environ, "JAX_PLATFORMS": "cpu"},
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
                errors="replace",
            )

    def check(self) -> None:
        """UsageError when XLA refused the flags (a probe that does not end in time is not held against them)."""
        child, self._child = self._child, None
        if child is None:
            return
        try:
            _, err = child.communicate(timeout=PROBE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            child.kill()
            child.communicate()
            return
        if child.returncode != 0:
            raise UsageError(f"XLA_FLAGS={self.flags!r}: XLA refused it: {_refusal(err)}; fix it or unset XLA_FLAGS")

    def close(self) -> None:
        """End the probe if the command ended before it needed the answer."""
        if self._child is not None:
            self._child.kill()
            self._child.communicate()
            self._child = None


def check_backend(probe: XlaFlagsProbe) -> None:
    """Make jax's backends now (after ``probe`` said XLA_FLAGS is good), or UsageError naming JAX_PLATFORMS."""
    probe.check()
    import jax

    try:
        jax.devices()
    except (RuntimeError, AssertionError) as error:
        platforms = os.environ.get("JAX_PLATFORMS") or os.environ.get("JAX_PLATFORM_NAME")
        reason = (str(error).splitlines() or [""])[0].split(" (set JAX_PLATFORMS")[0]
        if platforms:
            reason = reason or f"none of {platforms} is usable here (no such device is visible)"
            raise UsageError(
                f"JAX_PLATFORMS={platforms}: jax cannot start a backend: {reason}; unset JAX_PLATFORMS or set it to "
                "a platform this machine has (cpu)"
            ) from None
        raise UsageError(f"jax cannot start a backend: {reason or type(error).__name__}") from None


SEQUENTIAL_SCHEDULER = "--xla_cpu_enable_concurrency_optimized_scheduler=false"
"""XLA:CPU scheduling the ops of a program for sequence rather than concurrency (the same results, bit for bit)."""
SMALL_JAX_ENVS = ("CartPole-v1", "Acrobot-v1")
"""gymnax's vector tasks: their 64-64 MLPs and 4 envs make ops of microseconds."""
SMALL_PROGRAM_AGENTS = 2


def schedule_small_programs(args: Any) -> str | None:
    """For ``ppo-eqx train`` of one or two agents on a gymnax vector task (its whole run compiled as programs of
    microsecond ops), add ``SEQUENTIAL_SCHEDULER`` to ``XLA_FLAGS`` before jax makes its backend; returns the
    ``XLA_FLAGS`` to put back when the command ends (``restore_xla_flags``; None: nothing was changed).

    XLA:CPU's concurrency-optimised scheduler spreads independent ops (the actor's and the critic's) over the
    threads; for ops this small the hand-offs cost more than they overlap. On a 2-core Xeon CartPole-v1's 500k
    steps ran in 2.7 s instead of 3.6 s with one agent and 5.3 s instead of 6.1 s with two, to the same bits; with
    four agents (9.3 s against 9.7 s) and MinAtar's 2 x 256 MLPs (12.0 s against 15.6 s) the default is faster
    (docs/performance.md, "Scheduling small programs"). A user's own XLA_FLAGS that name the scheduler win; a
    resumed run (its flags are in its run directory, not here) keeps XLA's default.
    """
    flags = os.environ.get("XLA_FLAGS")
    if args.command != "train" or args.resume is not None or _backend_started():
        return None
    if args.env_backend != "gymnax" or args.env_id not in SMALL_JAX_ENVS:
        return None
    agents = math.prod(len(values) for _, values in args.sweep or ()) * (args.num_seeds or 1)  # PPOConfig.num_agents
    if agents > SMALL_PROGRAM_AGENTS or "concurrency_optimized_scheduler" in (flags or ""):
        return None
    os.environ["XLA_FLAGS"] = f"{flags} {SEQUENTIAL_SCHEDULER}" if flags else SEQUENTIAL_SCHEDULER
    return flags or ""


def restore_xla_flags(flags: str | None) -> None:
    """Put back the ``XLA_FLAGS`` that ``schedule_small_programs`` returned ("" : there were none)."""
    if flags is None:
        return
    if flags:
        os.environ["XLA_FLAGS"] = flags
    else:
        os.environ.pop("XLA_FLAGS", None)
