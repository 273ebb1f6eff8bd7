"""``ppo-eqx train`` and ``ppo-eqx eval``: CleanRL's flags in kebab case, derived from PPOConfig's fields, and
one-line errors. The parser needs the config alone; each command's module is imported when it runs.

Exit status: 0 done, 2 bad input (one line, nothing written), 1 a run that cannot go on (one line; what was
written before is intact), 130/143 stopped by SIGINT/SIGTERM after a checkpoint.
"""

import argparse
import contextlib
import dataclasses
import errno
import logging
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn

from ..config import FIELD_CHOICES, INT32_MAX, PPOConfig, flag
from ..errors import ConfigError, RunDirError, RunError, UsageError
from ..host.run_dir import CHECKPOINT_DIR, check_output, path_problem, read_manifest, refuse_if_held, refuse_strangers
from ..sweeps import SWEEPABLE
from ..sweeps import sweep_item as parse_sweep
from ..validation import IMPORTABLE
from .environment import XlaFlagsProbe, import_jax, restore_xla_flags, schedule_small_programs
from .stopwatch import STARTUP


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(message.replace("\n", " "))


def _path(text: str) -> Path:
    problem = path_problem(text)
    if problem is not None:
        raise argparse.ArgumentTypeError(problem)
    try:
        os.stat(text)
    except OSError as error:  # a path that does not exist yet is fine; one that cannot be resolved is not
        if error.errno == errno.ELOOP:
            raise argparse.ArgumentTypeError(f"{text} is a symbolic link loop ({error.strerror})") from None
    return Path(text)


def _int_in(low: int, high: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text[:60]!r} is not an integer") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value} is out of range; allowed: {low} .. {high}")
        return value

    parse.__name__ = "integer"
    return parse


def _field_help(field: dataclasses.Field, default: Any) -> str:
    text = field.metadata.get("help", field.name.replace("_", " "))
    return f"{text} (default: {default!r})".replace("%", "%%")


