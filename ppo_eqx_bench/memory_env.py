"""A task that needs memory (issue 51), written in JAX with gymnax's interface: a cue is shown at an episode's first
step only, and ``delay`` steps later the agent is paid 1 for the action that matches it (0 otherwise), which ends
the episode. Between the two nothing is seen but a clock, so a policy without memory picks at chance at the
decision (an episode's return 0.5 on average) and one that remembers the cue earns 1 (the optimum).

The observation is ``[cue == 0, cue == 1, decide, t / delay]``: the cue's one-hot at ``t == 0`` (zeros after), a flag
that is 1 at the decision step, and the time. ``--env-id ppo_eqx_bench.memory_env:make_cue`` trains on it
(``delay`` 8); ``make_cue_delay(d)`` gives another delay.
"""

from types import SimpleNamespace
from typing import NamedTuple

import jax
import jax.numpy as jnp

CUES = 2
"""The cue's values, and the actions."""


class CueParams(NamedTuple):
    delay: int = 8


class CueState(NamedTuple):
    cue: jax.Array
    time: jax.Array


class Cue:
    """This module's task: see the cue, wait ``params.delay`` steps, act on it."""

    name = "Cue-v0"

    def __init__(self, delay: int = 8):
        self.delay = delay

    @property
    def default_params(self) -> CueParams:
        return CueParams(self.delay)

    def observation_space(self, params: CueParams) -> SimpleNamespace:
        return SimpleNamespace(shape=(CUES + 2,), dtype=jnp.float32)

    def action_space(self, params: CueParams) -> SimpleNamespace:
        return SimpleNamespace(n=CUES)

    def reset(self, key: jax.Array, params: CueParams) -> tuple[jax.Array, CueState]:
        state = CueState(jax.random.randint(key, (), 0, CUES), jnp.zeros((), jnp.int32))
        return self._obs(state, params), state

    def step(self, key: jax.Array, state: CueState, action: jax.Array, params: CueParams):
        deciding = state.time == params.delay
        reward = jnp.where(deciding & (action == state.cue), 1.0, 0.0)
        stepped = CueState(state.cue, state.time + 1)
        reset_obs, reset_state = self.reset(key, params)
        next_state = jax.tree.map(lambda a, b: jnp.where(deciding, a, b), reset_state, stepped)
        obs = jnp.where(deciding, reset_obs, self._obs(stepped, params))
        return obs, next_state, reward, deciding, {}

    def _obs(self, state: CueState, params: CueParams) -> jax.Array:
        cue = jax.nn.one_hot(state.cue, CUES) * (state.time == 0)
        decide = (state.time == params.delay).astype(jnp.float32)
        return jnp.concatenate([cue, jnp.stack([decide, state.time / params.delay])]).astype(jnp.float32)


def make_cue() -> Cue:
    """What ``ppo-eqx train --env-id ppo_eqx_bench.memory_env:make_cue`` calls: a delay of 8 steps."""
    return Cue()


def make_cue_delay(delay: int) -> Cue:
    return Cue(delay)


class Flicker:
    """An env of gymnax's interface whose observations are blanked (all zeros) with probability ``p`` each step
    (Hausknecht and Stone's flickering Atari, on MinAtar): what a feedforward policy sees at a blanked step says nothing
    of the game, where a recurrent one remembers the last frames it saw. Its state is the inner env's."""

    def __init__(self, env: object, params: object, p: float = 0.5, name: str = "Flicker"):
        self.env, self.params, self.p, self.name = env, params, p, name

    @classmethod
    def breakout(cls, p: float = 0.5) -> "Flicker":
        """gymnax's Breakout-MinAtar, flickering."""
        import gymnax

        env, params = gymnax.make("Breakout-MinAtar")
        return cls(env, params, p, "Flicker-Breakout-MinAtar")

    @property
    def default_params(self) -> object:
        return self.params

    def observation_space(self, params: object) -> object:
        return self.env.observation_space(params)  # type: ignore[attr-defined]

    def action_space(self, params: object) -> object:
        return self.env.action_space(params)  # type: ignore[attr-defined]

    def _blank(self, key: jax.Array, obs: jax.Array) -> jax.Array:
        return jnp.where(jax.random.bernoulli(key, self.p), jnp.zeros_like(obs), obs)

    def reset(self, key: jax.Array, params: object) -> tuple[jax.Array, object]:
        env_key, blank_key = jax.random.split(key)
        obs, state = self.env.reset(env_key, params)  # type: ignore[attr-defined]
        return self._blank(blank_key, obs), state

    def step(self, key: jax.Array, state: object, action: jax.Array, params: object) -> tuple:
        env_key, blank_key = jax.random.split(key)
        obs, *rest = self.env.step(env_key, state, action, params)  # type: ignore[attr-defined]
        return (self._blank(blank_key, obs), *rest)
