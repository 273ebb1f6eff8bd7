"""The only module that imports envpool: make_env -> (spec, handle, env_step, first observation)."""

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


def _make_pool(env_id: str, num_envs: int, seed: int, env_seed: list[int] | None, render: bool) -> Any:
    import envpool

    kwargs: dict[str, Any] = {"env_type": "gymnasium", "num_envs": num_envs, "seed": seed}
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
    atari = is_atari(config.env_id)
    with _quiet_gymnasium():
        space, observation_space = pool.action_space, pool.observation_space
    if not hasattr(space, "n"):
        raise ConfigError(f"env_id={config.env_id!r} has a continuous action space; ppo_eqx needs discrete actions")
    spec = EnvSpec(
        config.env_id, tuple(observation_space.shape), np.dtype(observation_space.dtype), int(space.n), atari
    )
    handle, _recv, _send, xla_step = pool.xla()
    first_obs, _ = pool.reset()

    def env_step(handle: Any, actions: Int[Array, " N"]) -> tuple[Any, EnvOutput]:
        handle, (obs, reward, terminated, truncated, info) = xla_step(handle, actions)
        done = jnp.logical_or(terminated, truncated)
        if atari:
            # info["terminated"] is the game over (all lives spent); info["reward"] the unclipped score.
            game_over = jnp.logical_or(info["terminated"].astype(bool), truncated)
            raw_reward = info["reward"].astype(jnp.float32)
        else:
            game_over, raw_reward = done, reward.astype(jnp.float32)
        return handle, EnvOutput(obs, reward.astype(jnp.float32), done, raw_reward, game_over)

    return spec, handle, env_step, pool, first_obs


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
