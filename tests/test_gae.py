from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ppo_eqx import compute_gae
from ppo_eqx.core.rollout import compute_gae_by_env, truncation_bootstrap

from .strategies import TIME_ENV_SHAPES, bool_arrays, float_arrays, unit_interval

pytestmark = pytest.mark.unit

gae: Any = jax.jit(compute_gae)  # jit's signature loses the keyword-only parameters
gae_by_env: Any = jax.jit(compute_gae_by_env, static_argnames="num_envs")


def reference_gae(rewards, values, dones, last_value, gamma, gae_lambda):
    """The textbook backward loop, one env and one step at a time, in float64."""
    steps, envs = rewards.shape
    advantages = np.zeros((steps, envs))
    for n in range(envs):
        next_advantage, next_value = 0.0, float(last_value[n])
        for t in reversed(range(steps)):
            live = 0.0 if dones[t, n] else 1.0
            delta = rewards[t, n] + gamma * next_value * live - values[t, n]
            next_advantage = delta + gamma * gae_lambda * live * next_advantage
            next_value = values[t, n]
            advantages[t, n] = next_advantage
    return advantages, advantages + values


@st.composite
def gae_inputs(draw):
    steps, envs = draw(st.sampled_from(TIME_ENV_SHAPES))
    return (
        draw(float_arrays((steps, envs))),
        draw(float_arrays((steps, envs))),
        draw(bool_arrays((steps, envs), draw(st.sampled_from([0.0, 0.1, 0.5])))),
        draw(float_arrays((envs,))),
    )


