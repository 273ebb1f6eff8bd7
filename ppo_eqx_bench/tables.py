"""What the report says, before it is rendered: one row per game, the HNS aggregates, and a sweep's settings.

Which games have rows: every game run; when any run is of a reference game (or none ran at all), every
reference game too, reading "missing" where not run. A report of other tasks only (CartPole-v1, a vector
task) therefore lists just those, with no reference to compare against.

A game's row pools all its runs. When they have more than one setting (``runs.setting_config``: a sweep),
the game also gets one ``SettingRow`` per setting, in ``Report.settings``.
"""

import dataclasses
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .anchors import Anchor, HumanRandom
from .runs import Run, SkippedRun, setting_config, value_key
from .stats import (
    AGGREGATES,
    BOOTSTRAP_SEED,
    CONFIDENCE,
    NAN,
    NUM_RESAMPLES,
    TARGET_STEPS,
    aggregate_scores,
    final_return,
    human_normalized_score,
    mean_if_all_finite,
    mean_std,
    project_minutes,
    ratio,
    seed_interval,
    stratified_bootstrap_ci,
)


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
    machines: tuple[str, ...] = ()
    """Where its seeds ran, each distinct once: the GPU (else the CPU) and how many runs shared the machine."""

    @property
    def missing(self) -> bool:
        return not self.seeds

    @property
    def steps_mean(self) -> float:
        return mean_if_all_finite([float(timing.steps) for timing in self.timings])

    @property
    def measured_minutes(self) -> float:
        """Mean over seeds."""
        return mean_if_all_finite([timing.measured_minutes for timing in self.timings])

    @property
    def minutes_at_target(self) -> float:
        """Mean over seeds; NaN when a seed cannot be projected (one iteration only)."""
        return mean_if_all_finite([timing.minutes_at_target for timing in self.timings])

    @property
    def projected(self) -> bool:
        return any(timing.projected for timing in self.timings)

    @property
    def speedup_cleanrl(self) -> float:
        return ratio(self.anchor.cleanrl_minutes, self.minutes_at_target) if self.anchor else NAN

    @property
    def speedup_baselines(self) -> float:
        return ratio(self.anchor.baselines_ppo2_minutes, self.minutes_at_target) if self.anchor else NAN

    @property
    def return_stats(self) -> tuple[float, float, int]:
        """(mean, std, count) over the seeds that finished an episode."""
        return mean_std(self.final_returns)

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
    (every listed game with anchor and human/random scores). IQM of an anchor is over its per-game means.
    """

    games: tuple[str, ...]
    point: dict[str, float]
    interval: dict[str, tuple[float, float]]
    anchors: dict[tuple[str, str], dict[str, float]]
    anchor_game_counts: dict[str, int]


@dataclasses.dataclass(frozen=True)
class SettingRow:
    """The runs of one game with one setting. values: this setting's value of each field that tells the game's
    settings apart (None where its config has no such field). Per-seed tuples are in ``seeds`` order.

    return_mean: the mean final return over the seeds that finished an episode; return_interval: its interval
    over seeds (``stats.seed_interval``; NaN with fewer than two such seeds).
    """

    env_id: str
    values: Mapping[str, Any]
    seeds: tuple[int, ...]
    run_dirs: tuple[Path, ...]
    steps: tuple[int, ...]
    final_returns: tuple[float, ...]
    return_mean: float
    return_interval: tuple[float, float]

    @property
    def finished_seeds(self) -> int:
        """How many seeds finished an episode (have a finite final return)."""
        return sum(math.isfinite(value) for value in self.final_returns)

    @property
    def steps_mean(self) -> float:
        return mean_if_all_finite([float(steps) for steps in self.steps])


@dataclasses.dataclass(frozen=True)
class GameSettings:
    """A game run with more than one setting. fields: the config fields whose values differ between its
    settings (PPOConfig's order); settings: one row per setting, ordered by those values."""

    env_id: str
    fields: tuple[str, ...]
    settings: tuple[SettingRow, ...]


@dataclasses.dataclass(frozen=True)
class Report:
    rows: tuple[GameRow, ...]
    runs: tuple[Run, ...]
    skipped: tuple[SkippedRun, ...]
    aggregates: Aggregates
    target_steps: int
    num_resamples: int
    bootstrap_seed: int
    confidence: float
    settings: tuple[GameSettings, ...] = ()
    """Only the games with more than one setting; empty when every game has one."""

    def row(self, env_id: str) -> GameRow:
        return next(row for row in self.rows if row.env_id == env_id)

    @property
    def has_anchors(self) -> bool:
        """Whether any game has CleanRL's numbers (else the tables have no columns for them)."""
        return any(row.anchor is not None for row in self.rows)

    @property
    def has_hns(self) -> bool:
        """Whether any game has random and human scores (else there are no human-normalised scores)."""
        return any(row.human_random is not None for row in self.rows)


def _listed_games(run_games: set[str], reference_games: set[str]) -> list[str]:
    if not run_games or run_games & reference_games:
        return sorted(run_games | reference_games)
    return sorted(run_games)


def _game_row(
    env_id: str, runs: Sequence[Run], anchor: Anchor | None, scores: HumanRandom | None, target_steps: int
) -> GameRow:
    runs = sorted(runs, key=lambda run: run.seed)
    returns = tuple(final_return(run.episodic_return) for run in runs)
    hns = tuple(
        float(human_normalized_score(value, scores.random_score, scores.human_score)) if scores else NAN
        for value in returns
    )
    return GameRow(
        env_id=env_id,
        seeds=tuple(run.seed for run in runs),
        run_dirs=tuple(run.run_dir for run in runs),
        timings=tuple(run_timing(run, target_steps=target_steps) for run in runs),
        final_returns=returns,
        hns=hns,
        anchor=anchor,
        human_random=scores,
        machines=tuple(dict.fromkeys(machine_of(run.hardware) for run in runs)),
    )


def machine_of(hardware: Mapping[str, Any] | None) -> str:
    """A run's machine in words: its GPU (else its CPU) and the runs that shared it (``runs_at_once``)."""
    if not hardware:
        return "unknown machine"
    device = hardware.get("accelerator") or hardware.get("gpu_name") or hardware.get("cpu_model") or "unknown machine"
    at_once = hardware.get("runs_at_once") or 1
    return f"{device}, {at_once} run{'s' if at_once != 1 else ''} at once"


def _aggregates(rows: Sequence[GameRow], *, num_resamples: int, confidence: float, seed: int) -> Aggregates:
    scored = [row for row in rows if row.finite_hns.size]
    point: dict[str, float] = dict.fromkeys(AGGREGATES, NAN)
    interval: dict[str, tuple[float, float]] = dict.fromkeys(AGGREGATES, (NAN, NAN))
    if scored:
        scores = [row.finite_hns for row in scored]
        point = aggregate_scores(scores)
        interval = stratified_bootstrap_ci(scores, num_resamples=num_resamples, confidence=confidence, seed=seed)
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
    return Aggregates(tuple(row.env_id for row in scored), point, interval, anchor_values, anchor_counts)


def _value_order(value: Any) -> tuple[int, Any]:
    """Sort key of setting values: numbers and bools by value, then strings, then anything else by its JSON."""
    if isinstance(value, bool | int | float):
        return 0, float(value)
    if isinstance(value, str):
        return 1, value
    return 2, value_key(value)


def _setting_row(
    env_id: str, runs: Sequence[Run], values: dict[str, Any], *, num_resamples: int, confidence: float, seed: int
) -> SettingRow:
    runs = sorted(runs, key=lambda run: run.seed)
    returns = tuple(final_return(run.episodic_return) for run in runs)
    mean, _, _ = mean_std(returns)
    interval = seed_interval(returns, num_resamples=num_resamples, confidence=confidence, seed=seed)
    return SettingRow(
        env_id=env_id,
        values=values,
        seeds=tuple(run.seed for run in runs),
        run_dirs=tuple(run.run_dir for run in runs),
        steps=tuple(run.final_step for run in runs),
        final_returns=returns,
        return_mean=mean,
        return_interval=interval,
    )


def group_settings(
    runs: Sequence[Run],
    *,
    num_resamples: int = NUM_RESAMPLES,
    confidence: float = CONFIDENCE,
    bootstrap_seed: int = BOOTSTRAP_SEED,
) -> tuple[GameSettings, ...]:
    """The games (sorted by env_id) whose runs have more than one setting, each with a row per setting.

    Runs of one game with equal ``Run.setting`` are one setting's seeds. The fields shown are those whose value
    differs between the game's settings (a field absent from some configs and not a PPOConfig field counts as
    None). Settings are ordered by those values, the first field slowest.
    """
    by_game: dict[str, dict[str, list[Run]]] = {}
    for run in runs:
        by_game.setdefault(run.env_id, {}).setdefault(run.setting, []).append(run)
    games = []
    for env_id, by_setting in sorted(by_game.items()):
        if len(by_setting) < 2:
            continue
        configs = {key: setting_config(group[0].config) for key, group in by_setting.items()}
        names = list(dict.fromkeys(name for config in configs.values() for name in config))
        fields = tuple(name for name in names if len({value_key(config.get(name)) for config in configs.values()}) > 1)
        rows = [
            _setting_row(
                env_id,
                group,
                {name: configs[key].get(name) for name in fields},
                num_resamples=num_resamples,
                confidence=confidence,
                seed=bootstrap_seed,
            )
            for key, group in by_setting.items()
        ]
        rows.sort(key=lambda row: [_value_order(row.values[name]) for name in fields])
        games.append(GameSettings(env_id, fields, tuple(rows)))
    return tuple(games)


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
    """Per-game rows sorted by env_id (which games: see the module's docstring), the HNS aggregates, and the
    settings of the games run with more than one (``group_settings``)."""
    by_game: dict[str, list[Run]] = {}
    for run in runs:
        by_game.setdefault(run.env_id, []).append(run)
    games = _listed_games(set(by_game), set(anchors) | set(human_random))
    rows = tuple(
        _game_row(env_id, by_game.get(env_id, []), anchors.get(env_id), human_random.get(env_id), target_steps)
        for env_id in games
    )
    return Report(
        rows=rows,
        runs=tuple(runs),
        skipped=tuple(skipped),
        aggregates=_aggregates(rows, num_resamples=num_resamples, confidence=confidence, seed=bootstrap_seed),
        target_steps=target_steps,
        num_resamples=num_resamples,
        bootstrap_seed=bootstrap_seed,
        confidence=confidence,
        settings=group_settings(
            runs, num_resamples=num_resamples, confidence=confidence, bootstrap_seed=bootstrap_seed
        ),
    )
