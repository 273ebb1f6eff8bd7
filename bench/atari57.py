"""Run the Atari-57 benchmark: every game x seed as one `ppo-eqx train` run, resumable.

    python bench/atari57.py --sweep-dir runs/atari57 --jobs 2
    python bench/atari57.py --games Breakout-v5 Pong-v5 --seeds 1 --dry-run -- --no-tensorboard

``--jobs auto`` plans from the machine how many runs go at once and with how many env threads each
(``plan_concurrency``: the cores this process may use, the GPUs, the memory); each run's threads are pinned to
cores of their own (``--num-threads``, ``--thread-affinity-offset``), so that no two runs fight over one, and its
``hardware.json`` records how many runs shared the machine (``runs_at_once``). ``--measure-s S`` runs the first
runs of the plan together for S seconds once each has compiled, writes their aggregate env steps/s (``--json``)
and stops them: what the plan gives on this machine, before a day of sweeping. Runs stay sync with CleanRL's
settings; EnvPool's async mode is the flag after ``--`` (``--async-batch-size``) and is then in each run's config.

Each run goes to SWEEP_DIR/<env_id>__seed<k>/ and its output to SWEEP_DIR/<env_id>__seed<k>.log. Runs are
ordered seed-major (every game's first seed before any second seed), as CleanRL's benchmark utility does, so
that a partial sweep covers all games. Resuming: a run directory holding summary.json is finished and
skipped; one with a checkpoint was interrupted and goes on from it (`ppo-eqx train --resume`, with the config it
was started with: config flags after `--` are left out of its command); one without a checkpoint starts again
(--overwrite, which deletes only what that run wrote). Arguments after `--` go to every train command.
--dry-run prints the command lines, one per line, for GNU parallel or a Slurm array.
"""

import dataclasses
import json
import os
import shlex
import shutil
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
from ppo_eqx.host.run_dir.names import CHECKPOINT_DIR, SUMMARY  # noqa: E402
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


@dataclasses.dataclass(frozen=True)
class Concurrency:
    """How many runs go at once (``jobs``), each with ``threads`` env threads pinned from core ``slot * threads``
    on (``pin``), and the share of a GPU's memory each takes (``gpu_memory_fraction``; None without a GPU)."""

    jobs: int
    threads: int
    pin: bool
    gpu_memory_fraction: float | None
    why: str

    def run_flags(self, slot: int) -> list[str]:
        """The train flags of the run in ``slot`` (0 .. jobs - 1): its threads and, pinned, its first core."""
        flags = ["--num-threads", str(self.threads)]
        return flags + (["--thread-affinity-offset", str(slot * self.threads)] if self.pin else [])


RUN_MEMORY_GIB = 2.0
"""Host memory one Atari run takes, with room: 1.0 GB measured for ppo-eqx on a CPU (README's Results)."""
THREADS_PER_RUN_ON_GPU = 2
"""Env threads of each run where a GPU learns: its 8 envs step on 2 cores (a sync pool waits for its slowest env,
so more threads than cores help no one), and the learner needs little of the CPU."""


