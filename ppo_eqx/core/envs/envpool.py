"""EnvPool as an env backend: the only module that imports envpool.

Atari tasks get CleanRL's settings (``make_env`` of ``ppo_atari_envpool_xla_jax.py``): a lost life ends the
learning episode (``episodic_life``) and rewards are clipped to their sign (``reward_clip``); the raw score and
the game over come from the step's info. EnvPool's XLA call is bound at trace time to the pool it came from.
"""

import contextlib
import functools
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import envpool
import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import io_callback
from jaxtyping import Array, Int

from ...errors import ConfigError
from .._types import EnvOutput
from . import BACKEND_THREADS, AsyncEnv, AsyncPool, EnvSpec, EnvThreads, HostPool, Pool


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
        return _continuous_spec(env_id, space, observation_space)
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


def _env_output(timestep: tuple[Any, ...], atari: bool, xp: Any = jnp) -> EnvOutput:
    """EnvPool's gymnasium ``(obs, reward, terminated, truncated, info)`` as an EnvOutput, computed with ``xp``
    (``jax.numpy`` in the program, NumPy on the host). EnvPool resets an env on the step after its episode ends,
    so the observation that ends one is its final one."""
    obs, reward, terminated, truncated, info = timestep
    done = xp.logical_or(terminated, truncated)
    if atari:
        # info["terminated"] is the game over (all lives spent); info["reward"] the unclipped score.
        game_over = xp.logical_or(info["terminated"].astype(bool), truncated)
        raw_reward = info["reward"].astype(xp.float32)
    else:
        game_over, raw_reward = done, reward.astype(xp.float32)
    time_limit = xp.logical_and(truncated, xp.logical_not(terminated))
    return EnvOutput(obs, reward.astype(xp.float32), done, raw_reward, game_over, time_limit, obs)


def _continuous_spec(env_id: str, space: Any, observation_space: Any) -> EnvSpec:
    """A task with a box of actions (MuJoCo's): float64 observations and actions, which the pool steps through
    EnvPool's host API (``_host_step``), its observations float32 in the program."""
    shape = tuple(getattr(observation_space, "shape", None) or ())  # dm_control's observations: a dict, no shape
    low, high = np.asarray(space.low, np.float64).ravel(), np.asarray(space.high, np.float64).ravel()
    if len(shape) != 1 or len(tuple(space.shape)) != 1 or not (np.isfinite(low).all() and np.isfinite(high).all()):
        observed = shape or type(observation_space).__name__
        raise ConfigError(
            f"env_id={env_id!r} has observations {observed} and actions {space}; allowed: continuous tasks with "
            "flat observations and bounded actions (EnvPool's MuJoCo gym tasks)"
        )
    bounds = (tuple(float(x) for x in low), tuple(float(x) for x in high))
    return EnvSpec(env_id, shape, np.dtype(np.float32), int(low.size), "vector", None, bounds)


def _box_actions(spec: EnvSpec) -> Callable[[Any], np.ndarray]:
    """A continuous task's actions as its pool takes them: clipped to the bounds (CleanRL's ``ClipAction``), float64."""
    assert spec.action_bounds is not None
    low, high = (np.asarray(b, np.float64) for b in spec.action_bounds)
    return lambda actions: np.clip(np.asarray(actions, np.float64), low, high)  # a jax.Array or a NumPy array


def _box_step(timestep: tuple[Any, ...]) -> tuple[np.ndarray, ...]:
    """A continuous pool's step as the program takes it: observations and rewards float32, terminated and truncated
    bools."""
    obs, reward, terminated, truncated, _ = timestep
    return obs.astype(np.float32), reward.astype(np.float32), terminated.astype(bool), truncated.astype(bool)


def _host_step(pool: Any, spec: EnvSpec) -> Callable[[Any, Array], tuple[Any, EnvOutput]]:
    """A step of a continuous pool as a call out of the program to EnvPool's host API, in order (``_box_actions``,
    ``_box_step``). No XLA buffer of EnvPool's is made, so no float64 can be written into a float32 one."""
    num_envs = pool.config["num_envs"]
    shapes = (
        jax.ShapeDtypeStruct((num_envs, *spec.obs_shape), jnp.float32),
        jax.ShapeDtypeStruct((num_envs,), jnp.float32),
        jax.ShapeDtypeStruct((num_envs,), jnp.bool_),
        jax.ShapeDtypeStruct((num_envs,), jnp.bool_),
    )
    actions_of = _box_actions(spec)

    def on_host(actions: Any) -> tuple[np.ndarray, ...]:
        return _box_step(pool.step(actions_of(actions)))

    def step(handle: Any, actions: Array) -> tuple[Any, EnvOutput]:
        obs, reward, terminated, truncated = io_callback(on_host, shapes, actions, ordered=True)
        return handle, _env_output((obs, reward, terminated, truncated, {}), False)

    return step


