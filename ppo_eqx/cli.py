"""``ppo-eqx train`` and ``ppo-eqx eval``: CleanRL's flags in kebab case, a run directory with checkpoints, a
progress bar, one-line errors."""

import argparse
import dataclasses
import importlib
import json
import math
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Any, NamedTuple, NoReturn

from .config import CONV_IMPLS, ConfigError, PPOConfig, preset_for

CHOICES = {"conv_impl": CONV_IMPLS}
CHECKPOINT_DIR = "checkpoints"  # checkpoint.CHECKPOINT_DIR, without importing jax for --help
VIDEO_SUFFIXES = (".mp4", ".gif")  # evaluate.VIDEO_SUFFIXES
VIDEO_PACKAGES = {".mp4": "PyAV: pip install av", ".gif": "Pillow: pip install pillow"}


class UsageError(Exception):
    """Bad input on the command line; printed as one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _add_config_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per PPOConfig field; defaults stay None so that presets and explicit values can be told apart."""
    defaults = PPOConfig()
    names = [field.name for field in dataclasses.fields(PPOConfig)]
    for field in dataclasses.fields(PPOConfig):
        default = getattr(defaults, field.name)
        whose = "CleanRL's" if names.index(field.name) <= names.index("seed") else "ppo_eqx's"
        help_text = f"(default: {default!r}; {whose} {field.name})"
        if field.type is bool:
            parser.add_argument(_flag(field.name), action=argparse.BooleanOptionalAction, default=None, help=help_text)
        elif field.name in CHOICES:
            parser.add_argument(_flag(field.name), choices=CHOICES[field.name], default=None, help=help_text)
        else:
            kind = int if field.type is int else float if field.type is float else str
            parser.add_argument(_flag(field.name), type=kind, default=None, metavar=field.name.upper(), help=help_text)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="ppo-eqx", description="PPO on EnvPool's XLA interface, in JAX and Equinox.")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    train = commands.add_parser(
        "train",
        help="train an agent",
        description="Train PPO with CleanRL's defaults. Atari games use CleanRL's ppo_atari_envpool_xla_jax "
        "settings; vector-observation tasks (CartPole-v1, ...) default to CleanRL's ppo.py settings "
        "(total-timesteps 500000, num-envs 4, clip-coef 0.2). Explicit flags win over both.",
    )
    _add_config_flags(train)
    train.add_argument(
        "--run-dir", type=Path, default=None, help="where the run is written (default: runs/ENV__SEED__TIME)"
    )
    train.add_argument("--overwrite", action="store_true", help="replace a run directory that already holds a run")
    train.add_argument(
        "--resume",
        type=Path,
        default=None,
        metavar="RUN_DIR",
        help="continue the run in RUN_DIR from its newest checkpoint, with its own config",
    )
    train.add_argument(
        "--keep-checkpoints", type=int, default=3, metavar="N", help="newest checkpoints to keep (default: 3)"
    )
    train.add_argument("--no-tensorboard", action="store_true", help="do not write TensorBoard event files")
    train.add_argument("--no-progress", action="store_true", help="print one line per iteration, no progress bar")
    parallel = train.add_argument_group(
        "devices and hosts",
        "Data parallelism: each minibatch is split over the devices, the gradients averaged; the envs are split "
        "over the processes, each with its own EnvPool. The run computes what one device computes, up to the "
        "order of floating-point sums (see README). Process 0 writes the run directory; every process reads "
        "--resume's.",
    )
    parallel.add_argument(
        "--devices",
        type=int,
        default=None,
        metavar="K",
        help="devices of this process to train on (default: 1; with several processes, all of them)",
    )
    parallel.add_argument(
        "--distributed",
        action="store_true",
        help="join a multi-process run through jax.distributed.initialize(), which reads Slurm's (and other "
        "cluster managers') environment; the three flags below give the peers explicitly instead",
    )
    parallel.add_argument("--coordinator-address", default=None, metavar="HOST:PORT", help="process 0's address")
    parallel.add_argument("--num-processes", type=int, default=None, metavar="P", help="processes in the run")
    parallel.add_argument("--process-id", type=int, default=None, metavar="I", help="this process, 0 .. P-1")
    train.add_argument("--track", action="store_true", help="log to Weights & Biases (needs `pip install wandb`)")
    train.add_argument("--wandb-project-name", default="cleanRL", help="W&B project (default: cleanRL)")
    train.add_argument("--wandb-entity", default=None, help="W&B entity (team or user)")

    evaluate = commands.add_parser(
        "eval",
        help="play whole games with a trained agent",
        description="Play episodes with a checkpoint's policy on envs of their own and report the game score "
        "(raw, unclipped, summed over all lives until game over or truncation). Writes eval.json in the run "
        "directory.",
    )
    evaluate.add_argument("path", type=Path, help="a run directory (its newest checkpoint) or a checkpoint file")
    evaluate.add_argument("--episodes", type=int, default=10, help="episodes to play (default: 10)")
    evaluate.add_argument("--greedy", action="store_true", help="take the most probable action, not a sample")
    evaluate.add_argument("--seed", type=int, default=1, help="seed of the evaluation envs and actions (default: 1)")
    evaluate.add_argument("--video", type=Path, default=None, help="write the first episode as .mp4 or .gif")
    evaluate.add_argument(
        "--output", type=Path, default=None, help="where to write the results (default: RUN_DIR/eval.json)"
    )
    return parser


