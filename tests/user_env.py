"""A small env written in JAX with gymnax's interface, as a user would write it: no gymnax import, no base class,
gymnax's older five-value step. The tests' stand-in for "an env of your own" (``tests/test_user_env.py``)."""

from types import SimpleNamespace
from typing import NamedTuple

import jax
import jax.numpy as jnp

LENGTH = 8


class CorridorParams(NamedTuple):
    max_steps: int = 50


class CorridorState(NamedTuple):
    position: jax.Array
    time: jax.Array


class Corridor:
    """A corridor of ``LENGTH`` cells: each episode starts in one of the first two; action 1 steps right, 0 left;
    the last cell pays 1 and ends the episode, every other step costs 0.01; ``max_steps`` truncates it. The
    observation is the position, one-hot."""

    name = "Corridor-v0"

    @property
    def default_params(self) -> CorridorParams:
        return CorridorParams()

    def observation_space(self, params: CorridorParams) -> SimpleNamespace:
        return SimpleNamespace(shape=(LENGTH,), dtype=jnp.float32)

    def action_space(self, params: CorridorParams) -> SimpleNamespace:
        return SimpleNamespace(n=2)

    def reset(self, key: jax.Array, params: CorridorParams) -> tuple[jax.Array, CorridorState]:
        state = CorridorState(jax.random.randint(key, (), 0, 2), jnp.zeros((), jnp.int32))
        return self._obs(state), state

    def step(self, key: jax.Array, state: CorridorState, action: jax.Array, params: CorridorParams):
        position = jnp.clip(state.position + 2 * action - 1, 0, LENGTH - 1)
        stepped = CorridorState(position, state.time + 1)
        at_goal = position == LENGTH - 1
        out_of_time = stepped.time >= params.max_steps
        done = at_goal | out_of_time
        reward = jnp.where(at_goal, 1.0, -0.01)
        reset_obs, reset_state = self.reset(key, params)
        next_state = jax.tree.map(lambda a, b: jnp.where(done, a, b), reset_state, stepped)
        obs = jnp.where(done, reset_obs, self._obs(stepped))
        info = {"truncated": out_of_time & ~at_goal, "final_observation": self._obs(stepped)}
        return obs, next_state, reward, done, info

    def _obs(self, state: CorridorState) -> jax.Array:
        return jax.nn.one_hot(state.position, LENGTH, dtype=jnp.float32)


def make_corridor() -> Corridor:
    """What ``ppo-eqx train --env-id tests.user_env:make_corridor`` calls."""
    return Corridor()


def kl_penalty(coef: float):
    """CleanRL's loss plus ``coef`` times the approximate KL divergence of the new policy from the one that
    collected the batch, reported as ``kl_penalty``: the loss docs/design.md's how-to writes."""
    import ppo_eqx

    def loss(model, minibatch, hyperparameters, *, prepared):
        logprob, entropy, value = model.evaluate_actions(minibatch.obs, minibatch.actions, prepared=prepared)
        old = minibatch
        clean, info = ppo_eqx.ppo_loss(
            logprob, value, entropy, old.logprobs, old.values, old.advantages, old.returns, hyperparameters
        )
        log_ratio = logprob - old.logprobs
        penalty = coef * ((jnp.exp(log_ratio) - 1) - log_ratio).mean()
        return clean + penalty, {**info._asdict(), "loss": clean + penalty, "kl_penalty": penalty}

    return loss


kl_loss = kl_penalty(0.5)
"""What ``ppo-eqx train --loss tests.user_env:kl_loss`` descends."""


class ReachState(NamedTuple):
    position: jax.Array
    time: jax.Array


class Reach:
    """Continuous actions: a point on [-1, 1] starts at random and moves by 0.2 times the action (a box [-1, 1]);
    each step pays minus its distance to the target 0.5; 20 steps an episode (truncated). The best policy drives
    to the target and stays: about -1.5 an episode from the farthest start, against about -13 for random actions."""

    name = "Reach-v0"
    default_params = None

    def observation_space(self, params: None) -> SimpleNamespace:
        return SimpleNamespace(shape=(1,), dtype=jnp.float32)

    def action_space(self, params: None) -> SimpleNamespace:
        return SimpleNamespace(shape=(1,), low=-1.0, high=1.0)

    def reset(self, key: jax.Array, params: None) -> tuple[jax.Array, ReachState]:
        state = ReachState(jax.random.uniform(key, (), minval=-1.0, maxval=1.0), jnp.zeros((), jnp.int32))
        return state.position[None], state

    def step(self, key: jax.Array, state: ReachState, action: jax.Array, params: None):
        position = jnp.clip(state.position + 0.2 * action[0], -1.0, 1.0)
        time = state.time + 1
        reward = -jnp.abs(position - 0.5)
        done = time >= 20
        reset_obs, reset_state = self.reset(key, params)
        next_state = jax.tree.map(lambda a, b: jnp.where(done, a, b), reset_state, ReachState(position, time))
        obs = jnp.where(done, reset_obs, position[None])
        info = {"truncated": done, "final_observation": position[None]}
        return obs, next_state, reward, done, info


class Unbounded(Reach):
    """Reach with an action box that has no bounds: refused (the Gaussian's samples are clipped to them)."""

    def action_space(self, params: None) -> SimpleNamespace:
        return SimpleNamespace(shape=(1,), low=-jnp.inf, high=jnp.inf)
