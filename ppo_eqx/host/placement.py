"""Where the iteration runs: the ``Placement`` protocol the ``Trainer`` composes, and ``OneDevice``, the whole
iteration (or a chunk of iterations) as one jitted program on the default device (``ppo_eqx.host.mesh
.MeshPlacement`` is the other)."""

import os
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import jax
import jax.numpy as jnp

from ..config import PPOConfig
from ..core.collect import Collector
from ..core.envs import EnvBackend, EnvSpec
from ..core.hyperparameters import AgentHyperparameters, Sizes
from ..core.iteration import Metrics, make_iteration, make_prime, over_iterations
from ..core.networks import ConvRoute
from ..core.state import Checkpoint, TrainState
from ..core.update import Loss, OptimizerFactory, make_optimizer, model_loss
from ..errors import ConfigError
from .compiled import own_jit
from .fresh import EnvShare, fresh_agents


@runtime_checkable
class Program(Protocol):
    """A segment's compiled iteration, as a placement builds it."""

    length: int
    """The most iterations one call runs: 1 (its metrics are the iteration's), or a chunk's length (its metrics
    stacked ``[length, ...]``, the first ``count`` rows filled)."""

    def __call__(self, state: TrainState, count: int = 1) -> tuple[TrainState, Metrics]: ...
    def prime(self, state: TrainState) -> TrainState: ...

    # Optional: ``host_loop``, True where a call runs the rollout on the host before it returns (the update dispatched
    # after it): the host loop reads its metrics before it dispatches the next (``Dispatch.overlaps``).
    def compile(self, state: TrainState) -> None: ...


@runtime_checkable
class Placement(Protocol):
    """Where the iteration runs: which envs are this process's, how the state is laid out, the program."""

    share: EnvShare

    def place(
        self, checkpoint: Checkpoint, collector: Collector, hyperparameters: AgentHyperparameters
    ) -> TrainState: ...
    def program(
        self,
        collector: Collector,
        sizes: Sizes,
        *,
        loss: Loss = model_loss,
        optimizer: OptimizerFactory = make_optimizer,
    ) -> Program: ...
    def checkpoint(self, state: TrainState, collector: Collector) -> Checkpoint: ...
    def rollout_record(self) -> dict[str, Any]:
        """Where it runs the rollout, for ``hardware.json``: ``on`` "device" (one program, or a mesh's two),
        "host" (with the rollout's device and convolutions' route and the learning's device) or "host-envs" (with
        the device of the policy and the learning)."""
        ...


class _Jitted:
    """The iteration (or, with ``sizes.iterations_per_dispatch`` K > 1, a chunk of up to K iterations:
    ``over_iterations``) and the priming of one segment, each a program of its own (``own_jit``) traced at most once."""

    def __init__(self, collector: Collector, sizes: Sizes, loss: Loss, optimizer: OptimizerFactory):
        self.length = sizes.iterations_per_dispatch
        iteration = make_iteration(collector, sizes, loss=loss, optimizer=optimizer)
        run: Callable[..., tuple[TrainState, Metrics]] = (
            iteration if self.length == 1 else over_iterations(iteration, self.length)
        )
        self._run = own_jit(run, donate="all")
        self._prime = own_jit(make_prime(collector, sizes), donate="all")

    def _args(self, state: TrainState, count: int) -> tuple:
        return (state,) if self.length == 1 else (state, jnp.asarray(count, jnp.int32))

    def __call__(self, state: TrainState, count: int = 1) -> tuple[TrainState, Metrics]:
        return self._run(*self._args(state, count))

    def prime(self, state: TrainState) -> TrainState:
        return self._prime(state)

    def compile(self, state: TrainState) -> None:
        self._prime.compile(state)
        self._run.compile(*self._args(state, 1))


class OneDevice:
    """The whole iteration as one jitted program on the default device; every env in this process."""

    share = EnvShare()
    carries_memory = True
    """A recurrent policy's memory per env travels in the program's carry (``core.recurrent``); the other placements
    say nothing, and are refused one."""

    def place(self, checkpoint: Checkpoint, collector: Collector, hyperparameters: AgentHyperparameters) -> TrainState:
        carry = collector.restore(checkpoint.envs)
        return TrainState(
            checkpoint.model, checkpoint.opt_state, carry, checkpoint.key, checkpoint.iteration, hyperparameters
        )

    def program(
        self,
        collector: Collector,
        sizes: Sizes,
        *,
        loss: Loss = model_loss,
        optimizer: OptimizerFactory = make_optimizer,
    ) -> Program:
        return _Jitted(collector, sizes, loss, optimizer)

    def checkpoint(self, state: TrainState, collector: Collector) -> Checkpoint:
        return Checkpoint(state.model, state.opt_state, state.key, collector.save(state.carry), state.iteration)

    def rollout_record(self) -> dict[str, Any]:
        return {"on": "device"}


