"""The rollout on the host's CPU, the learning on another device (``--rollout-on host``, ``host.split``; issue 31).

On a CPU machine two host devices stand for the host's CPU and an accelerator (``XLA_FLAGS`` forces them, so the
cases run in processes of their own): the split run computes what the one-program run computes, to float32
rounding, for one agent with the rollout's convolutions on another route and for two agents in one program; a
split run resumed from a checkpoint is the uninterrupted one bit for bit; EnvPool's threads change nothing the run
computes.
"""

import json
import textwrap
from pathlib import Path

import pytest

from .comparisons import metrics, resumes_in_a_process_as_it_ran
from .processes import ROOT, ppo_eqx, run_child, worker_env
from .run_files import BATCH, tiny

pytestmark = pytest.mark.subprocess

TWO_DEVICES = {"XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
COMPARE = """
    import json, sys
    import equinox as eqx, jax, numpy as np
    import ppo_eqx
    from ppo_eqx.host.split import SplitPlacement

    def train(config, placement):
        with ppo_eqx.Trainer(config, placement=placement) as trainer:
            records = list(ppo_eqx.run_agents(trainer))
            checkpoint = trainer.checkpoint()
        arrays = [np.asarray(x) for x in jax.tree.leaves(eqx.filter(checkpoint, eqx.is_array))]
        return records, arrays

    results = {}
    cpu, other = jax.devices()
    # One agent (Breakout, the rollout's convolutions on another route than the learning's) and two agents in one
    # program (CartPole, each stage vmapped): 2 iterations each, the envs made afresh after the first.
    for name, env_id, extra, rollout_conv in (
        ("cartpole-2-seeds", "CartPole-v1", {"num_seeds": 2}, None),
        ("breakout-rollout-on-another-route", "Breakout-v5", {"conv_impl": "kernel"}, "matmul"),
    ):
        config = ppo_eqx.PPOConfig.for_task(
            env_id, num_envs=4, num_steps=16, num_minibatches=2, update_epochs=1, total_timesteps=4 * 16 * 2,
            checkpoint_every=1, **extra,
        )
        one, one_arrays = train(config, None)
        # The rollout on the second device, the learning on the first: the batch and the parameters cross over.
        split, split_arrays = train(config, SplitPlacement(other, cpu, rollout_conv=rollout_conv))
        diff = max(float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))) if a.size else 0.0
                   for a, b in zip(one_arrays, split_arrays, strict=True) if a.dtype.kind == "f")
        same_ints = all(np.array_equal(a, b) for a, b in zip(one_arrays, split_arrays) if a.dtype.kind != "f")
        losses = [[agent["loss"] for agent in row] for row in one], [[agent["loss"] for agent in row] for row in split]
        steps = config.num_iterations * config.num_minibatches * config.update_epochs
        results[name] = {"diff": diff, "same_ints": same_ints, "losses": losses, "steps": steps,
                         "learning_rate": config.learning_rate, "devices": [str(d) for d in jax.devices()]}
    print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def compared() -> dict:
    code, out, err = run_child(["-c", textwrap.dedent(COMPARE)], env=worker_env() | TWO_DEVICES, cwd=ROOT)
    assert code == 0, "\n".join(out + err)[-4000:]
    return json.loads(out[-1])


@pytest.mark.parametrize("name", ["cartpole-2-seeds", "breakout-rollout-on-another-route"])
def test_the_split_run_computes_what_one_program_computes(compared: dict, name: str) -> None:
    result = compared[name]
    assert len(result["devices"]) == 2, result["devices"]
    # Each Adam step moves a parameter by at most about 3.2 x the learning rate ((1 - beta1) / sqrt(1 - beta2)
    # with optax's defaults), whatever its gradient: two runs whose gradients differ by float32 rounding alone
    # are at most twice that apart per step. Far below it is what rounding gives; a wrong batch is far above.
    bound = 2 * 3.2 * result["learning_rate"] * result["steps"]
    assert result["diff"] <= bound / 10, result
    assert result["same_ints"], result  # the keys, the iteration, Adam's step count
    one, split = result["losses"]
    pairs = [(a, b) for row_a, row_b in zip(one, split, strict=True) for a, b in zip(row_a, row_b, strict=True)]
    assert all(abs(a - b) <= 1e-3 * max(1.0, abs(a)) for a, b in pairs), result


def test_a_host_rollout_resumes_bit_exact_and_says_where_it_ran(cli_run: Path, tmp_path: Path) -> None:
    finished = tmp_path / "finished"
    code, out, err = run_child(ppo_eqx(*tiny(finished, 4), "--rollout-on", "host"))
    assert code == 0, out + err
    first = next(line for line in out if "run directory" in line)
    assert "rollout: host (cpu:0" in first, first
    hardware = json.loads((finished / "hardware.json").read_text())
    assert hardware["rollout"]["on"] == "host" and hardware["rollout"]["learn_device"] == "cpu:0", hardware
    resumes_in_a_process_as_it_ran(finished, tmp_path / "resumed", at=2)


def test_env_threads_change_nothing_the_run_computes(tmp_path: Path) -> None:
    """EnvPool's threads (one, pinned to core 0; the default) step the same envs: the same rows."""
    rows = []
    for name, extra in (("default", ()), ("one-pinned", ("--num-threads", "1", "--thread-affinity-offset", "0"))):
        run = tmp_path / name
        code, out, err = run_child(ppo_eqx(*tiny(run, 2), *extra))
        assert code == 0, out + err
        rows.append(metrics(run))
    assert rows[0] == rows[1] and len(rows[0]) == 2 and rows[0][0]["global_step"] == BATCH


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        pytest.param(("--env-backend", "gymnax"), ("rollout_on", "gymnax"), id="gymnax-envs-run-in-the-program"),
        pytest.param(("--devices", "2"), ("rollout_on", "mesh"), id="a-mesh"),
    ],
)
def test_a_host_rollout_where_it_cannot_run_is_one_line(tmp_path: Path, extra: tuple[str, ...], words) -> None:
    if "gymnax" in extra and not _has_gymnax():
        pytest.skip("gymnax is not installed")
    code, out, err = run_child(
        ppo_eqx(*tiny(tmp_path / "run", 1), "--rollout-on", "host", *extra), env=worker_env() | TWO_DEVICES
    )
    assert code == 2 and len(err) == 1 and err[0].startswith("ppo-eqx: error: "), out + err
    assert all(word in err[0] for word in words), err
    assert not (tmp_path / "run").exists()


def _has_gymnax() -> bool:
    import importlib.util

    return importlib.util.find_spec("gymnax") is not None
