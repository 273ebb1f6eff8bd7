"""Reading run directories for the report: each usable run, and each unusable one with its reason.

A run directory holds ``config.json``, ``metrics.jsonl``, ``hardware.json`` and, once finished,
``summary.json`` (the names are ``ppo_eqx.host.run_dir.names``'s). Anything unusable is skipped with a reason, never
fatal. A ``--num-seeds`` run's own directory holds ``seeds.json`` and no run files: its ``seedK/``
directories are the runs; under a ``--sweep`` they are ``SETTING/seedK/``, one folder per setting.

A run's *setting* is its config but for ``NOT_SETTING_FIELDS``: runs of one game with equal settings are
seeds of one experiment, runs with different ones (a sweep's) are compared setting by setting.
"""

import dataclasses
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any, TypeGuard

import numpy as np

from ppo_eqx.config import PPOConfig
from ppo_eqx.errors import RunDirError
from ppo_eqx.host.run_dir import names as rundir

NAN = float("nan")
READ_FILES = (rundir.CONFIG, rundir.METRICS, rundir.SUMMARY, rundir.HARDWARE)
"""The files the report reads; a directory holding any of them is a run directory."""
NOT_SETTING_FIELDS = ("seed", "num_seeds", "sweep", "conv_impl", "minibatch_unroll")
"""Config fields that do not tell settings apart: the seed; how many agents one program trained and what it
swept (an agent's config says 1 and no sweep; older configs have no ``sweep``); how the convolutions and the
minibatch loop are computed (the same numbers within float32 rounding)."""


@dataclasses.dataclass(frozen=True)
class Run:
    """One training run as read from its directory.

    global_step, episodic_return, time_elapsed: one entry per logged iteration (float64; episodic_return
    is NaN where no episode finished). final_step, final_seconds: from summary.json when the run finished,
    else the last logged iteration.
    """

    run_dir: Path
    env_id: str
    seed: int
    config: dict[str, Any]
    global_step: np.ndarray
    episodic_return: np.ndarray
    time_elapsed: np.ndarray
    hardware: dict[str, Any] | None
    summary: dict[str, Any] | None

    @property
    def finished(self) -> bool:
        return self.summary is not None

    @property
    def final_step(self) -> int:
        value = (self.summary or {}).get("global_step")
        return int(value) if _is_number(value) else int(self.global_step[-1])

    @property
    def final_seconds(self) -> float:
        value = (self.summary or {}).get("time_elapsed")
        return float(value) if _is_number(value) else float(self.time_elapsed[-1])

    @property
    def setting(self) -> str:
        """The run's setting as a canonical string (``setting_key``): equal for the seeds of one setting."""
        return setting_key(self.config)

    @property
    def batch_size(self) -> int:
        """num_envs * num_steps from the config, else the last step increment of the log (0 if unknown)."""
        num_envs, num_steps = self.config.get("num_envs"), self.config.get("num_steps")
        if _is_int(num_envs) and _is_int(num_steps):
            return num_envs * num_steps
        return int(self.global_step[-1] - self.global_step[-2]) if self.global_step.size > 1 else 0


@dataclasses.dataclass(frozen=True)
class SkippedRun:
    path: Path
    reason: str


def _is_number(value: Any) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as error:
        raise RunDirError(f"{path.name}: cannot read ({error})") from error
    except json.JSONDecodeError as error:
        raise RunDirError(f"{path.name}: invalid JSON ({error})") from error


def _read_json_object(path: Path) -> dict[str, Any] | None:
    """The JSON object in ``path``; None when there is no such file."""
    if not path.is_file():
        return None
    value = _read_json(path)
    if not isinstance(value, dict):
        raise RunDirError(f"{path.name}: not a JSON object")
    return value


def _metrics_row(line: str, number: int) -> tuple[float, float, float]:
    """(global_step, episodic_return, time_elapsed) of one parsed line; a null return becomes NaN."""
    row = json.loads(line)
    where = f"{rundir.METRICS} line {number}"
    if not isinstance(row, dict):
        raise RunDirError(f"{where}: not a JSON object")
    for key in ("global_step", "time_elapsed"):
        if not _is_number(row.get(key)):
            raise RunDirError(f"{where}: {key} missing or not a number")
    episodic_return = row.get("episodic_return", None)
    if episodic_return is not None and not _is_number(episodic_return):
        raise RunDirError(f"{where}: episodic_return is not a number or null")
    return row["global_step"], NAN if episodic_return is None else episodic_return, row["time_elapsed"]


