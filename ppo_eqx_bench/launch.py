"""Starting ``ppo-eqx train`` as a child process of a bench script (``bench/atari57.py``, ``bench/learning_curve.py``):
the command, the child's environment, and SIGINT/SIGTERM passed on so that the trainer stops after its iteration,
checkpointed."""

import os
import signal
import subprocess
import sys
from pathlib import Path
from types import FrameType

REPO_ROOT = Path(__file__).resolve().parents[1]


def train_command() -> list[str]:
    """``ppo-eqx`` as this interpreter runs it: ``python -m ppo_eqx``."""
    return [sys.executable, "-m", "ppo_eqx"]


def child_env(jobs: int = 1) -> dict[str, str]:
    """The child imports this checkout's ppo_eqx, as the script does; with several runs on one GPU, each JAX
    process preallocates its share of the memory instead of JAX's default 75% (unless the caller chose)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    if jobs > 1 and "XLA_PYTHON_CLIENT_MEM_FRACTION" not in env and "XLA_PYTHON_CLIENT_PREALLOCATE" not in env:
        env["XLA_PYTHON_CLIENT_MEM_FRACTION"] = f"{0.9 / jobs:.3f}"
    return env


class StopRequest:
    """SIGINT or SIGTERM: remember it (``signum``); the caller stops starting runs and passes it on."""

    def __init__(self) -> None:
        self.signum: int | None = None

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        self.signum = signum


def run_to_end(arguments: list[str]) -> int:
    """Run ``ppo-eqx ARGUMENTS`` in the foreground and return its exit status.

    The child runs in its own session: each SIGINT or SIGTERM this process gets is passed on once (the trainer
    stops after its iteration at the first, at once at the second), never twice, by the terminal and by us.
    Raises OSError when it cannot start.
    """
    process = subprocess.Popen([*train_command(), *arguments], env=child_env(), start_new_session=True)

    def forward(signum: int, frame: FrameType | None) -> None:
        if process.poll() is None:
            process.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        return process.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
