"""The only module that imports envpool: make_env -> (spec, handle, env_step, first observation), and
make_async_env for EnvPool's async mode (recv/send)."""

import contextlib
import functools
import warnings
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import custom_batching
from jaxtyping import Array, Int

from ._types import EnvOutput
from .config import ConfigError, PPOConfig

EnvStep = Callable[[Any, Int[Array, " N"]], tuple[Any, EnvOutput]]
"""``env_step(handle, actions) -> (handle, EnvOutput)``: pure, jittable, the handle threaded through."""


class EnvSpec(NamedTuple):
    env_id: str
    obs_shape: tuple[int, ...]
    obs_dtype: np.dtype
    num_actions: int
    is_atari: bool


@functools.cache
def _all_env_ids() -> frozenset[str]:
    import envpool

    return frozenset(envpool.list_all_envs())


def check_env_id(env_id: str) -> None:
    """Raise ConfigError unless EnvPool knows ``env_id``."""
    if env_id not in _all_env_ids():
        close = sorted(name for name in _all_env_ids() if name.split("-")[0].lower() == env_id.split("-")[0].lower())
        hint = f"; did you mean {', '.join(close)}?" if close else "; see envpool.list_all_envs()"
        raise ConfigError(f"env_id={env_id!r} is not an EnvPool task{hint}")


def is_atari(env_id: str) -> bool:
    """Atari tasks are those with frame stacking and episodic lives (every ``*-v5`` game)."""
    check_env_id(env_id)
    import envpool

    with _quiet_gymnasium():
        config = envpool.make_spec(env_id).config
    return hasattr(config, "episodic_life")


