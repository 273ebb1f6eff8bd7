"""Checkpoints in ``RUN_DIR/checkpoints``: ``iter_NNNNNN.eqx`` (the arrays) beside ``iter_NNNNNN.json``.

The ``.eqx`` file is ``eqx.tree_serialise_leaves`` of a ``Checkpoint`` (model, optimizer state, key, what the
collector keeps of the envs, iteration); the ``.json`` file holds the config, the iteration, and the size and
SHA-256 of the ``.eqx`` file. Each is written to a temporary file, fsynced and renamed over its name, the ``.eqx``
first: a checkpoint exists once its ``.json`` does, and a kill at any moment leaves the previous ones whole.
Reading (``read_checkpoint``) reads both files once and checks the size and hash before an array is used;
loading (``load_checkpoint``) checks the shapes and dtypes against a "like" tree built from the config, with
the convolutions' route given (loading never chooses one: ``host.kernel_build.resolve_conv_impl``).
"""

import hashlib
import io
import json
import math
import os
import re
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import equinox as eqx
import jax
import numpy as np

from ..config import INT32_MAX, PPOConfig
from ..core.envs import EnvSpec
from ..core.envs.normalize import NormalizedHandle
from ..core.networks import ConvRoute
from ..core.state import Checkpoint, ModelFactory
from ..core.update import OptimizerFactory
from ..errors import CheckpointError, ConfigError, RunDirError, show_value
from .fresh import init_checkpoint
from .named import network_named, optimizer_named
from .run_dir import CHECKPOINT_DIR, CONFIG, RunDirectory, RunLock, json_bytes

FORMAT_VERSION = 1
_NAME = re.compile(r"iter_(\d{6,})\.json")


class CheckpointFile(NamedTuple):
    """A checkpoint read from its files once: the ``.json``'s path and metadata, and the arrays' bytes, checked
    against the size and SHA-256 that the metadata holds."""

    path: Path
    metadata: dict[str, Any]
    arrays: bytes


