"""ppo_eqx's CPU kernel (``cpu_kernel.cc``, the convolutions of ``conv_impl="kernel"``): its build with the
machine's C++ compiler, its cache, the CPU it is built for, and its loading into XLA, whose FFI targets the
core's wrappers (``ppo_eqx.core.cpu_kernel``) then call; and the route a model's convolutions take here
(``resolve_conv_impl``, ``ready``, at the end).

The kernel is compiled with ``$CXX`` (else ``g++`` or ``c++``) and jaxlib's FFI headers into ``$PPO_EQX_CACHE``
(default ``~/.cache/ppo_eqx``), keyed by the source, the flags, jaxlib's version and the CPU. ``build_now`` (the
command ``ppo-eqx build-kernel``, which the README's setup runs) compiles it; ``load`` loads a built one and, where
asked (``build=True``: an explicit ``--conv-impl kernel``), builds it first. ``conv_impl="auto"`` takes the
kernel only where it is built already (``built``): a run never starts a compiler it was not asked for.
``$PPO_EQX_KERNEL_ISA`` says what it is built for:

- ``native`` (the default): this CPU (``-march=native``);
- ``avx512``: any AVX-512 CPU (``-march=x86-64-v4``);
- ``avx2``: any CPU with AVX2 and FMA (``-march=x86-64-v3``): AMD Zen 1-3, most laptops and desktops. On an
  AVX-512 machine this builds and measures the AVX2 kernel (``bench/train_speed.py --isa avx2``).

Its vectors are one machine register each: 16 floats with AVX-512, 8 with AVX2, in register blocks sized so
that nothing spills. Without AVX2 and FMA the source refuses to build.
"""

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
from pathlib import Path
from typing import NamedTuple

import jax
import jaxlib

from ..config import ConvImpl
from ..core import cpu_kernel
from ..core.envs import EnvSpec
from ..core.networks import ConvRoute
from ..errors import ConfigError

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
_SYMBOLS = {
    cpu_kernel.FORWARD: "PpoEqxFirstConvForward",
    cpu_kernel.WEIGHT_GRADIENT: "PpoEqxFirstConvWeightGradient",
    cpu_kernel.CONV_FORWARD: "PpoEqxConvForward",
    cpu_kernel.CONV_INPUT_GRADIENT: "PpoEqxConvInputGradient",
    cpu_kernel.CONV_WEIGHT_GRADIENT: "PpoEqxConvWeightGradient",
}
BUILD_HINT = "ppo-eqx build-kernel"
"""How a user builds the kernel (about 20 s once per machine)."""


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
    return cache_root() / f"cpu_kernel-{key}.so"


def cache_root() -> Path:
    """Where ppo_eqx keeps what it builds for this machine (the kernel here, a TPU's compiled programs in ``xla/``):
    ``$PPO_EQX_CACHE``, default ``~/.cache/ppo_eqx``."""
    return Path(os.environ.get("PPO_EQX_CACHE") or Path.home() / ".cache" / "ppo_eqx")


def build(path: Path, march: str = "native") -> None:
    """Compile ``cpu_kernel.cc`` for ``-march=march`` into ``path`` (written whole, then renamed into place)."""
    compiler = _compiler()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise KernelUnavailable(f"could not create the kernel cache {path.parent}: {error}") from error
    partial = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:  # the cache's own fault (read-only, another's permissions), not the compiler's or the linker's
        partial.touch()
    except OSError as error:
        raise KernelUnavailable(
            f"the kernel cache {path.parent} is not writable ({error.strerror}); set $PPO_EQX_CACHE to a writable "
            "directory"
        ) from error
    command = [compiler, f"-march={march}", *FLAGS, "-I", jax.ffi.include_dir(), str(SOURCE), "-o", str(partial)]
    try:
        result = subprocess.run(command, capture_output=True, text=True, check=False)
    except OSError as error:  # no such compiler: the partial file it would have written goes too
        partial.unlink(missing_ok=True)
        raise KernelUnavailable(f"{compiler} could not build {SOURCE.name}: {error}") from error
    if result.returncode != 0:
        partial.unlink(missing_ok=True)
        lines = result.stderr.strip().splitlines() or [f"exit status {result.returncode}"]
        reason = next((line for line in lines if "error" in line), lines[-1])  # notes may follow the error
        raise KernelUnavailable(f"{compiler} could not build {SOURCE.name}: {reason}")
    digest = _digest_path(path)
    try:
        digest_partial = digest.with_name(f"{digest.name}.{os.getpid()}.tmp")
        digest_partial.write_text(_digest(partial))
        os.replace(partial, path)
        os.replace(digest_partial, digest)
    except OSError as error:
        raise KernelUnavailable(f"could not write the kernel into {path.parent}: {error.strerror}") from error


