"""--sweep: agents with different hyperparameters in one program, each equal to its single run (to float32
rounding), on one pool; the settings' grid, its run directories, checkpoints, resume and eval."""

import itertools
import json
import math

import equinox as eqx
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given

from ppo_eqx import AgentHyperparameters, ConfigError, PPOConfig
from ppo_eqx.cli import main
from ppo_eqx.config import FIELD_TYPES
from ppo_eqx.core.envs import env_spec
from ppo_eqx.core.update import learning_rate_schedule, ppo_loss
from ppo_eqx.host.checkpoint import list_checkpoints, load_checkpoint, read_checkpoint
from ppo_eqx.host.evaluate import EVAL_STREAM, evaluate
from ppo_eqx.host.loop import run, run_agents
from ppo_eqx.host.trainer import Trainer, pool_env_seeds
from ppo_eqx.sweeps import SWEEPABLE
from ppo_eqx_bench.runs import find_run_dirs

from .comparisons import ATOL, RTOL, VOLATILE, final_checkpoint_bytes, metrics, param_atol, resume_a_copy
from .run_files import listing

pytestmark = pytest.mark.unit

QUIET = ["--no-progress", "--no-tensorboard"]
BOOLS = {name for name in SWEEPABLE if FIELD_TYPES[name] is bool}


# --- the grid ---------------------------------------------------------------------------------------------------

VALUES = {
    "learning_rate": [1e-3, 2.5e-4, 3e-5],
    "gamma": [0.9, 0.99, 1.0],
    "gae_lambda": [0.0, 0.95, 1.0],
    "clip_coef": [0.1, 0.2, 0.0],
    "ent_coef": [0.0, 0.01, 0.02],
    "vf_coef": [0.5, 1.0, 0.25],
    "max_grad_norm": [0.5, 10.0, 0.1],
}


def values_of(name: str) -> list[float]:
    """Values to sweep ``name`` over: ``VALUES``'s, or for a field they do not name its default and another."""
    default = getattr(PPOConfig(), name)
    return VALUES.get(name, [default, default / 2 if default else 1.0])


@st.composite
def sweeps(draw):
    names = draw(st.lists(st.sampled_from(SWEEPABLE), min_size=1, max_size=3, unique=True))
    sweep = {}
    for name in names:
        pool = [True, False] if name in BOOLS else values_of(name)
        sweep[name] = draw(st.lists(st.sampled_from(pool), min_size=1, max_size=len(pool), unique=True))
    if math.prod(len(values) for values in sweep.values()) == 1:
        sweep[names[0]] = [True, False] if names[0] in BOOLS else values_of(names[0])[:2]
    return sweep


@given(sweeps(), st.integers(1, 3), st.integers(0, 100))
def test_the_agents_are_the_grid_of_settings_times_the_seeds(sweep, num_seeds, seed):
    config = PPOConfig(sweep=sweep, num_seeds=num_seeds, seed=seed).validate()
    # The reference: nested loops over the values, the last name fastest, the seeds innermost.
    expected = []

    def walk(names, setting):
        if not names:
            expected.extend((dict(setting), seed + s) for s in range(num_seeds))
            return
        for value in sweep[names[0]]:
            walk(names[1:], {**setting, names[0]: value})

    walk(list(sweep), {})
    agents = config.agent_configs()
    assert config.num_agents == len(agents) == len(expected)
    for agent, (setting, agent_seed) in zip(agents, expected, strict=True):
        assert agent.seed == agent_seed and agent.num_seeds == 1 and agent.sweep == ()
        assert {name: getattr(agent, name) for name in sweep} == setting
        others = {name for name in PPOConfig.__dataclass_fields__} - set(sweep) - {"seed", "num_seeds", "sweep"}
        assert all(getattr(agent, name) == getattr(config, name) for name in others)
    names = config.agent_names()
    assert len(set(names)) == len(names)
    assert all(name.endswith(f"/seed{a.seed}") for name, a in zip(names, agents, strict=True))
    # Agent k plays the envs of its single run.
    assert pool_env_seeds(config, 0) == [s for a in agents for s in pool_env_seeds(a, 0)]
    # The config survives JSON, the way the run directory and checkpoints keep it.
    assert PPOConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config


