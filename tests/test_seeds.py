"""--num-seeds S: S agents in one program equal S single-seed runs (to float32 summation order)."""

import json

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ppo_eqx import ConfigError, PPOConfig
from ppo_eqx.cli import main
from ppo_eqx.core.envs import agents_env_step, env_spec, segment_env_seeds
from ppo_eqx.host.checkpoint import list_checkpoints, load_checkpoint, read_checkpoint
from ppo_eqx.host.trainer import pool_env_seeds
from ppo_eqx_bench.runs import find_run_dirs, load_run

from .comparisons import ATOL, RTOL, final_checkpoint_bytes, metrics, param_atol, resume_a_copy
from .fake_env import counting_env
from .run_files import listing

pytestmark = pytest.mark.unit

QUIET = ["--no-progress", "--no-tensorboard"]


def assert_close_rows(seeds_rows: list[dict], single_rows: list[dict]) -> None:
    assert [row["iteration"] for row in seeds_rows] == [row["iteration"] for row in single_rows]
    for got, want in zip(seeds_rows, single_rows, strict=True):
        assert got.keys() == want.keys()
        for name, value in want.items():
            if value is None or isinstance(value, int):
                assert got[name] == value, name
            else:
                np.testing.assert_allclose(got[name], value, rtol=RTOL, atol=ATOL, err_msg=name)


def final_params(run_dir, config: PPOConfig):
    path = list_checkpoints(run_dir)[-1]
    checkpoint = load_checkpoint(read_checkpoint(path), config, env_spec(config.env_id))
    return eqx.filter(checkpoint.model, eqx.is_array), checkpoint


def test_num_seeds_must_be_positive():
    with pytest.raises(ConfigError, match="num_seeds=0 must be a positive integer"):
        PPOConfig(num_seeds=0).validate()
    assert [c.seed for c in PPOConfig(seed=5, num_seeds=3).agent_configs()] == [5, 6, 7]
    assert {c.num_seeds for c in PPOConfig(seed=5, num_seeds=3).agent_configs()} == {1}


@pytest.mark.parametrize("iteration", [0, 50, 100])
def test_agent_s_gets_the_envs_of_the_single_seed_run(iteration):
    config = PPOConfig(seed=7, num_envs=3, num_seeds=2)
    seeds = pool_env_seeds(config, iteration)
    for s, agent in enumerate(config.agent_configs()):
        assert seeds[3 * s : 3 * s + 3] == segment_env_seeds(agent.seed, iteration, 3)
        if iteration == 0:  # as EnvPool seeds env i of a pool made with seed K (CleanRL's): K + i
            assert seeds[3 * s : 3 * s + 3] == [agent.seed + i for i in range(3)]


def test_the_seeds_env_step_steps_one_pool_for_all_agents():
    num_seeds, num_envs, num_steps = 3, 2, 7
    handle, _, env_step = counting_env(num_seeds * num_envs)  # a pure fake pool: no EnvPool
    step = agents_env_step(env_step, num_seeds)
    actions = jax.random.randint(jax.random.PRNGKey(0), (num_steps, num_seeds, num_envs), 0, 3, jnp.int32)

    def agents(handle, actions):
        return jax.lax.scan(lambda h, a: jax.vmap(step, in_axes=(None, 0), out_axes=(None, 0))(h, a), handle, actions)

    def pool(handle, actions):
        return jax.lax.scan(lambda h, a: env_step(h, a.reshape(-1)), handle, actions)

    (agents_handle, agents_out), (pool_handle, pool_out) = jax.jit(agents)(handle, actions), pool(handle, actions)
    np.testing.assert_array_equal(agents_handle, pool_handle)
    for got, want in zip(agents_out, pool_out, strict=True):
        assert got.shape == (num_steps, num_seeds, num_envs) + want.shape[2:]
        np.testing.assert_array_equal(got, want.reshape(got.shape))


@pytest.mark.subprocess
def test_two_seeds_in_one_process_equal_two_single_seed_runs_on_cartpole(tmp_path, capsys):
    flags = ["train", "--env-id", "CartPole-v1", "--total-timesteps", "1024", "--checkpoint-every", "1", *QUIET]
    seeds_dir = tmp_path / "seeds"
    assert main([*flags, "--seed", "3", "--num-seeds", "2", "--run-dir", str(seeds_dir)]) == 0
    assert "x 2 seeds" in capsys.readouterr().out
    for seed in (3, 4):
        assert main([*flags, "--seed", str(seed), "--run-dir", str(tmp_path / f"single{seed}")]) == 0

    # The run directory holds the stacked checkpoints and the config; each agent's directory is a run.
    assert listing(seeds_dir) == ["checkpoints", "seed3", "seed4", "seeds.json"]
    assert json.loads((seeds_dir / "seeds.json").read_text())["num_seeds"] == 2
    assert find_run_dirs(seeds_dir) == [seeds_dir / "seed3", seeds_dir / "seed4"]
    seeds_config = PPOConfig.from_dict(json.loads((seeds_dir / "seeds.json").read_text()))
    stacked, checkpoint = final_params(seeds_dir, seeds_config)
    assert int(checkpoint.iteration) == 2 and checkpoint.key.shape[0] == 2
    for s, seed in enumerate((3, 4)):
        agent_dir, single_dir = seeds_dir / f"seed{seed}", tmp_path / f"single{seed}"
        assert listing(agent_dir) == [
            "config.json",
            "hardware.json",
            "metrics.jsonl",
            "summary.json",
        ]
        config = json.loads((agent_dir / "config.json").read_text())
        assert config == json.loads((single_dir / "config.json").read_text())
        assert (config["seed"], config["num_seeds"]) == (seed, 1)
        run = load_run(agent_dir)
        assert (run.env_id, run.seed) == ("CartPole-v1", seed)
        assert_close_rows(metrics(agent_dir), metrics(single_dir))
        single, single_checkpoint = final_params(single_dir, PPOConfig.from_dict(config))
        np.testing.assert_array_equal(checkpoint.key[s], single_checkpoint.key)
        for got, want in zip(jax.tree.leaves(stacked), jax.tree.leaves(single), strict=True):
            atol = param_atol(PPOConfig.from_dict(config), int(checkpoint.iteration))
            np.testing.assert_allclose(got[s], want, rtol=0, atol=atol)
    # Not trivially close: the two agents differ from each other.
    assert metrics(seeds_dir / "seed3") != metrics(seeds_dir / "seed4")


@pytest.mark.subprocess
def test_a_two_seed_run_resumes_from_its_stacked_checkpoint(tmp_path, capsys):
    flags = ["train", "--env-id", "CartPole-v1", "--total-timesteps", "1536", "--checkpoint-every", "1"]
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    assert main([*flags, *QUIET, "--num-seeds", "2", "--run-dir", str(whole)]) == 0
    # The same run, stopped after its second checkpoint: drop what came later.
    resume_a_copy(whole, resumed, capsys)
    for seed in (1, 2):
        assert [row["iteration"] for row in metrics(resumed / f"seed{seed}")] == [1, 2, 3]
        assert metrics(resumed / f"seed{seed}") == metrics(whole / f"seed{seed}")
    assert final_checkpoint_bytes(resumed) == final_checkpoint_bytes(whole)

    assert main(["eval", str(whole)]) == 2
    assert "holds the 2 agents of a --num-seeds or --sweep run" in capsys.readouterr().err
    assert main(["eval", str(whole / "seed2"), "--episodes", "1"]) == 0
    assert json.loads((whole / "seed2" / "eval.json").read_text())["agent"] == "seed2"