def _digest_path(path: Path) -> Path:
    """Where the SHA-256 of the kernel at ``path`` is kept, written by ``build`` after the kernel itself."""
    return path.with_suffix(".sha256")


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def cache_problem(path: Path) -> str | None:
    """Why the cached kernel at ``path`` must not be loaded (absent, or its bytes not the ones ``build`` wrote: a
    truncated or overwritten file would crash the process that loads it); None when it may be."""
    if not path.exists():
        return "not built"
    try:
        matches = _digest_path(path).read_text().strip() == _digest(path)
    except OSError:
        matches = False
    return None if matches else f"damaged ({path} is not the file its build wrote)"


def built() -> bool:
    """Whether the kernel for ``requested_isa()`` is in the cache already, whole (nothing is compiled to find
    out)."""
    try:
        return cache_problem(library_path(requested_isa())) is None
    except KernelUnavailable:
        return False


def build_now() -> Path:
    """Build the kernel for ``requested_isa()`` now (``ppo-eqx build-kernel``), replacing a cached one; its path."""
    isa = requested_isa()
    path = library_path(isa)
    build(path, MARCH[isa])
    return path


class Built(NamedTuple):
    """The kernel registered with XLA: the ISA it was built for and the prefix of its FFI targets' names."""

    isa: str
    targets: str


_loaded: dict[str, Built] = {}
"""The kernels loaded in this process, by the ISA asked for (the tests load two: ``$PPO_EQX_KERNEL_ISA``)."""


def load(build_if_missing: bool = True) -> Built:
    """Load the kernel for ``requested_isa()`` (building it first where it is not built and
    ``build_if_missing``), register it with XLA and name it to the core's wrappers (``cpu_kernel.use``); raises
    ``KernelUnavailable`` if it can't. A build for an explicit ISA registers its targets under names that say
    it, so that builds for two ISAs can run in one process, the one asked for last called."""
    requested = requested_isa()
    if requested not in _loaded:
        _loaded[requested] = _load(requested, build_if_missing)
    cpu_kernel.use(_loaded[requested].targets)
    return _loaded[requested]


def _load(requested: str, build_if_missing: bool) -> Built:
    path = library_path(requested)
    problem = cache_problem(path)
    if problem is not None:
        if not build_if_missing:
            raise KernelUnavailable(f"ppo_eqx's CPU kernel is {problem} ({BUILD_HINT} builds it)")
        build(path, MARCH[requested])
    try:
        library = ctypes.cdll.LoadLibrary(str(path))
        functions = {name: getattr(library, symbol) for name, symbol in _SYMBOLS.items()}
        lanes = library.PpoEqxVectorLanes()
    except (OSError, AttributeError) as error:
        raise KernelUnavailable(f"could not load {path}: {error} ({BUILD_HINT} builds it again)") from None
    targets = "ppo_eqx_" if requested == "native" else f"ppo_eqx_{requested}_"
    for name, function in functions.items():
        jax.ffi.register_ffi_target(targets + name, jax.ffi.pycapsule(function), platform="cpu")
    return Built(_VECTOR_LANES[lanes], targets)


def unavailable_reason(*, build_if_missing: bool = True) -> str | None:
    """Why the kernel cannot be loaded here (building it where ``build_if_missing``), or None once it is."""
    try:
        load(build_if_missing)
    except KernelUnavailable as error:
        return str(error)
    return None


def isa() -> str | None:
    """What the loaded kernel is built for here, "avx512" or "avx2"; None where it is not loaded."""
    return load(False).isa if unavailable_reason(build_if_missing=False) is None else None


