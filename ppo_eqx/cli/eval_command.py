"""What ``ppo-eqx eval`` does: check the backend, read the checkpoint (the newest, whole, even while training
prunes it) and both output paths, then play, then write the results. eval takes no lock: it only reads the run."""

import argparse
import math
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, TypeVar

import equinox as eqx
import jax

from ..config import PPOConfig
from ..core.envs import EnvSpec
from ..core.envs.normalize import NormalizedHandle
from ..core.networks import ConvRoute, Policy
from ..errors import RunError, UsageError
from ..host.checkpoint import CheckpointFile, config_of, load_checkpoint, read_checkpoint
from ..host.evaluate import VIDEO_FORMATS, Evaluation, VideoWriter, eval_key, evaluate, normalization_of, summarise
from ..host.kernel_build import kernel_unavailable_reason, resolve_conv_impl_for
from ..host.named import backend_named
from ..host.run_dir import CHECKPOINT_DIR, EVAL, SEEDS_CONFIG, check_output, is_eval_result, write_json
from .checks import require
from .environment import XlaFlagsProbe, check_backend, check_jax_settings
from .interrupts import EARLY

_Tree = TypeVar("_Tree")


def eval_command(args: argparse.Namespace, probe: XlaFlagsProbe | None = None) -> int:
    """Check the backend, the checkpoint and both output paths, then play, then write ``eval.json`` (or
    ``--output``)."""
    probe = probe or XlaFlagsProbe()
    probe.check()
    check_jax_settings()
    check_backend(probe)
    agent = _agent_of(args.path)
    # Read whole at once: a run in training prunes its older checkpoints (read_checkpoint takes the next newest).
    checkpoint = read_checkpoint(args.path if agent is None else agent[0])
    path, metadata = checkpoint.path, checkpoint.metadata
    run_dir = path.parent.parent if agent is None else args.path
    output = args.output or run_dir / EVAL
    check_output("--output", output, run_dir)
    if args.output is None and output.exists() and not is_eval_result(output):
        raise UsageError(f"{output} is not a result of ppo-eqx eval, and eval keeps it; pass --output for another file")
    if args.video is not None:
        _check_video(args.video, run_dir, output)
    model, config, spec, statistics = _load_agent(checkpoint, args.env_backend, None if agent is None else agent[1])
    if args.video is not None and spec.continuous and backend_named(config.env_backend).name == "envpool":
        _check_renders(args.video, config.env_id)
    print(
        f"ppo-eqx: evaluating {path} ({config.env_id}, iteration {metadata['iteration']}) on {args.episodes} "
        f"episodes, {'greedy' if args.greedy else 'sampled'} actions",
        flush=True,
    )
    evaluation, video_error = _play(args, model, config, statistics, fps=15 if spec.kind == "frames" else 50)
    _write_result(output, _result(args, path, agent, config, metadata, evaluation, video_error))
    if video_error:
        raise RunError(f"{video_error}; the evaluation's results are in {output}")
    return 0


def _result(
    args: argparse.Namespace,
    path: Path,
    agent: tuple[Path, str] | None,
    config: PPOConfig,
    metadata: dict[str, Any],
    evaluation: Evaluation,
    video_error: str | None,
) -> dict[str, Any]:
    """``eval.json``'s object: what was played, by which checkpoint, and the returns with their summary."""
    return {
        "checkpoint": str(path),
        "agent": None if agent is None else agent[1],
        "env_id": config.env_id,
        "iteration": metadata["iteration"],
        "global_step": metadata.get("global_step"),
        "episodes": args.episodes,
        "greedy": args.greedy,
        "seed": args.seed,
        **summarise(evaluation),
        # JSON has no NaN or inf: such a return is written null (summary's non_finite_returns counts them)
        "returns": [r if math.isfinite(r) else None for r in evaluation.returns],
        "lengths": evaluation.lengths,
        "video": None if args.video is None or video_error else str(args.video),
    }


def _write_result(output: Path, result: dict[str, Any]) -> None:
    """Write ``result`` to ``output`` whole (a Ctrl-C waits for it) and say what it holds in one line."""
    EARLY.defer()  # eval.json is written whole or not at all; a Ctrl-C now waits for it
    try:
        write_json(output, result)
    except OSError as error:
        raise RunError(f"could not write {output}: {error.strerror or error}") from None
    shown = "no finite return"
    if result["mean_return"] is not None:
        shown = (
            f"return {result['mean_return']:.2f} +- {result['std_return']:.2f} "
            f"(min {result['min_return']:.2f}, max {result['max_return']:.2f})"
        )
    odd = result["non_finite_returns"]
    note = f" ({odd} not finite, written as null)" if odd else ""
    print(f"ppo-eqx: {shown} over {result['episodes']} episodes{note}; written to {output}", flush=True)