def read_bounded(path: Path, limit: int, error: type[Exception], name: str) -> bytes:
    """The bytes of the file ``path`` as untrusted input: at most ``limit`` of them plus one (so that a longer file
    shows as longer: the caller compares), never through a link at its end or from a FIFO; ``error`` naming
    ``name`` for anything else than a missing file (FileNotFoundError)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        raise
    except OSError as problem:
        raise error(f"cannot read {name}: {problem.strerror}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise error(f"cannot read {name}: it is not a regular file")
        chunks, left = [], limit + 1
        while left and (chunk := os.read(fd, min(left, 2**24))):
            chunks.append(chunk)
            left -= len(chunk)
    except OSError as problem:
        raise error(f"cannot read {name}: {problem.strerror}") from None
    finally:
        os.close(fd)
    return b"".join(chunks)


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
    run_dir: "Path | RunDirectory",
    checkpoint: Checkpoint,
    config: PPOConfig,
    spec: EnvSpec,
    *,
    keep: int,
    extra: dict[str, Any] | None = None,
) -> Path:
    """Write ``checkpoint`` as ``run_dir/checkpoints/iter_NNNNNN.{eqx,json}``, listed in the directory's manifest
    first, then delete all but the ``keep`` newest of the checkpoints of this run (``config``'s) that the manifest
    lists (one of another run, or one it does not list, a user's own, is never deleted). Returns the ``.json`` path.
    Refuses (FloatingPointError) a model or optimizer state with NaN or inf. ``run_dir`` is a path (the library's:
    made if missing, and locked for the write as ``ppo-eqx train`` locks it: RunDirError naming the process that
    holds it) or a run's ``RunDirectory`` (whose owner holds its lock).
    """
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
        raise ValueError(
            f"keep={keep!r}; allowed: an integer >= 1 (the newest checkpoints to keep, this one among them)"
        )
    _check_fits(checkpoint, config, spec)
    if not finite_here((checkpoint.model, checkpoint.opt_state)):
        raise FloatingPointError(f"refusing to checkpoint non-finite parameters at iteration {checkpoint.iteration}")
    if isinstance(run_dir, RunDirectory):
        return _save_into(run_dir, checkpoint, config, spec, keep=keep, extra=extra)
    path = Path(run_dir)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise RunDirError(f"{path} is not a directory ppo-eqx can write: {error.strerror}") from None
    lock = RunLock.take(path, "ppo_eqx.save_checkpoint")
    try:
        with RunDirectory(path, lock.directory_fd()) as directory:
            return _save_into(directory, checkpoint, config, spec, keep=keep, extra=extra)
    finally:
        lock.release()


def _save_into(
    directory: RunDirectory,
    checkpoint: Checkpoint,
    config: PPOConfig,
    spec: EnvSpec,
    *,
    keep: int,
    extra: dict[str, Any] | None,
) -> Path:
    """``save_checkpoint`` through ``directory``, whose owner holds its lock."""
    iteration = int(checkpoint.iteration)
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
        "model": model_signature(checkpoint.model),
        "arrays": f"{name}.eqx",
        "arrays_bytes": len(data),
        "arrays_sha256": hashlib.sha256(data).hexdigest(),
        "jax_version": jax.__version__,
        "equinox_version": eqx.__version__,
        **(extra or {}),
    }
    directory.make_dir(CHECKPOINT_DIR)
    directory.write(f"{CHECKPOINT_DIR}/{name}.eqx", data)
    directory.write(f"{CHECKPOINT_DIR}/{name}.json", json_bytes(metadata))
    _prune(directory, keep, iteration, config)
    return directory.path / CHECKPOINT_DIR / f"{name}.json"


def model_signature(model: Any) -> dict[str, Any]:
    """What a checkpoint says of its model, to refuse it to another: its class, how many arrays it holds, and the
    SHA-256 of their paths, shapes and dtypes (not of their values; the convolutions' route is no part of it)."""
    arrays = eqx.filter(model, lambda x: eqx.is_array(x) or isinstance(x, jax.ShapeDtypeStruct))  # or their shapes
    leaves = jax.tree_util.tree_flatten_with_path(arrays)[0]
    described = [f"{jax.tree_util.keystr(path)}:{tuple(x.shape)}:{x.dtype}" for path, x in leaves]
    digest = hashlib.sha256("\n".join(described).encode()).hexdigest()
    return {"class": type(model).__name__, "leaves": len(described), "sha256": digest}


def _check_fits(checkpoint: Checkpoint, config: PPOConfig, spec: EnvSpec) -> None:
    """ValueError unless ``checkpoint``'s model takes ``spec``'s observations and actions, for each of
    ``config``'s agents (``load_checkpoint`` checks every array later): its metadata would describe another run."""
    model = checkpoint.model
    first = jax.tree.leaves(eqx.filter(model, eqx.is_array))[0]  # stacked [S, ...] for S agents
    held = first.shape[0] if config.num_agents > 1 and first.ndim else 1
    if (tuple(model.obs_shape), model.num_actions, held) != (
        tuple(spec.obs_shape),
        spec.num_actions,
        config.num_agents,
    ):
        raise ValueError(
            f"the checkpoint's model does not fit {spec.env_id} (observations {spec.obs_shape}, {spec.num_actions} "
            f"actions) and config's {config.num_agents} agent(s) (env_id={config.env_id!r}); allowed: a checkpoint "
            "of this config's run"
        )


def _prune(directory: RunDirectory, keep: int, written: int, config: PPOConfig) -> None:
    """Delete all but the ``keep`` newest of the checkpoints that ``directory``'s manifest lists and that are of the
    run of ``config`` (the ``.json`` first: no half-deleted checkpoint is left that looks whole), never the one just
    ``written``; and listed ``.eqx`` files whose ``.json`` is gone. A checkpoint of another run (another config: a
    finished run a library saves beside) is not this run's to prune."""
    names = directory.names(CHECKPOINT_DIR)
    listed = sorted(
        int(m.group(1))
        for name in names
        if (m := _NAME.fullmatch(name))
        and directory.listed("file", f"{CHECKPOINT_DIR}/{name}")
        and _config_of(directory, f"{CHECKPOINT_DIR}/{name}") == config
    )
    others = [i for i in listed if i != written]
    for iteration in others[: max(len(others) + 1 - keep, 0)]:
        for suffix in (".json", ".eqx"):
            directory.delete(f"{CHECKPOINT_DIR}/{checkpoint_name(iteration)}{suffix}")
    left = set(directory.names(CHECKPOINT_DIR))
    for name in left:
        if name.endswith(".eqx") and name.removesuffix(".eqx") + ".json" not in left:
            directory.delete(f"{CHECKPOINT_DIR}/{name}")


def _config_of(directory: RunDirectory, relative: str) -> PPOConfig | None:
    """The config a checkpoint's ``.json`` in ``directory`` holds (fields it lacks, an older version's, at their
    defaults); None where it cannot be read as one."""
    data = directory.read(relative)
    try:
        return PPOConfig.from_dict(json.loads(data or b"")["config"])
    except (ValueError, KeyError, TypeError, RunDirError):
        return None


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


MAX_METADATA_BYTES = 16 * 2**20
"""A checkpoint's ``.json`` larger than this is not one ppo-eqx wrote (a sweep of 4096 agents writes kilobytes)."""
MAX_ARRAYS_BYTES = 2**40
"""The largest ``.eqx`` a checkpoint's metadata may claim (1 TiB)."""
_SHA256 = re.compile(r"[0-9a-f]{64}")


def read_metadata(path: Path) -> dict[str, Any]:
    """The ``.json`` of a checkpoint, read as untrusted input (at most ``MAX_METADATA_BYTES``) and checked for the
    fields that loading needs: an iteration that a run can reach, arrays named for this very checkpoint (no path
    elsewhere), their size and hash of the forms ppo-eqx writes."""
    try:
        data = read_bounded(path, MAX_METADATA_BYTES, CheckpointError, f"checkpoint {path}")
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint {path} does not exist") from None
    if len(data) > MAX_METADATA_BYTES:
        raise CheckpointError(f"checkpoint {path} is damaged: its metadata is over {MAX_METADATA_BYTES} bytes")
    try:
        metadata = json.loads(data)
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise CheckpointError(f"checkpoint {path} is damaged: its metadata is not JSON") from None
    required = ("format_version", "iteration", "config", "arrays", "arrays_bytes", "arrays_sha256")
    if not isinstance(metadata, dict) or any(name not in metadata for name in required):
        raise CheckpointError(f"checkpoint {path} is damaged: its metadata lacks {', '.join(required)}")
    if metadata["format_version"] != FORMAT_VERSION:
        raise CheckpointError(
            f"checkpoint {path} has format version {show_value(metadata['format_version'])}; this ppo_eqx reads "
            f"{FORMAT_VERSION}"
        )
    problem = _metadata_problem(path, metadata)
    if problem is not None:
        raise CheckpointError(f"checkpoint {path} is damaged: {problem}")
    return metadata


def _metadata_problem(path: Path, metadata: dict[str, Any]) -> str | None:
    """What makes ``metadata`` other than what ppo-eqx writes for the checkpoint ``path``, or None."""
    iteration, arrays, size = metadata["iteration"], metadata["arrays"], metadata["arrays_bytes"]
    if isinstance(iteration, bool) or not isinstance(iteration, int) or not 0 <= iteration <= INT32_MAX:
        return f"its iteration is {show_value(iteration)}; allowed: an integer in 0 .. {INT32_MAX}"
    if arrays != path.with_suffix(".eqx").name:
        return f"its arrays are {show_value(arrays)}; allowed: {path.with_suffix('.eqx').name}, beside it"
    if isinstance(size, bool) or not isinstance(size, int) or not 0 <= size <= MAX_ARRAYS_BYTES:
        return f"its arrays_bytes is {show_value(size)}; allowed: an integer in 0 .. {MAX_ARRAYS_BYTES}"
    if not isinstance(metadata["arrays_sha256"], str) or not _SHA256.fullmatch(metadata["arrays_sha256"]):
        return f"its arrays_sha256 is {show_value(metadata['arrays_sha256'])}; allowed: 64 hexadecimal digits"
    if not isinstance(metadata["config"], dict):
        return f"its config is {show_value(metadata['config'])}; allowed: an object of config fields"
    return _optional_problem(metadata)


def _is_count(value: object, low: int = 0) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= 2**62


_OPTIONAL: dict[str, tuple[Callable[[object], bool], str]] = {
    "global_step": (_is_count, "an integer of 0 or more"),
    "time_elapsed": (
        lambda v: isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and v >= 0,
        "a finite number of seconds, 0 or more",
    ),
    "keep_checkpoints": (lambda v: v is None or _is_count(v, 1), "null or an integer of 1 or more"),
    "num_actions": (lambda v: _is_count(v, 1), "an integer of 1 or more"),
    "obs_shape": (
        lambda v: isinstance(v, list) and len(v) <= 4 and all(_is_count(n, 1) for n in v),
        "a list of at most 4 positive integers",
    ),
}
"""The metadata fields that a checkpoint may hold beside the required ones, what each must be, in words."""


def _optional_problem(metadata: dict[str, Any]) -> str | None:
    for name, (good, allowed) in _OPTIONAL.items():
        if name in metadata and not good(metadata[name]):
            return f"its {name} is {show_value(metadata[name])}; allowed: {allowed}"
    return None


def config_of(file: CheckpointFile) -> PPOConfig:
    """The config that a checkpoint's run was trained with."""
    try:
        return PPOConfig.from_dict(file.metadata["config"])
    except (ConfigError, TypeError) as error:
        raise CheckpointError(f"checkpoint {file.path} holds an invalid config: {error}") from None


def check_same_run(file: CheckpointFile, config: PPOConfig) -> None:
    """Raise CheckpointError unless the checkpoint was written by a run with ``config`` (a field that an older
    checkpoint does not name has its default)."""
    saved = {**PPOConfig().to_dict(), **file.metadata["config"]}
    differing = [name for name, value in config.to_dict().items() if saved[name] != value]
    if differing:
        shown = ", ".join(f"{name}={saved[name]!r} (this run: {getattr(config, name)!r})" for name in differing)
        raise CheckpointError(f"checkpoint {file.path} belongs to another run: {shown}")


READ_ATTEMPTS = 5
"""Checkpoints of a run directory tried, newest first, when each vanishes while it is read (pruned by training)."""


def read_checkpoint(path: Path) -> CheckpointFile:
    """The checkpoint ``path`` names (a run directory: its newest; a ``.json`` or an ``.eqx`` file), read and
    checked (``read_metadata``, ``read_arrays``); CheckpointError when it is missing, damaged or unreadable.

    A run directory's newest checkpoint that is deleted while it is read (a run in training keeps only its
    newest few) is not an error: the then newest is read instead. Both files are read whole, once: what is
    returned is one checkpoint, whatever happens to the files afterwards."""
    for attempt in range(READ_ATTEMPTS):
        chosen = resolve_checkpoint(path)
        try:
            metadata = read_metadata(chosen)
            return CheckpointFile(chosen, metadata, read_arrays(chosen, metadata))
        except CheckpointError:
            if not (path.is_dir() and not chosen.exists() and attempt + 1 < READ_ATTEMPTS):
                raise
    raise AssertionError("unreachable")


def read_arrays(path: Path, metadata: dict[str, Any]) -> bytes:
    """The bytes of a checkpoint's ``.eqx`` file, checked against the size and SHA-256 in its metadata."""
    arrays = path.with_name(metadata["arrays"])
    try:
        data = read_bounded(arrays, metadata["arrays_bytes"], CheckpointError, f"checkpoint {arrays}")
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint {path} is incomplete: {arrays.name} is missing") from None
    if len(data) != metadata["arrays_bytes"]:
        raise CheckpointError(
            f"checkpoint {arrays} is truncated or damaged: {len(data)} bytes, {metadata['arrays_bytes']} written"
        )
    if hashlib.sha256(data).hexdigest() != metadata["arrays_sha256"]:
        raise CheckpointError(f"checkpoint {arrays} is damaged: its SHA-256 differs from the one written")
    return data


def load_checkpoint(
    file: CheckpointFile,
    config: PPOConfig,
    spec: EnvSpec,
    *,
    conv_impl: ConvRoute = "xla",
    model: ModelFactory | None = None,
    optimizer: OptimizerFactory | None = None,
) -> Checkpoint:
    """The arrays of ``file`` in a tree shaped by ``config`` and ``spec``, its model computing its convolutions
    by ``conv_impl``: the model ``model`` makes and the state of ``optimizer`` (default: those ``config.network``
    and ``config.optimizer`` name, as the ``Trainer`` makes them).

    Raises CheckpointError when the arrays are of other shapes or dtypes (another architecture or env), or the
    checkpoint's model is not the one the factory makes (``model_signature``).
    """
    arrays = file.path.with_name(file.metadata["arrays"])
    obs_shape, num_actions = file.metadata.get("obs_shape", spec.obs_shape), file.metadata.get("num_actions")
    if list(spec.obs_shape) != list(obs_shape) or num_actions not in (None, spec.num_actions):
        raise CheckpointError(
            f"checkpoint {file.path} is for observations {tuple(obs_shape)} and {num_actions} actions; "
            f"{spec.env_id} has {spec.obs_shape} and {spec.num_actions}"
        )
    if model is None:
        model = network_named(config.network, conv_impl=conv_impl, init=config.network_init)  # type: ignore[arg-type]
    optimizer = optimizer_named(config.optimizer) if optimizer is None else optimizer
    like = eqx.filter_eval_shape(init_checkpoint, config, spec, conv_impl=conv_impl, model=model, optimizer=optimizer)
    saved = file.metadata.get("model")
    made = model_signature(like.model)
    if isinstance(saved, dict) and saved != made:
        held = f"{saved.get('leaves')} arrays"
        if (saved.get("class"), saved.get("leaves")) == (made["class"], made["leaves"]):
            held += " of other shapes"
        raise CheckpointError(
            f"checkpoint {file.path} holds a model of class {saved.get('class')} ({held}); network="
            f"{config.network!r} makes one of class {made['class']} ({made['leaves']} arrays); allowed: the network "
            "it was trained with"
        )
    try:
        checkpoint = eqx.tree_deserialise_leaves(io.BytesIO(file.arrays), like)
    except (RuntimeError, ValueError, TypeError, EOFError) as error:  # equinox: a mismatch, as a RuntimeError
        cause = error.__cause__ or error
        message = str(cause).splitlines()[0] if str(cause) else type(cause).__name__
        raise CheckpointError(f"checkpoint {arrays} does not fit this model ({config.env_id}): {message}") from None
    if int(checkpoint.iteration) != file.metadata["iteration"]:
        raise CheckpointError(f"checkpoint {file.path} is damaged: its arrays are of another iteration")
    problem = untrusted(checkpoint)
    if problem is not None:
        raise CheckpointError(f"checkpoint {file.path} holds {problem}; allowed: a checkpoint of finite numbers")
    return checkpoint


def finite_here(tree: Any) -> bool:
    """Whether every floating-point array of ``tree`` is finite (no NaN, no inf), read on the host, in one transfer
    (``core.iteration.all_finite`` computed where the arrays are would be a program compiled there: seconds on a
    TPU, where a checkpoint fetches them anyway)."""
    arrays = [
        x for x in jax.tree.leaves(eqx.filter(tree, eqx.is_array)) if jax.numpy.issubdtype(x.dtype, jax.numpy.inexact)
    ]
    return all(bool(np.isfinite(np.asarray(x)).all()) for x in jax.device_get(arrays))


def untrusted(checkpoint: Checkpoint) -> str | None:
    """What in ``checkpoint`` cannot be trained or played from, in words: parameters or optimizer state that are not
    finite, or normalisation statistics that are not (a mean, a variance or a count of NaN or inf) or impossible (a
    negative variance, a count not above 0); None where all is well. A file whose hash was forged to match
    (``read_checkpoint`` checks the bytes, not what they mean) is refused here."""
    if not finite_here((checkpoint.model, checkpoint.opt_state)):
        return "parameters or optimizer state that are not finite (NaN or inf)"
    handle = getattr(getattr(checkpoint, "envs", None), "handle", None)
    if not isinstance(handle, NormalizedHandle):
        return None
    for what, moments in (("observations'", handle.obs), ("returns'", handle.returns)):
        mean, var, count = (np.asarray(x, np.float64) for x in moments)
        if not (np.isfinite(mean).all() and np.isfinite(var).all() and np.isfinite(count).all()):
            return f"normalisation statistics of the {what} that are not finite (NaN or inf)"
        if (var < 0).any() or (count <= 0).any():
            return f"impossible normalisation statistics of the {what} (a negative variance or a count not above 0)"
    if not np.isfinite(np.asarray(handle.discounted)).all():
        return "discounted returns that are not finite (NaN or inf)"
    return None
