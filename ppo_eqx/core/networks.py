"""The models: the model interface (issue 51), what the rollout, the loss and evaluation call of a model, as
abstract Equinox modules; and ppo_eqx's own networks. A model of your own subclasses one of the abstract classes
here, never a concrete model (Equinox's abstract/final pattern), so nothing it does changes what ours do:

- ``Policy``: ``__call__(obs) -> (outputs [B, A], values [B])``, where ``outputs`` are what the action
  distribution is made of; ``sample``, ``mode`` and ``log_prob_entropy`` of that distribution; ``obs_shape`` and
  ``num_actions``. ``evaluate_actions`` follows from them; ``prepare`` (a relayout of a whole batch's observations,
  done once for all epochs) is the identity unless a model says otherwise.
- ``CategoricalPolicy``: discrete actions, ``outputs`` the logits (``ActorCritic``): implement ``__call__`` alone.
- ``GaussianPolicy``: continuous actions, ``outputs`` the mean of a diagonal Gaussian whose log standard deviation is
  the model's ``log_std`` (``GaussianActorCritic``): implement ``__call__`` and hold ``log_std``.
- ``RecurrentPolicy`` (``core.recurrent``): a policy with a memory per env, carried through the rollout and
  replayed over whole sequences by the update.

Ours, ``ActorCritic``: CleanRL's Nature-CNN agent for Atari frames, its two-MLP agent for vector observations, and
gymnax-blines' two wider ReLU MLPs for MinAtar's grids; ``core.gaussian`` adds the Gaussian policy of continuous
actions.

Every layer takes a whole batch (leading axis ``B``); nothing here is vmapped. The convolutions are computed by a
route (``ConvRoute``: XLA's, matrix products, or ppo_eqx's CPU kernel), all giving the same numbers within float32
rounding: ``core.convolutions``. A model is built with its route and never chooses one itself: ``PPOConfig.conv_impl``'s
"auto" is resolved once, at the edge (``ppo_eqx.host.kernel_build.resolve_conv_impl``).
"""

import abc
import copy
import math
from typing import Literal

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PRNGKeyArray, Shaped

from . import cpu_kernel
from ._types import ObsKind
from .checks import check_actions, typechecked
from .convolutions import CONV_ROUTES, Conv, ConvRoute, frames_space_to_depth
from .layers import Dense, NetworkInit

# --- the model interface ----------------------------------------------------------------------------------------------


LOG_2PI = math.log(2 * math.pi)

Actions = Int[Array, " B"] | Float[Array, "B A"]
"""A batch of actions: ``[B]`` ints for discrete ones, ``[B, A]`` floats for continuous ones."""


class Policy(eqx.Module):
    """What the rollout, the loss and evaluation call of a model (abstract)."""

    obs_shape: eqx.AbstractVar[tuple[int, ...]]
    """The shape of one observation (a batch is ``[B, *obs_shape]``)."""
    num_actions: eqx.AbstractVar[int]
    """A: the actions to choose among (discrete), or the action's dimensions (continuous)."""

    @abc.abstractmethod
    def __call__(
        self, obs: Shaped[Array, " B *obs"], *, prepared: bool = False
    ) -> tuple[Float[Array, "B A"], Float[Array, " B"]]:
        """The distribution's ``outputs`` ``[B, A]`` (logits, or a Gaussian's mean) and the values ``[B]`` of a batch
        of observations; ``prepared``: the observations went through ``prepare`` already."""

    @abc.abstractmethod
    def sample(
        self,
        key: PRNGKeyArray,
        outputs: Float[Array, "N A"],
        *,
        first_env: int | Int[Array, ""] = 0,
        total_envs: int | None = None,
    ) -> tuple[Actions, Float[Array, " N"]]:
        """One action per row of ``outputs``, and its log-probability. With ``total_envs`` the rows are rows
        ``first_env ..`` of a ``[total_envs, A]`` batch, each drawing that row's noise of the whole batch (a process's
        share of the envs, or a host loop's half, draws what the whole rollout would)."""

    @abc.abstractmethod
    def mode(self, outputs: Float[Array, "N A"]) -> Actions:
        """The distribution's most likely action per row (greedy evaluation)."""

    @abc.abstractmethod
    def log_prob_entropy(
        self, outputs: Float[Array, "B A"], actions: Actions
    ) -> tuple[Float[Array, " B"], Float[Array, " B"]]:
        """The log-probability of ``actions`` and the distribution's entropy, per row."""

    def prepare(self, obs: Shaped[Array, " B *obs"]) -> Shaped[Array, " B *prepared"]:
        """Observations relaid out for the model, once for all epochs of an update (the identity here)."""
        return obs

    def evaluate_actions(
        self, obs: Shaped[Array, " B *obs"], actions: Actions, *, prepared: bool = False
    ) -> tuple[Float[Array, " B"], Float[Array, " B"], Float[Array, " B"]]:
        """Log-probability of ``actions``, the policy's entropy and the value, each ``[B]``."""
        outputs, value = self(obs, prepared=prepared)
        logprob, entropy = self.log_prob_entropy(outputs, actions)
        return logprob, entropy, value