def config_from_args(args: argparse.Namespace) -> PPOConfig:
    """Explicit flags, else the task's preset, else PPOConfig's (CleanRL's) defaults; validated."""
    from .envs import check_env_id, is_atari

    env_id = args.env_id or PPOConfig.env_id
    check_env_id(env_id)
    values: dict[str, Any] = preset_for(is_atari(env_id))
    for field in dataclasses.fields(PPOConfig):
        value = getattr(args, field.name)
        if value is not None:
            values[field.name] = value
    return PPOConfig(**values).validate()


RUN_FILES = ("config.json", "hardware.json", "metrics.jsonl", "summary.json", "eval.json", "wandb.json")
SEEDS_CONFIG = "seeds.json"
"""A --num-seeds run's directory holds its config under this name, not config.json: the agents' own run
directories below it (seedK/) are the runs that readers of run directories (bench/report.py) should find."""


def _check_writable(run_dir: Path) -> None:
    try:  # a probe of its own: the processes of a multi-host run may check one directory at once
        with tempfile.NamedTemporaryFile(dir=run_dir, prefix=".write-test"):
            pass
    except OSError as error:
        raise UsageError(f"--run-dir {run_dir} is not writable: {error.strerror}") from None


def _prepare_run_dir(run_dir: Path, overwrite: bool) -> None:
    if run_dir.exists() and not run_dir.is_dir():
        raise UsageError(f"--run-dir {run_dir} is a file, not a directory")
    holds_run = run_dir.is_dir() and any(
        (run_dir / name).exists() for name in ("config.json", SEEDS_CONFIG, "metrics.jsonl", CHECKPOINT_DIR)
    )
    if holds_run and not overwrite:
        raise UsageError(
            f"--run-dir {run_dir} already holds a run; pass --overwrite to replace it "
            f"or --resume {run_dir} to continue it"
        )
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise UsageError(f"--run-dir {run_dir} is not writable: {error.strerror}") from None
    _check_writable(run_dir)
    if holds_run:
        for name in (*RUN_FILES, SEEDS_CONFIG):
            (run_dir / name).unlink(missing_ok=True)
        for events in run_dir.glob("events.out.tfevents.*"):
            events.unlink()
        shutil.rmtree(run_dir / CHECKPOINT_DIR, ignore_errors=True)


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


class _Resume(NamedTuple):
    config: PPOConfig
    checkpoint: Any
    path: Path
    metadata: dict[str, Any]


