"""Which paths a command of ppo-eqx may write, and taking a directory for a run: a new run's path
(``check_new_run_dir``) and an evaluation's output (``check_output``), neither inside another run's own files;
``--overwrite`` (``clear_run``: deletes exactly what the old run's manifest lists, nothing a user put beside it); and
the new run's directory made, locked, checked again under the lock and cleared (``take_new_run``). No jax here:
files only (refused with ``errors.RunDirError``).

The lock is ``lock.py``'s; the manifest, and what a directory holds beside what its run wrote
(``check_contents``), ``manifest.py``'s; every write and delete goes through the directory's one owner,
``directory.RunDirectory``.
"""

import contextlib
import errno
import itertools
import json
import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path, PurePosixPath
from typing import NamedTuple

from ...errors import RunDirError
from .directory import RunDirectory
from .lock import RunLock
from .manifest import check_contents, holds_run, never_trained, written_name
from .names import BOOKKEEPING, EVAL, MANIFEST, SEEDS_CONFIG
from .names import agent_dirs as agent_dirs_of


def is_eval_result(path: Path) -> bool:
    """Whether ``path`` is what ``ppo-eqx eval`` writes (a JSON object with its checkpoint, episodes and returns):
    the only ``eval.json`` that ``--overwrite`` deletes or ``eval`` replaces."""
    try:
        return is_eval_result_bytes(path.read_bytes())
    except OSError:
        return False


# --- --overwrite ------------------------------------------------------------------------------------------------


class Cleared(NamedTuple):
    """What ``clear_run`` deleted and what it kept (relative paths, directories with a trailing ``/``)."""

    deleted: list[str]
    kept: list[str]

    def lines(self, run_dir: Path, flag: str | None) -> list[str]:
        """What clearing the old run in ``run_dir`` did, a line each for the user: what it deleted and what it
        kept. ``flag`` (``--overwrite``) None: a plain retry of a run that stopped before anything of it could be
        kept."""
        said = []
        if flag is None:
            said.append(f"{run_dir} held a run that stopped before its first iteration; starting it afresh")
        who = flag or "the retry"
        if self.deleted:
            said.append(f"{who} deleted what the old run wrote: {', '.join(self.deleted)}")
        if self.kept:
            said.append(f"{who} kept what the old run did not write: {', '.join(self.kept)}")
        return said


def clear_run(directory: RunDirectory) -> Cleared:
    """Delete what the run in ``directory`` wrote (its manifest's entries, agents' directories recursively; an
    ``eval.json`` only if ``ppo-eqx eval`` wrote it), never through a link, and say what was deleted and what is left
    that it did not write. The manifest is checked whole first (``read_manifest``): a damaged one deletes nothing."""
    entries = directory.entries()
    deleted: list[str] = []
    for kind, relative in entries:
        with contextlib.suppress(RunDirError):  # a link on the way: kept, and said so below
            if kind == "file" and relative == EVAL and not is_eval_result_bytes(directory.read(EVAL)):
                continue  # a user's own eval.json, not ppo-eqx eval's: kept, and said so below
            if kind == "file" and directory.delete(relative):
                deleted.append(relative)
            elif kind == "tree" and directory.remove_tree(relative):
                deleted.append(f"{relative}/")
    kept: list[str] = []
    for kind, relative in entries:
        agent = directory.existing_child(relative) if kind == "run" else None
        if agent is not None:
            with agent:
                inner = clear_run(agent)
                agent.remove_bookkeeping()
            deleted += [f"{relative}/{name}" for name in inner.deleted]
            kept += [f"{relative}/{name}" for name in inner.kept]
            directory.remove_dir_if_empty(relative)
    for kind, relative in sorted(entries, key=lambda entry: -len(PurePosixPath(entry[1]).parts)):
        if kind == "dir":
            directory.remove_dir_if_empty(relative)
    directory.forget_all()
    dirs = {relative for kind, relative in entries if kind == "dir"}
    runs = {relative for kind, relative in entries if kind == "run"}
    return Cleared(deleted, kept + _leftovers(directory, "", dirs, runs))


def is_eval_result_bytes(data: bytes | None) -> bool:
    """Whether ``data`` (an ``eval.json``'s bytes, None if missing) is what ``ppo-eqx eval`` writes."""
    try:
        result = json.loads(data) if data is not None else None
    except (ValueError, RecursionError):
        return False
    return isinstance(result, dict) and {"checkpoint", "episodes", "returns", "mean_return"} <= set(result)