class CategoricalPolicy(Policy):
    """A policy of discrete actions whose ``outputs`` are logits (abstract: implement ``__call__``)."""

    def sample(
        self,
        key: PRNGKeyArray,
        outputs: Float[Array, "N A"],
        *,
        first_env: int | Int[Array, ""] = 0,
        total_envs: int | None = None,
    ) -> tuple[Int[Array, " N"], Float[Array, " N"]]:
        action = sample_actions(key, outputs, first_env=first_env, total_envs=total_envs)
        logprob, _ = categorical_logprob_entropy(outputs, action)
        return action, logprob

    def mode(self, outputs: Float[Array, "N A"]) -> Int[Array, " N"]:
        return jnp.argmax(outputs, axis=-1).astype(jnp.int32)

    @typechecked
    def log_prob_entropy(
        self, outputs: Float[Array, "B A"], actions: Int[Array, " B"]
    ) -> tuple[Float[Array, " B"], Float[Array, " B"]]:
        check_actions(actions, outputs.shape[-1], "evaluate_actions")
        return categorical_logprob_entropy(outputs, actions)


class GaussianPolicy(Policy):
    """A policy of continuous actions: a diagonal Gaussian whose mean is ``outputs`` and whose log standard deviation
    is ``log_std`` (state-independent, learned), log-probabilities and entropies summed over the action's
    dimensions, as CleanRL's ``ppo_continuous_action.py`` (abstract: implement ``__call__``, hold ``log_std``)."""

    log_std: eqx.AbstractVar[Float[Array, " A"]]

    def sample(
        self,
        key: PRNGKeyArray,
        outputs: Float[Array, "N A"],
        *,
        first_env: int | Int[Array, ""] = 0,
        total_envs: int | None = None,
    ) -> tuple[Float[Array, "N A"], Float[Array, " N"]]:
        mean = outputs
        rows = mean.shape[0] if total_envs is None else total_envs
        noise = jax.random.normal(key, (rows, mean.shape[1]), mean.dtype)
        if total_envs is not None:
            noise = jax.lax.dynamic_slice_in_dim(noise, first_env, mean.shape[0])
        action = mean + jnp.exp(self.log_std) * noise
        logprob, _ = gaussian_logprob_entropy(mean, self.log_std, action)
        return action, logprob

    def mode(self, outputs: Float[Array, "N A"]) -> Float[Array, "N A"]:
        return outputs

    @typechecked
    def log_prob_entropy(
        self, outputs: Float[Array, "B A"], actions: Float[Array, "B A"]
    ) -> tuple[Float[Array, " B"], Float[Array, " B"]]:
        return gaussian_logprob_entropy(outputs, self.log_std, actions)


def sample_actions(
    key: PRNGKeyArray,
    logits: Float[Array, "N A"],
    *,
    first_env: int | Int[Array, ""] = 0,
    total_envs: int | None = None,
) -> Int[Array, " N"]:
    """One action per row of ``logits``, as ``jax.random.categorical(key, logits)``.

    With ``total_envs``, the rows are rows ``first_env ..`` of a ``[total_envs, A]`` batch, and each gets the
    action that ``categorical`` (Gumbel-max) draws for that row of the whole batch.
    """
    if total_envs is None:
        return jax.random.categorical(key, logits).astype(jnp.int32)
    gumbel = jax.random.gumbel(key, (total_envs, logits.shape[-1]), logits.dtype)
    noise = jax.lax.dynamic_slice_in_dim(gumbel, first_env, logits.shape[0])
    return jnp.argmax(logits + noise, axis=-1).astype(jnp.int32)


