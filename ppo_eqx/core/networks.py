"""ActorCritic: CleanRL's Nature-CNN agent for Atari frames, its two-MLP agent for vector observations, and
gymnax-blines' two wider ReLU MLPs for MinAtar's grids.

Every layer takes a whole batch (leading axis ``B``); nothing here is vmapped. Convolutions can be
computed in ways that give the same numbers (``conv_impl``):

- ``"xla"``: ``lax.conv_general_dilated``.
- ``"matmul"``: space-to-depth by the stride, then matrix products (see ``Conv``). On CPU, XLA's
  convolution gradients run far below its matmul rate and slow down another ten times inside
  ``lax.scan``; matrix products do neither. The frames are folded while still uint8.
- ``"kernel"``: hand-written CPU kernels (``cpu_kernel``). The first layer reads the uint8 frames and folds
  them itself (``first_conv``, faster than the matmuls: docs/performance.md); the other two read each window straight
  from their input (``conv``), so they compute exactly the layers' products, where the matmul route computes
  23-29% more and relayouts around each product. Layers the kernels do not take fall back to "matmul".
A model is built with its route and never chooses one itself: ``PPOConfig.conv_impl``'s "auto" is resolved once,
at the edge (``ppo_eqx.host.conv_route.resolve_conv_impl``: "xla" off the CPU backend; on it "kernel" where the
kernel builds, else "matmul"), because finding out may compile the kernel. The matmul route was designed around
XLA:CPU's slow convolution gradients and has not been measured on an accelerator (``bench/device_check.py``
measures both there).
"""

import copy
import math
from typing import Literal, get_args

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PRNGKeyArray, Shaped

from . import cpu_kernel
from ._types import ObsKind
from .checks import check_actions, typechecked

ConvRoute = Literal["kernel", "matmul", "xla"]
"""How a model computes its convolutions (see this module's docstring)."""
CONV_ROUTES: tuple[str, ...] = get_args(ConvRoute)


def _orthogonal(key: PRNGKeyArray, shape: tuple[int, ...], scale: float) -> Float[Array, "..."]:
    """CleanRL's ``layer_init``: an orthogonal (fan-in x fan-out) matrix times ``scale``."""
    fan_out = shape[-1]
    matrix = jax.nn.initializers.orthogonal(scale)(key, (math.prod(shape[:-1]), fan_out), jnp.float32)
    return matrix.reshape(shape)


NetworkInit = Literal["cleanrl", "gymnax-blines"]
"""How a model's layers start. ``"cleanrl"``: CleanRL's ``layer_init``, an orthogonal matrix (fan-in x fan-out)
times the layer's gain, zero biases. ``"gymnax-blines"``: as gymnax-blines' flax agents start, flax's default
kernels (LeCun normal: variance 1 / fan-in, truncated at two standard deviations) and biases uniform in
``[0, GYMNAX_BLINES_BIAS_HIGH)``; the gains play no part."""
GYMNAX_BLINES_BIAS_HIGH = 0.05


def _init_layer(
    key: PRNGKeyArray, shape: tuple[int, ...], scale: float, init: NetworkInit
) -> tuple[Float[Array, "..."], Float[Array, " fan_out"]]:
    """A layer's weight of ``shape`` (fan-in axes first, fan-out last) and its bias, started as ``init`` says."""
    if init == "cleanrl":
        return _orthogonal(key, shape, scale), jnp.zeros(shape[-1:], jnp.float32)
    weight_key, bias_key = jax.random.split(key)
    weight = jax.nn.initializers.lecun_normal(in_axis=tuple(range(len(shape) - 1)), out_axis=-1)(
        weight_key, shape, jnp.float32
    )
    return weight, jax.random.uniform(bias_key, shape[-1:], jnp.float32, 0.0, GYMNAX_BLINES_BIAS_HIGH)


class Dense(eqx.Module):
    weight: Float[Array, "fan_in fan_out"]
    bias: Float[Array, " fan_out"]

    def __init__(self, fan_in: int, fan_out: int, scale: float, *, init: NetworkInit = "cleanrl", key: PRNGKeyArray):
        self.weight, self.bias = _init_layer(key, (fan_in, fan_out), scale, init)

    def __call__(self, x: Float[Array, "B fan_in"]) -> Float[Array, "B fan_out"]:
        return x @ self.weight + self.bias


