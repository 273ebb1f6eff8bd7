"""Recurrent policies (issue 51): a memory per env, carried through the rollout, reset where an episode starts, and
replayed over whole env sequences by the update (``core.update.sequence_update``), as CleanRL's
``ppo_atari_lstm.py`` and PureJaxRL's ``ppo_rnn.py`` do.

``RecurrentPolicy`` is the interface (abstract): ``initial_memory(num_envs)`` and ``step(memory, obs, starts)``,
``starts[n]`` True where ``obs[n]`` is the first of its episode (the memory is reset before it, CleanRL's ``(1 -
done) * state``); ``unroll`` and ``evaluate_sequences`` follow. Its action distribution is a ``CategoricalPolicy``'s
or a ``GaussianPolicy``'s (a concrete model subclasses one of them beside it). Called without a memory
(``model(obs)``) it is the policy at an episode's first step.

``LSTMActorCritic`` is ppo_eqx's (``--network lstm``): on Atari frames CleanRL's ``ppo_atari_lstm.py`` agent (the
Nature CNN's 512 features, an LSTM of 128, linear actor and critic of gains 0.01 and 1; the LSTM's weights orthogonal,
its biases 0); on vectors and MinAtar grids PureJaxRL's ``ppo_rnn.py`` shape (a 128-unit ReLU embedding, an LSTM of
128 where PureJaxRL has a GRU, actor and critic MLPs of 128 ReLU units).
"""

import abc
import math
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, PRNGKeyArray, PyTree, Shaped

from .convolutions import CONV_ROUTES, ConvRoute
from .envs import EnvSpec
from .layers import Dense, NetworkInit
from .networks import MLP, CategoricalPolicy, NatureCNN, Policy

LSTM_SIZE = 128
"""The LSTM's hidden units (CleanRL's ``ppo_atari_lstm.py``; PureJaxRL's GRU has as many)."""
EMBEDDING = 128
"""The ReLU embedding of a vector or grid observation before the LSTM (PureJaxRL's ``ppo_rnn.py``)."""

Memory = PyTree
"""A recurrent policy's memory of ``N`` envs: arrays with a leading ``N`` axis (the LSTM's ``(h, c)``)."""


class RecurrentPolicy(Policy):
    """A policy with a memory per env (abstract: implement ``initial_memory`` and ``step``; the distribution's
    methods come from ``CategoricalPolicy`` or ``GaussianPolicy``)."""

    @abc.abstractmethod
    def initial_memory(self, num_envs: int) -> Memory:
        """The memory of ``num_envs`` envs before their first step (arrays ``[N, ...]``, independent of the
        parameters: a run's carry is made from the model's shape alone)."""

    @abc.abstractmethod
    def step(
        self, memory: Memory, obs: Shaped[Array, " N *obs"], starts: Bool[Array, " N"], *, prepared: bool = False
    ) -> tuple[Memory, Float[Array, "N A"], Float[Array, " N"]]:
        """One step of every env: the memory reset where ``starts`` (``obs`` begins an episode), then moved on by
        ``obs``; the distribution's outputs and the values of this step."""

    def __call__(
        self, obs: Shaped[Array, " B *obs"], *, prepared: bool = False
    ) -> tuple[Float[Array, "B A"], Float[Array, " B"]]:
        """The policy at an episode's first step (a fresh memory)."""
        rows = obs.shape[0]
        _, outputs, values = self.step(self.initial_memory(rows), obs, jnp.ones((rows,), bool), prepared=prepared)
        return outputs, values

    def unroll(
        self, memory: Memory, obs: Shaped[Array, "T N *obs"], starts: Bool[Array, "T N"], *, prepared: bool = False
    ) -> tuple[Memory, Float[Array, "T N A"], Float[Array, "T N"]]:
        """``step`` over a time-major sequence from ``memory`` (a ``lax.scan``): the memory after it, and each
        step's outputs and values."""

        def step(memory: Memory, xs: tuple[Array, Array]) -> tuple[Memory, tuple[Array, Array]]:
            memory, outputs, values = self.step(memory, *xs, prepared=prepared)
            return memory, (outputs, values)

        memory, (outputs, values) = jax.lax.scan(step, memory, (obs, starts))
        return memory, outputs, values

    def evaluate_sequences(
        self,
        memory: Memory,
        obs: Shaped[Array, "T N *obs"],
        starts: Bool[Array, "T N"],
        actions: Any,
        *,
        prepared: bool = False,
    ) -> tuple[Float[Array, "T N"], Float[Array, "T N"], Float[Array, "T N"]]:
        """``evaluate_actions`` of whole sequences replayed from ``memory``: log-probabilities of ``actions``
        ``[T, N]``, entropies and values, each ``[T, N]``."""
        _, outputs, values = self.unroll(memory, obs, starts, prepared=prepared)
        flat = outputs.reshape((-1, outputs.shape[-1]))
        logprob, entropy = self.log_prob_entropy(flat, actions.reshape((flat.shape[0], *actions.shape[2:])))
        return logprob.reshape(values.shape), entropy.reshape(values.shape), values

    def sequence_prepare(self, obs: Shaped[Array, "T N *obs"]) -> Shaped[Array, "T N *prepared"]:
        """``prepare`` of a time-major batch: once for all epochs of an update."""
        prepared = self.prepare(obs.reshape((-1, *obs.shape[2:])))
        return prepared.reshape((*obs.shape[:2], *prepared.shape[1:]))


