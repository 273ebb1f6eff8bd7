"""Checks of ``ppo-eqx`` input that need more than the parser: each runs before anything is written and fails
with a one-line ``UsageError``."""

import argparse
import importlib

from ..errors import UsageError


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
