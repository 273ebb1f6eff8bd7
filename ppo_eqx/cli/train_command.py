"""What ``ppo-eqx train`` does with its parsed flags, each stage once and in order, each stage a module of its own:
check every input before anything is written (the plan, ``plan.py``, which reads a run to resume through
``host.resume``; the flags the plan does not read, ``checks.py``), join the devices and processes and resolve what
they decide (memory, mesh, the convolutions' route, the placement, hardware.json's record: ``devices.py``, all in
the plan), take the run directory (a new run's checked, made, locked and cleared by ``--overwrite``; a resumed
one's locked and read again before its arrays are loaded: ``take.py``), and hand the run to a
``supervisor.Supervisor``: the run's lifecycle (writers, trainer, signals, checkpoints, the end). Imported by
``main`` when the command runs, so that ``ppo-eqx --help`` reads no more than the parser needs.
"""

import argparse

import jax

from ..host.checkpoint import load_checkpoint
from .checks import check_addresses, check_wandb_names, require
from .devices import on_these_devices, start_processes
from .environment import XlaFlagsProbe, check_backend, check_jax_settings, results_environment
from .plan import Plan, plan_new, plan_resume
from .stopwatch import STARTUP
from .supervisor import RunOptions, Supervisor
from .take import take_run_dir


def train_command(args: argparse.Namespace, probe: XlaFlagsProbe | None = None) -> int:
    """Check everything (``_checked_plan``), then take the run directory, then train (``Supervisor``)."""
    probe = probe or XlaFlagsProbe()
    # XLA_FLAGS first: a backend that planning makes (gymnax's spec computes) would end the process on a bad flag.
    probe.check()
    check_jax_settings()
    one_process = not (args.distributed or args.coordinator_address)
    if one_process:  # the plan may compute (an env written in JAX): a JAX_PLATFORMS jax cannot start is one line first
        check_backend(probe)
    plan = _checked_plan(args, results_environment(probe.flags))
    STARTUP.lap("plan")
    if plan.nothing_to_resume:  # said before anything is joined, built or taken: the lock file is left as it is too
        print(plan.nothing_to_resume, flush=True)
        return 0
    mesh = start_processes(args, probe)
    plan, route = on_these_devices(plan, mesh)
    STARTUP.lap("devices")
    lock, directory = None, None
    try:
        writes = jax.process_index() == 0  # process 0 writes the run directory and prints; all of them train
        plan, lock, directory = take_run_dir(plan, args, writes, one_process)
        if plan.nothing_to_resume:  # it went on to its end while this process started
            print(plan.nothing_to_resume, flush=True)
            return 0
        factories = {"model": plan.model, "optimizer": plan.optimizer}
        restore = (
            None
            if plan.resume is None
            else load_checkpoint(plan.resume, plan.config, plan.spec, conv_impl=route, **factories)
        )
        options = RunOptions.of(args, None if plan.resume is None else plan.resume.metadata)
        STARTUP.lap("run_dir")
        return Supervisor(options, plan, mesh, restore, directory).run()
    finally:
        if directory is not None:
            directory.close()
        if lock is not None:
            lock.release()


def _checked_plan(args: argparse.Namespace, environment: dict[str, str | None]) -> Plan:
    """The plan of ``args``, checked as far as one process can before any is joined: the flags, the config, the
    checkpoint to resume and the environment it was trained under (a new run's directory is checked by the process
    that takes it, ``take.take_run_dir``, before it makes anything)."""
    if args.track:
        require("wandb", "--track needs Weights & Biases: pip install wandb")
        check_wandb_names(args)
    check_addresses(args)
    if args.resume is None:
        return plan_new(args, environment)
    return plan_resume(args, environment)
