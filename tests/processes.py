"""Starting the tests' subprocesses (parallel_worker.py, the CLI's multi-process runs) on this checkout."""

import os
import socket
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_S = 180


def worker_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["JAX_PLATFORMS"] = "cpu"
    return env


def run_processes(
    commands: list[list[str]],
    env: dict[str, str] | None = None,
    *,
    codes: tuple[int, ...] = (),
    timeout: float = TIMEOUT_S,
) -> list[str]:
    """Start every command at once (in ``env``, default ``worker_env()``), wait for all of them (killing any
    still running after ``timeout`` seconds), check their exit codes (``codes``, default all 0); their
    outputs."""
    running = [
        subprocess.Popen(
            command,
            env=worker_env() if env is None else env,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for command in commands
    ]
    try:
        logs = [process.communicate(timeout=timeout)[0] for process in running]
    finally:
        for process in running:
            if process.poll() is None:
                process.kill()
                process.wait(timeout=30)
    for process, log, code in zip(running, logs, codes or (0,) * len(running), strict=True):
        assert process.returncode == code, log[-4000:]
    return logs


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
