"""The run directory as one object that owns every write (``RunDirectory``), as a database owns its files. No jax
here: files only.

Every write, rename and delete of a run goes through it: it lists a thing in the manifest (``manifest.py``) before
it makes it; it writes relative to an open descriptor of the directory it was given (for a run that trains, the one
its lock holds: ``lock.RunLock.directory_fd``), so a path that is moved or repointed while the run goes on (a
``runs/latest`` link) leads nowhere it writes; it opens every directory on the way with ``O_NOFOLLOW`` and never
writes through a symbolic link (one where a run would write is refused in one line); it deletes only what its
manifest lists; and a file it appends to that is hard-linked elsewhere (a backup) is replaced by a copy of its own
first, so the other link keeps what it held.
"""

import contextlib
import errno
import json
import os
import shutil
import stat
from pathlib import Path, PurePosixPath
from typing import Any

from ...errors import RunDirError
from .lock import kind_of
from .manifest import Kind, read_manifest, written_entry
from .names import BOOKKEEPING, MANIFEST

_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW


def temporary_name(name: str) -> str:
    """The temporary file that an atomic write of ``name`` writes before it renames it (``.NAME.tmp``)."""
    return f".{name}.tmp"


class RunDirectory:
    """A run's directory, pinned: ``path`` is what messages call it, ``fd`` the directory itself.

    ``RunDirectory.at(path)`` opens (and makes) a directory for the library's writes (``save_checkpoint``);
    ``RunDirectory(path, lock.directory_fd())`` is the locked directory of a run that trains; ``child(name)`` an
    agent's directory inside it, with its own manifest. Close it (or use it as a context manager) when done.
    """

    def __init__(self, path: Path, fd: int):
        """``fd`` is the directory's, this object's to close from now on (also when its manifest is refused here)."""
        self.path, self._fd = path, fd
        self._dirs: dict[str, int] = {}
        try:
            self._listed: set[tuple[Kind, str]] = set(read_manifest(path, dir_fd=fd) or [])
        except BaseException:
            os.close(fd)
            raise
        self._manifest_own = False

    @classmethod
    def at(cls, path: Path) -> "RunDirectory":
        """``path`` (made if missing, its parents too) opened as a run directory; RunDirError naming it otherwise."""
        try:
            path.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        except OSError as error:
            raise RunDirError(f"{path} is not a directory ppo-eqx can write: {error.strerror}") from None
        return cls(path, fd)

    def __enter__(self) -> "RunDirectory":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for fd in [*self._dirs.values(), self._fd]:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._dirs.clear()

    # --- where it is ------------------------------------------------------------------------------------------

    def in_place(self) -> bool:
        """Whether ``path`` still names this directory (not moved, removed, or a link repointed)."""
        try:
            return os.path.samestat(os.stat(self.path), os.fstat(self._fd))
        except OSError:
            return False

    def where(self) -> str:
        """Where this directory is now, as the kernel knows it (``path`` where it cannot say)."""
        with contextlib.suppress(OSError):
            found = os.readlink(f"/proc/self/fd/{self._fd}")
            if found.startswith("/"):
                return found
        return str(self.path)

    def child(self, relative: str) -> "RunDirectory":
        """The agent's directory ``relative`` (``seedK``, ``SETTING/seedK``), listed and made here first."""
        parts = PurePosixPath(relative).parts
        for depth in range(1, len(parts)):
            self.make_dir("/".join(parts[:depth]), "dir")
        self.make_dir(relative, "run")
        fd = os.open(parts[-1], _DIRECTORY, dir_fd=self._dir_fd(parts[:-1], relative))
        return RunDirectory(self.path / relative, fd)

    def existing_child(self, relative: str) -> "RunDirectory | None":
        """The agent's directory ``relative`` if it is there as a directory (not through a link), else None."""
        parts = PurePosixPath(relative).parts
        try:
            fd = os.open(parts[-1], _DIRECTORY, dir_fd=self._dir_fd(parts[:-1], relative))
        except (OSError, RunDirError):
            return None
        return RunDirectory(self.path / relative, fd)

    # --- the manifest -------------------------------------------------------------------------------------------

    def listed(self, kind: Kind, relative: str) -> bool:
        return (kind, relative) in self._listed

    def entries(self) -> list[tuple[Kind, str]]:
        """What the manifest lists now, read again (untrusted: ``read_manifest``)."""
        return read_manifest(self.path, dir_fd=self._fd) or []

    def list_entry(self, kind: Kind, relative: str) -> None:
        """Append ``[kind, relative]`` to the manifest, before the thing is made (once: a listed entry is not
        listed again)."""
        entry = (kind, PurePosixPath(relative).as_posix())
        if entry in self._listed:
            return
        if not written_entry(*entry):
            raise ValueError(f"{entry} is not an entry that a run writes")
        self._own_copy(MANIFEST, "manifest")
        fd = self._open(MANIFEST, os.O_WRONLY | os.O_APPEND | os.O_CREAT, self._fd)
        try:
            write_all(fd, (json.dumps(list(entry)) + "\n").encode())
        except OSError as error:
            raise OSError(error.errno, error.strerror, str(self.path / MANIFEST)) from None
        finally:
            os.close(fd)
        self._listed.add(entry)

    # --- writes -------------------------------------------------------------------------------------------------

    def write(self, relative: str, data: bytes) -> None:
        """Write ``relative`` whole, listed first: a temporary file beside it, fsynced and renamed over it, the
        directory fsynced; a failure leaves the old file as it was. A crash leaves the old file or the new one."""
        self.list_entry("file", relative)
        parent, name = self._parent(relative)
        try:
            write_whole(parent, name, data)
        except OSError as error:
            if error.errno == errno.ELOOP:
                raise self._not_followed(relative, stat.S_IFLNK) from None
            raise OSError(error.errno, error.strerror, str(self.path / relative)) from None

    def write_json(self, relative: str, data: Any) -> None:
        self.write(relative, json_bytes(data))

    def append(self, relative: str, *, new: bool = False) -> int:
        """A descriptor that appends to ``relative`` (made if missing; with ``new``, only made), listed first. A file
        hard-linked elsewhere is first replaced by a copy of its own."""
        self.list_entry("file", relative)
        parent, name = self._parent(relative)
        if not new:
            self._own_copy(name, relative, parent)
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | (os.O_EXCL if new else 0)
        return self._open(name, flags, parent, relative)

    def make_dir(self, relative: str, kind: Kind = "dir") -> None:
        """The directory ``relative``, listed first; one that is there must be a directory, not a link to one."""
        self.list_entry(kind, relative)
        parent, name = self._parent(relative)
        try:
            os.mkdir(name, 0o755, dir_fd=parent)
        except FileExistsError:
            mode = os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode
            if not stat.S_ISDIR(mode):
                raise self._not_followed(relative, mode) from None
        except OSError as error:
            raise RunDirError(f"cannot make {self.path / relative}: {error.strerror}") from None

    def read(self, relative: str) -> bytes | None:
        """The bytes of ``relative`` (None if missing), never through a link."""
        parent, name = self._parent(relative)
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=parent)
        except FileNotFoundError:
            return None
        except OSError as error:
            raise RunDirError(f"cannot read {self.path / relative}: {error.strerror}") from None
        with os.fdopen(fd, "rb") as file:
            return file.read()

    def names(self, relative: str = "") -> list[str]:
        """What the directory ``relative`` holds (empty if it is missing)."""
        try:
            fd = self._dir_fd(PurePosixPath(relative).parts, relative) if relative else self._fd
            return sorted(os.listdir(fd))
        except (FileNotFoundError, RunDirError):
            return []

    def delete(self, relative: str) -> bool:
        """Delete the file ``relative`` and its temporary, if the manifest lists it (nothing else is ever
        deleted): whether it was there."""
        if not self.listed("file", relative):
            return False
        parent, name = self._parent(relative)
        found = False
        for each in (name, temporary_name(name)):
            with contextlib.suppress(FileNotFoundError, IsADirectoryError, PermissionError):
                os.unlink(each, dir_fd=parent)
                found = True
        return found

    def is_dir(self, relative: str) -> bool:
        """Whether ``relative`` is a directory here (a link to one is not)."""
        parent, name = self._parent(relative)
        try:
            return stat.S_ISDIR(os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode)
        except OSError:
            return False

    def remove_tree(self, relative: str) -> bool:
        """Delete the listed tree ``relative`` (what another library fills: W&B's) whole, never through a link."""
        if not self.listed("tree", relative) or not self.is_dir(relative):
            return False
        parent, name = self._parent(relative)
        shutil.rmtree(name, dir_fd=parent)
        return True

    def remove_dir_if_empty(self, relative: str) -> None:
        """Remove the listed directory ``relative`` if it is empty (what a user put there keeps it)."""
        if not (self.listed("dir", relative) or self.listed("run", relative)) or not self.is_dir(relative):
            return
        parent, name = self._parent(relative)
        with contextlib.suppress(OSError):
            os.rmdir(name, dir_fd=parent)

    def remove_bookkeeping(self) -> None:
        """Delete this directory's lock file and manifest (an agent's directory, cleared)."""
        for name in BOOKKEEPING:
            with contextlib.suppress(FileNotFoundError, IsADirectoryError, PermissionError):
                os.unlink(name, dir_fd=self._fd)
        self._listed.clear()

    def forget_all(self) -> None:
        """An empty manifest, written whole: what it listed is gone (``take.clear_run``)."""
        write_whole(self._fd, MANIFEST, b"")
        self._listed.clear()
        self._manifest_own = True

    # --- the way there ------------------------------------------------------------------------------------------

    def _parent(self, relative: str) -> tuple[int, str]:
        parts = PurePosixPath(relative).parts
        return self._dir_fd(parts[:-1], relative), parts[-1]

    def _dir_fd(self, parts: tuple[str, ...], relative: str) -> int:
        """The directory ``parts`` inside this one, each step opened without following a link (kept open, and
        checked to be what its name still holds: a directory made anew is opened anew)."""
        fd = self._fd
        for depth in range(1, len(parts) + 1):
            key = "/".join(parts[:depth])
            cached = self._dirs.get(key)
            try:
                now = os.stat(parts[depth - 1], dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                raise RunDirError(f"{self.path / key} is missing; a run writes {relative} inside it") from None
            if not stat.S_ISDIR(now.st_mode):
                raise self._not_followed(key, now.st_mode)
            if cached is None or not os.path.samestat(os.fstat(cached), now):
                if cached is not None:
                    os.close(cached)
                cached = self._dirs[key] = os.open(parts[depth - 1], _DIRECTORY, dir_fd=fd)
            fd = cached
        return fd

    def _open(self, name: str, flags: int, dir_fd: int, relative: str | None = None) -> int:
        try:
            return os.open(name, flags | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644, dir_fd=dir_fd)
        except OSError as error:
            if error.errno == errno.ELOOP:
                raise self._not_followed(relative or name, stat.S_IFLNK) from None
            raise RunDirError(f"cannot write {self.path / (relative or name)}: {error.strerror}") from None

    def _own_copy(self, name: str, relative: str, dir_fd: int | None = None) -> None:
        """Replace ``name`` by a copy of its own when it is hard-linked elsewhere (a backup made with ``cp -l``):
        what this run appends then leaves the other link as it was."""
        dir_fd = self._fd if dir_fd is None else dir_fd
        if name == MANIFEST and self._manifest_own:
            return
        try:
            found = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            return
        if not stat.S_ISREG(found.st_mode):
            raise self._not_followed(relative if name != MANIFEST else MANIFEST, found.st_mode)
        if found.st_nlink > 1:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=dir_fd)
            with os.fdopen(fd, "rb") as file:
                data = file.read()
            write_whole(dir_fd, name, data)
        if name == MANIFEST:
            self._manifest_own = True

    def _not_followed(self, relative: str, mode: int) -> RunDirError:
        return RunDirError(
            f"{self.path / relative} is a {kind_of(mode)}, where a run writes its own; a run writes only inside its "
            "directory, never through a link: remove it (or pick another --run-dir) and try again"
        )


# --- the atomic write, for the run's files and (outside a run) ``ppo-eqx eval``'s results -------------------------


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


def json_bytes(data: Any) -> bytes:
    """``data`` as the JSON the run directory holds (indented, no NaN: a ValueError before anything is written)."""
    return (json.dumps(data, indent=2, allow_nan=False) + "\n").encode()


def write_json(path: Path, data: Any) -> None:
    """Write ``data`` as JSON atomically (``write_atomic``)."""
    write_atomic(path, json_bytes(data))
