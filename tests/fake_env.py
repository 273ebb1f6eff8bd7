"""Pure stand-ins for EnvPool's XLA step (and its async recv/send), with the same signatures, for fast tests."""

from typing import NamedTuple

import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Int

from ppo_eqx import EnvOutput
from ppo_eqx.core.envs import AsyncEnv, AsyncPool, EnvSpec, Pool


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
        obs = observe(counter)
        return counter, EnvOutput(obs, jnp.sign(raw), done, raw, game_over, done & False, obs)

    first_handle = jnp.zeros(num_envs, jnp.int32)
    return first_handle, observe(first_handle), env_step


class AsyncHandle(NamedTuple):
    counter: Int[Array, " N"]
    last_action: Int[Array, " N"]
    ready_at: Int[Array, " N"]
    clock: Int[Array, ""]


def counting_async_env(num_envs: int, batch_size: int, lives: int = 1):
    """``counting_env``'s envs as an async pool that receives ``batch_size`` of them at a time.

    Each step (and the first reset) of env n takes ``1 + (7n + 3c) % 5`` ticks, c its step counter; ``recv``
    returns the ``batch_size`` envs that finish first, so envs come back in changing groups and orders, and
    one can come back twice before another's reset. An env's first receive is its reset (counter 0, reward 0,
    not done). Returns ``(handle, env)``.
    """
    length = jnp.arange(num_envs) + 2
    in_hand = jnp.iinfo(jnp.int32).max

    def duration(env_ids, counter):
        return 1 + (7 * env_ids + 3 * counter) % 5

    def recv(handle: AsyncHandle):
        env_ids = jnp.argsort(handle.ready_at, stable=True)[:batch_size].astype(jnp.int32)
        counter, action = handle.counter[env_ids], handle.last_action[env_ids]
        stepped = counter > 0
        obs = jnp.stack([counter, env_ids, 0 * counter, 0 * counter], axis=1).astype(jnp.float32)
        done = stepped & (counter % length[env_ids] == 0)
        game_over = stepped & (counter % (length[env_ids] * lives) == 0)
        raw = jnp.where(stepped, action + 1, 0).astype(jnp.float32)
        clock = jnp.max(handle.ready_at[env_ids])
        handle = handle._replace(ready_at=handle.ready_at.at[env_ids].set(in_hand), clock=clock)
        return handle, env_ids, EnvOutput(obs, jnp.sign(raw), done, raw, game_over, done & False, obs)

    def send(handle: AsyncHandle, env_ids: Int[Array, " R"], actions: Int[Array, " R"]):
        counter = handle.counter[env_ids]
        return AsyncHandle(
            handle.counter.at[env_ids].add(1),
            handle.last_action.at[env_ids].set(actions),
            handle.ready_at.at[env_ids].set(handle.clock + duration(env_ids, counter + 1)),
            handle.clock,
        )

    envs = jnp.arange(num_envs, dtype=jnp.int32)
    zeros = jnp.zeros(num_envs, jnp.int32)
    handle = AsyncHandle(zeros, zeros, duration(envs, 0).astype(jnp.int32), jnp.int32(0))
    return handle, AsyncEnv(recv, send)


SPEC = EnvSpec("fake", (4,), np.dtype(np.float32), 3, "vector")


def counting_pool(num_envs: int, lives: int = 1) -> Pool:
    """``counting_env`` as a backend's ``Pool`` (observations ``[N, 4]``, 3 actions)."""
    handle, obs, env_step = counting_env(num_envs, lives)
    return Pool(SPEC, handle, env_step, np.asarray(obs), lambda: None, lambda i: np.zeros((1, 1, 3), np.uint8))


def counting_async_pool(num_envs: int, batch_size: int, lives: int = 1) -> AsyncPool:
    """``counting_async_env`` as a backend's ``AsyncPool``."""
    handle, env = counting_async_env(num_envs, batch_size, lives)
    return AsyncPool(SPEC, handle, env, lambda: None)
