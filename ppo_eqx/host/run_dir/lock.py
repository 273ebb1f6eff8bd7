"""A run directory has one owner at a time: ``RunLock``, ``fcntl.flock`` on the run directory itself, held for the
life of the process that trains. No jax here: files only.

The kernel releases the lock on every exit, SIGKILL included, so a dead holder never blocks the next run. It is the
directory's inode that is locked, which no file operation inside it can replace: deleting, renaming over or
replacing ``.ppo-eqx.lock`` (which only names the holder: its pid, host and command, for the refusal's message)
changes nothing. Where a file system cannot lock a directory (NFS emulates ``flock`` with byte-range locks, which
need a file open for writing), the lock falls back to the lock file, checked after locking to be the file its path
still names (a file replaced between the open and the lock is not locked). The locked directory's descriptor is what
the run writes through (``directory.RunDirectory``): a path that is moved or repointed afterwards leads
nowhere the run writes.
"""

import contextlib
import errno
import fcntl
import json
import os
import socket
import stat
import time
from pathlib import Path

from ...errors import RunDirError
from .names import LOCK

HOLDER_WAIT_S = 2.0
"""How long a refused process waits for the holder to write who it is (it locks first, then writes)."""


def kind_of(mode: int) -> str:
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
        raise RunDirError(f"{path} is a {kind_of(mode)}, not the file ppo-eqx keeps there; remove it and try again")
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
        data = (json.dumps(holder) + "\n").encode()
        if stat.S_ISDIR(os.fstat(self._fd).st_mode):  # the directory is the lock: its lock file only says who
            self._replace_holder(data)
            return
        fd = _open_regular(self.run_dir / LOCK, os.O_RDWR | os.O_CREAT)  # the lock file is the lock: written in place
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, data, 0)
        except OSError as error:
            raise RunDirError(f"--run-dir {self.run_dir} is not writable: {error.strerror}") from None
        finally:
            os.close(fd)

    def _replace_holder(self, data: bytes) -> None:
        """The lock file written anew and renamed over its name: a lock file hard-linked into another directory
        (``cp -al RUN BAK``) keeps saying who holds that one."""
        try:
            mode = os.lstat(self.run_dir / LOCK).st_mode
        except FileNotFoundError:
            mode = None
        if mode is not None and not stat.S_ISREG(mode):  # a link, a FIFO, a directory: not ours to replace
            raise RunDirError(
                f"{self.run_dir / LOCK} is a {kind_of(mode)}, not the file ppo-eqx keeps there; remove it and try again"
            )
        temporary = self.run_dir / f"{LOCK}.{os.getpid()}.tmp"
        try:
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)
            os.replace(temporary, self.run_dir / LOCK)
        except OSError as error:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise RunDirError(f"--run-dir {self.run_dir} is not writable: {error.strerror}") from None

    def directory_fd(self) -> int:
        """A new descriptor of the directory this lock holds: the locked descriptor's own duplicate, or (where the
        lock is on the lock file) the directory opened now and checked to hold that very lock file."""
        if stat.S_ISDIR(os.fstat(self._fd).st_mode):
            return os.dup(self._fd)
        fd = os.open(self.run_dir, os.O_RDONLY | os.O_DIRECTORY)
        try:
            inside = os.stat(LOCK, dir_fd=fd, follow_symlinks=False)
        except OSError:
            inside = None
        if inside is None or not os.path.samestat(inside, os.fstat(self._fd)):
            os.close(fd)
            raise RunDirError(f"{self.run_dir} was moved or replaced as it was locked; try again")
        return fd

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
