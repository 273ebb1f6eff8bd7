"""The run directory's file names and layout, the atomic write and bounded reads (every write of a run goes
through ``run_directory.RunDirectory``; which paths a command may write, ``ownership``). No jax here: files and
paths only.

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
``.ppo-eqx-manifest.jsonl`` (what the run wrote, which ``--overwrite`` deletes), both kept by ``ownership.py``.
Every one of these names, with ``.NAME.tmp`` (the temporary of an atomic write), is the run's: no other command of
ppo-eqx writes it (``written_name``).

A run of several agents (``--num-seeds S``, ``--sweep``) holds ``seeds.json`` (its config) instead of
``config.json``, the checkpoints of all agents, and one such directory per agent: ``seedK/``, or under a sweep
``SETTING/seedK/`` with the setting written as its flags (``learning-rate=0.001,ent-coef=0.01/seed1/``). Those are
the runs that readers of run directories find.
"""

import json
import os
import re
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import RunDirError

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
"""The run directory's bookkeeping (``ownership``): never deleted, never listed as the user's."""

RUN_FILES = (CONFIG, HARDWARE, METRICS, SUMMARY, EVAL, WANDB)
"""The files a run writes at its top (besides TensorBoard's events and the checkpoints)."""
MARKERS = (CONFIG, SEEDS_CONFIG, METRICS, CHECKPOINT_DIR)
"""Any of these makes a directory hold a run (which a new run must not write into unless told to)."""
EVENTS = re.compile(r"events\.out\.tfevents\..+")
"""TensorBoard's events files (``TENSORBOARD_GLOB``)."""
CHECKPOINT_FILE = re.compile(r"iter_\d{6,}\.(eqx|json)")
"""A checkpoint's two files in ``checkpoints/``."""


def _base_name(name: str) -> str:
    """``name``, or the name whose temporary it is (``.NAME.tmp``: ``write_whole``'s)."""
    return name[1:-4] if name.startswith(".") and name.endswith(".tmp") and len(name) > 5 else name


def written_name(name: str) -> bool:
    """Whether ``name``, at the top of a run's (or an agent's) directory, is one ppo-eqx writes there: a run file,
    ``seeds.json``, TensorBoard's events, ``checkpoints/``, ``wandb/``, the bookkeeping, or a temporary of one."""
    base = _base_name(name)
    return base in (*RUN_FILES, SEEDS_CONFIG, CHECKPOINT_DIR, WANDB_DIR, *BOOKKEEPING) or bool(EVENTS.fullmatch(base))


def written_checkpoint_name(name: str) -> bool:
    """Whether ``name``, inside ``checkpoints/``, is one ppo-eqx writes there (a checkpoint file or its temporary)."""
    return bool(CHECKPOINT_FILE.fullmatch(_base_name(name)))


def read_bounded(path: Path, limit: int, error: type[Exception], name: str) -> bytes:
    """The bytes of the file ``path`` as untrusted input: at most ``limit`` of them plus one (so that a longer file
    shows as longer: the caller compares), never through a link at its end or from a FIFO; ``error`` naming
    ``name`` for anything else than a missing file (FileNotFoundError)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        raise
    except OSError as problem:
        raise error(f"cannot read {name}: {problem.strerror}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise error(f"cannot read {name}: it is not a regular file")
        chunks, left = [], limit + 1
        while left and (chunk := os.read(fd, min(left, 2**24))):
            chunks.append(chunk)
            left -= len(chunk)
    except OSError as problem:
        raise error(f"cannot read {name}: {problem.strerror}") from None
    finally:
        os.close(fd)
    return b"".join(chunks)


def agent_dirs(run_dir: Path, names: Sequence[str]) -> list[Path]:
    """Where each agent's run is written: ``run_dir`` itself for one agent, else ``run_dir/NAME`` for each of the
    agents' names (``PPOConfig.agent_names``: ``seedK``, ``SETTING/seedK``)."""
    if len(names) == 1:
        return [run_dir]
    return [run_dir / name for name in names]


def holds_run(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds (part of) a run: any of ``MARKERS``."""
    return run_dir.is_dir() and any((run_dir / name).exists() for name in MARKERS)


def _listed(iterations: Sequence[int]) -> str:
    shown = ", ".join(map(str, iterations[:5]))
    return shown + (f", ... ({len(iterations)} rows)" if len(iterations) > 5 else "") if iterations else "none"


def checked_metrics(path: Path, last_iteration: int) -> list[str]:
    """The lines of ``metrics.jsonl`` that a run resumed from its checkpoint of ``last_iteration`` keeps: the rows
    of iterations 1 .. ``last_iteration``, each once and in order. What a kill or a copy can leave is repaired
    (a line cut short or not JSON, rows after the checkpoint, a row repeated, rows out of order); a row that is
    missing, or two different rows of one iteration, cannot be: RunDirError, as resuming would extend a history
    with a gap or a row of another run. Reads only."""
    rows: dict[int, dict[str, Any]] = {}
    lines: dict[int, str] = {}
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        text = None
    except OSError as error:
        raise RunDirError(f"cannot read {path}: {error.strerror}") from None
    if text is None and last_iteration:
        raise RunDirError(
            f"{path} is missing; resuming would leave iterations 1 .. {last_iteration} without metrics: restore it "
            "or --overwrite"
        )
    for line in (text or "").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        iteration = row.get("iteration") if isinstance(row, dict) else None
        if not isinstance(iteration, int) or not 1 <= iteration <= last_iteration:
            continue
        if iteration in rows and rows[iteration] != row:
            raise RunDirError(
                f"{path} holds two different rows of iteration {iteration}; resuming would keep a row of another "
                "run: restore it or --overwrite"
            )
        rows[iteration], lines[iteration] = row, line
    missing = [i for i in range(1, last_iteration + 1) if i not in rows]
    if missing:
        raise RunDirError(
            f"{path} lacks iteration {missing[0]} (it has {_listed(sorted(rows))}); resuming would leave a gap: "
            "restore it or --overwrite"
        )
    return [lines[i] + "\n" for i in range(1, last_iteration + 1)]
