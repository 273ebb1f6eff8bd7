"""How this machine computes the Nature CNN's convolutions: ``conv_impl`` resolved to a route, once, at the edge
(the ``Trainer``, the command line, the bench scripts), which then passes the route in. Never while a model is
built or a checkpoint is loaded. "auto" takes ppo_eqx's CPU kernel only where it is built already
(``kernel_build.built``: ``ppo-eqx build-kernel``, which the README's setup runs); an explicit "kernel" builds it
where it must (a C++ compile of about 20 s, cached in ``$PPO_EQX_CACHE``)."""

import jax

from ..config import ConvImpl
from ..core.envs import EnvSpec
from ..core.networks import ConvRoute
from ..errors import ConfigError
from . import kernel_build


def kernel_refusal(reason: str, name: str = "conv_impl='kernel'") -> str:
    """The one line that refuses the kernel route (``name``: how the user asked for it) and says why."""
    return f"{name} is unavailable: {reason}; allowed: auto, matmul or xla"


def kernel_unavailable_reason(platform: str | None = None, *, build: bool = True) -> str | None:
    """Why the "kernel" route cannot run on ``platform`` (default: jax's default backend): it is not the CPU, or
    the kernel does not build (``build``), or is not built (not ``build``); None when it can."""
    platform = platform or jax.default_backend()
    if platform != "cpu":
        return f"the CPU kernel runs on the CPU backend only, not {platform!r}"
    return kernel_build.unavailable_reason(build_if_missing=build)


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
    if kernel_build.find_compiler() is None:
        return None
    try:
        problem = kernel_build.cache_problem(kernel_build.library_path(kernel_build.requested_isa()))
    except kernel_build.KernelUnavailable:
        return None
    if problem is None:
        return None
    return f"ppo_eqx's CPU kernel is faster here and {problem}: {kernel_build.BUILD_HINT} builds it, once"


def ready(route: ConvRoute | None) -> None:
    """Make ``route`` runnable in this process: for "kernel", the kernel loaded (built where it is not), or
    ConfigError naming why it cannot be. A model of the route computes only once it is (``core.cpu_kernel``). None:
    a model without convolutions of ours (``core.networks.conv_route_of``)."""
    if route != "kernel":
        return
    reason = kernel_unavailable_reason("cpu")
    if reason is not None:
        raise ConfigError(kernel_refusal(reason))