def _load_resume(args: argparse.Namespace) -> _Resume:
    """Check everything about ``--resume RUN_DIR`` before anything in it is touched."""
    from .checkpoint import check_same_run, load_checkpoint, read_metadata, resolve_checkpoint
    from .envs import check_env_id, env_spec

    run_dir: Path = args.resume
    given = [_flag(field.name) for field in dataclasses.fields(PPOConfig) if getattr(args, field.name) is not None]
    if given:
        raise UsageError(
            f"--resume continues the run with its own config ({run_dir / 'config.json'}); drop {', '.join(given)}"
        )
    if args.overwrite:
        raise UsageError("--resume and --overwrite contradict each other; pick one")
    if args.run_dir is not None and args.run_dir != run_dir:
        raise UsageError("--resume RUN_DIR is the run directory; drop --run-dir")
    if not run_dir.is_dir():
        raise UsageError(f"--resume {run_dir}: no such run directory")
    config_path = run_dir / "config.json"
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
        config = PPOConfig.from_dict(saved)
        check_env_id(config.env_id)
    except (ConfigError, TypeError) as error:
        raise UsageError(f"--resume {run_dir}: {config_path}: {error}") from None
    path = resolve_checkpoint(run_dir)
    metadata = read_metadata(path)
    check_same_run(path, metadata, config)
    checkpoint = load_checkpoint(path, metadata, config, env_spec(config.env_id))
    _check_writable(run_dir)
    return _Resume(config, checkpoint, path, metadata)


def _require(module: str, message: str) -> None:
    """Import ``module`` now, or fail with ``message``: optional dependencies are checked before a run starts."""
    try:
        importlib.import_module(module)
    except ImportError:
        raise UsageError(message) from None


def _start_wandb(args: argparse.Namespace, run_dir: Path, config: PPOConfig) -> Any:
    if not args.track:
        return None
    from .logging import start_wandb

    return start_wandb(run_dir, config, project=args.wandb_project_name, entity=args.wandb_entity)


def _any_process(flag: bool) -> bool:
    from .parallel import any_process

    return any_process(flag)


def _start_processes(args: argparse.Namespace) -> Any:
    """Join the multi-process run that the flags ask for, and return the device mesh to train on (None: one
    device, the plain Trainer). Runs before anything else touches jax."""
    import jax

    explicit = {
        "--coordinator-address": args.coordinator_address,
        "--num-processes": args.num_processes,
        "--process-id": args.process_id,
    }
    given = [flag for flag, value in explicit.items() if value is not None]
    if args.devices is not None and args.devices < 1:
        raise UsageError(f"--devices {args.devices} must be at least 1")
    if given and len(given) < len(explicit):
        missing = ", ".join(flag for flag in explicit if flag not in given)
        raise UsageError(f"{', '.join(given)} needs {missing} too (or --distributed alone, under Slurm)")
    processes: int = args.num_processes or 0
    if given and processes < 1:
        raise UsageError(f"--num-processes {processes} must be at least 1")
    if given and not 0 <= args.process_id < processes:
        raise UsageError(f"--process-id {args.process_id} must be in 0 .. {processes - 1}")
    if args.distributed or given:
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


def _check_conv_impl(config: PPOConfig) -> None:
    """``--conv-impl kernel`` where the kernel cannot run is refused before anything is written."""
    if config.conv_impl == "kernel":
        from .networks import kernel_unavailable_reason

        reason = kernel_unavailable_reason()
        if reason is not None:
            raise UsageError(f"--conv-impl kernel: {reason}; use --conv-impl auto or matmul")


