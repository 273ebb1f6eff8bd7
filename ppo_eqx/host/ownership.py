"""A run directory has one owner at a time (``RunLock``), and the run keeps a list of what it wrote there
(``Manifest``), so that ``--overwrite`` deletes exactly that (``clear_run``) and nothing a user put beside it.
No jax here: files only.

**The lock** is ``fcntl.flock`` on the run directory itself, held for the life of the process that trains: the
kernel releases it on every exit, SIGKILL included, so a dead holder never blocks the next run. It is the
directory's inode that is locked, which no file operation inside it can replace: deleting, renaming over or
replacing ``.ppo-eqx.lock`` (which only names the holder: its pid, host and command, for the refusal's message)
changes nothing. Where a file system cannot lock a directory (NFS emulates ``flock`` with byte-range locks, which
need a file open for writing), the lock falls back to the lock file, checked after locking to be the file its path
still names (a file replaced between the open and the lock is not locked).

**The manifest** is read as untrusted input: every line must be one that ppo-eqx writes, ``[kind, path]`` with a
path that a run writes (``rundir.written_name``: a run file, an event file, a checkpoint, an agent's directory, a
setting's directory, ``wandb/``), never the directory itself, nothing outside it, nothing through a link. A damaged
manifest is refused in one line (``ManifestError``) before anything is deleted or written; only a last line without
its newline (a write that a kill cut short) is skipped.
"""

import contextlib
import errno
import fcntl
import json
import os
import re
import shutil
import socket
import stat
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path, PurePosixPath
from typing import Literal, NamedTuple

from ..config import AGENT_PREFIX, PPOConfig
from ..errors import ConfigError, RunDirError
from .rundir import (
    BOOKKEEPING,
    CHECKPOINT_DIR,
    CONFIG,
    EVAL,
    LOCK,
    MANIFEST,
    METRICS,
    RUN_FILES,
    SEEDS_CONFIG,
    TENSORBOARD_GLOB,
    WANDB_DIR,
    check_new_run_dir,
    claim_new_dir,
    make_dirs,
    temporary_of,
    write_atomic,
    write_json,
    written_checkpoint_name,
    written_name,
)
from .rundir import (
    agent_dirs as agent_dirs_of,
)
from .rundir import (
    holds_run as looks_like_a_run,
)

__all__ = ["LOCK", "MANIFEST"]  # re-exported: their names live in rundir with every other name a run writes

HOLDER_WAIT_S = 2.0
"""How long a refused process waits for the holder to write who it is (it locks first, then writes)."""
MAX_MANIFEST_BYTES = 64 * 2**20
"""A manifest larger than this is not one ppo-eqx wrote (a run lists tens of entries, a sweep thousands)."""


# --- the lock ---------------------------------------------------------------------------------------------------


