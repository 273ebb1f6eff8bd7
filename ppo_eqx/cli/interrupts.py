"""Ctrl-C (SIGINT), SIGTERM, SIGHUP and SIGUSR1 from the first moment of ``ppo-eqx``: installed by
``entry_point`` before anything heavy is imported, a handler that never raises (a KeyboardInterrupt raised inside an
import, a compile or one of jax's callbacks prints a traceback, or is swallowed by a gc callback). No jax here.

Until a command has something to lose (``EARLY.defer()``), a signal ends the process at once with one line: nothing
was written. While a command writes what must not be cut short (taking the run directory, eval's results), the
signal is only recorded, and the command acts on it when it can (``EARLY.pending()``). The ``Supervisor`` of a
training run then installs its own handler (stop after the iteration under way, with a checkpoint).
"""

import contextlib
import os
import signal
import sys
from types import FrameType
from typing import Any

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1)
"""What stops a run as Ctrl-C does: SIGHUP (a closed terminal or ssh session) and SIGUSR1 too, whose default would
end the process with nothing said (a ``.eqx`` written without its ``.json``)."""


def exit_status(signum: int) -> int:
    """The exit status of a process stopped by ``signum`` (130 for SIGINT, 143 for SIGTERM), as a shell reports it."""
    return 128 + signum


class EarlyStop:
    def __init__(self) -> None:
        self.installed = False
        self.deferring = False
        self.signum: int | None = None

    def install(self) -> None:
        for sig in SIGNALS:
            signal.signal(sig, self)
        self.installed = True

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        if self.deferring:
            self.signum = self.signum or signum
            return
        print(f"ppo-eqx: stopped by {signal.Signals(signum).name}; nothing was written", file=sys.stderr, flush=True)
        os._exit(exit_status(signum))

    def defer(self) -> None:
        """From now on record a signal instead of ending the process (nothing happens where not installed: a
        command called as a function, in a test)."""
        self.deferring = True

    def pending(self) -> str | None:
        """The name of the signal recorded since ``defer``, if any."""
        return None if self.signum is None else signal.Signals(self.signum).name


EARLY = EarlyStop()


def say(line: str, *, stream: Any = None) -> None:
    """Print ``line`` (to stdout by default) and flush it. Output that fails (a closed pipe: ``ppo-eqx train | head``,
    a full disk under a redirect) never stops training: that stream is pointed at ``/dev/null`` from then on (so that
    Python's flush at exit finds nothing to complain of), and what was said is in the run's files."""
    stream = stream or sys.stdout
    if stream is None:  # no stdout at all (pythonw)
        return
    try:
        print(line, file=stream, flush=True)
    except (OSError, ValueError):  # BrokenPipeError, ENOSPC; ValueError: a stream already closed
        with contextlib.suppress(OSError, ValueError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, stream.fileno())
            os.close(devnull)
