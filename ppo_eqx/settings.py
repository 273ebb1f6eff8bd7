"""The hyperparameters as Python values, and what stays static beside them: jax-free, so that the command line
parses its flags (derived from ``PPOConfig``, which derives from ``Hyperparameters``) without importing jax.

``Hyperparameters`` holds the hyperparameters that the agents of one program may differ in (a sweep), with
CleanRL's names and defaults, each field's one-line help and allowed range; ``PPOConfig`` derives from it, so
they are its first fields. Their array face, ``AgentHyperparameters``, is in ``hyperparameters.py``. What sets an
array's shape or a loop's length is ``Sizes``.
"""

import dataclasses
import re
from typing import Any, NamedTuple


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
ENV_BACKENDS = ("envpool", "ale", "gymnax", "jax")
"""The env backends a config may name (``ppo_eqx.core.envs.BACKENDS`` maps each to its module; an import-time
check ties the two); besides these, ``MODULE:ATTRIBUTE`` names a backend object of the user's (``is_import_path``)."""
IMPORT_PATH = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*")
"""``MODULE:ATTRIBUTE``: how a config names an env maker (``env_id``) or a backend object (``env_backend``) of the
user's, imported when the run starts."""


def is_import_path(text: object) -> bool:
    """Whether ``text`` reads as ``MODULE:ATTRIBUTE``."""
    return isinstance(text, str) and IMPORT_PATH.fullmatch(text) is not None


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
