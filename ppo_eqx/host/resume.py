"""What a run directory holds to be resumed (``read_run``): its manifest, its config, its newest checkpoint, the
environment it was trained under and its agents' histories, read whole and checked before anything is written;
and read again under the run's lock (``read_run_again``). Every refusal is one RunDirError line that names the
flag the directory came from."""

import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, BinaryIO

from ..config import PPOConfig
from ..errors import RunDirError
from .checkpoint import CheckpointFile, check_same_run, read_bounded, read_checkpoint
from .run_dir import CONFIG, HARDWARE, MANIFEST, METRICS, SEEDS_CONFIG, agent_dirs, read_manifest

MAX_CONFIG_BYTES = 16 * 2**20
"""A ``config.json`` larger than this is not one ppo-eqx wrote."""


def read_run(run_dir: Path, who: str, environment: dict[str, str | None]) -> tuple[PPOConfig, CheckpointFile]:
    """What a run directory holds to be resumed, read whole and checked before anything is written (RunDirError
    names what is wrong, after ``who``, the flag that named it): its manifest and its config
    (``read_run_config``), its newest checkpoint (written by that config), the environment it
    was trained under against this process's (``check_same_environment``), and each agent's history up to that
    checkpoint (``checked_metrics``)."""
    config = read_run_config(run_dir, who)
    newest = read_checkpoint(run_dir)
    check_same_run(newest, config)
    names = config.agent_names()
    if newest.metadata["iteration"] > config.num_iterations:
        raise RunDirError(
            f"{who} {run_dir}: checkpoint {newest.path.name} claims iteration {newest.metadata['iteration']}, past "
            f"the run's {config.num_iterations}; it is not this run's: move it, or train a new run"
        )
    if not os.access(run_dir, os.W_OK | os.X_OK):
        raise RunDirError(f"{who} {run_dir} is not writable")
    dirs = agent_dirs(run_dir, names)
    check_same_environment(f"{who} {run_dir}", recorded_environment(dirs[0]), environment)
    for agent_dir in dirs:
        checked_metrics(agent_dir / METRICS, int(newest.metadata["iteration"]))
    return config, newest


def read_run_again(run_dir: Path, who: str, config: PPOConfig, environment: dict[str, str | None]) -> CheckpointFile:
    """The newest checkpoint of the run that ``read_run`` read as ``config``, read and checked again (under the
    run's lock: it may have gone on meanwhile); RunDirError where another run has been written there since."""
    again, newest = read_run(run_dir, who, environment)
    if again != config:
        raise RunDirError(f"{who} {run_dir}: another run was written there while this one was read; try again")
    return newest


def recorded_environment(agent_dir: Path) -> dict | None:
    """The environment an agent's run was trained under (its ``hardware.json``'s "environment"), if recorded."""
    try:
        return json.loads((agent_dir / HARDWARE).read_text()).get("environment")
    except (OSError, ValueError, AttributeError):
        return None


_TRUE = ("1", "true", "t", "yes", "y", "on")


def _meaning(name: str, value: str | None) -> str | None:
    """What a variable's value means to jax: a flag's truth (``1`` and ``true`` alike), else the text itself."""
    if name in ("JAX_ENABLE_X64", "JAX_THREEFRY_PARTITIONABLE"):
        return None if value is None else str(value.strip().lower() in _TRUE)
    return value.strip() or None if value is not None else None


def check_same_environment(run: str, recorded: dict[str, Any] | None, now: dict[str, str | None]) -> None:
    """RunDirError when the environment variables that change what a run computes (``now``: their values in this
    process, ``cli.environment.results_environment``) differ from those ``run`` was trained under (``recorded``,
    from its ``hardware.json``; None for a run of an earlier ppo-eqx: nothing to compare)."""
    if not isinstance(recorded, dict):
        return
    for name, after in now.items():
        before = recorded.get(name)
        if _meaning(name, before) != _meaning(name, after):
            was = "unset" if before is None else f"{name}={before!r}"
            is_now = "unset" if after is None else f"{name}={after!r}"
            advice = f"unset {name}" if before is None else f"set {name}={before!r}"
            raise RunDirError(
                f"{run} was trained with {was} and this process has {is_now}, which changes what it computes; "
                f"{advice} to resume it"
            )


def read_run_config(run_dir: Path, who: str) -> PPOConfig:
    """The config that the run of ppo-eqx's in ``run_dir`` was trained with: its ``config.json``, or a run of several
    agents' ``seeds.json``. First its manifest, which makes it a run of this ppo-eqx's (a damaged one is refused, as
    ``--overwrite`` refuses it)."""
    if read_manifest(run_dir) is None:
        raise RunDirError(
            f"{who} {run_dir}: it holds no list of what its run wrote ({MANIFEST}: no run, or one of an earlier "
            "ppo-eqx), and ppo-eqx writes only where it knows what it wrote; train a new run in another directory"
        )
    config_path = run_dir / CONFIG
    if not config_path.exists() and (run_dir / SEEDS_CONFIG).exists():
        config_path = run_dir / SEEDS_CONFIG
    try:
        data = read_bounded(config_path, MAX_CONFIG_BYTES, RunDirError, f"{who} {run_dir}: {config_path.name}")
        if len(data) > MAX_CONFIG_BYTES:
            raise ValueError(f"it is over {MAX_CONFIG_BYTES} bytes")
        saved = json.loads(data)
    except FileNotFoundError:
        raise RunDirError(f"{who} {run_dir}: no run there ({config_path} is missing)") from None
    except (ValueError, RecursionError) as error:  # RecursionError: JSON nested past Python's limit
        raise RunDirError(f"{who} {run_dir}: cannot read {config_path}: {str(error) or type(error).__name__}") from None
    if not isinstance(saved, dict):
        raise RunDirError(f"{who} {run_dir}: {config_path} is not a config")
    try:
        return PPOConfig.from_dict(saved)
    except ValueError as error:
        raise RunDirError(f"{who} {run_dir}: {config_path}: {error}") from None


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
        file = path.open("rb")
    except FileNotFoundError:
        if last_iteration:
            raise RunDirError(
                f"{path} is missing; resuming would leave iterations 1 .. {last_iteration} without metrics: restore "
                "it or --overwrite"
            ) from None
        return []
    except OSError as error:
        raise RunDirError(f"cannot read {path}: {error.strerror}") from None
    with file:
        try:
            read = list(_bounded_lines(file))
        except OSError as error:
            raise RunDirError(f"cannot read {path}: {error.strerror}") from None
    for line in read:
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


MAX_ROW = 1 << 20
"""Bytes of the longest line of ``metrics.jsonl`` read as a row: a row is well under a kilobyte; a longer line is
damage, skipped as a line that is not JSON is."""


def _bounded_lines(file: BinaryIO) -> Iterator[str]:
    """The lines of ``file`` of at most ``MAX_ROW`` bytes, as text; a longer one is passed over in pieces, so that
    reading costs ``MAX_ROW`` of memory whatever the file holds."""
    while piece := file.readline(MAX_ROW + 1):
        if len(piece) > MAX_ROW:  # too long for a row: pass over the rest of the line unread
            while piece and not piece.endswith(b"\n"):
                piece = file.readline(MAX_ROW)
            continue
        yield piece.decode(errors="replace").rstrip("\r\n")
