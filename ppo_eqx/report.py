"""The Atari benchmark report: run directories in, tables and plots beside CleanRL's published numbers out.

Conventions, stated once (the rendered report repeats them):

- A *run directory* holds ``config.json``, ``metrics.jsonl``, ``hardware.json`` and, once finished,
  ``summary.json`` (see ``load_run``). Anything else is skipped with a reason, never fatal.
- *Final return* of a run: the mean of ``episodic_return`` over the last 10% of iterations (rounded up, at
  least one), ignoring iterations in which no episode finished (NaN); when none of those finished an
  episode, the last finite value; NaN when no episode ever finished.
- *Minutes at 10M steps*: the measured wall clock when the run's last ``global_step`` is within one batch
  (``num_envs * num_steps``) of 10M; otherwise projected, linear in steps: the first iteration's time
  (compilation included, which a 10M run pays once too) plus the rate measured after the first iteration
  times the remaining steps. Speed-up = anchor minutes / our minutes at 10M (> 1: ppo_eqx is faster).
- *HNS* = (score - random) / (human - random). Aggregates follow rliable (Agarwal et al. 2021): median and
  mean over games of the per-game mean over seeds; IQM over all (seed, game) scores pooled, with the
  ``scipy.stats.trim_mean(x, 0.25)`` convention (drop floor(n/4) scores at each end). Confidence intervals:
  percentile intervals of a stratified bootstrap that resamples seeds within each game.
- Standard deviations over seeds are population ones (``ddof=0``, NumPy's default).

The numeric functions are pure and importable by tests; matplotlib is imported only inside ``write_plots``.
"""

import csv
import dataclasses
import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeGuard

import numpy as np

TARGET_STEPS = 10_000_000
FINAL_FRACTION = 0.1
NUM_RESAMPLES = 2000
BOOTSTRAP_SEED = 0
CONFIDENCE = 0.95
RUN_FILES = ("config.json", "metrics.jsonl", "summary.json", "hardware.json")
AGGREGATES = ("median", "iqm", "mean")
AGGREGATE_NAMES = {"median": "Median", "iqm": "IQM", "mean": "Mean"}
ANCHORS_CSV = "cleanrl_ppo_atari_envpool_xla_jax.csv"
HUMAN_RANDOM_CSV = "atari_human_random_scores.csv"
NAN = float("nan")

# Plain unions, not numpy.typing's array-like one, which the tests' runtime type checker rejects floats for.
Numbers = Sequence[float] | Sequence[int] | np.ndarray


# ----------------------------------------------------------------------------------------------- numbers


def human_normalized_score(score: float | Numbers, random_score: float, human_score: float) -> np.ndarray:
    """(score - random) / (human - random): 0 is a random policy, 1 a human tester. Same shape as score."""
    return np.asarray((np.asarray(score, dtype=np.float64) - random_score) / (human_score - random_score))


def _iqm_last_axis(sorted_scores: np.ndarray) -> np.ndarray:
    """IQM along the last axis of scores already sorted along it: mean after dropping floor(n/4) each end."""
    n = sorted_scores.shape[-1]
    cut = n // 4
    return np.asarray(sorted_scores[..., cut : n - cut].mean(axis=-1))


def interquartile_mean(scores: Numbers | Sequence[Numbers]) -> float:
    """Mean of the middle half of the scores (all axes pooled), as ``scipy.stats.trim_mean(x, 0.25)``.

    floor(n/4) scores are dropped at each end: for 8 scores the 3rd to 6th smallest are averaged, for 5 the
    2nd to 4th.
    """
    flat = np.sort(np.asarray(scores, dtype=np.float64).ravel())
    if flat.size == 0:
        raise ValueError("interquartile_mean of no scores")
    return float(_iqm_last_axis(flat))


def aggregate_scores(scores_per_game: Sequence[Numbers]) -> dict[str, float]:
    """Median, IQM and mean of per-seed scores, one 1-D array per game (seed counts may differ).

    median, mean: over games, of each game's mean over seeds. iqm: over all (seed, game) scores pooled,
    as rliable does. Every game needs at least one score.
    """
    games = [np.asarray(scores, dtype=np.float64).ravel() for scores in scores_per_game]
    if not games or any(scores.size == 0 for scores in games):
        raise ValueError("aggregate_scores needs at least one game and one score per game")
    per_game_means = np.array([scores.mean() for scores in games])
    return {
        "median": float(np.median(per_game_means)),
        "iqm": interquartile_mean(np.concatenate(games)),
        "mean": float(per_game_means.mean()),
    }


