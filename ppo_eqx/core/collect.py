"""Collectors: how the envs of a pool become a batch to learn from, as three functions (the way optax's
``GradientTransformation`` is two). ``sync_collector`` rolls out every env at once (CleanRL's way);
``async_collector`` receives R envs at a time from an async pool.

``carry(stats)`` is the carry of the pool's fresh envs (host side); ``prime(model, carry, key)`` starts them
(a no-op for a synchronous pool; an async pool's first steps) and returns the key left over;
``collect(model, carry, key, *, gamma, gae_lambda)`` plays ``num_steps`` steps and returns the time-major batch
``[T, N, ...]`` with its GAE advantages and returns, discounted by the agent's own ``gamma`` and ``gae_lambda``
(``AgentHyperparameters``: the collector holds none). ``prime`` and ``collect`` are pure and jittable.
"""

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, PRNGKeyArray

from ._types import Batch, EpisodeStats
from .envs import AsyncPool, Pool, seeds_env_step
from .gae import compute_gae, compute_gae_by_env
from .networks import ActorCritic
from .rollout import AsyncRolloutCarry, RolloutCarry, async_rollout, init_async_carry, prime_async, rollout

Carry = RolloutCarry | AsyncRolloutCarry


class Collector(NamedTuple):
    carry: Callable[[EpisodeStats], Any]
    prime: Callable[[ActorCritic, Any, PRNGKeyArray], tuple[Any, PRNGKeyArray]]
    collect: Callable[..., tuple[Any, Batch]]
    """``collect(model, carry, key, *, gamma, gae_lambda)``."""


Discount = float | Float[Array, ""]
"""A discount: one agent's array inside the iteration, or a number."""


def _no_prime(model: ActorCritic, carry: Carry, key: PRNGKeyArray) -> tuple[Carry, PRNGKeyArray]:
    return carry, key


def sync_collector(
    pool: Pool,
    *,
    num_steps: int,
    num_agents: int = 1,
    first_env: int = 0,
    total_envs: int | None = None,
) -> Collector:
    """Roll out every env of ``pool`` ``num_steps`` times (``rollout``), then ``compute_gae``.

    With ``num_agents`` S > 1 the pool holds S agents' envs, agent s's the s-th block of ``N``: ``collect`` is
    one agent's, to be ``vmap``-ed over S (``seeds_env_step``), and ``carry`` takes ``[S, N]`` statistics.
    ``first_env`` and ``total_envs`` say which envs of a larger run these are (one process's share, see
    ``rollout``).
    """
    step = pool.step if num_agents == 1 else seeds_env_step(pool.step, num_agents)

    def carry(stats: EpisodeStats) -> RolloutCarry:
        obs = jnp.asarray(pool.first_obs)
        if num_agents > 1:
            obs = obs.reshape((num_agents, -1) + obs.shape[1:])
        return RolloutCarry(pool.handle, obs, stats)

    def collect(
        model: ActorCritic,
        carry: RolloutCarry,
        key: PRNGKeyArray,
        *,
        gamma: Discount,
        gae_lambda: Discount,
    ) -> tuple[RolloutCarry, Batch]:
        carry, t, last_value = rollout(
            model, step, carry, num_steps=num_steps, key=key, first_env=first_env, total_envs=total_envs
        )
        advantages, returns = compute_gae(t.rewards, t.values, t.dones, last_value, gamma=gamma, gae_lambda=gae_lambda)
        return carry, Batch(t.obs, t.actions, t.logprobs, t.values, advantages, returns)

    return Collector(carry, _no_prime, collect)


def async_collector(pool: AsyncPool, *, num_steps: int) -> Collector:
    """``num_steps`` receives of R envs from ``pool`` (``async_rollout``), then GAE env by env
    (``compute_gae_by_env``); the batch is ``[T, R, ...]``. ``prime`` gives every env its first pending step
    (``prime_async``) with a key split from the one it is given."""

    def carry(stats: EpisodeStats) -> AsyncRolloutCarry:
        return init_async_carry(pool.handle, pool.spec.obs_shape, pool.spec.obs_dtype, stats)

    def prime(
        model: ActorCritic, carry: AsyncRolloutCarry, key: PRNGKeyArray
    ) -> tuple[AsyncRolloutCarry, PRNGKeyArray]:
        key, prime_key = jax.random.split(key)
        return prime_async(model, pool.env, carry, key=prime_key), key

    def collect(
        model: ActorCritic,
        carry: AsyncRolloutCarry,
        key: PRNGKeyArray,
        *,
        gamma: Discount,
        gae_lambda: Discount,
    ) -> tuple[AsyncRolloutCarry, Batch]:
        carry, t = async_rollout(model, pool.env, carry, num_steps=num_steps, key=key)
        num_envs = carry.actions.shape[0]
        advantages, returns = compute_gae_by_env(
            t.rewards,
            t.values,
            t.next_values,
            t.dones,
            t.env_ids,
            num_envs=num_envs,
            gamma=gamma,
            gae_lambda=gae_lambda,
        )
        return carry, Batch(t.obs, t.actions, t.logprobs, t.values, advantages, returns)

    return Collector(carry, prime, collect)
