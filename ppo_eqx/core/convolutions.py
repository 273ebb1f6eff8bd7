"""The Nature CNN's convolutions (``Conv``) and the routes that compute them (``ConvRoute``), which give the same
numbers within float32 rounding:

- ``"xla"``: ``lax.conv_general_dilated``.
- ``"matmul"``: space-to-depth by the stride, then matrix products (see ``Conv``). On CPU, XLA's
  convolution gradients run far below its matmul rate and slow down another ten times inside
  ``lax.scan``; matrix products do neither. The frames are folded while still uint8.
- ``"kernel"``: hand-written CPU kernels (``cpu_kernel``). The first layer reads the uint8 frames and folds
  them itself (``first_conv``, faster than the matmuls: docs/performance.md); the other two read each window straight
  from their input (``conv``), so they compute exactly the layers' products, where the matmul route computes
  23-29% more and relayouts around each product. Layers the kernels do not take fall back to "matmul".
A model is built with its route and never chooses one itself: ``PPOConfig.conv_impl``'s "auto" is resolved once,
at the edge (``ppo_eqx.host.kernel_build.resolve_conv_impl``: "xla" off the CPU backend; on it "kernel" where the
kernel builds, else "matmul"), because finding out may compile the kernel. The matmul route was designed around
XLA:CPU's slow convolution gradients and has not been measured on an accelerator (``bench/device_check.py``
measures both there).
"""

from typing import Literal, get_args

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, PRNGKeyArray, Shaped

from . import cpu_kernel
from .layers import NetworkInit, _init_layer

ConvRoute = Literal["kernel", "matmul", "xla"]
"""How a model computes its convolutions (this module's docstring)."""
CONV_ROUTES: tuple[str, ...] = get_args(ConvRoute)


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
