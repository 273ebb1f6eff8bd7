"""The benchmark report on synthetic run directories and anchors with hand-computed numbers.

Synthetic anchors (never the real CSVs), per game: random/human score, CleanRL and PPO2 minutes and returns.

    game          random  human   CleanRL min  PPO2 min  CleanRL return  PPO2 return
    Alien-v5       100.0  1100.0      60.0       120.0      1100 ± 10      600 ± 20    (no runs: missing)
    Breakout-v5      0.0   100.0      40.0        80.0       400 ± 5       300 ± 6
    Pong-v5        -20.0    20.0      30.0        90.0        20 ± 1        19 ± 2
    Seaquest-v5      0.0  1000.0      33.0        66.0      1500 ± 50     1000 ± 40
"""

import json
import math
import os
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ppo_eqx.errors import RunDirError
from ppo_eqx_bench import anchors, report, runs, stats

from .bench_scripts import load_bench_script

pytestmark = pytest.mark.unit

REPO_ROOT = Path(__file__).resolve().parents[1]
NAN = float("nan")
FULL_STEPS = 9_765 * 1024  # what a 10M-step run with CleanRL's 8 x 128 batch logs last: 9_999_360

ANCHORS_CSV = """\
env_id,cleanrl_minutes,baselines_ppo2_minutes,cleanrl_return_mean,cleanrl_return_std,\
baselines_return_mean,baselines_return_std
Alien-v5,60.0,120.0,1100.0,10.0,600.0,20.0
Breakout-v5,40.0,80.0,400.0,5.0,300.0,6.0
Pong-v5,30.0,90.0,20.0,1.0,19.0,2.0
Seaquest-v5,33.0,66.0,1500.0,50.0,1000.0,40.0
"""
HUMAN_RANDOM_CSV = """env_id,random_score,human_score
Alien-v5,100.0,1100.0
Breakout-v5,0.0,100.0
Pong-v5,-20.0,20.0
Seaquest-v5,0.0,1000.0
"""
HARDWARE = {"cpu_model": "Test CPU", "cpu_count": 10, "gpu_name": "Test GPU", "jax_version": "0.0"}


@pytest.fixture
def anchors_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "anchors"
    directory.mkdir()
    (directory / anchors.ANCHORS_CSV).write_text(ANCHORS_CSV)
    (directory / anchors.HUMAN_RANDOM_CSV).write_text(HUMAN_RANDOM_CSV)
    return directory


def write_run(
    run_dir: Path,
    env_id: str,
    seed: int,
    *,
    steps: list[int],
    returns: list[float],
    times: list[float],
    num_envs: int = 8,
    num_steps: int = 128,
    summary_time: float | None = None,
    finished: bool = True,
    hardware: dict[str, Any] | None = None,
) -> Path:
    """A run directory as the trainer writes it (NaN returns written as null, as the trainer does)."""
    run_dir.mkdir(parents=True)
    config = {
        "env_id": env_id,
        "seed": seed,
        "total_timesteps": 10_000_000,
        "num_envs": num_envs,
        "num_steps": num_steps,
        "learning_rate": 2.5e-4,
    }
    (run_dir / "config.json").write_text(json.dumps(config))
    lines = []
    for iteration, (step, value, seconds) in enumerate(zip(steps, returns, times, strict=True), start=1):
        row = {
            "iteration": iteration,
            "global_step": step,
            "episodic_return": None if math.isnan(value) else value,
            "episodic_length": 100.0,
            "sps": 1000.0,
            "time_elapsed": seconds,
            "learning_rate": 2.5e-4,
            "policy_loss": 0.0,
            "value_loss": 1.0,
            "entropy": 1.0,
            "approx_kl": 0.0,
            "clip_fraction": 0.0,
        }
        lines.append(json.dumps(row))
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    (run_dir / "hardware.json").write_text(json.dumps(HARDWARE if hardware is None else hardware))
    if finished:
        summary = {
            "global_step": steps[-1],
            "time_elapsed": times[-1] if summary_time is None else summary_time,
            "episodic_return": returns[-1],
        }
        (run_dir / "summary.json").write_text(json.dumps(summary))
    return run_dir


