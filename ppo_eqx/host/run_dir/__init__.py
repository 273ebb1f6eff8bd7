"""The run directory, one room: everything that decides what a run may write where, and writes it. A straight stack,
each module importing only those above it:

    names      the files of a run and their layout
    lock       one owner at a time (``RunLock``)
    manifest   what a run wrote, read as untrusted input
    directory  the one object every write goes through (``RunDirectory``)
    take       which paths a command may write; a new run's directory taken

No jax here: files only. Its users outside import what follows from here.
"""

from .directory import RunDirectory, json_bytes, write_json
from .lock import RunLock, refuse_if_held
from .manifest import check_resumed_dirs, never_trained, read_manifest, refuse_strangers
from .names import CHECKPOINT_DIR, CONFIG, EVAL, HARDWARE, MANIFEST, METRICS, SEEDS_CONFIG, SUMMARY, WANDB, agent_dirs
from .take import check_output, check_run_dirs, free_name, is_eval_result, path_problem, take_new_run

__all__ = [
    "CHECKPOINT_DIR", "CONFIG", "EVAL", "HARDWARE", "MANIFEST", "METRICS", "SEEDS_CONFIG", "SUMMARY", "WANDB",
    "RunDirectory", "RunLock", "agent_dirs", "check_output", "check_resumed_dirs", "check_run_dirs", "free_name",
    "is_eval_result", "json_bytes", "never_trained", "path_problem", "read_manifest", "refuse_if_held",
    "refuse_strangers", "take_new_run", "write_json",
]  # fmt: skip
