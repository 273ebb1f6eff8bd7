"""What one program may sweep (``PPOConfig.sweep``): the sweepable fields, why each other field is not, a sweep's
normal form and a setting's name. No jax here; a sweep's check is ``validation.check_sweep``, beside the fields'
types and ranges."""

import dataclasses
from collections.abc import Mapping
from typing import Any

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
    "num_threads": "changes how the envs are stepped, not the results",
    "thread_affinity_offset": "changes where the envs are stepped, not the results",
    "iterations_per_dispatch": "changes the program, not the results",
    "loss": "changes the program's update",
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