@given(gae_inputs(), unit_interval, unit_interval)
def test_matches_reference_loop(inputs, gamma, gae_lambda):
    rewards, values, dones, last_value = map(jnp.asarray, inputs)
    advantages, returns = gae(rewards, values, dones, last_value, gamma=gamma, gae_lambda=gae_lambda)
    expected_advantages, expected_returns = reference_gae(*inputs, gamma=gamma, gae_lambda=gae_lambda)
    np.testing.assert_allclose(advantages, expected_advantages, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(returns, expected_returns, rtol=1e-4, atol=1e-3)


@given(gae_inputs(), unit_interval)
def test_lambda_zero_gives_td_error(inputs, gamma):
    rewards, values, dones, last_value = inputs
    advantages, _ = gae(*map(jnp.asarray, inputs), gamma=gamma, gae_lambda=0.0)
    next_values = np.concatenate([values[1:], last_value[None]], axis=0)
    td_error = rewards + gamma * next_values * (1.0 - dones) - values
    np.testing.assert_allclose(advantages, td_error, rtol=1e-5, atol=1e-4)


@given(gae_inputs())
def test_undiscounted_without_dones_is_reward_to_go_plus_bootstrap(inputs):
    rewards, values, _, last_value = inputs
    dones = np.zeros_like(rewards, dtype=bool)
    _, returns = gae(
        jnp.asarray(rewards),
        jnp.asarray(values),
        jnp.asarray(dones),
        jnp.asarray(last_value),
        gamma=1.0,
        gae_lambda=1.0,
    )
    reward_to_go = np.cumsum(rewards[::-1], axis=0)[::-1]
    np.testing.assert_allclose(returns, reward_to_go + last_value, rtol=1e-4, atol=1e-3)


@given(gae_inputs(), unit_interval, unit_interval, st.data())
def test_a_done_cuts_propagation(inputs, gamma, gae_lambda, data):
    rewards, values, dones, last_value = inputs
    steps = rewards.shape[0]
    cut = data.draw(st.integers(0, steps - 1))
    dones = dones.copy()
    dones[cut] = True
    # Whatever happens after the done at step `cut` cannot change the estimates up to it.
    later = np.random.default_rng(0).normal(size=rewards.shape).astype(np.float32) * 100
    changed_rewards, changed_values = rewards.copy(), values.copy()
    changed_rewards[cut + 1 :] += later[cut + 1 :]
    changed_values[cut + 1 :] += later[cut + 1 :]
    base, _ = gae(*map(jnp.asarray, (rewards, values, dones, last_value)), gamma=gamma, gae_lambda=gae_lambda)
    changed, _ = gae(
        *map(jnp.asarray, (changed_rewards, changed_values, dones, last_value + 1000.0)),
        gamma=gamma,
        gae_lambda=gae_lambda,
    )
    np.testing.assert_array_equal(np.asarray(base)[: cut + 1], np.asarray(changed)[: cut + 1])


def test_hand_computed_case():
    # Two steps, one env, gamma=0.5, lambda=0.5, no dones: delta1 = 1 + 0.5*4 - 2 = 1, A1 = 1;
    # delta0 = 0 + 0.5*2 - 1 = 0, A0 = 0 + 0.25*1 = 0.25.
    advantages, returns = compute_gae(
        jnp.array([[0.0], [1.0]]),
        jnp.array([[1.0], [2.0]]),
        jnp.zeros((2, 1), bool),
        jnp.array([4.0]),
        gamma=0.5,
        gae_lambda=0.5,
    )
    np.testing.assert_allclose(advantages[:, 0], [0.25, 1.0])
    np.testing.assert_allclose(returns[:, 0], [1.25, 3.0])


def reference_gae_by_env(rewards, values, next_values, dones, env_ids, num_envs, gamma, gae_lambda):
    """Each env's transitions picked out in order, then the textbook backward loop over them, in float64."""
    advantages = np.zeros(rewards.shape)
    for n in range(num_envs):
        steps, slots = np.nonzero(env_ids == n)
        next_advantage = 0.0
        for t, i in reversed(list(zip(steps, slots, strict=True))):
            live = 0.0 if dones[t, i] else 1.0
            delta = rewards[t, i] + gamma * next_values[t, i] * live - values[t, i]
            next_advantage = delta + gamma * gae_lambda * live * next_advantage
            advantages[t, i] = next_advantage
    return advantages, advantages + values


ASYNC_SHAPES = [(1, 2, 4), (6, 2, 4), (16, 3, 6), (32, 1, 2)]
"""(T, R, N): T steps of R of N envs each."""


@st.composite
def gae_by_env_inputs(draw):
    steps, received, envs = draw(st.sampled_from(ASYNC_SHAPES))
    seed = draw(st.integers(0, 2**32 - 1))
    # Any R distinct envs at each step, as an async pool's receives (some envs may not appear at all).
    rng = np.random.default_rng(seed)
    env_ids = np.stack([rng.permutation(envs)[:received] for _ in range(steps)]).astype(np.int32)
    return (
        draw(float_arrays((steps, received))),
        draw(float_arrays((steps, received))),
        draw(float_arrays((steps, received))),
        draw(bool_arrays((steps, received), draw(st.sampled_from([0.0, 0.1, 0.5])))),
        env_ids,
        envs,
    )


@given(gae_by_env_inputs(), unit_interval, unit_interval)
def test_by_env_matches_reference_loop(inputs, gamma, gae_lambda):
    rewards, values, next_values, dones, env_ids, envs = inputs
    advantages, returns = gae_by_env(
        *map(jnp.asarray, (rewards, values, next_values, dones, env_ids)),
        num_envs=envs,
        gamma=gamma,
        gae_lambda=gae_lambda,
    )
    expected_advantages, expected_returns = reference_gae_by_env(*inputs, gamma=gamma, gae_lambda=gae_lambda)
    np.testing.assert_allclose(advantages, expected_advantages, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(returns, expected_returns, rtol=1e-4, atol=1e-3)


@given(gae_inputs(), unit_interval, unit_interval)
def test_by_env_with_every_env_at_every_step_is_compute_gae(inputs, gamma, gae_lambda):
    """A synchronous rollout seen as an async one: env n in slot n, its next value the one of the next step."""
    rewards, values, dones, last_value = inputs
    steps, envs = rewards.shape
    next_values = np.concatenate([values[1:], last_value[None]], axis=0)
    env_ids = np.broadcast_to(np.arange(envs, dtype=np.int32), (steps, envs))
    advantages, returns = gae_by_env(
        *map(jnp.asarray, (rewards, values, next_values, dones, env_ids)),
        num_envs=envs,
        gamma=gamma,
        gae_lambda=gae_lambda,
    )
    expected_advantages, expected_returns = gae(*map(jnp.asarray, inputs), gamma=gamma, gae_lambda=gae_lambda)
    np.testing.assert_allclose(advantages, expected_advantages, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(returns, expected_returns, rtol=1e-5, atol=1e-4)


@given(gae_by_env_inputs(), unit_interval)
def test_by_env_lambda_zero_gives_each_transitions_td_error(inputs, gamma):
    rewards, values, next_values, dones, env_ids, envs = inputs
    advantages, _ = gae_by_env(
        *map(jnp.asarray, (rewards, values, next_values, dones, env_ids)), num_envs=envs, gamma=gamma, gae_lambda=0.0
    )
    td_error = rewards + gamma * next_values * (1.0 - dones) - values
    np.testing.assert_allclose(advantages, td_error, rtol=1e-5, atol=1e-4)


def test_by_env_hand_computed_case():
    # Envs 0 and 1 take turns, then env 0 again; gamma=lambda=0.5, no dones. Env 0's last transition (t=2):
    # A = 1 + 0.5*6 - 3 = 1; its first (t=0): delta = 0 + 0.5*3 - 1 = 0.5, A = 0.5 + 0.25*1 = 0.75.
    # Env 1's only transition (t=1): A = 2 + 0.5*4 - 2 = 2.
    advantages, returns = compute_gae_by_env(
        jnp.array([[0.0], [2.0], [1.0]]),
        jnp.array([[1.0], [2.0], [3.0]]),
        jnp.array([[3.0], [4.0], [6.0]]),
        jnp.zeros((3, 1), bool),
        jnp.array([[0], [1], [0]]),
        num_envs=2,
        gamma=0.5,
        gae_lambda=0.5,
    )
    np.testing.assert_allclose(advantages[:, 0], [0.75, 2.0, 1.0])
    np.testing.assert_allclose(returns[:, 0], [1.75, 4.0, 4.0])


# --- a time limit bootstrapped from the final observation (--bootstrap-truncated) ---


def reference_gae_truncated(rewards, values, final_values, terminated, truncated, last_value, gamma, gae_lambda):
    """The recurrence written out, env by env, in float64: a termination ends the chain with its reward alone, a
    time limit (not terminal) with its reward plus gamma times the final observation's value."""
    steps, envs = rewards.shape
    advantages = np.zeros((steps, envs))
    for n in range(envs):
        following = 0.0
        for t in reversed(range(steps)):
            next_value = float(last_value[n]) if t == steps - 1 else float(values[t + 1, n])
            if terminated[t, n]:
                target = rewards[t, n]
            elif truncated[t, n]:
                target = rewards[t, n] + gamma * final_values[t, n]
            else:
                target = rewards[t, n] + gamma * next_value
            ended = terminated[t, n] or truncated[t, n]
            following = target - values[t, n] + (0.0 if ended else gamma * gae_lambda * following)
            advantages[t, n] = following
    return advantages, advantages + values


def bootstrapped_gae(rewards, values, final_values, terminated, truncated, last_value, gamma, gae_lambda):
    """What the collector computes: ``compute_gae`` on ``truncation_bootstrap``'s rewards, every end a done."""
    time_limit = truncated & ~terminated
    rewards = truncation_bootstrap(rewards, final_values, time_limit, gamma=gamma)
    return gae(rewards, values, terminated | truncated, last_value, gamma=gamma, gae_lambda=gae_lambda)


F, T = False, True
# T=3, gamma=0.5, lambda=1, rewards 1, values 0, final values 4, last_value 8 (worked by hand).
TRUNCATION_CASES = {
    "no end": ((F, F, F), (F, F, F), [2.75, 3.5, 5.0]),
    # A_1 = 1 + 0.5 * 4 = 3, not chained to step 2; A_0 = 1 + 0.5 * 3 = 2.5
    "time limit at t=1": ((F, F, F), (F, T, F), [2.5, 3.0, 5.0]),
    "terminal at t=1": ((F, T, F), (F, F, F), [1.5, 1.0, 5.0]),
    "both at t=1 is terminal": ((F, T, F), (F, T, F), [1.5, 1.0, 5.0]),
    # the final observation's value, not last_value: A_2 = 1 + 0.5 * 4 = 3, A_1 = 2.5, A_0 = 2.25
    "time limit at the last step": ((F, F, F), (F, F, T), [2.25, 2.5, 3.0]),
}


@pytest.mark.parametrize("name", sorted(TRUNCATION_CASES))
def test_a_time_limit_bootstraps_from_the_final_observation_by_hand(name):
    terminated, truncated, expected = TRUNCATION_CASES[name]
    column = [np.asarray(x, np.float32)[:, None] for x in ([1, 1, 1], [0, 0, 0], [4, 4, 4])]
    flags = [np.asarray(x)[:, None] for x in (terminated, truncated)]
    inputs = (*column, *flags, np.asarray([8.0], np.float32))
    advantages, _ = bootstrapped_gae(*map(jnp.asarray, inputs), gamma=0.5, gae_lambda=1.0)
    reference, _ = reference_gae_truncated(*inputs, gamma=0.5, gae_lambda=1.0)
    np.testing.assert_allclose(np.asarray(advantages)[:, 0], expected, atol=1e-6)
    np.testing.assert_allclose(reference[:, 0], expected, atol=1e-12)


@st.composite
def truncation_inputs(draw):
    steps, envs = draw(st.sampled_from(TIME_ENV_SHAPES))
    terminated_p, truncated_p = draw(st.sampled_from([0.0, 0.2])), draw(st.sampled_from([0.0, 0.2, 0.5]))
    return (
        draw(float_arrays((steps, envs))),
        draw(float_arrays((steps, envs))),
        draw(float_arrays((steps, envs))),
        draw(bool_arrays((steps, envs), terminated_p)),
        draw(bool_arrays((steps, envs), truncated_p)),
        draw(float_arrays((envs,))),
    )


@given(truncation_inputs(), st.sampled_from([0.0, 0.5, 0.99, 1.0]), st.sampled_from([0.0, 0.95, 1.0]))
def test_truncation_bootstrap_matches_the_reference_loop(inputs, gamma, gae_lambda):
    advantages, returns = bootstrapped_gae(*map(jnp.asarray, inputs), gamma=gamma, gae_lambda=gae_lambda)
    expected_advantages, expected_returns = reference_gae_truncated(*inputs, gamma=gamma, gae_lambda=gae_lambda)
    np.testing.assert_allclose(advantages, expected_advantages, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(returns, expected_returns, rtol=1e-4, atol=1e-3)


@given(truncation_inputs(), unit_interval)
def test_without_a_time_limit_the_rewards_are_left_as_they_are(inputs, gamma):
    rewards, _, final_values, _, _, _ = inputs
    unchanged = truncation_bootstrap(
        jnp.asarray(rewards), jnp.asarray(final_values), jnp.zeros(rewards.shape, bool), gamma=gamma
    )
    assert np.array_equal(np.asarray(unchanged), rewards)
