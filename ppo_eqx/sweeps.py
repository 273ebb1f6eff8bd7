"""What one program may sweep (``PPOConfig.sweep``): the sweepable fields, why each other field is not, a sweep's
normal form, its text (``--sweep NAME=V1,V2``) and a setting's name. No jax here; a sweep's check is
``validation.check_sweep``, beside the fields' types and ranges."""

import dataclasses
from collections.abc import Mapping
from typing import Any

from .errors import ConfigError
from .settings import Hyperparameters

SWEEPABLE: tuple[str, ...] = tuple(field.name for field in dataclasses.fields(Hyperparameters))
"""The fields that ``sweep`` may vary: the per-agent hyperparameters that change no array shape."""

_SHAPES = "changes the iteration's array shapes"
NOT_SWEEPABLE: dict[str, str] = {
    "env_id": "makes another pool and model",
    "total_timesteps": "sets the number of iterations, shared by the agents of one program",
    "num_envs": _SHAPES,
    "num_steps": _SHAPES,
    "num_minibatches": _SHAPES,
    "update_epochs": "changes the number of minibatch steps, the program's shape",
    "seed": "is swept by --num-seeds",
    "conv_impl": "changes the program, not the results",
    "minibatch_unroll": "changes the program, not the results",
    "checkpoint_every": "sets when the pool's envs are made afresh, shared by the agents",
    "num_seeds": "is the number of seeds of every setting",
    "async_batch_size": "changes the pool and the batch's shape",
    "env_backend": "makes another pool",
    "bootstrap_truncated": "changes the program (one more critic evaluation a step)",
    "network_init": "is drawn before the program, the same way for every agent of a run",
    "rollout_on": "changes where the program runs, not the results",
    "actor_threads": "changes how the envs are stepped, not the results",
    "num_threads": "changes how the envs are stepped, not the results",
    "thread_affinity_offset": "changes where the envs are stepped, not the results",
    "iterations_per_dispatch": "changes the program, not the results",
    "loss": "changes the program's update",
    "network": "makes another model",
    "optimizer": "changes the program's update",
    "normalize_obs": "changes the program's rollout",
    "normalize_reward": "changes the program's rollout",
    "preset": "sets the defaults of the fields it names, the envs' count and shape among them",
    "sweep": "is the sweep itself",
}
"""Why each other field cannot be swept in one program: it is swept by separate runs instead."""


def setting_label(setting: Mapping[str, Any]) -> str:
    """A setting as its flags, ``learning-rate=0.001,norm-adv=false`` (also its run directory's name)."""
    return ",".join(f"{name.replace('_', '-')}={_value_text(value)}" for name, value in setting.items())


def _value_text(value: Any) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else repr(value)


def normal_sweep(sweep: Any) -> Any:
    """``sweep`` as a tuple of ``(name, tuple_of_values)`` pairs when it is a mapping of names to lists of values
    (as JSON gives it) or a sequence of such pairs; anything else unchanged, for ``validate`` to refuse."""
    pairs = list(sweep.items()) if isinstance(sweep, Mapping) else sweep
    if isinstance(pairs, list | tuple) and all(
        isinstance(pair, list | tuple) and len(pair) == 2 and isinstance(pair[1], list | tuple) for pair in pairs
    ):
        return tuple((name, tuple(values)) for name, values in pairs)
    return sweep


_TYPES: dict[str, Any] = {field.name: field.type for field in dataclasses.fields(Hyperparameters)}
_TRUTH = {"true": True, "false": False}


def _kebab(name: str) -> str:
    return name.replace("_", "-")


def _sweep_value(name: str, text: str) -> Any:
    """One value of a sweep's text, parsed as field ``name``'s type (its range is PPOConfig's to check)."""
    if _TYPES[name] is bool:
        if text.lower() not in _TRUTH:
            raise ConfigError(f"{_kebab(name)}: {text[:60]!r} is not true or false")
        return _TRUTH[text.lower()]
    try:
        return float(text)
    except ValueError:
        raise ConfigError(f"{_kebab(name)}: {text[:60]!r} is not a number") from None


def sweep_item(text: str) -> tuple[str, tuple[Any, ...]]:
    """A sweep written as ``--sweep`` takes it, ``NAME=V1,V2,...`` (NAME a kebab-case flag name), as
    ``(field_name, (value, ...))``: an item of ``PPOConfig.sweep``; ConfigError naming what is wrong."""
    name, equals, values = text.partition("=")
    field = name.strip().replace("-", "_")
    allowed = ", ".join(_kebab(name) for name in SWEEPABLE)
    if not equals:
        raise ConfigError(f"{text[:60]!r} is not NAME=V1,V2,...; allowed names: {allowed}")
    if field not in SWEEPABLE and field not in NOT_SWEEPABLE:
        raise ConfigError(f"{name[:60]!r} is not a hyperparameter; allowed: {allowed}")
    if field not in SWEEPABLE:
        raise ConfigError(
            f"{_kebab(field)} cannot be swept in one program ({field} {NOT_SWEEPABLE[field]}); train one run "
            f"per value instead (bench/atari57.py runs many); allowed: {allowed}"
        )
    pieces = [piece.strip() for piece in values.split(",")]
    if not values.strip() or not all(pieces):
        raise ConfigError(f"{_kebab(field)}: {values[:60]!r} has an empty value; allowed: V1,V2,...")
    return field, tuple(_sweep_value(field, piece) for piece in pieces)
