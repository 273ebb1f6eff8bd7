"""What a run wrote in its directory: the manifest, one JSON line ``[kind, relative path]`` appended before each
thing is made (``run_directory.RunDirectory.list_entry``), so that ``--overwrite`` and pruning delete exactly that and
nothing a user put beside it. No jax here: files only.

The manifest is read as untrusted input: every line must be one that ppo-eqx writes, ``[kind, path]`` with a
path that a run writes (``rundir.written_name``: a run file, an event file, a checkpoint, an agent's directory, a
setting's directory, ``wandb/``), never the directory itself, nothing outside it, nothing through a link. A damaged
manifest is refused in one line (``ManifestError``) before anything is deleted or written; only a last line without
its newline (a write that a kill cut short) is skipped.
"""

import json
import os
import re
import stat
from pathlib import Path, PurePosixPath
from typing import Literal

from ..config import AGENT_PREFIX
from ..errors import RunDirError
from .lock import kind_of
from .rundir import BOOKKEEPING, CHECKPOINT_DIR, MANIFEST, WANDB_DIR, written_checkpoint_name, written_name

MAX_MANIFEST_BYTES = 64 * 2**20
"""A manifest larger than this is not one ppo-eqx wrote (a run lists tens of entries, a sweep thousands)."""

Kind = Literal["file", "dir", "run", "tree"]
"""What a run made: a ``file``; a ``dir`` that holds its files (removed once empty); an agent's ``run`` directory
(with its own manifest); a ``tree`` that another library fills (W&B's), removed whole."""
KINDS = ("file", "dir", "run", "tree")
_AGENT = re.compile(rf"(?:[a-z][a-z0-9-]*=[^/\0]+/)?{AGENT_PREFIX}\d+")
"""An agent's directory (``PPOConfig.agent_names``): ``seedK``, or under a sweep ``SETTING/seedK``."""
_SETTING = re.compile(r"[a-z][a-z0-9-]*=[^/\0]+")


class ManifestError(RunDirError):
    """A manifest that ppo-eqx did not write as it stands: refused, never guessed at."""


def written_entry(kind: str, relative: str) -> bool:
    """Whether ``[kind, relative]`` is an entry that a run writes: a clean relative path (no ``.``, ``..``, empty
    or absolute part) of the kind's names."""
    path = PurePosixPath(relative)
    if not relative or "\0" in relative or path.is_absolute() or path.as_posix() != relative:
        return False
    if any(part in ("", ".", "..") for part in relative.split("/")):
        return False
    parts = path.parts
    if kind == "file":
        if len(parts) == 2 and parts[0] == CHECKPOINT_DIR:
            return written_checkpoint_name(parts[1])
        return len(parts) == 1 and written_name(parts[0]) and parts[0] not in BOOKKEEPING
    if kind == "dir":
        return relative == CHECKPOINT_DIR or bool(_SETTING.fullmatch(relative))
    if kind == "run":
        return bool(_AGENT.fullmatch(relative))
    return kind == "tree" and relative == WANDB_DIR


def _damaged(path: Path, why: str) -> ManifestError:
    return ManifestError(
        f"{path} is damaged ({why}): ppo-eqx deletes only what its manifest lists and will not guess; remove that "
        f"line (or the directory {path.parent}, yourself) and try again"
    )


def _manifest_bytes(path: Path, dir_fd: int | None) -> bytes | None:
    """The manifest's bytes (``path``; read as ``MANIFEST`` in ``dir_fd`` when given), never through a link or from a
    FIFO; None when there is none."""
    where = MANIFEST if dir_fd is not None else path
    try:
        mode = os.stat(where, dir_fd=dir_fd, follow_symlinks=False).st_mode
    except FileNotFoundError:
        return None
    except OSError as error:
        raise ManifestError(f"cannot read {path}: {error.strerror}") from None
    if not stat.S_ISREG(mode):
        raise _damaged(path, f"it is a {kind_of(mode)}, not a file")
    fd = os.open(where, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
    try:
        data = os.read(fd, MAX_MANIFEST_BYTES + 1)
        rest = data
        while rest and len(data) <= MAX_MANIFEST_BYTES:
            rest = os.read(fd, MAX_MANIFEST_BYTES + 1 - len(data))
            data += rest
    finally:
        os.close(fd)
    if len(data) > MAX_MANIFEST_BYTES:
        raise _damaged(path, f"more than {MAX_MANIFEST_BYTES // 2**20} MiB")
    return data


def _entry(line: str) -> tuple[Kind, str] | None:
    try:
        value = json.loads(line)
    except (ValueError, RecursionError):
        return None
    if not (isinstance(value, list) and len(value) == 2 and all(isinstance(v, str) for v in value)):
        return None
    kind, relative = value
    return (kind, relative) if kind in KINDS and written_entry(kind, relative) else None  # type: ignore[return-value]


def read_manifest(run_dir: Path, *, dir_fd: int | None = None) -> list[tuple[Kind, str]] | None:
    """The entries of ``run_dir``'s manifest (read in the directory ``dir_fd`` when given), in order; None when it has
    none. ManifestError for any line that is not an entry a run writes; a last line without its newline (cut short
    by a kill) is skipped."""
    path = run_dir / MANIFEST
    data = _manifest_bytes(path, dir_fd)
    if data is None:
        return None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise _damaged(path, "it is not UTF-8 text") from None
    lines = text.split("\n")
    entries = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        entry = _entry(line)
        if entry is None:
            if number == len(lines):  # no newline after it: a line that a kill cut short
                continue
            shown = line if len(line) <= 60 else line[:57] + "..."
            raise _damaged(path, f"line {number}, {shown!r}, is not an entry that a run writes")
        entries.append(entry)
    return entries
