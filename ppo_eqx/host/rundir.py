"""The run directory's one owner: its file names and layout, the atomic write, and the checks of a run directory
before anything is written to it (refused with ``errors.RunDirError``). No jax here: files and paths only.

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

import contextlib
import errno
import itertools
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


def write_all(fd: int, data: bytes) -> None:
    """All of ``data`` to ``fd`` (``os.write`` may take less at a time)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def write_whole(dir_fd: int, name: str, data: bytes) -> None:
    """Write the file ``name`` in the directory ``dir_fd`` whole: ``data`` to its temporary (``.NAME.tmp``, never
    through a link), fsynced and renamed over it, the directory fsynced; on any failure the temporary is removed and
    the file left as it was. A crash leaves the old file or the new one."""
    temporary = f".{name}.tmp"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644, dir_fd=dir_fd)
    try:
        try:
            write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temporary, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary, dir_fd=dir_fd)
        raise
    os.fsync(dir_fd)


def write_atomic(path: Path, data: bytes) -> None:
    """``write_whole`` of ``path`` (outside a run: ``ppo-eqx eval``'s results)."""
    dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        write_whole(dir_fd, path.name, data)
    finally:
        os.close(dir_fd)


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


def json_bytes(data: Any) -> bytes:
    """``data`` as the JSON the run directory holds (indented, no NaN: a ValueError before anything is written)."""
    return (json.dumps(data, indent=2, allow_nan=False) + "\n").encode()


def write_json(path: Path, data: Any) -> None:
    """Write ``data`` as JSON atomically (``write_atomic``)."""
    write_atomic(path, json_bytes(data))


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


def free_name(base: Path) -> Path:
    """The first of ``base``, ``base__2``, ``base__3``, ... that does not exist now (``claim_new_dir`` takes one)."""
    return next(path for n in itertools.count(1) if not (path := _numbered(base, n)).exists())


def _numbered(base: Path, n: int) -> Path:
    return base if n == 1 else base.with_name(f"{base.name}__{n}")


def claim_new_dir(base: Path) -> Path:
    """Create ``base`` as a new, empty directory (its parents as needed), or if it exists the first of
    ``base__2``, ``base__3``, ... that does not: ``mkdir`` is atomic, so two runs started at once get two."""
    try:
        base.parent.mkdir(parents=True, exist_ok=True)
        for n in itertools.count(1):
            path = _numbered(base, n)
            try:
                path.mkdir()
                return path
            except FileExistsError:
                continue
    except OSError as error:
        raise RunDirError(f"--run-dir {base} is not writable: {error.strerror}") from None
    raise AssertionError("unreachable")


def make_dirs(flag: str, path: Path) -> None:
    """``mkdir -p path``, or RunDirError naming ``flag``."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise RunDirError(f"{flag} {path} is not writable: {error.strerror}") from None


MAX_PATH = 4096
MAX_NAME = 255


def path_problem(text: str) -> str | None:
    """What makes ``text`` no path at all (empty, a NUL character, too long), said for a message; else None."""
    if not text:
        return "is empty; allowed: a path"
    if "\0" in text:
        return "holds a NUL character; allowed: a path"
    if len(text) > MAX_PATH or any(len(part) > MAX_NAME for part in text.split("/")):
        return f"is too long; allowed: {MAX_PATH} characters, {MAX_NAME} per name"
    return None


def check_path(flag: str, path: Path) -> None:
    """RunDirError unless ``path`` could be a file or directory to write: a path (``path_problem``; ``Path("")``
    reads as "."), and no part of it an existing file (a path "inside a file")."""
    text = str(path)
    problem = path_problem("" if text == "." else text)
    if problem is not None:
        raise RunDirError(f"{flag} {text[:60]} {problem}" if text != "." else f"{flag} {problem}")
    for parent in path.parents:
        if parent.exists() and not parent.is_dir():
            raise RunDirError(f"{flag} {path}: {parent} is a file, not a directory")


def resolved(flag: str, path: Path) -> Path:
    """``path.resolve()``, or RunDirError for a symbolic link loop (Python 3.11 raises RuntimeError, 3.13 OSError)."""
    try:
        return path.resolve()
    except (RuntimeError, OSError) as error:
        reason = getattr(error, "strerror", None) or os.strerror(errno.ELOOP)
        raise RunDirError(f"{flag} {path}: a symbolic link loop ({reason})") from None


def run_file(path: Path, run_dir: Path, flag: str = "path") -> str | None:
    """The name of ``run_dir``'s own file that ``path`` is (or lies in), else None: any name ``written_name``
    says a run writes, its bookkeeping and temporaries included, but ``eval.json`` itself (``ppo-eqx eval``'s own)."""
    try:
        relative = resolved(flag, path).relative_to(resolved(flag, run_dir))
    except ValueError:
        return None
    name = relative.parts[0] if relative.parts else "."
    return name if name == "." or (written_name(name) and name != EVAL) else None


def _check_not_in_a_run(flag: str, path: Path) -> None:
    """RunDirError if ``path`` is, or lies in, one of the own files of a run (or an agent's run) above it."""
    for parent in resolved(flag, path).parents:
        own = run_file(path, parent, flag) if holds_run(parent) or (parent / MANIFEST).exists() else None
        if own is not None:
            raise RunDirError(f"{flag} {path} is the {own} of the run in {parent}; allowed: a path of its own")


def check_output(flag: str, path: Path, run_dir: Path) -> None:
    """RunDirError unless ``path`` can be written by ``ppo-eqx eval``: a writable place that is not a
    directory and not one of the run's own files, through a link or not (``eval.json`` is eval's own)."""
    check_path(flag, path)
    if path.is_dir():
        raise RunDirError(f"{flag} {path} is a directory; allowed: a file name")
    own = run_file(path, run_dir, flag)
    if own is not None:
        raise RunDirError(f"{flag} {path} is the run's own {own}; allowed: another file")
    _check_not_in_a_run(flag, path)
    parent = path.parent
    if not parent.is_dir():
        raise RunDirError(f"{flag} {path}: no directory {parent}")
    if not os.access(parent, os.W_OK):
        raise RunDirError(f"{flag} {path}: {parent} is not writable")


def check_new_run_dir(run_dir: Path, overwrite: bool) -> None:
    """RunDirError unless a new run may be written to ``run_dir`` as far as its path goes (nothing is written or
    created here; what is in it is ``ownership.check_run_dirs``'s)."""
    check_path("--run-dir", run_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise RunDirError(f"--run-dir {run_dir} is a file, not a directory")
    # A run among another run's own files (its checkpoints/) would go with them when that run is overwritten.
    _check_not_in_a_run("--run-dir", run_dir)
    existing = next((p for p in (run_dir, *run_dir.parents) if p.exists()), Path("."))
    if not os.access(existing, os.W_OK | os.X_OK):
        raise RunDirError(f"--run-dir {run_dir} is not writable: {existing} is not writable")