def machine() -> dict[str, object]:
    """What the plan is made from: the cores this process may use, the GPUs (``nvidia-smi -L``: no jax in this
    process) and the memory available now."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    gpus: list[str] = []
    if shutil.which("nvidia-smi"):
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30, check=False)
        gpus = [line for line in listed.stdout.splitlines() if line.startswith("GPU ")]
    memory_gib = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                memory_gib = int(line.split()[1]) / 2**20
    except (OSError, ValueError):
        pass
    return {"cores": cores, "gpus": gpus, "memory_available_gib": memory_gib}


def plan_concurrency(facts: dict[str, object], num_runs: int) -> Concurrency:
    """Runs at once and their threads, from ``machine()``'s facts. Without a GPU one run at a time, its envs on
    EnvPool's default threads: the learner is compute-bound and takes every core (two runs would share them). With
    a GPU the learner takes a few milliseconds an iteration and the envs are the work: as many runs as the cores
    hold ``THREADS_PER_RUN_ON_GPU`` threads each (pinned apart), as the memory holds, as there are runs; each with
    its share of the GPU's memory."""
    cores, gpus, memory = int(facts["cores"]), facts["gpus"], facts["memory_available_gib"]  # type: ignore[arg-type]
    if not gpus:
        return Concurrency(1, 0, False, None, f"no GPU: one run at a time on all {cores} cores")
    by_cores = max(1, cores // THREADS_PER_RUN_ON_GPU)
    by_memory = max(1, int(memory // RUN_MEMORY_GIB)) if isinstance(memory, float) else by_cores
    jobs = max(1, min(by_cores, by_memory, num_runs))
    why = (
        f"{len(gpus)} GPU(s), {cores} cores: {by_cores} runs of {THREADS_PER_RUN_ON_GPU} env threads, "
        f"{by_memory} by memory ({RUN_MEMORY_GIB:g} GiB each), {num_runs} runs to do"
    )
    return Concurrency(jobs, THREADS_PER_RUN_ON_GPU, True, round(0.9 / jobs, 3), why)


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
    parser.add_argument(
        "--jobs", type=jobs_value, default=1,
        help="runs at once, or auto: planned from this machine's cores, GPUs and memory (default: %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--measure-s", type=float, default=None, metavar="S",
        help="run the plan's first runs together for S seconds once each has compiled, report their aggregate env "
        "steps/s and stop them (nothing is kept in SWEEP_DIR that was not there)",
    )  # fmt: skip
    parser.add_argument("--json", type=Path, default=None, help="with --measure-s: write the measurement here")
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
    if args.sweep_dir.exists() and not args.sweep_dir.is_dir():
        parser.error(f"--sweep-dir {args.sweep_dir} is not a directory; allowed: a directory, or a path to create one")
    return args, extra


def jobs_value(text: str) -> int | str:
    """``--jobs``: a positive count, or ``auto``."""
    if text == "auto":
        return text
    return int_at_least(1)(text)


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
    todo: Sequence[PlannedRun],
    launcher: list[str],
    total_timesteps: int,
    extra: Sequence[str],
    concurrency: Concurrency,
) -> tuple[list[PlannedRun], list[PlannedRun], list[PlannedRun]]:
    """Run ``todo``, at most ``jobs`` at once; (finished, failed, not finished because interrupted).

    A run has finished when its command exits 0 and left summary.json. On SIGINT or SIGTERM no new run
    starts, the signal is passed to the running ones (the trainer stops after its iteration) and they are
    waited for.
    """
    jobs = concurrency.jobs
    pending = list(todo)
    running: dict[subprocess.Popen[bytes], tuple[PlannedRun, float, int]] = {}
    finished: list[PlannedRun] = []
    failed: list[PlannedRun] = []
    stopped: list[PlannedRun] = []
    env = run_env(concurrency)
    total = len(todo)
    stop = StopRequest()
    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}

    def reap(process: subprocess.Popen[bytes], returncode: int) -> None:
        run, start, _ = running.pop(process)
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
                slot = min(set(range(jobs)) - {slot for _, _, slot in running.values()})
                process = _start(run, launcher + run_args(run, total_timesteps, extra, concurrency, slot), env)
                if process is None:
                    failed.append(run)
                else:
                    running[process] = (run, time.monotonic(), slot)
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


def run_env(concurrency: Concurrency) -> dict[str, str]:
    """Every run's environment: this checkout's ppo_eqx, its share of a GPU's memory, and how many runs share
    the machine (recorded in its ``hardware.json``, so that its minutes are read as a shared machine's)."""
    env = child_env(concurrency.jobs)
    if concurrency.gpu_memory_fraction is not None and "XLA_PYTHON_CLIENT_MEM_FRACTION" not in os.environ:
        env["XLA_PYTHON_CLIENT_MEM_FRACTION"] = str(concurrency.gpu_memory_fraction)
    env["PPO_EQX_RUNS_AT_ONCE"] = str(concurrency.jobs)
    return env


def run_args(
    run: PlannedRun, total_timesteps: int, extra: Sequence[str], concurrency: Concurrency, slot: int
) -> list[str]:
    """``run``'s train arguments with its slot's threads (a resumed run keeps its own config, threads included)."""
    args = run.train_args(total_timesteps, extra)
    given = {arg.split("=", 1)[0] for arg in extra}
    if run.resumable or concurrency.threads == 0 or {"--num-threads", "--thread-affinity-offset"} & given:
        return args
    return args + concurrency.run_flags(slot)


def measure(
    todo: Sequence[PlannedRun], launcher: list[str], extra: Sequence[str], concurrency: Concurrency, seconds: float
) -> dict[str, object]:
    """The first ``concurrency.jobs`` runs of ``todo`` together: once every one has written an iteration, their
    iterations over ``seconds``; then each is stopped and its directory and log removed (a fresh run's only)."""
    runs = [run for run in todo if not run.run_dir.exists()][: concurrency.jobs]
    env = run_env(concurrency)
    processes = []
    for slot, run in enumerate(runs):
        args = run_args(run, 10**9, extra, dataclasses.replace(concurrency, jobs=len(runs)), slot)
        processes.append(_start(run, launcher + args, env))
    try:
        deadline = time.monotonic() + 600
        while not all(_rows(run) for run in runs):
            ended = [run for run, p in zip(runs, processes, strict=True) if p is None or p.poll() is not None]
            if ended or time.monotonic() > deadline:
                log = (ended or runs)[0].log_path
                tail = " | ".join(log.read_text(errors="replace").strip().splitlines()[-3:]) if log.exists() else ""
                raise SystemExit(f"error: a run of the measurement ended or did not compile ({log}): {tail[-800:]}")
            time.sleep(POLL_SECONDS)
        start, before = time.monotonic(), [_rows(run) for run in runs]
        time.sleep(seconds)
        elapsed, after = time.monotonic() - start, [_rows(run) for run in runs]
    finally:
        for process in processes:
            if process is not None and process.poll() is None:
                process.kill()
                process.wait()
        for run in runs:
            shutil.rmtree(run.run_dir, ignore_errors=True)
            run.log_path.unlink(missing_ok=True)
    rows = []
    for run, first, last in zip(runs, before, after, strict=True):
        steps = sum(row["batch"] for row in last[len(first) :])
        rows.append({"env_id": run.env_id, "iterations": len(last) - len(first), "env_steps_per_s": steps / elapsed})
    total = sum(float(row["env_steps_per_s"]) for row in rows)  # type: ignore[arg-type]
    return {"rows": rows, "aggregate_env_steps_per_s": total, "seconds": elapsed}


def _rows(run: PlannedRun) -> list[dict[str, int]]:
    """The iterations ``run`` has written, each with its batch (steps of the iteration)."""
    try:
        lines = (run.run_dir / "metrics.jsonl").read_text().splitlines()
    except OSError:
        return []
    rows, last = [], 0
    for line in lines:
        try:
            step = int(json.loads(line)["global_step"])
        except (ValueError, KeyError, TypeError):
            continue
        rows.append({"batch": step - last})
        last = step
    return rows


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
    facts = machine()
    concurrency = (
        plan_concurrency(facts, len(todo))
        if args.jobs == "auto"
        else Concurrency(args.jobs, 0, False, None, f"--jobs {args.jobs}")
    )
    print(f"plan: {concurrency.jobs} run(s) at once ({concurrency.why})", flush=True)
    try:
        args.sweep_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise SystemExit(f"error: cannot create --sweep-dir {args.sweep_dir}: {error.strerror}") from None
    if args.measure_s is not None:
        measured = measure(todo, launcher, extra, concurrency, args.measure_s)
        rows = measured.pop("rows")
        header = {"machine": facts, "jobs": concurrency.jobs, "threads": concurrency.threads, **measured}
        header["plan"] = concurrency.why
        print(f"aggregate: {measured['aggregate_env_steps_per_s']:.0f} env steps/s over {measured['seconds']:.0f} s")
        if args.json is not None:
            args.json.write_text(json.dumps({"header": header, "rows": rows}, indent=2) + "\n")
        return 0
    for run in skipped:
        print(f"skip {run.env_id} seed {run.seed}: finished ({run.run_dir / SUMMARY} exists)")
    finished, failed, not_finished = launch(todo, launcher, args.total_timesteps, extra, concurrency)
    print(
        f"finished {len(finished)}, skipped {len(skipped)}, failed {len(failed)}"
        + (f", interrupted or not started {len(not_finished)}" if not_finished else "")
    )
    for run in failed:
        print(f"  failed: {run.env_id} seed {run.seed}, see {run.log_path}")
    return 1 if failed or not_finished else 0


if __name__ == "__main__":
    sys.exit(main())