def test_a_setting_is_named_by_its_flags():
    config = PPOConfig(sweep={"learning_rate": [0.001, 3e-5], "norm_adv": [False, True]}, seed=4).validate()
    assert config.agent_names() == [
        "learning-rate=0.001,norm-adv=false/seed4",
        "learning-rate=0.001,norm-adv=true/seed4",
        "learning-rate=3e-05,norm-adv=false/seed4",
        "learning-rate=3e-05,norm-adv=true/seed4",
    ]
    assert PPOConfig(num_seeds=2).agent_names() == ["seed1", "seed2"]


@pytest.mark.parametrize(
    ("sweep", "message"),
    [
        ({"num_envs": [4, 8]}, "sweep of num_envs: one program cannot sweep it .*separate run per value"),
        ({"seed": [1, 2]}, "seed is swept by --num-seeds"),
        ({"env_id": ["Pong-v5", "Breakout-v5"]}, "makes another pool and model"),
        ({"bogus": [1, 2]}, "'bogus': not a hyperparameter; allowed: learning_rate"),
        ({"learning_rate": []}, "no values"),
        ({"learning_rate": [0.1, 0.1]}, "0.1 given twice; allowed: distinct values"),
        ({"learning_rate": [0.1, -1.0]}, r"learning_rate=-1.0 must be > 0"),
        ({"gamma": [0.9, 1.5]}, r"gamma=1.5 must be in \[0, 1\]"),
        ({"learning_rate": [0.1, float("nan")]}, "is not finite"),
        ({"norm_adv": [True, 1]}, "norm_adv=1 is a int, not a bool"),
        ({"ent_coef": [0.1, "0.2"]}, "is a str, not a number"),
        ({"learning_rate": [0.1]}, r"sweep of one setting \(learning_rate=0.1\) is no sweep"),
        ((("gamma", (0.9, 0.8)), ("gamma", (0.7, 0.6))), "sweep of gamma: given twice"),
        ("gamma=0.9", "is not a sweep"),
        ({"gamma": 0.9}, "is not a sweep"),
    ],
)
def test_bad_sweeps_are_refused_with_one_line(sweep, message):
    with pytest.raises(ConfigError, match=message) as error:
        PPOConfig(sweep=sweep).validate()
    assert "\n" not in str(error.value)


def test_a_sweep_counts_its_agents_in_the_limits():
    with pytest.raises(ConfigError, match=r"settings\*num_seeds\*num_envs\*num_steps=\d+ transitions"):
        PPOConfig(num_envs=2**20, num_steps=2**10, sweep={"gamma": [0.9, 0.99]}).validate()
    with pytest.raises(ConfigError, match="works with one agent only, not a sweep of 2 settings"):
        PPOConfig(num_envs=8, async_batch_size=4, sweep={"gamma": [0.9, 0.99]}).validate()


# --- swept hyperparameters are array leaves that a vmap maps ------------------------------------------------------


@given(st.integers(0, 2**31 - 1))
def test_the_loss_vmapped_over_agents_is_each_agents_own_loss(seed):
    rng = np.random.default_rng(seed)
    new_logprob, new_value, entropy, old_logprob, old_value, advantages, returns = (
        jnp.asarray(rng.normal(size=16), jnp.float32) for _ in range(7)
    )
    arrays = (new_logprob, new_value, jnp.abs(entropy), old_logprob, old_value, advantages, returns)
    config = PPOConfig(sweep={"norm_adv": [False, True], "clip_vloss": [False, True], "clip_coef": [0.1, 0.3]})
    agents = config.agent_configs()
    stacked = AgentHyperparameters.of(agents)
    assert stacked.axes().gamma is None and stacked.axes().clip_coef == 0  # shared: unmapped; swept: [A]
    got = jax.vmap(lambda h: ppo_loss(*arrays, hyperparameters=h), in_axes=(stacked.axes(),))(stacked)
    for k, agent in enumerate(agents):
        want = ppo_loss(*arrays, hyperparameters=AgentHyperparameters.of([agent]))
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
            np.testing.assert_array_equal(a[k], b)