def _raw_calls(pool: Any, atari: bool) -> tuple[Callable[[np.ndarray], None], Callable[[], tuple]] | None:
    """EnvPool's C++ ``send`` and ``recv`` of a synchronous pool without its Python wrapper, which rebuilds its
    config as a dict and infers the players' env ids on every call (about 60 us of a MuJoCo step's 160): the same
    arrays, in and out, as its public ``send(actions)`` and gymnasium ``recv()``. They are EnvPool's private names,
    checked here; where one is missing or other than this version's, None (the public calls then)."""
    try:
        state_keys, action_keys = list(pool._state_keys), list(pool._action_keys)
        c_send, c_recv, action_type = pool._send, pool._recv, pool._spec._action_spec[-1][0]
        players = pool.config.get("max_num_players", 1)
    except (AttributeError, IndexError, TypeError):
        return None
    needed = ["obs", "reward", "done", "trunc"] + (["info:terminated", "info:reward"] if atari else [])
    if action_keys != ["env_id", "players.env_id", "action"] or players != 1 or not set(needed) <= set(state_keys):
        return None
    obs, reward, done, trunc, *info = (state_keys.index(k) for k in needed)
    # A task whose state says ``terminated`` (EnvPool 1.2.7 reads it: a terminal state on a time limit's step too).
    terminal = state_keys.index("terminated") if "terminated" in state_keys else None
    env_ids = np.arange(pool.config["num_envs"], dtype=np.int32)

    def send(actions: np.ndarray) -> None:
        c_send([env_ids, env_ids, np.asarray(actions).astype(action_type, order="C")])

    def recv() -> tuple:
        state = c_recv()
        ended = state[done] & ~state[trunc] if terminal is None else state[terminal]
        infos = {"terminated": state[info[0]], "reward": state[info[1]]} if atari else {}
        return state[obs], state[reward], ended, state[trunc], infos

    return send, recv


class EnvPoolBackend:
    """``EnvBackend`` on EnvPool (synchronous pools, and EnvPool's async mode)."""

    name = "envpool"
    rebinds = False
    has_async = True
    state_is_data = False
    compiles_on = ("cpu", "gpu")
    """The platforms whose programs can hold EnvPool's XLA step: a call registered for the CPU and CUDA alone."""

    def spec(self, env_id: str) -> EnvSpec:
        return _spec(env_id)

    def make(
        self, env_id: str, seeds: Sequence[int], *, render: bool = False, threads: EnvThreads = BACKEND_THREADS
    ) -> Pool:
        pool = _make(env_id, seeds, threads, **({"render_mode": "rgb_array"} if render else {}))
        spec = _spec(env_id)
        if spec.continuous:
            with _quiet_gymnasium():
                first_obs, _ = pool.reset()
            render_env = lambda i: pool.render(env_ids=i)[0]  # noqa: E731
            handle = jnp.zeros((), jnp.int32)
            return Pool(spec, handle, _host_step(pool, spec), first_obs.astype(np.float32), pool.close, render_env)
        with _quiet_gymnasium():
            handle, _recv, _send, xla_step = pool.xla()
            first_obs, _ = pool.reset()

        def step(handle: Any, actions: Int[Array, " N"]) -> tuple[Any, EnvOutput]:
            handle, timestep = xla_step(handle, actions)
            return handle, _env_output(timestep, spec.kind == "frames")

        return Pool(spec, jnp.asarray(handle), step, first_obs, pool.close, lambda i: pool.render(env_ids=i)[0])

    def make_host(self, env_id: str, seeds: Sequence[int], *, threads: EnvThreads = BACKEND_THREADS) -> HostPool:
        """The envs of ``make``, stepped from the host through EnvPool's host API (``send``, then ``recv``); a
        continuous task's actions clipped and made float64 on the way in, its observations float32 on the way out."""
        spec = _spec(env_id)
        pool = _make(env_id, seeds, threads)
        atari = spec.kind == "frames"
        with _quiet_gymnasium():
            first_obs, _ = pool.reset()
        actions_of: Callable[[np.ndarray], np.ndarray] = _box_actions(spec) if spec.continuous else np.asarray
        if spec.continuous:
            first_obs = first_obs.astype(np.float32)

        raw = _raw_calls(pool, atari)
        send_step, recv_step = raw if raw is not None else (pool.send, pool.recv)

        def send(actions: np.ndarray) -> None:
            send_step(actions_of(actions))

        def recv() -> EnvOutput:
            timestep = recv_step()
            return _env_output((*_box_step(timestep), {}) if spec.continuous else timestep, atari, np)

        return HostPool(spec, first_obs, send, recv, pool.close)

    def make_async(
        self, env_id: str, seeds: Sequence[int], batch_size: int, *, threads: EnvThreads = BACKEND_THREADS
    ) -> AsyncPool:
        spec = _spec(env_id)
        if spec.continuous:
            raise ConfigError(f"async_batch_size={batch_size} with {env_id}'s continuous actions; allowed: 0")
        pool = _make(env_id, seeds, threads, batch_size=batch_size)
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
