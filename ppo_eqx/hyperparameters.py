"""The hyperparameters that the agents of one program may differ in (a sweep), declared once, in two faces.

``Hyperparameters`` holds them as Python values, with CleanRL's names and defaults, each field's one-line help
and allowed range; ``PPOConfig`` derives from it, so they are its first fields. ``AgentHyperparameters`` holds
the same fields as arrays: a scalar where the agents of a program share a value, ``[A]`` where they differ,
the axis a ``vmap`` over the agents maps. The training state carries them; the collector (``gamma``,
``gae_lambda``), the loss and the optimizer read them there. What sets an array's shape or a loop's length stays
static beside them: ``Sizes``.

A new sweepable hyperparameter is a field of both classes here and is read where it is used; nothing in
between names it (the check at the end of this module keeps the two faces' fields equal).
"""

import dataclasses
from collections.abc import Sequence
from typing import Any, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float


class FieldRange(NamedTuple):
    """The closed interval ``[low, high]`` of a number field, and how a value outside it is told off."""

    low: float
    high: float
    must_be: str


FLOAT32_MAX = (2 - 2**-23) * 2.0**127
"""The largest finite float32 (about 3.4e38): every float setting becomes one under jit."""
FLOAT32_TINY = 2.0**-126
"""The smallest normal float32 (about 1.2e-38): XLA on CPU flushes smaller numbers to 0, so a setting that must
be > 0 must be at least this."""
PROBABILITY = FieldRange(0.0, 1.0, "in [0, 1]")
STEP_SIZE = FieldRange(FLOAT32_TINY, FLOAT32_MAX, "> 0")
WEIGHT = FieldRange(0.0, FLOAT32_MAX, ">= 0")


def config_field(
    default: Any, help: str, *, within: FieldRange | None = None, choices: tuple[str, ...] | None = None
) -> Any:
    """A field of the config (``Hyperparameters``, ``PPOConfig``): its default, its one line of help (the
    description of its flag) and what it allows besides its type, a number's range or a string's choices."""
    return dataclasses.field(default=default, metadata={"help": help, "within": within, "choices": choices})


@dataclasses.dataclass(frozen=True)
class Hyperparameters:
    """The hyperparameters of CleanRL's ``ppo_atari_envpool_xla_jax.py`` that change no array shape, with its
    names, defaults and order: what one program may vary across its agents (``PPOConfig.sweep``)."""

    learning_rate: float = config_field(2.5e-4, "Adam's step size (CleanRL's)", within=STEP_SIZE)
    anneal_lr: bool = config_field(True, "anneal the learning rate linearly to 0 over the run (CleanRL's)")
    gamma: float = config_field(0.99, "discount factor (CleanRL's)", within=PROBABILITY)
    gae_lambda: float = config_field(0.95, "lambda of generalised advantage estimation (CleanRL's)", within=PROBABILITY)
    norm_adv: bool = config_field(True, "normalise the advantages of each minibatch (CleanRL's)")
    clip_coef: float = config_field(
        0.1, "clipping range of the policy ratio's surrogate objective (CleanRL's)", within=WEIGHT
    )
    clip_vloss: bool = config_field(False, "clip the value loss around the old values (CleanRL's)")
    ent_coef: float = config_field(0.01, "weight of the entropy bonus (CleanRL's)", within=WEIGHT)
    vf_coef: float = config_field(0.5, "weight of the value loss (CleanRL's)", within=WEIGHT)
    max_grad_norm: float = config_field(
        0.5, "global norm that the gradient is clipped to (CleanRL's)", within=STEP_SIZE
    )


class AgentHyperparameters(eqx.Module):
    """``Hyperparameters`` as arrays, float32 or bool, for the agents of one program: each a scalar that every
    agent shares, or, where the agents differ (a swept hyperparameter), ``[A]`` with one value per agent, the
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
        """The hyperparameters of ``agents``: a scalar where they share the value, ``[A]`` where they differ."""

        def column(field: dataclasses.Field) -> Array:
            values = [getattr(agent, field.name) for agent in agents]
            dtype = jnp.bool_ if field.type is bool else jnp.float32
            return jnp.asarray(values[0] if values.count(values[0]) == len(values) else values, dtype)

        return cls(**{field.name: column(field) for field in dataclasses.fields(Hyperparameters)})

    def axes(self) -> "AgentHyperparameters":
        """``vmap`` axes over the agents: 0 for a field with one value per agent, None for a shared one."""
        return jax.tree.map(lambda x: 0 if x.ndim else None, self)


class Sizes(NamedTuple):
    """What sets the iteration's array shapes and loop lengths: Python ints, static under jit (another value
    compiles anew), shared by the agents of a program."""

    num_agents: int
    num_steps: int
    num_minibatches: int
    update_epochs: int
    num_iterations: int
    """The length of the learning rate's annealing."""
    minibatch_unroll: int = 1
    iterations_per_dispatch: int = 1
    """The most iterations one program runs (``core.iteration.over_iterations``); 1: the iteration alone."""


if [field.name for field in dataclasses.fields(Hyperparameters)] != list(AgentHyperparameters.__annotations__):
    raise TypeError("Hyperparameters and AgentHyperparameters must declare the same fields in the same order")
