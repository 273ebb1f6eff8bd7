import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ppo_eqx import ActorCritic, RolloutCarry, init_episode_stats, rollout
from ppo_eqx.networks import MLP
from ppo_eqx.rollout import sample_actions

from .fake_env import counting_env


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