def _kind_of(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "directory"
    if stat.S_ISFIFO(mode):
        return "FIFO"
    if stat.S_ISLNK(mode):
        return "symbolic link"
    if stat.S_ISSOCK(mode):
        return "socket"
    return "device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "special file"


def _open_regular(path: Path, flags: int) -> int:
    """``path`` opened without following a link or blocking on a FIFO; RunDirError naming it when it is not a
    regular file (a link to /dev/null, a FIFO, a directory)."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        mode = None
    if mode is not None and not stat.S_ISREG(mode):
        raise RunDirError(f"{path} is a {_kind_of(mode)}, not the file ppo-eqx keeps there; remove it and try again")
    try:
        return os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
    except OSError as error:
        raise RunDirError(f"cannot open {path}: {error.strerror}") from None


def _gone(holder: dict) -> bool:
    """Whether ``holder`` names a process of this host that no longer exists: an earlier holder's record, which
    the new holder (it locks first, then writes) has not yet replaced."""
    if holder["host"] != socket.gethostname():
        return False
    try:
        os.kill(int(holder["pid"]), 0)
    except ProcessLookupError:
        return True
    except (OSError, ValueError):  # alive but not ours to signal, or no pid: not known to be gone
        pass
    return False


def _read_holder(run_dir: Path) -> str:
    with contextlib.suppress(OSError, RunDirError):
        fd = _open_regular(run_dir / LOCK, os.O_RDONLY)
        try:
            return os.pread(fd, 4096, 0).decode(errors="replace")
        finally:
            os.close(fd)
    return ""


def _holder(run_dir: Path) -> str:
    """Who holds ``run_dir``'s lock, in words, from what the holder wrote in its lock file."""
    deadline = time.monotonic() + HOLDER_WAIT_S
    while True:
        try:
            holder = json.loads(_read_holder(run_dir))
            if not _gone(holder) or time.monotonic() > deadline:
                return f"pid {holder['pid']} on host {holder['host']} ({holder['command']} since {holder['since']})"
        except (ValueError, KeyError, TypeError):
            if time.monotonic() > deadline:
                return "another process (its lock file names nobody)"
        time.sleep(0.02)


_NO_DIRECTORY_LOCKS = (errno.EBADF, errno.ENOLCK, errno.EINVAL, errno.EOPNOTSUPP)
"""What ``flock`` of a directory gives where the file system cannot lock one (NFS)."""


def _lock_fd(run_dir: Path, exclusive: bool) -> int | None:
    """A descriptor of ``run_dir`` (or, where directories cannot be locked, of its lock file) locked without
    waiting; None when another process holds it. RunDirError when it cannot be locked at all."""
    operation = (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB
    try:
        fd = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as error:
        raise RunDirError(f"cannot lock {run_dir}: {error.strerror}") from None
    try:
        fcntl.flock(fd, operation)
        return fd
    except OSError as error:
        os.close(fd)
        if error.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return None
        if error.errno not in _NO_DIRECTORY_LOCKS:
            raise RunDirError(f"cannot lock {run_dir}: {error.strerror}") from None
    return _lock_file_fd(run_dir, operation)


def _lock_file_fd(run_dir: Path, operation: int) -> int | None:
    """The fallback: the lock file locked, and still the file that its path names once locked."""
    fd = _open_regular(run_dir / LOCK, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, operation)
    except OSError as error:
        os.close(fd)
        if error.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return None
        raise RunDirError(f"cannot lock {run_dir}: {error.strerror}") from None
    try:
        same = os.path.samestat(os.fstat(fd), os.lstat(run_dir / LOCK))
    except OSError:
        same = False
    if not same:
        os.close(fd)
        return None  # replaced meanwhile: whoever replaced it holds the run
    return fd


class RunLock:
    """The exclusive lock of a run directory, held until ``release`` or the process's end."""

    def __init__(self, run_dir: Path, fd: int):
        self.run_dir, self._fd = run_dir, fd

    @classmethod
    def take(cls, run_dir: Path, command: str) -> "RunLock":
        """Lock ``run_dir`` (an existing directory) for this process, then say who holds it in its lock file; or
        RunDirError naming the holder (or a lock file that is not a regular file)."""
        fd = _lock_fd(run_dir, exclusive=True)
        if fd is None:
            raise RunDirError(f"{run_dir} is in use by {_holder(run_dir)}; wait for it to end or stop it")
        lock = cls(run_dir, fd)
        try:
            lock._write_holder(command)
        except BaseException:
            lock.release()
            raise
        return lock

    def _write_holder(self, command: str) -> None:
        holder = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "since": time.strftime("%Y-%m-%d %H:%M:%S"),
            "command": command,
        }
        fd = _open_regular(self.run_dir / LOCK, os.O_RDWR | os.O_CREAT)
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, (json.dumps(holder) + "\n").encode(), 0)
        except OSError as error:
            raise RunDirError(f"--run-dir {self.run_dir} is not writable: {error.strerror}") from None
        finally:
            os.close(fd)

    def release(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._fd)


def refuse_if_held(run_dir: Path) -> None:
    """RunDirError naming the holder when another process holds ``run_dir``'s lock; creates nothing. A cheap first
    check: the lock itself is ``RunLock.take``."""
    if not run_dir.is_dir():
        return
    try:
        fd = _lock_fd(run_dir, exclusive=False)
    except RunDirError:  # a directory that cannot be locked, a lock file that is no file: RunLock.take says so
        return
    if fd is None:
        raise RunDirError(f"{run_dir} is in use by {_holder(run_dir)}; wait for it to end or stop it")
    os.close(fd)


# --- the manifest -----------------------------------------------------------------------------------------------

Kind = Literal["file", "dir", "run", "tree"]
"""What a run made: a ``file``; a ``dir`` that holds its files (removed once empty); an agent's ``run`` directory
(with its own manifest); a ``tree`` that another library fills (W&B's), removed whole."""
KINDS = ("file", "dir", "run", "tree")
_AGENT = re.compile(rf"(?:[a-z][a-z0-9-]*=[^/\0]+/)?{AGENT_PREFIX}\d+")
"""An agent's directory (``PPOConfig.agent_names``): ``seedK``, or under a sweep ``SETTING/seedK``."""
_SETTING = re.compile(r"[a-z][a-z0-9-]*=[^/\0]+")


