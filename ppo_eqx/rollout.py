"""Collect ``num_steps`` transitions from ``N`` envs under ``jax.lax.scan``, with episode statistics."""

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PRNGKeyArray

from ._types import EnvOutput, EpisodeStats, Observation, Transition
from .envs import EnvStep
from .networks import ActorCritic, categorical_logprob_entropy


def init_episode_stats(num_envs: int) -> EpisodeStats:
    # Four distinct buffers: the jitted iteration donates its inputs, and a buffer cannot be donated twice.
    return EpisodeStats(
        jnp.zeros((num_envs,), jnp.float32),
        jnp.zeros((num_envs,), jnp.int32),
        jnp.full((num_envs,), jnp.nan, jnp.float32),
        jnp.full((num_envs,), jnp.nan, jnp.float32),
    )


def update_episode_stats(stats: EpisodeStats, out: EnvOutput) -> EpisodeStats:
    """Add one step's raw reward; when a game is over, keep its return and length and start again."""
    returns = stats.episode_returns + out.raw_reward
    lengths = stats.episode_lengths + 1
    over = out.game_over
    return EpisodeStats(
        episode_returns=jnp.where(over, 0.0, returns),
        episode_lengths=jnp.where(over, 0, lengths),
        returned_episode_returns=jnp.where(over, returns, stats.returned_episode_returns),
        returned_episode_lengths=jnp.where(over, lengths.astype(jnp.float32), stats.returned_episode_lengths),
    )


def sample_actions(
    key: PRNGKeyArray, logits: Float[Array, "N A"], *, first_env: int = 0, total_envs: int | None = None
) -> Int[Array, " N"]:
    """One action per row of ``logits``, as ``jax.random.categorical(key, logits)``.

    With ``total_envs``, the rows are rows ``first_env ..`` of a ``[total_envs, A]`` batch, and each gets the
    action that ``categorical`` (Gumbel-max) draws for that row of the whole batch.
    """
    if total_envs is None:
        return jax.random.categorical(key, logits).astype(jnp.int32)
    gumbel = jax.random.gumbel(key, (total_envs, logits.shape[-1]), logits.dtype)
    noise = jax.lax.dynamic_slice_in_dim(gumbel, first_env, logits.shape[0])
    return jnp.argmax(logits + noise, axis=-1).astype(jnp.int32)


class RolloutCarry(NamedTuple):
    """What one rollout hands the next: the EnvPool handle, the current observation, episode statistics."""

    handle: Any
    obs: Observation
    stats: EpisodeStats


def rollout(
    model: ActorCritic,
    env_step: EnvStep,
    carry: RolloutCarry,
    *,
    num_steps: int,
    key: PRNGKeyArray,
    first_env: int = 0,
    total_envs: int | None = None,
) -> tuple[RolloutCarry, Transition, Float[Array, " N"]]:
    """Act ``num_steps`` times in every env with actions sampled from ``model``.

    Returns the carry after the last step, the time-major transitions and the value of the last
    observation (GAE's bootstrap). With ``total_envs``, these N envs are envs ``first_env .. first_env + N - 1``
    of a run of ``total_envs`` (one process's share of a multi-host run): they draw the actions that
    those envs would draw in one rollout over all ``total_envs`` (``sample_actions``).
    """

    def step(carry: RolloutCarry, step_key: PRNGKeyArray) -> tuple[RolloutCarry, Transition]:
        logits, value = model(carry.obs)
        action = sample_actions(step_key, logits, first_env=first_env, total_envs=total_envs)
        logprob, _ = categorical_logprob_entropy(logits, action)
        handle, out = env_step(carry.handle, action)
        transition = Transition(carry.obs, action, logprob, value, out.reward, out.done)
        return RolloutCarry(handle, out.obs, update_episode_stats(carry.stats, out)), transition

    carry, transitions = jax.lax.scan(step, carry, jax.random.split(key, num_steps))
    _, last_value = model(carry.obs)
    return carry, transitions, last_value
