"""`ppo-eqx train` on a device mesh: 2 CPU devices in one process, and 2 processes on localhost (gloo), each
with its own EnvPool of half the envs, compute what the one-device run computes.

jax fixes its devices and peers when it starts, so every run is a subprocess of its own. The tolerances
are those of tests/test_parallel.py: the runs differ by the order in which XLA sums, observed below 1e-6
relative in the metrics over these few iterations.
"""

import json
import shutil
import sys
from pathlib import Path

import equinox as eqx
import jax
import numpy as np
import pytest

from ppo_eqx.config import PPOConfig
from ppo_eqx.core.envs import env_spec
from ppo_eqx.host.checkpoint import list_checkpoints, load_checkpoint, read_checkpoint

from ..processes import free_port, run_processes, worker_env

pytestmark = pytest.mark.subprocess

TIMEOUT_S = 240
RTOL, ATOL, PARAM_ATOL = 1e-4, 1e-5, 1e-6
# 6 iterations of 4 CartPole envs x 64 steps; new envs (and a checkpoint) after iterations 4 and 6.
FLAGS = ["--env-id", "CartPole-v1", "--total-timesteps", "1536", "--num-envs", "4", "--num-steps", "64"]
FLAGS += ["--checkpoint-every", "4", "--no-progress", "--no-tensorboard"]


def train(
    run_dir: Path, *, processes: int = 1, devices: int = 1, resume: bool = False, codes: tuple[int, ...] = ()
) -> list[str]:
    """Run (or resume) `ppo-eqx train` in ``processes`` processes (on 127.0.0.1) of ``devices`` forced CPU
    devices each; checks their exit codes (``codes``, default all 0) and returns each process's output."""
    env = worker_env()
    if devices > 1:
        env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    where = ["--resume", str(run_dir), *FLAGS[-2:]] if resume else [*FLAGS, "--run-dir", str(run_dir)]
    command = [sys.executable, "-m", "ppo_eqx", "train", *where]
    if devices > 1:
        command += ["--devices", str(devices)]
    if processes > 1:
        peers = ["--coordinator-address", f"127.0.0.1:{free_port()}", "--num-processes", str(processes)]
        commands = [command + peers + ["--process-id", str(i)] for i in range(processes)]
    else:
        commands = [command]
    return run_processes(commands, env, codes=codes, timeout=TIMEOUT_S)


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def final_params(run_dir: Path) -> list[np.ndarray]:
    path = list_checkpoints(run_dir)[-1]
    config = PPOConfig.from_dict(json.loads((run_dir / "config.json").read_text()))
    checkpoint = load_checkpoint(read_checkpoint(path), config, env_spec(config.env_id))
    return [np.asarray(x) for x in jax.tree.leaves(eqx.filter(checkpoint.model, eqx.is_array))]


def assert_same_run(got: Path, want: Path) -> None:
    got_rows, want_rows = metrics(got), metrics(want)
    assert len(got_rows) == len(want_rows) == 6
    for got_row, want_row in zip(got_rows, want_rows, strict=True):
        for name, value in want_row.items():
            if name not in ("sps", "time_elapsed"):
                np.testing.assert_allclose(got_row[name], value, rtol=RTOL, atol=ATOL, err_msg=name)
    for a, b in zip(final_params(got), final_params(want), strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=PARAM_ATOL)


@pytest.fixture(scope="module")
def one_device(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("one") / "run"
    train(run_dir)
    return run_dir


@pytest.mark.slow
def test_two_devices_train_as_one(one_device, tmp_path):
    train(tmp_path / "run", devices=2)
    assert json.loads((tmp_path / "run" / "hardware.json").read_text())["mesh"] == {"devices": 2, "processes": 1}
    assert_same_run(tmp_path / "run", one_device)


@pytest.mark.slow
def test_two_processes_train_as_one_and_resume_as_one(one_device, tmp_path):
    whole = tmp_path / "whole"
    logs = train(whole, processes=2)
    assert "ppo-eqx: done" in logs[0] and "ppo-eqx: done" not in logs[1]  # process 0 reports, 1 only trains
    assert_same_run(whole, one_device)
    # Process 0 refuses a directory that holds a run, and process 1 stops too instead of waiting for it.
    logs = train(whole, processes=2, codes=(2, 1))
    assert "already holds a run" in logs[0] and "process 0 refused --run-dir" in logs[1]

    # Both processes resume from process 0's checkpoint after iteration 4 and end where the whole run ended.
    resumed = tmp_path / "resumed"
    shutil.copytree(whole, resumed)
    for path in list_checkpoints(resumed)[1:]:
        path.unlink()
        path.with_suffix(".eqx").unlink()
    assert [p.stem for p in list_checkpoints(resumed)] == ["iter_000004"]
    train(resumed, processes=2, resume=True)
    assert list_checkpoints(resumed)[-1].with_suffix(".eqx").read_bytes() == (
        list_checkpoints(whole)[-1].with_suffix(".eqx").read_bytes()
    )
    assert metrics(resumed)[-1]["loss"] == metrics(whole)[-1]["loss"]