def write_full_run(sweep: Path, env_id: str, seed: int, final: float, seconds: float) -> Path:
    """A finished 10M-step run: 10 iterations logged, the last one's return is the final return (10%)."""
    steps = [1024 * (1 + i * 1085) for i in range(9)] + [FULL_STEPS]
    returns = [NAN, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, final]
    times = [60.0 + (seconds - 60.0) * i / 9 for i in range(10)]
    return write_run(sweep / f"{env_id}__seed{seed}", env_id, seed, steps=steps, returns=returns, times=times)


@pytest.fixture
def sweep(tmp_path: Path) -> Path:
    """Breakout 2 seeds and Seaquest 3 seeds of 10M steps; Pong one short run; Alien missing.

    Breakout: 30 and 40 minutes, final returns 50 and 70 (HNS 0.5, 0.7).
    Seaquest: 10, 11, 12 minutes, final returns 100, 200, 600 (HNS 0.1, 0.2, 0.6).
    Pong: 10 iterations of 1000 steps (num_envs 10 x num_steps 100); the first ends at 65 s, then 2 s per
    iteration (0.002 s/step), so 10M steps project to 65 + 0.002 * (10M - 1000) = 20063 s = 334.3833 min;
    measured (summary): 83.5 s. Final return 10 (HNS 0.75).
    """
    root = tmp_path / "sweep"
    write_full_run(root, "Breakout-v5", 1, final=50.0, seconds=1800.0)
    write_full_run(root, "Breakout-v5", 2, final=70.0, seconds=2400.0)
    for seed, (final, seconds) in enumerate([(100.0, 600.0), (200.0, 660.0), (600.0, 720.0)], start=1):
        write_full_run(root, "Seaquest-v5", seed, final=final, seconds=seconds)
    write_run(
        root / "Pong-v5__seed1",
        "Pong-v5",
        1,
        steps=[1000 * i for i in range(1, 11)],
        returns=[NAN] * 9 + [10.0],
        times=[65.0 + 2.0 * i for i in range(10)],
        num_envs=10,
        num_steps=100,
        summary_time=83.5,
    )
    return root


# ------------------------------------------------------------------------------------------ pure numbers


def test_human_normalized_score_hand_values() -> None:
    assert float(stats.human_normalized_score(600.0, 100.0, 1100.0)) == pytest.approx(0.5)
    assert float(stats.human_normalized_score(100.0, 100.0, 1100.0)) == 0.0
    assert float(stats.human_normalized_score(30.0, -20.0, 20.0)) == pytest.approx(1.25)
    np.testing.assert_allclose(stats.human_normalized_score([-20.0, 0.0, 20.0], -20.0, 20.0), [0.0, 0.5, 1.0])


def test_interquartile_mean_of_eight_drops_two_at_each_end() -> None:
    # sorted: 1 2 | 3 4 5 6 | 7 100 -> (3 + 4 + 5 + 6) / 4
    assert stats.interquartile_mean([100.0, 3.0, 1.0, 6.0, 2.0, 5.0, 7.0, 4.0]) == pytest.approx(4.5)


def test_interquartile_mean_small_counts() -> None:
    assert stats.interquartile_mean([10.0, 1.0, 3.0, 2.0, 50.0]) == pytest.approx(5.0)  # (2 + 3 + 10) / 3
    assert stats.interquartile_mean([1.0, 2.0, 3.0, 4.0]) == pytest.approx(2.5)  # (2 + 3) / 2
    assert stats.interquartile_mean([1.0, 2.0, 9.0]) == pytest.approx(4.0)  # fewer than 4: plain mean
    assert stats.interquartile_mean([[1.0, 100.0], [2.0, 3.0]]) == pytest.approx(2.5)  # axes pooled
    with pytest.raises(ValueError):
        stats.interquartile_mean([])


@given(st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=40))
def test_interquartile_mean_matches_scipy_trim_mean(values: list[float]) -> None:
    scipy_stats = pytest.importorskip("scipy.stats")
    expected = scipy_stats.trim_mean(values, 0.25)  # rliable's aggregate_iqm
    assert stats.interquartile_mean(values) == pytest.approx(expected, rel=1e-9, abs=1e-6)


