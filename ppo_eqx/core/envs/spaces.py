"""The action spaces an env written in JAX may declare, read duck-typed (``JaxEnv``): discrete (``.n``), or a box
(``.shape``, ``.low``, ``.high``) of continuous actions with finite bounds; and random actions of either (the
probe of a user's env)."""

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array

from ...errors import ConfigError
from . import EnvSpec

PROBE_ENVS = 4
"""Envs the probe of a user's env steps at once."""


def action_space_of(env_id: str, space: Any) -> tuple[int, tuple[tuple[float, ...], tuple[float, ...]] | None]:
    """The number of discrete actions of ``space`` and None, or the dimensions of a box and its bounds (finite:
    CleanRL clips the Gaussian's samples to them); ConfigError for any other space."""
    n = getattr(space, "n", None)
    if n is None:
        return _box(env_id, space)
    try:
        count = int(n)
    except (TypeError, ValueError):
        count = 0
    if count < 1 or count != n:
        raise ConfigError(f"{env_id}: action_space(params).n={n!r}; allowed: a positive integer")
    return count, None


def _box(env_id: str, space: Any) -> tuple[int, tuple[tuple[float, ...], tuple[float, ...]]]:
    shape, low, high = (getattr(space, name, None) for name in ("shape", "low", "high"))
    if shape is None or low is None or high is None:
        raise ConfigError(
            f"{env_id}: action_space(params) is {type(space).__name__}; allowed: a discrete space with .n, or a box "
            "with .shape, .low and .high"
        )
    shape = tuple(int(d) for d in shape)
    if len(shape) > 1 or (shape and shape[0] < 1):
        raise ConfigError(f"{env_id}: a box of actions of shape {shape}; allowed: () or (A,), a vector of actions")
    size = shape[0] if shape else 1
    try:
        lows, highs = (np.broadcast_to(np.asarray(b, np.float64), (size,)) for b in (low, high))
    except (TypeError, ValueError):
        raise ConfigError(f"{env_id}: the box's low and high do not fit its shape {shape}") from None
    if not (np.all(np.isfinite(lows)) and np.all(np.isfinite(highs)) and np.all(lows < highs)):
        raise ConfigError(
            f"{env_id}: the box of actions has bounds low={lows.tolist()}, high={highs.tolist()}; allowed: finite "
            "bounds, low < high (the Gaussian policy's samples are clipped to them)"
        )
    return size, (tuple(float(x) for x in lows), tuple(float(x) for x in highs))


def random_actions(key: Array, spec: EnvSpec) -> Array:
    """Random actions of ``PROBE_ENVS`` envs: uniform over the discrete actions, or over the box."""
    if spec.action_bounds is None:
        return jax.random.randint(key, (PROBE_ENVS,), 0, spec.num_actions, jnp.int32)
    low, high = (jnp.asarray(b, jnp.float32) for b in spec.action_bounds)
    return jax.random.uniform(key, (PROBE_ENVS, spec.num_actions), jnp.float32, low, high)
