"""What ``ppo-eqx train`` does with its parsed flags, each stage once and in order: check every input before
anything is written (the plan, ``plan.py``, which reads a run to resume through ``host.resume``; the rest,
``checks.py``), join the devices and processes and resolve what they decide (memory, mesh, the convolutions'
route, the placement, hardware.json's record: all in the plan), lock a run to resume and read it again before its
arrays are loaded, take the run directory (a new run's checked, made, locked and cleared by ``--overwrite``:
``host.ownership``), and hand the run to a ``supervisor.Supervisor``: the run's lifecycle (writers, trainer,
signals, checkpoints, the end). Imported by ``main`` when the command runs, so that ``ppo-eqx --help`` reads no
more than the parser needs.
"""

import argparse
from pathlib import Path

import jax
from jax.sharding import Mesh

from ..core.networks import ConvRoute
from ..core.sharded import make_mesh
from ..errors import RunDirError, RunError, UsageError
from ..host.checkpoint import load_checkpoint
from ..host.hardware import hardware_info
from ..host.lock import RunLock, refuse_if_held
from ..host.manifest import check_resumed_dirs
from ..host.mesh import MeshPlacement, any_process
from ..host.ownership import check_run_dirs, free_name, take_new_run
from ..host.placement import placement_for
from ..host.resume import read_run_again
from ..host.run_directory import RunDirectory
from .checks import check_addresses, check_memory, check_wandb_names, conv_route, require
from .environment import (
    XlaFlagsProbe,
    check_backend,
    check_jax_settings,
    results_environment,
)
from .interrupts import EARLY, say
from .plan import Plan, plan_new, plan_resume
from .supervisor import RunOptions, Supervisor


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


def train_command(args: argparse.Namespace, probe: XlaFlagsProbe | None = None) -> int:
    """Check everything (``_checked_plan``), then take the run directory, then train (``Supervisor``)."""
    probe = probe or XlaFlagsProbe()
    # XLA_FLAGS first: a backend that planning makes (gymnax's spec computes) would end the process on a bad flag.
    probe.check()
    check_jax_settings()
    plan = _checked_plan(args, results_environment(probe.flags))
    if plan.nothing_to_resume:  # said before anything is joined, built or taken: the lock file is left as it is too
        print(plan.nothing_to_resume, flush=True)
        return 0
    one_process = not (args.distributed or args.coordinator_address)
    mesh = start_processes(args, probe)
    plan, route = _on_these_devices(plan, mesh)
    lock, directory = None, None
    try:
        if plan.resume is not None and one_process:
            lock = RunLock.take(plan.run_dir, "ppo-eqx train --resume")
            # Read again under its lock, before its arrays are loaded: it may have gone on, to its end too.
            plan = plan._replace(resume=read_run_again(plan.run_dir, "--resume", plan.config, plan.environment))
            if plan.nothing_to_resume:
                print(plan.nothing_to_resume, flush=True)
                return 0
        restore = None if plan.resume is None else load_checkpoint(plan.resume, plan.config, plan.spec, conv_impl=route)
        writes = jax.process_index() == 0  # process 0 writes the run directory and prints; all of them train
        plan, lock, directory = _take(plan, args, lock, writes)
        options = RunOptions.of(args, None if plan.resume is None else plan.resume.metadata)
        return Supervisor(options, plan, mesh, restore, directory).run()
    finally:
        if directory is not None:
            directory.close()
        if lock is not None:
            lock.release()


def _checked_plan(args: argparse.Namespace, environment: dict[str, str | None]) -> Plan:
    """The plan of ``args``, checked as far as one process can before any is joined: the flags, the config, the
    checkpoint to resume and the environment it was trained under (a new run's directory is checked by the process
    that takes it, ``_take_new``, before it makes anything)."""
    if args.track:
        require("wandb", "--track needs Weights & Biases: pip install wandb")
        check_wandb_names(args)
    check_addresses(args)
    if args.resume is not None:
        return plan_resume(args, environment)
    return plan_new(args, environment)


def _on_these_devices(plan: Plan, mesh: Mesh | None) -> tuple[Plan, ConvRoute]:
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


def _take(
    plan: Plan, args: argparse.Namespace, lock: RunLock | None, writes: bool
) -> tuple[Plan, RunLock | None, RunDirectory | None]:
    """Process 0 takes the run directory (a new run's made, locked, checked again under the lock and cleared by
    ``--overwrite``; a resumed one's locked and checked: ``check_resumed_dirs``) and returns it as the one owner of
    every write (``RunDirectory``, pinned to what the lock holds); every process learns whether it was refused, so
    that none trains (and waits on process 0) when it was."""
    refused: Exception | None = None
    directory = None
    if writes:
        try:
            if plan.resume is None:
                plan, lock, directory = _take_new(plan, args)
            else:
                lock = lock or RunLock.take(plan.run_dir, "ppo-eqx train --resume")
                check_resumed_dirs(plan.run_dir, _agent_dirs(plan))
                directory = RunDirectory(plan.run_dir, lock.directory_fd())
        except RunDirError as error:
            refused = error
    if any_process(refused is not None):
        raise refused or RunError(f"process 0 refused --run-dir {plan.run_dir}; its output says why")
    return plan, lock, directory


def _agent_dirs(plan: Plan) -> list[Path]:
    """The agents' own directories of a run of several (none for one agent: its directory is the run's)."""
    return plan.agent_dirs if plan.config.num_agents > 1 else []


def _take_new(plan: Plan, args: argparse.Namespace) -> tuple[Plan, RunLock, RunDirectory]:
    """The new run's directory taken (``take_new_run``: made, locked, checked again under the lock, the old run
    cleared by ``--overwrite`` or by a plain retry of one that never trained, each saying what it deleted and
    kept, the agents' directories made): the plan with the directory taken, and its lock. Every directory it
    writes is checked first (``check_run_dirs``), so that nothing is made where the run would be refused."""
    if args.run_dir is not None:
        refuse_if_held(plan.run_dir)  # a run that started meanwhile is named, not just found
    # A default name is claimed fresh (take_new_run): a run that took it meanwhile is no reason to refuse.
    run_dir = plan.run_dir if args.run_dir is not None else free_name(plan.run_dir)
    check_run_dirs(run_dir, _agent_dirs(plan._replace(run_dir=run_dir)), args.overwrite)
    EARLY.defer()  # from here on a Ctrl-C is the Supervisor's to act on: the directory changes
    directory, lock = take_new_run(
        plan.run_dir,
        plan.config.agent_names(),
        plan.config.to_dict(),
        overwrite=args.overwrite,
        claim=args.run_dir is None,
        command="ppo-eqx train --overwrite" if args.overwrite else "ppo-eqx train",
        report=lambda line: say(f"ppo-eqx: {line}"),
    )
    return plan._replace(run_dir=directory.path), lock, directory