def _load_agent(
    checkpoint: CheckpointFile, env_backend: str | None, agent: str | None
) -> tuple[Policy, PPOConfig, EnvSpec, NormalizedHandle | None]:
    """The model, config and env spec of the agent to play: the checkpoint's one agent, or of a run of several
    (``--num-seeds``, ``--sweep``) the agent named ``agent``; on ``env_backend`` if given, with this machine's
    route for the convolutions; and the statistics its observations were normalised by (None: they were not)."""
    path, config = checkpoint.path, config_of(checkpoint)
    names = config.agent_names()
    if config.num_agents > 1 and agent not in names:
        raise UsageError(
            f"{path} holds the {config.num_agents} agents of a --num-seeds or --sweep run; eval takes one agent's "
            f"directory ({path.parent.parent / names[0]}, ...)"
        )
    spec = backend_named(config.env_backend).spec(config.env_id)
    loaded = load_checkpoint(checkpoint, config, spec, conv_impl=_route(config, spec))
    model, statistics = loaded.model, normalization_of(loaded)
    if config.num_agents > 1:
        index = names.index(agent)  # pyright: ignore[reportArgumentType]  # in names, so not None
        model, config = _agent_model(model, index), config.agent_configs()[index]
        statistics = None if statistics is None else _agent_model(statistics, index)
    if env_backend is not None and env_backend != config.env_backend:  # the model plays on another backend's envs
        config = config.replace(env_backend=env_backend)
        played = backend_named(env_backend).spec(config.env_id)
        if (played.obs_shape, played.num_actions) != (spec.obs_shape, spec.num_actions):
            raise UsageError(
                f"--env-backend {env_backend}: {config.env_id} has observations {played.obs_shape} and "
                f"{played.num_actions} actions there; the agent was trained on {spec.obs_shape} and {spec.num_actions}"
            )
    return model, config, spec, statistics


def _route(config: PPOConfig, spec: EnvSpec) -> ConvRoute:
    """The route eval's model takes: the one training asked for where it runs here, else "auto"'s (every route
    gives the same numbers within float32 rounding)."""
    kernel_runs = config.conv_impl != "kernel" or kernel_unavailable_reason() is None
    return resolve_conv_impl_for(config.conv_impl if kernel_runs else "auto", spec)  # type: ignore[arg-type]


def _agent_of(path: Path) -> tuple[Path, str] | None:
    """The run of several agents (``--num-seeds``, ``--sweep``) whose agent's directory ``path`` is, and the
    agent's name in it (``seed2``, ``learning-rate=0.001/seed1``); None when ``path`` is not such a directory."""
    if not path.is_dir() or (path / CHECKPOINT_DIR).is_dir():
        return None
    for parent in path.absolute().parents[:2]:
        if (parent / SEEDS_CONFIG).is_file():
            return parent, path.absolute().relative_to(parent).as_posix()
    return None


def _agent_model(model: _Tree, index: int) -> _Tree:
    """Agent ``index``'s model (or env statistics) out of the agents' stacked ones."""
    return jax.tree.map(lambda x: x[index] if eqx.is_array(x) else x, model)


def _check_video(video: Path, run_dir: Path, output: Path) -> None:
    suffix = video.suffix.lower()
    if suffix not in VIDEO_FORMATS:
        raise UsageError(f"--video {video}: the name must end in {' or '.join(VIDEO_FORMATS)}")
    check_output("--video", video, run_dir)
    if video.resolve() == output.resolve():
        raise UsageError(f"--video {video} is also the --output; allowed: two different files")
    module, package = VIDEO_FORMATS[suffix]
    require(module, f"--video {video} needs {package}")


def _check_renders(video: Path, env_id: str) -> None:
    """EnvPool's MuJoCo tasks render through OpenGL; where this machine has none, MuJoCo ends the process at the
    first frame (its own "ERROR: an OpenGL platform library ..." and exit 1): so one frame is tried in a child."""
    code = f"from ppo_eqx.core.envs import backend; backend('envpool').make({env_id!r}, [0], render=True).render(0)"
    try:
        with tempfile.TemporaryDirectory() as scratch:  # where MuJoCo leaves its MUJOCO_LOG.TXT
            child = subprocess.run(
                [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=scratch
            )
    except subprocess.TimeoutExpired:
        said = "no frame in 300 s"
    else:
        if child.returncode == 0:
            return
        lines = [line.strip() for line in (child.stdout + child.stderr).splitlines() if line.strip()]
        said = next((line for line in lines if "ERROR" in line), lines[-1] if lines else f"exit {child.returncode}")
    raise UsageError(
        f"--video {video}: EnvPool cannot render {env_id} on this machine ({said[:200]}); allowed: eval without "
        "--video, or a machine where MuJoCo has OpenGL"
    )


def _play(
    args: argparse.Namespace,
    model: Policy,
    config: PPOConfig,
    statistics: NormalizedHandle | None,
    *,
    fps: int,
) -> tuple[Evaluation, str | None]:
    """The evaluation, and why its video could not be written (None: it was, or none was asked for): a video
    that fails at its end costs the evaluation nothing."""
    key = eval_key(args.seed)
    writer = None
    if args.video is not None:
        try:
            writer = VideoWriter(args.video, fps)
        except OSError as error:
            raise UsageError(f"--video {args.video}: {error.strerror or error}") from None
    try:
        evaluation = evaluate(
            model,
            config,
            episodes=args.episodes,
            greedy=args.greedy,
            on_frame=None if writer is None else writer.append,
            statistics=statistics,
            seed=args.seed,
            key=key,
        )
    finally:
        video_error = _close(writer)
    return evaluation, video_error


def _close(writer: VideoWriter | None) -> str | None:
    """Close ``writer`` (a ``.gif`` is written only now); why it could not be, else None."""
    if writer is None:
        return None
    try:
        writer.close()
    except OSError as error:
        return f"could not write the video {error.filename or writer.path}: {error.strerror or error}"
    return None