def stratified_bootstrap_ci(
    scores_per_game: Sequence[Numbers],
    *,
    num_resamples: int = NUM_RESAMPLES,
    confidence: float = CONFIDENCE,
    seed: int = BOOTSTRAP_SEED,
) -> dict[str, tuple[float, float]]:
    """Percentile confidence intervals of ``aggregate_scores`` under a stratified bootstrap.

    Each resample draws, within every game, as many seeds as it has, with replacement (rliable's
    StratifiedBootstrap without task resampling); games are never resampled. A game with one seed adds no
    spread. Deterministic for a given ``seed`` and game order.
    """
    games = [np.asarray(scores, dtype=np.float64).ravel() for scores in scores_per_game]
    if not games or any(scores.size == 0 for scores in games):
        raise ValueError("stratified_bootstrap_ci needs at least one game and one score per game")
    rng = np.random.default_rng(seed)
    resampled = [scores[rng.integers(0, scores.size, size=(num_resamples, scores.size))] for scores in games]
    per_game_means = np.stack([draws.mean(axis=1) for draws in resampled], axis=1)  # [R, G]
    pooled = np.sort(np.concatenate(resampled, axis=1), axis=1)  # [R, total seeds]
    statistics = {
        "median": np.median(per_game_means, axis=1),
        "iqm": _iqm_last_axis(pooled),
        "mean": per_game_means.mean(axis=1),
    }
    tail = 100.0 * (1.0 - confidence) / 2.0
    intervals = {}
    for name, values in statistics.items():
        low, high = np.percentile(values, [tail, 100.0 - tail])
        intervals[name] = (float(low), float(high))
    return intervals


def final_return(episodic_return: Numbers, fraction: float = FINAL_FRACTION) -> float:
    """A run's final return from its per-iteration ``episodic_return`` (NaN where no episode finished).

    The mean of the finite values over the last ceil(fraction * iterations) iterations (at least one); when
    none of those is finite, the last finite value; NaN when there is none at all.
    """
    returns = np.asarray(episodic_return, dtype=np.float64).ravel()
    if returns.size == 0:
        return NAN
    window = returns[-max(1, math.ceil(fraction * returns.size)) :]
    finite_window = window[np.isfinite(window)]
    if finite_window.size:
        return float(finite_window.mean())
    finite = returns[np.isfinite(returns)]
    return float(finite[-1]) if finite.size else NAN


def project_minutes(global_step: Numbers, time_elapsed: Numbers, *, target_steps: int = TARGET_STEPS) -> float:
    """Wall-clock minutes a run of ``target_steps`` would take, from one run's per-iteration log.

    The first iteration's time (compilation included: a run of any length pays it once) plus the rate after
    it, (t_last - t_first) / (s_last - s_first) seconds per step, times the steps left after the first
    iteration. NaN with fewer than two iterations, where that rate cannot be measured.
    """
    steps = np.asarray(global_step, dtype=np.float64).ravel()
    seconds = np.asarray(time_elapsed, dtype=np.float64).ravel()
    if steps.size < 2 or not steps[-1] > steps[0]:
        return NAN
    seconds_per_step = (seconds[-1] - seconds[0]) / (steps[-1] - steps[0])
    return float((seconds[0] + seconds_per_step * (target_steps - steps[0])) / 60.0)


def _mean_std(values: Sequence[float]) -> tuple[float, float, int]:
    """Mean and population std of the finite values, and how many there were (NaN, NaN, 0 for none)."""
    finite = np.array([value for value in values if math.isfinite(value)], dtype=np.float64)
    if finite.size == 0:
        return NAN, NAN, 0
    return float(finite.mean()), float(finite.std()), int(finite.size)


def _mean_if_all_finite(values: Sequence[float]) -> float:
    if not values or not all(math.isfinite(value) for value in values):
        return NAN
    return float(np.mean(values))


def _ratio(numerator: float, denominator: float) -> float:
    if not (math.isfinite(numerator) and math.isfinite(denominator)) or denominator <= 0:
        return NAN
    return numerator / denominator


# ----------------------------------------------------------------------------------------------- reading


class RunError(ValueError):
    """A run directory that cannot be used; the message is the reason the report shows."""


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
        raise RunError(f"{path.name}: cannot read ({error})") from error
    except json.JSONDecodeError as error:
        raise RunError(f"{path.name}: invalid JSON ({error})") from error