def test_the_schedule_vmapped_over_agents_is_each_agents_own():
    config = PPOConfig(total_timesteps=10_240, sweep={"learning_rate": [3e-4, 1e-3], "anneal_lr": [True, False]})
    stacked = AgentHyperparameters.of(config.agent_configs())
    for count in (0, 15, 16, 100, 159):
        got = jax.vmap(lambda h: learning_rate_schedule(h, config.sizes)(count), in_axes=(stacked.axes(),))(stacked)
        for k, agent in enumerate(config.agent_configs()):
            want = learning_rate_schedule(AgentHyperparameters.of([agent]), config.sizes)(count)
            np.testing.assert_array_equal(np.asarray(got)[k], want)


# --- agent k is its single run ----------------------------------------------------------------------------------

# Every sweepable field, through the per-agent arrays: four settings, each flag's two values among them (the
# array flags' other branch is checked exactly above).
EVERY_FIELD = {
    "learning_rate": [1e-3, 3e-4],
    "anneal_lr": [False],
    "gamma": [0.95],
    "gae_lambda": [0.9],
    "clip_coef": [0.2],
    "ent_coef": [0.02],
    "vf_coef": [0.7],
    "max_grad_norm": [0.3],
    "norm_adv": [False, True],
    "clip_vloss": [True],
}


def records_and_params(config: PPOConfig, iterations: int):
    with Trainer(config) as trainer:
        if config.num_agents == 1:
            records = [[record] for record in run(trainer, num_iterations=iterations)]
        else:
            records = list(run_agents(trainer, num_iterations=iterations))
        return records, eqx.filter(trainer.checkpoint().model, eqx.is_array)


def assert_agents_equal_single_runs(config: PPOConfig, iterations: int, agents: list[int]) -> None:
    records, stacked = records_and_params(config, iterations)
    for k in agents:
        single_records, single = records_and_params(config.agent_configs()[k], iterations)
        for row, (want,) in zip(records, single_records, strict=True):
            got = row[k]
            for name, value in want.items():
                if name not in VOLATILE:
                    np.testing.assert_allclose(got[name], value, rtol=RTOL, atol=ATOL, err_msg=f"agent {k} {name}")
        for got, want in zip(jax.tree.leaves(stacked), jax.tree.leaves(single), strict=True):
            np.testing.assert_allclose(got[k], want, rtol=0, atol=param_atol(config, iterations))
    # Not trivially close: the agents differ from each other.
    last = records[-1]
    assert any(last[0][name] != last[-1][name] for name in ("loss", "learning_rate", "value_loss"))


@pytest.mark.envpool
def test_each_agent_of_a_cartpole_sweep_computes_its_single_run():
    config = PPOConfig(
        env_id="CartPole-v1", total_timesteps=4 * 512, num_envs=4, num_steps=128, clip_coef=0.2, sweep=EVERY_FIELD
    )
    assert_agents_equal_single_runs(config, iterations=3, agents=[0, 3])


@pytest.mark.envpool
def test_each_agent_of_a_breakout_sweep_computes_its_single_run():
    config = PPOConfig(
        total_timesteps=3 * 64,
        num_envs=2,
        num_steps=32,
        num_minibatches=2,
        update_epochs=1,
        sweep={"learning_rate": [1e-3, 2.5e-4], "ent_coef": [0.02], "clip_vloss": [True]},
    )
    assert_agents_equal_single_runs(config, iterations=2, agents=[0, 1])


# --- the command line: run directories, resume, eval -------------------------------------------------------------


