"""The checks of a config's fields, one value at a time (``check_field``: the field's declared type, and the range
or choices its metadata holds: ``settings.config_field``) and a sweep's (``check_sweep``), each failure a ConfigError
that names the field, the value and what is allowed. They take the fields themselves (``dataclasses.Field``), so
that ``PPOConfig`` (config.py) calls them without this module knowing it. No jax here (the command line's parser runs
them before jax is imported)."""

import dataclasses
import math
import struct
from collections.abc import Mapping
from typing import Any

from .errors import ConfigError, show_value
from .settings import FLOAT32_MAX, is_import_path
from .sweeps import NOT_SWEEPABLE, SWEEPABLE

IMPORTABLE = frozenset({"env_backend", "loss", "network", "optimizer"})
"""The str fields that take ``MODULE:ATTRIBUTE`` (the user's own object) besides their choices."""


def _allowed(field: dataclasses.Field) -> str:
    """What ``field`` takes, in words."""
    kind, choices = field.type, field.metadata["choices"]
    if kind is bool:
        return "True or False"
    if choices:
        outside = ", or MODULE:ATTRIBUTE (an object of yours)" if field.name in IMPORTABLE else ""
        return "one of " + ", ".join(map(repr, choices)) + outside
    if kind is str:
        return "a non-empty string"
    low, high, _ = field.metadata["within"]
    if kind is int:
        return f"an integer in {low} .. {high}"
    return f"a number in [{low:.3g}, {high:.3g}] (float32)"


def _type_problem(kind: object, value: object) -> str | None:
    """Why ``value`` is not of the field's type ``kind``, or None if it is."""
    is_bool = isinstance(value, bool)
    if kind is bool:
        return None if is_bool else f"is a {type(value).__name__}, not a bool"
    if kind is int:
        return None if isinstance(value, int) and not is_bool else f"is a {type(value).__name__}, not an integer"
    if kind is float:
        if is_bool or not isinstance(value, int | float):
            return f"is a {type(value).__name__}, not a number"
        if isinstance(value, float) and not math.isfinite(value):
            return "is not finite"
        if abs(value) > FLOAT32_MAX:
            return f"does not fit float32 (largest {FLOAT32_MAX:.3g})"
        return None
    if kind is str:
        return None if isinstance(value, str) and value else "is not a non-empty string"
    raise TypeError(f"PPOConfig has a field of type {kind!r} that validate() does not know")


def check_field(field: dataclasses.Field, value: Any) -> None:
    """Raise ConfigError unless ``value`` is of ``field``'s type and among its allowed values."""
    name, choices, within = field.name, field.metadata["choices"], field.metadata["within"]
    problem = _type_problem(field.type, value)
    if problem is None and choices and value not in choices:
        if not (name in IMPORTABLE and is_import_path(value)):  # an object of the user's
            problem = "is not a known choice"
    if problem is None and within:
        low, high, must_be = within
        if not low <= value <= high:
            problem = f"must be {must_be}"
    if problem is not None:
        raise ConfigError(f"{name}={show_value(value)} {problem}; allowed: {_allowed(field)}")


def check_sweep(sweep: Any, fields: Mapping[str, dataclasses.Field]) -> None:
    """Raise ConfigError unless ``sweep`` is pairs of distinct sweepable names (of ``fields``) and distinct allowed
    values."""
    if not isinstance(sweep, tuple) or any(not isinstance(pair, tuple) or len(pair) != 2 for pair in sweep):
        raise ConfigError(
            f"sweep={show_value(sweep)} is not a sweep; allowed: a mapping of hyperparameter name to a list of values"
        )
    seen: set[str] = set()
    for name, values in sweep:
        if not isinstance(name, str) or name not in fields:
            raise ConfigError(f"sweep of {show_value(name)}: not a hyperparameter; allowed: {', '.join(SWEEPABLE)}")
        if name not in SWEEPABLE:
            raise ConfigError(
                f"sweep of {name}: one program cannot sweep it ({name} {NOT_SWEEPABLE[name]}); sweep it with a "
                f"separate run per value; allowed: {', '.join(SWEEPABLE)}"
            )
        if name in seen:
            raise ConfigError(f"sweep of {name}: given twice; allowed: each name once")
        seen.add(name)
        if not values:
            raise ConfigError(f"sweep of {name}: no values; allowed: one or more values")
        for value in values:
            try:
                check_field(fields[name], value)
            except ConfigError as error:
                raise ConfigError(f"sweep of {name}: {error}") from None
        repeated = [value for i, value in enumerate(values) if value in values[:i]]
        if repeated:
            raise ConfigError(f"sweep of {name}: {show_value(repeated[0])} given twice; allowed: distinct values")
        same = [(a, b) for i, b in enumerate(values) for a in values[:i] if _float32(a) == _float32(b)]
        if same:
            a, b = same[0]
            raise ConfigError(
                f"sweep of {name}: {show_value(a)} and {show_value(b)} are the same float32 number, which the agents "
                "compute with; allowed: values that differ in float32"
            )
    if sweep and math.prod(len(values) for _, values in sweep) == 1:
        setting = ", ".join(f"{name}={show_value(values[0])}" for name, values in sweep)
        raise ConfigError(
            f"sweep of one setting ({setting}) is no sweep; allowed: two or more values of a name (one value is "
            "set as the field itself)"
        )


def _float32(value: Any) -> Any:
    """``value`` rounded to float32, as the agents' arrays hold it (a bool as it is)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return value
    return struct.unpack("f", struct.pack("f", value))[0]