def train_command(args: argparse.Namespace) -> int:
    import jax
    from tqdm import tqdm

    from .checkpoint import save_checkpoint
    from .hardware import hardware_info
    from .logging import RunWriter, truncate_metrics, write_json
    from .train import NonFiniteError, Trainer, run_seeds

    if args.keep_checkpoints < 1:
        raise UsageError(f"--keep-checkpoints {args.keep_checkpoints} must be at least 1")
    if args.track:
        _require("wandb", "--track needs Weights & Biases: pip install wandb")
    mesh = _start_processes(args)
    # With several processes, process 0 writes the run directory and prints; all of them train.
    writes = jax.process_index() == 0

    def say(line: str) -> None:
        if writes:
            print(line, flush=True)

    resume_dir: Path | None = args.resume
    resume = _load_resume(args) if resume_dir is not None else None
    if resume is not None and resume_dir is not None:
        config = resume.config
        run_dir = resume_dir
        _check_conv_impl(config)
        start_iteration = int(resume.checkpoint.iteration)
        if start_iteration >= config.num_iterations:
            print(f"ppo-eqx: {run_dir} finished at iteration {start_iteration}; nothing to resume", flush=True)
            return 0
        if args.track and config.num_seeds > 1:
            raise UsageError(f"--track logs one run; {run_dir} trains {config.num_seeds} seeds")
        agent_dirs = _agent_dirs(run_dir, config)
        kept = 0
        for agent_dir in agent_dirs if writes else []:
            kept = truncate_metrics(agent_dir / "metrics.jsonl", start_iteration)
            (agent_dir / "summary.json").unlink(missing_ok=True)
        say(f"ppo-eqx: resuming {run_dir} from {resume.path.name} ({kept} rows of metrics kept)")
    else:
        config = config_from_args(args)
        _check_conv_impl(config)
        if args.track and config.num_seeds > 1:
            raise UsageError(f"--track logs one run; drop it or --num-seeds {config.num_seeds}")
        run_dir = args.run_dir or Path("runs") / f"{config.env_id}__{config.seed}__{int(time.time())}"
        agent_dirs = _agent_dirs(run_dir, config)
        if mesh is not None:
            from .parallel import check_mesh_config

            check_mesh_config(config, mesh)
        refused: UsageError | None = None
        if writes:
            try:
                _prepare_run_dir(run_dir, args.overwrite)
            except UsageError as error:
                refused = error
        # The other processes must not start training (and wait on process 0) when it refused the directory.
        if _any_process(refused is not None):  # one process: just the flag
            raise refused or RunError(f"process 0 refused --run-dir {run_dir}; its output says why")
        if config.num_seeds > 1 and writes:
            for agent_dir in agent_dirs:
                _prepare_run_dir(agent_dir, args.overwrite)
            write_json(run_dir / SEEDS_CONFIG, config.to_dict())
        start_iteration = 0

    devices = "" if mesh is None else f" ({mesh.size} devices, {jax.process_count()} processes)"
    say(
        f"ppo-eqx: {config.env_id}, {config.num_iterations} iterations of {config.batch_size} steps"
        f"{f' x {config.num_seeds} seeds' if config.num_seeds > 1 else ''}, "
        f"run directory {run_dir}, jax {jax.__version__} on {jax.default_backend()}{devices}"
    )
    hardware = hardware_info()
    if mesh is not None:
        hardware["mesh"] = {"devices": mesh.size, "processes": jax.process_count()}
    writers = [
        RunWriter(
            agent_dir,
            agent,
            hardware,
            tensorboard=not args.no_tensorboard,
            resume_step=None if resume is None else start_iteration * config.batch_size,
            wandb_run=_start_wandb(args, run_dir, config) if config.num_seeds == 1 else None,
        )
        for agent_dir, agent in zip(agent_dirs, config.agent_configs(), strict=True)
        if writes
    ]
    stop = _StopRequest()
    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    trainer = None
    last_checkpoint: Path | None = None if resume is None else resume.path
    try:
        start = time.perf_counter()
        time_offset = 0.0 if resume is None else float(resume.metadata.get("time_elapsed", 0.0))
        restore = None if resume is None else resume.checkpoint
        if mesh is None:
            trainer = Trainer(config, restore=restore)
        else:
            from .parallel import MeshTrainer

            trainer = MeshTrainer(config, mesh=mesh, restore=restore)
        compile_seconds = trainer.compile()
        say(f"ppo-eqx: compiled one iteration in {compile_seconds:.1f} s")
        bar = tqdm(
            total=config.num_iterations * config.batch_size,
            initial=start_iteration * config.batch_size,
            unit="step",
            unit_scale=True,
            disable=args.no_progress or not writes,
            dynamic_ncols=True,
            mininterval=1.0,
        )

        def save(iteration: int, reason: str, elapsed: float) -> Path | None:
            assert trainer is not None
            checkpoint = trainer.checkpoint()  # collective: every process takes part
            if not writes:
                return None
            try:
                return save_checkpoint(
                    run_dir,
                    checkpoint,
                    config,
                    trainer.spec,
                    keep=args.keep_checkpoints,
                    extra={"reason": reason, "time_elapsed": elapsed},
                )
            except OSError as error:
                kept = f"the previous checkpoint {last_checkpoint} is intact" if last_checkpoint else "none was kept"
                raise RunError(
                    f"could not write the checkpoint of iteration {iteration} in {run_dir}: "
                    f"{error.strerror or error}; {kept}"
                ) from None

        record: dict[str, Any] = {}
        records: list[dict[str, Any]] = []
        iterations = run_seeds(trainer)
        while True:
            try:
                records = next(iterations)
            except StopIteration:
                break
            except NonFiniteError as error:
                for writer, failed in zip(writers, error.records, strict=bool(writers)):
                    failed["time_elapsed"] = time.perf_counter() - start + time_offset
                    writer.write(failed)
                kept = f"the last good checkpoint is {last_checkpoint}" if last_checkpoint else "no checkpoint was kept"
                raise FloatingPointError(f"{error}; {kept}") from None
            for record in records:
                record["time_elapsed"] = time.perf_counter() - start + time_offset
            for writer, record in zip(writers, records, strict=bool(writers)):
                writer.write(record)
            record = records[0]
            # Progress counts every agent's steps; the return shown is the mean over agents.
            episodic_return = _mean_return(records)
            bar.update(config.batch_size)
            bar.set_postfix(sps=f"{record['sps'] * config.num_seeds:.0f}", ret=f"{episodic_return:.1f}")
            iteration = record["iteration"]
            if args.no_progress and writes:
                left = (config.num_iterations - iteration) * config.batch_size / record["sps"]
                print(
                    f"step {record['global_step']} sps {record['sps'] * config.num_seeds:.0f} episodic_return "
                    f"{episodic_return:.2f} time left {_format_eta(left)}",
                    flush=True,
                )
            boundary = iteration % config.checkpoint_every == 0 or iteration == config.num_iterations
            if mesh is not None and _any_process(stop.signal is not None):  # all processes stop together
                stop.signal = stop.signal or "stop"
            if boundary or stop.signal:
                reason = "periodic" if boundary else stop.signal or "stop"
                last_checkpoint = save(iteration, reason, record["time_elapsed"])
            if stop.signal:
                break
        bar.close()
        if stop.signal:
            if not writes:
                return 130 if stop.signal == "SIGINT" else 143
            print(
                f"ppo-eqx: stopped by {stop.signal} after iteration {record.get('iteration', start_iteration)}; "
                f"checkpoint {last_checkpoint}; continue with: ppo-eqx train --resume {run_dir}",
                file=sys.stderr,
            )
            return 130 if stop.signal == "SIGINT" else 143
        for writer, agent_record in zip(writers, records, strict=bool(writers)):
            writer.finish({key: agent_record.get(key) for key in ("global_step", "time_elapsed", "episodic_return")})
        seeds = f" x {config.num_seeds} seeds" if config.num_seeds > 1 else ""
        say(
            f"ppo-eqx: done, {record['global_step']} steps{seeds} in {record['time_elapsed']:.0f} s, "
            f"episodic_return {_mean_return(records):.2f}"
        )
        return 0
    except KeyboardInterrupt:
        raise RunError(
            f"interrupted twice, stopped at once; continue from {last_checkpoint} with: "
            f"ppo-eqx train --resume {run_dir}"
            if last_checkpoint
            else "interrupted twice, stopped at once before the first checkpoint"
        ) from None
    finally:
        if trainer is not None:
            trainer.close()
        for writer in writers:
            writer.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _agent_dirs(run_dir: Path, config: PPOConfig) -> list[Path]:
    """Where each agent's run is written: the run directory itself for one seed, else ``RUN_DIR/seedK``."""
    if config.num_seeds == 1:
        return [run_dir]
    return [run_dir / f"seed{agent.seed}" for agent in config.agent_configs()]