def space_to_depth(x: Shaped[Array, "B H W C"], block: int) -> Shaped[Array, "B h w D"]:
    """Fold each ``block x block`` tile into channels, ordered (row in tile, column in tile, channel)."""
    b, h, w, c = x.shape
    x = x.reshape(b, h // block, block, w // block, block, c).transpose(0, 1, 3, 2, 4, 5)
    return x.reshape(b, h // block, w // block, block * block * c)


def frames_space_to_depth(frames: Shaped[Array, "B C H W"], block: int) -> Shaped[Array, "B h w D"]:
    """``space_to_depth`` of NCHW frames straight from their stored layout (one transpose, any dtype)."""
    b, c, h, w = frames.shape
    x = frames.reshape(b, c, h // block, block, w // block, block).transpose(0, 2, 4, 3, 5, 1)
    return x.reshape(b, h // block, w // block, block * block * c)


def neighbour_columns(x: Float[Array, "B H W C"], size: int) -> Float[Array, "B H w D"]:
    """Each position's ``size`` horizontal neighbours side by side: ``[B, H, W - size + 1, size * C]``,
    ordered (kernel column, channel)."""
    b, h, w, c = x.shape
    out_w = w - size + 1
    # Stacking on a new axis then merging it with channels runs faster on CPU than concatenating channels.
    return jnp.stack([x[:, :, j : j + out_w, :] for j in range(size)], axis=3).reshape(b, h, out_w, size * c)


@jax.custom_vjp
def shift_sum(z: Float[Array, "B h w k k C"]) -> Float[Array, "B oh ow C"]:
    """``y[:, i, j] = sum over (a, b) of z[:, i + a, j + b, a, b]``: the outputs of k*k kernel slices, each
    shifted into place and added."""
    k = z.shape[3]
    out_h, out_w = z.shape[1] - k + 1, z.shape[2] - k + 1
    first, *rest = [z[:, a : a + out_h, b : b + out_w, a, b] for a in range(k) for b in range(k)]
    return sum(rest, first)


def _shift_sum_forward(z: Float[Array, "B h w k k C"]) -> tuple[Float[Array, "B oh ow C"], int]:
    return shift_sum(z), z.shape[3]


def _shift_sum_backward(k: int, dy: Float[Array, "B oh ow C"]) -> tuple[Float[Array, "B h w k k C"]]:
    # The cotangent of each shifted slice is dy padded back into place. Stacking the k*k pads writes the
    # result once; autodiff's default (a sum of k*k zero-padded full-size arrays) writes it k*k times.
    def pad(a: int, b: int) -> Float[Array, "B h w C"]:
        return jnp.pad(dy, ((0, 0), (a, k - 1 - a), (b, k - 1 - b), (0, 0)))

    return (jnp.stack([jnp.stack([pad(a, b) for b in range(k)], axis=3) for a in range(k)], axis=3),)


shift_sum.defvjp(_shift_sum_forward, _shift_sum_backward)


@jax.custom_vjp
def shift_rows(z: Float[Array, "B h w k C"]) -> Float[Array, "B oh w C"]:
    """``y[:, i] = sum over a of z[:, i + a, :, a]``: the outputs of k kernel rows, shifted into place and added."""
    k = z.shape[3]
    out_h = z.shape[1] - k + 1
    first, *rest = [z[:, a : a + out_h, :, a] for a in range(k)]
    return sum(rest, first)


def _shift_rows_forward(z: Float[Array, "B h w k C"]) -> tuple[Float[Array, "B oh w C"], int]:
    return shift_rows(z), z.shape[3]


def _shift_rows_backward(k: int, dy: Float[Array, "B oh w C"]) -> tuple[Float[Array, "B h w k C"]]:
    # As in _shift_sum_backward: one stack of pads.
    pads = [jnp.pad(dy, ((0, 0), (a, k - 1 - a), (0, 0), (0, 0))) for a in range(k)]
    return (jnp.stack(pads, axis=3),)


shift_rows.defvjp(_shift_rows_forward, _shift_rows_backward)


class Conv(eqx.Module):
    """A VALID convolution in NHWC with an HWIO kernel (flax's layout), kernel size a multiple of stride.

    The "matmul" path folds the stride into channels (space-to-depth), which leaves a stride-1 convolution
    with a ``k x k`` kernel, ``k = size / stride``. A folded (strided) layer, k = 2 with many channels,
    multiplies every input position by all k*k kernel slices in one matmul and adds the k*k shifted
    outputs. A stride-1 layer (3 x 3 here) puts each position's k horizontal neighbours side by side (k
    times the input, not the k*k of full patches), multiplies them by all k kernel rows, and adds the k
    row-shifted outputs. Each was the fastest of the three (full patches too) for its layers on CPU
    (bench/microbench.py; commit messages give the numbers).
    """

    weight: Float[Array, "kh kw cin cout"]
    bias: Float[Array, " cout"]
    stride: int = eqx.field(static=True)

    def __init__(
        self,
        cin: int,
        cout: int,
        size: int,
        stride: int,
        scale: float,
        *,
        init: NetworkInit = "cleanrl",
        key: PRNGKeyArray,
    ):
        if size % stride:
            raise ValueError(f"kernel size {size} must be a multiple of stride {stride}")
        self.weight, self.bias = _init_layer(key, (size, size, cin, cout), scale, init)
        self.stride = stride

    def output_size(self, size: int) -> int:
        return (size - self.weight.shape[0]) // self.stride + 1

    def input_extent(self, size: int) -> int:
        """How many rows (or columns) of an input of ``size`` the VALID convolution reads."""
        return self.output_size(size) * self.stride + self.weight.shape[0] - self.stride

    def __call__(self, x: Float[Array, "B H W C"], impl: ConvRoute) -> Float[Array, "B h w cout"]:
        if impl == "xla":
            y = jax.lax.conv_general_dilated(
                x, self.weight, (self.stride, self.stride), "VALID", dimension_numbers=("NHWC", "HWIO", "NHWC")
            )
            return y + self.bias
        if impl == "kernel" and cpu_kernel.conv_computes(x.shape, self.weight.shape):
            return cpu_kernel.conv(x, self.weight, self.bias, self.stride)
        _, h, w, _ = x.shape
        x = x[:, : self.input_extent(h), : self.input_extent(w), :]
        return self.on_space_to_depth(space_to_depth(x, self.stride))

    def on_space_to_depth(self, x: Float[Array, "B h w D"]) -> Float[Array, "B oh ow cout"]:
        """The convolution of an input already folded by ``space_to_depth(x, stride)`` (and cropped)."""
        s = self.stride
        size, _, _, cout = self.weight.shape
        k = size // s
        b, h, w, depth = x.shape
        if s > 1:
            # Rows (bi, bj, cin) match space_to_depth(x), columns (ki, kj, cout): every kernel slice's output
            # at every input position in one product, then shifted into place.
            kernel = self.folded_kernel().transpose(2, 0, 1, 3).reshape(depth, k * k * cout)
            y = shift_sum((x.reshape(-1, depth) @ kernel).reshape(b, h, w, k, k, cout))
        else:
            # Rows (kj, cin) match neighbour_columns(x), columns (ki, cout): every kernel row's output at
            # every input row in one product, then shifted into place.
            out_w = w - k + 1
            kernel = self.weight.transpose(1, 2, 0, 3).reshape(k * depth, k * cout)
            columns = neighbour_columns(x, k).reshape(-1, k * depth)
            y = shift_rows((columns @ kernel).reshape(b, h, out_w, k, cout))
        return y + self.bias

    def folded_kernel(self) -> Float[Array, "k k D cout"]:
        """The kernel of the stride-1 convolution that this layer is on ``space_to_depth(x, stride)``:
        ``[k, k, stride * stride * cin, cout]``, depth ordered as space_to_depth orders it."""
        s = self.stride
        size, _, cin, cout = self.weight.shape
        k = size // s
        # The kernel (k*s, k*s, cin, cout) viewed as (ki, bi, kj, bj, cin, cout).
        kernel = self.weight.reshape(k, s, k, s, cin, cout).transpose(0, 2, 1, 3, 4, 5)
        return kernel.reshape(k, k, s * s * cin, cout)


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


class ActorCritic(eqx.Module):
    """Policy logits and state values for a batch of observations.

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
                "resolved before a model is built: ppo_eqx.host.conv_route.resolve_conv_impl)"
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

    @typechecked
    def evaluate_actions(
        self, obs: Shaped[Array, " B *obs"], actions: Int[Array, " B"], *, prepared: bool = False
    ) -> tuple[Float[Array, " B"], Float[Array, " B"], Float[Array, " B"]]:
        """Log-probability of ``actions`` (each in ``0 .. A-1``: checked when they are known, in an eager call),
        policy entropy and value, each ``[B]``."""
        check_actions(actions, self.num_actions, "evaluate_actions")
        logits, value = self(obs, prepared=prepared)
        logprob, entropy = categorical_logprob_entropy(logits, actions)
        return logprob, entropy, value


def categorical_logprob_entropy(
    logits: Float[Array, "B A"], actions: Int[Array, " B"]
) -> tuple[Float[Array, " B"], Float[Array, " B"]]:
    """Log-probability of ``actions`` under softmax(logits), and the distribution's entropy."""
    log_probs = jax.nn.log_softmax(logits)
    logprob = jnp.take_along_axis(log_probs, actions[:, None], axis=1)[:, 0]
    entropy = -jnp.sum(jnp.exp(log_probs) * log_probs, axis=-1)
    return logprob, entropy
