"""ActorCritic: CleanRL's Nature-CNN agent for Atari frames, its two-MLP agent for vector observations, and
gymnax-blines' two wider ReLU MLPs for MinAtar's grids; ``core.gaussian`` adds the Gaussian policy of continuous
actions.

Every layer takes a whole batch (leading axis ``B``); nothing here is vmapped. The convolutions are computed by a
route (``ConvRoute``: XLA's, matrix products, or ppo_eqx's CPU kernel), all giving the same numbers within float32
rounding: ``core.convolutions``. A model is built with its route and never chooses one itself: ``PPOConfig.conv_impl``'s
"auto" is resolved once, at the edge (``ppo_eqx.host.kernel_build.resolve_conv_impl``).
"""

import copy
import math
from typing import Literal

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, PRNGKeyArray, Shaped

from . import cpu_kernel
from ._types import ObsKind
from .checks import typechecked
from .convolutions import CONV_ROUTES, Conv, ConvRoute, frames_space_to_depth
from .layers import Dense, NetworkInit
from .policy import CategoricalPolicy, categorical_logprob_entropy

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
