"""``ppo-eqx train --network lstm`` end to end (issue 51): runs resumed from a checkpoint are the uninterrupted ones bit
for bit (gymnax: the memory is in every checkpoint; EnvPool: the envs and memories made afresh at each segment),
``eval`` plays with a memory, the placements that carry none refuse it in one line, and the LSTM learns a task that
needs memory where the feedforward policy stays at chance."""

import json
from pathlib import Path

import numpy as np
import pytest

import ppo_eqx
from ppo_eqx.cli import main
from ppo_eqx_bench.memory_env import Cue

from .comparisons import metrics, resumes_in_a_process_as_it_ran

pytestmark = pytest.mark.subprocess

QUIET = ["--no-progress", "--no-tensorboard"]


@pytest.mark.parametrize(
    ("backend", "at"),
    [
        pytest.param("gymnax", 3, id="gymnax-any-checkpoint"),  # a Ctrl-C's checkpoint between two segments too
        pytest.param("envpool", 2, id="envpool-at-a-segment"),
    ],
)
def test_an_lstm_run_resumes_bit_for_bit_and_plays(tmp_path: Path, capsys, backend: str, at: int) -> None:
    run = tmp_path / "run"
    every = ["--checkpoint-every", "2"] if backend == "envpool" else ["--checkpoint-every", "1"]
    args = ["train", "--env-id", "CartPole-v1", "--env-backend", backend, "--network", "lstm", "--num-envs", "4",
            "--num-steps", "32", "--total-timesteps", str(4 * 32 * 4), *every, "--keep-checkpoints", "5"]  # fmt: skip
    args += QUIET
    if backend == "gymnax":
        pytest.importorskip("gymnax")
        args += ["--iterations-per-dispatch", "1"]
    assert main([*args, "--run-dir", str(run)]) == 0
    assert json.loads((run / "config.json").read_text())["network"] == "lstm"
    assert len(metrics(run)) == 4
    resumes_in_a_process_as_it_ran(run, tmp_path / "resumed", at=at)
    for greedy in ([], ["--greedy"]):
        out = tmp_path / f"eval{len(greedy)}.json"
        assert main(["eval", str(run), "--episodes", "3", "--output", str(out), *greedy]) == 0
        assert len(json.loads(out.read_text())["returns"]) == 3
    capsys.readouterr()


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (["--rollout-on", "host-envs"], "carries no memory per env; allowed: rollout_on='device'"),
        (["--rollout-on", "host"], "carries no memory per env"),
        (["--num-envs", "8", "--async-batch-size", "4"], "async_batch_size=4 with a recurrent network"),
    ],
)
def test_where_the_memory_cannot_travel_lstm_is_refused_in_one_line(
    tmp_path: Path, capsys, extra: list[str], words: str
) -> None:
    run = tmp_path / "run"
    args = ["train", "--env-id", "CartPole-v1", "--network", "lstm", "--total-timesteps", "2048", *extra, *QUIET]
    assert main([*args, "--run-dir", str(run)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0], err


def _learn(network: str, steps: int) -> float:
    """The mean episodic return of the last fifth of a run on the cue task (8 steps between cue and decision)."""
    env = Cue(8)
    config = ppo_eqx.PPOConfig.for_task(env, total_timesteps=steps, network=network, num_envs=16, num_steps=64)
    with ppo_eqx.Trainer(config, env=env) as trainer:
        returns = [record["episodic_return"] for record in ppo_eqx.run(trainer)]
    return float(np.nanmean(returns[-len(returns) // 5 :]))


@pytest.mark.slow
def test_the_lstm_learns_what_needs_memory_where_the_feedforward_policy_cannot() -> None:
    # Optimum 1 (the cue remembered), chance 0.5; the vector preset but 16 envs x 64 steps (minibatches of 4 envs
    # sequences, as bench/recurrent.py's), 120k steps each.
    assert _learn("lstm", 120_000) >= 0.9
    assert _learn("feedforward", 120_000) <= 0.65
