import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ppo_eqx import ActorCritic, make_async_pool
from ppo_eqx.core.networks import MLP
from ppo_eqx.core.rollout import (
    RolloutCarry,
    async_rollout,
    init_async_carry,
    init_episode_stats,
    prime_async,
    rollout,
    sample_actions,
)

from .fake_env import counting_async_env, counting_env

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(("num_envs", "num_steps", "lives"), [(3, 17, 1), (2, 24, 3)])
def test_rollout_against_a_fake_env(num_envs, num_steps, lives):
    handle, obs, env_step = counting_env(num_envs, lives)
    model = ActorCritic((4,), 3, key=jax.random.PRNGKey(0))
    carry = RolloutCarry(handle, obs, init_episode_stats(num_envs))
    run = jax.jit(lambda c, k: rollout(model, env_step, c, num_steps=num_steps, key=k))
    carry, transitions, last_value = run(carry, jax.random.PRNGKey(1))

    assert transitions.obs.shape == (num_steps, num_envs, 4)
    assert transitions.actions.dtype == jnp.int32 and transitions.dones.dtype == jnp.bool_
    counters = np.asarray(transitions.obs[:, :, 0])
    np.testing.assert_array_equal(counters, np.arange(num_steps)[:, None] * np.ones(num_envs))
    actions = np.asarray(transitions.actions)
    np.testing.assert_array_equal(transitions.rewards, 1.0)  # the clipped reward is what is learned from
    lengths = np.arange(num_envs) + 2
    np.testing.assert_array_equal(transitions.dones, (np.arange(1, num_steps + 1)[:, None] % lengths) == 0)

    # The stored log-probabilities and values are the model's at the stored observations.
    logprob, _, value = model.evaluate_actions(transitions.obs.reshape(-1, 4), transitions.actions.reshape(-1))
    np.testing.assert_allclose(transitions.logprobs.reshape(-1), logprob, rtol=1e-5)
    np.testing.assert_allclose(transitions.values.reshape(-1), value, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(last_value, model(carry.obs)[1], rtol=1e-5)

    # Episode statistics: raw rewards summed over a whole game (all lives), from a plain loop.
    for n in range(num_envs):
        game = lengths[n] * lives
        finished = num_steps // game
        returned = carry.stats.returned_episode_returns[n]
        if finished == 0:
            assert np.isnan(returned)
            continue
        last_game = slice((finished - 1) * game, finished * game)
        assert float(returned) == float(np.sum(actions[last_game, n] + 1))
        assert float(carry.stats.returned_episode_lengths[n]) == game
        running = slice(finished * game, num_steps)
        assert float(carry.stats.episode_returns[n]) == float(np.sum(actions[running, n] + 1))
        assert int(carry.stats.episode_lengths[n]) == num_steps - finished * game


def test_actions_follow_the_policy():
    """With a strongly peaked policy almost every sampled action is its mode."""
    handle, obs, env_step = counting_env(4)
    model = ActorCritic((4,), 3, key=jax.random.PRNGKey(0))
    assert isinstance(model.actor, MLP)
    bias = model.actor.layers[-1].bias
    model = eqx.tree_at(lambda m: m.actor.layers[-1].bias, model, bias.at[2].set(50.0))
    _, transitions, _ = rollout(
        model, env_step, RolloutCarry(handle, obs, init_episode_stats(4)), num_steps=8, key=jax.random.PRNGKey(0)
    )
    np.testing.assert_array_equal(transitions.actions, 2)


@settings(deadline=None, max_examples=20)
@given(seed=st.integers(0, 2**31 - 1), parts=st.sampled_from([1, 2, 4]))
def test_a_share_of_the_envs_draws_what_one_rollout_over_all_draws(seed, parts):
    """A process holding envs [first, first + n) of N samples their actions of the whole N-env draw."""
    total, num_actions = 8, 5
    key, logits_key = jax.random.split(jax.random.PRNGKey(seed))
    logits = 3.0 * jax.random.normal(logits_key, (total, num_actions))
    whole = np.asarray(jax.random.categorical(key, logits))
    share = total // parts
    pieces = [
        sample_actions(key, logits[first : first + share], first_env=first, total_envs=total)
        for first in range(0, total, share)
    ]
    np.testing.assert_array_equal(np.concatenate(pieces), whole)
    assert np.asarray(sample_actions(key, logits)).dtype == np.int32


def primed_async_rollouts(model, env, carry, num_steps, num_rollouts):
    """Prime a fresh async pool, then run ``num_rollouts`` async rollouts; their transitions joined along T."""
    prime = jax.jit(lambda c, k: prime_async(model, env, c, key=k))
    run = jax.jit(lambda c, k: async_rollout(model, env, c, num_steps=num_steps, key=k))
    carry = primed = prime(carry, jax.random.PRNGKey(1))
    rollouts = []
    for key in jax.random.split(jax.random.PRNGKey(2), num_rollouts):
        carry, transitions = run(carry, key)
        rollouts.append(transitions)
    joined = jax.tree.map(lambda *xs: jnp.concatenate(xs), *rollouts)
    return primed, carry, joined


def each_envs_transitions(transitions, env):
    """Indices ``(t, i)`` of env ``env``'s transitions, in the order they were received."""
    return np.nonzero(np.asarray(transitions.env_ids) == env)


@pytest.mark.compile
@pytest.mark.parametrize(("num_envs", "batch_size", "num_steps", "lives"), [(4, 2, 16, 1), (6, 2, 20, 3), (6, 3, 9, 1)])
def test_async_rollout_against_a_fake_pool(num_envs, batch_size, num_steps, lives):
    handle, env = counting_async_env(num_envs, batch_size, lives)
    model = ActorCritic((4,), 3, key=jax.random.PRNGKey(0))
    carry = init_async_carry(handle, (4,), np.dtype(np.float32), init_episode_stats(num_envs))
    primed, carry, transitions = primed_async_rollouts(model, env, carry, num_steps, num_rollouts=2)

    # Priming leaves every env with a pending step: the observation before the step under way.
    np.testing.assert_array_equal(primed.obs[:, 0], np.asarray(primed.handle.counter) - 1)
    np.testing.assert_array_equal(primed.obs[:, 1], np.arange(num_envs))
    assert transitions.obs.shape == (2 * num_steps, batch_size, 4)
    env_ids = np.asarray(transitions.env_ids)
    assert all(len(set(row)) == batch_size for row in env_ids), env_ids
    assert set(env_ids.ravel()) == set(range(num_envs))

    length = np.arange(num_envs) + 2
    for n in range(num_envs):
        steps, slots = each_envs_transitions(transitions, n)
        counters = np.asarray(transitions.obs[steps, slots, 0])
        # Each transition starts where the env's previous one ended: its observation is the one received last.
        np.testing.assert_array_equal(counters, primed.obs[n, 0] + np.arange(len(steps)))
        np.testing.assert_array_equal(transitions.obs[steps, slots, 1], n)
        np.testing.assert_array_equal(transitions.dones[steps, slots], (counters + 1) % length[n] == 0)
        np.testing.assert_array_equal(transitions.rewards[steps, slots], 1.0)
        # Each transition's bootstrap value is the value stored with the env's next transition.
        np.testing.assert_array_equal(
            transitions.next_values[steps[:-1], slots[:-1]], transitions.values[steps[1:], slots[1:]]
        )
        # The carry's pending step follows the last transition.
        assert float(carry.obs[n, 0]) == counters[-1] + 1

    # The stored log-probabilities and values are the model's at the stored observations.
    flat = jax.tree.map(lambda x: x.reshape((-1, *x.shape[2:])), transitions)
    logprob, _, value = model.evaluate_actions(flat.obs, flat.actions)
    np.testing.assert_allclose(flat.logprobs, logprob, rtol=1e-5)
    np.testing.assert_allclose(flat.values, value, rtol=1e-5, atol=1e-6)
    _, next_value = model(flat.obs.at[:, 0].add(1.0))
    np.testing.assert_allclose(flat.next_values, next_value, rtol=1e-5, atol=1e-6)

    # Episode statistics per env, priming's steps included: the last game's length, the running one's.
    received = np.asarray(carry.obs[:, 0])
    game = length * lives
    np.testing.assert_array_equal(carry.stats.episode_lengths, received % game)
    finished = received >= game
    np.testing.assert_array_equal(carry.stats.returned_episode_lengths[finished], game[finished])
    assert np.all(np.isnan(carry.stats.returned_episode_returns[~finished]))
    returns = np.asarray(carry.stats.returned_episode_returns[finished])
    assert np.all((returns >= game[finished]) & (returns <= 3 * game[finished]))


def test_priming_receives_until_every_env_is_back():
    """In the fake pool of 6 envs received 2 at a time, env 1 comes back before env 2's reset is received."""
    handle, env = counting_async_env(6, 2)
    model = ActorCritic((4,), 3, key=jax.random.PRNGKey(0))
    carry = prime_async(
        model,
        env,
        init_async_carry(handle, (4,), np.dtype(np.float32), init_episode_stats(6)),
        key=jax.random.PRNGKey(0),
    )
    sent = np.asarray(carry.handle.counter)
    assert sent.min() >= 1 and sent.sum() > 6
    np.testing.assert_array_equal(carry.obs[:, 0], sent - 1)
    # The steps completed while priming count in the statistics; resets do not.
    np.testing.assert_array_equal(carry.stats.episode_lengths, (sent - 1) % (np.arange(6) + 2))


def cartpole_step(obs, action):
    """Gymnasium's CartPole-v1 dynamics (Euler), in float64."""
    x, x_dot, theta, theta_dot = np.asarray(obs, np.float64).T
    force = np.where(action == 1, 10.0, -10.0)
    cos, sin = np.cos(theta), np.sin(theta)
    temp = (force + 0.05 * theta_dot**2 * sin) / 1.1
    theta_acc = (9.8 * sin - cos * temp) / (0.5 * (4.0 / 3.0 - 0.1 * cos**2 / 1.1))
    x_acc = temp - 0.05 * theta_acc * cos / 1.1
    return np.stack([x + 0.02 * x_dot, x_dot + 0.02 * x_acc, theta + 0.02 * theta_dot, theta_dot + 0.02 * theta_acc], 1)


@pytest.mark.envpool
def test_async_rollout_on_cartpole_keeps_each_envs_transitions_in_order():
    """With EnvPool's real async pool, each env's stored observation follows from its previous one and action."""
    pool = make_async_pool("CartPole-v1", 4, 2)
    spec = pool.spec
    model = ActorCritic(spec.obs_shape, spec.num_actions, key=jax.random.PRNGKey(0))
    carry = init_async_carry(pool.handle, spec.obs_shape, spec.obs_dtype, init_episode_stats(4))
    _, _, transitions = primed_async_rollouts(model, pool.env, carry, num_steps=64, num_rollouts=2)
    pool.close()

    env_ids = np.asarray(transitions.env_ids)
    assert all(len(set(row)) == 2 for row in env_ids)
    assert set(env_ids.ravel()) == {0, 1, 2, 3}
    checked = 0
    for n in range(4):
        steps, slots = each_envs_transitions(transitions, n)
        obs = np.asarray(transitions.obs[steps, slots])
        actions = np.asarray(transitions.actions[steps, slots])
        dones = np.asarray(transitions.dones[steps, slots])
        rewards = np.asarray(transitions.rewards[steps, slots])
        # The step after a done resets the env (the action is ignored, the reward is 0).
        after_done = np.concatenate([[False], dones[:-1]])
        np.testing.assert_array_equal(rewards, np.where(after_done, 0.0, 1.0))
        follows = ~after_done[:-1]
        np.testing.assert_allclose(obs[1:][follows], cartpole_step(obs[:-1], actions[:-1])[follows], atol=1e-4)
        checked += int(follows.sum())
    assert checked > 200
