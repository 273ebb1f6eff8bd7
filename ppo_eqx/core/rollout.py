"""The rollout and its advantages: ``num_steps`` transitions from ``N`` envs under ``jax.lax.scan``, with episode
statistics (or, from an async pool, ``num_steps`` receives of ``R`` of its envs each); then generalised advantage
estimation over them (``compute_gae``, ``compute_gae_by_env``)."""

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Bool, Float, Int, PRNGKeyArray

from ._types import AsyncTransition, EnvOutput, EpisodeStats, Observation, Transition
from .checks import typechecked
from .envs import AsyncEnv, EnvStep
from .networks import Policy
from .networks import sample_actions as sample_actions  # its home before the model interface
from .recurrent import RecurrentPolicy

# --- the rollout ------------------------------------------------------------------------------------------------------


def init_episode_stats(num_envs: int) -> EpisodeStats:
    # Four distinct buffers: the jitted iteration donates its inputs, and a buffer cannot be donated twice.
    return EpisodeStats(
        jnp.zeros((num_envs,), jnp.float32),
        jnp.zeros((num_envs,), jnp.int32),
        jnp.full((num_envs,), jnp.nan, jnp.float32),
        jnp.full((num_envs,), jnp.nan, jnp.float32),
    )


def fresh_episodes(stats: EpisodeStats) -> EpisodeStats:
    """Statistics for new envs: no running episode, the last finished ones kept."""
    return stats._replace(
        episode_returns=jnp.zeros_like(stats.episode_returns),
        episode_lengths=jnp.zeros_like(stats.episode_lengths),
    )


def update_episode_stats(stats: EpisodeStats, out: EnvOutput) -> EpisodeStats:
    """Add one step's raw reward; when a game is over, keep its return and length and start again."""
    return count_step(stats, out.raw_reward, out.game_over)


def count_step(stats: EpisodeStats, raw_reward: Float[Array, " N"], over: Bool[Array, " N"]) -> EpisodeStats:
    """``update_episode_stats`` of a step's raw reward and game over alone."""
    returns = stats.episode_returns + raw_reward
    lengths = stats.episode_lengths + 1
    return EpisodeStats(
        episode_returns=jnp.where(over, 0.0, returns),
        episode_lengths=jnp.where(over, 0, lengths),
        returned_episode_returns=jnp.where(over, returns, stats.returned_episode_returns),
        returned_episode_lengths=jnp.where(over, lengths.astype(jnp.float32), stats.returned_episode_lengths),
    )


class RolloutCarry(NamedTuple):
    """What one rollout hands the next: the env backend's handle, the current observation, episode statistics; for
    a recurrent policy (``core.recurrent``) also each env's memory and whether the current observation begins an
    episode (``starts``: the memory is reset before it)."""

    handle: Any
    obs: Observation
    stats: EpisodeStats
    memory: Any = None
    starts: Bool[Array, " N"] | None = None


def act(
    model: Policy,
    obs: Observation,
    key: PRNGKeyArray,
    *,
    first_env: int | Int[Array, ""] = 0,
    total_envs: int | None = None,
) -> tuple[Int[Array, " N"] | Float[Array, "N A"], Float[Array, " N"], Float[Array, " N"]]:
    """The policy's action for each observation (``model.sample``: with ``total_envs``, those of rows ``first_env
    ..`` of a batch of ``total_envs``), its log-probability, and the value."""
    outputs, value = model(obs)
    action, logprob = model.sample(key, outputs, first_env=first_env, total_envs=total_envs)
    return action, logprob, value


