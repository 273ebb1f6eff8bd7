"""The Nature CNN's convolutions by hand on XLA:CPU (``conv_impl="kernel"``): C++ (``cpu_kernel.cc``) called
through XLA's FFI.

- ``first_conv`` computes the first layer from the uint8 frames as the env returns them, forward pass and
  weight gradient. Each frame is folded by the stride (``space_to_depth``) and scaled inside the kernel. The
  layer takes about 2/5 of the matmul route's time (bench/profile_update.py), because it never writes the
  k*k-times-larger intermediate that the matmul route needs, nor the frames as float32, nor their relayout.
- ``conv`` computes a layer of 64 output channels (the second and third), forward pass, input gradient and
  weight gradient. Each output position reads its window straight from the input, so the kernel computes
  exactly the layer's products, where the matmul route computes 23% (conv2) and 29% (conv3) more at positions
  its shifted sums then drop, and relayouts its inputs and cotangents around each product.

Both give the same numbers as the "matmul" route within float32 rounding, near the CPU's matmul rate.

The kernel is compiled on first use with the machine's C++ compiler (``$CXX``, else ``g++`` or ``c++``)
and jaxlib's FFI headers into ``$PPO_EQX_CACHE`` (default ``~/.cache/ppo_eqx``), keyed by the source, the flags,
jaxlib's version and the CPU. ``$PPO_EQX_KERNEL_ISA`` says what it is built for:

- ``native`` (the default): this CPU (``-march=native``);
- ``avx512``: any AVX-512 CPU (``-march=x86-64-v4``);
- ``avx2``: any CPU with AVX2 and FMA (``-march=x86-64-v3``): AMD Zen 1-3, most laptops and desktops. On an
  AVX-512 machine this builds and measures the AVX2 kernel (``bench/train_speed.py --isa avx2``).

Its vectors are one machine register each: 16 floats with AVX-512, 8 with AVX2, in register blocks sized so
that nothing spills. Without AVX2 and FMA the source refuses to build. ``isa()`` says what it was built for;
``available()`` whether the build worked; ``conv_impl="auto"`` falls back to "matmul" where it did not.
"""

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
from pathlib import Path
from typing import NamedTuple

import jax
import jax.numpy as jnp
import jaxlib
import numpy as np
from jaxtyping import Array, Float, UInt8