def sweep_item(text: str) -> tuple[str, tuple[Any, ...]]:
    """``--sweep``'s value (``config.sweep_item``), its refusal as argparse's."""
    try:
        return parse_sweep(text)
    except ConfigError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def add_config_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per PPOConfig field; defaults stay None so that presets and explicit values can be told apart."""
    defaults = PPOConfig()
    for field in dataclasses.fields(PPOConfig):
        help_text = _field_help(field, getattr(defaults, field.name))
        if field.name == "sweep":
            parser.add_argument(
                "--sweep", type=sweep_item, action="append", default=None, metavar="NAME=V1,V2",
                help=f"train every value of hyperparameter NAME, in one program; repeat for a grid; NAME: "
                f"{', '.join(flag(name)[2:] for name in SWEEPABLE)}; each setting x --num-seeds seeds (ppo_eqx's own)",
            )  # fmt: skip
            continue
        if field.type is bool:
            kwargs: dict[str, Any] = {"action": argparse.BooleanOptionalAction}
        elif field.name in IMPORTABLE:  # a name, or MODULE:ATTRIBUTE: PPOConfig checks it
            kwargs = {"metavar": "{" + ",".join(FIELD_CHOICES[field.name]) + "},MODULE:ATTRIBUTE"}
        elif field.name in FIELD_CHOICES:
            kwargs = {"choices": FIELD_CHOICES[field.name]}
        else:
            kind = int if field.type is int else float if field.type is float else str
            kwargs = {"type": kind, "metavar": field.name.upper()}
        parser.add_argument(flag(field.name), default=None, help=help_text, **kwargs)


def _add_run_flags(train: argparse.ArgumentParser) -> None:
    train.add_argument(
        "--run-dir", type=_path, default=None, help="where the run is written (default: runs/ENV__SEED__TIME)"
    )
    train.add_argument("--overwrite", action="store_true", help="replace a run directory that already holds a run")
    train.add_argument(
        "--resume", type=_path, default=None, metavar="RUN_DIR",
        help="continue the run in RUN_DIR from its newest checkpoint, with its own config",
    )  # fmt: skip
    train.add_argument(
        "--keep-checkpoints", type=_int_in(1, INT32_MAX), default=None, metavar="N",
        help="newest checkpoints to keep (default: 3; a resumed run keeps the number it was started with)",
    )  # fmt: skip
    train.add_argument("--no-tensorboard", action="store_true", help="do not write TensorBoard event files")
    train.add_argument("--no-progress", action="store_true", help="print one line per iteration, no progress bar")
    train.add_argument("--track", action="store_true", help="log to Weights & Biases (needs `pip install wandb`)")
    train.add_argument("--wandb-project-name", default="cleanRL", help="W&B project (default: cleanRL)")
    train.add_argument("--wandb-entity", default=None, help="W&B entity (team or user)")


def _add_parallel_flags(train: argparse.ArgumentParser) -> None:
    parallel = train.add_argument_group(
        "devices and hosts",
        "Data parallelism: each minibatch is split over the devices, the gradients averaged; the envs are split "
        "over the processes, each stepping its own share with the run's env backend. The run computes what one "
        "device computes, up to the "
        "order of floating-point sums (see README). Process 0 writes the run directory; every process reads "
        "--resume's.",
    )
    parallel.add_argument(
        "--devices", type=_int_in(1, 2**16), default=None, metavar="K",
        help="devices of this process to train on (default: 1; with several processes, all of them)",
    )  # fmt: skip
    parallel.add_argument(
        "--distributed", action="store_true",
        help="join a multi-process run through jax.distributed.initialize(), which reads Slurm's (and other "
        "cluster managers') environment; the three flags below give the peers explicitly instead",
    )  # fmt: skip
    parallel.add_argument("--coordinator-address", default=None, metavar="HOST:PORT", help="process 0's address")
    parallel.add_argument("--num-processes", type=_int_in(1, 2**16), default=None, metavar="P", help="processes")
    parallel.add_argument(
        "--process-id", type=_int_in(0, 2**16), default=None, metavar="I", help="this process, 0 .. P-1"
    )


def _add_eval_command(commands: Any) -> None:
    evaluate = commands.add_parser(
        "eval",
        help="play whole games with a trained agent",
        description="Play episodes with a checkpoint's policy on envs of their own and report the game score "
        "(raw, unclipped, summed over all lives until game over or truncation). Writes eval.json in the run "
        "directory.",
    )
    evaluate.add_argument("path", type=_path, help="a run directory (its newest checkpoint) or a checkpoint file")
    evaluate.add_argument("--episodes", type=_int_in(1, 10**6), default=10, help="episodes to play (default: 10)")
    evaluate.add_argument("--greedy", action="store_true", help="take the most probable action, not a sample")
    evaluate.add_argument(
        "--seed", type=_int_in(0, INT32_MAX), default=1, help="seed of the evaluation envs and actions (default: 1)"
    )
    evaluate.add_argument("--video", type=_path, default=None, help="write the first episode as .mp4 or .gif")
    evaluate.add_argument(
        "--env-backend", choices=FIELD_CHOICES["env_backend"], default=None,
        help="play on this env backend (default: the one the agent was trained on)",
    )  # fmt: skip
    evaluate.add_argument(
        "--output", type=_path, default=None, help="where to write the results (default: RUN_DIR/eval.json)"
    )


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="ppo-eqx", description="CleanRL's PPO in JAX and Equinox: Atari, MinAtar, MuJoCo, your envs.")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    train = commands.add_parser(
        "train",
        help="train an agent",
        description="Train PPO with CleanRL's defaults. Atari games use CleanRL's ppo_atari_envpool_xla_jax "
        "settings; vector-observation tasks (CartPole-v1, ...) its ppo.py settings; MinAtar grids gymnax-blines'; "
        "continuous tasks (HalfCheetah-v4, Pendulum-v1, ...) its ppo_continuous_action.py settings. Explicit flags "
        "win over all.",
    )
    add_config_flags(train)
    _add_run_flags(train)
    _add_parallel_flags(train)
    _add_eval_command(commands)
    commands.add_parser(
        "build-kernel",
        help="build ppo_eqx's CPU kernel for this machine, once (--conv-impl auto takes it where it is built)",
        description="Compile ppo_eqx's C++ convolutions for this CPU (AVX2 with FMA, or AVX-512) with the machine's "
        "C++ compiler ($CXX, g++ or c++) into $PPO_EQX_CACHE (default ~/.cache/ppo_eqx): about 20 s. Training on the "
        "CPU with --conv-impl auto then takes them; without, it takes XLA's matrix products (the same numbers, "
        "slower). $PPO_EQX_KERNEL_ISA=avx2 builds for any AVX2 CPU.",
    )
    return parser


def _refuse_early(args: argparse.Namespace) -> None:
    """What of the run directory can be refused at once, before jax is imported (a fraction of a second, where
    planning takes seconds): one that another process trains in (the lock itself is taken later, by
    ``train_command``), a damaged manifest, and files named like a run's that no run of ppo-eqx's wrote there.
    ``train_command`` checks all of it again, with the agents' directories, once the plan is made. The processes
    of a multi-process run share their directory: theirs is process 0's to check."""
    if args.distributed or args.coordinator_address:
        return
    for path in (args.resume, args.run_dir):
        if path is not None:
            refuse_if_held(path)
    if args.resume is not None and args.resume.is_dir():
        read_manifest(args.resume)
    elif args.run_dir is not None and args.run_dir.is_dir():
        refuse_strangers(args.run_dir, args.run_dir)
        read_manifest(args.run_dir)


