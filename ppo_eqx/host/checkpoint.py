"""Checkpoints in ``RUN_DIR/checkpoints``: ``iter_NNNNNN.eqx`` (the arrays) beside ``iter_NNNNNN.json``.

The ``.eqx`` file is ``eqx.tree_serialise_leaves`` of a ``Checkpoint`` (model, optimizer state, key,
episode statistics, iteration); the ``.json`` file holds the config, the iteration, and the size and SHA-256
of the ``.eqx`` file. Each is written to a temporary file, fsynced and renamed over its name, the ``.eqx``
first: a checkpoint exists once its ``.json`` does, and a kill at any moment leaves the previous ones whole.
Loading checks the size and hash before it reads an array, and the shapes and dtypes against a "like" tree
built from the config.
"""

import hashlib
import io
import json
import re
from pathlib import Path
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Int, Key, PRNGKeyArray, PyTree, UInt32

from ..config import ConvImpl, PPOConfig
from ..core._types import EpisodeStats
from ..core.envs import EnvSpec
from ..core.networks import ActorCritic
from ..core.rollout import init_episode_stats
from ..core.update import Hyperparameters, agent_hyperparameters, make_optimizer
from ..errors import CheckpointError, ConfigError
from .rundir import CHECKPOINT_DIR, CONFIG, json_bytes, write_atomic

FORMAT_VERSION = 1
_NAME = re.compile(r"iter_(\d{6,})\.json")

AgentKeys = Key[Array, "*S"] | UInt32[Array, "*S 2"]
"""A PRNG key, or with ``num_agents`` A > 1 one per agent."""


class Checkpoint(eqx.Module):
    """What a checkpoint holds: the training state less the envs (a backend's env state cannot be saved).

    ``stats`` keeps the last finished episode of every env; its running episodes are dropped on restore, as
    the envs are made afresh. With ``num_agents`` A > 1 every field but ``iteration`` has a leading ``A`` axis.
    """

    model: ActorCritic
    opt_state: PyTree
    key: AgentKeys
    stats: EpisodeStats
    iteration: Int[Array, ""]


def init_checkpoint(config: PPOConfig, spec: EnvSpec) -> Checkpoint:
    """A fresh run's model, optimizer state, key and episode statistics, at iteration 0; under
    ``eqx.filter_eval_shape`` the "like" tree that a checkpoint loads into.

    With ``num_agents`` A > 1 each is stacked over a leading ``A`` axis (``eqx.filter_vmap`` over the agents),
    agent k initialised as the single run of ``config.agent_configs()[k]``.
    """
    conv_impl: ConvImpl = config.conv_impl  # type: ignore[assignment]  # validated by PPOConfig

    def init(
        seed: int | Int[Array, ""], hyperparameters: Hyperparameters
    ) -> tuple[ActorCritic, PyTree, PRNGKeyArray, EpisodeStats]:
        key, model_key = jax.random.split(jax.random.PRNGKey(seed))
        model = ActorCritic(spec.obs_shape, spec.num_actions, conv_impl=conv_impl, key=model_key)
        optimizer = make_optimizer(config.replace(**hyperparameters) if hyperparameters else config)
        opt_state = optimizer.init(eqx.filter(model, eqx.is_array))
        return model, opt_state, key, init_episode_stats(config.num_envs)

    if config.num_agents == 1:
        agents = init(config.seed, {})
    else:
        seeds = jnp.asarray([agent.seed for agent in config.agent_configs()])
        agents = eqx.filter_vmap(init)(seeds, agent_hyperparameters(config))
    model, opt_state, key, stats = agents
    return Checkpoint(model, opt_state, key, stats, jnp.zeros((), jnp.int32))


@eqx.filter_jit
def all_finite(tree: PyTree) -> Bool[Array, ""]:
    """True when every floating-point leaf of ``tree`` is finite (no NaN, no inf)."""
    leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.inexact)]
    return jnp.all(jnp.stack(leaves)) if leaves else jnp.asarray(True)


def checkpoint_name(iteration: int) -> str:
    return f"iter_{iteration:06d}"


