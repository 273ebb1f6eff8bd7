"""ALE's own vector env (``ale_py.vector_env.AtariVectorEnv``) as an env backend: the only module that imports
ale_py.

The envs are made to play as EnvPool's do under CleanRL's settings (``ppo_eqx.core.envs.envpool``; docs/backends.md
has the table, setting by setting). Two of ALE's settings do not mean what EnvPool's of the same name do:

- ALE's ``episodic_life`` ends the whole game at a lost life (its next step is a full ``reset_game``), so the
  raw score could not be summed over lives. The envs are made with ``episodic_life=False, life_loss_info=True``
  instead: a lost life is ``terminated`` and the game goes on. The game over (EnvPool's ``info["terminated"]``)
  is ``terminated`` without a life lost at that step, worked out from the lives carried in the handle.
- ALE's ``reward_clipping`` leaves no unclipped reward in the step's info, so the envs give raw rewards and the
  learning reward is their sign, as EnvPool's ``reward_clip``.

ALE starts the frame stack of a reset from zeros where EnvPool repeats the first frame four times; the step after
a game over (a reset, in ALE's ``NextStep`` autoreset as in EnvPool) and a new pool's first observation are
given EnvPool's stack. ALE's XLA calls have fixed target names and take the pool's address as data, so a
program traced with one pool drives any other of the same size (``rebinds``).
"""

import functools
from collections.abc import Sequence
from typing import Any, NamedTuple

import ale_py
import ale_py.roms
import chex  # noqa: F401  (AtariVectorEnv.xla() imports it; a missing one is reported by envs.backend)
import jax.numpy as jnp
import numpy as np
from ale_py.vector_env import AtariVectorEnv
from gymnasium.spaces import Discrete
from jaxtyping import Array, Bool, Int, UInt8

from ...errors import ConfigError
from .._types import EnvOutput
from . import BACKEND_THREADS, AsyncPool, EnvSpec, EnvThreads, Pool

SETTINGS: dict[str, Any] = {
    "max_num_frames_per_episode": 108_000,  # EnvPool's max_episode_steps=27000 steps of 4 frames
    "repeat_action_probability": 0.0,
    "full_action_space": False,
    "autoreset_mode": "NextStep",
    "img_height": 84,
    "img_width": 84,
    "grayscale": True,
    "stack_num": 4,
    "frameskip": 4,
    "maxpool": True,
    "noop_max": 30,
    "episodic_life": False,  # ALE's ends the game at a lost life; the life loss comes from life_loss_info
    "life_loss_info": True,
    "reward_clipping": False,  # clipped here, so that the raw score stays
    "use_fire_reset": True,
}
"""AtariVectorEnv's arguments besides the game and the number of envs (the pool is made with these alone)."""


@functools.cache
def games() -> dict[str, str]:
    """``*-v5`` id -> ALE's game name, for every ROM ale_py ships that it can load for one player (EnvPool's
    naming: ``montezuma_revenge`` is ``MontezumaRevenge-v5``). ale_py 0.12.1 ships four that it cannot (Combat,
    Joust, MazeCraze, Warlords: ``isSupportedROM`` is None): making one ends the process in ALE's C++."""
    return {
        "".join(word.capitalize() for word in name.split("_")) + "-v5": name
        for name in ale_py.roms.get_all_rom_ids()
        if ale_py.ALEInterface.isSupportedROM(str(ale_py.roms.get_rom_path(name))) is not None
    }


@functools.cache
def _spec(env_id: str) -> EnvSpec:
    if not isinstance(env_id, str) or env_id not in games():
        raise ConfigError(
            f"env_id={env_id!r} is not a game of ALE's vector env; allowed: the Atari '<Game>-v5' ids "
            f"({', '.join(sorted(games())[:3])}, ... {len(games())} in all)"
        )
    env = AtariVectorEnv(games()[env_id], 1, num_threads=1, **SETTINGS)
    try:
        shape, actions = env.single_observation_space.shape, env.single_action_space
        assert shape is not None and isinstance(actions, Discrete)  # ALE's frames and its minimal action set
        return EnvSpec(env_id, tuple(shape), np.dtype(np.uint8), int(actions.n), "frames")
    finally:
        env.close()


class AleHandle(NamedTuple):
    """What the step threads through besides ALE's own handle: each env's lives, the number of frames its game
    has put in its stack (up to the stack's size), and whether its last step ended its game (then this step is
    its reset)."""

    ale: UInt8[Array, " 8"]
    lives: Int[Array, " N"]
    frames: Int[Array, " N"]
    game_over: Bool[Array, " N"]


