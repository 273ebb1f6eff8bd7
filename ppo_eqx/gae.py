"""Generalised advantage estimation."""

import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Bool, Float


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