def _read_metrics(path: Path, *, finished: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(global_step, episodic_return, time_elapsed) of metrics.jsonl; a null return becomes NaN.

    The last line of an unfinished run may have been cut by the kill that interrupted it: it is dropped.
    """
    try:
        lines = [line for line in path.read_text().splitlines() if line.strip()]
    except (OSError, UnicodeDecodeError) as error:
        raise RunError(f"metrics.jsonl: cannot read ({error})") from error
    rows = []
    for number, line in enumerate(lines, start=1):
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            if number == len(lines) and not finished:
                break
            raise RunError(f"metrics.jsonl line {number}: invalid JSON ({error})") from error
        if not isinstance(row, dict):
            raise RunError(f"metrics.jsonl line {number}: not a JSON object")
        for key in ("global_step", "time_elapsed"):
            if not _is_number(row.get(key)):
                raise RunError(f"metrics.jsonl line {number}: {key} missing or not a number")
        episodic_return = row.get("episodic_return", None)
        if episodic_return is not None and not _is_number(episodic_return):
            raise RunError(f"metrics.jsonl line {number}: episodic_return is not a number or null")
        rows.append((row["global_step"], NAN if episodic_return is None else episodic_return, row["time_elapsed"]))
    if not rows:
        raise RunError("metrics.jsonl has no iterations")
    columns = np.array(rows, dtype=np.float64)
    return columns[:, 0], columns[:, 1], columns[:, 2]


def load_run(run_dir: str | os.PathLike[str], *, include_unfinished: bool = False) -> Run:
    """Read one run directory, or raise RunError saying why it cannot be used.

    Needs config.json (an object with ``env_id`` and an integer ``seed``) and metrics.jsonl (one object per
    iteration with numeric ``global_step``, ``time_elapsed`` and a number or null ``episodic_return``).
    hardware.json is optional. Without summary.json the run is unfinished (interrupted or still running) and
    refused unless ``include_unfinished``.
    """
    run_dir = Path(run_dir)
    if not (run_dir / "config.json").is_file():
        raise RunError("missing config.json")
    config = _read_json(run_dir / "config.json")
    if not isinstance(config, dict):
        raise RunError("config.json: not a JSON object")
    env_id, seed = config.get("env_id"), config.get("seed")
    if not isinstance(env_id, str) or not env_id:
        raise RunError("config.json: env_id missing or not a string")
    if not _is_int(seed):
        raise RunError("config.json: seed missing or not an integer")
    summary = _read_json(run_dir / "summary.json") if (run_dir / "summary.json").is_file() else None
    if summary is not None and not isinstance(summary, dict):
        raise RunError("summary.json: not a JSON object")
    if summary is None and not include_unfinished:
        raise RunError("unfinished: no summary.json (interrupted or still running)")
    if not (run_dir / "metrics.jsonl").is_file():
        raise RunError("missing metrics.jsonl")
    global_step, episodic_return, time_elapsed = _read_metrics(run_dir / "metrics.jsonl", finished=summary is not None)
    hardware = _read_json(run_dir / "hardware.json") if (run_dir / "hardware.json").is_file() else None
    if hardware is not None and not isinstance(hardware, dict):
        raise RunError("hardware.json: not a JSON object")
    return Run(run_dir, env_id, seed, config, global_step, episodic_return, time_elapsed, hardware, summary)


def find_run_dirs(path: str | os.PathLike[str]) -> list[Path]:
    """Directories at or under ``path`` that hold any of the run files (config.json, metrics.jsonl, ...).

    A run directory's own subdirectories (checkpoints) are not searched. Sorted by path.
    """
    found = []
    for directory, subdirectories, files in os.walk(path):
        if any(name in files for name in RUN_FILES):
            found.append(Path(directory))
            subdirectories.clear()
        else:
            subdirectories.sort()
    return sorted(found)


def collect_runs(
    paths: Iterable[str | os.PathLike[str]], *, include_unfinished: bool = False
) -> tuple[list[Run], list[SkippedRun]]:
    """Every usable run under ``paths``, and every directory that was not usable with its reason.

    A second run of the same (env_id, seed) is skipped as a duplicate so that no seed counts twice.
    """
    runs: list[Run] = []
    skipped: list[SkippedRun] = []
    seen_dirs: set[Path] = set()
    seen_runs: dict[tuple[str, int], Path] = {}
    for path in map(Path, paths):
        if not path.exists():
            skipped.append(SkippedRun(path, "does not exist"))
            continue
        run_dirs = find_run_dirs(path)
        if not run_dirs:
            skipped.append(SkippedRun(path, f"no run directory under it (none holds {', '.join(RUN_FILES)})"))
        for run_dir in run_dirs:
            if run_dir.resolve() in seen_dirs:
                continue
            seen_dirs.add(run_dir.resolve())
            try:
                run = load_run(run_dir, include_unfinished=include_unfinished)
            except RunError as error:
                skipped.append(SkippedRun(run_dir, str(error)))
                continue
            key = (run.env_id, run.seed)
            if key in seen_runs:
                skipped.append(SkippedRun(run_dir, f"duplicate of {run.env_id} seed {run.seed} in {seen_runs[key]}"))
                continue
            seen_runs[key] = run_dir
            runs.append(run)
    return runs, skipped


@dataclasses.dataclass(frozen=True)
class Anchor:
    """CleanRL's published 10M-step results for one game (minutes and final return, 3 seeds)."""

    cleanrl_minutes: float
    baselines_ppo2_minutes: float
    cleanrl_return_mean: float
    cleanrl_return_std: float
    baselines_return_mean: float
    baselines_return_std: float


@dataclasses.dataclass(frozen=True)
class HumanRandom:
    random_score: float
    human_score: float


class AnchorError(ValueError):
    """An anchor CSV that is missing or malformed."""


def _read_csv(path: Path, columns: Sequence[str]) -> dict[str, list[float]]:
    """{env_id: [float per column]} of a CSV with an env_id column; an empty cell reads as NaN."""
    try:
        with path.open(newline="") as file:
            reader = csv.DictReader(file)
            missing = [name for name in ("env_id", *columns) if name not in (reader.fieldnames or [])]
            if missing:
                raise AnchorError(f"{path}: missing column(s) {', '.join(missing)}")
            table = {}
            for line, row in enumerate(reader, start=2):
                try:
                    table[row["env_id"]] = [float(row[name]) if (row[name] or "").strip() else NAN for name in columns]
                except ValueError as error:
                    raise AnchorError(f"{path} line {line}: {error}") from error
    except OSError as error:
        raise AnchorError(f"cannot read {path}: {error}") from error
    return table


def load_anchors(anchors_dir: str | os.PathLike[str]) -> tuple[dict[str, Anchor], dict[str, HumanRandom]]:
    """The CleanRL anchor table and the human/random scores from ``anchors_dir``; AnchorError if unreadable."""
    anchors_dir = Path(anchors_dir)
    columns = [field.name for field in dataclasses.fields(Anchor)]  # the CSV's column names
    anchors = {env_id: Anchor(*values) for env_id, values in _read_csv(anchors_dir / ANCHORS_CSV, columns).items()}
    scores = _read_csv(anchors_dir / HUMAN_RANDOM_CSV, ["random_score", "human_score"])
    return anchors, {env_id: HumanRandom(*values) for env_id, values in scores.items()}


# ---------------------------------------------------------------------------------------------- building


@dataclasses.dataclass(frozen=True)
class RunTiming:
    """steps: the run's last global_step. minutes_at_target: measured_minutes, or the projection."""

    steps: int
    measured_minutes: float
    projected: bool
    minutes_at_target: float


def run_timing(run: Run, *, target_steps: int = TARGET_STEPS) -> RunTiming:
    """Measured minutes, and minutes at ``target_steps``: measured when within one batch of it, else projected."""
    measured = run.final_seconds / 60.0
    projected = abs(run.final_step - target_steps) >= max(run.batch_size, 1)
    at_target = project_minutes(run.global_step, run.time_elapsed, target_steps=target_steps) if projected else measured
    return RunTiming(run.final_step, measured, projected, at_target)


@dataclasses.dataclass(frozen=True)
class GameRow:
    """Everything the tables say about one game; per-seed tuples are in ``seeds`` order (empty: missing)."""

    env_id: str
    seeds: tuple[int, ...]
    run_dirs: tuple[Path, ...]
    timings: tuple[RunTiming, ...]
    final_returns: tuple[float, ...]
    hns: tuple[float, ...]
    anchor: Anchor | None
    human_random: HumanRandom | None

    @property
    def missing(self) -> bool:
        return not self.seeds

    @property
    def steps_mean(self) -> float:
        return _mean_if_all_finite([float(timing.steps) for timing in self.timings])

    @property
    def measured_minutes(self) -> float:
        """Mean over seeds."""
        return _mean_if_all_finite([timing.measured_minutes for timing in self.timings])

    @property
    def minutes_at_target(self) -> float:
        """Mean over seeds; NaN when a seed cannot be projected (one iteration only)."""
        return _mean_if_all_finite([timing.minutes_at_target for timing in self.timings])

    @property
    def projected(self) -> bool:
        return any(timing.projected for timing in self.timings)

    @property
    def speedup_cleanrl(self) -> float:
        return _ratio(self.anchor.cleanrl_minutes, self.minutes_at_target) if self.anchor else NAN

    @property
    def speedup_baselines(self) -> float:
        return _ratio(self.anchor.baselines_ppo2_minutes, self.minutes_at_target) if self.anchor else NAN

    @property
    def return_stats(self) -> tuple[float, float, int]:
        """(mean, std, count) over the seeds that finished an episode."""
        return _mean_std(self.final_returns)

    @property
    def finite_hns(self) -> np.ndarray:
        return np.array([value for value in self.hns if math.isfinite(value)], dtype=np.float64)

    def anchor_hns(self, which: str) -> float:
        """HNS of the anchor's mean return; which: "cleanrl" or "baselines"."""
        if self.anchor is None or self.human_random is None:
            return NAN
        score = getattr(self.anchor, f"{which}_return_mean")
        return float(human_normalized_score(score, self.human_random.random_score, self.human_random.human_score))


@dataclasses.dataclass(frozen=True)
class Aggregates:
    """HNS aggregates of ppo_eqx over ``games`` (those with a finite score) beside the anchors' point values.

    anchors[(which, scope)]: which in ("cleanrl", "baselines"), scope "same" (our ``games``) or "all"
    (every game with anchor and human/random scores). IQM of an anchor is over its per-game means.
    """

    games: tuple[str, ...]
    point: dict[str, float]
    interval: dict[str, tuple[float, float]]
    anchors: dict[tuple[str, str], dict[str, float]]
    anchor_game_counts: dict[str, int]


@dataclasses.dataclass(frozen=True)
class Report:
    rows: tuple[GameRow, ...]
    runs: tuple[Run, ...]
    skipped: tuple[SkippedRun, ...]
    aggregates: Aggregates
    anchor_games: tuple[str, ...]
    target_steps: int
    num_resamples: int
    bootstrap_seed: int
    confidence: float

    def row(self, env_id: str) -> GameRow:
        return next(row for row in self.rows if row.env_id == env_id)


def build_report(
    runs: Sequence[Run],
    skipped: Sequence[SkippedRun],
    anchors: Mapping[str, Anchor],
    human_random: Mapping[str, HumanRandom],
    *,
    target_steps: int = TARGET_STEPS,
    num_resamples: int = NUM_RESAMPLES,
    bootstrap_seed: int = BOOTSTRAP_SEED,
    confidence: float = CONFIDENCE,
) -> Report:
    """Per-game rows for every anchor game and every game run (sorted by env_id), and the HNS aggregates."""
    by_game: dict[str, list[Run]] = {}
    for run in runs:
        by_game.setdefault(run.env_id, []).append(run)
    rows = []
    for env_id in sorted(set(anchors) | set(human_random) | set(by_game)):
        game_runs = sorted(by_game.get(env_id, []), key=lambda run: run.seed)
        returns = tuple(final_return(run.episodic_return) for run in game_runs)
        scores = human_random.get(env_id)
        hns = tuple(
            float(human_normalized_score(value, scores.random_score, scores.human_score)) if scores else NAN
            for value in returns
        )
        rows.append(
            GameRow(
                env_id=env_id,
                seeds=tuple(run.seed for run in game_runs),
                run_dirs=tuple(run.run_dir for run in game_runs),
                timings=tuple(run_timing(run, target_steps=target_steps) for run in game_runs),
                final_returns=returns,
                hns=hns,
                anchor=anchors.get(env_id),
                human_random=scores,
            )
        )
    scored = [row for row in rows if row.finite_hns.size]
    point: dict[str, float] = dict.fromkeys(AGGREGATES, NAN)
    interval: dict[str, tuple[float, float]] = dict.fromkeys(AGGREGATES, (NAN, NAN))
    if scored:
        point = aggregate_scores([row.finite_hns for row in scored])
        interval = stratified_bootstrap_ci(
            [row.finite_hns for row in scored], num_resamples=num_resamples, confidence=confidence, seed=bootstrap_seed
        )
    anchor_values: dict[tuple[str, str], dict[str, float]] = {}
    anchor_counts: dict[str, int] = {}
    with_anchor = [row for row in rows if math.isfinite(row.anchor_hns("cleanrl"))]
    scored_games = {row.env_id for row in scored}
    same_games = [row for row in with_anchor if row.env_id in scored_games]
    for scope, scope_rows in (("same", same_games), ("all", with_anchor)):
        anchor_counts[scope] = len(scope_rows)
        for which in ("cleanrl", "baselines"):
            values = [np.array([row.anchor_hns(which)]) for row in scope_rows if math.isfinite(row.anchor_hns(which))]
            anchor_values[(which, scope)] = aggregate_scores(values) if values else dict.fromkeys(AGGREGATES, NAN)
    aggregates = Aggregates(tuple(row.env_id for row in scored), point, interval, anchor_values, anchor_counts)
    return Report(
        rows=tuple(rows),
        runs=tuple(runs),
        skipped=tuple(skipped),
        aggregates=aggregates,
        anchor_games=tuple(sorted(anchors)),
        target_steps=target_steps,
        num_resamples=num_resamples,
        bootstrap_seed=bootstrap_seed,
        confidence=confidence,
    )


# --------------------------------------------------------------------------------------------- rendering

MISSING = "missing"
NOT_AVAILABLE = "n/a"


def _number(value: float, digits: int = 1) -> str:
    return f"{value:,.{digits}f}" if math.isfinite(value) else NOT_AVAILABLE


def _speedup(value: float) -> str:
    return f"{value:.2f}×" if math.isfinite(value) else NOT_AVAILABLE


def _plus_minus(mean: float, std: float, digits: int = 1) -> str:
    return f"{_number(mean, digits)} ± {_number(std, digits)}" if math.isfinite(mean) else NOT_AVAILABLE


def _steps(value: float) -> str:
    return f"{value:,.0f}" if math.isfinite(value) else NOT_AVAILABLE


def _table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(cells) + " |" for cells in rows]
    return lines


