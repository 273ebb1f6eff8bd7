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

import functools
from collections.abc import Sequence

import gymnax
import jax

from ...errors import ConfigError
from . import BACKEND_THREADS, AsyncPool, EnvSpec, EnvThreads, Pool
from .jax_env import JaxEnv

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