def categorical_logprob_entropy(
    logits: Float[Array, "B A"], actions: Int[Array, " B"]
) -> tuple[Float[Array, " B"], Float[Array, " B"]]:
    """Log-probability of ``actions`` under softmax(logits), and the distribution's entropy."""
    log_probs = jax.nn.log_softmax(logits)
    logprob = jnp.take_along_axis(log_probs, actions[:, None], axis=1)[:, 0]
    entropy = -jnp.sum(jnp.exp(log_probs) * log_probs, axis=-1)
    return logprob, entropy


def gaussian_logprob_entropy(
    mean: Float[Array, "B A"], log_std: Float[Array, " A"], actions: Float[Array, "B A"]
) -> tuple[Float[Array, " B"], Float[Array, " B"]]:
    """Log-density of ``actions`` under the diagonal Gaussian (``mean``, ``exp(log_std)``) and its entropy, each
    summed over the action's dimensions (torch's ``Normal(...).log_prob(a).sum(1)``, ``.entropy().sum(1)``)."""
    z = (actions - mean) * jnp.exp(-log_std)
    logprob = jnp.sum(-0.5 * z * z - log_std - 0.5 * LOG_2PI, axis=-1)
    entropy = jnp.broadcast_to(jnp.sum(0.5 + 0.5 * LOG_2PI + log_std), mean.shape[:1])
    return logprob, entropy


# --- ppo_eqx's networks -----------------------------------------------------------------------------------------------


__all__ = [
    "CONV_ROUTES",
    "MLP",
    "ActorCritic",
    "Conv",
    "ConvRoute",
    "Dense",
    "NatureCNN",
    "NetworkInit",
    "categorical_logprob_entropy",
    "conv_route_of",
]


class NatureCNN(eqx.Module):
    """Mnih et al. (2015) torso as CleanRL builds it: 3 convs then a 512-unit layer, ReLU, sqrt(2) gain."""

    convs: tuple[Conv, Conv, Conv]
    dense: Dense

    def __init__(self, obs_shape: tuple[int, ...], *, init: NetworkInit = "cleanrl", key: PRNGKeyArray):
        channels, height, width = obs_shape
        k1, k2, k3, k4 = jax.random.split(key, 4)
        gain = math.sqrt(2)
        self.convs = (
            Conv(channels, 32, 8, 4, gain, init=init, key=k1),
            Conv(32, 64, 4, 2, gain, init=init, key=k2),
            Conv(64, 64, 3, 1, gain, init=init, key=k3),
        )
        for conv in self.convs:
            height, width = conv.output_size(height), conv.output_size(width)
        if height < 1 or width < 1:
            smallest = 1
            for conv in reversed(self.convs):
                smallest = (smallest - 1) * conv.stride + conv.weight.shape[0]
            raise ValueError(
                f"obs_shape={tuple(obs_shape)}: frames of {obs_shape[1]}x{obs_shape[2]} are too small for the Nature "
                f"CNN's three convolutions; allowed: at least {smallest}x{smallest}"
            )
        self.dense = Dense(height * width * 64, 512, gain, init=init, key=k4)

    def prepare(self, obs: Shaped[Array, "B C H W"], impl: ConvRoute) -> Shaped[Array, "B ..."]:
        """The layout the first layer reads, still in the frames' dtype: NHWC for "xla"; for "matmul" the
        frames cropped to what the first layer reads and folded by its stride (``space_to_depth``); for
        "kernel", uint8 frames as they are (the kernel folds each frame itself).

        A pure relayout, cheap on a whole batch and slow per minibatch, so the update does it once.
        """
        if impl == "xla":
            return jnp.transpose(obs, (0, 2, 3, 1))
        if impl == "kernel" and obs.dtype == jnp.uint8:
            return obs
        first = self.convs[0]
        _, _, h, w = obs.shape
        return frames_space_to_depth(obs[:, :, : first.input_extent(h), : first.input_extent(w)], first.stride)

    def apply(self, prepared: Shaped[Array, "B ..."], impl: ConvRoute) -> Float[Array, "B 512"]:
        """Features of frames already ``prepare``d; the 1/255 scaling happens here."""
        first, *rest = self.convs
        if impl == "kernel" and prepared.dtype == jnp.uint8:
            x = cpu_kernel.first_conv(prepared, first.folded_kernel(), first.bias, first.stride)
        else:
            x = prepared.astype(jnp.float32) / 255.0
            x = first(x, impl) if impl == "xla" else first.on_space_to_depth(x)
        x = jax.nn.relu(x)
        for conv in rest:
            x = jax.nn.relu(conv(x, impl))
        # Flatten in (row, column, channel) order, as CleanRL's flax model does.
        return jax.nn.relu(self.dense(x.reshape(x.shape[0], -1)))

    def __call__(self, obs: Shaped[Array, "B C H W"], impl: ConvRoute) -> Float[Array, "B 512"]:
        return self.apply(self.prepare(obs, impl), impl)