class ManifestError(RunDirError):
    """A manifest that ppo-eqx did not write as it stands: refused, never guessed at."""


def _written_entry(kind: str, relative: str) -> bool:
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


def _manifest_bytes(path: Path) -> bytes | None:
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    except OSError as error:
        raise ManifestError(f"cannot read {path}: {error.strerror}") from None
    if not stat.S_ISREG(mode):
        raise _damaged(path, f"it is a {_kind_of(mode)}, not a file")
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
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
    return (kind, relative) if kind in KINDS and _written_entry(kind, relative) else None  # type: ignore[return-value]


def read_manifest(run_dir: Path) -> list[tuple[Kind, str]] | None:
    """The entries of ``run_dir``'s manifest, in order; None when it has none (a run of an earlier ppo_eqx).
    ManifestError for any line that is not an entry a run writes; a last line without its newline (cut short by
    a kill) is skipped."""
    path = run_dir / MANIFEST
    data = _manifest_bytes(path)
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


class Manifest:
    """What a run wrote in ``run_dir``: one JSON line ``[kind, relative path]`` appended before each thing is
    created, so that a kill at any moment leaves nothing of the run's unlisted."""

    def __init__(self, run_dir: Path):
        self.run_dir = run_dir
        self.path = run_dir / MANIFEST
        self._known = set(read_manifest(run_dir) or [])

    def add(self, kind: Kind, relative: str | Path) -> None:
        entry = (kind, Path(relative).as_posix())
        if entry in self._known:
            return
        if not _written_entry(*entry):
            raise ValueError(f"{entry} is not an entry that a run writes")
        with open(self.path, "a") as file:
            file.write(json.dumps(list(entry)) + "\n")
        self._known.add(entry)

    def add_all(self, entries: Iterable[tuple[Kind, str]]) -> None:
        for kind, relative in entries:
            self.add(kind, relative)


# --- runs of an earlier ppo-eqx (no manifest) --------------------------------------------------------------------

_CHECKPOINT = re.compile(r"\.?iter_\d{6,}\.(eqx|json)(\.tmp)?")


def _saved_config(run_dir: Path) -> PPOConfig | None:
    for name in (SEEDS_CONFIG, CONFIG):
        with contextlib.suppress(OSError, ValueError, ConfigError, RecursionError):
            return PPOConfig.from_dict(json.loads((run_dir / name).read_text()))
    return None


