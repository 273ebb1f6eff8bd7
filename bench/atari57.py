"""Run the Atari-57 benchmark: every game x seed as one `ppo-eqx train` run, resumable.

    python bench/atari57.py --sweep-dir runs/atari57 --jobs 2
    python bench/atari57.py --games Breakout-v5 Pong-v5 --seeds 1 --dry-run -- --no-tensorboard

Each run goes to SWEEP_DIR/<env_id>__seed<k>/ and its output to SWEEP_DIR/<env_id>__seed<k>.log. Runs are
ordered seed-major (every game's first seed before any second seed), as CleanRL's benchmark utility does, so
that a partial sweep covers all games. Resuming: a run directory holding summary.json is finished and
skipped; one with a checkpoint was interrupted and goes on from it (`ppo-eqx train --resume`, with the config it
was started with: config flags after `--` are left out of its command); one without a checkpoint starts again
(--overwrite, which deletes only what that run wrote). Arguments after `--` go to every train command.
--dry-run prints the command lines, one per line, for GNU parallel or a Slurm array.
"""

import dataclasses
import shlex
import signal
import subprocess
import sys
import time
from argparse import RawDescriptionHelpFormatter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # run from a checkout without installing the package
    sys.path.insert(0, str(REPO_ROOT))

from ppo_eqx.config import FIELD_TYPES, flag  # noqa: E402
from ppo_eqx.host.rundir import CHECKPOINT_DIR, SUMMARY  # noqa: E402
from ppo_eqx_bench.arguments import Parser, int_at_least  # noqa: E402
from ppo_eqx_bench.atari_games import ATARI_57  # noqa: E402
from ppo_eqx_bench.launch import StopRequest, child_env, train_command  # noqa: E402

# Flags the runner sets itself; passing them after `--` would contradict the run directory's name.
RUNNER_FLAGS = ("--env-id", "--seed", "--total-timesteps", "--run-dir")
POLL_SECONDS = 0.2
# A config flag after `--` and whether it takes a value (--num-envs 4; --anneal-lr and --no-anneal-lr do not).
CONFIG_FLAGS = {flag(name): kind is not bool for name, kind in FIELD_TYPES.items()} | {
    f"--no-{flag(name)[2:]}": False for name, kind in FIELD_TYPES.items() if kind is bool
}


def without_config_flags(extra: Sequence[str]) -> tuple[list[str], list[str]]:
    """``extra`` less its config flags (and their values), and those left out: a resumed run keeps its own."""
    kept, dropped, takes_value = [], [], False
    for arg in extra:
        if takes_value:
            dropped.append(arg)
            takes_value = False
            continue
        name, equals, _ = arg.partition("=")
        if name in CONFIG_FLAGS:
            dropped.append(arg)
            takes_value = CONFIG_FLAGS[name] and not equals
        else:
            kept.append(arg)
    return kept, dropped


@dataclasses.dataclass(frozen=True)
class PlannedRun:
    """One game x seed. ``resumable``: its directory holds a checkpoint (goes on with --resume);
    ``interrupted``: it exists without one (started again with --overwrite)."""

    env_id: str
    seed: int
    run_dir: Path
    interrupted: bool
    resumable: bool = False

    @property
    def log_path(self) -> Path:
        return self.run_dir.with_name(self.run_dir.name + ".log")

    def train_args(self, total_timesteps: int, extra: Sequence[str]) -> list[str]:
        """The arguments after the launcher: train --resume RUN_DIR [extra less its config flags...], or
        train --env-id ... [--overwrite] [extra...]."""
        if self.resumable:
            return ["train", "--resume", str(self.run_dir), *without_config_flags(extra)[0]]
        args = [
            "train",
            "--env-id",
            self.env_id,
            "--seed",
            str(self.seed),
            "--total-timesteps",
            str(total_timesteps),
            "--run-dir",
            str(self.run_dir),
        ]
        if self.interrupted:
            args.append("--overwrite")
        return args + list(extra)