def _read_metrics(path: Path, *, finished: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(global_step, episodic_return, time_elapsed) of metrics.jsonl, one entry per iteration.

    The last line of an unfinished run may have been cut by the kill that interrupted it: it is dropped.
    """
    try:
        lines = [line for line in path.read_text().splitlines() if line.strip()]
    except (OSError, UnicodeDecodeError) as error:
        raise RunDirError(f"{rundir.METRICS}: cannot read ({error})") from error
    rows = []
    for number, line in enumerate(lines, start=1):
        try:
            rows.append(_metrics_row(line, number))
        except json.JSONDecodeError as error:
            if number == len(lines) and not finished:
                break
            raise RunDirError(f"{rundir.METRICS} line {number}: invalid JSON ({error})") from error
    if not rows:
        raise RunDirError(f"{rundir.METRICS} has no iterations")
    columns = np.array(rows, dtype=np.float64)
    return columns[:, 0], columns[:, 1], columns[:, 2]


def load_run(run_dir: str | os.PathLike[str], *, include_unfinished: bool = False) -> Run:
    """Read one run directory, or raise RunDirError saying why it cannot be used.

    Needs config.json (an object with ``env_id`` and an integer ``seed``) and metrics.jsonl (one object per
    iteration with numeric ``global_step``, ``time_elapsed`` and a number or null ``episodic_return``).
    hardware.json is optional. Without summary.json the run is unfinished (interrupted or still running) and
    refused unless ``include_unfinished``.
    """
    run_dir = Path(run_dir)
    if not (run_dir / rundir.CONFIG).is_file():
        raise RunDirError(f"missing {rundir.CONFIG}")
    config = _read_json_object(run_dir / rundir.CONFIG) or {}
    env_id, seed = config.get("env_id"), config.get("seed")
    if not isinstance(env_id, str) or not env_id:
        raise RunDirError(f"{rundir.CONFIG}: env_id missing or not a string")
    if not _is_int(seed):
        raise RunDirError(f"{rundir.CONFIG}: seed missing or not an integer")
    summary = _read_json_object(run_dir / rundir.SUMMARY)
    if summary is None and not include_unfinished:
        raise RunDirError(f"unfinished: no {rundir.SUMMARY} (interrupted or still running)")
    if not (run_dir / rundir.METRICS).is_file():
        raise RunDirError(f"missing {rundir.METRICS}")
    global_step, episodic_return, time_elapsed = _read_metrics(run_dir / rundir.METRICS, finished=summary is not None)
    hardware = _read_json_object(run_dir / rundir.HARDWARE)
    return Run(run_dir, env_id, seed, config, global_step, episodic_return, time_elapsed, hardware, summary)


def _config_defaults() -> dict[str, Any]:
    defaults = {}
    for field in dataclasses.fields(PPOConfig):
        if field.default is not dataclasses.MISSING:
            defaults[field.name] = field.default
        elif field.default_factory is not dataclasses.MISSING:
            defaults[field.name] = field.default_factory()
    return defaults


def setting_config(config: dict[str, Any]) -> dict[str, Any]:
    """The fields of ``config`` that make its setting: all but ``NOT_SETTING_FIELDS``, a PPOConfig field that
    ``config`` lacks (written before the field existed) taking its default. PPOConfig's fields first, in order."""
    values = {**_config_defaults(), **config}
    return {name: value for name, value in values.items() if name not in NOT_SETTING_FIELDS}


def _canonical(value: Any) -> Any:
    """JSON-like ``value`` with every number a float, so that 0 and 0.0 (equal settings) compare equal."""
    if _is_number(value):
        return float(value)
    if isinstance(value, dict):
        return {str(key): _canonical(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_canonical(item) for item in value]
    return value


def value_key(value: Any) -> str:
    """A config value as canonical JSON (keys sorted, numbers as floats): equal exactly when the values are."""
    return json.dumps(_canonical(value), sort_keys=True, default=str)


def setting_key(config: dict[str, Any]) -> str:
    """``setting_config(config)`` as canonical JSON (``value_key``): equal exactly when the settings are."""
    return value_key(setting_config(config))


def find_run_dirs(path: str | os.PathLike[str]) -> list[Path]:
    """Directories at or under ``path`` that hold any of ``READ_FILES``.

    A run directory's own subdirectories (checkpoints) are not searched. Sorted by path.
    """
    found = []
    for directory, subdirectories, files in os.walk(path):
        if any(name in files for name in READ_FILES):
            found.append(Path(directory))
            subdirectories.clear()
        else:
            subdirectories.sort()
    return sorted(found)


def collect_runs(
    paths: Iterable[str | os.PathLike[str]], *, include_unfinished: bool = False
) -> tuple[list[Run], list[SkippedRun]]:
    """Every usable run under ``paths``, and every directory that was not usable with its reason.

    A second run of the same (env_id, setting, seed) is skipped as a duplicate so that no seed counts twice;
    the runs of a sweep share their seeds, one per setting.
    """
    runs: list[Run] = []
    skipped: list[SkippedRun] = []
    seen_dirs: set[Path] = set()
    seen_runs: dict[tuple[str, str, int], Path] = {}
    for path in map(Path, paths):
        if not path.exists():
            skipped.append(SkippedRun(path, "does not exist"))
            continue
        run_dirs = find_run_dirs(path)
        if not run_dirs:
            skipped.append(SkippedRun(path, f"no run directory under it (none holds {', '.join(READ_FILES)})"))
        for run_dir in run_dirs:
            if run_dir.resolve() in seen_dirs:
                continue
            seen_dirs.add(run_dir.resolve())
            try:
                run = load_run(run_dir, include_unfinished=include_unfinished)
            except RunDirError as error:
                skipped.append(SkippedRun(run_dir, str(error)))
                continue
            key = (run.env_id, run.setting, run.seed)
            if key in seen_runs:
                skipped.append(SkippedRun(run_dir, f"duplicate of {run.env_id} seed {run.seed} in {seen_runs[key]}"))
                continue
            seen_runs[key] = run_dir
            runs.append(run)
    return runs, skipped
