"""Starting the tests' subprocesses (parallel_worker.py, the CLI's multi-process runs) on this checkout, and
watching one as it runs (``Child``): its output line by line, the files it writes, signals sent at given moments."""

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
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


def ppo_eqx(*args: str) -> list[str]:
    """The interpreter arguments that run ``ppo-eqx ARGS`` from this checkout (``Child``, ``run_child``)."""
    return ["-m", "ppo_eqx", *args]


def bench_script(name: str, *args: str) -> list[str]:
    """The interpreter arguments that run ``bench/NAME.py ARGS``."""
    return [str(ROOT / "bench" / f"{name}.py"), *args]


# Python started with SIGINT at its default, whatever this process has: a job run in the background ignores SIGINT,
# and a child inherits an ignored signal across exec (a handled one is reset). Then exec the real command line in
# the same process (same pid), where Python installs its own SIGINT handler as in a terminal.
_SIGINT_AT_DEFAULT = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])"
)
IMPORT_TIME = "import time:"
"""The lines that ``PYTHONPROFILEIMPORTTIME=1`` writes to stderr, one as each import completes (``Child.imports``)."""


class Child:
    """``python ARGS`` (``ppo_eqx(...)``, ``bench_script(...)``) in a session of its own with SIGINT at its default,
    its stdout and stderr read line by line as they come, so that a test can wait for a line or a file and then
    act (a signal, a second process) at that moment. Use as a context manager: a child still running at the end
    is killed.

    ``profile_imports``: the child writes a line per completed import to stderr (``PYTHONPROFILEIMPORTTIME``),
    which ``wait_for_import`` waits for; those lines are left out of ``err``.
    """

    def __init__(
        self,
        args: Sequence[str],
        *,
        env: dict[str, str] | None = None,
        cwd: Path = ROOT,
        profile_imports: bool = False,
    ):
        env = dict(worker_env() if env is None else env)
        if profile_imports:
            env["PYTHONPROFILEIMPORTTIME"] = "1"
        self.args = list(args)
        self.process = subprocess.Popen(
            [sys.executable, "-c", _SIGINT_AT_DEFAULT, *args],
            env=env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
            start_new_session=True,
        )
        self.out: list[str] = []
        self.err: list[str] = []
        self.imports: list[str] = []
        self._changed = threading.Condition()
        self._readers = [
            threading.Thread(target=self._read, args=(self.process.stdout, self.out), daemon=True),
            threading.Thread(target=self._read, args=(self.process.stderr, self.err), daemon=True),
        ]
        for reader in self._readers:
            reader.start()

    def _read(self, stream, lines: list[str]) -> None:
        for line in stream:
            with self._changed:
                line = line.rstrip("\n")
                if lines is self.err and line.startswith(IMPORT_TIME):
                    self.imports.append(line)
                else:
                    lines.append(line)
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    @property
    def pid(self) -> int:
        return self.process.pid

    def running(self) -> bool:
        return self.process.poll() is None

    def _log(self) -> str:
        """The end of the output so far, for a failure's message (call with ``_changed`` held, or after the end)."""
        return "\n".join(["--- stdout", *self.out, "--- stderr", *self.err])[-4000:]

    def wait_until(self, what: str, happened: Callable[[], bool], timeout: float = TIMEOUT_S) -> None:
        """Return once ``happened()`` is true (polled as output comes, and every 50 ms); AssertionError naming
        ``what`` if the child exits first or ``timeout`` seconds pass."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while not happened():
                if self.process.poll() is not None and not any(reader.is_alive() for reader in self._readers):
                    raise AssertionError(f"{what}: never, the process exited {self.process.returncode}\n{self._log()}")
                if time.monotonic() > deadline:
                    raise AssertionError(f"{what}: not within {timeout:.0f} s\n{self._log()}")
                self._changed.wait(0.05)

    def wait_for_line(self, text: str, *, stream: str = "out", timeout: float = TIMEOUT_S) -> None:
        """Until a line of stdout (``stream="err"``: stderr) holds ``text``."""
        lines = self.out if stream == "out" else self.err
        self.wait_until(f"a line with {text!r}", lambda: any(text in line for line in lines), timeout)

    def wait_for_import(self, module: str, timeout: float = TIMEOUT_S) -> None:
        """Until an import of ``module`` or of one of its submodules has completed (needs ``profile_imports``)."""

        def imported() -> bool:
            return any(line.rsplit("|", 1)[-1].strip().split(".")[0] == module for line in self.imports)

        self.wait_until(f"an import of {module}", imported, timeout)

    def wait_for_file(self, path: Path, timeout: float = TIMEOUT_S) -> None:
        self.wait_until(f"{path} to exist", path.exists, timeout)

    def send(self, signum: int) -> None:
        os.kill(self.pid, signum)

    def finish(self, timeout: float = TIMEOUT_S) -> int:
        """Wait for the child to exit (killing it after ``timeout`` seconds) and for its output; its exit status."""
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"{self.args} did not exit within {timeout:.0f} s\n{self._log()}") from None
        self._close()
        return self.process.returncode

    def _close(self) -> None:
        """Read the pipes to their end (they end with the process's session) and close them."""
        for reader in self._readers:
            reader.join(timeout=30)
        for stream in (self.process.stdout, self.process.stderr):
            if stream is not None:
                stream.close()

    def kill(self) -> None:
        """SIGKILL the child's whole session (it may have started processes of its own; a stopped process dies
        too) and reap it."""
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGKILL)
        self.process.wait(timeout=30)

    def __enter__(self) -> "Child":
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()
        self._close()


def run_child(
    args: Sequence[str], *, env: dict[str, str] | None = None, cwd: Path = ROOT, timeout: float = TIMEOUT_S
) -> tuple[int, list[str], list[str]]:
    """Run ``python ARGS`` as a ``Child`` to its end: (exit status, stdout lines, stderr lines)."""
    with Child(args, env=env, cwd=cwd) as child:
        code = child.finish(timeout)
        return code, child.out, child.err