@contextlib.contextmanager
def _quiet_gymnasium() -> Iterator[None]:
    """gymnasium warns each time it builds a Box from EnvPool's float64 bounds; the cast is harmless."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*precision lowered by casting", category=UserWarning)
        yield


def _make_pool(
    env_id: str, num_envs: int, seed: int, env_seed: list[int] | None, render: bool, batch_size: int | None = None
) -> Any:
    import envpool

    kwargs: dict[str, Any] = {"env_type": "gymnasium", "num_envs": num_envs, "seed": seed}
    if batch_size is not None:
        kwargs["batch_size"] = batch_size
    if env_seed is not None:
        kwargs["env_seed"] = env_seed
    if render:
        kwargs["render_mode"] = "rgb_array"
    if is_atari(env_id):
        # CleanRL's make_env: a lost life ends the learning episode and rewards are clipped to their sign.
        kwargs.update(episodic_life=True, reward_clip=True)
    with _quiet_gymnasium():
        return envpool.make(env_id, **kwargs)


def env_spec(env_id: str) -> EnvSpec:
    """Observation shape and dtype and number of actions of ``env_id``, without making an env."""
    import envpool

    check_env_id(env_id)
    with _quiet_gymnasium():
        spec = envpool.make_spec(env_id)
        space, observation_space = spec.action_space, spec.observation_space
    if not hasattr(space, "n"):
        raise ConfigError(f"env_id={env_id!r} has a continuous action space; ppo_eqx needs discrete actions")
    shape, dtype = tuple(observation_space.shape), np.dtype(observation_space.dtype)
    return EnvSpec(env_id, shape, dtype, int(space.n), is_atari(env_id))


def make_env(
    config: PPOConfig, *, env_seed: list[int] | None = None, render: bool = False
) -> tuple[EnvSpec, Any, EnvStep, Any, np.ndarray]:
    """Make ``config.num_envs`` envs of ``config.env_id`` and reset them.

    Returns ``(spec, handle, env_step, pool, first_obs)``; ``pool`` must stay alive while ``handle`` is used,
    and a function traced with ``env_step`` steps this ``pool`` whatever handle it is given (EnvPool bakes the
    pool's address into the XLA call): new envs need a new trace.
    ``env_seed`` gives every env its own seed (EnvPool's ``env_seed``), otherwise env i gets ``seed + i``.
    ``render`` makes ``pool.render(env_ids=i)`` return env i's screen (``[1, H, W, 3]`` uint8).
    """
    check_env_id(config.env_id)
    pool = _make_pool(config.env_id, config.num_envs, config.seed, env_seed, render)
    spec = _pool_spec(config.env_id, pool)
    handle, _recv, _send, xla_step = pool.xla()
    first_obs, _ = pool.reset()

    def env_step(handle: Any, actions: Int[Array, " N"]) -> tuple[Any, EnvOutput]:
        handle, timestep = xla_step(handle, actions)
        return handle, _env_output(timestep, spec.is_atari)

    return spec, handle, env_step, pool, first_obs


def _pool_spec(env_id: str, pool: Any) -> EnvSpec:
    with _quiet_gymnasium():
        space, observation_space = pool.action_space, pool.observation_space
    if not hasattr(space, "n"):
        raise ConfigError(f"env_id={env_id!r} has a continuous action space; ppo_eqx needs discrete actions")
    shape, dtype = tuple(observation_space.shape), np.dtype(observation_space.dtype)
    return EnvSpec(env_id, shape, dtype, int(space.n), is_atari(env_id))


def _env_output(timestep: tuple[Any, ...], atari: bool) -> EnvOutput:
    """EnvPool's gymnasium ``(obs, reward, terminated, truncated, info)`` as an EnvOutput."""
    obs, reward, terminated, truncated, info = timestep
    done = jnp.logical_or(terminated, truncated)
    if atari:
        # info["terminated"] is the game over (all lives spent); info["reward"] the unclipped score.
        game_over = jnp.logical_or(info["terminated"].astype(bool), truncated)
        raw_reward = info["reward"].astype(jnp.float32)
    else:
        game_over, raw_reward = done, reward.astype(jnp.float32)
    return EnvOutput(obs, reward.astype(jnp.float32), done, raw_reward, game_over)


EnvRecv = Callable[[Any], tuple[Any, Int[Array, " R"], EnvOutput]]
"""``recv(handle) -> (handle, env_ids, EnvOutput)``: the next ``R`` envs to finish a step, in no fixed order."""
EnvSend = Callable[[Any, Int[Array, " R"], Int[Array, " R"]], Any]
"""``send(handle, env_ids, actions) -> handle``: start a step of each of the envs ``env_ids``."""


class AsyncEnv(NamedTuple):
    """EnvPool's async mode as two pure, jittable calls, the handle threaded through both.

    Every env has one step under way at any time (a reset, at first): ``recv`` waits for ``R`` of them to
    finish and ``send`` starts the next step of exactly those. The outputs of an env's first ``recv`` after
    the pool was made are its reset (reward 0, not done).
    """

    recv: EnvRecv
    send: EnvSend


def make_async_env(config: PPOConfig, *, env_seed: list[int] | None = None) -> tuple[EnvSpec, Any, AsyncEnv, Any]:
    """Make an async pool of ``config.num_envs`` envs that ``recv`` returns ``config.async_batch_size`` at a time.

    Returns ``(spec, handle, env, pool)`` with every env's reset under way (EnvPool's ``async_reset``); the
    pool is bound into the traced calls as in ``make_env``, and must stay alive while ``handle`` is used.
    Which envs a ``recv`` returns depends on EnvPool's threads: runs are not bit-reproducible.
    """
    check_env_id(config.env_id)
    pool = _make_pool(
        config.env_id, config.num_envs, config.seed, env_seed, render=False, batch_size=config.async_batch_size
    )
    spec = _pool_spec(config.env_id, pool)
    handle, xla_recv, xla_send, _step = pool.xla()
    pool.async_reset()

    def recv(handle: Any) -> tuple[Any, Int[Array, " R"], EnvOutput]:
        handle, timestep = xla_recv(handle)
        return handle, timestep[-1]["env_id"].astype(jnp.int32), _env_output(timestep, spec.is_atari)

    def send(handle: Any, env_ids: Int[Array, " R"], actions: Int[Array, " R"]) -> Any:
        return xla_send(handle, actions, env_ids)

    return spec, handle, AsyncEnv(recv, send), pool


def seeds_env_step(env_step: EnvStep, num_seeds: int) -> EnvStep:
    """``env_step`` of a pool of ``S * N`` envs made vmappable over ``S`` agents of ``N`` envs each.

    EnvPool's XLA call has no batching rule, so ``jax.vmap`` cannot step it. Under ``vmap`` over a leading
    ``S`` axis of actions (``[S, N]``) this steps the whole pool once with the actions flattened to ``[S*N]``
    (agent s drives envs ``s*N .. s*N + N - 1``) and returns the outputs reshaped to ``[S, N, ...]``; the handle
    stays unbatched, as there is one pool. Called without ``vmap`` (as JAX does once to learn the output
    shapes), all agents take the same ``[N]`` actions and agent 0's outputs are returned.
    """

    @custom_batching.custom_vmap
    def step(handle: Any, actions: Int[Array, " N"]) -> tuple[Any, EnvOutput]:
        handle, out = env_step(handle, jnp.tile(actions, num_seeds))
        return handle, jax.tree.map(lambda x: x[: actions.shape[0]], out)

    @step.def_vmap
    def step_agents(
        axis_size: int, in_batched: list[Any], handle: Any, actions: Int[Array, "S N"]
    ) -> tuple[tuple[Any, EnvOutput], tuple[Any, Any]]:
        handle_batched, actions_batched = in_batched
        if axis_size != num_seeds or any(jax.tree.leaves(handle_batched)):
            raise ValueError(f"vmap this env step over its {num_seeds} agents only, with one unbatched handle")
        if not actions_batched:
            actions = jnp.broadcast_to(actions, (num_seeds, *actions.shape))
        handle, out = env_step(handle, actions.reshape(-1))
        out = jax.tree.map(lambda x: x.reshape((num_seeds, -1) + x.shape[1:]), out)
        return (handle, out), (jax.tree.map(lambda _: False, handle), jax.tree.map(lambda _: True, out))

    return step
