"""Ctrl-C and SIGTERM from the first moment of ``ppo-eqx``: installed by ``entry_point`` before anything heavy is
imported, a handler that never raises (a KeyboardInterrupt raised inside an import, a compile or one of jax's
callbacks prints a traceback, or is swallowed by a gc callback). No jax here.

Until a command has something to lose (``EARLY.defer()``), a signal ends the process at once with one line: nothing
was written. While a command writes what must not be cut short (taking the run directory, eval's results), the
signal is only recorded, and the command acts on it when it can (``EARLY.pending()``). The ``Supervisor`` of a
training run then installs its own handler (stop after the iteration under way, with a checkpoint).
"""

import os
import signal
import sys
from types import FrameType

SIGNALS = (signal.SIGINT, signal.SIGTERM)


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
