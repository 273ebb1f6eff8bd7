"""The TPU tier (issues 49, 50): on a machine with a TPU, what runs there computes what the CPU computes, ``auto``
takes a route the chip can compile, and the route it cannot is refused in one line. Skipped where no TPU is
present (CI). On the TPU machine, in one process (one program at a time may hold the chip)::

    python3 -m pytest -m tpu -n 0 -W "ignore:Transparent hugepages:UserWarning" tests/test_tpu.py

(``-n 0``, not ``-p no:xdist``: the project's pytest options name xdist's own ``--dist``.)

Float32 products on a TPU agree with float64 to about three digits at the default precision: the comparisons run
under ``jax.default_matmul_precision("highest")`` (about seven), and a comparison of whole iterations allows each
parameter the bound ``test_host_envs`` allows two routes on one CPU.
"""

import contextlib
import dataclasses
from collections.abc import Iterator
from pathlib import Path

import equinox as eqx
import jax
import numpy as np
import pytest

import ppo_eqx
from ppo_eqx.cli import main
from ppo_eqx.core.envs import backend
from ppo_eqx.host.host_envs import HostEnvsPlacement
from ppo_eqx.host.placement import MEASURED_HOST_ROUTE, OneDevice, placement_for, rollout_place

pytestmark = [
    pytest.mark.tpu,
    pytest.mark.skipif(not any(device.platform == "tpu" for device in jax.devices()), reason="no TPU on this machine"),
]


@contextlib.contextmanager
def on_cpu() -> Iterator[None]:
    with jax.default_device(jax.devices("cpu")[0]):
        yield


def _train(config: ppo_eqx.PPOConfig, placement: object = None) -> tuple[list, list[np.ndarray]]:
    """The records and the learned arrays (model, optimiser, keys, counts), on the host."""
    with ppo_eqx.Trainer(config, placement=placement) as trainer:  # type: ignore[arg-type]
        records = [rows for rows in ppo_eqx.run_agents(trainer)]
        checkpoint = trainer.checkpoint()
    learned = eqx.filter(eqx.tree_at(lambda c: c.envs, checkpoint, None), eqx.is_array)
    return records, [np.asarray(x) for x in jax.tree.leaves(learned)]


def _assert_close(config: ppo_eqx.PPOConfig, cpu: tuple[list, list], tpu: tuple[list, list]) -> None:
    (cpu_records, cpu_arrays), (tpu_records, tpu_arrays) = cpu, tpu
    floats = [(a, b) for a, b in zip(cpu_arrays, tpu_arrays, strict=True) if a.dtype.kind == "f" and a.size]
    diff = max(float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))) for a, b in floats)
    steps = config.num_iterations * config.num_minibatches * config.update_epochs
    assert diff <= 2 * 3.2 * config.learning_rate * steps / 10, diff  # each Adam step moves at most ~3.2 x lr
    ints = [(a, b) for a, b in zip(cpu_arrays, tpu_arrays, strict=True) if a.dtype.kind != "f"]
    assert all(np.array_equal(a, b) for a, b in ints)  # the keys, the iterations, Adam's count
    for cpu_rows, tpu_rows in zip(cpu_records, tpu_records, strict=True):
        for a, b in zip(cpu_rows, tpu_rows, strict=True):
            # A minibatch after the first is taken with parameters one Adam step on: a gradient near zero whose
            # sign the two platforms' sums disagree on moves its parameter by about lr either way, so the losses
            # part by more than the arithmetic's own 1e-7. On the TPU v5e, 2026-12-07: 1.1e-3 of 0.17 (Breakout-v5).
            assert abs(a["loss"] - b["loss"]) <= 1e-2 * max(1.0, abs(a["loss"])), (a, b)


def test_auto_steps_envpool_from_the_host_on_a_tpu() -> None:
    config = ppo_eqx.PPOConfig(num_envs=64).validate()
    envpool = backend("envpool")
    spec = envpool.spec(config.env_id)
    device = jax.devices()[0]
    measured = MEASURED_HOST_ROUTE.get(device.device_kind, "host-envs")
    assert rollout_place(config, envpool, spec, device=device) == measured
    chosen = placement_for(dataclasses.replace(config, rollout_on="host-envs"), spec, envpool)
    assert isinstance(chosen, HostEnvsPlacement) and chosen.actor_threads > 1
    assert chosen.rollout_record()["policy_device"] == "tpu:0"


def test_the_tpu_preset_steps_its_64_envs_by_actor_threads_acting_on_the_chip() -> None:
    config = ppo_eqx.PPOConfig.for_task("Breakout-v5", preset="tpu")
    envpool = backend("envpool")
    chosen = placement_for(config, envpool.spec(config.env_id), envpool)
    assert isinstance(chosen, HostEnvsPlacement) and chosen.actor_threads > 1
    assert (config.num_envs, chosen.rollout_record()["policy_device"]) == (64, "tpu:0")


def test_the_device_route_with_envpool_is_refused_in_one_line(tmp_path: Path, capsys) -> None:
    run = tmp_path / "run"
    args = ["train", "--env-id", "Breakout-v5", "--rollout-on", "device", "--run-dir", str(run), "--no-progress"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "into a TPU program" in err[0] and "allowed: rollout_on='auto', 'host-envs'" in err[0]
    assert not run.exists()


def test_a_host_envs_run_with_actors_on_the_tpu_computes_what_the_cpu_computes() -> None:
    config = ppo_eqx.PPOConfig(
        env_id="Breakout-v5", num_envs=4, num_steps=16, num_minibatches=2, update_epochs=1,
        total_timesteps=4 * 16 * 3, rollout_on="host-envs", actor_threads=2,
    ).validate()  # fmt: skip
    with jax.default_matmul_precision("highest"):
        with on_cpu():
            cpu = _train(config.replace(rollout_on="device"), OneDevice())
        tpu = _train(config)
    _assert_close(config, cpu, tpu)


def test_a_vector_policy_acts_on_the_host_cpu_and_learns_on_the_tpu() -> None:
    """Hopper-v4 (``auto``: host-envs): the policy acts on the host's CPU, the update runs on the chip."""
    config = ppo_eqx.PPOConfig.for_task(
        "Hopper-v4", num_envs=3, num_steps=16, num_minibatches=2, update_epochs=1, total_timesteps=3 * 16 * 3
    )
    envpool = backend("envpool")
    chosen = placement_for(config, envpool.spec("Hopper-v4"), envpool)
    assert isinstance(chosen, HostEnvsPlacement), chosen
    assert (chosen.rollout_record()["policy_device"], chosen.rollout_record()["learn_device"]) == ("cpu:0", "tpu:0")
    with jax.default_matmul_precision("highest"):
        with on_cpu():
            cpu = _train(config.replace(rollout_on="device"), OneDevice())
        tpu = _train(config, chosen)
    _assert_close(config, cpu, tpu)


def test_a_vmapped_gymnax_program_on_the_tpu_computes_what_the_cpu_computes() -> None:
    pytest.importorskip("gymnax")
    config = ppo_eqx.PPOConfig.for_task(
        "CartPole-v1", "gymnax", num_seeds=3, total_timesteps=4 * 128 * 6, iterations_per_dispatch=3
    )
    with jax.default_matmul_precision("highest"):
        with on_cpu():
            cpu = _train(config)
        tpu = _train(config)
    _assert_close(config, cpu, tpu)