@typechecked
def rollout(
    model: Policy,
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

    _check_rollout(model, env_step, carry, num_steps)

    def step(carry: RolloutCarry, step_key: PRNGKeyArray) -> tuple[RolloutCarry, Transition]:
        action, logprob, value = act(model, carry.obs, step_key, first_env=first_env, total_envs=total_envs)
        handle, out = env_step(carry.handle, action)
        transition = Transition(carry.obs, action, logprob, value, out.reward, out.done)
        return RolloutCarry(handle, out.obs, update_episode_stats(carry.stats, out)), transition

    carry, transitions = jax.lax.scan(step, carry, jax.random.split(key, num_steps))
    _, last_value = model(carry.obs)
    return carry, transitions, last_value


def recurrent_rollout(
    model: RecurrentPolicy,
    env_step: EnvStep,
    carry: RolloutCarry,
    *,
    num_steps: int,
    key: PRNGKeyArray,
    first_env: int = 0,
    total_envs: int | None = None,
) -> tuple[RolloutCarry, Transition, Bool[Array, "T N"], Float[Array, " N"]]:
    """``rollout`` of a recurrent policy, whose memory (``carry.memory``) each step moves on after resetting it
    where the observation begins an episode (``carry.starts``, the previous step's ``done``). Returns the carry, the
    transitions, each step's ``starts`` and the value of the last observation (under the memory it reached)."""
    _check_rollout(model, env_step, carry, num_steps)

    if carry.starts is None:
        raise ValueError("recurrent_rollout: the carry holds no memory (a recurrent policy's collector makes one)")

    def step(carry: RolloutCarry, step_key: PRNGKeyArray) -> tuple[RolloutCarry, tuple[Transition, Array]]:
        assert carry.starts is not None
        memory, outputs, value = model.step(carry.memory, carry.obs, carry.starts)
        action, logprob = model.sample(step_key, outputs, first_env=first_env, total_envs=total_envs)
        handle, out = env_step(carry.handle, action)
        transition = Transition(carry.obs, action, logprob, value, out.reward, out.done)
        stats = update_episode_stats(carry.stats, out)
        return RolloutCarry(handle, out.obs, stats, memory, out.done), (transition, carry.starts)

    carry, (transitions, starts) = jax.lax.scan(step, carry, jax.random.split(key, num_steps))
    assert carry.starts is not None
    _, _, last_value = model.step(carry.memory, carry.obs, carry.starts)
    return carry, transitions, starts, last_value


def _check_rollout(model: Policy, env_step: EnvStep, carry: RolloutCarry, num_steps: int) -> None:
    """``num_steps`` >= 1, and ``env_step`` returning observations like ``carry.obs`` (its shapes, traced once
    with ``jax.eval_shape``), before the scan would fail on them deep inside jax."""
    if num_steps < 1:
        raise ValueError(f"rollout: num_steps={num_steps}; allowed: 1 or more")
    outputs, _ = jax.eval_shape(model, carry.obs)
    actions, _ = jax.eval_shape(model.sample, jax.random.key(0), outputs)
    _, out = jax.eval_shape(env_step, carry.handle, actions)
    obs = getattr(out, "obs", None)
    if obs is None or (obs.shape, obs.dtype) != (carry.obs.shape, carry.obs.dtype):
        shown = "no EnvOutput" if obs is None else f"obs {obs.dtype}{list(obs.shape)}"
        raise ValueError(
            f"rollout: env_step(handle, actions) returns {shown}; allowed: EnvOutput with obs like carry.obs, "
            f"{carry.obs.dtype}{list(carry.obs.shape)}"
        )


def update_episode_stats_at(
    stats: EpisodeStats, env_ids: Int[Array, " R"], out: EnvOutput, *, where: Bool[Array, " R"] | None = None
) -> EpisodeStats:
    """``update_episode_stats`` for the envs ``env_ids`` only (those that ``out`` is of; ``where`` them, if given)."""
    own = EpisodeStats(*(x[env_ids] for x in stats))
    updated = update_episode_stats(own, out)
    if where is not None:
        updated = EpisodeStats(*(jnp.where(where, new, old) for new, old in zip(updated, own, strict=True)))
    return EpisodeStats(*(x.at[env_ids].set(new) for x, new in zip(stats, updated, strict=True)))


class AsyncRolloutCarry(NamedTuple):
    """What one async rollout hands the next: the handle, each env's pending step and episode statistics.

    Env n's pending step is the one under way in the pool: the observation ``obs[n]`` that the policy acted on,
    the action ``actions[n]`` that was sent, its log-probability and the value of ``obs[n]``; its reward comes
    with the env's next receive.
    """

    handle: Any
    obs: Observation
    actions: Int[Array, " N"]
    logprobs: Float[Array, " N"]
    values: Float[Array, " N"]
    stats: EpisodeStats


def init_async_carry(
    handle: Any, obs_shape: tuple[int, ...], obs_dtype: np.dtype, stats: EpisodeStats
) -> AsyncRolloutCarry:
    """The carry of a fresh async pool before ``prime_async``: zeros for the pending steps, as none is known."""
    num_envs = stats.episode_returns.shape[0]
    obs = jnp.zeros((num_envs, *obs_shape), obs_dtype)
    # Distinct buffers, as in init_episode_stats: the iteration donates them.
    logprobs, values = jnp.zeros((num_envs,), jnp.float32), jnp.zeros((num_envs,), jnp.float32)
    return AsyncRolloutCarry(handle, obs, jnp.zeros((num_envs,), jnp.int32), logprobs, values, stats)


def _pend(
    carry: AsyncRolloutCarry,
    handle: Any,
    env_ids: Int[Array, " R"],
    obs: Observation,
    action: Int[Array, " R"],
    logprob: Float[Array, " R"],
    value: Float[Array, " R"],
    stats: EpisodeStats,
) -> AsyncRolloutCarry:
    """The carry with the steps just sent to ``env_ids`` as their pending ones."""
    return AsyncRolloutCarry(
        handle,
        carry.obs.at[env_ids].set(obs),
        carry.actions.at[env_ids].set(action),
        carry.logprobs.at[env_ids].set(logprob),
        carry.values.at[env_ids].set(value),
        stats,
    )


def prime_async(model: Policy, env: AsyncEnv, carry: AsyncRolloutCarry, *, key: PRNGKeyArray) -> AsyncRolloutCarry:
    """Give every env of a fresh async pool (``init_async_carry``) a pending step.

    Receives, acts and sends until every env has come back from its reset once. EnvPool's threads finish in
    any order, so an env can come back a second time before another's reset is received: the step it completes
    then is not learned from (its reward still counts in the episode statistics).
    """
    num_envs = carry.actions.shape[0]

    def waiting(loop: tuple[AsyncRolloutCarry, Bool[Array, " N"], PRNGKeyArray]) -> Bool[Array, ""]:
        return ~jnp.all(loop[1])

    def step(
        loop: tuple[AsyncRolloutCarry, Bool[Array, " N"], PRNGKeyArray],
    ) -> tuple[AsyncRolloutCarry, Bool[Array, " N"], PRNGKeyArray]:
        carry, received, key = loop
        key, act_key = jax.random.split(key)
        handle, env_ids, out = env.recv(carry.handle)
        action, logprob, value = act(model, out.obs, act_key)
        handle = env.send(handle, env_ids, action)
        # An env's first receive is its reset, not a step of an episode.
        stats = update_episode_stats_at(carry.stats, env_ids, out, where=received[env_ids])
        carry = _pend(carry, handle, env_ids, out.obs, action, logprob, value, stats)
        return carry, received.at[env_ids].set(True), key

    carry, _, _ = jax.lax.while_loop(waiting, step, (carry, jnp.zeros((num_envs,), bool), key))
    return carry


def async_rollout(
    model: Policy,
    env: AsyncEnv,
    carry: AsyncRolloutCarry,
    *,
    num_steps: int,
    key: PRNGKeyArray,
) -> tuple[AsyncRolloutCarry, AsyncTransition]:
    """Receive ``R`` envs ``num_steps`` times, completing each one's pending step, and send their next actions.

    The carry must come from ``prime_async`` or a previous ``async_rollout``. Transition ``[t, i]`` is the
    pending step of env ``env_ids[t, i]`` with the reward and done that came back, and the value (under
    ``model``) of the observation that came with them as its ``next_values``: each transition carries its own
    bootstrap (see ``compute_gae_by_env``).
    """

    def step(carry: AsyncRolloutCarry, step_key: PRNGKeyArray) -> tuple[AsyncRolloutCarry, AsyncTransition]:
        handle, env_ids, out = env.recv(carry.handle)
        action, logprob, value = act(model, out.obs, step_key)
        handle = env.send(handle, env_ids, action)
        transition = AsyncTransition(
            carry.obs[env_ids],
            carry.actions[env_ids],
            carry.logprobs[env_ids],
            carry.values[env_ids],
            out.reward,
            out.done,
            value,
            env_ids,
        )
        stats = update_episode_stats_at(carry.stats, env_ids, out)
        return _pend(carry, handle, env_ids, out.obs, action, logprob, value, stats), transition

    return jax.lax.scan(step, carry, jax.random.split(key, num_steps))


# --- generalised advantage estimation ---------------------------------------------------------------------------------


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