def run_dir_name(env_id: str, seed: int) -> str:
    return f"{env_id}__seed{seed}"


def plan(games: Sequence[str], seeds: Sequence[int], sweep_dir: Path) -> tuple[list[PlannedRun], list[PlannedRun]]:
    """(runs to do, finished runs to skip), seed-major. A run is finished when its summary.json exists."""
    todo, finished = [], []
    for seed in seeds:
        for env_id in games:
            run_dir = sweep_dir / run_dir_name(env_id, seed)
            if (run_dir / SUMMARY).is_file():
                finished.append(PlannedRun(env_id, seed, run_dir, interrupted=False))
            elif any((run_dir / CHECKPOINT_DIR).glob("iter_*.json")):
                todo.append(PlannedRun(env_id, seed, run_dir, interrupted=True, resumable=True))
            else:
                todo.append(PlannedRun(env_id, seed, run_dir, interrupted=run_dir.exists()))
    return todo, finished


def parse_args(argv: Sequence[str]) -> tuple[Any, list[str]]:
    """The runner's own arguments, and those after the first `--` (for every train command)."""
    argv = list(argv)
    extra: list[str] = []
    if "--" in argv:
        split = argv.index("--")
        argv, extra = argv[:split], argv[split + 1 :]
    parser = Parser(description=__doc__, formatter_class=RawDescriptionHelpFormatter)
    parser.add_argument(
        "--games",
        nargs="+",
        default=list(ATARI_57),
        metavar="ENV_ID",
        help="EnvPool task ids (default: the 57 Atari games of ppo_eqx_bench.atari_games.ATARI_57)",
    )
    parser.add_argument("--seeds", nargs="+", type=int_at_least(0), default=[1, 2, 3], help="(default: 1 2 3)")
    parser.add_argument(
        "--total-timesteps", type=int_at_least(1), default=10_000_000, help="steps per run (default: %(default)s)"
    )
    parser.add_argument("--jobs", type=int_at_least(1), default=1, help="runs at once (default: %(default)s)")
    parser.add_argument(
        "--sweep-dir",
        type=Path,
        default=Path("runs/atari57"),
        help="where run directories and logs go (default: %(default)s)",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="print the command lines of the runs left to do, one per line, and run nothing",
    )
    parser.add_argument(
        "--launcher",
        default=None,
        help="command that the train arguments follow (default: `ppo-eqx` in --dry-run output, "
        "`PYTHON -m ppo_eqx` with this interpreter when running)",
    )
    args = parser.parse_args(argv)
    clashes = [arg for arg in extra if arg.split("=", 1)[0] in RUNNER_FLAGS]
    if clashes:
        parser.error(f"{', '.join(clashes)} after `--`: the runner sets {', '.join(RUNNER_FLAGS)} itself")
    return args, extra


def _start(run: PlannedRun, command: list[str], env: dict[str, str]) -> subprocess.Popen[bytes] | None:
    """Start one run with its output in its log; None when the command cannot start (no such launcher)."""
    run.log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(run.log_path, "w") as log:
        log.write(f"# {shlex.join(command)}\n")
        log.flush()
        try:
            process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
        except OSError as error:  # this run fails, the others may not
            log.write(f"cannot start: {error}\n")
            print(f"{run.env_id} seed {run.seed}: FAILED to start: {error}", flush=True)
            return None
    overwrite = " (--resume)" if run.resumable else " (--overwrite)" if run.interrupted else ""
    print(f"start {run.env_id} seed {run.seed}{overwrite}: {shlex.join(command)}", flush=True)
    return process


