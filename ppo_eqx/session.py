"""What ``ppo-eqx train`` and ``ppo-eqx eval`` do with their parsed flags.

``train_command`` checks every input before anything is written (``plan_new``/``plan_resume``, then the
devices, the kernel and the checkpoint), creates or clears the run directory only then, and hands the run to
a ``TrainingRun``: the run's lifecycle (writers, trainer, signals, checkpoints, the end) in one object.
"""

import argparse
import contextlib
import importlib
import json
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any, NamedTuple

from .cli import RunError, UsageError, flag
from .config import PPOConfig, preset_for
from .rundir import (
    CONFIG,
    EVAL,
    METRICS,
    SEEDS_CONFIG,
    SUMMARY,
    RunDirError,
    agent_dirs,
    check_new_run_dir,
    check_output,
    make_run_dir,
    truncate_metrics,
    write_json,
)

VIDEO_PACKAGES = {".mp4": ("av", "PyAV: pip install av"), ".gif": ("PIL", "Pillow: pip install pillow")}


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
        return agent_dirs(self.run_dir, [agent.seed for agent in self.config.agent_configs()])


def config_from_args(args: argparse.Namespace) -> PPOConfig:
    """Explicit flags, else the task's preset, else PPOConfig's (CleanRL's) defaults; validated."""
    from .envs import backend

    env_id = args.env_id or PPOConfig.env_id
    spec = backend("envpool").spec(env_id)
    values: dict[str, Any] = preset_for(spec.is_atari)
    values.update({name: value for name, value in vars(args).items() if name in _CONFIG_FIELDS and value is not None})
    return PPOConfig(**values).validate()


_CONFIG_FIELDS = frozenset(PPOConfig.__dataclass_fields__)


def plan_new(args: argparse.Namespace) -> Plan:
    """The checked plan of a new run: config, env and every directory it writes (nothing is written)."""
    config = config_from_args(args)
    if args.track and config.num_seeds > 1:
        raise UsageError(f"--track logs one run; drop it or --num-seeds {config.num_seeds}")
    run_dir = args.run_dir or Path("runs") / f"{config.env_id}__{config.seed}__{int(time.time())}"
    plan = Plan(config, run_dir)
    check_new_run_dir(run_dir, args.overwrite)
    for agent_dir in plan.agent_dirs if config.num_seeds > 1 else []:
        check_new_run_dir(agent_dir, args.overwrite)
    return plan


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
    backend("envpool").spec(config.env_id)
    if args.track and config.num_seeds > 1:
        raise UsageError(f"--track logs one run; {run_dir} trains {config.num_seeds} seeds")
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
        except (RuntimeError, ValueError) as error:
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
    check_addresses(args)
    plan = plan_resume(args) if args.resume is not None else plan_new(args)
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
            _make_run_dirs(plan, args.overwrite)
        except RunDirError as error:
            refused = error
    # The other processes must not start training (and wait on process 0) when it refused the directory.
    if any_process(refused is not None):
        raise refused or RunError(f"process 0 refused --run-dir {plan.run_dir}; its output says why")
    return TrainingRun(args, plan, mesh, writes, restore).run()


def _load(plan: Plan) -> Any:
    from .checkpoint import load_checkpoint
    from .envs import backend

    assert plan.resume is not None
    path = plan.resume["path"]
    return load_checkpoint(path, plan.resume, plan.config, backend("envpool").spec(plan.config.env_id))


def _make_run_dirs(plan: Plan, overwrite: bool) -> None:
    make_run_dir(plan.run_dir, overwrite)
    if plan.config.num_seeds > 1:
        for agent_dir in plan.agent_dirs:
            make_run_dir(agent_dir, overwrite)
        write_json(plan.run_dir / SEEDS_CONFIG, plan.config.to_dict())


class _StopRequest:
    """Ctrl-C or SIGTERM asks the loop to stop after the iteration under way; a second one stops at once."""

    def __init__(self) -> None:
        self.signal: str | None = None

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        if self.signal is not None:
            raise KeyboardInterrupt
        self.signal = signal.Signals(signum).name


def _format_eta(seconds: float) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(seconds)) if math.isfinite(seconds) else "?"


def _mean_return(records: list[dict[str, Any]]) -> float:
    returns = [r["episodic_return"] for r in records if math.isfinite(r.get("episodic_return", math.nan))]
    return sum(returns) / len(returns) if returns else math.nan


