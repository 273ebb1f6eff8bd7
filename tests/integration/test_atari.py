import json
import math
import subprocess
import sys

import pytest

pytestmark = pytest.mark.subprocess

VOLATILE = {"sps", "time_elapsed"}


def train_breakout(run_dir, seed: int) -> list[dict]:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "ppo_eqx",
            "train",
            "--env-id",
            "Breakout-v5",
            "--total-timesteps",
            "3072",
            "--seed",
            str(seed),
            "--run-dir",
            str(run_dir),
            "--no-progress",
            "--no-tensorboard",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_breakout_runs_whole_iterations_deterministically(tmp_path):
    rows = train_breakout(tmp_path / "a", seed=1)
    assert [row["global_step"] for row in rows] == [1024, 2048, 3072]
    for row in rows:
        for key in (
            "loss",
            "policy_loss",
            "value_loss",
            "entropy",
            "approx_kl",
            "clip_fraction",
            "learning_rate",
            "sps",
        ):
            assert math.isfinite(row[key]), (key, row)
        assert 0.0 < row["entropy"] <= math.log(4) + 1e-6
        assert row["episodic_return"] is None or row["episodic_return"] >= 0.0
    config = json.loads((tmp_path / "a" / "config.json").read_text())
    assert (config["env_id"], config["num_envs"], config["clip_coef"]) == ("Breakout-v5", 8, 0.1)
    again = train_breakout(tmp_path / "b", seed=1)
    strip = lambda rows: [{k: v for k, v in row.items() if k not in VOLATILE} for row in rows]  # noqa: E731
    assert strip(again) == strip(rows)
