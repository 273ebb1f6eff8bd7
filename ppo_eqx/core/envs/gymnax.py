"""gymnax's envs, written in JAX, as an env backend: the only module that imports gymnax.

Each task is a ``JaxEnv`` (``jax_env.py``: the door any env with gymnax's interface comes through) over
``gymnax.make``'s env and params: a pool's handle is the envs' whole state as arrays, so the step is a plain pure
function, the handle is ``vmap``-ed per agent, saved in a checkpoint and restored bit for bit, and the envs live
for the whole run (``state_is_data``).

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
from typing import Any

import jax

from ...errors import ConfigError
from . import BACKEND_THREADS, AsyncPool, EnvSpec, EnvThreads, Pool
from .jax_env import JaxEnv

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
    "Pendulum-v1",
    "MountainCarContinuous-v0",
)
"""The gymnax ids this backend trains: classic control with discrete actions, MinAtar (no sticky actions,
gymnax's minimal action sets and time limits: 500 steps, 1000 for MinAtar, 2500 for Freeway, which never ends
otherwise), and classic control with continuous actions (a Gaussian policy: ``core.gaussian``)."""


@functools.cache
def jax_env(env_id: str) -> JaxEnv:
    """The ``JaxEnv`` of gymnax's ``env_id`` (one per process): ``gymnax.make``'s env and params."""
    if not isinstance(env_id, str) or env_id not in SUPPORTED:
        allowed = ", ".join(SUPPORTED)
        raise ConfigError(f"env_id={env_id!r} is not a gymnax task this backend trains; allowed: {allowed}")
    with jax.ensure_compile_time_eval():  # the arrays gymnax makes with an env are values, even inside a trace
        env, params = gymnax.make(env_id)
    return JaxEnv(env, params, env_id=env_id, probe=False)


class GymnaxBackend:
    """``EnvBackend`` on gymnax: ``JaxEnv`` over ``gymnax.make`` for the ids in ``SUPPORTED``."""

    name = "gymnax"
    rebinds = True
    has_async = False
    state_is_data = True

    def spec(self, env_id: str) -> EnvSpec:
        return jax_env(env_id).spec()

    def make(
        self, env_id: str, seeds: Sequence[int], *, render: bool = False, threads: EnvThreads = BACKEND_THREADS
    ) -> Pool:
        if render:
            raise ConfigError("gymnax's envs do not render screens here; allowed for videos: --env-backend envpool")
        return jax_env(env_id).make(env_id, seeds, threads=threads)

    def make_async(
        self, env_id: str, seeds: Sequence[int], batch_size: int, *, threads: EnvThreads = BACKEND_THREADS
    ) -> AsyncPool:
        raise ConfigError(
            f"async_batch_size={batch_size} is not possible with --env-backend gymnax; allowed: 0 with --env-backend "
            "gymnax"
        )


BACKEND = GymnaxBackend()