SOURCE = Path(__file__).with_name("cpu_kernel.cc")
FLAGS = ("-O3", "-ffp-contract=fast", "-std=c++17", "-shared", "-fPIC", "-w")
"""The compiler's flags besides ``-march``."""
ISA_VARIABLE = "PPO_EQX_KERNEL_ISA"
MARCH = {"native": "native", "avx512": "x86-64-v4", "avx2": "x86-64-v3"}
"""``$PPO_EQX_KERNEL_ISA``'s values and the ``-march`` each builds the kernel for."""
_CPU_FLAGS = {
    "avx512": {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"},
    "avx2": {"avx", "avx2", "fma", "bmi1", "bmi2", "f16c", "movbe", "abm"},
}
"""What /proc/cpuinfo's flags must hold for each ISA (``-march=x86-64-v4``'s and ``x86-64-v3``'s extensions)."""
_VECTOR_LANES = {16: "avx512", 8: "avx2"}
OUT_CHANNELS = 32
"""The kernel's output channels (the Nature CNN's first layer); its input depth must be a multiple of 8."""
CONV_OUT_CHANNELS = 64
"""``conv``'s output channels (the Nature CNN's second and third layers); its input depth must be a multiple
of 16, at most 64."""
_FORWARD = "first_conv_forward"  # the names of the FFI targets, after Built.targets
_WEIGHT_GRADIENT = "first_conv_weight_gradient"
_CONV_FORWARD = "conv_forward"
_CONV_INPUT_GRADIENT = "conv_input_gradient"
_CONV_WEIGHT_GRADIENT = "conv_weight_gradient"
_SYMBOLS = {
    _FORWARD: "PpoEqxFirstConvForward",
    _WEIGHT_GRADIENT: "PpoEqxFirstConvWeightGradient",
    _CONV_FORWARD: "PpoEqxConvForward",
    _CONV_INPUT_GRADIENT: "PpoEqxConvInputGradient",
    _CONV_WEIGHT_GRADIENT: "PpoEqxConvWeightGradient",
}
_log = logging.getLogger(__name__)


class KernelUnavailable(RuntimeError):
    """The CPU kernel could not be built or loaded here; the message says why."""


def _cpu_flags() -> str:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor()
    return next((line for line in lines if line.startswith("flags")), platform.processor())


def cpu_supports(isa: str) -> bool:
    """Whether this CPU runs the kernel built for ``isa``: "avx512" or "avx2" (``MARCH``'s CPU classes), or
    "native" (this CPU: it needs AVX2 and FMA)."""
    return _CPU_FLAGS["avx2" if isa == "native" else isa] <= set(_cpu_flags().split())


def requested_isa() -> str:
    """What ``$PPO_EQX_KERNEL_ISA`` asks the kernel to be built for: "native" (the default), "avx512" or "avx2"."""
    isa = os.environ.get(ISA_VARIABLE) or "native"
    if isa not in MARCH:
        raise KernelUnavailable(f"{ISA_VARIABLE}={isa!r} is not one of {', '.join(MARCH)}")
    return isa


def find_compiler() -> str | None:
    """The C++ compiler the kernel is built with: ``$CXX``, else ``g++`` or ``c++`` on the PATH; None if none."""
    return os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")


def _compiler() -> str:
    compiler = find_compiler()
    if compiler is None:
        raise KernelUnavailable("no C++ compiler found (set $CXX, or install g++) to build ppo_eqx's CPU kernel")
    return compiler


def library_path(isa: str = "native") -> Path:
    """Where the kernel compiled for ``isa`` (a key of ``MARCH``), this source, jaxlib and CPU lives (built or
    not)."""
    parts = [SOURCE.read_bytes(), f"-march={MARCH[isa]} {' '.join(FLAGS)}".encode(), jaxlib.__version__.encode()]
    key = hashlib.sha256(b"\0".join([*parts, _cpu_flags().encode()])).hexdigest()[:16]
    cache = Path(os.environ.get("PPO_EQX_CACHE") or Path.home() / ".cache" / "ppo_eqx")
    return cache / f"cpu_kernel-{key}.so"


def build(path: Path, march: str = "native") -> None:
    """Compile ``cpu_kernel.cc`` for ``-march=march`` into ``path`` (written whole, then renamed into place)."""
    compiler = _compiler()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise KernelUnavailable(f"could not create the kernel cache {path.parent}: {error}") from error
    partial = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    command = [compiler, f"-march={march}", *FLAGS, "-I", jax.ffi.include_dir(), str(SOURCE), "-o", str(partial)]
    try:
        result = subprocess.run(command, capture_output=True, text=True, check=False)
    except OSError as error:
        raise KernelUnavailable(f"{compiler} could not build {SOURCE.name}: {error}") from error
    if result.returncode != 0:
        partial.unlink(missing_ok=True)
        lines = result.stderr.strip().splitlines() or [f"exit status {result.returncode}"]
        reason = next((line for line in lines if "error" in line), lines[-1])  # notes may follow the error
        raise KernelUnavailable(f"{compiler} could not build {SOURCE.name}: {reason}")
    os.replace(partial, path)


class Built(NamedTuple):
    """The kernel registered with XLA: the ISA it was built for and the prefix of its FFI targets' names."""

    isa: str
    targets: str


@functools.cache  # a failure is not cached: the next call tries again
def load() -> Built:
    """Build (once per machine) the kernel for ``requested_isa()`` and register it with XLA; raises
    ``KernelUnavailable`` if it can't. A build for an explicit ISA registers its targets under names that say
    it, so that builds for two ISAs can run in one process (the tests run both: ``load.cache_clear()``)."""
    requested = requested_isa()
    path = library_path(requested)
    if not path.exists():
        build(path, MARCH[requested])
    try:
        library = ctypes.cdll.LoadLibrary(str(path))
    except OSError as error:
        raise KernelUnavailable(f"could not load {path}: {error}") from error
    targets = "ppo_eqx_" if requested == "native" else f"ppo_eqx_{requested}_"
    for name, symbol in _SYMBOLS.items():
        jax.ffi.register_ffi_target(targets + name, jax.ffi.pycapsule(getattr(library, symbol)), platform="cpu")
    return Built(_VECTOR_LANES[library.PpoEqxVectorLanes()], targets)


@functools.cache
def available() -> bool:
    """Whether the kernel is built and registered here (building it if need be). Logs why not, once."""
    try:
        load()
    except KernelUnavailable as error:
        _log.warning("ppo_eqx's CPU kernel is unavailable, convolutions fall back to matmuls: %s", error)
        return False
    return True


def isa() -> str | None:
    """What the kernel is built for here, "avx512" or "avx2" (building it if need be); None where it does not
    build (``available()`` logs why)."""
    return load().isa if available() else None


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
    call = jax.ffi.ffi_call(load().targets + _FORWARD, out, vmap_method="sequential")
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
    call = jax.ffi.ffi_call(load().targets + _WEIGHT_GRADIENT, out, vmap_method="sequential")
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
    call = jax.ffi.ffi_call(load().targets + _CONV_FORWARD, out, vmap_method="sequential")
    return call(x, kernel, bias, stride=np.int64(stride))


def _conv_forward(
    x: Float[Array, "B H W C"], kernel: Float[Array, "k k C O"], bias: Float[Array, " O"], stride: int
) -> tuple[Float[Array, "B oh ow O"], tuple[Float[Array, "B H W C"], Float[Array, "k k C O"]]]:
    return _conv(x, kernel, bias, stride), (x, kernel)


def _conv_backward(
    stride: int, residuals: tuple[Float[Array, "B H W C"], Float[Array, "k k C O"]], dy: Float[Array, "B oh ow O"]
) -> tuple[Float[Array, "B H W C"], Float[Array, "k k C O"], Float[Array, " O"]]:
    x, kernel = residuals
    targets = load().targets
    call = functools.partial(jax.ffi.ffi_call, vmap_method="sequential")
    dx = call(targets + _CONV_INPUT_GRADIENT, jax.ShapeDtypeStruct(x.shape, jnp.float32))(
        dy, jnp.transpose(kernel, (0, 1, 3, 2)), stride=np.int64(stride)
    )
    dkernel = call(targets + _CONV_WEIGHT_GRADIENT, jax.ShapeDtypeStruct(kernel.shape, jnp.float32))(
        x, dy, stride=np.int64(stride)
    )
    return dx, dkernel, jnp.sum(dy, axis=(0, 1, 2))


_conv.defvjp(_conv_forward, _conv_backward)
