"""The hyperparameters that the agents of one program may differ in (a sweep), in two faces.

``Hyperparameters`` (``settings.py``, jax-free) holds them as Python values, with CleanRL's names and defaults;
``PPOConfig`` derives from it. ``AgentHyperparameters`` holds the same fields as arrays: a scalar where the agents
of a program share a value, ``[S]`` where they differ, the axis a ``vmap`` over the agents maps. The training
state carries them; the collector (``gamma``, ``gae_lambda``), the loss and the optimizer read them there. What
sets an array's shape or a loop's length stays static beside them: ``Sizes``.

A new sweepable hyperparameter is a field of both classes and is read where it is used; nothing in between names
it (the check at the end of this module keeps the two faces' fields equal).
"""

import dataclasses
from collections.abc import Sequence

import equinox as eqx
import jax
import numpy as np
from jaxtyping import Array, Bool, Float

from ..settings import Hyperparameters as Hyperparameters
from ..settings import Sizes as Sizes
from .checks import typechecked


@typechecked  # each field checked when one is built (dataclasses.replace too): float32 or bool arrays
class AgentHyperparameters(eqx.Module):
    """``Hyperparameters`` as arrays, float32 or bool, for the agents of one program: each a scalar that every
    agent shares, or, where the agents differ (a swept hyperparameter), ``[S]`` with one value per agent, the
    axis a ``vmap`` over the agents maps (``axes``)."""

    learning_rate: Float[Array, "..."]
    anneal_lr: Bool[Array, "..."]
    gamma: Float[Array, "..."]
    gae_lambda: Float[Array, "..."]
    norm_adv: Bool[Array, "..."]
    clip_coef: Float[Array, "..."]
    clip_vloss: Bool[Array, "..."]
    ent_coef: Float[Array, "..."]
    vf_coef: Float[Array, "..."]
    max_grad_norm: Float[Array, "..."]

    @classmethod
    def of(cls, agents: Sequence[Hyperparameters]) -> "AgentHyperparameters":
        """The hyperparameters of ``agents``: a scalar where they share the value, ``[S]`` where they differ."""

        def column(field: dataclasses.Field) -> Array:
            values = [getattr(agent, field.name) for agent in agents]
            dtype = np.bool_ if field.type is bool else np.float32
            # Made by NumPy and put on the device (a transfer): jnp's conversion would be a program compiled there.
            return jax.device_put(np.asarray(values[0] if values.count(values[0]) == len(values) else values, dtype))

        return cls(**{field.name: column(field) for field in dataclasses.fields(Hyperparameters)})

    def axes(self) -> "AgentHyperparameters":
        """``vmap`` axes over the agents: 0 for a field with one value per agent, None for a shared one."""
        return jax.tree.map(lambda x: 0 if x.ndim else None, self)


if [field.name for field in dataclasses.fields(Hyperparameters)] != list(AgentHyperparameters.__annotations__):
    raise TypeError("Hyperparameters and AgentHyperparameters must declare the same fields in the same order")
