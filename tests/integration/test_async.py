import json
import math
import subprocess
import sys

import pytest

from ppo_eqx.cli import main

pytestmark = pytest.mark.subprocess


def metrics(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_cartpole_learns_with_an_async_pool(tmp_path):
    """`ppo-eqx train --env-id CartPole-v1 --async-batch-size 2 --num-envs 4`: 200k steps (about 20 s) learn.

    Async runs are not reproducible (which envs come back together depends on EnvPool's threads), so the bar is
    set well below what runs reach (a return of 500, the maximum, by 100k steps) and well above chance (about 22).
    """
    run_dir = tmp_path / "cartpole"
    argv = ["train", "--env-id", "CartPole-v1", "--async-batch-size", "2", "--num-envs", "4"]
    argv += ["--total-timesteps", "200000", "--run-dir", str(run_dir), "--no-progress", "--no-tensorboard"]
    assert main(argv) == 0
    rows = metrics(run_dir)
    assert [row["global_step"] for row in rows[:2]] == [256, 512]  # num_steps * async_batch_size a batch
    assert json.loads((run_dir / "config.json").read_text())["async_batch_size"] == 2
    assert max(row["episodic_return"] or 0.0 for row in rows) > 400
    tail = [row["episodic_return"] for row in rows[-len(rows) // 10 :]]
    assert sum(tail) / len(tail) > 150


@pytest.mark.slow
def test_breakout_runs_async_iterations_across_a_segment_boundary(tmp_path):
    """16 envs received 8 at a time keep CleanRL's batch of 1024; new envs (and a new priming) after iteration 1."""
    run_dir = tmp_path / "breakout"
    argv = [sys.executable, "-m", "ppo_eqx", "train", "--env-id", "Breakout-v5", "--total-timesteps", "2048"]
    argv += ["--num-envs", "16", "--async-batch-size", "8", "--checkpoint-every", "1"]
    argv += ["--run-dir", str(run_dir), "--no-progress", "--no-tensorboard"]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    rows = metrics(run_dir)
    assert [row["global_step"] for row in rows] == [1024, 2048]
    for row in rows:
        for key in ("loss", "policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction", "sps"):
            assert math.isfinite(row[key]), (key, row)
        assert 0.0 < row["entropy"] <= math.log(4) + 1e-6