def _runtime_section(report: Report) -> list[str]:
    target = f"{report.target_steps / 1e6:g}M"
    lines = [
        "## 1. Runtime",
        "",
        f"Wall-clock minutes per run, mean over seeds, beside CleanRL's `ppo_atari_envpool_xla_jax.py` and "
        f"openai/baselines PPO2 for {target} steps. *At {target}* is the measured time when a run reached "
        f"{target} steps (within one batch); a value marked **(projected)** comes from a shorter (or longer) "
        f"run: the first iteration's time (compilation included) plus the rate measured after the first "
        f"iteration (so excluding compilation) times the remaining steps, linear in steps. Speed-up = anchor "
        f"minutes / ppo_eqx minutes at {target} (> 1: ppo_eqx is faster). The anchors' minutes were measured "
        f"on CleanRL's hardware (one GPU and 10 CPU cores per run), so a speed-up mixes software and hardware: "
        f"see section 5 for ours.",
        "",
    ]
    cells = []
    for row in report.rows:
        anchor = row.anchor
        cleanrl = _number(anchor.cleanrl_minutes) if anchor else NOT_AVAILABLE
        baselines = _number(anchor.baselines_ppo2_minutes) if anchor else NOT_AVAILABLE
        if row.missing:
            cells.append([row.env_id, MISSING, MISSING, MISSING, MISSING, cleanrl, MISSING, baselines, MISSING])
            continue
        at_target = _number(row.minutes_at_target)
        if row.projected and math.isfinite(row.minutes_at_target):
            at_target += " (projected)"
        cells.append(
            [
                row.env_id,
                str(len(row.seeds)),
                _steps(row.steps_mean),
                _number(row.measured_minutes),
                at_target,
                cleanrl,
                _speedup(row.speedup_cleanrl),
                baselines,
                _speedup(row.speedup_baselines),
            ]
        )
    header = [
        "Game",
        "Seeds",
        "Steps (mean)",
        "ppo_eqx min (measured)",
        f"ppo_eqx min at {target}",
        "CleanRL min",
        "Speed-up vs CleanRL",
        "PPO2 min",
        "Speed-up vs PPO2",
    ]
    return lines + _table(header, cells) + [""]


