"""The Nature CNN's convolutions by hand on XLA:CPU (``conv_impl="kernel"``): the pure wrappers around the C++
kernel's FFI calls (``ppo_eqx/host/cpu_kernel.cc``), which ``ppo_eqx.host.kernel_build`` builds, loads and
registers with XLA, then names here (``use``): this module runs no compiler and touches no file.

- ``first_conv`` computes the first layer from the uint8 frames as the env returns them, forward pass and
  weight gradient. Each frame is folded by the stride (``space_to_depth``) and scaled inside the kernel, so the
  layer never writes the k*k-times-larger intermediate that the matmul route needs, nor the frames as float32,
  nor their relayout.
- ``conv`` computes a layer of 64 output channels (the second and third), forward pass, input gradient and
  weight gradient. Each output position reads its window straight from the input, so the kernel computes
  exactly the layer's products, where the matmul route computes more at positions its shifted sums then drop.

Both give the same numbers as the "matmul" route within float32 rounding (docs/performance.md has the speeds).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, UInt8

OUT_CHANNELS = 32
"""The kernel's output channels (the Nature CNN's first layer); its input depth must be a multiple of 8."""
CONV_OUT_CHANNELS = 64
"""``conv``'s output channels (the Nature CNN's second and third layers); its input depth must be a multiple
of 16, at most 64."""
FORWARD = "first_conv_forward"  # the names of the FFI targets, after the prefix ``use`` is given
WEIGHT_GRADIENT = "first_conv_weight_gradient"
CONV_FORWARD = "conv_forward"
CONV_INPUT_GRADIENT = "conv_input_gradient"
CONV_WEIGHT_GRADIENT = "conv_weight_gradient"
TARGETS = (FORWARD, WEIGHT_GRADIENT, CONV_FORWARD, CONV_INPUT_GRADIENT, CONV_WEIGHT_GRADIENT)
_loaded: list[str] = []


def use(prefix: str) -> None:
    """Call the kernel whose FFI targets are registered as ``prefix + name`` for each of ``TARGETS`` (what
    ``ppo_eqx.host.kernel_build.load`` registers). Until then the wrappers refuse to trace."""
    _loaded[:] = [prefix]


def _target(name: str) -> str:
    if not _loaded:
        raise RuntimeError(
            "ppo_eqx's CPU kernel is not loaded: ppo_eqx.host.kernel_build.load() builds and registers it (the "
            'command line and the Trainer do so where conv_impl="kernel")'
        )
    return _loaded[0] + name


def first_conv(
    frames: UInt8[Array, "B C H W"], kernel: Float[Array, "k k D O"], bias: Float[Array, " O"], stride: int
) -> Float[Array, "B oh ow O"]:
    """The first layer on the frames as the env returns them, ``[B, C, H, W]`` uint8, scaled by 1/255: a VALID
    convolution at ``stride`` with the layer's kernel folded for ``space_to_depth(frames, stride)``
    (``Conv.folded_kernel()``, ``[k, k, D, O]`` with ``D = stride * stride * C``), i.e.
    ``y[:, i, j] = bias + sum over (a, b, d) of folded[:, i + a, j + b, d] / 255 * kernel[a, b, d]``.
    O must be 32 and D a multiple of 8. No gradient flows to the frames."""
    b, c, h, w = frames.shape
    k, _, depth, out_channels = kernel.shape
    if out_channels != OUT_CHANNELS or depth % 8:
        raise ValueError(
            f"first_conv computes {OUT_CHANNELS} output channels from a depth that is a multiple of 8, "
            f"not {out_channels} from {depth}"
        )
    if depth != stride * stride * c or min(h, w) < k * stride:
        raise ValueError(
            f"first_conv at stride {stride} needs a kernel depth of {stride * stride * c} (stride^2 x {c} channels) "
            f"and frames of at least {k * stride} x {k * stride}, not depth {depth} and {h} x {w}"
        )
    return _first_conv(frames, kernel, bias, stride)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _first_conv(
    frames: UInt8[Array, "B C H W"], kernel: Float[Array, "k k D O"], bias: Float[Array, " O"], stride: int
) -> Float[Array, "B oh ow O"]:
    b, _, h, w = frames.shape
    k, _, _, out_channels = kernel.shape
    out_h, out_w = (h - k * stride) // stride + 1, (w - k * stride) // stride + 1
    out = jax.ShapeDtypeStruct((b, out_h, out_w, out_channels), jnp.float32)
    call = jax.ffi.ffi_call(_target(FORWARD), out, vmap_method="sequential")
    return call(frames, kernel, bias, stride=np.int64(stride))


def _first_conv_forward(
    frames: UInt8[Array, "B C H W"], kernel: Float[Array, "k k D O"], bias: Float[Array, " O"], stride: int
) -> tuple[Float[Array, "B oh ow O"], tuple[UInt8[Array, "B C H W"], Float[Array, "k k D O"]]]:
    return _first_conv(frames, kernel, bias, stride), (frames, kernel)


def _first_conv_backward(
    stride: int, residuals: tuple[UInt8[Array, "B C H W"], Float[Array, "k k D O"]], dy: Float[Array, "B oh ow O"]
) -> tuple[None, Float[Array, "k k D O"], Float[Array, " O"]]:
    frames, kernel = residuals
    out = jax.ShapeDtypeStruct(kernel.shape, jnp.float32)
    call = jax.ffi.ffi_call(_target(WEIGHT_GRADIENT), out, vmap_method="sequential")
    dkernel = call(frames, dy, stride=np.int64(stride))
    return None, dkernel, jnp.sum(dy, axis=(0, 1, 2))


_first_conv.defvjp(_first_conv_forward, _first_conv_backward)


def conv_computes(x_shape: tuple[int, ...], kernel_shape: tuple[int, ...]) -> bool:
    """Whether ``conv`` computes a layer with this NHWC input and HWIO kernel: 64 output channels from a
    multiple of 16 input channels, at most 64, and a square kernel that fits the input."""
    k, k2, c, out_channels = kernel_shape
    return (
        len(x_shape) == 4
        and x_shape[3] == c
        and c % 16 == 0
        and 0 < c <= 64
        and out_channels == CONV_OUT_CHANNELS
        and k == k2
        and min(x_shape[1:3]) >= k
    )


def conv(
    x: Float[Array, "B H W C"], kernel: Float[Array, "k k C O"], bias: Float[Array, " O"], stride: int
) -> Float[Array, "B oh ow O"]:
    """A VALID convolution at ``stride``, NHWC input and HWIO kernel, by the C++ kernel: each output position
    reads its window straight from ``x``, so it computes exactly the layer's products (see ``conv_computes``
    for the shapes it takes)."""
    if not conv_computes(x.shape, kernel.shape):
        raise ValueError(
            f"conv computes {CONV_OUT_CHANNELS} output channels from 16, 32, 48 or 64 input channels with a "
            f"square kernel that fits the input, not input {x.shape} and kernel {kernel.shape}"
        )
    return _conv(x, kernel, bias, stride)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _conv(
    x: Float[Array, "B H W C"], kernel: Float[Array, "k k C O"], bias: Float[Array, " O"], stride: int
) -> Float[Array, "B oh ow O"]:
    b, h, w, _ = x.shape
    k = kernel.shape[0]
    out = jax.ShapeDtypeStruct((b, (h - k) // stride + 1, (w - k) // stride + 1, CONV_OUT_CHANNELS), jnp.float32)
    call = jax.ffi.ffi_call(_target(CONV_FORWARD), out, vmap_method="sequential")
    return call(x, kernel, bias, stride=np.int64(stride))


def _conv_forward(
    x: Float[Array, "B H W C"], kernel: Float[Array, "k k C O"], bias: Float[Array, " O"], stride: int
) -> tuple[Float[Array, "B oh ow O"], tuple[Float[Array, "B H W C"], Float[Array, "k k C O"]]]:
    return _conv(x, kernel, bias, stride), (x, kernel)


def _conv_backward(
    stride: int, residuals: tuple[Float[Array, "B H W C"], Float[Array, "k k C O"]], dy: Float[Array, "B oh ow O"]
) -> tuple[Float[Array, "B H W C"], Float[Array, "k k C O"], Float[Array, " O"]]:
    x, kernel = residuals
    call = functools.partial(jax.ffi.ffi_call, vmap_method="sequential")
    dx = call(_target(CONV_INPUT_GRADIENT), jax.ShapeDtypeStruct(x.shape, jnp.float32))(
        dy, jnp.transpose(kernel, (0, 1, 3, 2)), stride=np.int64(stride)
    )
    dkernel = call(_target(CONV_WEIGHT_GRADIENT), jax.ShapeDtypeStruct(kernel.shape, jnp.float32))(
        x, dy, stride=np.int64(stride)
    )
    return dx, dkernel, jnp.sum(dy, axis=(0, 1, 2))


_conv.defvjp(_conv_forward, _conv_backward)
