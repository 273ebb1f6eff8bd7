"""The ``ppo-eqx`` program: its flags, the ``train`` and ``eval`` commands, the supervised run (signals,
writers, checkpoints) and what it writes besides checkpoints. Built on ``ppo_eqx.host``; the library never
imports it. Importing this package imports nothing else: ``entry_point`` handles Ctrl-C before the flags' module
(and jax, which only the commands import) is loaded."""

import signal
import sys
from collections.abc import Sequence


def entry_point() -> None:
    """``ppo-eqx``: Ctrl-C and the other stopping signals are handled first (``interrupts.EARLY``), then the command
    runs."""
    from .interrupts import EARLY, SIGNALS
    from .stopwatch import STARTUP

    EARLY.install()
    STARTUP.restart()
    STARTUP.started_with_process()
    from .command_line import main

    code = main()
    # A Ctrl-C from here on would interrupt jax's exit hooks with a traceback: the run is over, ignore it.
    for sig in SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    sys.exit(code)


def main(argv: Sequence[str] | None = None) -> int:
    """``ppo-eqx ARGV`` in this process (``command_line.main``): its exit status."""
    from .command_line import main as run
    from .stopwatch import STARTUP

    STARTUP.restart()
    return run(argv)
