"""CleanRL's continuous-control wrappers' arithmetic inside the program: observations normalised by their running
mean and variance and clipped to +-10 (gymnasium's ``NormalizeObservation``, then ``TransformObservation``), rewards
divided by the running standard deviation of the discounted return and clipped to +-10 (``NormalizeReward``, then
``TransformReward``). ``raw_reward`` stays the env's, so the reported episodic return is the raw one, as CleanRL's
``RecordEpisodeStatistics`` (the innermost wrapper) sees it.

The statistics are one pool's (gymnasium's wrappers of a vector env), kept in the pool's handle, so they are in
every checkpoint of the carry and a resumed run goes on with them, bit for bit. Every env holds a copy of its
pool's statistics (leaves ``[N, ...]``): the handle then splits into agents (``jax_env_collector``) like any
other, and each agent's envs keep their own. ``frozen`` plays with them unchanged (``ppo-eqx eval``).

Where gymnasium's vector env resets an env after its last step, it updates the statistics with the terminal
observation and then the reset one; an env written in JAX resets inside its step, so here each step's returned
observation (the reset one, at an episode's end) updates them once. The arithmetic is float32 (gymnasium's is
float64)."""

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float

from ...errors import ConfigError
from .._types import EnvOutput
from . import EnvSpec, Pool

CLIP = 10.0
EPSILON = 1e-8
"""Added to the variance before its square root (gymnasium's ``epsilon``)."""
START_COUNT = 1e-4
"""The count the moments start with (gymnasium's ``RunningMeanStd(epsilon=1e-4)``): mean 0, variance 1."""


class Moments(NamedTuple):
    """Running mean, variance and count (Chan et al.'s parallel update, as gymnasium's ``RunningMeanStd``)."""

    mean: Float[Array, "N ..."]
    var: Float[Array, "N ..."]
    count: Float[Array, " N"]


class NormalizedHandle(NamedTuple):
    """The inner pool's handle, the observations' moments, the discounted returns' moments and each env's
    discounted return so far."""

    inner: Any
    obs: Moments
    returns: Moments
    discounted: Float[Array, " N"]


def fresh_moments(num_envs: int, shape: tuple[int, ...]) -> Moments:
    return Moments(
        jnp.zeros((num_envs, *shape), jnp.float32),
        jnp.ones((num_envs, *shape), jnp.float32),
        jnp.full((num_envs,), START_COUNT, jnp.float32),
    )


def updated(moments: Moments, batch: Float[Array, "N ..."]) -> Moments:
    """The moments after ``batch`` (one row per env), copied back to every env."""
    mean, var, count = moments.mean[0], moments.var[0], moments.count[0]
    n = batch.shape[0]
    batch_mean, batch_var = jnp.mean(batch, axis=0), jnp.var(batch, axis=0)
    delta = batch_mean - mean
    total = count + n
    new_mean = mean + delta * n / total
    new_var = (var * count + batch_var * n + delta * delta * count * n / total) / total
    rows = (n,)
    return Moments(
        jnp.broadcast_to(new_mean, rows + new_mean.shape),
        jnp.broadcast_to(new_var, rows + new_var.shape),
        jnp.broadcast_to(total, rows),
    )


def _scaled_obs(moments: Moments, obs: Float[Array, "N D"]) -> Float[Array, "N D"]:
    return jnp.clip((obs - moments.mean) / jnp.sqrt(moments.var + EPSILON), -CLIP, CLIP)


def updated_blocks(moments: Moments, batch: Float[Array, "N ..."], blocks: int) -> Moments:
    """``updated`` for each of ``blocks`` consecutive blocks of envs (agents) on its own."""
    if blocks == 1:
        return updated(moments, batch)
    split = jax.tree.map(lambda x: x.reshape(blocks, -1, *x.shape[1:]), (moments, batch))
    joined = jax.vmap(updated)(*split)
    return jax.tree.map(lambda x: x.reshape(-1, *x.shape[2:]), joined)


def observed(
    moments: Moments, obs: Float[Array, "N D"], *, learn: bool = True, blocks: int = 1
) -> tuple[Moments, Float[Array, "N D"]]:
    """One step's observations added to ``moments`` (where ``learn``; each of ``blocks`` blocks of envs on its
    own), then scaled by them and clipped."""
    if learn:
        moments = updated_blocks(moments, obs, blocks)
    return moments, _scaled_obs(moments, obs)


def scaled_rewards(
    moments: Moments,
    discounted: Float[Array, " N"],
    reward: Float[Array, " N"],
    terminated: Bool[Array, " N"],
    *,
    gamma: float,
    learn: bool = True,
    blocks: int = 1,
) -> tuple[Moments, Float[Array, " N"], Float[Array, " N"]]:
    """One step's rewards added to each env's discounted return (restarted after a terminal state), the returns
    added to ``moments`` (where ``learn``), and the rewards divided by their standard deviation and clipped."""
    discounted = discounted * gamma * (1.0 - terminated.astype(jnp.float32)) + reward
    if learn:
        moments = updated_blocks(moments, discounted, blocks)
    return moments, discounted, jnp.clip(reward / jnp.sqrt(moments.var + EPSILON), -CLIP, CLIP)


