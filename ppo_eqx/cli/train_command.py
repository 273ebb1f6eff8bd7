"""What ``ppo-eqx train`` does with its parsed flags: check every input before anything is written (the plan,
``plan.py``; the rest, ``checks.py``), join the devices and processes, take the run directory only then (its lock,
then ``--overwrite``'s clearing: ``host.ownership``), and hand the run to a ``supervisor.Supervisor``: the run's
lifecycle (writers, trainer, signals, checkpoints, the end). Imported by ``main`` when the command runs, so that
``ppo-eqx --help`` reads no more than the parser needs.
"""

import argparse
import json
from pathlib import Path

import jax
from jax.sharding import Mesh

from ..core.sharded import make_mesh
from ..core.state import Checkpoint
from ..errors import RunDirError, RunError, UsageError
from ..host.checkpoint import load_checkpoint
from ..host.mesh import any_process, check_mesh_config
from ..host.ownership import (
    Cleared,
    RunLock,
    adopt_legacy_run,
    check_run_dirs,
    refuse_if_held,
    take_new_run,
)
from ..host.rundir import HARDWARE, free_name
from .checks import check_addresses, check_memory, check_wandb_names, conv_route, require
from .environment import (
    XlaFlagsProbe,
    check_backend,
    check_jax_settings,
    check_same_environment,
    results_environment,
)
from .interrupts import EARLY
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
    if _finished(plan):  # nothing to take: the lock file is left as it is too
        return 0
    one_process = not (args.distributed or args.coordinator_address)
    lock = None
    if plan.resume is not None and one_process:  # the run is read again under its lock: it may have gone on
        lock = RunLock.take(plan.run_dir, "ppo-eqx train --resume")
    try:
        if lock is not None:
            plan = plan_resume(args)._replace(environment=plan.environment)
        if _finished(plan):
            return 0
        mesh = start_processes(args, probe)
        plan = _on_these_devices(plan, mesh)
        restore = None if plan.resume is None else _loaded(plan)
        writes = jax.process_index() == 0  # process 0 writes the run directory and prints; all of them train
        plan, lock = _take(plan, args, lock, writes)
        return Supervisor(RunOptions.of(args), plan, mesh, writes, restore).run()
    finally:
        if lock is not None:
            lock.release()


def _checked_plan(args: argparse.Namespace, environment: dict[str, str | None]) -> Plan:
    """The plan of ``args``, checked as far as one process can before any is joined: the flags, the config, the
    checkpoint to resume and the environment it was trained under, the run directory."""
    if args.track:
        require("wandb", "--track needs Weights & Biases: pip install wandb")
        check_wandb_names(args)
    check_addresses(args)
    plan = (plan_resume(args) if args.resume is not None else plan_new(args))._replace(environment=environment)
    if plan.resume is not None:
        check_same_environment(plan.run_dir, _recorded_environment(plan), environment)
    elif not (args.distributed or args.coordinator_address):  # several: process 0 checks once all have joined
        if args.run_dir is not None:
            refuse_if_held(plan.run_dir)  # a run that started meanwhile is named, not just found
        # A default name is claimed fresh (_take): a run that took it meanwhile is no reason to refuse.
        run_dir = plan.run_dir if args.run_dir is not None else free_name(plan.run_dir)
        check_run_dirs(run_dir, _agent_dirs(plan._replace(run_dir=run_dir)), args.overwrite)
    return plan


def _on_these_devices(plan: Plan, mesh: Mesh | None) -> Plan:
    """What the joined devices decide, checked: the memory the run needs, the mesh's limits, and the route of the
    convolutions (in the plan from here on)."""
    check_memory(plan.config, plan.spec, devices=1 if mesh is None else mesh.size)
    if mesh is not None:
        check_mesh_config(plan.config, mesh)
    return plan._replace(route=conv_route(plan.config, plan.spec))