def is_legacy_run(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds a run that an earlier ppo-eqx (before the manifest) wrote: no manifest, a config
    that is a ``PPOConfig``, and its metrics or a checkpoint. Files that only bear the names are not one."""
    if (run_dir / MANIFEST).exists() or _saved_config(run_dir) is None:
        return False
    return (run_dir / METRICS).is_file() or any((run_dir / CHECKPOINT_DIR).glob("iter_*.json"))


def legacy_entries(run_dir: Path) -> list[tuple[Kind, str]]:
    """What a run written before the manifest existed wrote, by the names that ppo_eqx gives its files: the run's
    files at its top, its events, its checkpoints, and its agents' directories as its ``seeds.json`` names them
    (never any directory by the look of its name)."""
    files = [*RUN_FILES, SEEDS_CONFIG, *(path.name for path in sorted(run_dir.glob(TENSORBOARD_GLOB)))]
    checkpoints = run_dir / CHECKPOINT_DIR
    if checkpoints.is_dir():
        found = sorted(path.name for path in checkpoints.iterdir() if _CHECKPOINT.fullmatch(path.name))
        files += [f"{CHECKPOINT_DIR}/{name}" for name in found]
    entries: list[tuple[Kind, str]] = [("file", name) for name in files]
    if checkpoints.is_dir():
        entries.append(("dir", CHECKPOINT_DIR))
    config = _saved_config(run_dir)
    for name in config.agent_names() if config is not None and config.num_agents > 1 else []:
        for parent in reversed(Path(name).parents[:-1]):
            entries.append(("dir", parent.as_posix()))
        entries.append(("run", name))
    return entries


def adopt_legacy_run(run_dir: Path) -> None:
    """Give a run written before the manifest existed (and each of its agents) a manifest of what it wrote, by
    ``legacy_entries``, before a resumed run adds its own files: a later ``--overwrite`` then deletes both."""
    if not is_legacy_run(run_dir):
        return
    entries = legacy_entries(run_dir)
    for kind, relative in entries:
        if kind == "run":
            adopt_legacy_run(run_dir / relative)
    Manifest(run_dir).add_all(entry for entry in entries if _written_entry(*entry))


def owned_entries(run_dir: Path) -> list[tuple[Kind, str]]:
    """The run's entries: its manifest's, an earlier ppo-eqx's run's by name (``is_legacy_run``), or none."""
    entries = read_manifest(run_dir)
    if entries is not None:
        return entries
    if not is_legacy_run(run_dir):
        return []
    return legacy_entries(run_dir)


def owned_agents(run_dir: Path) -> set[Path]:
    """The agents' directories of the run in ``run_dir`` (from its manifest, or its ``seeds.json``)."""
    return {run_dir / relative for kind, relative in owned_entries(run_dir) if kind == "run"}


def has_run(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds a run of ppo-eqx's: its manifest lists something, or an earlier ppo-eqx's run
    (``rundir.holds_run`` says only whether it looks like one)."""
    return run_dir.is_dir() and bool(owned_entries(run_dir))


def is_eval_result(path: Path) -> bool:
    """Whether ``path`` is what ``ppo-eqx eval`` writes (a JSON object with its checkpoint, episodes and returns):
    the only ``eval.json`` that ``--overwrite`` deletes or ``eval`` replaces."""
    try:
        result = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(result, dict) and {"checkpoint", "episodes", "returns", "mean_return"} <= set(result)


# --- what is in a directory before a run writes it ----------------------------------------------------------------


def _plain(name: str) -> str:
    """``name``, or the name whose temporary it is (``.NAME.tmp``)."""
    return name[1:-4] if name.startswith(".") and name.endswith(".tmp") and len(name) > 5 else name


def look_alikes(run_dir: Path) -> list[str]:
    """What ``run_dir`` holds under a name that a run writes, without the run there having written it: every such
    name when no run of ppo-eqx's is there, else those its manifest does not list (relative paths, directories
    with a trailing ``/``). A new run would write over them, or ``--overwrite`` take them for the run's."""
    if not run_dir.is_dir():
        return []
    listed = {relative for _, relative in owned_entries(run_dir)}
    found = []
    for path in sorted(run_dir.iterdir()):
        name = path.name
        if name in BOOKKEEPING or not written_name(name):
            continue
        if name not in listed and _plain(name) not in listed:
            found.append(f"{name}/" if path.is_dir() and not path.is_symlink() else name)
        elif name == CHECKPOINT_DIR and path.is_dir() and not path.is_symlink():
            found += [
                f"{CHECKPOINT_DIR}/{inner.name}"
                for inner in sorted(path.iterdir())
                if written_checkpoint_name(inner.name)
                and not {f"{CHECKPOINT_DIR}/{inner.name}", f"{CHECKPOINT_DIR}/{_plain(inner.name)}"} & listed
            ]
    return found


def refuse_look_alikes(run_dir: Path, directory: Path) -> None:
    """RunDirError naming what ``directory`` (``run_dir`` or one of its agents' directories) holds under names a
    run writes without a run of ppo-eqx's there having written it (``look_alikes``)."""
    found = [
        os.path.join(os.path.relpath(directory, run_dir), name).removeprefix("./") for name in look_alikes(directory)
    ]
    if found:
        shown = ", ".join(found[:8]) + (f" and {len(found) - 8} more" if len(found) > 8 else "")
        raise RunDirError(
            f"--run-dir {run_dir} holds {shown}: named as a run's files, but no run of ppo-eqx there wrote them, "
            "and a run would write over them; move them, or pick another --run-dir"
        )


def never_trained(run_dir: Path) -> bool:
    """Whether the run of ppo-eqx's in ``run_dir`` stopped before anything of it could be kept: no checkpoint,
    and no agent wrote a row of metrics (what a kill or a fault before the first iteration leaves). A plain retry
    may start afresh there."""
    if read_manifest(run_dir) is None or any((run_dir / CHECKPOINT_DIR).glob("iter_*.json")):
        return False
    for agent_dir in [run_dir, *owned_agents(run_dir)]:
        with contextlib.suppress(FileNotFoundError):
            if (agent_dir / METRICS).read_text(errors="replace").strip():
                return False
    return True


# --- --overwrite ------------------------------------------------------------------------------------------------


class Cleared(NamedTuple):
    """What ``clear_run`` deleted and what it kept (relative paths, directories with a trailing ``/``)."""

    deleted: list[str]
    kept: list[str]

    def lines(self, run_dir: Path, listed: bool, flag: str | None) -> list[str]:
        """What clearing the old run in ``run_dir`` did, a line each for the user: what it deleted and what it
        kept, and whether the old run ``listed`` what it wrote. ``flag`` (``--overwrite``) None: a plain retry of
        a run that stopped before anything of it could be kept."""
        said = []
        if flag is None:
            said.append(f"{run_dir} held a run that stopped before its first iteration; starting it afresh")
        if not listed:
            said.append(
                f"{run_dir} holds no list of what its run wrote (an earlier ppo-eqx wrote it): --overwrite deleted "
                "the files that a run writes at its top, its events and checkpoints/iter_*, and the agents' "
                "directories that its seeds.json names"
            )
        who = flag or "the retry"
        if self.deleted:
            said.append(f"{who} deleted what the old run wrote: {', '.join(self.deleted)}")
        if self.kept:
            said.append(f"{who} kept what the old run did not write: {', '.join(self.kept)}")
        return said


def _through_links(run_dir: Path, relative: str) -> bool:
    """Whether a directory on the way from ``run_dir`` to ``relative`` is a link (it would lead outside)."""
    path = run_dir
    for part in PurePosixPath(relative).parts[:-1]:
        path = path / part
        if path.is_symlink():
            return True
    return False


def clear_run(run_dir: Path) -> Cleared:
    """Delete what the run in ``run_dir`` wrote (its manifest's entries, agents' directories recursively; an
    ``eval.json`` only if ``ppo-eqx eval`` wrote it) and say what was deleted and what is left that it did not
    write. The manifest is checked whole first (``read_manifest``): a damaged one deletes nothing."""
    entries = owned_entries(run_dir)
    deleted: list[str] = []
    kept: list[str] = []
    for kind, relative in entries:
        path = run_dir / relative
        if _through_links(run_dir, relative):
            continue
        if kind == "file" and relative == EVAL and path.exists() and not is_eval_result(path):
            continue  # a user's own eval.json, not ppo-eqx eval's: kept, and said so below
        if kind == "file":
            temporary = PurePosixPath(relative).with_name(temporary_of(path).name).as_posix()
            for each, shown in ((path, relative), (temporary_of(path), temporary)):
                if each.is_symlink() or each.is_file():
                    each.unlink()
                    deleted.append(shown)
        elif kind == "tree" and path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
            deleted.append(f"{relative}/")
    for kind, relative in entries:
        path = run_dir / relative
        if kind == "run" and path.is_dir() and not path.is_symlink() and not _through_links(run_dir, relative):
            inner = clear_run(path)
            deleted += [f"{relative}/{name}" for name in inner.deleted]
            kept += [f"{relative}/{name}" for name in inner.kept]
            _remove_own(path)
            _remove_if_empty(path)
    for kind, relative in sorted(entries, key=lambda entry: -len(Path(entry[1]).parts)):
        if kind == "dir" and not _through_links(run_dir, relative):
            _remove_if_empty(run_dir / relative)
    write_atomic(run_dir / MANIFEST, b"")
    dirs = {relative for kind, relative in entries if kind == "dir"}
    runs = {relative for kind, relative in entries if kind == "run"}
    return Cleared(deleted, kept + _leftovers(run_dir, "", dirs, runs))


def _remove_own(agent_dir: Path) -> None:
    for name in BOOKKEEPING:
        with contextlib.suppress(FileNotFoundError, IsADirectoryError):
            (agent_dir / name).unlink()


def _remove_if_empty(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.rmdir()


def _leftovers(run_dir: Path, prefix: str, dirs: set[str], runs: set[str]) -> list[str]:
    """What is left in ``run_dir/prefix``: each entry, and inside a directory that the run made, what is in it
    (agents' directories are cleared, and report what they kept, on their own)."""
    left = []
    directory = run_dir / prefix
    for path in sorted(directory.iterdir()) if directory.is_dir() else []:
        relative = f"{prefix}{path.name}"
        if (not prefix and path.name in BOOKKEEPING) or relative in runs:
            continue
        if relative in dirs and path.is_dir() and not path.is_symlink():
            left += _leftovers(run_dir, f"{relative}/", dirs, runs)
        else:
            left.append(f"{relative}/" if path.is_dir() and not path.is_symlink() else relative)
    return left


# --- taking a directory for a new run ----------------------------------------------------------------------------


def check_run_dirs(run_dir: Path, agent_dirs: Sequence[Path], overwrite: bool) -> None:
    """Every directory a new run writes (``run_dir``, and ``agent_dirs`` for a run of several agents) may be
    written (nothing is written or created here): not an agent's
    directory of another run; nothing in it named as a run's files that a run of ppo-eqx there did not write
    (``look_alikes``); a run there only with ``overwrite`` (or one that never trained: a plain retry); and with
    ``overwrite`` no agent's directory holding a run that the old run did not write (``--overwrite`` deletes only
    the old run's)."""
    check_new_run_dir(run_dir, overwrite)
    for parent in run_dir.absolute().parents:
        if looks_like_a_run(parent) and any(run_dir.absolute().is_relative_to(a) for a in owned_agents(parent)):
            raise RunDirError(f"--run-dir {run_dir} is an agent's directory of the run in {parent}; allowed: a path "
                              "of its own")  # fmt: skip
    refuse_look_alikes(run_dir, run_dir)
    if has_run(run_dir) and not overwrite and not never_trained(run_dir):
        raise RunDirError(
            f"--run-dir {run_dir} already holds a run; pass --overwrite to replace it "
            f"or --resume {run_dir} to continue it"
        )
    owned = owned_agents(run_dir) if overwrite else set()
    for agent_dir in agent_dirs:
        if overwrite and agent_dir not in owned and looks_like_a_run(agent_dir):
            raise RunDirError(
                f"{agent_dir} holds a run that the run in {run_dir} did not write, and --overwrite keeps it; move "
                "it, or pick another --run-dir"
            )
        check_new_run_dir(agent_dir, overwrite)
        refuse_look_alikes(run_dir, agent_dir)


def take_new_run_dir(run_dir: Path, *, claim: bool, command: str) -> tuple[Path, RunLock]:
    """Create the new run's directory (``claim``: a default name, made fresh as ``run_dir`` or ``run_dir__2``, ...:
    ``rundir.claim_new_dir``) and lock it: the directory taken, and its lock. The caller checks it again under the
    lock before anything is written."""
    if claim:
        run_dir = claim_new_dir(run_dir)
    make_dirs("--run-dir", run_dir)
    return run_dir, RunLock.take(run_dir, command)


def take_new_run(
    run_dir: Path,
    agent_names: Sequence[str],
    config: dict,
    *,
    overwrite: bool,
    claim: bool,
    command: str,
    report: Callable[[str], None],
) -> tuple[Path, RunLock]:
    """Take a new run's directory whole: made and locked (``take_new_run_dir``), checked again under the lock
    (``check_run_dirs``), the old run there cleared with ``overwrite`` or by a plain retry of one that never trained
    (``report`` is given ``Cleared.lines``, what was deleted and kept and whether the old run listed what it
    wrote, a line at a time before anything else is made), and for several agents (``agent_names``) their
    directories and ``seeds.json`` (``config``: ``make_agent_dirs``). The directory taken and its lock; nothing
    locked when it is refused."""
    run_dir, lock = take_new_run_dir(run_dir, claim=claim, command=command)
    several = len(agent_names) > 1
    try:
        check_run_dirs(run_dir, agent_dirs_of(run_dir, agent_names) if several else [], overwrite)
        if has_run(run_dir) and (overwrite or never_trained(run_dir)):
            listed = read_manifest(run_dir) is not None
            for line in clear_run(run_dir).lines(run_dir, listed, "--overwrite" if overwrite else None):
                report(line)
        if several:
            make_agent_dirs(run_dir, agent_names, config)
    except BaseException:
        lock.release()
        raise
    return run_dir, lock


def make_agent_dirs(run_dir: Path, names: Sequence[str], config: dict) -> None:
    """The agents' directories of a run of several (``seedK``, ``SETTING/seedK``) and its ``seeds.json``
    (``config``), each listed in the run's manifest before it is made."""
    manifest = Manifest(run_dir)
    manifest.add("file", SEEDS_CONFIG)
    for name in names:
        for parent in reversed(Path(name).parents[:-1]):
            manifest.add("dir", parent)
        manifest.add("run", name)
        make_dirs("--run-dir", run_dir / name)
    write_json(run_dir / SEEDS_CONFIG, config)