def init_state(config: PPOConfig, spec: EnvSpec, collector: Collector, *, conv_impl: ConvRoute) -> TrainState:
    """A fresh run's training state on one device: ``config``'s agents (``fresh_agents``) with the carry of
    ``collector``'s envs, ready for ``make_iteration(collector, config.sizes)`` (after ``make_prime``'s priming,
    for an async collector)."""
    agents = fresh_agents(config, spec, conv_impl=conv_impl)
    carry = collector.carry(agents.envs)
    hyperparameters = config.agent_hyperparameters()
    return TrainState(agents.model, agents.opt_state, carry, agents.key, agents.iteration, hyperparameters)


MEASURED_ROLLOUT: dict[str, str] = {}
"""Device kind (jax's ``Device.device_kind`` of the default device) -> the placement of the rollout that
``bench/device_check.py`` measured fastest on it (its ``auto_rollout_on``): what ``rollout_on="auto"`` takes there
for a task whose step can run inside the device's programs. Empty until a machine's measurement is committed:
"auto" is "device" there (on a 2-core AMD EPYC CPU the one program was the fastest of the three:
bench/results/train_speed_placements.json)."""


MEASURED_HOST_ROUTE: dict[str, str] = {"TPU v5 lite": "host"}
"""Device kind -> the host route ("host" or "host-envs") that ``bench/device_check.py`` measured fastest on it at
CleanRL's settings, for a task whose step cannot run inside the device's programs (EnvPool's on a TPU). A TPU v5e,
Breakout-v5, 8 envs, 2026-12-07: host 1,988 env steps/s, host-envs 737 (bench/results/device_check_tpu_v5e.json;
host-envs' act program then wrote each step into buffers on the chip, since taken out, and not measured there
since). A kind not named takes host-envs where it can run the config."""


def compiles_here(env_backend: EnvBackend, platform: str) -> bool:
    """Whether a program on ``platform`` (jax's backend name: "cpu", "gpu", "tpu") can step ``env_backend``'s envs:
    EnvPool's and ALE's XLA steps are calls registered for the CPU and CUDA alone (a TPU program that holds one
    fails to compile); a backend that does not say (``compiles_on``, envs written in JAX) runs anywhere."""
    platforms = getattr(env_backend, "compiles_on", None)
    return platforms is None or platform in platforms


def rollout_place(
    config: PPOConfig, env_backend: EnvBackend | None = None, spec: EnvSpec | None = None, *, device: Any = None
) -> str:
    """Where ``config.rollout_on`` compiles the rollout on ``device`` (the default device, once the devices are
    joined; None before, when the plan is checked: nothing is asked of jax then): "device" (the whole iteration one
    program on the default device), "host" (``split.SplitPlacement``) or "host-envs"
    (``host_envs.HostEnvsPlacement``). "auto" is "host-envs" for the continuous tasks of a backend with a host API
    (``spec``'s, where known) where host-envs can run the config: each step's call out of the program costs more
    than the step itself (bench/results/continuous_placements.json). On a device whose programs cannot step the
    backend's envs (``compiles_here``: EnvPool's on a TPU) it is the host route ``MEASURED_HOST_ROUTE`` names for
    the device's kind (else "host-envs") where that can run the config, else "host". Otherwise what
    ``MEASURED_ROLLOUT`` says of the device, else "device"."""
    if config.rollout_on != "auto":
        return config.rollout_on
    if config.network == "lstm":  # its memory per env travels in the one program's carry
        return "device"
    if env_backend is not None and spec is not None and spec.continuous and _host_envs_runs(config, env_backend, spec):
        return "host-envs"
    if device is not None and env_backend is not None and not compiles_here(env_backend, device.platform):
        measured = MEASURED_HOST_ROUTE.get(device.device_kind, "host-envs")
        return "host-envs" if measured == "host-envs" and _host_envs_runs(config, env_backend, spec) else "host"
    if device is None or not MEASURED_ROLLOUT:
        return "device"
    return MEASURED_ROLLOUT.get(device.device_kind, "device")