# --- the convolutions' route ------------------------------------------------------------------------------------------
# How this machine computes the Nature CNN's convolutions: ``conv_impl`` resolved to a route, once, at the edge
# (the ``Trainer``, the command line, the bench scripts), which then passes the route in. Never while a model is
# built or a checkpoint is loaded. "auto" takes ppo_eqx's CPU kernel only where it is built already
# (``built``: ``ppo-eqx build-kernel``, which the README's setup runs); an explicit "kernel" builds it
# where it must (a C++ compile of about 20 s, cached in ``$PPO_EQX_CACHE``).


def kernel_refusal(reason: str, name: str = "conv_impl='kernel'") -> str:
    """The one line that refuses the kernel route (``name``: how the user asked for it) and says why."""
    return f"{name} is unavailable: {reason}; allowed: auto, matmul or xla"


def kernel_unavailable_reason(platform: str | None = None, *, build: bool = True) -> str | None:
    """Why the "kernel" route cannot run on ``platform`` (default: jax's default backend): it is not the CPU, or
    the kernel does not build (``build``), or is not built (not ``build``); None when it can."""
    platform = platform or jax.default_backend()
    if platform != "cpu":
        return f"the CPU kernel runs on the CPU backend only, not {platform!r}"
    return unavailable_reason(build_if_missing=build)


def resolve_conv_impl(conv_impl: ConvImpl, obs_shape: tuple[int, ...], *, platform: str | None = None) -> ConvRoute:
    """The route a model of observations ``obs_shape`` takes for ``conv_impl`` on ``platform`` (default: jax's
    default backend). "auto", for frames, is "xla" off the CPU and, on it, "kernel" where the kernel is built and
    loads (nothing is compiled: ``auto_note`` says how to build it), else "matmul"; for vectors, which have no
    convolutions, "matmul". "kernel" where it cannot run is a ConfigError naming why. Any other value is itself."""
    platform = platform or jax.default_backend()
    if conv_impl not in ("auto", "kernel") or len(obs_shape) != 3:
        return "matmul" if conv_impl == "auto" else conv_impl
    if conv_impl == "auto":
        if platform != "cpu":
            return "xla"
        return "kernel" if kernel_unavailable_reason(platform, build=False) is None else "matmul"
    reason = kernel_unavailable_reason(platform)
    if reason is not None:
        raise ConfigError(kernel_refusal(reason))
    return "kernel"


def resolve_conv_impl_for(conv_impl: ConvImpl, spec: EnvSpec, *, platform: str | None = None) -> ConvRoute:
    """``resolve_conv_impl`` for the model of ``spec``'s observations: only frames are convolved (a MinAtar grid,
    3-D too, goes through MLPs), so anything else takes "matmul" for "auto" and builds no kernel."""
    return resolve_conv_impl(conv_impl, spec.obs_shape if spec.kind == "frames" else (), platform=platform)


def auto_note(conv_impl: ConvImpl, route: ConvRoute, spec: EnvSpec) -> str | None:
    """What a user should know of "auto"'s choice: on the CPU, for frames, that the kernel would be faster and how
    to build it, where "auto" took the matmuls because it is not built; None otherwise."""
    if conv_impl != "auto" or route != "matmul" or spec.kind != "frames" or jax.default_backend() != "cpu":
        return None
    if find_compiler() is None:
        return None
    try:
        problem = cache_problem(library_path(requested_isa()))
    except KernelUnavailable:
        return None
    if problem is None:
        return None
    return f"ppo_eqx's CPU kernel is faster here and {problem}: {BUILD_HINT} builds it, once"


def ready(route: ConvRoute | None) -> None:
    """Make ``route`` runnable in this process: for "kernel", the kernel loaded (built where it is not), or
    ConfigError naming why it cannot be. A model of the route computes only once it is (``core.cpu_kernel``). None:
    a model without convolutions of ours (``core.networks.conv_route_of``)."""
    if route != "kernel":
        return
    reason = kernel_unavailable_reason("cpu")
    if reason is not None:
        raise ConfigError(kernel_refusal(reason))
