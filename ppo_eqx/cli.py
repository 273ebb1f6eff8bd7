"""``ppo-eqx train``: CleanRL's flags in kebab case, a run directory, a progress bar, one-line errors."""

import argparse
import dataclasses
import math
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn

from .config import CONV_IMPLS, ConfigError, PPOConfig, preset_for

CHOICES = {"conv_impl": CONV_IMPLS}


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
    for field in dataclasses.fields(PPOConfig):
        default = getattr(defaults, field.name)
        help_text = f"(default: {default!r}; CleanRL's {field.name})"
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
    train.add_argument("--no-tensorboard", action="store_true", help="do not write TensorBoard event files")
    train.add_argument("--no-progress", action="store_true", help="print one line per iteration, no progress bar")
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


def _prepare_run_dir(run_dir: Path, overwrite: bool) -> None:
    if run_dir.exists() and not run_dir.is_dir():
        raise UsageError(f"--run-dir {run_dir} is a file, not a directory")
    holds_run = run_dir.is_dir() and any((run_dir / name).exists() for name in ("config.json", "metrics.jsonl"))
    if holds_run and not overwrite:
        raise UsageError(f"--run-dir {run_dir} already holds a run; pass --overwrite to replace it")
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        if holds_run:
            for name in ("config.json", "hardware.json", "metrics.jsonl", "summary.json"):
                (run_dir / name).unlink(missing_ok=True)
            for events in run_dir.glob("events.out.tfevents.*"):
                events.unlink()
        probe = run_dir / ".write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as error:
        raise UsageError(f"--run-dir {run_dir} is not writable: {error.strerror}") from None


class _StopRequest:
    """Ctrl-C or SIGTERM asks the loop to stop after the iteration under way."""

    def __init__(self) -> None:
        self.signal: str | None = None

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        self.signal = signal.Signals(signum).name


def _format_eta(seconds: float) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(seconds)) if math.isfinite(seconds) else "?"


def train_command(args: argparse.Namespace) -> int:
    import jax
    from tqdm import tqdm

    from .hardware import hardware_info
    from .logging import RunWriter
    from .train import Trainer, run

    config = config_from_args(args)
    run_dir = args.run_dir or Path("runs") / f"{config.env_id}__{config.seed}__{int(time.time())}"
    _prepare_run_dir(run_dir, args.overwrite)

    print(
        f"ppo-eqx: {config.env_id}, {config.num_iterations} iterations of {config.batch_size} steps, "
        f"run directory {run_dir}, jax {jax.__version__} on {jax.default_backend()}",
        flush=True,
    )
    writer = RunWriter(run_dir, config, hardware_info(), tensorboard=not args.no_tensorboard)
    stop = _StopRequest()
    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        start = time.perf_counter()
        trainer = Trainer(config)
        compile_seconds = trainer.compile()
        print(f"ppo-eqx: compiled one iteration in {compile_seconds:.1f} s", flush=True)
        bar = tqdm(
            total=config.num_iterations * config.batch_size,
            unit="step",
            unit_scale=True,
            disable=args.no_progress,
            dynamic_ncols=True,
            mininterval=1.0,
        )
        record: dict[str, Any] = {}
        for record in run(trainer):
            record["time_elapsed"] = time.perf_counter() - start
            writer.write(record)
            if not math.isfinite(record["loss"]):
                raise FloatingPointError(f"the loss is {record['loss']} at iteration {record['iteration']}")
            bar.update(config.batch_size)
            bar.set_postfix(sps=f"{record['sps']:.0f}", ret=f"{record['episodic_return']:.1f}")
            if args.no_progress:
                left = (config.num_iterations - record["iteration"]) * config.batch_size / record["sps"]
                print(
                    f"step {record['global_step']} sps {record['sps']:.0f} episodic_return "
                    f"{record['episodic_return']:.2f} time left {_format_eta(left)}",
                    flush=True,
                )
            if stop.signal:
                break
        bar.close()
        if stop.signal:
            print(
                f"ppo-eqx: stopped by {stop.signal} after iteration {record.get('iteration', 0)}; "
                f"metrics so far are in {run_dir}",
                file=sys.stderr,
            )
            return 130 if stop.signal == "SIGINT" else 143
        writer.finish({key: record.get(key) for key in ("global_step", "time_elapsed", "episodic_return")})
        print(
            f"ppo-eqx: done, {record['global_step']} steps in {record['time_elapsed']:.0f} s, "
            f"episodic_return {record['episodic_return']:.2f}",
            flush=True,
        )
        return 0
    finally:
        writer.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        if args.command == "train":
            return train_command(args)
        raise UsageError(f"unknown command {args.command!r}")
    except (UsageError, ConfigError) as error:
        print(f"ppo-eqx: error: {error}", file=sys.stderr)
        return 2
    except FloatingPointError as error:
        print(f"ppo-eqx: error: {error}; stopping", file=sys.stderr)
        return 1


def entry_point() -> None:
    sys.exit(main())