def launch(
    todo: Sequence[PlannedRun], launcher: list[str], total_timesteps: int, extra: Sequence[str], jobs: int
) -> tuple[list[PlannedRun], list[PlannedRun], list[PlannedRun]]:
    """Run ``todo``, at most ``jobs`` at once; (finished, failed, not finished because interrupted).

    A run has finished when its command exits 0 and left summary.json. On SIGINT or SIGTERM no new run
    starts, the signal is passed to the running ones (the trainer stops after its iteration) and they are
    waited for.
    """
    pending = list(todo)
    running: dict[subprocess.Popen[bytes], tuple[PlannedRun, float]] = {}
    finished: list[PlannedRun] = []
    failed: list[PlannedRun] = []
    stopped: list[PlannedRun] = []
    env = child_env(jobs)
    total = len(todo)
    stop = StopRequest()
    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}

    def reap(process: subprocess.Popen[bytes], returncode: int) -> None:
        run, start = running.pop(process)
        minutes = (time.monotonic() - start) / 60.0
        done = returncode == 0 and (run.run_dir / SUMMARY).is_file()
        interrupted = stop.signum is not None
        (finished if done else stopped if interrupted else failed).append(run)
        outcome = "finished" if done else f"{'interrupted' if interrupted else 'FAILED'} (exit {returncode})"
        count = len(finished) + len(failed) + len(stopped)
        print(
            f"[{count}/{total}] {run.env_id} seed {run.seed}: {outcome} after {minutes:.1f} min; log {run.log_path}",
            flush=True,
        )

    try:
        while (pending or running) and stop.signum is None:
            while pending and len(running) < jobs and stop.signum is None:
                run = pending.pop(0)
                process = _start(run, launcher + run.train_args(total_timesteps, extra), env)
                if process is None:
                    failed.append(run)
                else:
                    running[process] = (run, time.monotonic())
            for process in list(running):
                returncode = process.poll()
                if returncode is not None:
                    reap(process, returncode)
            time.sleep(POLL_SECONDS)
        if stop.signum is not None:
            name = signal.Signals(stop.signum).name
            print(f"{name}: starting no new run, waiting for {len(running)} running one(s) to stop", flush=True)
            for process in running:
                if process.poll() is None:
                    process.send_signal(stop.signum)  # the trainer stops after the iteration under way
            for process in list(running):
                reap(process, process.wait())
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return finished, failed, stopped + pending


def main(argv: Sequence[str] | None = None) -> int:
    args, extra = parse_args(sys.argv[1:] if argv is None else argv)
    unknown = [env_id for env_id in args.games if env_id not in ATARI_57]
    if unknown:
        print(f"note: not among the 57 Atari games: {', '.join(unknown)}", file=sys.stderr)
    todo, skipped = plan(args.games, args.seeds, args.sweep_dir)
    dropped = without_config_flags(extra)[1]
    if dropped and any(run.resumable for run in todo):
        print(
            f"note: the runs resumed from a checkpoint go on with their own config; left out of their commands: "
            f"{shlex.join(dropped)}",
            file=sys.stderr,
        )
    if args.dry_run:
        launcher = shlex.split(args.launcher) if args.launcher else ["ppo-eqx"]
        for run in todo:
            print(shlex.join(launcher + run.train_args(args.total_timesteps, extra)))
        resumed = sum(run.resumable for run in todo)
        restarted = sum(run.interrupted and not run.resumable for run in todo)
        print(
            f"# {len(todo)} to run ({resumed} resumed from a checkpoint, {restarted} started again with --overwrite), "
            f"{len(skipped)} finished and skipped",
            file=sys.stderr,
        )
        return 0
    launcher = shlex.split(args.launcher) if args.launcher else train_command()
    args.sweep_dir.mkdir(parents=True, exist_ok=True)
    for run in skipped:
        print(f"skip {run.env_id} seed {run.seed}: finished ({run.run_dir / SUMMARY} exists)")
    finished, failed, not_finished = launch(todo, launcher, args.total_timesteps, extra, args.jobs)
    print(
        f"finished {len(finished)}, skipped {len(skipped)}, failed {len(failed)}"
        + (f", interrupted or not started {len(not_finished)}" if not_finished else "")
    )
    for run in failed:
        print(f"  failed: {run.env_id} seed {run.seed}, see {run.log_path}")
    return 1 if failed or not_finished else 0


if __name__ == "__main__":
    sys.exit(main())
