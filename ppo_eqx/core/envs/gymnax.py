"""gymnax's envs, written in JAX, as an env backend: the only module that imports gymnax.

A pool's handle is the envs' whole state as arrays (``GymnaxHandle``: gymnax's state and one PRNG key per env),
so the step is a plain pure function: the handle can be ``vmap``-ed per agent, saved in a checkpoint and restored
bit for bit, and the envs live for the whole run (``state_is_data``).

gymnax (1.0) draws an env's randomness from the key each call is given, not from its state: env i's key starts as
``PRNGKey(seeds[i])`` and is split at every step, one half carried on, the other given to gymnax's step (which
splits it again for its own step and the reset it computes beside it). gymnax resets an env inside the step that
ends its episode: the observation returned is the next episode's first, and ``info["final_observation"]`` the
one the episode ended on (``EnvOutput.final_obs``). A step can be both terminated and truncated (a terminal
state on the last allowed step): that is a termination. There are no lives and no reward clipping, so the
learning episode is the reported one and ``reward`` the game's score.
"""

import contextlib
import functools
import importlib.util
import sys
import types
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Int, PyTree, UInt32

from ...errors import ConfigError
from .._types import EnvOutput, ObsKind
from . import BACKEND_THREADS, AsyncPool, EnvSpec, EnvThreads, Pool

PLOTTING = ("seaborn", "matplotlib.pyplot")
"""What gymnax imports at its own import, for rendering two envs this backend never trains (Pong, Catch): a second
of a short run's start (seaborn brings scipy.stats and pandas). Imported on first use instead."""


class _OnFirstUse(types.ModuleType):
    """A module not imported yet: its first attribute asked for imports it (and puts it in ``sys.modules``), for
    whoever asks, gymnax's renderers or anyone after; those holding this stand-in are forwarded."""

    def __getattr__(self, attribute: str) -> Any:
        real = self.__dict__.get("_real")
        if real is None:
            if sys.modules.get(self.__name__) is self:
                del sys.modules[self.__name__]
            real = self.__dict__["_real"] = importlib.import_module(self.__name__)
        return getattr(real, attribute)


@contextlib.contextmanager
def _plotting_on_first_use() -> Iterator[None]:
    """While gymnax is imported, ``PLOTTING``'s modules not imported yet are stand-ins (``_OnFirstUse``)."""
    for name in PLOTTING:
        if name not in sys.modules and importlib.util.find_spec(name.split(".")[0]) is not None:
            sys.modules[name] = _OnFirstUse(name)
    yield


with _plotting_on_first_use():
    import gymnax

SUPPORTED = (
    "CartPole-v1",
    "Acrobot-v1",
    "Breakout-MinAtar",
    "SpaceInvaders-MinAtar",
    "Asterix-MinAtar",
    "Freeway-MinAtar",
)
"""The gymnax ids this backend trains: classic control with discrete actions, and MinAtar (no sticky actions,
gymnax's minimal action sets and time limits: 500 steps, 1000 for MinAtar, 2500 for Freeway, which never ends
otherwise)."""


class GymnaxHandle(NamedTuple):
    """The envs' state as data: gymnax's state (every leaf ``[N, ...]``, strongly typed) and each env's key."""

    state: PyTree
    keys: UInt32[Array, "N 2"]


@functools.cache
def _env(env_id: str) -> tuple[Any, Any]:
    if not isinstance(env_id, str) or env_id not in SUPPORTED:
        allowed = ", ".join(SUPPORTED)
        raise ConfigError(f"env_id={env_id!r} is not a gymnax task this backend trains; allowed: {allowed}")
    with jax.ensure_compile_time_eval():  # the arrays gymnax makes with an env are values, even inside a trace
        return gymnax.make(env_id)


@functools.cache
def _spec(env_id: str) -> EnvSpec:
    env, params = _env(env_id)
    shape = tuple(env.observation_space(params).shape)
    return EnvSpec(env_id, shape, np.dtype(np.float32), int(env.action_space(params).n), _kind(shape))


