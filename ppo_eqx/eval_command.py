"""What ``ppo-eqx eval`` does: check the checkpoint and both output paths, then play, then write the results."""

import argparse
from pathlib import Path
from typing import Any

from .cli import RunError, UsageError
from .config import PPOConfig
from .rundir import EVAL, check_output, write_json
from .session import require

VIDEO_PACKAGES = {".mp4": ("av", "PyAV: pip install av"), ".gif": ("PIL", "Pillow: pip install pillow")}


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
    if args.env_backend is not None:
        config = config.replace(env_backend=args.env_backend)
    if config.num_seeds > 1:
        raise UsageError(f"{path} holds the {config.num_seeds} agents of a --num-seeds run; eval takes one agent's")
    spec = backend(config.env_backend).spec(config.env_id)
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