def test_aggregate_scores_hand_computed() -> None:
    # per-game means 0.5, 4, 10 -> median 4; pooled and sorted 0 | 1 2 4 6 | 10: floor(6/4) = 1 dropped at
    # each end -> (1 + 2 + 4 + 6) / 4 = 3.25.
    aggregates = stats.aggregate_scores([[0.0, 1.0], [2.0, 4.0, 6.0], [10.0]])
    assert aggregates["median"] == pytest.approx(4.0)
    assert aggregates["mean"] == pytest.approx((0.5 + 4.0 + 10.0) / 3)
    assert aggregates["iqm"] == pytest.approx(3.25)


def test_bootstrap_interval_hand_computed() -> None:
    """Game A has seeds (0, 1), game B (10, 10). A resample's mean of A is 0, 0.5 or 1 with probability
    1/4, 1/2, 1/4, so the mean (and, for two games, the median) over games is 5, 5.25 or 5.5: the 2.5% and
    97.5% percentiles are 5 and 5.5. The pooled IQM drops the smallest and largest of 4: (0,0,10,10) -> 5,
    otherwise 5.5 (probability 3/4): interval (5, 5.5)."""
    intervals = stats.stratified_bootstrap_ci([[0.0, 1.0], [10.0, 10.0]], num_resamples=2000, seed=0)
    for name in ("mean", "median", "iqm"):
        assert intervals[name] == pytest.approx((5.0, 5.5)), name


def test_bootstrap_with_one_seed_per_game_has_no_spread() -> None:
    intervals = stats.stratified_bootstrap_ci([[0.2], [0.9], [0.4]], num_resamples=200)
    assert intervals["median"] == pytest.approx((0.4, 0.4))
    assert intervals["mean"] == pytest.approx((0.5, 0.5))
    assert intervals["iqm"] == pytest.approx((0.5, 0.5))


@given(
    st.lists(st.lists(st.floats(-100.0, 100.0), min_size=1, max_size=5), min_size=1, max_size=6), st.integers(0, 2**31)
)
def test_bootstrap_interval_is_ordered_within_the_scores_and_repeatable(scores: list[list[float]], seed: int) -> None:
    intervals = stats.stratified_bootstrap_ci(scores, num_resamples=100, seed=seed)
    low_bound, high_bound = min(map(min, scores)), max(map(max, scores))
    for low, high in intervals.values():
        assert low_bound - 1e-9 <= low <= high <= high_bound + 1e-9
    assert stats.stratified_bootstrap_ci(scores, num_resamples=100, seed=seed) == intervals


def test_final_return_is_the_mean_of_the_last_tenth_of_iterations() -> None:
    assert stats.final_return(np.arange(1.0, 21.0)) == pytest.approx(19.5)  # last 2 of 20
    assert stats.final_return(np.arange(1.0, 26.0)) == pytest.approx(24.0)  # ceil(2.5) = 3: 23, 24, 25
    assert stats.final_return([3.0]) == 3.0


def test_final_return_ignores_nan_and_falls_back_to_the_last_finite_value() -> None:
    assert stats.final_return([*np.arange(1.0, 19.0), NAN, 20.0]) == pytest.approx(20.0)
    assert stats.final_return([5.0, 7.0, NAN, NAN]) == 7.0  # window = last 1 iteration, NaN
    assert math.isnan(stats.final_return([NAN, NAN]))
    assert math.isnan(stats.final_return([]))


@given(st.lists(st.one_of(st.just(NAN), st.floats(-1e3, 1e3)), min_size=1, max_size=50))
def test_final_return_lies_within_the_finite_returns(returns: list[float]) -> None:
    finite = [value for value in returns if not math.isnan(value)]
    value = stats.final_return(returns)
    if finite:
        assert min(finite) - 1e-9 <= value <= max(finite) + 1e-9
    else:
        assert math.isnan(value)


def test_project_minutes_excludes_compilation_from_the_rate() -> None:
    # 30 s for the first 1000 steps (compilation), then 10 s per 1000 steps.
    steps, seconds = [1000, 2000, 3000], [30.0, 40.0, 50.0]
    assert stats.project_minutes(steps, seconds, target_steps=10_000_000) == pytest.approx(100_020.0 / 60.0)
    assert stats.project_minutes(steps, seconds, target_steps=3000) == pytest.approx(50.0 / 60.0)
    assert math.isnan(stats.project_minutes([1000], [30.0]))