def list_checkpoints(run_dir: Path) -> list[Path]:
    """The ``.json`` files of the checkpoints in ``run_dir``, oldest iteration first."""
    directory = run_dir / CHECKPOINT_DIR
    if not directory.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in directory.iterdir() if (m := _NAME.fullmatch(p.name))]
    return [path for _, path in sorted(found)]


def _serialise(checkpoint: Checkpoint) -> bytes:
    buffer = io.BytesIO()
    eqx.tree_serialise_leaves(buffer, checkpoint)
    return buffer.getvalue()


def save_checkpoint(
    run_dir: Path,
    checkpoint: Checkpoint,
    config: PPOConfig,
    spec: EnvSpec,
    *,
    keep: int,
    extra: dict[str, Any] | None = None,
) -> Path:
    """Write ``checkpoint`` as ``run_dir/checkpoints/iter_NNNNNN.{eqx,json}``, then delete all but the ``keep``
    newest. Returns the ``.json`` path. Refuses (FloatingPointError) a model or optimizer state with NaN or inf.
    """
    if not bool(all_finite((checkpoint.model, checkpoint.opt_state))):
        raise FloatingPointError(f"refusing to checkpoint non-finite parameters at iteration {checkpoint.iteration}")
    iteration = int(checkpoint.iteration)
    directory = run_dir / CHECKPOINT_DIR
    directory.mkdir(parents=True, exist_ok=True)
    data = _serialise(checkpoint)
    name = checkpoint_name(iteration)
    metadata = {
        "format_version": FORMAT_VERSION,
        "iteration": iteration,
        "global_step": iteration * config.batch_size,
        "at_segment_boundary": iteration % config.checkpoint_every == 0,
        "config": config.to_dict(),
        "obs_shape": list(spec.obs_shape),
        "num_actions": spec.num_actions,
        "arrays": f"{name}.eqx",
        "arrays_bytes": len(data),
        "arrays_sha256": hashlib.sha256(data).hexdigest(),
        "jax_version": jax.__version__,
        "equinox_version": eqx.__version__,
        **(extra or {}),
    }
    write_atomic(directory / f"{name}.eqx", data)
    path = directory / f"{name}.json"
    write_atomic(path, json_bytes(metadata))
    _prune(run_dir, keep)
    return path


def _prune(run_dir: Path, keep: int) -> None:
    """Delete all but the ``keep`` newest checkpoints (the ``.json`` first: no half-deleted checkpoint is left
    that looks whole), and ``.eqx`` files whose ``.json`` was never written."""
    checkpoints = list_checkpoints(run_dir)
    for path in checkpoints[: max(len(checkpoints) - keep, 0)]:
        path.unlink(missing_ok=True)
        path.with_suffix(".eqx").unlink(missing_ok=True)
    directory = run_dir / CHECKPOINT_DIR
    for arrays in directory.glob("iter_*.eqx"):
        if not arrays.with_suffix(".json").exists():
            arrays.unlink(missing_ok=True)


def resolve_checkpoint(path: Path) -> Path:
    """The ``.json`` of a checkpoint given as a run directory (its newest), a ``.json`` or an ``.eqx`` path."""
    if path.is_dir():
        if (path / CHECKPOINT_DIR).is_dir() or (path / CONFIG).exists():
            checkpoints = list_checkpoints(path)
            if not checkpoints:
                raise CheckpointError(f"{path} holds no checkpoint (no {CHECKPOINT_DIR}/iter_*.json)")
            return checkpoints[-1]
        raise CheckpointError(f"{path} is neither a run directory nor a checkpoint")
    if path.suffix == ".eqx":
        path = path.with_suffix(".json")
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist")
    return path