def _refuse_early_output(args: argparse.Namespace) -> None:
    """``eval``'s ``--output`` and ``--video`` checked before jax is imported, where the run they play is plain
    from the path (a run or agent directory, or a checkpoint's file in ``RUN/checkpoints/``)."""
    path: Path = args.path
    run_dir = path if path.is_dir() else path.parent.parent if path.parent.name == CHECKPOINT_DIR else None
    if run_dir is None:
        return
    for flag_name, target in (("--output", args.output), ("--video", args.video)):
        if target is not None:
            check_output(flag_name, target, run_dir)


def main(argv: Sequence[str] | None = None) -> int:
    probe, saved_flags = None, None
    try:
        args = build_parser().parse_args(argv)
        if args.command == "train":
            _refuse_early(args)
        elif args.command == "eval":
            _refuse_early_output(args)
        STARTUP.lap("flags")
        probe = XlaFlagsProbe()  # while the command imports jax
        import_jax()  # checks what jax reads at import; makes no backend yet
        STARTUP.lap("imports")
        with _quiet_callback_log():
            saved_flags = schedule_small_programs(args)  # after the probe: it adds a flag XLA is known to take
            return _command(args, probe)
    except (UsageError, ConfigError, RunDirError) as error:
        _error(error)
        return 2
    except FloatingPointError as error:
        _error(f"{error}; stopping")
        return 1
    except RunError as error:
        _error(error)
        return 1
    except OSError as error:
        where = f"{error.filename}: " if error.filename else ""
        _error(f"{where}{error.strerror or error}")
        return 1
    finally:
        if probe is not None:
            probe.close()
        restore_xla_flags(saved_flags)


def _command(args: argparse.Namespace, probe: XlaFlagsProbe) -> int:
    """The command ``args`` name, run. Past the flags nothing of ppo-eqx's raises ``SystemExit`` or
    ``KeyboardInterrupt`` (signals are recorded, never raised, until a run's second Ctrl-C, which the run handles):
    one that escapes was raised by code of the user's (a module, an env, a loss), and is a line, not its status."""
    try:
        return _run(args, probe)
    except (SystemExit, KeyboardInterrupt) as error:
        from ..host.named import user_error

        raise UsageError(str(user_error("code of yours", error))) from None


def _run(args: argparse.Namespace, probe: XlaFlagsProbe) -> int:
    if args.command == "train":
        from .train_command import train_command

        return train_command(args, probe)
    if args.command == "build-kernel":
        return build_kernel_command()
    from .eval_command import eval_command

    return eval_command(args, probe)


@contextlib.contextmanager
def _quiet_callback_log() -> Iterator[None]:
    """jax logs a failing host callback's traceback as it happens (``jax._src.callback``); the run says it in one
    line once the error reaches it (``callback_fault``)."""
    logger = logging.getLogger("jax._src.callback")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


def build_kernel_command() -> int:
    """``ppo-eqx build-kernel``: build (again) and load the CPU kernel; RunError (exit 1) naming why it cannot."""
    from ..host import kernel_build

    try:
        path = kernel_build.build_now()
        built = kernel_build.load()
    except kernel_build.KernelUnavailable as error:
        raise RunError(f"cannot build ppo_eqx's CPU kernel: {error}") from None
    print(f"ppo-eqx: built the CPU kernel for {built.isa} into {path}", flush=True)
    return 0


MAX_WORD = 200
"""Characters of one word that an error line shows: a 5000-character value given on the command line is cut."""


def _error(message: object) -> None:
    """``message`` as one ``ppo-eqx: error:`` line on stderr, each word longer than ``MAX_WORD`` cut short."""
    words = (word if len(word) <= MAX_WORD else f"{word[: MAX_WORD - 3]}..." for word in str(message).split())
    print("ppo-eqx: error:", *words, file=sys.stderr)