# ---------------------------------------------------------------------------------------- whole reports


def test_tables_hold_hand_computed_values(sweep: Path, anchors_dir: Path, tmp_path: Path) -> None:
    result = report.write_report([sweep], tmp_path / "out", anchors_dir, plots=False, num_resamples=200)
    assert result.skipped == ()

    breakout = result.row("Breakout-v5")
    assert breakout.seeds == (1, 2)
    assert not breakout.projected
    assert breakout.measured_minutes == pytest.approx(35.0)
    assert breakout.minutes_at_target == pytest.approx(35.0)
    assert breakout.speedup_cleanrl == pytest.approx(40.0 / 35.0)
    assert breakout.speedup_baselines == pytest.approx(80.0 / 35.0)
    assert breakout.return_stats == pytest.approx((60.0, 10.0, 2))  # population std of 50, 70
    assert breakout.hns == pytest.approx((0.5, 0.7))

    pong = result.row("Pong-v5")
    assert pong.projected
    assert pong.measured_minutes == pytest.approx(83.5 / 60.0)
    assert pong.minutes_at_target == pytest.approx(20_063.0 / 60.0)
    assert pong.speedup_cleanrl == pytest.approx(30.0 / (20_063.0 / 60.0))
    assert pong.final_returns == (10.0,)
    assert pong.hns == pytest.approx((0.75,))

    seaquest = result.row("Seaquest-v5")
    assert seaquest.measured_minutes == pytest.approx(11.0)
    assert seaquest.speedup_cleanrl == pytest.approx(3.0)
    assert seaquest.hns == pytest.approx((0.1, 0.2, 0.6))

    aggregates = result.aggregates
    assert aggregates.games == ("Breakout-v5", "Pong-v5", "Seaquest-v5")
    # per-game means 0.6, 0.75, 0.3; pooled 0.1 | 0.2 0.5 0.6 0.7 | 0.75
    assert aggregates.point["median"] == pytest.approx(0.6)
    assert aggregates.point["mean"] == pytest.approx(0.55)
    assert aggregates.point["iqm"] == pytest.approx(0.5)
    for name, (low, high) in aggregates.interval.items():
        assert low <= high, name
    # CleanRL HNS: Breakout 4.0, Pong 1.0, Seaquest 1.5; Alien 1.0 only among all games.
    assert aggregates.anchors[("cleanrl", "same")] == pytest.approx({"median": 1.5, "mean": 6.5 / 3, "iqm": 6.5 / 3})
    assert aggregates.anchors[("cleanrl", "all")] == pytest.approx({"median": 1.25, "mean": 1.875, "iqm": 1.25})
    # PPO2 HNS: Breakout 3.0, Pong 0.975, Seaquest 1.0.
    assert aggregates.anchors[("baselines", "same")]["median"] == pytest.approx(1.0)

    markdown = (tmp_path / "out" / "report.md").read_text()
    machine = "Test GPU, 1 run at once"  # hardware.json's GPU; runs_at_once unset: alone
    assert f"| Pong-v5 | 1 | 10,000 | 1.4 | 334.4 (projected) | {machine} | 30.0 | 0.09× | 90.0 | 0.27× |" in markdown
    assert f"| Breakout-v5 | 2 | 9,999,360 | 35.0 | 35.0 | {machine} | 40.0 | 1.14× | 80.0 | 2.29× |" in markdown
    assert "| Breakout-v5 | 1, 2 | 60.0 ± 10.0 | 400.0 ± 5.0 | 300.0 ± 6.0 |" in markdown
    assert "| Median | 0.600 [" in markdown


