"""A pure stand-in for EnvPool's XLA step, with the same signature, for fast tests."""

import jax.numpy as jnp
from jaxtyping import Array, Int

from ppo_eqx import EnvOutput


def counting_env(num_envs: int, lives: int = 1):
    """Env n's episodes last n+2 steps; the reward is the action + 1 (raw) and its sign (clipped).

    The handle is the step counter of each env, the observation (counter, n, 0, 0). With ``lives`` > 1 a
    game is over after that many episodes (Atari's lost lives): ``done`` ends each life, ``game_over`` the game.
    """
    length = jnp.arange(num_envs) + 2

    def observe(counter):
        return jnp.stack([counter, jnp.arange(num_envs), 0 * counter, 0 * counter], axis=1).astype(jnp.float32)

    def env_step(handle: Int[Array, " N"], actions: Int[Array, " N"]):
        counter = handle + 1
        done = counter % length == 0
        game_over = counter % (length * lives) == 0
        raw = (actions + 1).astype(jnp.float32)
        return counter, EnvOutput(observe(counter), jnp.sign(raw), done, raw, game_over)

    first_handle = jnp.zeros(num_envs, jnp.int32)
    return first_handle, observe(first_handle), env_step