def _host_envs_runs(config: PPOConfig, env_backend: EnvBackend, spec: EnvSpec | None) -> bool:
    from .host_envs import check_host_envs

    try:
        check_host_envs(config, env_backend, spec)
        return True
    except ConfigError:
        return False


def check_rollout_place(
    config: PPOConfig, env_backend: EnvBackend, spec: EnvSpec | None = None, *, device: Any = None
) -> None:
    """ConfigError where ``config.rollout_on`` would step on the host's CPU envs that run inside the program, ask
    of ``env_backend`` (and the env of ``spec``, where known) what its placement cannot do, or (once ``device`` is
    known) compile the envs' step into a program of a device that cannot run it."""
    place, rollout_on = rollout_place(config, env_backend, spec, device=device), config.rollout_on
    if place != "device" and env_backend.state_is_data:
        raise ConfigError(
            f"rollout_on={rollout_on!r} steps host envs (EnvPool, ALE) on the host's CPU, and {env_backend.name}'s "
            "envs run inside the program; allowed: rollout_on='device' or 'auto'"
        )
    if place == "device" and device is not None and not compiles_here(env_backend, device.platform):
        works = ["host-envs"] if _host_envs_runs(config, env_backend, spec) else []
        raise ConfigError(
            f"rollout_on={rollout_on!r} compiles {env_backend.name}'s env step into a {device.platform.upper()} "
            f"program, and it is a call for {' and '.join(getattr(env_backend, 'compiles_on', ()))} alone; allowed: "
            f"rollout_on={', '.join(repr(w) for w in ['auto', *works, 'host'])}"
        )
    if place == "host-envs":
        from .host_envs import check_host_envs

        check_host_envs(config, env_backend, spec)


def act_device_for(spec: EnvSpec, device: Any) -> Any:
    """Where host-envs' policy acts: on ``device`` (the default device, the learner's), except on an accelerator for
    observations that are not frames, where it acts on the host's CPU (its parameters moved there once a rollout):
    a vector policy's step takes about 0.1 ms on a CPU, a call to a TPU v5e and back 0.6-1.4 ms. Acting on the chip,
    HalfCheetah-v4's ``--preset fast`` (16 envs, one act call a step) took 281 s for 2M steps on the TPU machine,
    2.25 ms a step, where the 2-core AMD EPYC runs it whole in 72 s (docs/performance.md, "One TPU v5e")."""
    if device.platform == "cpu" or spec.kind == "frames":
        return device
    try:
        return jax.devices("cpu")[0]
    except RuntimeError:  # jax started without its CPU backend (JAX_PLATFORMS=tpu): the policy acts on the device
        return device


def default_actor_threads(config: PPOConfig, device: Any) -> int:
    """``config.actor_threads``, or where it is 0 the count chosen for ``device``, where the policy acts: one on a
    CPU (the policy acts on the cores that step the envs), and on an accelerator one actor for each 8 envs, at most
    a third of the cores this process may use (each actor's policy call waits on the device while the others' envs
    step)."""
    if config.actor_threads:
        return config.actor_threads
    if device.platform == "cpu" or config.normalize_obs:
        return 1
    return max(1, min(config.num_envs // 8, len(os.sched_getaffinity(0)) // 3))


def placement_for(config: PPOConfig, spec: EnvSpec, env_backend: EnvBackend) -> Placement:
    """The placement ``config.rollout_on`` asks for here: ``OneDevice``; the rollout on the host's CPU and the
    learning on the default device (``SplitPlacement``, its rollout's convolutions on the CPU's route); or the envs
    stepped from a host loop by actor threads and the rest on the default device (``HostEnvsPlacement``)."""
    device = jax.devices()[0]
    place = rollout_place(config, env_backend, spec, device=device)
    check_rollout_place(config, env_backend, spec, device=device)
    if place == "device":
        return OneDevice()
    if place == "host-envs":
        from .host_envs import HostEnvsPlacement

        act = act_device_for(spec, device)
        return HostEnvsPlacement(default_actor_threads(config, act), act_device=act)
    from .kernel_build import resolve_conv_impl_for
    from .split import SplitPlacement

    rollout_conv = resolve_conv_impl_for(config.conv_impl, spec, platform="cpu")  # type: ignore[arg-type]
    return SplitPlacement(jax.devices("cpu")[0], device, rollout_conv=rollout_conv)
