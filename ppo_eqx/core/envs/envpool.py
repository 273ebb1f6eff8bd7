"""EnvPool as an env backend: the only module that imports envpool.

Atari tasks get CleanRL's settings (``make_env`` of ``ppo_atari_envpool_xla_jax.py``): a lost life ends the
learning episode (``episodic_life``) and rewards are clipped to their sign (``reward_clip``); the raw score and
the game over come from the step's info. EnvPool's XLA call is bound at trace time to the pool it came from.
"""

import contextlib
import functools
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import envpool
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Int

from ...errors import ConfigError
from .._types import EnvOutput
from . import BACKEND_THREADS, AsyncEnv, AsyncPool, EnvSpec, EnvThreads, Pool


@contextlib.contextmanager
def _quiet_gymnasium() -> Iterator[None]:
    """gymnasium warns each time it builds a Box from EnvPool's float64 bounds; the cast is harmless."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*precision lowered by casting", category=UserWarning)
        yield


@functools.cache
def _all_env_ids() -> frozenset[str]:
    return frozenset(envpool.list_all_envs())


@functools.cache
def _spec(env_id: str) -> EnvSpec:
    if not isinstance(env_id, str) or env_id not in _all_env_ids():
        close = sorted(
            name for name in _all_env_ids() if name.split("-")[0].lower() == str(env_id).split("-")[0].lower()
        )
        hint = f"; did you mean {', '.join(close)}?" if close else "; see envpool.list_all_envs()"
        raise ConfigError(f"env_id={env_id!r} is not an EnvPool task{hint}")
    with _quiet_gymnasium():
        spec = envpool.make_spec(env_id)
        space, observation_space = spec.action_space, spec.observation_space
    if not hasattr(space, "n"):
        raise ConfigError(
            f"env_id={env_id!r} has continuous actions, which EnvPool's backend does not step yet (its MuJoCo tasks "
            "are float64); allowed: EnvPool's discrete tasks, or continuous ones written in JAX: --env-backend "
            "gymnax --env-id Pendulum-v1, or an env of yours (--env-id MODULE:CALLABLE)"
        )
    shape, dtype = tuple(observation_space.shape), np.dtype(observation_space.dtype)
    # Atari tasks are those with episodic lives (every ``*-v5`` game).
    kind = "frames" if hasattr(spec.config, "episodic_life") else "vector"
    return EnvSpec(env_id, shape, dtype, int(space.n), kind)


def _make(env_id: str, seeds: Sequence[int], threads: EnvThreads, **kwargs: Any) -> Any:
    spec = _spec(env_id)
    kwargs.update(env_type="gymnasium", num_envs=len(seeds), seed=int(seeds[0]), env_seed=[int(s) for s in seeds])
    kwargs.update(num_threads=threads.count, thread_affinity_offset=threads.first_core)
    if spec.kind == "frames":
        kwargs.update(episodic_life=True, reward_clip=True)
    with _quiet_gymnasium():
        pool = envpool.make(env_id, **kwargs)
        # The spaces are built (and warned about) once, here: the traced XLA calls read them too.
        _ = pool.observation_space, pool.action_space
    return pool


def _env_output(timestep: tuple[Any, ...], atari: bool) -> EnvOutput:
    """EnvPool's gymnasium ``(obs, reward, terminated, truncated, info)`` as an EnvOutput. EnvPool resets an env on
    the step after its episode ends, so the observation that ends one is its final one."""
    obs, reward, terminated, truncated, info = timestep
    done = jnp.logical_or(terminated, truncated)
    if atari:
        # info["terminated"] is the game over (all lives spent); info["reward"] the unclipped score.
        game_over = jnp.logical_or(info["terminated"].astype(bool), truncated)
        raw_reward = info["reward"].astype(jnp.float32)
    else:
        game_over, raw_reward = done, reward.astype(jnp.float32)
    time_limit = jnp.logical_and(truncated, jnp.logical_not(terminated))
    return EnvOutput(obs, reward.astype(jnp.float32), done, raw_reward, game_over, time_limit, obs)


class EnvPoolBackend:
    """``EnvBackend`` on EnvPool (synchronous pools, and EnvPool's async mode)."""

    name = "envpool"
    rebinds = False
    has_async = True
    state_is_data = False

    def spec(self, env_id: str) -> EnvSpec:
        return _spec(env_id)

    def make(
        self, env_id: str, seeds: Sequence[int], *, render: bool = False, threads: EnvThreads = BACKEND_THREADS
    ) -> Pool:
        pool = _make(env_id, seeds, threads, **({"render_mode": "rgb_array"} if render else {}))
        spec = _spec(env_id)
        with _quiet_gymnasium():
            handle, _recv, _send, xla_step = pool.xla()
            first_obs, _ = pool.reset()

        def step(handle: Any, actions: Int[Array, " N"]) -> tuple[Any, EnvOutput]:
            handle, timestep = xla_step(handle, actions)
            return handle, _env_output(timestep, spec.kind == "frames")

        return Pool(spec, jnp.asarray(handle), step, first_obs, pool.close, lambda i: pool.render(env_ids=i)[0])

    def make_async(
        self, env_id: str, seeds: Sequence[int], batch_size: int, *, threads: EnvThreads = BACKEND_THREADS
    ) -> AsyncPool:
        pool = _make(env_id, seeds, threads, batch_size=batch_size)
        spec = _spec(env_id)
        with _quiet_gymnasium():
            handle, xla_recv, xla_send, _step = pool.xla()
            pool.async_reset()

        def recv(handle: Any) -> tuple[Any, Int[Array, " R"], EnvOutput]:
            handle, timestep = xla_recv(handle)
            return handle, timestep[-1]["env_id"].astype(jnp.int32), _env_output(timestep, spec.kind == "frames")

        def send(handle: Any, env_ids: Int[Array, " R"], actions: Int[Array, " R"]) -> Any:
            return xla_send(handle, actions, env_ids)

        return AsyncPool(spec, jnp.asarray(handle), AsyncEnv(recv, send), pool.close)


BACKEND = EnvPoolBackend()