def _first_frame_stack(obs: UInt8[Array, "N K h w"], frames: Int[Array, " N"]) -> UInt8[Array, "N K h w"]:
    """The stacks of games with only ``frames`` frames so far, as EnvPool has them: ALE's zeros before the first
    frame are that frame."""
    stack_num = obs.shape[1]
    source = jnp.maximum(jnp.arange(stack_num)[None, :], stack_num - frames[:, None])
    return jnp.take_along_axis(obs, source[:, :, None, None], axis=1)


def _env_output(handle: AleHandle, timestep: tuple[Any, ...]) -> tuple[AleHandle, EnvOutput]:
    """ALE's ``(obs, reward, terminated, truncated, info)`` as an EnvOutput, and the handle to carry on.

    ``handle`` holds the new ALE handle and the lives, frames and game overs of the same envs' previous step."""
    obs, reward, terminated, truncated, info = timestep
    lives = info["lives"].astype(jnp.int32)
    # ALE's own test of a lost life (PreprocessedEnv::step): fewer lives than at the step's start, some left.
    life_lost = (lives < handle.lives) & (lives > 0)
    game_over = truncated | (terminated & ~life_lost)
    frames = jnp.where(handle.game_over, 1, jnp.minimum(handle.frames + 1, obs.shape[1]))
    obs = _first_frame_stack(obs, frames)
    raw_reward = reward.astype(jnp.float32)
    # ALE resets on the next step (NextStep): the observation that ends an episode is its final one.
    time_limit = truncated & ~terminated
    out = EnvOutput(obs, jnp.sign(raw_reward), terminated | truncated, raw_reward, game_over, time_limit, obs)
    return AleHandle(handle.ale, lives, frames, game_over), out


def _vector_env(env_id: str, num_envs: int, **kwargs: Any) -> AtariVectorEnv:
    _spec(env_id)
    return AtariVectorEnv(games()[env_id], num_envs, **(SETTINGS | kwargs))


def _reset(env: AtariVectorEnv, seeds: Sequence[int]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    obs, info = env.reset(seed=np.asarray(seeds, dtype=np.int64))
    obs = np.broadcast_to(obs[:, -1:], obs.shape).copy()  # EnvPool's first stack: the first frame, four times
    return obs, info


class AleBackend:
    """``EnvBackend`` on ALE's vector env: synchronous pools only (its async mode is refused)."""

    name = "ale"
    rebinds = True
    has_async = False
    state_is_data = False
    compiles_on = ("cpu", "gpu")
    """The platforms whose programs can hold ALE's XLA step: calls registered for the CPU and CUDA alone."""

    def spec(self, env_id: str) -> EnvSpec:
        return _spec(env_id)

    def make(
        self, env_id: str, seeds: Sequence[int], *, render: bool = False, threads: EnvThreads = BACKEND_THREADS
    ) -> Pool:
        if render:
            raise ConfigError("ALE's vector env cannot render its screens; allowed for videos: --env-backend envpool")
        env = _vector_env(env_id, len(seeds), num_threads=threads.count, thread_affinity_offset=threads.first_core)
        ale_handle, _reset_call, xla_step = env.xla()
        first_obs, info = _reset(env, seeds)
        num_envs = len(seeds)
        lives = jnp.asarray(info["lives"], jnp.int32)
        handle = AleHandle(jnp.asarray(ale_handle), lives, jnp.ones(num_envs, jnp.int32), jnp.zeros(num_envs, bool))

        def step(handle: AleHandle, actions: Int[Array, " N"]) -> tuple[AleHandle, EnvOutput]:
            ale, timestep = xla_step(handle.ale, actions.astype(jnp.int32))
            return _env_output(handle._replace(ale=ale), timestep)

        def no_render(i: int) -> np.ndarray:
            raise ConfigError("ALE's vector env cannot render its screens")

        return Pool(_spec(env_id), handle, step, first_obs, env.close, no_render)

    def make_async(
        self, env_id: str, seeds: Sequence[int], batch_size: int, *, threads: EnvThreads = BACKEND_THREADS
    ) -> AsyncPool:
        raise ConfigError(
            f"async_batch_size={batch_size} is not possible with --env-backend ale; allowed: 0 with --env-backend ale"
        )


BACKEND = AleBackend()
