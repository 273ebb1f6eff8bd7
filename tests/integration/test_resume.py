"""A run stopped at a checkpoint, or killed, and resumed equals the uninterrupted run, bit for bit on CPU."""

import importlib
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from ppo_eqx.cli import main
from ppo_eqx.config import PPOConfig
from ppo_eqx.core.envs import env_spec
from ppo_eqx.core.networks import ActorCritic, Dense
from ppo_eqx.host.checkpoint import list_checkpoints, load_checkpoint, read_checkpoint, read_metadata

from ..comparisons import final_checkpoint_bytes, metrics

pytestmark = pytest.mark.subprocess

supervisor_module = importlib.import_module("ppo_eqx.cli.supervisor")  # saves the checkpoints of ppo-eqx train
QUIET = ["--no-progress", "--no-tensorboard"]


@pytest.mark.slow
def test_breakout_stopped_at_a_checkpoint_and_resumed_equals_the_uninterrupted_run(tmp_path, monkeypatch, capsys):
    flags = ["--env-id", "Breakout-v5", "--num-envs", "4", "--num-steps", "32", "--total-timesteps", "768"]
    flags += ["--checkpoint-every", "2", *QUIET]  # 6 iterations of 128 steps, checkpoints after 2, 4 and 6
    whole, stopped = tmp_path / "whole", tmp_path / "stopped"
    assert main(["train", *flags, "--run-dir", str(whole)]) == 0

    real_save = supervisor_module.save_checkpoint

    def save_then_sigint_at_iteration_4(run_dir, checkpoint, *args, **kwargs):
        path = real_save(run_dir, checkpoint, *args, **kwargs)
        if int(checkpoint.iteration) == 4:
            os.kill(os.getpid(), signal.SIGINT)
        return path

    monkeypatch.setattr(supervisor_module, "save_checkpoint", save_then_sigint_at_iteration_4)
    assert main(["train", *flags, "--run-dir", str(stopped)]) == 130
    monkeypatch.undo()
    assert [p.name for p in list_checkpoints(stopped)] == ["iter_000002.json", "iter_000004.json"]
    assert f"continue with: ppo-eqx train --resume {stopped}" in capsys.readouterr().err
    assert main(["train", "--resume", str(stopped), *QUIET]) == 0

    rows = metrics(stopped)
    assert [row["iteration"] for row in rows] == [1, 2, 3, 4, 5, 6]
    assert rows == metrics(whole)
    assert final_checkpoint_bytes(stopped) == final_checkpoint_bytes(whole)
    # Not trivially equal: training moved the parameters, and another seed gives another run.
    config = PPOConfig.from_dict(json.loads((whole / "config.json").read_text()))
    spec = env_spec(config.env_id)
    first, last = (list_checkpoints(whole)[i] for i in (0, -1))
    first_model = load_checkpoint(read_checkpoint(first), config, spec).model
    last_model = load_checkpoint(read_checkpoint(last), config, spec).model
    assert isinstance(first_model, ActorCritic) and isinstance(last_model, ActorCritic)
    assert isinstance(first_model.actor, Dense) and isinstance(last_model.actor, Dense)
    assert (first_model.actor.weight != last_model.actor.weight).any()


@pytest.mark.slow
def test_a_run_killed_after_a_checkpoint_resumes_to_the_uninterrupted_run(tmp_path):
    # 15 iterations: after the checkpoint of iteration 5 the run waits for the compile of the envs of iteration 10.
    flags = ["--env-id", "CartPole-v1", "--total-timesteps", str(15 * 512), "--checkpoint-every", "5", *QUIET]
    killed, whole = tmp_path / "killed", tmp_path / "whole"
    process = subprocess.Popen(
        [sys.executable, "-m", "ppo_eqx", "train", *flags, "--run-dir", str(killed)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 300
        while not (killed / "checkpoints" / "iter_000005.json").exists():
            assert process.poll() is None and time.monotonic() < deadline, "no checkpoint appeared"
            time.sleep(0.05)
        process.send_signal(signal.SIGKILL)
    finally:
        process.kill()
        process.wait()
    assert process.returncode == -signal.SIGKILL
    checkpoints = list_checkpoints(killed)
    newest = read_metadata(checkpoints[-1])
    assert newest["iteration"] in (5, 10) and not (killed / "summary.json").exists()
    config = PPOConfig.from_dict(newest["config"])
    load_checkpoint(read_checkpoint(checkpoints[-1]), config, env_spec(config.env_id))  # whole and loadable

    assert main(["train", "--resume", str(killed), *QUIET]) == 0
    assert main(["train", *flags, "--run-dir", str(whole)]) == 0
    assert metrics(killed) == metrics(whole)
    assert final_checkpoint_bytes(killed) == final_checkpoint_bytes(whole)
    assert json.loads((killed / "summary.json").read_text())["global_step"] == 15 * 512