class TrainingRun:
    """One ``ppo-eqx train`` once its input is checked: the writers, the trainer, signals, checkpoints, the end.

    ``run()`` returns the exit status; a fault after the start (a full disk, a writer's thread failing, a second
    Ctrl-C) is a ``RunError`` (one line), with everything written before it intact.
    """

    def __init__(self, args: argparse.Namespace, plan: Plan, mesh: Any, writes: bool, restore: Any):
        self.args, self.plan, self.mesh, self.writes, self.restore = args, plan, mesh, writes, restore
        self.config = plan.config
        self.writers: list[Any] = []
        self.trainer: Any = None
        self.stop = _StopRequest()
        self.last_checkpoint: Path | None = None if plan.resume is None else plan.resume["path"]
        self.thread_errors: list[BaseException] = []
        self.time_offset = 0.0 if plan.resume is None else float(plan.resume.get("time_elapsed", 0.0))
        self.records: list[dict[str, Any]] = []

    def say(self, line: str) -> None:
        if self.writes:
            print(line, flush=True)

    def run(self) -> int:
        with self._signals(), self._thread_errors():
            try:
                self._open()
                self._loop()
                return self._end()
            except KeyboardInterrupt:
                raise RunError(
                    f"interrupted twice, stopped at once; continue from {self.last_checkpoint} with: "
                    f"ppo-eqx train --resume {self.plan.run_dir}"
                    if self.last_checkpoint
                    else "interrupted twice, stopped at once before the first checkpoint"
                ) from None
            finally:
                self._close()

    @contextlib.contextmanager
    def _signals(self) -> Iterator[None]:
        previous = {sig: signal.signal(sig, self.stop) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    @contextlib.contextmanager
    def _thread_errors(self) -> Iterator[None]:
        """A writer's background thread that fails (TensorBoard on a full disk) is recorded, not printed: the
        loop stops with one line (``_check_threads``)."""
        previous = threading.excepthook
        threading.excepthook = lambda hook: self.thread_errors.append(hook.exc_value or RuntimeError("thread"))
        try:
            yield
        finally:
            threading.excepthook = previous

    def _open(self) -> None:
        import jax

        from .hardware import hardware_info
        from .train import Trainer

        plan, config = self.plan, self.config
        if plan.resume is not None:
            kept = 0
            for agent_dir in plan.agent_dirs if self.writes else []:
                kept = truncate_metrics(agent_dir / METRICS, plan.start_iteration)
                (agent_dir / SUMMARY).unlink(missing_ok=True)
            self.say(f"ppo-eqx: resuming {plan.run_dir} from {plan.resume['path'].name} ({kept} rows of metrics kept)")
        devices = "" if self.mesh is None else f" ({self.mesh.size} devices, {jax.process_count()} processes)"
        self.say(
            f"ppo-eqx: {config.env_id}, {config.num_iterations} iterations of {config.batch_size} steps"
            f"{f' x {config.num_seeds} seeds' if config.num_seeds > 1 else ''}, "
            f"run directory {plan.run_dir}, jax {jax.__version__} on {jax.default_backend()}{devices}"
        )
        hardware = hardware_info()
        if self.mesh is not None:
            hardware["mesh"] = {"devices": self.mesh.size, "processes": jax.process_count()}
        self.writers = self._make_writers(hardware) if self.writes else []
        placement = None
        if self.mesh is not None:
            from .parallel import MeshPlacement

            placement = MeshPlacement(config, self.mesh)
        self.trainer = Trainer(config, restore=self.restore, placement=placement)
        self.say(f"ppo-eqx: compiled one iteration in {self.trainer.compile():.1f} s")

    def _make_writers(self, hardware: dict[str, Any]) -> list[Any]:
        from .writers import RunWriter, start_wandb

        args, plan, config = self.args, self.plan, self.config
        resume_step = None if plan.resume is None else plan.start_iteration * config.batch_size
        writers = []
        for agent_dir, agent in zip(plan.agent_dirs, config.agent_configs(), strict=True):
            wandb_run = None
            if args.track:
                wandb_run = start_wandb(plan.run_dir, config, project=args.wandb_project_name, entity=args.wandb_entity)
            writers.append(
                RunWriter(
                    agent_dir,
                    agent,
                    hardware,
                    tensorboard=not args.no_tensorboard,
                    resume_step=resume_step,
                    wandb_run=wandb_run,
                )
            )
        return writers

    def _loop(self) -> None:
        from tqdm import tqdm

        from .train import NonFiniteError, run_seeds

        config, start = self.config, time.perf_counter()
        bar = tqdm(
            total=config.num_iterations * config.batch_size,
            initial=self.plan.start_iteration * config.batch_size,
            unit="step",
            unit_scale=True,
            disable=self.args.no_progress or not self.writes,
            dynamic_ncols=True,
            mininterval=1.0,
        )
        try:
            for records in run_seeds(self.trainer):
                for record in records:
                    record["time_elapsed"] = time.perf_counter() - start + self.time_offset
                self._write(records)
                self._show(bar, records)
                if self._checkpoint_now(records[0]["iteration"]):
                    break
        except NonFiniteError as error:
            for record in error.records:
                record["time_elapsed"] = time.perf_counter() - start + self.time_offset
            self._write(error.records)
            kept = (
                f"the last good checkpoint is {self.last_checkpoint}"
                if self.last_checkpoint
                else "no checkpoint was kept"
            )
            raise FloatingPointError(f"{error}; {kept}") from None
        finally:
            bar.close()

    def _write(self, records: list[dict[str, Any]]) -> None:
        self.records = records
        try:
            for writer, record in zip(self.writers, records, strict=bool(self.writers)):
                writer.write(record)
        except OSError as error:
            raise RunError(
                f"could not write the metrics of iteration {records[0]['iteration']}: {error.strerror or error}"
            ) from None
        self._check_threads()

    def _check_threads(self) -> None:
        if self.thread_errors:
            error = self.thread_errors[0]
            reason = getattr(error, "strerror", None) or (str(error).splitlines() or [type(error).__name__])[0]
            raise RunError(f"a writer of {self.plan.run_dir} failed: {reason}; {self._kept()}")

    def _kept(self) -> str:
        return (
            f"the last checkpoint {self.last_checkpoint} is intact"
            if self.last_checkpoint
            else "no checkpoint was kept"
        )

    def _show(self, bar: Any, records: list[dict[str, Any]]) -> None:
        # Progress counts every agent's steps; the return shown is the mean over agents.
        config, record = self.config, records[0]
        sps = record["sps"] * config.num_seeds
        bar.update(config.batch_size)
        bar.set_postfix(sps=f"{sps:.0f}", ret=f"{_mean_return(records):.1f}")
        if self.args.no_progress and self.writes:
            left = (config.num_iterations - record["iteration"]) * config.batch_size / record["sps"]
            print(
                f"step {record['global_step']} sps {sps:.0f} episodic_return {_mean_return(records):.2f} "
                f"time left {_format_eta(left)}",
                flush=True,
            )

    def _checkpoint_now(self, iteration: int) -> bool:
        """Save at segment boundaries, at the end and on a stop request; True when the loop should stop."""
        config = self.config
        boundary = iteration % config.checkpoint_every == 0 or iteration == config.num_iterations
        if self.mesh is not None and any_process(self.stop.signal is not None):  # all processes stop together
            self.stop.signal = self.stop.signal or "stop"
        if boundary or self.stop.signal:
            self._save(iteration, "periodic" if boundary else self.stop.signal or "stop")
        return self.stop.signal is not None

    def _save(self, iteration: int, reason: str) -> None:
        from .checkpoint import save_checkpoint

        checkpoint = self.trainer.checkpoint()  # collective: every process takes part
        if not self.writes:
            return
        elapsed = self.records[0]["time_elapsed"]
        try:
            self.last_checkpoint = save_checkpoint(
                self.plan.run_dir,
                checkpoint,
                self.config,
                self.trainer.spec,
                keep=self.args.keep_checkpoints,
                extra={"reason": reason, "time_elapsed": elapsed},
            )
        except OSError as error:
            raise RunError(
                f"could not write the checkpoint of iteration {iteration} in {self.plan.run_dir}: "
                f"{error.strerror or error}; {self._kept().replace('last', 'previous')}"
            ) from None

    def _end(self) -> int:
        records, config = self.records, self.config
        if self.stop.signal:
            if self.writes:
                iteration = records[0]["iteration"] if records else self.plan.start_iteration
                print(
                    f"ppo-eqx: stopped by {self.stop.signal} after iteration {iteration}; checkpoint "
                    f"{self.last_checkpoint}; continue with: ppo-eqx train --resume {self.plan.run_dir}",
                    file=sys.stderr,
                )
            return 130 if self.stop.signal == "SIGINT" else 143
        for writer, record in zip(self.writers, records, strict=bool(self.writers)):
            writer.finish({key: record.get(key) for key in ("global_step", "time_elapsed", "episodic_return")})
        seeds = f" x {config.num_seeds} seeds" if config.num_seeds > 1 else ""
        record = records[0]
        self.say(
            f"ppo-eqx: done, {record['global_step']} steps{seeds} in {record['time_elapsed']:.0f} s, "
            f"episodic_return {_mean_return(records):.2f}"
        )
        return 0

    def _close(self) -> None:
        if self.trainer is not None:
            self.trainer.close()
        for writer in self.writers:
            with contextlib.suppress(OSError):
                writer.close()


def eval_command(args: argparse.Namespace) -> int:
    """Check the checkpoint and both output paths, then play, then write ``eval.json`` (or ``--output``)."""
    from .checkpoint import config_of, load_checkpoint, read_metadata, resolve_checkpoint
    from .envs import backend

    path = resolve_checkpoint(args.path)
    run_dir = path.parent.parent
    output = args.output or run_dir / EVAL
    check_output("--output", output, run_dir)
    if args.video is not None:
        _check_video(args.video, run_dir, output)
    metadata = read_metadata(path)
    config = config_of(path, metadata)
    if config.num_seeds > 1:
        raise UsageError(f"{path} holds the {config.num_seeds} agents of a --num-seeds run; eval takes one agent's")
    spec = backend("envpool").spec(config.env_id)
    checkpoint = load_checkpoint(path, metadata, config, spec)
    print(
        f"ppo-eqx: evaluating {path} ({config.env_id}, iteration {metadata['iteration']}) on {args.episodes} "
        f"episodes, {'greedy' if args.greedy else 'sampled'} actions",
        flush=True,
    )
    evaluation = _play(args, checkpoint.model, config, fps=15 if spec.is_atari else 50)
    from .evaluate import summarise

    summary = summarise(evaluation)
    result = {
        "checkpoint": str(path),
        "env_id": config.env_id,
        "iteration": metadata["iteration"],
        "global_step": metadata.get("global_step"),
        "episodes": args.episodes,
        "greedy": args.greedy,
        "seed": args.seed,
        **summary,
        "returns": evaluation.returns,
        "lengths": evaluation.lengths,
        "video": None if args.video is None else str(args.video),
    }
    try:
        write_json(output, result)
    except OSError as error:
        raise RunError(f"could not write {output}: {error.strerror or error}") from None
    print(
        f"ppo-eqx: return {summary['mean_return']:.2f} +- {summary['std_return']:.2f} "
        f"(min {summary['min_return']:.2f}, max {summary['max_return']:.2f}) over {args.episodes} episodes; "
        f"written to {output}",
        flush=True,
    )
    return 0


def _check_video(video: Path, run_dir: Path, output: Path) -> None:
    suffix = video.suffix.lower()
    if suffix not in VIDEO_PACKAGES:
        raise UsageError(f"--video {video}: the name must end in {' or '.join(VIDEO_PACKAGES)}")
    check_output("--video", video, run_dir)
    if video.resolve() == output.resolve():
        raise UsageError(f"--video {video} is also the --output; allowed: two different files")
    module, package = VIDEO_PACKAGES[suffix]
    require(module, f"--video {video} needs {package}")


def _play(args: argparse.Namespace, model: Any, config: PPOConfig, *, fps: int) -> Any:
    import jax

    from .evaluate import EVAL_STREAM, VideoWriter, evaluate

    key = jax.random.fold_in(jax.random.PRNGKey(args.seed), EVAL_STREAM)
    writer = None
    if args.video is not None:
        try:
            writer = VideoWriter(args.video, fps)
        except OSError as error:
            raise UsageError(f"--video {args.video}: {error.strerror or error}") from None
    try:
        return evaluate(
            model,
            config,
            episodes=args.episodes,
            greedy=args.greedy,
            on_frame=None if writer is None else writer.append,
            seed=args.seed,
            key=key,
        )
    finally:
        if writer is not None:
            writer.close()
