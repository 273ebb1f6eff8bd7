"""What ``ppo-eqx train`` does with its parsed flags, up to the start of the run.

``train_command`` checks every input before anything is written (``plan_new``/``plan_resume``, then the
devices, the kernel and the checkpoint), creates or clears the run directory only then, and hands the run to
a ``training_run.TrainingRun``: the run's lifecycle (writers, trainer, signals, checkpoints, the end).
"""

import argparse
import importlib
import json
import os
import time
from pathlib import Path
from typing import Any, NamedTuple

from .cli import RunError, UsageError, flag
from .config import ConfigError, PPOConfig, preset_for
from .rundir import (
    CONFIG,
    SEEDS_CONFIG,
    RunDirError,
    agent_dirs,
    check_new_run_dir,
    make_run_dir,
    write_json,
)


class Plan(NamedTuple):
    """A checked request to train: the config, where it is written, and what a resume starts from."""

    config: PPOConfig
    run_dir: Path
    resume: dict[str, Any] | None = None
    """The newest checkpoint's metadata (``path`` added) when resuming."""

    @property
    def start_iteration(self) -> int:
        return 0 if self.resume is None else int(self.resume["iteration"])

    @property
    def agent_dirs(self) -> list[Path]:
        return agent_dirs(self.run_dir, self.config.agent_names())


def config_from_args(args: argparse.Namespace) -> PPOConfig:
    """Explicit flags, else the task's preset, else PPOConfig's (CleanRL's) defaults; validated."""
    from .envs import backend

    env_id = args.env_id or PPOConfig.env_id
    env_backend = backend(args.env_backend or PPOConfig.env_backend)
    values: dict[str, Any] = preset_for(env_backend.spec(env_id).is_atari)
    values.update({name: value for name, value in vars(args).items() if name in _CONFIG_FIELDS and value is not None})
    for name, _ in values.get("sweep", ()):
        if getattr(args, name, None) is not None:
            raise UsageError(f"{flag(name)} and --sweep {flag(name)[2:]}=... both set {name}; drop one")
    config = PPOConfig(**values).validate()
    if config.async_batch_size and not env_backend.has_async:
        raise ConfigError(
            f"async_batch_size={config.async_batch_size} is not possible with --env-backend {env_backend.name}; "
            "allowed: 0"
        )
    return config


_CONFIG_FIELDS = frozenset(PPOConfig.__dataclass_fields__)


def plan_new(args: argparse.Namespace) -> Plan:
    """The checked plan of a new run: its config and env (nothing is written; the run directory is checked by
    the process that writes it, ``check_run_dirs``)."""
    config = config_from_args(args)
    if args.track and config.num_agents > 1:
        raise UsageError(f"--track logs one run; drop it or --num-seeds {config.num_seeds} and --sweep")
    run_dir = args.run_dir or Path("runs") / f"{config.env_id}__{config.seed}__{int(time.time())}"
    return Plan(config, run_dir)


def check_run_dirs(plan: Plan, overwrite: bool) -> None:
    """Every directory a new run writes may be written (nothing is written or created here)."""
    check_new_run_dir(plan.run_dir, overwrite)
    for agent_dir in plan.agent_dirs if plan.config.num_agents > 1 else []:
        check_new_run_dir(agent_dir, overwrite)


def plan_resume(args: argparse.Namespace) -> Plan:
    """The checked plan of ``--resume RUN_DIR``: its config and newest checkpoint's metadata (arrays not read)."""
    from .checkpoint import check_same_run, read_arrays, read_metadata, resolve_checkpoint
    from .envs import backend

    run_dir: Path = args.resume
    given = [flag(name) for name in sorted(_CONFIG_FIELDS) if getattr(args, name) is not None]
    if given:
        raise UsageError(
            f"--resume continues the run with its own config ({run_dir / CONFIG}); drop {', '.join(given)}"
        )
    if args.overwrite:
        raise UsageError("--resume and --overwrite contradict each other; pick one")
    if args.run_dir is not None and args.run_dir != run_dir:
        raise UsageError("--resume RUN_DIR is the run directory; drop --run-dir")
    if not run_dir.is_dir():
        raise UsageError(f"--resume {run_dir}: no such run directory")
    config = _saved_config(run_dir)
    backend(config.env_backend).spec(config.env_id)
    if args.track and config.num_agents > 1:
        raise UsageError(f"--track logs one run; {run_dir} trains {config.num_agents} agents")
    path = resolve_checkpoint(run_dir)
    metadata = read_metadata(path)
    check_same_run(path, metadata, config)
    read_arrays(path, metadata)  # whole and unaltered (loaded once the devices are known)
    if not os.access(run_dir, os.W_OK | os.X_OK):
        raise RunDirError(f"--resume {run_dir} is not writable")
    return Plan(config, run_dir, {**metadata, "path": path})


