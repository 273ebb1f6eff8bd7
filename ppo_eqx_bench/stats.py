"""The report's numbers: human-normalised scores, their aggregates and intervals, final returns, minutes.

Pure NumPy functions of per-seed scores and per-iteration logs. Conventions:

- *HNS* = (score - random) / (human - random).
- Aggregates follow rliable (Agarwal et al. 2021): median and mean over games of the per-game mean over
  seeds; IQM over all (seed, game) scores pooled, with the ``scipy.stats.trim_mean(x, 0.25)`` convention
  (drop floor(n/4) scores at each end). Intervals: percentile intervals of a stratified bootstrap that
  resamples seeds within each game. Unlike rliable, games may have different numbers of seeds (a sweep
  under way). On equal seed counts the point values equal rliable 1.2.0's and the intervals agree with its
  ``get_interval_estimates`` to Monte Carlo error.
- *Interval over seeds* of one setting's mean final return (a sweep's table): the same bootstrap with that
  setting as the one game, so the percentile interval of the mean of its seeds resampled; none (NaN) with
  fewer than two finite returns.
- *Final return* of a run: the mean of ``episodic_return`` over the last 10% of iterations (rounded up, at
  least one), ignoring iterations in which no episode finished (NaN); when none of those finished an
  episode, the last finite value; NaN when no episode ever finished.
- *Minutes at a target step count* (10M, the reference's): measured or projected linearly in steps after
  the first iteration (``project_minutes``).
- Standard deviations over seeds are population ones (``ddof=0``, NumPy's default).
"""

import math
from collections.abc import Sequence

import numpy as np

TARGET_STEPS = 10_000_000
FINAL_FRACTION = 0.1
NUM_RESAMPLES = 2000
BOOTSTRAP_SEED = 0
CONFIDENCE = 0.95
AGGREGATES = ("median", "iqm", "mean")
WINDOW = 20
"""Iterations in a learning curve's moving average (``moving_average``)."""
NAN = float("nan")

# Plain unions, not numpy.typing's array-like one, which the tests' runtime type checker rejects floats for.
Numbers = Sequence[float] | Sequence[int] | np.ndarray


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


def _per_game(scores_per_game: Sequence[Numbers], caller: str) -> list[np.ndarray]:
    games = [np.asarray(scores, dtype=np.float64).ravel() for scores in scores_per_game]
    if not games or any(scores.size == 0 for scores in games):
        raise ValueError(f"{caller} needs at least one game and one score per game")
    return games


def aggregate_scores(scores_per_game: Sequence[Numbers]) -> dict[str, float]:
    """Median, IQM and mean of per-seed scores, one 1-D array per game (seed counts may differ).

    median, mean: over games, of each game's mean over seeds. iqm: over all (seed, game) scores pooled,
    as rliable does. Every game needs at least one score.
    """
    games = _per_game(scores_per_game, "aggregate_scores")
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
    games = _per_game(scores_per_game, "stratified_bootstrap_ci")
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


def seed_interval(
    values: Numbers,
    *,
    num_resamples: int = NUM_RESAMPLES,
    confidence: float = CONFIDENCE,
    seed: int = BOOTSTRAP_SEED,
) -> tuple[float, float]:
    """Percentile interval of the mean of the finite ``values`` (one per seed) under a bootstrap of the seeds.

    ``stratified_bootstrap_ci`` with one game; (NaN, NaN) with fewer than two finite values, where resampling
    cannot show any spread.
    """
    array = np.asarray(values, dtype=np.float64).ravel()
    finite = array[np.isfinite(array)]
    if finite.size < 2:
        return NAN, NAN
    intervals = stratified_bootstrap_ci([finite], num_resamples=num_resamples, confidence=confidence, seed=seed)
    return intervals["mean"]


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


def mean_std(values: Sequence[float]) -> tuple[float, float, int]:
    """Mean and population std of the finite values, and how many there were (NaN, NaN, 0 for none)."""
    finite = np.array([value for value in values if math.isfinite(value)], dtype=np.float64)
    if finite.size == 0:
        return NAN, NAN, 0
    return float(finite.mean()), float(finite.std()), int(finite.size)


def mean_if_all_finite(values: Sequence[float]) -> float:
    """The mean, or NaN when there are no values or any is not finite."""
    if not values or not all(math.isfinite(value) for value in values):
        return NAN
    return float(np.mean(values))


def ratio(numerator: float, denominator: float) -> float:
    """numerator / denominator, or NaN unless both are finite and the denominator positive."""
    if not (math.isfinite(numerator) and math.isfinite(denominator)) or denominator <= 0:
        return NAN
    return numerator / denominator


def moving_average(values: Numbers, window: int = WINDOW) -> np.ndarray:
    """Trailing mean of the finite values among the last ``window`` entries (fewer at the start); NaN where
    that window holds none."""
    if window < 1:
        raise ValueError(f"window {window} must be at least 1")
    values = np.asarray(values, dtype=np.float64).ravel()
    finite = np.isfinite(values)
    sums = np.concatenate([[0.0], np.cumsum(np.where(finite, values, 0.0))])
    counts = np.concatenate([[0], np.cumsum(finite)])
    end = np.arange(1, values.size + 1)
    start = np.maximum(end - window, 0)
    count = counts[end] - counts[start]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(count > 0, (sums[end] - sums[start]) / np.maximum(count, 1), np.nan)


def steps_text(steps: float) -> str:
    """A step count in a few characters: ``1.5M``, ``564k``, ``512``."""
    if steps >= 1e6:
        return f"{steps / 1e6:.3g}M"
    return f"{steps / 1e3:.3g}k" if steps >= 1e3 else f"{steps:.0f}"