def _leftovers(directory: RunDirectory, prefix: str, dirs: set[str], runs: set[str]) -> list[str]:
    """What is left in ``directory/prefix``: each entry, and inside a directory that the run made, what is in it
    (agents' directories are cleared, and report what they kept, on their own)."""
    left = []
    for name in directory.names(prefix.rstrip("/")):
        relative = f"{prefix}{name}"
        if (not prefix and name in BOOKKEEPING) or relative in runs:
            continue
        is_dir = directory.is_dir(relative)
        if relative in dirs and is_dir:
            left += _leftovers(directory, f"{relative}/", dirs, runs)
        else:
            left.append(f"{relative}/" if is_dir else relative)
    return left


# --- the paths a command writes: a new run's directory, an evaluation's output --------------------------------


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
    try:  # what os.access cannot say (a read-only or pseudo file system, root's writes refused): a file made there
        fd, probe = tempfile.mkstemp(prefix=".ppo-eqx-probe-", dir=parent)
        os.close(fd)
        os.unlink(probe)
    except OSError as error:
        raise RunDirError(f"{flag} {path}: cannot write in {parent}: {error.strerror or error}") from None


def check_new_run_dir(run_dir: Path, overwrite: bool) -> None:
    """RunDirError unless a new run may be written to ``run_dir`` as far as its path goes (nothing is written or
    created here; what is in it is ``check_run_dirs``'s)."""
    check_path("--run-dir", run_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise RunDirError(f"--run-dir {run_dir} is a file, not a directory")
    # A run among another run's own files (its checkpoints/) would go with them when that run is overwritten.
    _check_not_in_a_run("--run-dir", run_dir)
    existing = next((p for p in (run_dir, *run_dir.parents) if p.exists()), Path("."))
    if not os.access(existing, os.W_OK | os.X_OK):
        raise RunDirError(f"--run-dir {run_dir} is not writable: {existing} is not writable")


# --- taking a directory for a new run ----------------------------------------------------------------------------


def check_run_dirs(run_dir: Path, agent_dirs: Sequence[Path], overwrite: bool) -> None:
    """Every directory a new run writes (``run_dir``, and ``agent_dirs`` for a run of several agents) may be
    written (nothing is written or created here): each path (``check_new_run_dir``), then what each holds against
    what its run wrote (``manifest.check_contents``)."""
    for directory in (run_dir, *agent_dirs):
        check_new_run_dir(directory, overwrite)
    check_contents(run_dir, agent_dirs, overwrite)


def take_new_run_dir(run_dir: Path, *, claim: bool, command: str) -> tuple[Path, RunLock]:
    """Create the new run's directory (``claim``: a default name, made fresh as ``run_dir`` or ``run_dir__2``, ...:
    ``claim_new_dir``) and lock it: the directory taken, and its lock. The caller checks what it holds again under
    the lock before anything is written."""
    if claim:
        run_dir = claim_new_dir(run_dir)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise RunDirError(f"--run-dir {run_dir} is not writable: {error.strerror}") from None
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
) -> tuple[RunDirectory, RunLock]:
    """Take a new run's directory whole: made and locked (``take_new_run_dir``) and opened, what it holds checked
    again under the lock (``check_contents``), the old run there cleared with ``overwrite`` or by a plain retry of
    one that never trained (``report`` is given ``Cleared.lines``, what was deleted and kept, a line at a time before
    anything else is made), and for several agents (``agent_names``) their directories and ``seeds.json``
    (``config``: ``make_agent_dirs``). The directory taken (``RunDirectory``, pinned to what the lock holds) and its
    lock; nothing locked when it is refused."""
    run_dir, lock = take_new_run_dir(run_dir, claim=claim, command=command)
    several = len(agent_names) > 1
    directory = None
    try:
        fd = lock.directory_fd()
        directory = RunDirectory(run_dir, fd)
        # What it holds may have changed before the lock (its path was checked before it was made).
        entries = check_contents(run_dir, agent_dirs_of(run_dir, agent_names) if several else [], overwrite)
        if entries and (overwrite or never_trained(run_dir, entries)):
            for line in clear_run(directory).lines(run_dir, "--overwrite" if overwrite else None):
                report(line)
        if several:
            make_agent_dirs(directory, agent_names, config)
    except BaseException:
        if directory is not None:
            directory.close()
        lock.release()
        raise
    return directory, lock


def make_agent_dirs(directory: RunDirectory, names: Sequence[str], config: dict) -> None:
    """The agents' directories of a run of several (``seedK``, ``SETTING/seedK``) and its ``seeds.json``
    (``config``), each listed in the run's manifest before it is made."""
    for name in names:
        directory.child(name).close()
    directory.write_json(SEEDS_CONFIG, config)