Activation = Literal["tanh", "relu"]
_ACTIVATIONS = {"tanh": jnp.tanh, "relu": jax.nn.relu}


class MLP(eqx.Module):
    """Dense layers with ``activation`` between them, started as ``init`` says (CleanRL's gains: sqrt(2), then
    ``final_scale`` last)."""

    layers: tuple[Dense, ...]
    activation: Activation = eqx.field(static=True)

    def __init__(
        self,
        sizes: tuple[int, ...],
        final_scale: float,
        *,
        activation: Activation = "tanh",
        init: NetworkInit = "cleanrl",
        key: PRNGKeyArray,
    ):
        keys = jax.random.split(key, len(sizes) - 1)
        scales = [math.sqrt(2)] * (len(sizes) - 2) + [final_scale]
        self.layers = tuple(
            Dense(fan_in, fan_out, scale, init=init, key=k)
            for fan_in, fan_out, scale, k in zip(sizes[:-1], sizes[1:], scales, keys, strict=True)
        )
        self.activation = activation

    def __call__(self, x: Float[Array, "B D"]) -> Float[Array, "B out"]:
        act = _ACTIVATIONS[self.activation]
        for layer in self.layers[:-1]:
            x = act(layer(x))
        return self.layers[-1](x)


_KIND_OF_RANK: dict[int, ObsKind] = {3: "frames", 1: "vector"}
"""The kind of an observation that ``ActorCritic`` is not told: CleanRL's two, by rank."""
GRID_HIDDEN = 256
"""Width of the two hidden layers of the MinAtar MLPs (gymnax-blines' ``Categorical-MLP``)."""


