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

from ..core.envs import backend
from ..core.networks import ConvRoute
from ..core.sharded import make_mesh
from ..core.state import Checkpoint
from ..errors import RunDirError, RunError, UsageError
from ..host.checkpoint import load_checkpoint
from ..host.mesh import any_process, check_mesh_config
from ..host.ownership import (
    Manifest,
    RunLock,
    adopt_legacy_run,
    clear_run,
    has_run,
    never_trained,
    read_manifest,
    refuse_if_held,
)
from ..host.rundir import HARDWARE, SEEDS_CONFIG, claim_new_dir, free_name, make_dirs, write_json
from .checks import check_addresses, check_memory, check_wandb_names, conv_route, require
from .environment import (
    XlaFlagsProbe,
    check_backend,
    check_jax_settings,
    check_same_environment,
    results_environment,
)
from .interrupts import EARLY
from .plan import Plan, check_run_dirs, plan_new, plan_resume
from .supervisor import Supervisor


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
    """Check everything, then take the run directory, then train."""
    probe = probe or XlaFlagsProbe()
    # XLA_FLAGS first: a backend that planning makes (gymnax's spec computes) would end the process on a bad flag.
    probe.check()
    check_jax_settings()
    environment = results_environment(probe.flags)
    if args.track:
        require("wandb", "--track needs Weights & Biases: pip install wandb")
        check_wandb_names(args)
    check_addresses(args)
    plan = (plan_resume(args) if args.resume is not None else plan_new(args))._replace(environment=environment)
    if plan.resume is not None:
        check_same_environment(plan.run_dir, _recorded_environment(plan), environment)
    one_process = not (args.distributed or args.coordinator_address)
    if plan.resume is None and one_process:  # several: process 0 checks once all have joined (below)
        if args.run_dir is not None:
            refuse_if_held(plan.run_dir)  # a run that started meanwhile is named, not just found
        # A default name is claimed fresh (_take_run_dir): a run that took it meanwhile is no reason to refuse.
        check_run_dirs(
            plan if args.run_dir is not None else plan._replace(run_dir=free_name(plan.run_dir)), args.overwrite
        )
    if _finished(plan):  # nothing to take: the lock file is left as it is too
        return 0
    lock = None
    if plan.resume is not None and one_process:  # the run is read again under its lock: it may have gone on
        lock = RunLock.take(plan.run_dir, "ppo-eqx train --resume")
    try:
        if lock is not None:
            plan = plan_resume(args)._replace(environment=environment)
        if _finished(plan):
            return 0
        mesh = start_processes(args, probe)
        spec = backend(plan.config.env_backend).spec(plan.config.env_id)
        check_memory(plan.config, spec, devices=1 if mesh is None else mesh.size)
        route = conv_route(plan.config)
        if mesh is not None:
            check_mesh_config(plan.config, mesh)
        restore = None if plan.resume is None else _load(plan, route)

        writes = jax.process_index() == 0  # process 0 writes the run directory and prints; all of them train
        refused: Exception | None = None
        if writes:
            try:
                if plan.resume is None:
                    EARLY.defer()  # from here on a Ctrl-C is the Supervisor's to act on: the directory changes
                    plan, lock = _take_run_dir(plan, args)
                elif lock is None:
                    lock = RunLock.take(plan.run_dir, "ppo-eqx train --resume")
                if plan.resume is not None:
                    adopt_legacy_run(plan.run_dir)
            except RunDirError as error:
                refused = error
        # The other processes must not start training (and wait on process 0) when it refused the directory.
        if any_process(refused is not None):
            raise refused or RunError(f"process 0 refused --run-dir {plan.run_dir}; its output says why")
        return Supervisor(args, plan, mesh, writes, restore, route).run()
    finally:
        if lock is not None:
            lock.release()


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


def _load(plan: Plan, route: ConvRoute) -> Checkpoint:
    assert plan.resume is not None
    spec = backend(plan.config.env_backend).spec(plan.config.env_id)
    return load_checkpoint(plan.resume, plan.config, spec, conv_impl=route)


def _take_run_dir(plan: Plan, args: argparse.Namespace) -> tuple[Plan, RunLock]:
    """Create the new run's directory (a default name: a fresh one, ``claim_new_dir``), lock it, check it again
    under the lock, clear the old run with ``--overwrite`` and make the agents' directories: the plan with the
    directory taken, and its lock."""
    run_dir = claim_new_dir(plan.run_dir) if args.run_dir is None else plan.run_dir
    make_dirs("--run-dir", run_dir)
    lock = RunLock.take(run_dir, "ppo-eqx train --overwrite" if args.overwrite else "ppo-eqx train")
    try:
        plan = plan._replace(run_dir=run_dir)
        check_run_dirs(plan, args.overwrite)
        if has_run(run_dir) and (args.overwrite or never_trained(run_dir)):
            _overwrite(run_dir, "--overwrite" if args.overwrite else None)
        if plan.config.num_agents > 1:
            _make_agent_dirs(plan)
    except BaseException:
        lock.release()
        raise
    return plan, lock


def _overwrite(run_dir: Path, flag: str | None) -> None:
    """Delete what the old run in ``run_dir`` wrote and say, in a line each, what was deleted and what kept.
    ``flag`` None: a plain retry of a run that stopped before anything of it could be kept."""
    listed = read_manifest(run_dir) is not None
    cleared = clear_run(run_dir)
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


def _make_agent_dirs(plan: Plan) -> None:
    """The agents' directories of a run of several (``seedK``, ``SETTING/seedK``) and its ``seeds.json``, each
    listed in the run's manifest before it is made."""
    manifest = Manifest(plan.run_dir)
    manifest.add("file", SEEDS_CONFIG)
    for name, agent_dir in zip(plan.config.agent_names(), plan.agent_dirs, strict=True):
        for parent in reversed(Path(name).parents[:-1]):
            manifest.add("dir", parent)
        manifest.add("run", name)
        make_dirs("--run-dir", agent_dir)
    write_json(plan.run_dir / SEEDS_CONFIG, plan.config.to_dict())
