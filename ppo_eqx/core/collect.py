"""Collectors: how the envs of a pool become a batch to learn from, as a few functions (the way optax's
``GradientTransformation`` is two). ``sync_collector`` rolls out every env at once (CleanRL's way);
``async_collector`` receives R envs at a time from an async pool; ``jax_env_collector`` rolls out a pool whose
envs' state is data (gymnax), which a checkpoint then keeps whole.

``carry(stats)`` is the carry of the pool's fresh envs (host side); ``prime(model, carry, key)`` starts them
(a no-op for a synchronous pool; an async pool's first steps) and returns the key left over;
``collect(model, carry, key, *, gamma, gae_lambda)`` plays ``num_steps`` steps and returns the time-major batch
``[T, N, ...]`` with its GAE advantages and returns, discounted by the agent's own ``gamma`` and ``gae_lambda``
(``AgentHyperparameters``: the collector holds none). ``save(carry)`` is what a checkpoint keeps of a carry and
``restore(saved)`` the carry to go on from with this pool. ``prime`` and ``collect`` are pure and jittable.
"""

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PRNGKeyArray, PyTree

from ._types import Batch, EnvOutput, EpisodeStats, SequenceBatch
from .envs import AsyncPool, EnvStep, Pool, agents_env_step
from .envs.normalize import NormalizedHandle, kept
from .networks import Policy
from .recurrent import RecurrentPolicy
from .rollout import (
    AsyncRolloutCarry,
    RolloutCarry,
    async_rollout,
    compute_gae,
    compute_gae_by_env,
    fresh_episodes,
    init_async_carry,
    prime_async,
    recurrent_rollout,
    rollout,
    truncation_bootstrap,
)

Carry = RolloutCarry | AsyncRolloutCarry


class Collector(NamedTuple):
    carry: Callable[[EpisodeStats], Any]
    prime: Callable[[Policy, Any, PRNGKeyArray], tuple[Any, PRNGKeyArray]]
    collect: Callable[..., tuple[Any, Batch | SequenceBatch]]
    """``collect(model, carry, key, *, gamma, gae_lambda)``."""
    save: Callable[[Any], PyTree]
    """What a checkpoint keeps of a carry: the episode statistics of a host pool (its envs cannot be saved), the
    whole carry of a pool whose envs' state is data."""
    restore: Callable[[PyTree], Any]
    """The carry to go on from with what ``save`` kept: on this pool's fresh envs, with the finished episodes kept,
    for a host pool; the saved carry itself otherwise."""
    shared_handle: bool
    """True when the agents of a program step one pool through one handle (host pools, ``agents_env_step``); False
    when each agent has its own envs' state in the carry, mapped by the ``vmap`` over agents."""


Discount = float | Float[Array, ""]
"""A discount: one agent's array inside the iteration, or a number."""


def no_prime(model: Policy, carry: Carry, key: PRNGKeyArray) -> tuple[Carry, PRNGKeyArray]:
    """``Collector.prime`` of a pool whose envs need no first steps: the carry and key as they are."""
    return carry, key


def stats_of(carry: Carry) -> EpisodeStats:
    """``Collector.save`` of a host pool: the episode statistics alone (its envs cannot be saved)."""
    return carry.stats


def _same(carry: Any) -> Any:
    return carry


def bootstrapping_step(env_step: EnvStep, model: Policy, gamma: Discount) -> EnvStep:
    """``env_step`` whose learning reward at a time limit (``EnvOutput.truncated``) has ``gamma`` times ``model``'s
    value of the final observation added (``truncation_bootstrap``): GAE, which bootstraps nothing past a done,
    then computes the bootstrapped advantages. One more critic evaluation a step; the reported return (the raw
    reward) is untouched."""

    def step(handle: Any, actions: Int[Array, " N"] | Float[Array, "N A"]) -> tuple[Any, EnvOutput]:
        handle, out = env_step(handle, actions)
        _, final_value = model(out.final_obs)
        return handle, out._replace(reward=truncation_bootstrap(out.reward, final_value, out.truncated, gamma=gamma))

    return step


def _rollout_collect(
    step: EnvStep, *, num_steps: int, first_env: int, total_envs: int | None, bootstrap_truncated: bool
) -> Callable[..., tuple[RolloutCarry, Batch | SequenceBatch]]:
    """``collect`` of a synchronous pool stepped by ``step``: ``rollout``, then ``compute_gae``; for a recurrent
    policy (a carry with a memory) ``recurrent_rollout``, and a ``SequenceBatch`` with the memory it started from."""

    def collect(
        model: Policy,
        carry: RolloutCarry,
        key: PRNGKeyArray,
        *,
        gamma: Discount,
        gae_lambda: Discount,
    ) -> tuple[RolloutCarry, Batch | SequenceBatch]:
        if carry.memory is not None:
            if not isinstance(model, RecurrentPolicy) or bootstrap_truncated:
                raise ValueError("a carry with a memory is a RecurrentPolicy's, without bootstrap_truncated")
            memory = carry.memory
            carry, t, starts, last_value = recurrent_rollout(
                model, step, carry, num_steps=num_steps, key=key, first_env=first_env, total_envs=total_envs
            )
            advantages, returns = compute_gae(
                t.rewards, t.values, t.dones, last_value, gamma=gamma, gae_lambda=gae_lambda
            )
            return carry, SequenceBatch(t.obs, t.actions, t.logprobs, t.values, advantages, returns, starts, memory)
        env_step = bootstrapping_step(step, model, gamma) if bootstrap_truncated else step
        carry, t, last_value = rollout(
            model, env_step, carry, num_steps=num_steps, key=key, first_env=first_env, total_envs=total_envs
        )
        advantages, returns = compute_gae(t.rewards, t.values, t.dones, last_value, gamma=gamma, gae_lambda=gae_lambda)
        return carry, Batch(t.obs, t.actions, t.logprobs, t.values, advantages, returns)

    return collect