@pytest.mark.subprocess
def test_a_sweep_writes_one_run_per_agent_resumes_exactly_and_evaluates_one_agent(tmp_path, capsys):
    flags = ["train", "--env-id", "CartPole-v1", "--total-timesteps", "1536", "--checkpoint-every", "1", *QUIET]
    sweep = ["--sweep", "learning-rate=0.001,0.0003", "--sweep", "norm-adv=false,true"]
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    assert main([*flags, *sweep, "--num-seeds", "2", "--run-dir", str(whole)]) == 0
    assert "x 4 settings x 2 seeds" in capsys.readouterr().out

    config = PPOConfig.from_dict(json.loads((whole / "seeds.json").read_text()))
    assert config.sweep == (("learning_rate", (0.001, 0.0003)), ("norm_adv", (False, True)))
    settings = [f"learning-rate={lr},norm-adv={na}" for lr in ("0.001", "0.0003") for na in ("false", "true")]
    assert listing(whole) == sorted(["checkpoints", "seeds.json", *settings])
    agent_dirs = [whole / setting / f"seed{seed}" for setting in settings for seed in (1, 2)]
    assert find_run_dirs(whole) == sorted(agent_dirs)
    for agent_dir, agent in zip(agent_dirs, config.agent_configs(), strict=True):
        saved = json.loads((agent_dir / "config.json").read_text())
        assert PPOConfig.from_dict(saved) == agent
        assert (saved["num_seeds"], saved["sweep"]) == (1, {})
        assert [row["iteration"] for row in metrics(agent_dir)] == [1, 2, 3]

    # The sweep stopped after its second checkpoint goes on exactly as the whole one.
    resume_a_copy(whole, resumed, capsys)
    for agent_dir in agent_dirs:
        relative = agent_dir.relative_to(whole)
        assert metrics(resumed / relative) == metrics(agent_dir)
    assert final_checkpoint_bytes(resumed) == final_checkpoint_bytes(whole)

    # eval takes one agent's directory: its model out of the stacked checkpoint, its config.
    assert main(["eval", str(whole), "--episodes", "1"]) == 2
    assert "eval takes one agent's directory" in capsys.readouterr().err
    agent = agent_dirs[5]
    assert main(["eval", str(agent), "--episodes", "2", "--greedy"]) == 0
    result = json.loads((agent / "eval.json").read_text())
    assert result["agent"] == "learning-rate=0.0003,norm-adv=false/seed2" and len(result["returns"]) == 2
    # The returns are those of that agent's own model and config.
    path = list_checkpoints(whole)[-1]
    stacked = load_checkpoint(read_checkpoint(path), config, env_spec("CartPole-v1")).model
    one = jax.tree.map(lambda x: x[5] if eqx.is_array(x) else x, stacked)
    key = jax.random.fold_in(jax.random.PRNGKey(1), EVAL_STREAM)
    want = evaluate(one, config.agent_configs()[5], episodes=2, greedy=True, seed=1, key=key)
    assert result["returns"] == want.returns


@pytest.mark.subprocess
def test_overwrite_of_a_sweep_clears_its_agents(tmp_path, capsys):
    run_dir = tmp_path / "run"
    flags = ["train", "--env-id", "CartPole-v1", "--total-timesteps", "512", *QUIET, "--run-dir", str(run_dir)]
    assert main([*flags, "--sweep", "gamma=0.9,0.99"]) == 0
    assert set(listing(run_dir)) == {"checkpoints", "seeds.json", "gamma=0.9", "gamma=0.99"}
    (run_dir / "notes.txt").write_text("mine")
    assert main([*flags, "--overwrite"]) == 0
    assert set(listing(run_dir)) == {"checkpoints", "config.json", "hardware.json", "metrics.jsonl",
                                                  "summary.json", "notes.txt"}  # fmt: skip
    assert not list(itertools.chain(run_dir.glob("gamma=*"), run_dir.glob("seed*")))
