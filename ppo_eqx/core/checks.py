"""Checks of the public functions' inputs, for every caller: a bad argument raises an error that names it, from
ppo_eqx's own frame, before jax fails deep inside (or, worse, broadcasts ``[B, 1]`` against ``[B]``).

``typechecked`` is jaxtyping's ``jaxtyped`` with beartype: it checks each argument against its annotation
(shapes bound across arguments: the seven ``[B]`` of the loss share one ``B``) when the function is called in
Python, which under ``jit`` is once, when it is traced: compiled code pays nothing per call. What annotations
cannot say is checked explicitly, at trace time too (``check_fields``, ``one_agent``); action values only where
they are concrete (``check_actions``), as under ``jit`` they are not known until the program runs, and a check
there would be a callback in every step.
"""

import dataclasses
import types
import typing
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np
from beartype import beartype
from jax.core import Tracer
from jaxtyping import jaxtyped

F = TypeVar("F", bound=Callable[..., Any])


def typechecked(fn: F) -> F:
    """``jaxtyped(typechecker=beartype)``: a TypeCheckError naming the argument that does not fit its annotation."""
    return typing.cast(F, jaxtyped(typechecker=beartype)(fn))


def is_concrete(x: Any) -> bool:
    """Whether the values of ``x`` are known now (not a tracer of ``jit``, ``vmap``, ``grad``)."""
    return not isinstance(x, Tracer)


def check_fields(container: tuple, argument: str, where: str) -> None:
    """Each field of the NamedTuple ``container`` (``Batch``, ...) against its annotation, the shapes' names bound
    across the fields (a ``Batch``'s fields share one ``B``); TypeError naming ``argument.field``. (jaxtyping
    checks a NamedTuple argument's type, not its fields.)"""
    with jaxtyped("context"):  # pyright: ignore[reportCallIssue, reportArgumentType]
        for name, hint in typing.get_type_hints(type(container)).items():
            value = getattr(container, name)
            if not isinstance(value, hint):
                fields = ", ".join(f"{field} {_shown(getattr(container, field))}" for field in container._fields)  # pyright: ignore[reportAttributeAccessIssue]
                raise TypeError(
                    f"{where}: {argument}.{name} is {_shown(value)}, not {_hint_name(hint)} beside the other fields "
                    f"({fields})"
                )


def _hint_name(hint: Any) -> str:
    """``Float[Array, 'B A']``'s name, or ``a or b`` for a union of annotations."""
    parts = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
    return " or ".join(getattr(part, "__name__", str(part)) for part in parts)


def _shown(value: Any) -> str:
    """``float32[16, 1]``, or the type's name of a value that is not an array."""
    return f"{value.dtype}{list(value.shape)}" if hasattr(value, "shape") else type(value).__name__


def check_actions(actions: Any, num_actions: int, where: str, argument: str = "actions") -> None:
    """ValueError unless every action is in ``0 .. num_actions - 1``, when the values are known (an eager call);
    under ``jit`` nothing is checked (an action out of range gives a NaN log-probability there)."""
    if not is_concrete(actions) or np.size(actions) == 0:
        return
    # On the host: a jax method on a concrete array inside a jit trace (a closed-over batch) would be staged.
    values = np.asarray(actions)
    low, high = int(values.min()), int(values.max())
    if low < 0 or high >= num_actions:
        bad = low if low < 0 else high
        raise ValueError(f"{where}: {argument} holds {bad}; allowed: 0 .. {num_actions - 1} (the model's actions)")


def one_agent(hyperparameters: Any, where: str) -> None:
    """ValueError unless every field of ``hyperparameters`` (``AgentHyperparameters``) is one agent's, a scalar:
    the agents of a sweep are ``vmap``-ed over, each seeing its own."""
    for field in dataclasses.fields(hyperparameters):
        name, value = field.name, getattr(hyperparameters, field.name)
        if np.ndim(value) != 0:
            raise ValueError(
                f"{where}: hyperparameters.{name} has shape {list(np.shape(value))}; allowed: one agent's, a scalar "
                "(vmap over the agents of a sweep: AgentHyperparameters.axes())"
            )
