"""The Nature CNN's first convolution by hand on XLA:CPU (``conv_impl="kernel"``).

``first_conv`` computes the first layer from the uint8 frames folded by ``space_to_depth``: a C++ kernel
(``cpu_kernel.cc``) called through XLA's FFI, for the forward pass and the weight gradient. It gives the same
numbers as the "matmul" route within float32 rounding, near the CPU's matmul rate: the layer takes about
21 ms of a 256-frame minibatch step on one core instead of 55 (bench/profile_update.py), because it never
writes the k*k-times-larger intermediate that the matmul route needs, nor the frames as float32.

The kernel is compiled on first use with the machine's C++ compiler (``$CXX``, else ``g++`` or ``c++``)
and jaxlib's FFI headers, for this CPU (``-march=native``), into ``$PPO_EQX_CACHE`` (default
``~/.cache/ppo_eqx``), keyed by the source, the flags, jaxlib's version and the CPU. ``available()`` says
whether that worked; ``conv_impl="auto"`` falls back to "matmul" where it did not.
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

import jax
import jax.numpy as jnp
import jaxlib
from jaxtyping import Array, Float, UInt8

SOURCE = Path(__file__).with_name("cpu_kernel.cc")
FLAGS = ("-O3", "-march=native", "-ffp-contract=fast", "-std=c++17", "-shared", "-fPIC", "-w")
OUT_CHANNELS = 32
"""The kernel's output channels (the Nature CNN's first layer); its input depth must be a multiple of 8."""
_FORWARD = "ppo_eqx_first_conv_forward"
_WEIGHT_GRADIENT = "ppo_eqx_first_conv_weight_gradient"
_log = logging.getLogger(__name__)


class KernelUnavailable(RuntimeError):
    """The CPU kernel could not be built or loaded here; the message says why."""


def _cpu_flags() -> str:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor()
    return next((line for line in lines if line.startswith("flags")), platform.processor())


def find_compiler() -> str | None:
    """The C++ compiler the kernel is built with: ``$CXX``, else ``g++`` or ``c++`` on the PATH; None if none."""
    return os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")


def _compiler() -> str:
    compiler = find_compiler()
    if compiler is None:
        raise KernelUnavailable("no C++ compiler found (set $CXX, or install g++) to build ppo_eqx's CPU kernel")
    return compiler


def library_path() -> Path:
    """Where the compiled kernel for this source, jaxlib and CPU lives (built or not)."""
    key = hashlib.sha256(
        b"\0".join([SOURCE.read_bytes(), " ".join(FLAGS).encode(), jaxlib.__version__.encode(), _cpu_flags().encode()])
    ).hexdigest()[:16]
    cache = Path(os.environ.get("PPO_EQX_CACHE") or Path.home() / ".cache" / "ppo_eqx")
    return cache / f"cpu_kernel-{key}.so"


def build(path: Path) -> None:
    """Compile ``cpu_kernel.cc`` into ``path`` (written whole, then renamed into place)."""
    compiler = _compiler()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise KernelUnavailable(f"could not create the kernel cache {path.parent}: {error}") from error
    partial = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    command = [compiler, *FLAGS, "-I", jax.ffi.include_dir(), str(SOURCE), "-o", str(partial)]
    try:
        result = subprocess.run(command, capture_output=True, text=True, check=False)
    except OSError as error:
        raise KernelUnavailable(f"{compiler} could not build {SOURCE.name}: {error}") from error
    if result.returncode != 0:
        partial.unlink(missing_ok=True)
        last = (result.stderr.strip().splitlines() or [f"exit status {result.returncode}"])[-1]
        raise KernelUnavailable(f"{compiler} could not build {SOURCE.name}: {last}")
    os.replace(partial, path)


@functools.cache  # a failure is not cached: the next call tries again
def load() -> None:
    """Build (once per machine) and register the kernel with XLA; raises ``KernelUnavailable`` if it can't."""
    path = library_path()
    if not path.exists():
        build(path)
    try:
        library = ctypes.cdll.LoadLibrary(str(path))
    except OSError as error:
        raise KernelUnavailable(f"could not load {path}: {error}") from error
    for name, symbol in ((_FORWARD, "PpoEqxFirstConvForward"), (_WEIGHT_GRADIENT, "PpoEqxFirstConvWeightGradient")):
        jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(getattr(library, symbol)), platform="cpu")


@functools.cache
def available() -> bool:
    """Whether the kernel is built and registered here (building it if need be). Logs why not, once."""
    try:
        load()
    except KernelUnavailable as error:
        _log.warning("ppo_eqx's CPU kernel is unavailable, convolutions fall back to matmuls: %s", error)
        return False
    return True


@jax.custom_vjp
def first_conv(
    frames: UInt8[Array, "B H W D"], kernel: Float[Array, "k k D C"], bias: Float[Array, " C"]
) -> Float[Array, "B oh ow C"]:
    """``y[:, i, j] = bias + sum over (a, b, d) of frames[:, i + a, j + b, d] / 255 * kernel[a, b, d]``: a VALID
    stride-1 convolution of the uint8 frames scaled by 1/255 (C = 32, D a multiple of 8). No gradient flows
    to the frames."""
    b, h, w, depth = frames.shape
    k, _, _, c = kernel.shape
    if c != OUT_CHANNELS or depth % 8:
        raise ValueError(
            f"first_conv computes {OUT_CHANNELS} output channels from a depth that is a multiple of 8, "
            f"not {c} from {depth}"
        )
    load()
    out = jax.ShapeDtypeStruct((b, h - k + 1, w - k + 1, c), jnp.float32)
    return jax.ffi.ffi_call(_FORWARD, out, vmap_method="sequential")(frames, kernel, bias)


def _first_conv_forward(
    frames: UInt8[Array, "B H W D"], kernel: Float[Array, "k k D C"], bias: Float[Array, " C"]
) -> tuple[Float[Array, "B oh ow C"], tuple[UInt8[Array, "B H W D"], Float[Array, "k k D C"]]]:
    return first_conv(frames, kernel, bias), (frames, kernel)


def _first_conv_backward(
    residuals: tuple[UInt8[Array, "B H W D"], Float[Array, "k k D C"]], dy: Float[Array, "B oh ow C"]
) -> tuple[None, Float[Array, "k k D C"], Float[Array, " C"]]:
    frames, kernel = residuals
    out = jax.ShapeDtypeStruct(kernel.shape, jnp.float32)
    dkernel = jax.ffi.ffi_call(_WEIGHT_GRADIENT, out, vmap_method="sequential")(frames, dy)
    return None, dkernel, jnp.sum(dy, axis=(0, 1, 2))


first_conv.defvjp(_first_conv_forward, _first_conv_backward)