def _take(plan: Plan, args: argparse.Namespace, lock: RunLock | None, writes: bool) -> tuple[Plan, RunLock | None]:
    """Process 0 takes the run directory (a new run's made, locked, checked again under the lock and cleared by
    ``--overwrite``; a resumed one's locked and, if an earlier ppo-eqx wrote it, given its manifest); every process
    learns whether it was refused, so that none trains (and waits on process 0) when it was."""
    refused: Exception | None = None
    if writes:
        try:
            if plan.resume is None:
                EARLY.defer()  # from here on a Ctrl-C is the Supervisor's to act on: the directory changes
                plan, lock = _take_new(plan, args)
            else:
                lock = lock or RunLock.take(plan.run_dir, "ppo-eqx train --resume")
                adopt_legacy_run(plan.run_dir)
        except RunDirError as error:
            refused = error
    if any_process(refused is not None):
        raise refused or RunError(f"process 0 refused --run-dir {plan.run_dir}; its output says why")
    return plan, lock


def _agent_dirs(plan: Plan) -> list[Path]:
    """The agents' own directories of a run of several (none for one agent: its directory is the run's)."""
    return plan.agent_dirs if plan.config.num_agents > 1 else []


def _loaded(plan: Plan) -> Checkpoint:
    """The checkpoint to resume, its arrays loaded for the plan's env and convolutions' route."""
    assert plan.resume is not None and plan.route is not None
    return load_checkpoint(plan.resume, plan.config, plan.spec, conv_impl=plan.route)


def _recorded_environment(plan: Plan) -> dict | None:
    """The environment the run to resume was trained under (its first agent's ``hardware.json``), if recorded."""
    try:
        return json.loads((plan.agent_dirs[0] / HARDWARE).read_text()).get("environment")
    except (OSError, ValueError, AttributeError):
        return None


def _finished(plan: Plan) -> bool:
    """Whether the run to resume has trained all its iterations (then it says so)."""
    if plan.start_iteration < plan.config.num_iterations:
        return False
    print(f"ppo-eqx: {plan.run_dir} finished at iteration {plan.start_iteration}; nothing to resume", flush=True)
    return True


def _take_new(plan: Plan, args: argparse.Namespace) -> tuple[Plan, RunLock]:
    """The new run's directory taken (``take_new_run``: made, locked, checked again under the lock, the old run
    cleared by ``--overwrite`` or by a plain retry of one that never trained, the agents' directories made): the
    plan with the directory taken, and its lock."""
    flag = "--overwrite" if args.overwrite else None
    run_dir, lock = take_new_run(
        plan.run_dir,
        plan.config.agent_names(),
        plan.config.to_dict(),
        overwrite=args.overwrite,
        claim=args.run_dir is None,
        command=f"ppo-eqx train {flag or ''}".strip(),
        report=lambda run_dir, cleared, listed: _say_cleared(run_dir, cleared, listed, flag),
    )
    return plan._replace(run_dir=run_dir), lock


def _say_cleared(run_dir: Path, cleared: Cleared, listed: bool, flag: str | None) -> None:
    """Say, in a line each, what clearing the old run in ``run_dir`` deleted and what it kept. ``flag`` None: a
    plain retry of a run that stopped before anything of it could be kept."""
    if flag is None:
        print(f"ppo-eqx: {run_dir} held a run that stopped before its first iteration; starting it afresh", flush=True)
    if not listed:
        print(
            f"ppo-eqx: {run_dir} holds no list of what its run wrote (an earlier ppo-eqx wrote it): --overwrite "
            "deleted the files that a run writes at its top, its events and checkpoints/iter_*, and the agents' "
            "directories that its seeds.json names",
            flush=True,
        )
    who = flag or "the retry"
    if cleared.deleted:
        print(f"ppo-eqx: {who} deleted what the old run wrote: {', '.join(cleared.deleted)}", flush=True)
    if cleared.kept:
        print(f"ppo-eqx: {who} kept what the old run did not write: {', '.join(cleared.kept)}", flush=True)
