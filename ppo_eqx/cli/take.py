"""How ``ppo-eqx train`` takes its run directory once its devices are joined (``take_run_dir``): process 0 makes,
locks, checks again under the lock and clears a new run's (``host.run_dir.take.take_new_run``), or locks, reads again
and checks a resumed one's, and every process learns whether it was refused."""

import argparse
from pathlib import Path

from ..errors import RunDirError, RunError
from ..host.mesh import any_process
from ..host.resume import read_run_again
from ..host.run_dir import (
    RunDirectory,
    RunLock,
    check_resumed_dirs,
    check_run_dirs,
    free_name,
    refuse_if_held,
    take_new_run,
)
from .interrupts import EARLY, say
from .plan import Plan


def take_run_dir(
    plan: Plan, args: argparse.Namespace, writes: bool, one_process: bool
) -> tuple[Plan, RunLock | None, RunDirectory | None]:
    """Process 0 takes the run directory (a new run's made, locked, checked again under the lock and cleared by
    ``--overwrite``: ``_take_new``; a resumed one's locked, read again where one process trains, and checked:
    ``check_resumed_dirs``) and returns it as the one owner of every write (``RunDirectory``, pinned to what the
    lock holds); every process learns whether it was refused, so that none trains (and waits on process 0) when it
    was. A resumed run that went on to its end meanwhile is returned with its lock and no directory."""
    refused: Exception | None = None
    lock, directory = None, None
    if writes:
        try:
            if plan.resume is None:
                plan, lock, directory = _take_new(plan, args)
            else:
                lock = RunLock.take(plan.run_dir, "ppo-eqx train --resume")
                if one_process:  # read again under its lock, before its arrays are loaded: it may have gone on
                    plan = plan._replace(resume=read_run_again(plan.run_dir, "--resume", plan.config, plan.environment))
                if not plan.nothing_to_resume:
                    check_resumed_dirs(plan.run_dir, _agent_dirs(plan))
                    directory = RunDirectory(plan.run_dir, lock.directory_fd())
        except RunDirError as error:
            refused = error
        except BaseException:
            if lock is not None:
                lock.release()
            raise
    if any_process(refused is not None):
        if lock is not None:
            lock.release()
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
