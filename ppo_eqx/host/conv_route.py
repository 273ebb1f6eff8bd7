"""How this machine computes the Nature CNN's convolutions: ``conv_impl`` resolved to a route, once, at the edge
(the ``Trainer``, the command line, the bench scripts), which then passes the route in. Never while a model is
built or a checkpoint is loaded: finding out whether the CPU kernel runs here may build it (a C++ compile whose
library is cached in ``$PPO_EQX_CACHE``)."""

import jax

from ..config import ConvImpl
from ..core import cpu_kernel
from ..core.envs import EnvSpec
from ..core.networks import ConvRoute
from ..errors import ConfigError


def kernel_unavailable_reason(platform: str | None = None) -> str | None:
    """Why the "kernel" route cannot run on ``platform`` (default: jax's default backend): it is not the CPU, or
    the kernel does not build; None when it can."""
    platform = platform or jax.default_backend()
    if platform != "cpu":
        return f"the CPU kernel runs on the CPU backend only, not {platform!r}"
    try:
        cpu_kernel.load()
    except cpu_kernel.KernelUnavailable as error:
        return str(error)
    return None


def resolve_conv_impl(conv_impl: ConvImpl, obs_shape: tuple[int, ...], *, platform: str | None = None) -> ConvRoute:
    """The route a model of observations ``obs_shape`` takes for ``conv_impl`` on ``platform`` (default: jax's
    default backend). "auto", for frames, is "xla" off the CPU and, on it, "kernel" where the kernel builds
    (``cpu_kernel.available()``), else "matmul"; for vectors, which have no convolutions, "matmul". "kernel" where
    it cannot run is a ConfigError naming why. Any other value is itself."""
    platform = platform or jax.default_backend()
    if conv_impl not in ("auto", "kernel") or len(obs_shape) != 3:
        return "matmul" if conv_impl == "auto" else conv_impl
    if conv_impl == "auto":
        if platform != "cpu":
            return "xla"
        return "kernel" if cpu_kernel.available() else "matmul"
    reason = kernel_unavailable_reason(platform)
    if reason is not None:
        raise ConfigError(f"conv_impl='kernel' is unavailable: {reason}; allowed: auto, matmul or xla")
    return "kernel"


def resolve_conv_impl_for(conv_impl: ConvImpl, spec: EnvSpec, *, platform: str | None = None) -> ConvRoute:
    """``resolve_conv_impl`` for the model of ``spec``'s observations: only frames are convolved (a MinAtar grid,
    3-D too, goes through MLPs), so anything else takes "matmul" for "auto" and builds no kernel."""
    return resolve_conv_impl(conv_impl, spec.obs_shape if spec.kind == "frames" else (), platform=platform)
