"""Generalised advantage estimation."""

import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Bool, Float, Int

from .checks import typechecked


@typechecked
def compute_gae(
    rewards: Float[Array, "T N"],
    values: Float[Array, "T N"],
    dones: Bool[Array, "T N"],
    last_value: Float[Array, " N"],
    *,
    gamma: Float[ArrayLike, ""],
    gae_lambda: Float[ArrayLike, ""],
) -> tuple[Float[Array, "T N"], Float[Array, "T N"]]:
    """Generalised advantage estimates and value targets (Schulman et al. 2016).

    ``dones[t]`` is True when the transition at step ``t`` ended its episode: nothing after it is
    bootstrapped into step ``t``. ``last_value`` is the value of the observation after step ``T-1``.
    Returns ``(advantages, returns)`` with ``returns = advantages + values``.
    """
    not_done = 1.0 - dones.astype(values.dtype)

    def step(carry, x):
        next_advantage, next_value = carry
        reward, value, live = x
        delta = reward + gamma * next_value * live - value
        advantage = delta + gamma * gae_lambda * live * next_advantage
        return (advantage, value), advantage

    init = (jnp.zeros_like(last_value), last_value)
    _, advantages = jax.lax.scan(step, init, (rewards, values, not_done), reverse=True)
    return advantages, advantages + values


def truncation_bootstrap(
    rewards: Float[Array, "*batch"],
    final_values: Float[Array, "*batch"],
    truncated: Bool[Array, "*batch"],
    *,
    gamma: Float[ArrayLike, ""],
) -> Float[Array, "*batch"]:
    """``rewards`` plus ``gamma`` times the value of the final observation where a time limit ended the episode.

    ``truncated`` marks the time limits that were not also terminal states (``EnvOutput.truncated``). Fed to
    ``compute_gae`` with ``dones`` on every episode end, this bootstraps a time limit from its final observation
    (``delta = r + gamma * V(final) - V(s)``, nothing chained past it) and leaves every other step as it was: with
    no truncation the rewards are returned unchanged.
    """
    return jnp.where(truncated, rewards + gamma * final_values, rewards)


@typechecked
def compute_gae_by_env(
    rewards: Float[Array, "T R"],
    values: Float[Array, "T R"],
    next_values: Float[Array, "T R"],
    dones: Bool[Array, "T R"],
    env_ids: Int[Array, "T R"],
    *,
    num_envs: int,
    gamma: Float[ArrayLike, ""],
    gae_lambda: Float[ArrayLike, ""],
) -> tuple[Float[Array, "T R"], Float[Array, "T R"]]:
    """``compute_gae`` for steps that each hold ``R`` transitions of any of ``num_envs`` envs (EnvPool's async mode).

    Transition ``[t, i]`` is a step of env ``env_ids[t, i]`` (distinct within a step), ``next_values[t, i]`` the
    value of the observation it led to. An env's transitions chain in the order of ``t``; the last one of each
    env is bootstrapped from its own ``next_value``, as ``compute_gae`` bootstraps step ``T-1`` from
    ``last_value``. Returns ``(advantages, returns)`` with ``returns = advantages + values``.
    """
    not_done = 1.0 - dones.astype(values.dtype)

    def step(next_advantages, x):
        reward, value, next_value, live, ids = x
        delta = reward + gamma * next_value * live - value
        # An env with no later transition in the rollout still holds the initial 0 here.
        advantage = delta + gamma * gae_lambda * live * next_advantages[ids]
        return next_advantages.at[ids].set(advantage), advantage

    init = jnp.zeros((num_envs,), values.dtype)
    _, advantages = jax.lax.scan(step, init, (rewards, values, next_values, not_done, env_ids), reverse=True)
    return advantages, advantages + values