def _kind(shape: tuple[int, ...]) -> ObsKind:
    return "vector" if len(shape) == 1 else "grid"


def _strong(tree: PyTree) -> PyTree:
    """``tree`` with every leaf strongly typed. gymnax builds states from Python numbers, which JAX keeps as
    weakly typed leaves; a state read back from a checkpoint is strong, and both must be the same program's input."""
    return jax.tree.map(lambda x: jnp.asarray(x, jnp.asarray(x).dtype), tree)


def env_keys(seeds: Sequence[int] | UInt32[Array, " N"]) -> UInt32[Array, "N 2"]:
    """Env i's key, ``PRNGKey(seeds[i])``."""
    return jax.vmap(jax.random.PRNGKey)(jnp.asarray(seeds, jnp.uint32))


def reset(env_id: str, seeds: Sequence[int] | UInt32[Array, " N"]) -> tuple[GymnaxHandle, Array]:
    """``len(seeds)`` fresh envs of ``env_id``: their handle and first observations. Pure (traceable)."""
    env, params = _env(env_id)
    split = jax.vmap(jax.random.split)(env_keys(seeds))
    obs, state = jax.vmap(env.reset, in_axes=(0, None))(split[:, 1], params)
    return GymnaxHandle(_strong(state), split[:, 0]), obs.astype(jnp.float32)


_reset_program = jax.jit(reset, static_argnums=0)
"""``reset`` as one program (a pool's start compiles it once, where each of its dozen operations would be compiled on
its own), the same bits (``tests/test_gymnax.py``)."""


def make_step(env_id: str):
    """The pure step of ``env_id``'s envs: ``step(handle, actions) -> (handle, EnvOutput)``."""
    env, params = _env(env_id)

    def step(handle: GymnaxHandle, actions: Int[Array, " N"]) -> tuple[GymnaxHandle, EnvOutput]:
        split = jax.vmap(jax.random.split)(handle.keys)  # each env's stream goes on alone
        obs, state, reward, terminated, truncated, info = jax.vmap(env.step, in_axes=(0, 0, 0, None))(
            split[:, 1], handle.state, actions, params
        )
        reward = reward.astype(jnp.float32)
        done = terminated | truncated
        time_limit = truncated & ~terminated
        final_obs = info["final_observation"].astype(jnp.float32)
        out = EnvOutput(obs.astype(jnp.float32), reward, done, reward, done, time_limit, final_obs)
        return GymnaxHandle(_strong(state), split[:, 0]), out

    return step


class GymnaxBackend:
    """``EnvBackend`` on gymnax: synchronous pools whose handle is the envs' state."""

    name = "gymnax"
    rebinds = True
    has_async = False
    state_is_data = True

    def spec(self, env_id: str) -> EnvSpec:
        return _spec(env_id)

    def make(
        self, env_id: str, seeds: Sequence[int], *, render: bool = False, threads: EnvThreads = BACKEND_THREADS
    ) -> Pool:
        if render:
            raise ConfigError("gymnax's envs do not render screens here; allowed for videos: --env-backend envpool")
        handle, first_obs = _reset_program(env_id, jnp.asarray(seeds, jnp.uint32))

        def no_render(i: int) -> np.ndarray:
            raise ConfigError("gymnax's envs do not render screens here")

        return Pool(_spec(env_id), handle, make_step(env_id), first_obs, lambda: None, no_render)

    def make_async(
        self, env_id: str, seeds: Sequence[int], batch_size: int, *, threads: EnvThreads = BACKEND_THREADS
    ) -> AsyncPool:
        raise ConfigError(
            f"async_batch_size={batch_size} is not possible with --env-backend gymnax; allowed: 0 with --env-backend "
            "gymnax"
        )


BACKEND = GymnaxBackend()