def _returns_section(report: Report) -> list[str]:
    lines = [
        "## 2. Final episodic returns",
        "",
        f"ppo_eqx: mean ± std (population, ddof=0) over seeds of each run's final return = the mean "
        f"`episodic_return` over the last {FINAL_FRACTION:.0%} of iterations (rounded up, at least one), "
        f"ignoring iterations in which no episode finished; the last finite value when none in that window did. "
        f"Anchors: CleanRL's published mean ± std over 3 seeds at 10M steps (their own definition of the final "
        f"return). Compare returns only between runs of the same length.",
        "",
    ]
    cells = []
    for row in report.rows:
        anchor = row.anchor
        cleanrl = _plus_minus(anchor.cleanrl_return_mean, anchor.cleanrl_return_std) if anchor else NOT_AVAILABLE
        baselines = _plus_minus(anchor.baselines_return_mean, anchor.baselines_return_std) if anchor else NOT_AVAILABLE
        if row.missing:
            ours = MISSING
        else:
            mean, std, count = row.return_stats
            ours = _plus_minus(mean, std) if count else "no finished episode"
            if 0 < count < len(row.seeds):
                ours += f" ({count} of {len(row.seeds)} seeds finished an episode)"
        seeds = ", ".join(map(str, row.seeds)) if row.seeds else MISSING
        cells.append([row.env_id, seeds, ours, cleanrl, baselines])
    return lines + _table(["Game", "Seeds", "ppo_eqx", "CleanRL", "PPO2"], cells) + [""]