def read_metadata(path: Path) -> dict[str, Any]:
    """The ``.json`` of a checkpoint, checked for the fields that loading needs."""
    try:
        metadata = json.loads(path.read_text())
    except OSError as error:
        raise CheckpointError(f"cannot read checkpoint {path}: {error.strerror}") from None
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise CheckpointError(f"checkpoint {path} is damaged: its metadata is not JSON") from None
    required = ("format_version", "iteration", "config", "arrays", "arrays_bytes", "arrays_sha256")
    if not isinstance(metadata, dict) or any(name not in metadata for name in required):
        raise CheckpointError(f"checkpoint {path} is damaged: its metadata lacks {', '.join(required)}")
    if metadata["format_version"] != FORMAT_VERSION:
        raise CheckpointError(
            f"checkpoint {path} has format version {metadata['format_version']!r}; this ppo_eqx reads {FORMAT_VERSION}"
        )
    return metadata


def config_of(path: Path, metadata: dict[str, Any]) -> PPOConfig:
    """The config that a checkpoint's run was trained with."""
    try:
        return PPOConfig.from_dict(metadata["config"])
    except (ConfigError, TypeError) as error:
        raise CheckpointError(f"checkpoint {path} holds an invalid config: {error}") from None


def check_same_run(path: Path, metadata: dict[str, Any], config: PPOConfig) -> None:
    """Raise CheckpointError unless the checkpoint was written by a run with ``config`` (a field that an older
    checkpoint does not name has its default)."""
    saved = {**PPOConfig().to_dict(), **metadata["config"]}
    differing = [name for name, value in config.to_dict().items() if saved[name] != value]
    if differing:
        shown = ", ".join(f"{name}={saved[name]!r} (this run: {getattr(config, name)!r})" for name in differing)
        raise CheckpointError(f"checkpoint {path} belongs to another run: {shown}")


def read_arrays(path: Path, metadata: dict[str, Any]) -> bytes:
    """The bytes of a checkpoint's ``.eqx`` file, checked against the size and SHA-256 in its metadata."""
    arrays = path.with_name(metadata["arrays"])
    try:
        data = arrays.read_bytes()
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint {path} is incomplete: {arrays.name} is missing") from None
    except OSError as error:
        raise CheckpointError(f"cannot read checkpoint {arrays}: {error.strerror}") from None
    if len(data) != metadata["arrays_bytes"]:
        raise CheckpointError(
            f"checkpoint {arrays} is truncated or damaged: {len(data)} bytes, {metadata['arrays_bytes']} written"
        )
    if hashlib.sha256(data).hexdigest() != metadata["arrays_sha256"]:
        raise CheckpointError(f"checkpoint {arrays} is damaged: its SHA-256 differs from the one written")
    return data


def load_checkpoint(path: Path, metadata: dict[str, Any], config: PPOConfig, spec: EnvSpec) -> Checkpoint:
    """Read the arrays of the checkpoint ``path`` into a tree shaped by ``config`` and ``spec``.

    Raises CheckpointError when the ``.eqx`` file is missing, truncated or altered (size and SHA-256 against
    the metadata), or holds arrays of other shapes or dtypes (another architecture or env).
    """
    data = read_arrays(path, metadata)
    arrays = path.with_name(metadata["arrays"])
    if list(spec.obs_shape) != list(metadata.get("obs_shape", spec.obs_shape)) or spec.num_actions != metadata.get(
        "num_actions", spec.num_actions
    ):
        raise CheckpointError(
            f"checkpoint {path} is for observations {tuple(metadata['obs_shape'])} and {metadata['num_actions']} "
            f"actions; {spec.env_id} has {spec.obs_shape} and {spec.num_actions}"
        )
    like = eqx.filter_eval_shape(init_checkpoint, config, spec)
    try:
        checkpoint = eqx.tree_deserialise_leaves(io.BytesIO(data), like)
    except Exception as error:  # equinox reports a shape, dtype or type mismatch as a RuntimeError with a path
        cause = error.__cause__ or error
        message = str(cause).splitlines()[0] if str(cause) else type(cause).__name__
        raise CheckpointError(f"checkpoint {arrays} does not fit this model ({config.env_id}): {message}") from None
    if int(checkpoint.iteration) != metadata["iteration"]:
        raise CheckpointError(f"checkpoint {path} is damaged: its arrays are of another iteration")
    return checkpoint