def test_missing_games_read_missing_never_zero(sweep: Path, anchors_dir: Path, tmp_path: Path) -> None:
    result = report.write_report([sweep], tmp_path / "out", anchors_dir, plots=False, num_resamples=50)
    alien = result.row("Alien-v5")
    assert alien.missing
    assert math.isnan(alien.measured_minutes) and math.isnan(alien.speedup_cleanrl)
    assert "Alien-v5" not in result.aggregates.games

    markdown = (tmp_path / "out" / "report.md").read_text()
    alien_lines = [line for line in markdown.splitlines() if line.startswith("| Alien-v5 |")]
    assert len(alien_lines) == 3  # runtime, returns, HNS tables
    runtime_cells = alien_lines[0].strip("|").split("|")
    assert [cell.strip() for cell in runtime_cells] == [
        "Alien-v5",
        "missing",
        "missing",
        "missing",
        "missing",
        "missing",
        "60.0",
        "missing",
        "120.0",
        "missing",
    ]
    assert [cell.strip() for cell in alien_lines[1].strip("|").split("|")][:3] == ["Alien-v5", "missing", "missing"]
    assert [cell.strip() for cell in alien_lines[2].strip("|").split("|")][3] == "missing"
    assert markdown.split("## Missing games")[1].strip() == "Alien-v5"

    saved = json.loads((tmp_path / "out" / "report.json").read_text())
    alien_json = next(game for game in saved["games"] if game["env_id"] == "Alien-v5")
    assert alien_json["missing"] is True
    assert alien_json["measured_minutes"] is None and alien_json["return_mean"] is None


def test_a_game_without_finished_episodes_is_not_scored(tmp_path: Path, anchors_dir: Path) -> None:
    write_run(
        tmp_path / "runs" / "Pong-v5__seed1",
        "Pong-v5",
        1,
        steps=[512, 1024],
        returns=[NAN, NAN],
        times=[30.0, 31.0],
        num_envs=4,
    )
    result = report.write_report([tmp_path / "runs"], tmp_path / "out", anchors_dir, plots=True)
    assert not result.row("Pong-v5").missing
    assert result.aggregates.games == ()
    assert all(math.isnan(value) for value in result.aggregates.point.values())
    markdown = (tmp_path / "out" / "report.md").read_text()
    assert "| Pong-v5 | 1 | no finished episode |" in markdown


def test_malformed_and_partial_run_directories_are_listed_not_fatal(
    sweep: Path, anchors_dir: Path, tmp_path: Path
) -> None:
    junk = tmp_path / "junk"
    (junk / "bad_config").mkdir(parents=True)
    (junk / "bad_config" / "config.json").write_text("{not json")
    (junk / "no_config").mkdir()
    (junk / "no_config" / "metrics.jsonl").write_text('{"global_step": 1}\n')
    (junk / "config_list").mkdir()
    (junk / "config_list" / "config.json").write_text("[1, 2]")
    (junk / "no_env_id").mkdir()
    (junk / "no_env_id" / "config.json").write_text('{"seed": 1}')
    empty = write_run(junk / "empty_metrics", "Pong-v5", 7, steps=[512], returns=[1.0], times=[1.0])
    (empty / "metrics.jsonl").write_text("")
    no_metrics = write_run(junk / "no_metrics", "Pong-v5", 8, steps=[512], returns=[1.0], times=[1.0])
    (no_metrics / "metrics.jsonl").unlink()
    broken = write_run(
        junk / "broken_line", "Pong-v5", 9, steps=[512, 1024, 1536], returns=[1.0] * 3, times=[1.0, 2.0, 3.0]
    )
    lines = (broken / "metrics.jsonl").read_text().splitlines()
    (broken / "metrics.jsonl").write_text("\n".join([lines[0], lines[1][:20], lines[2]]) + "\n")
    bad_summary = write_run(junk / "bad_summary", "Pong-v5", 10, steps=[512], returns=[1.0], times=[1.0])
    (bad_summary / "summary.json").write_text("")
    write_run(junk / "unfinished", "Pong-v5", 11, steps=[512], returns=[1.0], times=[1.0], finished=False)
    write_full_run(junk / "duplicate", "Breakout-v5", 1, final=1000.0, seconds=60.0)
    (junk / "empty_dir").mkdir()  # holds no run file: not a run directory, not listed

    result = report.write_report(
        [sweep, junk, tmp_path / "nowhere"], tmp_path / "out", anchors_dir, plots=False, num_resamples=50
    )
    reasons = {item.path.name: item.reason for item in result.skipped}
    assert set(reasons) == {
        "bad_config",
        "no_config",
        "config_list",
        "no_env_id",
        "empty_metrics",
        "no_metrics",
        "broken_line",
        "bad_summary",
        "unfinished",
        "Breakout-v5__seed1",
        "nowhere",
    }
    assert reasons["bad_config"].startswith("config.json: invalid JSON")
    assert reasons["no_config"] == "missing config.json"
    assert reasons["config_list"] == "config.json: not a JSON object"
    assert reasons["no_env_id"] == "config.json: env_id missing or not a string"
    assert reasons["empty_metrics"] == "metrics.jsonl has no iterations"
    assert reasons["no_metrics"] == "missing metrics.jsonl"
    assert reasons["broken_line"].startswith("metrics.jsonl line 2: invalid JSON")
    assert reasons["bad_summary"].startswith("summary.json: invalid JSON")
    assert reasons["unfinished"].startswith("unfinished: no summary.json")
    assert reasons["Breakout-v5__seed1"].startswith("duplicate of Breakout-v5 seed 1 in ")
    assert reasons["nowhere"] == "does not exist"
    # The good runs are unaffected: the duplicate's return (1000) was not counted.
    assert result.row("Breakout-v5").final_returns == (50.0, 70.0)
    assert len(result.runs) == 6

    markdown = (tmp_path / "out" / "report.md").read_text()
    skipped_section = markdown.split("## Skipped run directories")[1].split("## Missing games")[0]
    for name in reasons:
        assert name in skipped_section