def _hns_section(report: Report) -> list[str]:
    aggregates = report.aggregates
    count = len(aggregates.games)
    all_count = aggregates.anchor_game_counts.get("all", 0)
    lines = [
        "## 3. Human-normalised scores",
        "",
        "HNS = (score - random) / (human - random), with random and human scores from DQN Zoo. Median and mean: "
        "over games, of each game's mean HNS over seeds; IQM: the mean of the middle half of all (seed, game) "
        "scores pooled (rliable's definition; floor(n/4) dropped at each end). "
        f"Interval: {report.confidence:.0%} percentile interval of a stratified bootstrap resampling seeds within "
        f"each game ({report.num_resamples} resamples, RNG seed {report.bootstrap_seed}); a game with one seed "
        f"adds no spread. Anchors: point values from their mean returns (their IQM is over per-game means), over "
        f"the same games as ppo_eqx and over all {all_count} anchor games.",
        "",
        f"ppo_eqx aggregates over {count} game(s) with a finished episode, of {len(report.rows)} in the tables "
        f"(the others are missing or have no score).",
        "",
    ]
    cells = []
    for name in AGGREGATES:
        low, high = aggregates.interval[name]
        ours = _number(aggregates.point[name], 3)
        if math.isfinite(low):
            ours += f" [{low:.3f}, {high:.3f}]"
        cells.append(
            [
                AGGREGATE_NAMES[name],
                ours,
                _number(aggregates.anchors[("cleanrl", "same")][name], 3),
                _number(aggregates.anchors[("baselines", "same")][name], 3),
                _number(aggregates.anchors[("cleanrl", "all")][name], 3),
                _number(aggregates.anchors[("baselines", "all")][name], 3),
            ]
        )
    same = aggregates.anchor_game_counts.get("same", 0)
    header = [
        "Aggregate HNS",
        f"ppo_eqx ({count} games, {report.confidence:.0%} CI)",
        f"CleanRL ({same} same games)",
        f"PPO2 ({same} same games)",
        f"CleanRL (all {all_count})",
        f"PPO2 (all {all_count})",
    ]
    lines += _table(header, cells) + ["", "Per game (ppo_eqx: mean ± std over seeds):", ""]
    cells = []
    for row in report.rows:
        scores = row.human_random
        random_score = _number(scores.random_score) if scores else NOT_AVAILABLE
        human_score = _number(scores.human_score) if scores else NOT_AVAILABLE
        if row.missing:
            ours = MISSING
        elif scores is None:
            ours = NOT_AVAILABLE + " (no human/random score)"
        elif row.finite_hns.size == 0:
            ours = "no finished episode"
        else:
            ours = _plus_minus(float(row.finite_hns.mean()), float(row.finite_hns.std()), 3)
        cells.append(
            [
                row.env_id,
                random_score,
                human_score,
                ours,
                _number(row.anchor_hns("cleanrl"), 3),
                _number(row.anchor_hns("baselines"), 3),
            ]
        )
    return lines + _table(["Game", "Random", "Human", "ppo_eqx HNS", "CleanRL HNS", "PPO2 HNS"], cells) + [""]