class ActorCritic(CategoricalPolicy):
    """Policy logits and state values for a batch of observations (a ``CategoricalPolicy``).

    By the observations' ``kind`` (default: ``"frames"`` for a 3-D shape, ``"vector"`` for a 1-D one):
    ``frames`` ``[B, C, H, W]`` (uint8, scaled by 1/255 inside) share a Nature-CNN torso between a linear actor
    (gain 0.01) and a linear critic (gain 1), as CleanRL's Atari agent. ``vector`` ``[B, D]`` gets CleanRL's
    classic-control agent: separate 64-64 tanh MLPs for actor and critic. ``grid`` ``[B, H, W, C]`` (MinAtar)
    gets gymnax-blines' agent: separate 256-256 ReLU MLPs on the flattened grid. Every layer starts as ``init``
    says (``NetworkInit``: CleanRL's, the default, or gymnax-blines').
    ``conv_impl`` is the route the convolutions take (see this module's docstring; default "xla", XLA's own, as
    CleanRL); building the model runs nothing but its initialisation.
    """

    torso: NatureCNN | None
    actor: Dense | MLP
    critic: Dense | MLP
    obs_shape: tuple[int, ...] = eqx.field(static=True)
    conv_impl: ConvRoute = eqx.field(static=True)

    @typechecked
    def __init__(
        self,
        obs_shape: tuple[int, ...],
        num_actions: int,
        *,
        kind: ObsKind | None = None,
        conv_impl: ConvRoute = "xla",
        init: NetworkInit = "cleanrl",
        key: PRNGKeyArray,
    ):
        if num_actions < 1:
            raise ValueError(f"num_actions={num_actions}; allowed: 1 or more")
        if conv_impl not in CONV_ROUTES:
            raise ValueError(
                f'conv_impl={conv_impl!r} is not a route; allowed: {", ".join(map(repr, CONV_ROUTES))} ("auto" is '
                "resolved before a model is built: ppo_eqx.host.kernel_build.resolve_conv_impl)"
            )
        torso_key, actor_key, critic_key = jax.random.split(key, 3)
        self.obs_shape, self.conv_impl = tuple(obs_shape), conv_impl
        kind = kind or _KIND_OF_RANK.get(len(obs_shape))
        if kind == "frames" and len(obs_shape) == 3:
            self.torso = NatureCNN(obs_shape, init=init, key=torso_key)
            self.actor = Dense(512, num_actions, 0.01, init=init, key=actor_key)
            self.critic = Dense(512, 1, 1.0, init=init, key=critic_key)
        elif kind == "vector" and len(obs_shape) == 1:
            self.torso = None
            self.actor = MLP((obs_shape[0], 64, 64, num_actions), 0.01, init=init, key=actor_key)
            self.critic = MLP((obs_shape[0], 64, 64, 1), 1.0, init=init, key=critic_key)
        elif kind == "grid" and len(obs_shape) == 3:
            self.torso = None
            width = math.prod(obs_shape)
            sizes = (width, GRID_HIDDEN, GRID_HIDDEN)
            self.actor = MLP((*sizes, num_actions), 0.01, activation="relu", init=init, key=actor_key)
            self.critic = MLP((*sizes, 1), 1.0, activation="relu", init=init, key=critic_key)
        else:
            raise ValueError(
                f"observation shape {obs_shape} (kind {kind!r}) is neither [C, H, W] frames, a flat vector nor an "
                "[H, W, C] grid"
            )

    def prepare(self, obs: Shaped[Array, " B *obs"]) -> Shaped[Array, " B *prepared"]:
        """Observations relaid out for the torso (frames only; vectors pass through). Pass the result with
        ``prepared=True`` to evaluate a batch many times without relaying it out each time."""
        return obs if self.torso is None else self.torso.prepare(obs, self.conv_impl)

    def with_conv_impl(self, conv_impl: ConvRoute) -> "ActorCritic":
        """This model with its convolutions computed by ``conv_impl``: the same arrays (shared), the same numbers
        within float32 rounding. A placement that compiles the rollout for another device than the learning
        gives each its own route."""
        if conv_impl not in CONV_ROUTES:
            raise ValueError(f"conv_impl={conv_impl!r} is not a route; allowed: {', '.join(map(repr, CONV_ROUTES))}")
        model = copy.copy(self)
        object.__setattr__(model, "conv_impl", conv_impl)  # a static field: not a leaf that eqx.tree_at can set
        return model

    @property
    def num_actions(self) -> int:
        """A: the actions the policy chooses among."""
        last = self.actor if isinstance(self.actor, Dense) else self.actor.layers[-1]
        return last.weight.shape[-1]

    @typechecked
    def __call__(
        self, obs: Shaped[Array, " B *obs"], *, prepared: bool = False
    ) -> tuple[Float[Array, "B A"], Float[Array, " B"]]:
        """Logits ``[B, A]`` and values ``[B]`` of a batch of observations (one observation: ``obs[None]``)."""
        if not prepared and tuple(obs.shape[1:]) != self.obs_shape:
            raise ValueError(
                f"ActorCritic takes a batch of observations [B, {', '.join(map(str, self.obs_shape))}], not an "
                f"array of shape {list(obs.shape)}; for one observation pass obs[None]"
            )
        if self.torso is None:
            x = obs.reshape(obs.shape[0], -1).astype(jnp.float32)  # a grid is flattened; a vector stays as it is
            return self.actor(x), self.critic(x)[:, 0]
        hidden = self.torso.apply(obs if prepared else self.prepare(obs), self.conv_impl)
        return self.actor(hidden), self.critic(hidden)[:, 0]


def conv_route_of(model: object) -> ConvRoute | None:
    """The route ``model``'s convolutions take: an ``ActorCritic``'s ``conv_impl``; None for any other model (one of
    the user's, a continuous one), whose convolutions are its own."""
    return model.conv_impl if isinstance(model, ActorCritic) else None
