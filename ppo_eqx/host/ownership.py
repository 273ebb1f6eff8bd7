"""A run directory has one owner at a time (``RunLock``), and the run keeps a list of what it wrote there
(``Manifest``), so that ``--overwrite`` deletes exactly that (``clear_run``) and nothing a user put beside it.
No jax here: files only.

The lock is ``fcntl.flock`` on ``RUN_DIR/.ppo-eqx.lock``, held for the life of the process that trains: the
kernel releases it on every exit, SIGKILL included, so a dead holder never blocks the next run, whatever its lock
file still says (the holder's pid, host and command, written there for the refusal's message only). The file is
never deleted: a process waiting on a deleted lock file would lock a file that nobody else sees. On NFS, Linux
emulates ``flock`` with byte-range locks (NLM), which hold across hosts when the server's lock manager runs.
"""

import contextlib
import errno
import fcntl
import json
import os
import re
import shutil
import socket
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Literal

from ..config import PPOConfig
from ..errors import ConfigError, RunDirError
from .rundir import (
    CHECKPOINT_DIR,
    RUN_FILES,
    SEEDS_CONFIG,
    TENSORBOARD_GLOB,
    temporary_of,
    write_atomic,
)

LOCK = ".ppo-eqx.lock"
MANIFEST = ".ppo-eqx-manifest.jsonl"
OWN = (LOCK, MANIFEST)
"""The run directory's bookkeeping: never deleted, never listed as the user's."""
HOLDER_WAIT_S = 2.0
"""How long a refused process waits for the holder to write who it is (it locks first, then writes)."""


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


def _holder(fd: int) -> str:
    """Who holds the lock whose file is open as ``fd``, in words, from what the holder wrote there."""
    deadline = time.monotonic() + HOLDER_WAIT_S
    while True:
        text = os.pread(fd, 4096, 0).decode(errors="replace")
        try:
            holder = json.loads(text)
            if not _gone(holder) or time.monotonic() > deadline:
                return f"pid {holder['pid']} on host {holder['host']} ({holder['command']} since {holder['since']})"
        except (ValueError, KeyError, TypeError):
            if time.monotonic() > deadline:
                return "another process (it wrote no name in its lock file)"
        time.sleep(0.02)


class RunLock:
    """The exclusive lock of a run directory, held until ``release`` or the process's end."""

    def __init__(self, run_dir: Path, fd: int):
        self.run_dir, self._fd = run_dir, fd

    @classmethod
    def take(cls, run_dir: Path, command: str) -> "RunLock":
        """Lock ``run_dir`` (an existing directory) for this process, or RunDirError naming the holder."""
        try:
            fd = os.open(run_dir / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as error:
            raise RunDirError(f"--run-dir {run_dir} is not writable: {error.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            holder = _holder(fd) if error.errno in (errno.EWOULDBLOCK, errno.EAGAIN) else None
            os.close(fd)
            if holder is None:
                raise RunDirError(f"cannot lock {run_dir}: {error.strerror}") from None
            raise RunDirError(f"{run_dir} is in use by {holder}; wait for it to end or stop it") from None
        holder = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "since": time.strftime("%Y-%m-%d %H:%M:%S"),
            "command": command,
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(holder) + "\n").encode(), 0)
        return cls(run_dir, fd)

    def release(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._fd)


def refuse_if_held(run_dir: Path) -> None:
    """RunDirError naming the holder when another process holds ``run_dir``'s lock; creates nothing (a directory
    without a lock file is held by nobody). A cheap first check: the lock itself is ``RunLock.take``."""
    try:
        fd = os.open(run_dir / LOCK, os.O_RDWR)
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as error:
        if error.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            raise RunDirError(f"{run_dir} is in use by {_holder(fd)}; wait for it to end or stop it") from None
    finally:
        os.close(fd)


Kind = Literal["file", "dir", "run", "tree"]
"""What a run made: a ``file``; a ``dir`` that holds its files (removed once empty); an agent's ``run`` directory
(with its own manifest); a ``tree`` that another library fills (W&B's), removed whole."""


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
        with open(self.path, "a") as file:
            file.write(json.dumps(list(entry)) + "\n")
        self._known.add(entry)

    def add_all(self, entries: Iterable[tuple[Kind, str]]) -> None:
        for kind, relative in entries:
            self.add(kind, relative)


