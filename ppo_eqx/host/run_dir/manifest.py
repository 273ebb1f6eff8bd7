"""What a run wrote in its directory: the names a run writes (``written_name``), and the manifest, one JSON line
``[kind, relative path]`` appended before each thing is made (``directory.RunDirectory.list_entry``), so that
``--overwrite`` and pruning delete exactly that and nothing a user put beside it; and what a directory holds beside
what its run wrote (``check_contents``, ``refuse_strangers``). No jax here: files only.

The manifest is read as untrusted input: every line must be one that ppo-eqx writes, ``[kind, path]`` with a
path that a run writes (``written_name``: a run file, an event file, a checkpoint, an agent's directory, a
setting's directory, ``wandb/``), never the directory itself, nothing outside it, nothing through a link. A damaged
manifest is refused in one line (``ManifestError``) before anything is deleted or written; only a last line without
its newline (a write that a kill cut short) is skipped.
"""

import contextlib
import json
import os
import re
import stat
from collections.abc import Sequence
from pathlib import Path, PurePosixPath
from typing import Literal, NamedTuple

from ...config import AGENT_PREFIX
from ...errors import RunDirError
from .lock import kind_of
from .names import (
    BOOKKEEPING,
    CHECKPOINT_DIR,
    CHECKPOINT_FILE,
    EVENTS,
    MANIFEST,
    MARKERS,
    METRICS,
    RUN_FILES,
    SEEDS_CONFIG,
    WANDB_DIR,
)

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


def base_name(name: str) -> str:
    """``name``, or the name whose temporary it is (``.NAME.tmp``: ``write_whole``'s)."""
    return name[1:-4] if name.startswith(".") and name.endswith(".tmp") and len(name) > 5 else name


def written_name(name: str) -> bool:
    """Whether ``name``, at the top of a run's (or an agent's) directory, is one ppo-eqx writes there: a run file,
    ``seeds.json``, TensorBoard's events, ``checkpoints/``, ``wandb/``, the bookkeeping, or a temporary of one."""
    base = base_name(name)
    return base in (*RUN_FILES, SEEDS_CONFIG, CHECKPOINT_DIR, WANDB_DIR, *BOOKKEEPING) or bool(EVENTS.fullmatch(base))


def written_checkpoint_name(name: str) -> bool:
    """Whether ``name``, inside ``checkpoints/``, is one ppo-eqx writes there (a checkpoint file or its temporary)."""
    return bool(CHECKPOINT_FILE.fullmatch(base_name(name)))


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


# --- what a directory holds beside what its run wrote ------------------------------------------------------------

Entries = list[tuple[Kind, str]]
"""A manifest's entries (``read_manifest``)."""


def owned_entries(run_dir: Path) -> Entries:
    """The run's entries: its manifest's, or none."""
    return read_manifest(run_dir) or []


def _owned_agents(run_dir: Path) -> list[Path]:
    """The agents' directories of the run in ``run_dir`` (from its manifest)."""
    return [run_dir / relative for kind, relative in owned_entries(run_dir) if kind == "run"]


