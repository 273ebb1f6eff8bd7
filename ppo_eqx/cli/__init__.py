"""The ``ppo-eqx`` program: its flags, the ``train`` and ``eval`` commands, the supervised run (signals,
writers, checkpoints) and what it writes besides checkpoints. Built on ``ppo_eqx.host``; the library never
imports it."""

from .main import entry_point as entry_point
from .main import main as main