def _hardware_section(report: Report) -> list[str]:
    lines = ["## 5. Hardware", "", "Distinct `hardware.json` contents of the runs in this report.", ""]
    groups: dict[str, list[Run]] = {}
    for run in report.runs:
        key = json.dumps(run.hardware, sort_keys=True) if run.hardware is not None else ""
        groups.setdefault(key, []).append(run)
    if not groups:
        return lines + ["No runs.", ""]
    for number, (key, runs) in enumerate(sorted(groups.items()), start=1):
        games = sorted({run.env_id for run in runs})
        shown = ", ".join(games[:8]) + (f", … ({len(games)} games)" if len(games) > 8 else "")
        lines.append(f"### Hardware {number}: {len(runs)} run(s) ({shown})")
        lines.append("")
        if not key:
            lines += ["No `hardware.json` in these runs.", ""]
            continue
        lines += _table(["Field", "Value"], [[name, str(value)] for name, value in json.loads(key).items()]) + [""]
    return lines


def render_markdown(report: Report, plots: Sequence[Path] = ()) -> str:
    """The whole report as Markdown; ``plots`` are paths relative to the report's directory."""
    run_games = sorted({run.env_id for run in report.runs})
    missing = [row.env_id for row in report.rows if row.missing]
    lines = [
        "# ppo_eqx Atari benchmark report",
        "",
        f"{len(report.runs)} run(s) over {len(run_games)} game(s); "
        f"{len(missing)} of {len(report.rows)} game(s) missing; {len(report.skipped)} run director(y/ies) skipped. "
        f'Everything below is computed from the run directories; a game without runs reads "{MISSING}", '
        f'a value that cannot be computed "{NOT_AVAILABLE}".',
        "",
    ]
    lines += _runtime_section(report) + _returns_section(report) + _hns_section(report)
    lines += ["## 4. Plots", ""]
    if plots:
        lines += [f"![{plot.stem}]({plot.as_posix()})" for plot in plots if plot.suffix == ".png"]
        lines += ["", "Each figure is also written as SVG beside its PNG.", ""]
    else:
        lines += ["No plots (no runs, or plots were not requested).", ""]
    lines += _hardware_section(report)
    lines += ["## Skipped run directories", ""]
    if report.skipped:
        lines += _table(["Directory", "Reason"], [[f"`{item.path}`", item.reason] for item in report.skipped])
    else:
        lines.append("None.")
    lines += ["", "## Missing games", "", ", ".join(missing) if missing else "None.", ""]
    return "\n".join(lines)