def holds_run(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds (part of) a run, or looks as if it did: any of ``names.MARKERS``, listed in a
    manifest or not."""
    return run_dir.is_dir() and any((run_dir / name).exists() for name in MARKERS)


def check_contents(run_dir: Path, agent_dirs: Sequence[Path], overwrite: bool) -> Entries:
    """RunDirError unless what the directories of a new run hold lets it write there (``run_dir``, and
    ``agent_dirs`` for a run of several agents; nothing is written or created here): not an agent's directory of
    another run; nothing in them named as a run's files that a run of ppo-eqx there did not write
    (``refuse_strangers``), or a link where a run writes; a run there only with ``overwrite`` (or one
    that never trained: a plain retry); and with ``overwrite`` no agent's directory holding a run that the old run
    did not write (``--overwrite`` deletes only the old run's). The entries of ``run_dir``'s manifest, as read."""
    for parent in run_dir.absolute().parents:
        if holds_run(parent) and any(run_dir.absolute().is_relative_to(agent) for agent in _owned_agents(parent)):
            raise RunDirError(f"--run-dir {run_dir} is an agent's directory of the run in {parent}; allowed: a path "
                              "of its own")  # fmt: skip
    entries = owned_entries(run_dir) if run_dir.is_dir() else []  # the manifest, read once
    refuse_strangers(run_dir, run_dir, entries)
    if entries and not overwrite and not never_trained(run_dir, entries):
        raise RunDirError(
            f"--run-dir {run_dir} already holds a run; pass --overwrite to replace it "
            f"or --resume {run_dir} to continue it"
        )
    owned = {run_dir / relative for kind, relative in entries if kind == "run"} if overwrite else set()
    for agent_dir in agent_dirs:
        if overwrite and agent_dir not in owned and holds_run(agent_dir):
            raise RunDirError(
                f"{agent_dir} holds a run that the run in {run_dir} did not write, and --overwrite keeps it; move "
                "it, or pick another --run-dir"
            )
        refuse_strangers(run_dir, agent_dir, owned_entries(agent_dir) if agent_dir.is_dir() else [])
    return entries


class Strangers(NamedTuple):
    """What a directory holds under names that a run writes without its run having written it (``strangers``):
    relative paths, directories with a trailing ``/``."""

    look_alikes: list[str]
    """Every such name when no run of ppo-eqx's is there, else those its manifest does not list: a new run would
    write over them, or ``--overwrite`` take them for the run's."""
    links: list[str]
    """Symbolic links under names a run writes (``checkpoints``, ``metrics.jsonl``, ...), a file that the manifest
    lists (the run's own to delete) aside: a run writes only inside its own directory, and ``--overwrite`` keeps what
    its run did not write, so they would stay in the way."""


def strangers(directory: Path, entries: Entries | None = None) -> Strangers:
    """What ``directory`` holds that its run (its manifest's ``entries``, read here if not given) did not write, in
    one pass over it (``Strangers``)."""
    found = Strangers([], [])
    if not directory.is_dir():
        return found
    entries = owned_entries(directory) if entries is None else entries
    owned, listed = set(entries), {relative for _, relative in entries}
    for path in sorted(directory.iterdir()):
        name = path.name
        if name in BOOKKEEPING or not written_name(name):
            continue
        link = path.is_symlink()
        if link and ("file", name) not in owned:
            found.links.append(name)
        if name not in listed and base_name(name) not in listed:
            found.look_alikes.append(f"{name}/" if path.is_dir() and not link else name)
        elif name == CHECKPOINT_DIR and path.is_dir() and not link:
            found.look_alikes.extend(
                f"{CHECKPOINT_DIR}/{inner.name}"
                for inner in sorted(path.iterdir())
                if written_checkpoint_name(inner.name)
                and not {f"{CHECKPOINT_DIR}/{inner.name}", f"{CHECKPOINT_DIR}/{base_name(inner.name)}"} & listed
            )
    return found


def refuse_strangers(
    run_dir: Path, directory: Path, entries: Entries | None = None, *, links_only: bool = False
) -> None:
    """RunDirError naming what ``directory`` (``run_dir`` or one of its agents' directories; ``entries``: its
    manifest's) holds that a run would write over or through (``strangers``): its look-alikes (unless
    ``links_only``), then its links."""
    found = strangers(directory, entries)
    relative = os.path.relpath(directory, run_dir)
    if found.look_alikes and not links_only:
        names = [os.path.join(relative, name).removeprefix("./") for name in found.look_alikes]
        shown = ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")
        raise RunDirError(
            f"--run-dir {run_dir} holds {shown}: named as a run's files, but no run of ppo-eqx there wrote them, "
            "and a run would write over them; move them, or pick another --run-dir"
        )
    if found.links:
        shown = os.path.join(relative, found.links[0]).removeprefix("./")
        raise RunDirError(
            f"--run-dir {run_dir}: {shown} is a symbolic link, where a run writes its own; a run writes only "
            "inside its directory, never through a link: remove it (or pick another --run-dir) and try again"
        )


def never_trained(run_dir: Path, entries: Entries | None = None) -> bool:
    """Whether the run of ppo-eqx's in ``run_dir`` (its manifest's ``entries``, read here if not given) stopped
    before anything of it could be kept: no checkpoint, and no agent wrote a row of metrics (what a kill or a fault
    before the first iteration leaves). A plain retry may start afresh there."""
    entries = read_manifest(run_dir) if entries is None else entries
    if entries is None or any((run_dir / CHECKPOINT_DIR).glob("iter_*.json")):
        return False
    for agent_dir in [run_dir, *(run_dir / relative for kind, relative in entries if kind == "run")]:
        with contextlib.suppress(FileNotFoundError):
            with (agent_dir / METRICS).open("rb") as metrics:
                if any(piece.strip() for piece in iter(lambda: metrics.read(1 << 16), b"")):
                    return False
    return True


def check_resumed_dirs(run_dir: Path, agent_dirs: Sequence[Path]) -> None:
    """A run to resume wrote a manifest (ppo-eqx writes only where it knows what it wrote: an earlier ppo-eqx's run,
    without one, is refused in one line), and no link stands where it writes (``refuse_strangers``)."""
    entries = read_manifest(run_dir)
    if entries is None:
        raise RunDirError(
            f"--resume {run_dir}: it holds no list of what its run wrote ({MANIFEST}: an earlier ppo-eqx wrote it), "
            "and ppo-eqx writes only where it knows what it wrote; train a new run, or resume it with the ppo-eqx "
            "that wrote it"
        )
    for directory in (run_dir, *agent_dirs):
        refuse_strangers(run_dir, directory, entries if directory == run_dir else None, links_only=True)
