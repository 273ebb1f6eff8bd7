"""What ``ppo-eqx train`` does with its parsed flags: check every input before anything is written (the plan,
``plan.py``; the rest, ``checks.py``), join the devices and processes, make the run directory only then, and hand
the run to a ``supervisor.Supervisor``: the run's lifecycle (writers, trainer, signals, checkpoints, the end).
Imported by ``main`` when the command runs, so that ``ppo-eqx --help`` reads no more than the parser needs.
"""

import argparse

import jax
from jax.sharding import Mesh

from ..core.envs import backend
from ..core.networks import ConvRoute
from ..core.sharded import make_mesh
from ..core.state import Checkpoint
from ..errors import RunDirError, RunError, UsageError
from ..host.checkpoint import load_checkpoint
from ..host.mesh import any_process, check_mesh_config
from ..host.rundir import SEEDS_CONFIG, make_run_dir, write_json
from .checks import check_addresses, check_wandb_names, conv_route, require
from .plan import Plan, check_run_dirs, plan_new, plan_resume
from .supervisor import Supervisor


def start_processes(args: argparse.Namespace) -> Mesh | None:
    """Join the multi-process run that the flags ask for, and return the device mesh to train on (None: one
    device). Runs before anything computes with jax."""
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
    route = conv_route(plan.config)
    if mesh is not None:
        check_mesh_config(plan.config, mesh)
    restore = None if plan.resume is None else _load(plan, route)

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
    return Supervisor(args, plan, mesh, writes, restore, route).run()


def _load(plan: Plan, route: ConvRoute) -> Checkpoint:
    assert plan.resume is not None
    spec = backend(plan.config.env_backend).spec(plan.config.env_id)
    return load_checkpoint(plan.resume, plan.config, spec, conv_impl=route)


def _make_run_dirs(plan: Plan, overwrite: bool) -> None:
    make_run_dir(plan.run_dir, overwrite)
    if plan.config.num_agents > 1:
        for agent_dir in plan.agent_dirs:
            make_run_dir(agent_dir, overwrite)
        write_json(plan.run_dir / SEEDS_CONFIG, plan.config.to_dict())