def test_unfinished_runs_can_be_included_and_their_cut_last_line_is_dropped(tmp_path: Path, anchors_dir: Path) -> None:
    run_dir = write_run(
        tmp_path / "runs" / "Pong-v5__seed1",
        "Pong-v5",
        1,
        steps=[1000, 2000, 3000],
        returns=[NAN, 4.0, 6.0],
        times=[30.0, 40.0, 50.0],
        num_envs=10,
        num_steps=100,
        finished=False,
    )
    with open(run_dir / "metrics.jsonl", "a") as file:
        file.write('{"iteration": 4, "global_st')  # killed mid-write
    run = runs.load_run(run_dir, include_unfinished=True)
    assert not run.finished
    assert run.global_step.tolist() == [1000.0, 2000.0, 3000.0]
    assert run.final_step == 3000 and run.final_seconds == 50.0
    with pytest.raises(RunDirError, match="unfinished"):
        runs.load_run(run_dir)
    result = report.write_report(
        [tmp_path / "runs"], tmp_path / "out", anchors_dir, include_unfinished=True, plots=False
    )
    assert result.row("Pong-v5").minutes_at_target == pytest.approx(100_020.0 / 60.0)


def test_plots_are_written_as_png_and_svg(sweep: Path, anchors_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    report.write_report([sweep], out, anchors_dir, num_resamples=50)
    for name in ("learning_curves_steps", "learning_curves_time", "runtime", "aggregate_hns"):
        png, svg = out / f"{name}.png", out / f"{name}.svg"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
        assert png.stat().st_size > 1000, name
        assert "<svg" in svg.read_text()[:1000], name
    markdown = (out / "report.md").read_text()
    assert "![runtime](runtime.png)" in markdown
    assert "![aggregate_hns](aggregate_hns.png)" in markdown


def test_no_runs_at_all_still_gives_a_report(tmp_path: Path, anchors_dir: Path) -> None:
    (tmp_path / "empty").mkdir()
    result = report.write_report([tmp_path / "empty"], tmp_path / "out", anchors_dir)
    assert all(row.missing for row in result.rows)
    assert [item.reason for item in result.skipped] == [
        "no run directory under it (none holds config.json, metrics.jsonl, summary.json, hardware.json)"
    ]
    markdown = (tmp_path / "out" / "report.md").read_text()
    assert "0 of 4 game(s) missing" not in markdown and "4 of 4 game(s) missing" in markdown
    assert "| Median | n/a |" in markdown
    assert not list((tmp_path / "out").glob("*.png"))


def test_hardware_section_lists_each_distinct_machine_once(tmp_path: Path, anchors_dir: Path) -> None:
    other = {**HARDWARE, "gpu_name": "Other GPU"}
    for seed, hardware in ((1, HARDWARE), (2, HARDWARE), (3, other)):
        write_run(
            tmp_path / "runs" / f"Pong-v5__seed{seed}",
            "Pong-v5",
            seed,
            steps=[512, 1024],
            returns=[1.0, 2.0],
            times=[10.0, 11.0],
            hardware=hardware,
        )
    report.write_report([tmp_path / "runs"], tmp_path / "out", anchors_dir, plots=False)
    section = (tmp_path / "out" / "report.md").read_text().split("## Hardware\n")[1].split("## Skipped")[0]
    assert section.count("### Hardware") == 2
    assert "2 run(s)" in section and "1 run(s)" in section
    assert "| gpu_name | Test GPU |" in section and "| gpu_name | Other GPU |" in section


def test_anchor_csvs_that_are_missing_raise_anchor_error(tmp_path: Path) -> None:
    with pytest.raises(anchors.AnchorError):
        anchors.load_anchors(tmp_path)
    (tmp_path / anchors.ANCHORS_CSV).write_text("env_id,cleanrl_minutes\nPong-v5,1.0\n")
    (tmp_path / anchors.HUMAN_RANDOM_CSV).write_text(HUMAN_RANDOM_CSV)
    with pytest.raises(anchors.AnchorError, match="missing column"):
        anchors.load_anchors(tmp_path)


def write_cartpole_run(runs_dir: Path, seed: int = 1) -> Path:
    """A finished CartPole-v1 run of 4 x 128 steps: no reference game."""
    return write_run(
        runs_dir / f"CartPole-v1__seed{seed}",
        "CartPole-v1",
        seed,
        steps=[512, 1024, 1536],
        returns=[NAN, 20.0, 60.0],
        times=[3.0, 4.0, 5.0],
        num_envs=4,
    )


def test_runs_without_a_reference_are_reported_without_its_columns(tmp_path: Path) -> None:
    write_cartpole_run(tmp_path / "runs")
    out = tmp_path / "out"
    result = report.write_report([tmp_path / "runs"], out)  # the shipped reference tables
    assert [row.env_id for row in result.rows] == ["CartPole-v1"]  # no Atari game listed as missing
    assert not result.has_anchors and not result.has_hns
    assert result.row("CartPole-v1").final_returns == (60.0,)

    markdown = (out / "report.md").read_text()
    assert "| Game | Seeds | Steps (mean) | ppo_eqx min (measured) | ppo_eqx min at 10M | Machine |\n" in markdown
    assert "| Game | Seeds | ppo_eqx |\n" in markdown
    assert "| CartPole-v1 | 1 | 60.0 ± 0.0 |\n" in markdown
    for word in ("CleanRL", "PPO2", "Speed-up", "Human-normalised", "HNS"):
        assert word not in markdown, word
    assert "0 of 1 game(s) missing" in markdown
    assert sorted(path.stem for path in out.glob("*.png")) == [
        "learning_curves_steps",
        "learning_curves_time",
        "runtime",
    ]
    saved = json.loads((out / "report.json").read_text())
    assert [game["env_id"] for game in saved["games"]] == ["CartPole-v1"]
    assert saved["games"][0]["anchor"] is None and saved["games"][0]["hns"] == [None]


def test_a_game_without_a_reference_beside_reference_games_reads_n_a(
    sweep: Path, anchors_dir: Path, tmp_path: Path
) -> None:
    write_cartpole_run(sweep)
    result = report.write_report([sweep], tmp_path / "out", anchors_dir, plots=False, num_resamples=50)
    assert [row.env_id for row in result.rows] == ["Alien-v5", "Breakout-v5", "CartPole-v1", "Pong-v5", "Seaquest-v5"]
    assert result.aggregates.games == ("Breakout-v5", "Pong-v5", "Seaquest-v5")  # CartPole has no HNS
    markdown = (tmp_path / "out" / "report.md").read_text()
    # projected: 3 s for the first 512 steps, then 1 s per 512: 3 + (10M - 512) / 512 = 19,533.25 s
    line = "| CartPole-v1 | 1 | 1,536 | 0.1 | 325.6 (projected) | Test GPU, 1 run at once | n/a | n/a | n/a | n/a |"
    assert line in markdown
    assert "| CartPole-v1 | 1 | 60.0 ± 0.0 | n/a | n/a |" in markdown
    assert "| CartPole-v1 | n/a | n/a | n/a (no human/random score) | n/a | n/a |" in markdown


def test_the_shipped_reference_tables_are_the_default(tmp_path: Path) -> None:
    table, human_random = anchors.load_anchors()
    assert len(table) == len(human_random) == 57
    breakout = table["Breakout-v5"]
    assert (breakout.cleanrl_minutes, breakout.cleanrl_return_mean, breakout.baselines_return_mean) == (
        42.3547,
        430.09,
        405.73,
    )
    assert human_random["Pong-v5"] == anchors.HumanRandom(-20.7, 14.6)
    write_full_run(tmp_path / "runs", "Breakout-v5", 1, final=30.5, seconds=2400.0)
    result = report.write_report([tmp_path / "runs"], tmp_path / "out", plots=False, num_resamples=50)
    assert len(result.rows) == 57 and result.has_anchors and result.has_hns
    breakout_row = result.row("Breakout-v5")
    assert breakout_row.hns == (1.0,)  # DQN Zoo's human score
    assert breakout_row.speedup_cleanrl == pytest.approx(42.3547 / 40.0)


def test_the_wheel_is_the_library_and_the_reference_tables_stay_in_the_checkout() -> None:
    pyproject = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    setuptools = pyproject["tool"]["setuptools"]
    assert setuptools["packages"]["find"]["include"] == ["ppo_eqx", "ppo_eqx.*"]
    assert "ppo_eqx_bench" not in setuptools.get("package-data", {})
    assert anchors.DATA_DIR.parent == REPO_ROOT / "ppo_eqx_bench"  # read from the checkout, beside bench/
    for name in (anchors.ANCHORS_CSV, anchors.HUMAN_RANDOM_CSV, "README.md"):  # README.md: sources and licences
        assert (anchors.DATA_DIR / name).is_file()


def test_the_core_package_imports_nothing_of_the_bench_package() -> None:
    importers = [path.name for path in (REPO_ROOT / "ppo_eqx").rglob("*.py") if "ppo_eqx_bench" in path.read_text()]
    assert importers == []


# ------------------------------------------------------------------------------------------ the CLI


def test_cli_reads_anchors_from_flag_or_environment(
    sweep: Path, anchors_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    cli = load_bench_script("report")
    assert cli.main([str(sweep), "--out", str(tmp_path / "a"), "--anchors", str(anchors_dir), "--no-plots"]) == 0
    assert "6 run(s) over 3 game(s), 0 skipped" in capsys.readouterr().out
    monkeypatch.setenv("PPO_EQX_ANCHORS", str(anchors_dir))
    assert cli.main([str(sweep), "--out", str(tmp_path / "b"), "--no-plots"]) == 0
    assert (tmp_path / "b" / "report.md").read_text() == (tmp_path / "a" / "report.md").read_text()
    monkeypatch.setenv("PPO_EQX_ANCHORS", str(tmp_path / "no_anchors_here"))
    assert cli.main([str(sweep), "--out", str(tmp_path / "c")]) == 2
    assert "error: cannot read" in capsys.readouterr().err


def test_cli_without_flag_or_environment_uses_the_shipped_tables(
    sweep: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("PPO_EQX_ANCHORS", raising=False)
    cli = load_bench_script("report")
    assert cli.main([str(sweep), "--out", str(tmp_path / "out"), "--no-plots"]) == 0
    assert "6 run(s) over 3 game(s), 0 skipped" in capsys.readouterr().out
    saved = json.loads((tmp_path / "out" / "report.json").read_text())
    assert len(saved["games"]) == 57
    assert next(game for game in saved["games"] if game["env_id"] == "Pong-v5")["anchor"]["cleanrl_minutes"] == 36.7657


@pytest.mark.subprocess
def test_cli_help_runs_as_a_script() -> None:
    result = subprocess.run(
        [sys.executable, str(REPO_ROOT / "bench" / "report.py"), "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )
    assert result.returncode == 0, result.stderr
    assert "--anchors" in result.stdout and "PPO_EQX_ANCHORS" in result.stdout
