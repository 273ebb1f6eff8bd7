"""Collectors on pure fake envs: a time limit bootstrapped from its final observation (``bootstrap_truncated``),
and many iterations in one program (``over_iterations``), read back by the host loop one record per iteration."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ppo_eqx import ActorCritic, EnvOutput, Pool, PPOConfig, init_state, make_iteration, sync_collector
from ppo_eqx.core.iteration import over_iterations
from ppo_eqx.core.rollout import init_episode_stats
from ppo_eqx.host.loop import run_agents
from ppo_eqx.host.trainer import Dispatch, Trainer

from .comparisons import leaves_equal
from .fake_env import SPEC, counting_pool
from .test_gae import reference_gae_truncated

pytestmark = pytest.mark.unit


def time_limit_pool(num_envs: int) -> Pool:
    """Env n's episodes last n + 2 steps and pay action + 1 a step; those of an even env end in a terminal state,
    those of an odd env at a time limit. Each env resets inside the step that ends its episode, as gymnax does:
    ``obs`` is then the next episode's first (counter 0) and ``final_obs`` the one the episode ended on."""
    length = jnp.arange(num_envs) + 2
    by_time_limit = jnp.arange(num_envs) % 2 == 1

    def observe(counter):
        return jnp.stack([counter, jnp.arange(num_envs), 0 * counter, 0 * counter], axis=1).astype(jnp.float32)

    def step(counter, actions):
        counter = counter + 1
        done = counter == length
        final_obs = observe(counter)
        counter = jnp.where(done, 0, counter)
        reward = (actions + 1).astype(jnp.float32)
        return counter, EnvOutput(observe(counter), reward, done, reward, done, done & by_time_limit, final_obs)

    first = jnp.zeros(num_envs, jnp.int32)
    return Pool(SPEC, first, step, np.asarray(observe(first)), lambda: None, lambda i: np.zeros((1, 1, 3), np.uint8))


@pytest.mark.parametrize("bootstrap_truncated", [True, False])
def test_a_time_limit_is_bootstrapped_from_the_value_of_the_final_observation(bootstrap_truncated):
    num_envs, num_steps, gamma, gae_lambda = 4, 13, 0.9, 0.8
    collector = sync_collector(time_limit_pool(num_envs), num_steps=num_steps, bootstrap_truncated=bootstrap_truncated)
    model = ActorCritic((4,), 3, key=jax.random.PRNGKey(0))
    carry = collector.carry(init_episode_stats(num_envs))
    collect = jax.jit(lambda m, c, k: collector.collect(m, c, k, gamma=gamma, gae_lambda=gae_lambda))
    end, batch = collect(model, carry, jax.random.PRNGKey(1))

    # The reference, from the observations alone: which steps ended an episode, how, and on which observation.
    counter = np.asarray(batch.obs[:, :, 0]).astype(int)
    lengths = np.arange(num_envs) + 2
    ended = counter + 1 == lengths
    time_limit = ended & (np.arange(num_envs) % 2 == 1)
    final_obs = np.stack([lengths, np.arange(num_envs), 0 * lengths, 0 * lengths], axis=1).astype(np.float32)
    final_values = np.broadcast_to(np.asarray(model(jnp.asarray(final_obs))[1]), counter.shape)
    values = np.asarray(model(batch.obs.reshape(-1, 4))[1]).reshape(num_steps, num_envs)
    rewards = np.asarray(batch.actions) + 1.0
    last_value = np.asarray(model(end.obs)[1])
    if not bootstrap_truncated:  # CleanRL's: a time limit is terminal
        time_limit, terminated = np.zeros_like(ended), ended
    else:
        terminated = ended & ~time_limit
    expected, _ = reference_gae_truncated(
        rewards, values, final_values, terminated, time_limit, last_value, gamma=gamma, gae_lambda=gae_lambda
    )
    assert time_limit.any() == bootstrap_truncated and terminated.any()
    np.testing.assert_allclose(batch.advantages, expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(batch.returns, expected + values, rtol=1e-5, atol=1e-5)
    # The reported return stays the game's: action + 1 summed over each finished episode.
    assert np.all(np.asarray(end.stats.returned_episode_returns) >= np.asarray(end.stats.returned_episode_lengths))


@pytest.mark.compile
def test_a_chunk_of_iterations_is_the_iterations_one_after_another():
    config = PPOConfig(env_id="fake", total_timesteps=8 * 32, num_envs=2, num_steps=16, num_minibatches=2)
    collector = sync_collector(counting_pool(config.num_envs), num_steps=16)
    state = init_state(config, SPEC, collector, conv_impl="matmul")
    iteration = eqx.filter_jit(make_iteration(collector, config.sizes))
    chunk = eqx.filter_jit(
        eqx.debug.assert_max_traces(over_iterations(make_iteration(collector, config.sizes), 4), max_traces=1)
    )

    alone, rows = state, []
    for _ in range(3):
        alone, metrics = iteration(alone)
        rows.append(metrics)
    three, stacked = chunk(state, jnp.int32(3))
    assert leaves_equal(three, alone) and int(three.iteration) == 3
    for name in rows[0]:
        assert stacked[name].shape == (4,)
        np.testing.assert_array_equal(stacked[name][:3], [row[name] for row in rows])
        assert not np.asarray(stacked[name][3]).any()  # a row the chunk did not run
    one, _ = chunk(three, jnp.int32(1))  # another count: the same program, no retrace
    assert leaves_equal(one, iteration(alone)[0])


class _ChunkedTrainer(Trainer):
    """Programs of up to ``length`` iterations that take no time, with given losses; no envs, no model."""

    def __init__(self, length: int, iterations: int, every: int):  # not super().__init__(): that would make envs
        self.config = PPOConfig(
            env_id="CartPole-v1", num_envs=4, num_steps=128, total_timesteps=512 * iterations, checkpoint_every=every
        )
        self.iteration, self.length = 0, length

    def dispatch(self, until=None, most=None):
        until = self.config.num_iterations if until is None else until
        every = self.config.checkpoint_every
        count = min(self.length, (self.iteration // every + 1) * every - self.iteration, until - self.iteration)
        losses = jnp.zeros(self.length).at[:count].set(self.iteration + 1 + jnp.arange(count))
        self.iteration += count
        metrics = {"loss": losses, "finite": jnp.ones(self.length, bool)}
        return Dispatch(self.iteration, count, metrics, True)


def test_the_loop_yields_each_iteration_of_a_chunk_and_pauses_only_between_chunks():
    trainer = _ChunkedTrainer(length=4, iterations=10, every=6)
    asked = []
    records = [r[0] for r in run_agents(trainer, pause=lambda i: asked.append(i) or False)]
    assert [r["iteration"] for r in records] == list(range(1, 11))
    assert [r["loss"] for r in records] == [float(i) for i in range(1, 11)]  # each row its own iteration's
    assert [r["global_step"] for r in records] == [512 * i for i in range(1, 11)]
    # Chunks of 4 that stop at the checkpoint after 6: 1-4, 5-6, 7-10; asked before the next is dispatched.
    assert asked == [4, 6]
    times = [r["time_elapsed"] for r in records]
    assert times[:4] == [times[0]] * 4 and times[4] == times[5]  # a chunk's iterations end together
