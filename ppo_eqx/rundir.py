"""The run directory's one owner: its file names and layout, the atomic write, and the error for a run
directory that is refused or damaged. Imports nothing heavier than the standard library (``ppo-eqx --help``
and the benchmark report read it without jax).

Layout of ``RUN_DIR`` (one agent)::

    config.json       the PPOConfig of the run
    hardware.json     the machine and package versions
    metrics.jsonl     one JSON object per iteration
    summary.json      written when the run finishes
    events.out.tfevents.*   TensorBoard
    checkpoints/      iter_NNNNNN.eqx (arrays) beside iter_NNNNNN.json (metadata)
    eval.json         written by ``ppo-eqx eval``
    wandb.json        the Weights & Biases run id, with --track

A ``--num-seeds S`` run holds ``seeds.json`` (its config) instead of ``config.json``, and one such directory
per agent, ``seedK/``: those are the runs that readers of run directories find.
"""

import json
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

CONFIG = "config.json"
SEEDS_CONFIG = "seeds.json"
HARDWARE = "hardware.json"
METRICS = "metrics.jsonl"
SUMMARY = "summary.json"
EVAL = "eval.json"
WANDB = "wandb.json"
CHECKPOINT_DIR = "checkpoints"
TENSORBOARD_GLOB = "events.out.tfevents.*"
AGENT_PREFIX = "seed"

RUN_FILES = (CONFIG, HARDWARE, METRICS, SUMMARY, EVAL, WANDB)
"""The files a run writes at its top (besides TensorBoard's events and the checkpoints)."""
MARKERS = (CONFIG, SEEDS_CONFIG, METRICS, CHECKPOINT_DIR)
"""Any of these makes a directory hold a run (which a new run must not write into unless told to)."""


class RunDirError(ValueError):
    """A run directory that is refused (exists, unwritable, a file) or damaged; the message is one line."""


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to a temporary file beside ``path``, fsync it and rename it over ``path``; on any failure
    remove the temporary file and leave ``path`` as it was. A crash leaves the old file or the new one."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def json_bytes(data: Any) -> bytes:
    """``data`` as the JSON the run directory holds (indented, no NaN: a ValueError before anything is written)."""
    return (json.dumps(data, indent=2, allow_nan=False) + "\n").encode()


def write_json(path: Path, data: Any) -> None:
    """Write ``data`` as JSON atomically (``write_atomic``)."""
    write_atomic(path, json_bytes(data))


def agent_dirs(run_dir: Path, seeds: Sequence[int]) -> list[Path]:
    """Where each agent's run is written: ``run_dir`` itself for one seed, else ``run_dir/seedK`` for seed K."""
    if len(seeds) == 1:
        return [run_dir]
    return [run_dir / f"{AGENT_PREFIX}{seed}" for seed in seeds]


def holds_run(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds (part of) a run: any of ``MARKERS``."""
    return run_dir.is_dir() and any((run_dir / name).exists() for name in MARKERS)


def clear_run(run_dir: Path) -> None:
    """Delete everything a run wrote in ``run_dir`` (agents' directories too); other files stay."""
    for name in (*RUN_FILES, SEEDS_CONFIG):
        (run_dir / name).unlink(missing_ok=True)
    for events in run_dir.glob(TENSORBOARD_GLOB):
        events.unlink()
    shutil.rmtree(run_dir / CHECKPOINT_DIR, ignore_errors=True)
    for agent in run_dir.glob(f"{AGENT_PREFIX}*"):
        if agent.is_dir() and agent.name[len(AGENT_PREFIX) :].isdigit() and holds_run(agent):
            clear_run(agent)
            if not any(agent.iterdir()):
                agent.rmdir()


def truncate_metrics(path: Path, last_iteration: int) -> int:
    """Keep the rows of ``metrics.jsonl`` up to ``last_iteration`` (and none that a kill cut short); atomic.

    Returns the number of rows kept.
    """
    kept = []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(row, dict) and isinstance(row.get("iteration"), int) and row["iteration"] <= last_iteration:
                kept.append(line + "\n")
    write_atomic(path, "".join(kept).encode())
    return len(kept)