def _per_agent(x: Array, num_agents: int) -> Array:
    """``[S*N, ...]`` -> ``[S, N, ...]`` (agent s's envs are the s-th block of N); unchanged for one agent."""
    return x if num_agents == 1 else x.reshape((num_agents, -1) + x.shape[1:])


InitialMemory = Callable[[int], PyTree]
"""A recurrent policy's ``initial_memory``: the memory of N fresh envs (``core.recurrent``)."""


def fresh_carry(
    handle: Any, obs: Any, stats: EpisodeStats, num_agents: int, memory: InitialMemory | None
) -> RolloutCarry:
    """The carry of fresh envs: their handle and first observations (``[S*N, ...]``, split per agent), the episode
    statistics, and, for a recurrent policy (``memory``), each env's fresh memory with every env at an episode's
    start."""
    obs = _per_agent(jnp.asarray(obs), num_agents)
    if memory is None:
        return RolloutCarry(handle, obs, stats)
    envs = obs.shape[0] * (obs.shape[1] if num_agents > 1 else 1)
    fresh = jax.tree.map(lambda x: _per_agent(x, num_agents), memory(envs))
    return RolloutCarry(handle, obs, stats, fresh, jnp.ones(obs.shape[: 2 if num_agents > 1 else 1], bool))


def sync_collector(
    pool: Pool,
    *,
    num_steps: int,
    num_agents: int = 1,
    first_env: int = 0,
    total_envs: int | None = None,
    bootstrap_truncated: bool = False,
    renormalize: Callable[[NormalizedHandle], Pool] | None = None,
    memory: InitialMemory | None = None,
) -> Collector:
    """Roll out every env of ``pool`` ``num_steps`` times (``rollout``), then ``compute_gae``.

    With ``num_agents`` S > 1 the pool holds S agents' envs, agent s's the s-th block of ``N``: ``collect`` is
    one agent's, to be ``vmap``-ed over S (``agents_env_step``), and ``carry`` takes ``[S, N]`` statistics.
    ``first_env`` and ``total_envs`` say which envs of a larger run these are (one process's share, see
    ``rollout``). With ``bootstrap_truncated``, a time limit is bootstrapped from the value of the final
    observation (``bootstrapping_step``). A ``pool`` normalised by ``normalize_pool`` passes ``renormalize``, which
    makes it again with a checkpoint's statistics: its checkpoints keep them (``normalize.kept``). A recurrent
    policy's ``memory`` (its ``initial_memory``) gives each fresh env a memory in the carry.
    """
    step = pool.step if num_agents == 1 else agents_env_step(pool.step, num_agents)

    def carry(stats: EpisodeStats) -> RolloutCarry:
        return fresh_carry(pool.handle, pool.first_obs, stats, num_agents, memory)

    collect = _rollout_collect(
        step, num_steps=num_steps, first_env=first_env, total_envs=total_envs, bootstrap_truncated=bootstrap_truncated
    )
    if renormalize is not None:  # the statistics go on; the envs are made afresh

        def restore(saved: RolloutCarry) -> RolloutCarry:
            again = renormalize(saved.handle)
            return fresh_carry(again.handle, again.first_obs, fresh_episodes(saved.stats), num_agents, memory)

        return Collector(carry, no_prime, collect, kept, restore, True)
    return Collector(carry, no_prime, collect, stats_of, lambda stats: carry(fresh_episodes(stats)), True)


def jax_env_collector(
    pool: Pool,
    *,
    num_steps: int,
    num_agents: int = 1,
    bootstrap_truncated: bool = False,
    memory: InitialMemory | None = None,
) -> Collector:
    """``sync_collector`` for a pool whose handle is its envs' whole state (``EnvBackend.state_is_data``).

    With ``num_agents`` S > 1 the pool's ``S * N`` envs are split into each agent's own ``[S, N, ...]`` state,
    handle and observations alike, which the ``vmap`` over agents maps as any other array (no
    ``agents_env_step``). A checkpoint keeps the whole carry (env state, env keys, observations, running episodes),
    so a run restored from any checkpoint goes on as the uninterrupted one did, bit for bit.
    """

    def carry(stats: EpisodeStats) -> RolloutCarry:
        handle = jax.tree.map(lambda x: _per_agent(x, num_agents), pool.handle)
        return fresh_carry(handle, pool.first_obs, stats, num_agents, memory)

    collect = _rollout_collect(
        pool.step, num_steps=num_steps, first_env=0, total_envs=None, bootstrap_truncated=bootstrap_truncated
    )
    return Collector(carry, no_prime, collect, _same, _same, False)


def async_collector(pool: AsyncPool, *, num_steps: int) -> Collector:
    """``num_steps`` receives of R envs from ``pool`` (``async_rollout``), then GAE env by env
    (``compute_gae_by_env``); the batch is ``[T, R, ...]``. ``prime`` gives every env its first pending step
    (``prime_async``) with a key split from the one it is given."""

    def carry(stats: EpisodeStats) -> AsyncRolloutCarry:
        return init_async_carry(pool.handle, pool.spec.obs_shape, pool.spec.obs_dtype, stats)

    def prime(model: Policy, carry: AsyncRolloutCarry, key: PRNGKeyArray) -> tuple[AsyncRolloutCarry, PRNGKeyArray]:
        key, prime_key = jax.random.split(key)
        return prime_async(model, pool.env, carry, key=prime_key), key

    def collect(
        model: Policy,
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

    return Collector(carry, prime, collect, stats_of, lambda stats: carry(fresh_episodes(stats)), True)
