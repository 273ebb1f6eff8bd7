"""What ``ppo-eqx train`` resolves once its input is checked and its devices are known: the processes and devices
joined (``start_processes``: the mesh), and what they decide, checked and put in the plan (``on_these_devices``):
the memory one iteration needs (``check_memory``), the route of the convolutions (``conv_route``), where the
iteration runs (the placement) and what ``hardware.json`` records of it all. Each check fails with a one-line
``UsageError`` before anything is written."""

import argparse
import math
from pathlib import Path

import jax
import numpy as np
from jax.sharding import Mesh

from ..config import PPOConfig
from ..core.envs import EnvSpec
from ..core.networks import GRID_HIDDEN, ConvRoute
from ..core.sharded import make_mesh
from ..errors import RunError, UsageError
from ..host.kernel_build import kernel_refusal, kernel_unavailable_reason, resolve_conv_impl_for
from ..host.mesh import MeshPlacement
from ..host.placement import placement_for
from .environment import XlaFlagsProbe, check_backend
from .hardware import hardware_info
from .plan import Plan


def start_processes(args: argparse.Namespace, probe: XlaFlagsProbe) -> Mesh | None:
    """Join the multi-process run that the flags ask for, and return the device mesh to train on (None: one
    device). Runs before anything computes with jax; ``probe`` says first whether XLA takes XLA_FLAGS."""
    probe.check()
    if args.distributed or args.coordinator_address is not None:
        local_ids = None if args.devices is None else list(range(args.devices))
        try:
            jax.distributed.initialize(
                coordinator_address=args.coordinator_address,
                num_processes=args.num_processes,
                process_id=args.process_id,
                local_device_ids=local_ids,
            )
        except ValueError as error:  # missing or malformed settings: nothing was tried
            raise UsageError(f"cannot join a distributed run: {str(error).splitlines()[0]}") from None
        except RuntimeError as error:
            raise RunError(f"could not join the distributed run: {str(error).splitlines()[0]}") from None
    check_backend(probe)
    if jax.process_count() == 1 and (args.devices or 1) == 1:
        return None
    if jax.process_count() > 1:
        return make_mesh()
    available, devices = jax.local_devices(), args.devices or 1
    if devices > len(available):
        hint = f"; on CPU set XLA_FLAGS=--xla_force_host_platform_device_count={args.devices}"
        raise UsageError(
            f"--devices {args.devices}: jax sees {len(available)} {available[0].platform} device(s)"
            f"{hint if available[0].platform == 'cpu' else ''}"
        )
    return make_mesh(available[:devices])


def on_these_devices(plan: Plan, mesh: Mesh | None) -> tuple[Plan, ConvRoute]:
    """What the joined devices decide, checked and put in the plan: the memory the run needs, the mesh's limits,
    the route of the convolutions, where the iteration runs, and what hardware.json records of it all."""
    config = plan.config
    check_memory(config, plan.spec, devices=1 if mesh is None else mesh.size)
    route = conv_route(config, plan.spec)
    if mesh is None:
        placement = placement_for(config, plan.spec, plan.backend)
    else:  # checks the mesh's limits (check_mesh_config)
        placement = MeshPlacement(config, mesh, plan.backend)
    hardware = hardware_info(route)  # with the route the convolutions take here
    hardware["environment"] = plan.environment
    hardware["rollout"] = placement.rollout_record()
    if mesh is not None:
        hardware["mesh"] = {"devices": mesh.size, "processes": jax.process_count()}
    return plan._replace(route=route, placement=placement, hardware=hardware), route


def conv_route(config: PPOConfig, spec: EnvSpec) -> ConvRoute:
    """The route this machine's convolutions take for ``config.conv_impl``, resolved once, here, after the devices
    are joined (``resolve_conv_impl``): ``--conv-impl kernel`` where the kernel cannot run is refused before
    anything is written."""
    if config.conv_impl == "kernel":
        reason = kernel_unavailable_reason()
        if reason is not None:
            raise UsageError(kernel_refusal(reason, "--conv-impl kernel"))
    return resolve_conv_impl_for(config.conv_impl, spec)  # type: ignore[arg-type]  # validated by PPOConfig


BATCH_BYTES_BESIDE_OBS = 4 + 4 + 4 + 4 + 1 + 4 + 4
"""Bytes of one transition of the batch besides its observation: action (int32), log-probability, value, reward
(float32), done (bool), advantage and return (float32)."""
HIDDEN_FLOATS = {
    "vector": 2 * (64 + 64),
    "grid": 2 * (GRID_HIDDEN + GRID_HIDDEN),
    "frames": 32 * 400 + 64 * 81 + 64 * 49 + 512,
}
"""Hidden activations of one observation through ``ActorCritic`` by observation kind: the 64-64 MLPs of actor and
critic, MinAtar's 256-256 pair, or the Nature CNN's three convolutions (20x20x32, 9x9x64, 7x7x64 on 84x84) and its
512 dense units."""
MEMINFO = Path("/proc/meminfo")


def batch_bytes(config: PPOConfig, spec: EnvSpec) -> int:
    """Bytes of one iteration's batch and of one minibatch's hidden activations and their gradients (float32), every
    agent's: a lower bound of what the compiled program holds at once."""
    obs = math.prod(spec.obs_shape) * np.dtype(spec.obs_dtype).itemsize
    activations = config.minibatch_size * HIDDEN_FLOATS.get(spec.kind, 0) * 2 * 4
    return config.num_agents * (config.batch_size * (obs + BATCH_BYTES_BESIDE_OBS) + activations)


def device_memory() -> tuple[int, str] | None:
    """The bytes the default device can hold now and what they are, in words: a GPU's limit, or on the CPU the
    memory this machine has available (``/proc/meminfo``); None where neither is known."""
    device = jax.devices()[0]
    if device.platform != "cpu":
        limit = (device.memory_stats() or {}).get("bytes_limit")
        return (int(limit), f"the {device.device_kind}'s memory") if limit else None
    try:
        for line in MEMINFO.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024, "the memory available on this machine"
    except (OSError, ValueError, IndexError):
        pass
    return None


def check_memory(config: PPOConfig, spec: EnvSpec, *, devices: int = 1) -> None:
    """UsageError when one iteration's batch alone (``batch_bytes``, split over ``devices``) is more than a device
    can hold: such a run would pass every other check, write its run directory, then die in XLA's allocator."""
    available = device_memory()
    needed = batch_bytes(config, spec) // devices
    if available is None or needed <= available[0]:
        return
    agents = f" x {config.num_agents} agents" if config.num_agents > 1 else ""
    size = f"num_envs={config.num_envs} x num_steps={config.num_steps}{agents}"
    raise UsageError(
        f"{size}: one iteration's batch and one minibatch's activations alone are {needed / 2**30:,.1f} GiB, more "
        f"than the {available[0] / 2**30:,.1f} "
        f"GiB of {available[1].removeprefix('the ')}; allowed: a smaller num_envs * num_steps"
    )
