"""The Atari-57 runner and the report end to end: real training on two games, a killed run, a resume."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.subprocess]

REPO_ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_SECONDS = 1800
# Two games, one seed, 4 iterations of 4 x 128 steps.
RUNNER_ARGS = ["--games", "Pong-v5", "Breakout-v5", "--seeds", "1", "--total-timesteps", "2048"]
TRAIN_ARGS = [
    "--num-envs",
    "4",
    "--num-steps",
    "128",
    "--num-minibatches",
    "4",
    "--update-epochs",
    "1",
    "--no-tensorboard",
    "--no-progress",
]


def run_script(*args: str) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_SECONDS,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )
    print(result.stdout, result.stderr, sep="\n")  # shown when the test fails
    return result


def test_sweep_resumes_only_the_killed_run_then_reports(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    runner = [str(REPO_ROOT / "bench" / "atari57.py"), *RUNNER_ARGS, "--sweep-dir", str(sweep), "--", *TRAIN_ARGS]
    pong, breakout = sweep / "Pong-v5__seed1", sweep / "Breakout-v5__seed1"

    first = run_script(*runner)
    assert first.returncode == 0
    assert "finished 2, skipped 0, failed 0" in first.stdout
    for run_dir in (pong, breakout):
        assert (run_dir / "summary.json").is_file()
        assert len((run_dir / "metrics.jsonl").read_text().splitlines()) == 4
        assert json.loads((run_dir / "config.json").read_text())["num_envs"] == 4

    breakout_summary = (breakout / "summary.json").read_bytes()
    breakout_mtime = (breakout / "summary.json").stat().st_mtime_ns
    # As if Pong had been killed before its end, and before its only checkpoint (the last iteration's): with no
    # checkpoint to go on from, it starts again with --overwrite.
    (pong / "summary.json").unlink()
    for path in (pong / "checkpoints").iterdir():
        path.unlink()

    dry = run_script(*runner[:1], "--dry-run", *runner[1:])
    assert dry.returncode == 0
    assert dry.stdout.splitlines() == [
        f"ppo-eqx train --env-id Pong-v5 --seed 1 --total-timesteps 2048 --run-dir {pong} --overwrite "
        + " ".join(TRAIN_ARGS)
    ]

    second = run_script(*runner)
    assert second.returncode == 0
    assert "finished 1, skipped 1, failed 0" in second.stdout
    assert "start Pong-v5 seed 1 (--overwrite)" in second.stdout
    assert "start Breakout-v5" not in second.stdout
    assert (pong / "summary.json").is_file()
    assert len((pong / "metrics.jsonl").read_text().splitlines()) == 4  # replaced, not appended to
    assert (breakout / "summary.json").read_bytes() == breakout_summary
    assert (breakout / "summary.json").stat().st_mtime_ns == breakout_mtime

    out = tmp_path / "report"
    report = run_script(str(REPO_ROOT / "bench" / "report.py"), str(sweep), "--out", str(out))  # shipped tables
    assert report.returncode == 0
    assert "2 run(s) over 2 game(s), 0 skipped" in report.stdout
    saved = json.loads((out / "report.json").read_text())
    assert saved["skipped"] == []
    assert len(saved["games"]) == 57
    run_games = [game for game in saved["games"] if not game["missing"]]
    assert [game["env_id"] for game in run_games] == ["Breakout-v5", "Pong-v5"]
    for game in run_games:
        assert game["seeds"] == [1]
        assert game["anchor"] is not None and game["speedup_cleanrl"] > 0
        assert game["projected"] is True  # 2048 steps, far from 10M
        assert game["timings"][0]["steps"] == 2048
        assert game["minutes_at_target"] > game["measured_minutes"] > 0
    markdown = (out / "report.md").read_text()
    assert "(projected)" in markdown
    assert (out / "runtime.png").stat().st_size > 0 and (out / "learning_curves_steps.svg").stat().st_size > 0
