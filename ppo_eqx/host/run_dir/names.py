"""The run directory's file names and layout (every write of a run goes through ``directory.RunDirectory``;
which names are a run's, ``manifest.written_name``; which paths a command may write, ``take``). No jax here:
names and paths only.

Layout of ``RUN_DIR`` (one agent)::

    config.json       the PPOConfig of the run
    hardware.json     the machine, package versions and the convolutions' route (conv_impl)
    metrics.jsonl     one JSON object per iteration
    summary.json      written when the run finishes
    events.out.tfevents.*   TensorBoard
    checkpoints/      iter_NNNNNN.eqx (arrays) beside iter_NNNNNN.json (metadata)
    eval.json         written by ``ppo-eqx eval``
    wandb.json        the Weights & Biases run id, with --track

and the run's bookkeeping, hidden: ``.ppo-eqx.lock`` (who trains there: the lock itself is on the directory) and
``.ppo-eqx-manifest.jsonl`` (what the run wrote, which ``--overwrite`` deletes): ``lock.py``'s and
``manifest.py``'s. Every one of these names, with ``.NAME.tmp`` (the temporary of an atomic write), is the run's: no
other command of ppo-eqx writes it (``manifest.written_name``).

A run of several agents (``--num-seeds S``, ``--sweep``) holds ``seeds.json`` (its config) instead of
``config.json``, the checkpoints of all agents, and one such directory per agent: ``seedK/``, or under a sweep
``SETTING/seedK/`` with the setting written as its flags (``learning-rate=0.001,ent-coef=0.01/seed1/``). Those are
the runs that readers of run directories find.
"""

import re
from collections.abc import Sequence
from pathlib import Path

CONFIG = "config.json"
SEEDS_CONFIG = "seeds.json"
HARDWARE = "hardware.json"
METRICS = "metrics.jsonl"
SUMMARY = "summary.json"
EVAL = "eval.json"
WANDB = "wandb.json"
CHECKPOINT_DIR = "checkpoints"
TENSORBOARD_GLOB = "events.out.tfevents.*"

WANDB_DIR = "wandb"
LOCK = ".ppo-eqx.lock"
MANIFEST = ".ppo-eqx-manifest.jsonl"
BOOKKEEPING = (LOCK, MANIFEST)
"""The run directory's bookkeeping (``lock``, ``manifest``): never deleted, never listed as the user's."""

RUN_FILES = (CONFIG, HARDWARE, METRICS, SUMMARY, EVAL, WANDB)
"""The files a run writes at its top (besides TensorBoard's events and the checkpoints)."""
MARKERS = (CONFIG, SEEDS_CONFIG, METRICS, CHECKPOINT_DIR)
"""Any of these makes a directory hold a run (which a new run must not write into unless told to)."""
EVENTS = re.compile(r"events\.out\.tfevents\..+")
"""TensorBoard's events files (``TENSORBOARD_GLOB``)."""
CHECKPOINT_FILE = re.compile(r"iter_\d{6,}\.(eqx|json)")
"""A checkpoint's two files in ``checkpoints/``."""


def agent_dirs(run_dir: Path, names: Sequence[str]) -> list[Path]:
    """Where each agent's run is written: ``run_dir`` itself for one agent, else ``run_dir/NAME`` for each of the
    agents' names (``PPOConfig.agent_names``: ``seedK``, ``SETTING/seedK``)."""
    if len(names) == 1:
        return [run_dir]
    return [run_dir / name for name in names]
