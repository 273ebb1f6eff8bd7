"""Checks of ``ppo-eqx`` input that need more than the parser: each runs before anything is written and fails
with a one-line ``UsageError``."""

import argparse
import importlib
import math
from pathlib import Path

import numpy as np

from ..config import PPOConfig
from ..core.envs import EnvSpec
from ..core.networks import GRID_HIDDEN, ConvRoute
from ..errors import UsageError
from ..host.conv_route import kernel_refusal, kernel_unavailable_reason, resolve_conv_impl_for


def check_addresses(args: argparse.Namespace) -> None:
    """The multi-host flags: all three or none, a HOST:PORT address, a process id below the count."""
    explicit = {
        "--coordinator-address": args.coordinator_address,
        "--num-processes": args.num_processes,
        "--process-id": args.process_id,
    }
    given = [name for name, value in explicit.items() if value is not None]
    if given and len(given) < len(explicit):
        missing = ", ".join(name for name in explicit if name not in given)
        raise UsageError(f"{', '.join(given)} needs {missing} too (or --distributed alone, under Slurm)")
    if not given:
        return
    host, _, port = str(args.coordinator_address).rpartition(":")
    if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise UsageError(
            f"--coordinator-address {args.coordinator_address[:60]!r} is not HOST:PORT; allowed: a host name "
            "or address, a colon and a port 1 .. 65535"
        )
    if not args.process_id < args.num_processes:
        raise UsageError(f"--process-id {args.process_id} must be in 0 .. {args.num_processes - 1}")


def check_wandb_names(args: argparse.Namespace) -> None:
    """W&B's project and entity names, checked before anything is written (W&B itself checks them only later)."""
    for name, value in (("--wandb-project-name", args.wandb_project_name), ("--wandb-entity", args.wandb_entity)):
        if value is None and name == "--wandb-entity":
            continue
        if not value or len(value) > 128 or any(c in value for c in "/\\#?%:"):
            raise UsageError(
                f"{name} {str(value)[:60]!r} is not a W&B name; allowed: 1 to 128 characters, none of /\\#?%:"
            )


def require(module: str, message: str) -> None:
    """Import ``module`` now, or fail with ``message``: optional dependencies are checked before a run starts."""
    try:
        importlib.import_module(module)
    except ImportError:
        raise UsageError(message) from None


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
    import jax

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