def read_manifest(run_dir: Path) -> list[tuple[Kind, str]] | None:
    """The entries of ``run_dir``'s manifest, in order; None when it has none (a run of an earlier ppo_eqx). A line
    cut short by a kill is skipped."""
    try:
        lines = (run_dir / MANIFEST).read_text().splitlines()
    except FileNotFoundError:
        return None
    entries = []
    for line in lines:
        with contextlib.suppress(ValueError):
            kind, relative = json.loads(line)
            if kind in ("file", "dir", "run", "tree") and isinstance(relative, str) and _inside(relative):
                entries.append((kind, relative))
    return entries


def _inside(relative: str) -> bool:
    """Whether ``relative`` names something inside the run directory (no absolute path, no ``..``)."""
    path = Path(relative)
    return not path.is_absolute() and ".." not in path.parts and relative not in ("", ".")


_CHECKPOINT = re.compile(r"\.?iter_\d{6,}\.(eqx|json)(\.tmp)?")


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
    for name in _legacy_agents(run_dir):
        for parent in reversed(Path(name).parents[:-1]):
            entries.append(("dir", parent.as_posix()))
        entries.append(("run", name))
    return entries


def _legacy_agents(run_dir: Path) -> list[str]:
    """The agents' directories named by ``run_dir/seeds.json`` (none when it is missing or unreadable)."""
    try:
        config = PPOConfig.from_dict(json.loads((run_dir / SEEDS_CONFIG).read_text()))
    except (OSError, ValueError, ConfigError):
        return []
    return config.agent_names() if config.num_agents > 1 else []


def adopt_legacy_run(run_dir: Path) -> None:
    """Give a run written before the manifest existed (and each of its agents) a manifest of what it wrote, by
    ``legacy_entries``, before a resumed run adds its own files: a later ``--overwrite`` then deletes both."""
    if read_manifest(run_dir) is not None:
        return
    entries = legacy_entries(run_dir)
    for kind, relative in entries:
        if kind == "run":
            adopt_legacy_run(run_dir / relative)
    Manifest(run_dir).add_all(entries)


def owned_entries(run_dir: Path) -> tuple[list[tuple[Kind, str]], bool]:
    """The run's entries and whether they come from its manifest (else ``legacy_entries``)."""
    entries = read_manifest(run_dir)
    return (entries, True) if entries is not None else (legacy_entries(run_dir), False)


def owned_agents(run_dir: Path) -> set[Path]:
    """The agents' directories of the run in ``run_dir`` (from its manifest, or its ``seeds.json``)."""
    return {run_dir / relative for kind, relative in owned_entries(run_dir)[0] if kind == "run"}


def clear_run(run_dir: Path) -> list[str]:
    """Delete what the run in ``run_dir`` wrote (its manifest's entries, agents' directories recursively), and
    return what is left that it did not write (relative paths, directories with a trailing ``/``)."""
    entries, _ = owned_entries(run_dir)
    kept: list[str] = []
    for kind, relative in entries:
        path = run_dir / relative
        if kind == "file":
            path.unlink(missing_ok=True)
            temporary_of(path).unlink(missing_ok=True)
        elif kind == "tree":
            shutil.rmtree(path, ignore_errors=True)
    for kind, relative in entries:
        path = run_dir / relative
        if kind == "run" and path.is_dir() and not path.is_symlink():
            kept += [f"{relative}/{name}" for name in clear_run(path)]
            _remove_own(path)
            _remove_if_empty(path)
    for kind, relative in sorted(entries, key=lambda entry: -len(Path(entry[1]).parts)):
        if kind == "dir":
            _remove_if_empty(run_dir / relative)
    write_atomic(run_dir / MANIFEST, b"")
    dirs = {relative for kind, relative in entries if kind == "dir"}
    runs = {relative for kind, relative in entries if kind == "run"}
    return kept + _leftovers(run_dir, "", dirs, runs)


def _remove_own(agent_dir: Path) -> None:
    for name in OWN:
        (agent_dir / name).unlink(missing_ok=True)


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
        if (not prefix and path.name in OWN) or relative in runs:
            continue
        if relative in dirs and path.is_dir() and not path.is_symlink():
            left += _leftovers(run_dir, f"{relative}/", dirs, runs)
        else:
            left.append(f"{relative}/" if path.is_dir() else relative)
    return left
