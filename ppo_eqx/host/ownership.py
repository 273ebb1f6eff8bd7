"""Taking a directory for a run: what is in it before a run writes it (``look_alikes``), ``--overwrite``
(``clear_run``: deletes exactly what the old run's manifest lists, nothing a user put beside it), and the new run's
directory made, locked, checked under the lock and cleared (``take_new_run``). No jax here: files only.

The lock is ``lock.py``'s, the manifest's grammar ``manifest.py``'s, and every write and delete goes through the
directory's one owner, ``run_directory.RunDirectory``. A directory that an earlier ppo-eqx wrote without a manifest
is no run of this one's: it is refused as any directory holding files named like a run's.
"""

import contextlib
import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path, PurePosixPath
from typing import NamedTuple

from ..errors import RunDirError
from .lock import RunLock, refuse_if_held
from .manifest import Kind, ManifestError, read_manifest
from .run_directory import RunDirectory
from .rundir import (
    BOOKKEEPING,
    CHECKPOINT_DIR,
    EVAL,
    LOCK,
    MANIFEST,
    METRICS,
    SEEDS_CONFIG,
    check_new_run_dir,
    claim_new_dir,
    make_dirs,
    written_checkpoint_name,
    written_name,
)
from .rundir import (
    agent_dirs as agent_dirs_of,
)
from .rundir import (
    holds_run as looks_like_a_run,
)

__all__ = ["LOCK", "MANIFEST", "ManifestError", "RunLock", "read_manifest", "refuse_if_held"]  # their owners' names


def owned_entries(run_dir: Path) -> list[tuple[Kind, str]]:
    """The run's entries: its manifest's, or none."""
    return read_manifest(run_dir) or []


def owned_agents(run_dir: Path) -> set[Path]:
    """The agents' directories of the run in ``run_dir`` (from its manifest)."""
    return {run_dir / relative for kind, relative in owned_entries(run_dir) if kind == "run"}


def has_run(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds a run of ppo-eqx's: its manifest lists something (``rundir.holds_run`` says only
    whether it looks like one)."""
    return run_dir.is_dir() and bool(owned_entries(run_dir))


def is_eval_result(path: Path) -> bool:
    """Whether ``path`` is what ``ppo-eqx eval`` writes (a JSON object with its checkpoint, episodes and returns):
    the only ``eval.json`` that ``--overwrite`` deletes or ``eval`` replaces."""
    try:
        return is_eval_result_bytes(path.read_bytes())
    except OSError:
        return False


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


# --- taking a directory for a new run ----------------------------------------------------------------------------


def refuse_links(run_dir: Path, directory: Path) -> None:
    """RunDirError naming a symbolic link in ``directory`` (``run_dir`` or one of its agents') where a run writes
    (``checkpoints``, ``metrics.jsonl``, ...): a run writes only inside its own directory, and ``--overwrite`` keeps
    what its run did not write, so it would stay in the way. A listed file that is a link is the run's to delete."""
    listed = set(owned_entries(directory)) if directory.is_dir() else set()
    for path in sorted(directory.iterdir()) if directory.is_dir() else []:
        if path.is_symlink() and written_name(path.name) and ("file", path.name) not in listed:
            shown = os.path.relpath(path, run_dir)
            raise RunDirError(
                f"--run-dir {run_dir}: {shown} is a symbolic link, where a run writes its own; a run writes only "
                "inside its directory, never through a link: remove it (or pick another --run-dir) and try again"
            )


def check_run_dirs(run_dir: Path, agent_dirs: Sequence[Path], overwrite: bool) -> None:
    """Every directory a new run writes (``run_dir``, and ``agent_dirs`` for a run of several agents) may be
    written (nothing is written or created here): not an agent's directory of another run; nothing in it named as a
    run's files that a run of ppo-eqx there did not write (``look_alikes``), or a link where a run writes
    (``refuse_links``); a run there only with ``overwrite`` (or one that never trained: a plain retry); and with
    ``overwrite`` no agent's directory holding a run that the old run did not write (``--overwrite`` deletes only
    the old run's)."""
    check_new_run_dir(run_dir, overwrite)
    for parent in run_dir.absolute().parents:
        if looks_like_a_run(parent) and any(run_dir.absolute().is_relative_to(a) for a in owned_agents(parent)):
            raise RunDirError(f"--run-dir {run_dir} is an agent's directory of the run in {parent}; allowed: a path "
                              "of its own")  # fmt: skip
    refuse_look_alikes(run_dir, run_dir)
    refuse_links(run_dir, run_dir)
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
        refuse_links(run_dir, agent_dir)


def check_resumed_dirs(run_dir: Path, agent_dirs: Sequence[Path]) -> None:
    """A run to resume wrote a manifest (ppo-eqx writes only where it knows what it wrote: an earlier ppo-eqx's run,
    without one, is refused in one line), and no link stands where it writes (``refuse_links``)."""
    if read_manifest(run_dir) is None:
        raise RunDirError(
            f"--resume {run_dir}: it holds no list of what its run wrote ({MANIFEST}: an earlier ppo-eqx wrote it), "
            "and ppo-eqx writes only where it knows what it wrote; train a new run, or resume it with the ppo-eqx "
            "that wrote it"
        )
    for directory in [run_dir, *agent_dirs]:
        refuse_links(run_dir, directory)


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
) -> tuple[RunDirectory, RunLock]:
    """Take a new run's directory whole: made and locked (``take_new_run_dir``), checked again under the lock
    (``check_run_dirs``), the old run there cleared with ``overwrite`` or by a plain retry of one that never trained
    (``report`` is given ``Cleared.lines``, what was deleted and kept, a line at a time before anything else is
    made), and for several agents (``agent_names``) their directories and ``seeds.json`` (``config``:
    ``make_agent_dirs``). The directory taken (``RunDirectory``, pinned to what the lock holds) and its lock;
    nothing locked when it is refused."""
    run_dir, lock = take_new_run_dir(run_dir, claim=claim, command=command)
    several = len(agent_names) > 1
    directory = None
    try:
        check_run_dirs(run_dir, agent_dirs_of(run_dir, agent_names) if several else [], overwrite)
        directory = RunDirectory(run_dir, lock.directory_fd())
        if has_run(run_dir) and (overwrite or never_trained(run_dir)):
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