def _json_safe(value: Any) -> Any:
    """NaN/inf as null, tuples as lists, paths as strings, so that the JSON is strict."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(key): _json_safe(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(item) for item in value]
    if isinstance(value, Path):
        return str(value)
    return value


def report_to_json(report: Report) -> dict[str, Any]:
    """The numbers of the report (NaN as null); per-game values per seed and as shown in the tables."""
    games = []
    for row in report.rows:
        mean, std, _ = row.return_stats
        games.append(
            {
                "env_id": row.env_id,
                "missing": row.missing,
                "seeds": row.seeds,
                "run_dirs": row.run_dirs,
                "timings": [dataclasses.asdict(timing) for timing in row.timings],
                "steps_mean": row.steps_mean,
                "measured_minutes": row.measured_minutes,
                "minutes_at_target": row.minutes_at_target,
                "projected": row.projected,
                "speedup_cleanrl": row.speedup_cleanrl,
                "speedup_baselines": row.speedup_baselines,
                "final_returns": row.final_returns,
                "return_mean": mean,
                "return_std": std,
                "hns": row.hns,
                "cleanrl_hns": row.anchor_hns("cleanrl"),
                "baselines_hns": row.anchor_hns("baselines"),
                "anchor": dataclasses.asdict(row.anchor) if row.anchor else None,
            }
        )
    aggregates = report.aggregates
    return _json_safe(
        {
            "target_steps": report.target_steps,
            "games": games,
            "aggregates": {
                "games": aggregates.games,
                "point": aggregates.point,
                "interval": aggregates.interval,
                "anchors": {f"{which}_{scope}": values for (which, scope), values in aggregates.anchors.items()},
                "anchor_game_counts": aggregates.anchor_game_counts,
                "num_resamples": report.num_resamples,
                "bootstrap_seed": report.bootstrap_seed,
                "confidence": report.confidence,
            },
            "skipped": [{"path": item.path, "reason": item.reason} for item in report.skipped],
        }
    )


# ------------------------------------------------------------------------------------------------- plots


def _save(figure: Any, out_dir: Path, name: str) -> list[Path]:
    paths = [out_dir / f"{name}.png", out_dir / f"{name}.svg"]
    figure.savefig(paths[0], dpi=80)
    figure.savefig(paths[1], metadata={"Date": None})  # no timestamp: same runs, same file
    return paths


def write_plots(report: Report, out_dir: str | os.PathLike[str]) -> list[Path]:
    """Learning curves (vs steps and vs minutes), runtime bars and aggregate HNS, as PNG and SVG.

    Returns the written paths; none when there is no run. Only finite returns are drawn.
    """
    from matplotlib.figure import Figure  # lazily: the numbers need no plotting library

    out_dir = Path(out_dir)
    rows = [row for row in report.rows if not row.missing]
    if not rows:
        return []
    written: list[Path] = []
    runs_by_dir = {run.run_dir: run for run in report.runs}
    columns = min(6, len(rows))
    grid_rows = math.ceil(len(rows) / columns)
    for axis_name, x_label in (("steps", "environment steps (millions)"), ("time", "wall-clock minutes")):
        figure = Figure(figsize=(4.0 * columns, 3.0 * grid_rows), layout="constrained")
        axes = figure.subplots(grid_rows, columns, squeeze=False).ravel()
        for ax, row in zip(axes, rows, strict=False):
            for seed, run_dir in zip(row.seeds, row.run_dirs, strict=True):
                run = runs_by_dir[run_dir]
                finite = np.isfinite(run.episodic_return)
                x = run.global_step / 1e6 if axis_name == "steps" else run.time_elapsed / 60.0
                ax.plot(
                    x[finite],
                    run.episodic_return[finite],
                    marker="." if finite.sum() < 3 else None,
                    label=f"seed {seed}",
                )
            if row.anchor and math.isfinite(row.anchor.cleanrl_return_mean):
                ax.axhline(row.anchor.cleanrl_return_mean, color="gray", linestyle="--", label="CleanRL, 10M")
            ax.set_title(row.env_id)
            ax.set_xlabel(x_label)
            ax.set_ylabel("episodic return")
            ax.legend(fontsize="x-small")
        for ax in axes[len(rows) :]:
            ax.set_visible(False)
        written += _save(figure, out_dir, f"learning_curves_{axis_name}")

    figure = Figure(figsize=(8.0, 1.0 + 0.45 * len(rows)), layout="constrained")
    ax = figure.subplots()
    bar_height = 0.27
    series = [
        ("ppo_eqx (hatched: projected)", [row.minutes_at_target for row in rows], "tab:blue"),
        ("CleanRL xla_jax", [row.anchor.cleanrl_minutes if row.anchor else NAN for row in rows], "tab:orange"),
        ("baselines PPO2", [row.anchor.baselines_ppo2_minutes if row.anchor else NAN for row in rows], "tab:green"),
    ]
    for offset, (label, values, color) in enumerate(series):
        labelled = False
        for position, (row, value) in enumerate(zip(rows, values, strict=True)):
            if not math.isfinite(value):
                continue  # unknown stays blank, never a zero-length bar
            hatch = "//" if offset == 0 and row.projected else None
            ax.barh(
                position + (offset - 1) * bar_height,
                value,
                height=bar_height,
                color=color,
                hatch=hatch,
                label=None if labelled else label,
            )
            labelled = True
    ax.set_yticks(range(len(rows)), [row.env_id for row in rows])
    ax.invert_yaxis()
    ax.set_xlabel(f"minutes for {report.target_steps / 1e6:g}M steps")
    ax.set_title("Runtime per game")
    if ax.get_legend_handles_labels()[0]:  # an empty legend warns
        figure.legend(loc="outside upper center", ncols=3, fontsize="small")
    written += _save(figure, out_dir, "runtime")

    aggregates = report.aggregates
    if aggregates.games:
        figure = Figure(figsize=(10.0, 2.6), layout="constrained")
        axes = figure.subplots(1, len(AGGREGATES), sharey=True)
        labels = ["ppo_eqx", "CleanRL (same games)", "PPO2 (same games)"]
        for ax, name in zip(axes, AGGREGATES, strict=True):
            low, high = aggregates.interval[name]
            point = aggregates.point[name]
            # A percentile interval need not contain the point estimate, so no errorbar (it refuses that).
            if math.isfinite(low):
                ax.plot([low, high], [0, 0], color="tab:blue", linewidth=2, solid_capstyle="butt")
            ax.plot([point], [0], "o", color="tab:blue")
            for position, which, color in ((1, "cleanrl", "tab:orange"), (2, "baselines", "tab:green")):
                value = aggregates.anchors[(which, "same")][name]
                if math.isfinite(value):
                    ax.plot([value], [position], "D", color=color)
            ax.set_title(AGGREGATE_NAMES[name])
            ax.set_xlabel("human-normalised score")
        axes[0].set_yticks(range(len(labels)), labels)
        axes[0].invert_yaxis()
        figure.suptitle(f"Aggregate HNS over {len(aggregates.games)} game(s), {report.confidence:.0%} intervals")
        written += _save(figure, out_dir, "aggregate_hns")
    return written


# -------------------------------------------------------------------------------------------------- entry


def write_report(
    paths: Iterable[str | os.PathLike[str]],
    out_dir: str | os.PathLike[str],
    anchors_dir: str | os.PathLike[str],
    *,
    include_unfinished: bool = False,
    plots: bool = True,
    target_steps: int = TARGET_STEPS,
    num_resamples: int = NUM_RESAMPLES,
    bootstrap_seed: int = BOOTSTRAP_SEED,
) -> Report:
    """Read the runs under ``paths``; write report.md, report.json and the plots into ``out_dir``."""
    anchors, human_random = load_anchors(anchors_dir)
    runs, skipped = collect_runs(paths, include_unfinished=include_unfinished)
    report = build_report(
        runs,
        skipped,
        anchors,
        human_random,
        target_steps=target_steps,
        num_resamples=num_resamples,
        bootstrap_seed=bootstrap_seed,
    )
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = write_plots(report, out_dir) if plots else []
    (out_dir / "report.md").write_text(render_markdown(report, [path.relative_to(out_dir) for path in written]))
    (out_dir / "report.json").write_text(json.dumps(report_to_json(report), indent=2, allow_nan=False) + "\n")
    return report
