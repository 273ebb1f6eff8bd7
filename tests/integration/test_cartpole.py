import json

import pytest

from ppo_eqx.cli import main

pytestmark = pytest.mark.subprocess


@pytest.mark.slow
def test_cartpole_learns_with_the_command_defaults(tmp_path):
    """`ppo-eqx train --env-id CartPole-v1` (CleanRL's ppo.py preset, seed 1) passes a return of 400."""
    run_dir = tmp_path / "cartpole"
    assert (
        main(["train", "--env-id", "CartPole-v1", "--run-dir", str(run_dir), "--no-progress", "--no-tensorboard"]) == 0
    )
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["global_step"] <= 500_000
    passed = [row["global_step"] for row in rows if (row["episodic_return"] or 0.0) > 400]
    assert passed, f"best return {max(row['episodic_return'] or 0.0 for row in rows)}"
    # Learning, not luck: the last tenth of training stays high on average.
    tail = [row["episodic_return"] for row in rows[-len(rows) // 10 :]]
    assert sum(tail) / len(tail) > 400