class LSTMCell(eqx.Module):
    """An LSTM cell as torch's ``nn.LSTM`` computes one step (gates in/forget/cell/out), its weights started
    orthogonal (gain 1) and its biases 0, as CleanRL's ``ppo_atari_lstm.py`` starts them."""

    inputs: Dense
    recurrent: Dense

    def __init__(self, fan_in: int, hidden: int, *, init: NetworkInit = "cleanrl", key: PRNGKeyArray):
        input_key, recurrent_key = jax.random.split(key)
        self.inputs = Dense(fan_in, 4 * hidden, 1.0, init=init, key=input_key)
        self.recurrent = Dense(hidden, 4 * hidden, 1.0, init=init, key=recurrent_key)

    def __call__(self, memory: tuple[Array, Array], x: Float[Array, "N D"]) -> tuple[Array, Array]:
        h, c = memory
        gates = self.inputs(x) + self.recurrent(h)
        i, f, g, o = jnp.split(gates, 4, axis=-1)
        c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
        return jax.nn.sigmoid(o) * jnp.tanh(c), c


class LSTMActorCritic(RecurrentPolicy, CategoricalPolicy):
    """ppo_eqx's recurrent policy of discrete actions (this module's docstring): ``[C, H, W]`` frames through the
    Nature CNN's 512 features (its convolutions by ``conv_impl``), vectors and grids through a 128-unit ReLU
    embedding; then an LSTM of 128 whose output the actor and the critic read."""

    torso: NatureCNN | None
    embedding: Dense | None
    lstm: LSTMCell
    actor: Dense | MLP
    critic: Dense | MLP
    obs_shape: tuple[int, ...] = eqx.field(static=True)
    conv_impl: ConvRoute = eqx.field(static=True)

    def __init__(
        self,
        obs_shape: tuple[int, ...],
        num_actions: int,
        *,
        kind: str = "vector",
        conv_impl: ConvRoute = "xla",
        init: NetworkInit = "cleanrl",
        key: PRNGKeyArray,
    ):
        if num_actions < 1:
            raise ValueError(f"num_actions={num_actions}; allowed: 1 or more")
        if conv_impl not in CONV_ROUTES:
            raise ValueError(f"conv_impl={conv_impl!r} is not a route; allowed: {', '.join(map(repr, CONV_ROUTES))}")
        torso_key, lstm_key, actor_key, critic_key = jax.random.split(key, 4)
        self.obs_shape, self.conv_impl = tuple(obs_shape), conv_impl
        if kind == "frames" and len(obs_shape) == 3:
            self.torso, self.embedding = NatureCNN(obs_shape, init=init, key=torso_key), None
            self.lstm = LSTMCell(512, LSTM_SIZE, init=init, key=lstm_key)
            self.actor = Dense(LSTM_SIZE, num_actions, 0.01, init=init, key=actor_key)
            self.critic = Dense(LSTM_SIZE, 1, 1.0, init=init, key=critic_key)
            return
        self.torso = None
        self.embedding = Dense(math.prod(obs_shape), EMBEDDING, math.sqrt(2), init=init, key=torso_key)
        self.lstm = LSTMCell(EMBEDDING, LSTM_SIZE, init=init, key=lstm_key)
        self.actor = MLP((LSTM_SIZE, 128, num_actions), 0.01, activation="relu", init=init, key=actor_key)
        self.critic = MLP((LSTM_SIZE, 128, 1), 1.0, activation="relu", init=init, key=critic_key)

    @property
    def num_actions(self) -> int:
        last = self.actor if isinstance(self.actor, Dense) else self.actor.layers[-1]
        return last.weight.shape[-1]

    def prepare(self, obs: Shaped[Array, " B *obs"]) -> Shaped[Array, " B *prepared"]:
        return obs if self.torso is None else self.torso.prepare(obs, self.conv_impl)

    def initial_memory(self, num_envs: int) -> tuple[Array, Array]:
        zeros = jnp.zeros((num_envs, LSTM_SIZE), jnp.float32)
        return zeros, jnp.zeros_like(zeros)

    def _features(self, obs: Shaped[Array, " B *obs"], prepared: bool) -> Float[Array, "B F"]:
        """What the LSTM reads of each observation: the Nature CNN's 512 features, or the ReLU embedding."""
        if self.torso is not None:
            return self.torso.apply(obs if prepared else self.prepare(obs), self.conv_impl)
        assert self.embedding is not None
        return jax.nn.relu(self.embedding(obs.reshape(obs.shape[0], -1).astype(jnp.float32)))

    def step(
        self,
        memory: tuple[Array, Array],
        obs: Shaped[Array, " N *obs"],
        starts: Bool[Array, " N"],
        *,
        prepared: bool = False,
    ) -> tuple[tuple[Array, Array], Float[Array, "N A"], Float[Array, " N"]]:
        memory = self.lstm(_reset(memory, starts), self._features(obs, prepared))
        h = memory[0]
        return memory, self.actor(h), self.critic(h)[:, 0]

    def unroll(
        self, memory: Memory, obs: Shaped[Array, "T N *obs"], starts: Bool[Array, "T N"], *, prepared: bool = False
    ) -> tuple[Memory, Float[Array, "T N A"], Float[Array, "T N"]]:
        """``step`` over a sequence, its arithmetic batched where no step depends on another: the features of every
        observation at once, then the LSTM step by step (a ``lax.scan``), then the actor and critic at once."""
        num_steps, num_envs = obs.shape[:2]
        features = self._features(obs.reshape((num_steps * num_envs, *obs.shape[2:])), prepared)
        features = features.reshape((num_steps, num_envs, -1))

        def step(memory: tuple[Array, Array], xs: tuple[Array, Array]) -> tuple[tuple[Array, Array], Array]:
            x, starts = xs
            memory = self.lstm(_reset(memory, starts), x)
            return memory, memory[0]

        memory, hidden = jax.lax.scan(step, memory, (features, starts))
        flat = hidden.reshape((num_steps * num_envs, -1))
        outputs, values = self.actor(flat), self.critic(flat)[:, 0]
        return memory, outputs.reshape((num_steps, num_envs, -1)), values.reshape((num_steps, num_envs))


def _reset(memory: tuple[Array, Array], starts: Bool[Array, " N"]) -> tuple[Array, Array]:
    """The memory of the envs whose observation begins an episode set to zeros (CleanRL's ``(1 - done) * state``)."""
    keep = (~starts)[:, None].astype(jnp.float32)
    h, c = memory
    return h * keep, c * keep


def lstm_model(
    spec: EnvSpec, key: PRNGKeyArray, *, conv_impl: ConvRoute = "xla", init: NetworkInit = "cleanrl"
) -> LSTMActorCritic:
    """``network="lstm"``'s factory (``core.state.ModelFactory``, with the convolutions' route and the layers'
    start bound at the edge): ``LSTMActorCritic`` of ``spec``'s task; discrete actions only."""
    if spec.continuous:
        raise ValueError(f"network='lstm' has discrete actions; {spec.env_id}'s are continuous")
    return LSTMActorCritic(spec.obs_shape, spec.num_actions, kind=spec.kind, conv_impl=conv_impl, init=init, key=key)