def _saved_config(run_dir: Path) -> PPOConfig:
    config_path = run_dir / CONFIG
    if not config_path.exists() and (run_dir / SEEDS_CONFIG).exists():
        config_path = run_dir / SEEDS_CONFIG
    try:
        saved = json.loads(config_path.read_text())
    except FileNotFoundError:
        raise UsageError(f"--resume {run_dir}: no run there ({config_path} is missing)") from None
    except (OSError, ValueError) as error:
        raise UsageError(f"--resume {run_dir}: cannot read {config_path}: {error}") from None
    if not isinstance(saved, dict):
        raise UsageError(f"--resume {run_dir}: {config_path} is not a config")
    try:
        return PPOConfig.from_dict(saved)
    except ValueError as error:
        raise UsageError(f"--resume {run_dir}: {config_path}: {error}") from None


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


def start_processes(args: argparse.Namespace) -> Any:
    """Join the multi-process run that the flags ask for, and return the device mesh to train on (None: one
    device). Runs before anything computes with jax."""
    import jax

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
    if jax.process_count() == 1 and (args.devices or 1) == 1:
        return None
    from .parallel import make_mesh

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


def check_conv_impl(config: PPOConfig) -> None:
    """``--conv-impl kernel`` where the kernel cannot run is refused before anything is written."""
    if config.conv_impl == "kernel":
        from .networks import kernel_unavailable_reason

        reason = kernel_unavailable_reason()
        if reason is not None:
            raise UsageError(f"--conv-impl kernel: {reason}; use --conv-impl auto or matmul")


def any_process(flag_value: bool) -> bool:
    from .parallel import any_process as collective

    return collective(flag_value)


def train_command(args: argparse.Namespace) -> int:
    """Check everything, then make the run directory, then train."""
    if args.track:
        require("wandb", "--track needs Weights & Biases: pip install wandb")
        check_wandb_names(args)
    check_addresses(args)
    plan = plan_resume(args) if args.resume is not None else plan_new(args)
    one_process = not (args.distributed or args.coordinator_address)
    if plan.resume is None and one_process:  # several: process 0 checks once all have joined (below)
        check_run_dirs(plan, args.overwrite)
    if plan.start_iteration >= plan.config.num_iterations:
        print(f"ppo-eqx: {plan.run_dir} finished at iteration {plan.start_iteration}; nothing to resume", flush=True)
        return 0
    mesh = start_processes(args)
    check_conv_impl(plan.config)
    if mesh is not None:
        from .parallel import check_mesh_config

        check_mesh_config(plan.config, mesh)
    restore = None if plan.resume is None else _load(plan)
    import jax

    writes = jax.process_index() == 0  # process 0 writes the run directory and prints; all of them train
    refused: Exception | None = None
    if writes and plan.resume is None:
        try:
            if not one_process:  # only now is this process known to be the writer
                check_run_dirs(plan, args.overwrite)
            _make_run_dirs(plan, args.overwrite)
        except RunDirError as error:
            refused = error
    # The other processes must not start training (and wait on process 0) when it refused the directory.
    if any_process(refused is not None):
        raise refused or RunError(f"process 0 refused --run-dir {plan.run_dir}; its output says why")
    from .training_run import TrainingRun

    return TrainingRun(args, plan, mesh, writes, restore).run()


def _load(plan: Plan) -> Any:
    from .checkpoint import load_checkpoint
    from .envs import backend

    assert plan.resume is not None
    path = plan.resume["path"]
    return load_checkpoint(path, plan.resume, plan.config, backend(plan.config.env_backend).spec(plan.config.env_id))


def _make_run_dirs(plan: Plan, overwrite: bool) -> None:
    make_run_dir(plan.run_dir, overwrite)
    if plan.config.num_agents > 1:
        for agent_dir in plan.agent_dirs:
            make_run_dir(agent_dir, overwrite)
        write_json(plan.run_dir / SEEDS_CONFIG, plan.config.to_dict())