def _mean_return(records: list[dict[str, Any]]) -> float:
    returns = [r["episodic_return"] for r in records if math.isfinite(r.get("episodic_return", math.nan))]
    return sum(returns) / len(returns) if returns else math.nan


def eval_command(args: argparse.Namespace) -> int:
    import jax

    from .checkpoint import config_of, load_checkpoint, read_metadata, resolve_checkpoint
    from .envs import env_spec
    from .evaluate import EVAL_STREAM, VideoWriter, evaluate, summarise
    from .logging import write_json

    if args.episodes < 1:
        raise UsageError(f"--episodes {args.episodes} must be at least 1")
    if args.video is not None:
        suffix = args.video.suffix.lower()
        if suffix not in VIDEO_SUFFIXES:
            raise UsageError(f"--video {args.video}: the name must end in {' or '.join(VIDEO_SUFFIXES)}")
        _require("av" if suffix == ".mp4" else "PIL", f"--video {args.video} needs {VIDEO_PACKAGES[suffix]}")
    path = resolve_checkpoint(args.path)
    metadata = read_metadata(path)
    config = config_of(path, metadata)
    if config.num_seeds > 1:
        raise UsageError(f"{path} holds the {config.num_seeds} agents of a --num-seeds run; eval takes one agent's")
    spec = env_spec(config.env_id)
    checkpoint = load_checkpoint(path, metadata, config, spec)
    run_dir = path.parent.parent
    output = args.output or run_dir / "eval.json"
    print(
        f"ppo-eqx: evaluating {path} ({config.env_id}, iteration {metadata['iteration']}) on {args.episodes} "
        f"episodes, {'greedy' if args.greedy else 'sampled'} actions",
        flush=True,
    )
    key = jax.random.fold_in(jax.random.PRNGKey(args.seed), EVAL_STREAM)
    video_writer = None
    if args.video is not None:
        fps = 15 if spec.is_atari else 50  # Atari: 60 Hz frames, 4 per step; classic control: 50 Hz
        try:
            video_writer = VideoWriter(args.video, fps)
        except OSError as error:
            raise UsageError(f"--video {args.video}: {error.strerror or error}") from None
    try:
        evaluation = evaluate(
            checkpoint.model,
            config,
            episodes=args.episodes,
            greedy=args.greedy,
            on_frame=None if video_writer is None else video_writer.append,
            seed=args.seed,
            key=key,
        )
    finally:
        if video_writer is not None:
            video_writer.close()
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
    write_json(output, result)
    print(
        f"ppo-eqx: return {summary['mean_return']:.2f} +- {summary['std_return']:.2f} "
        f"(min {summary['min_return']:.2f}, max {summary['max_return']:.2f}) over {args.episodes} episodes; "
        f"written to {output}",
        flush=True,
    )
    return 0


class RunError(Exception):
    """A run that cannot go on (a full disk, a second Ctrl-C); printed as one line, exit status 1."""


def main(argv: Sequence[str] | None = None) -> int:
    from .checkpoint import CheckpointError

    try:
        args = build_parser().parse_args(argv)
        if args.command == "train":
            return train_command(args)
        if args.command == "eval":
            return eval_command(args)
        raise UsageError(f"unknown command {args.command!r}")
    except (UsageError, ConfigError, CheckpointError) as error:
        print(f"ppo-eqx: error: {error}", file=sys.stderr)
        return 2
    except FloatingPointError as error:
        print(f"ppo-eqx: error: {error}; stopping", file=sys.stderr)
        return 1
    except RunError as error:
        print(f"ppo-eqx: error: {error}", file=sys.stderr)
        return 1
    except OSError as error:
        where = f"{error.filename}: " if error.filename else ""
        print(f"ppo-eqx: error: {where}{error.strerror or error}", file=sys.stderr)
        return 1


def entry_point() -> None:
    sys.exit(main())