def start_statistics(
    first_obs: Any,
    *,
    obs: bool = True,
    num_agents: int = 1,
    frozen: NormalizedHandle | None = None,
    start: NormalizedHandle | None = None,
) -> tuple[NormalizedHandle, Array]:
    """The statistics a pool of new envs starts with (its handle, with a placeholder for the inner one) and its
    first observations, scaled where ``obs``: fresh ones that count those observations, ``frozen``'s env 0's, or
    ``start``'s going on (see ``normalize_pool``)."""
    first = jnp.asarray(first_obs, jnp.float32)
    num_envs = first.shape[0]
    obs_moments, returns_moments = fresh_moments(num_envs, first.shape[1:]), fresh_moments(num_envs, ())
    if frozen is not None:
        obs_moments, returns_moments = _copied(frozen.obs, num_envs), _copied(frozen.returns, num_envs)
    elif start is not None:
        obs_moments, returns_moments = start.obs, start.returns
    placeholder = jnp.zeros((), jnp.int32)
    handle = NormalizedHandle(placeholder, obs_moments, returns_moments, jnp.zeros((num_envs,), jnp.float32))
    if not obs:
        return handle, first
    learn = frozen is None and start is None
    obs_moments, scaled = observed(obs_moments, first, learn=learn, blocks=num_agents)
    return handle._replace(obs=obs_moments), scaled


def normalize_pool(
    pool: Pool,
    *,
    gamma: float,
    obs: bool = True,
    reward: bool = True,
    num_agents: int = 1,
    shared: bool = False,
    frozen: NormalizedHandle | None = None,
    start: NormalizedHandle | None = None,
) -> Pool:
    """``pool`` with its observations (``obs``) and rewards (``reward``) normalised as CleanRL's wrappers do, each of
    its ``num_agents`` agents' envs (consecutive blocks) with statistics of their own. ``shared``: the agents step
    the pool together (a host pool, ``agents_env_step``), so each step updates each block; otherwise each agent's
    envs are split off and stepped alone (``jax_env_collector``). With ``frozen`` (a trained run's handle), by the
    statistics of its env 0, never updated; with ``start`` (a checkpoint's), the statistics go on from its (the
    first observations of these new envs are not added: a run's envs are made again at every checkpoint, and a
    resumed run must count what the uninterrupted one counts)."""
    handle, first_obs = start_statistics(pool.first_obs, obs=obs, num_agents=num_agents, frozen=frozen, start=start)
    handle = handle._replace(inner=pool.handle)
    learn, blocks = frozen is None, num_agents if shared else 1

    def step(handle: NormalizedHandle, actions: Array) -> tuple[NormalizedHandle, EnvOutput]:
        inner, out = pool.step(handle.inner, actions)
        obs_moments, returns_moments, discounted = handle.obs, handle.returns, handle.discounted
        new_obs, final_obs, rewards = out.obs, out.final_obs, out.reward
        if obs:
            obs_moments, new_obs = observed(obs_moments, out.obs, learn=learn, blocks=blocks)
            final_obs = _scaled_obs(obs_moments, out.final_obs)
        if reward:
            terminated = out.done & ~out.truncated
            returns_moments, discounted, rewards = scaled_rewards(
                returns_moments, discounted, out.reward, terminated, gamma=gamma, learn=learn, blocks=blocks
            )
        out = out._replace(obs=new_obs, final_obs=final_obs, reward=rewards)
        return NormalizedHandle(inner, obs_moments, returns_moments, discounted), out

    return pool._replace(handle=handle, step=step, first_obs=first_obs)


def check_normalizable(normalize_obs: bool, normalize_reward: bool, spec: EnvSpec, async_batch_size: int = 0) -> None:
    """ConfigError unless a pool of ``spec``'s envs can be normalised: vector observations (frames and grids are
    not), stepped synchronously."""
    names = [n for n, on in (("normalize_obs", normalize_obs), ("normalize_reward", normalize_reward)) if on]
    if not names:
        return
    if spec.kind != "vector":
        raise ConfigError(
            f"{names[0]}=True with {spec.env_id}'s {spec.kind} observations; allowed: tasks with vector observations "
            f"(continuous control), or {names[0]}=False"
        )
    if async_batch_size:
        raise ConfigError(f"{names[0]}=True with async_batch_size={async_batch_size}; allowed: async_batch_size=0")


def kept(carry: Any) -> Any:
    """What a checkpoint keeps of a host pool's carry whose handle is normalised: the statistics, without the
    envs (a placeholder for the inner handle and the observations), beside the episode statistics."""
    handle: NormalizedHandle = carry.handle
    return carry._replace(handle=handle._replace(inner=jnp.zeros((), jnp.int32)), obs=jnp.zeros((), jnp.float32))


def _copied(moments: Moments, num_envs: int) -> Moments:
    """The moments of env 0 (of agent 0, where a run's handle is split into agents), for ``num_envs`` envs."""
    first = (0,) * moments.count.ndim
    return Moments(*(jnp.broadcast_to(x[first], (num_envs, *x[first].shape)) for x in moments))
