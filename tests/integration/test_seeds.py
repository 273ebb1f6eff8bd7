"""Two Breakout agents in one program equal two single-seed runs, to float32 summation order."""

import equinox as eqx
import jax
import numpy as np
import pytest

from ppo_eqx import PPOConfig, Trainer, run, run_agents

from ..comparisons import ATOL, RTOL, param_atol

pytestmark = pytest.mark.envpool

BREAKOUT = PPOConfig(env_id="Breakout-v5", total_timesteps=2 * 128, num_envs=4, num_steps=32, num_minibatches=2, seed=3)


def train(config: PPOConfig) -> tuple[list, Trainer]:
    trainer = Trainer(config)
    try:
        records = list(run_agents(trainer)) if config.num_seeds > 1 else list(run(trainer))
    finally:
        trainer.close()
    return records, trainer


@pytest.mark.slow
def test_two_breakout_seeds_in_one_program_equal_two_single_seed_runs():
    seeds_config = BREAKOUT.replace(num_seeds=2)
    seeds_records, seeds_trainer = train(seeds_config)
    for s, agent in enumerate(seeds_config.agent_configs()):
        single_records, single_trainer = train(agent)
        for got, want in zip([r[s] for r in seeds_records], single_records, strict=True):
            for name, value in want.items():
                if name not in ("sps", "time_elapsed"):
                    np.testing.assert_allclose(got[name], value, rtol=RTOL, atol=ATOL, err_msg=name)
        np.testing.assert_array_equal(seeds_trainer.state.key[s], single_trainer.state.key)
        stacked = eqx.filter(seeds_trainer.state.model, eqx.is_array)
        single = eqx.filter(single_trainer.state.model, eqx.is_array)
        for got, want in zip(jax.tree.leaves(stacked), jax.tree.leaves(single), strict=True):
            np.testing.assert_allclose(got[s], want, rtol=0, atol=param_atol(agent, agent.num_iterations))
