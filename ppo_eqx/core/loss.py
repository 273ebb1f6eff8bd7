"""The PPO objective: ``ppo_loss`` on arrays, ``model_loss`` on a model and a batch, and ``Loss``, what any loss
that the update descends is (``model_loss`` by default; a user's own, reporting values of its own)."""

from collections.abc import Mapping
from typing import Any, Protocol, cast, runtime_checkable

import jax.numpy as jnp
from jaxtyping import Array, Float

from ._types import Batch, LossInfo, SequenceBatch
from .checks import one_agent, typechecked
from .hyperparameters import AgentHyperparameters
from .policy import Policy
from .recurrent import RecurrentPolicy


def normalize_advantages(advantages: Float[Array, " B"], ddof: int = 0) -> Float[Array, " B"]:
    """``(a - mean) / (std + 1e-8)`` over the minibatch (CleanRL's ``norm_adv``): the population's standard deviation
    as its JAX scripts compute it (``ddof=0``), or the sample's as torch's ``std()`` in its torch scripts (1)."""
    return (advantages - advantages.mean()) / (advantages.std(ddof=ddof) + 1e-8)


@typechecked
def ppo_loss(
    new_logprob: Float[Array, " B"],
    new_value: Float[Array, " B"],
    entropy: Float[Array, " B"],
    old_logprob: Float[Array, " B"],
    old_value: Float[Array, " B"],
    advantages: Float[Array, " B"],
    returns: Float[Array, " B"],
    hyperparameters: AgentHyperparameters,
    *,
    std_ddof: int = 0,
) -> tuple[Float[Array, ""], LossInfo]:
    """CleanRL's PPO loss on a flat minibatch; every reduction is a mean over ``B``.

    ``loss = policy_loss - ent_coef * mean(entropy) + vf_coef * value_loss``. With ``norm_adv`` the
    advantages are standardised within the minibatch, ``(a - mean) / (std + 1e-8)``. With ``clip_vloss``
    the value loss is the larger of the plain and the clipped squared error (CleanRL's torch version; its
    JAX version ignores the flag). The settings are one agent's ``hyperparameters`` (scalar arrays): both
    sides of each flag are computed and one is selected. ``std_ddof`` 1: the advantages' standard deviation as
    CleanRL's torch scripts compute it (``torch_model_loss``).
    """
    one_agent(hyperparameters, "ppo_loss")
    h = hyperparameters
    log_ratio = new_logprob - old_logprob
    ratio = jnp.exp(log_ratio)
    advantages = jnp.where(h.norm_adv, normalize_advantages(advantages, std_ddof), advantages)
    clipped_ratio = jnp.clip(ratio, 1 - h.clip_coef, 1 + h.clip_coef)
    policy_loss = jnp.maximum(-advantages * ratio, -advantages * clipped_ratio).mean()
    value_error = (new_value - returns) ** 2
    clipped_value = old_value + jnp.clip(new_value - old_value, -h.clip_coef, h.clip_coef)
    value_error = jnp.where(h.clip_vloss, jnp.maximum(value_error, (clipped_value - returns) ** 2), value_error)
    value_loss = 0.5 * value_error.mean()
    entropy_mean = entropy.mean()
    loss = policy_loss - h.ent_coef * entropy_mean + h.vf_coef * value_loss
    info = LossInfo(
        loss=loss,
        policy_loss=policy_loss,
        value_loss=value_loss,
        entropy=entropy_mean,
        approx_kl=((ratio - 1) - log_ratio).mean(),
        clip_fraction=(jnp.abs(ratio - 1) > h.clip_coef).astype(jnp.float32).mean(),
    )
    return loss, info


def evaluated(
    model: Policy, batch: Batch | SequenceBatch, *, prepared: bool = False
) -> tuple[tuple[Float[Array, " B"], Float[Array, " B"], Float[Array, " B"]], Batch]:
    """``model``'s log-probabilities of ``batch``'s actions, its entropies and values, and ``batch`` as a flat
    ``Batch`` beside them: a ``SequenceBatch``'s ``[T, n]`` sequences replayed from their memory by a recurrent
    policy (``RecurrentPolicy.evaluate_sequences``), then flattened to ``[T*n]``."""
    if not isinstance(batch, SequenceBatch):
        return model.evaluate_actions(batch.obs, batch.actions, prepared=prepared), batch
    if not isinstance(model, RecurrentPolicy):
        raise TypeError(f"a SequenceBatch is a RecurrentPolicy's to evaluate, not a {type(model).__name__}'s")
    logprob, entropy, value = model.evaluate_sequences(
        batch.memory, batch.obs, batch.starts, batch.actions, prepared=prepared
    )
    flat = [x.reshape((-1, *x.shape[2:])) for x in batch[:6]]
    return (logprob.reshape(-1), entropy.reshape(-1), value.reshape(-1)), Batch(*flat)


@typechecked
def model_loss(
    model: Policy, batch: Batch | SequenceBatch, hyperparameters: AgentHyperparameters, *, prepared: bool = False
) -> tuple[Float[Array, ""], LossInfo]:
    """``ppo_loss`` of ``model`` on ``batch``; differentiate it with ``eqx.filter_value_and_grad``.

    ``prepared``: ``batch.obs`` already went through ``model.prepare``. A recurrent policy's ``SequenceBatch`` is
    replayed and flattened first (``evaluated``).
    """
    (new_logprob, entropy, new_value), batch = evaluated(model, batch, prepared=prepared)
    return ppo_loss(
        new_logprob,
        new_value,
        entropy,
        batch.logprobs,
        batch.values,
        batch.advantages,
        batch.returns,
        hyperparameters,
    )


def torch_model_loss(
    model: Policy, batch: Batch | SequenceBatch, hyperparameters: AgentHyperparameters, *, prepared: bool = False
) -> tuple[Float[Array, ""], LossInfo]:
    """``model_loss`` as CleanRL's torch scripts compute it (``ppo_continuous_action.py``): the advantages
    normalised by their sample standard deviation (torch's ``std()``). The loss ``loss="cleanrl-torch"`` names."""
    (new_logprob, entropy, new_value), old = evaluated(model, batch, prepared=prepared)
    return ppo_loss(
        new_logprob, new_value, entropy, old.logprobs, old.values, old.advantages, old.returns, hyperparameters,
        std_ddof=1,
    )  # fmt: skip


@runtime_checkable
class Loss(Protocol):
    """What the update descends, one minibatch at a time: ``loss(model, minibatch, hyperparameters, *, prepared)``
    returns the scalar to minimise and what it reports, a ``LossInfo`` or any NamedTuple or mapping of scalars.

    ``model_loss`` (CleanRL's) is one. ``minibatch`` is a flat ``Batch`` whose observations went through
    ``model.prepare`` once for all epochs: pass ``prepared`` on to the model (``model(obs, prepared=prepared)``,
    ``model.evaluate_actions(..., prepared=prepared)``, ``model_loss(..., prepared=prepared)``); for a recurrent
    policy it is a ``SequenceBatch`` of whole env sequences (``evaluated`` replays and flattens it). Each reported value
    becomes a metric of its name (metrics.jsonl, TensorBoard's ``losses/NAME``): the last minibatch step's, as
    CleanRL reports its losses (``clip_fraction``: the mean over the steps). On a mesh each device evaluates the
    loss on the whole minibatch, so a loss of minibatch statistics computes what one device computes
    (``core.sharded``). ``hyperparameters`` are the agent's own; a loss's own settings are its closure's.
    """

    def __call__(
        self,
        model: Policy,
        minibatch: Batch | SequenceBatch,
        hyperparameters: AgentHyperparameters,
        /,
        *,
        prepared: bool,
    ) -> tuple[Float[Array, ""], Any]: ...


def check_loss(loss: Any) -> Loss:
    """``loss`` if it is callable (its signature is ``Loss``'s); TypeError naming what it is otherwise."""
    if not callable(loss):
        raise TypeError(f"loss={loss!r} is not callable; allowed: a function like ppo_eqx.model_loss (ppo_eqx.Loss)")
    return cast(Loss, loss)


RESERVED = frozenset(
    {"iteration", "global_step", "sps", "time_elapsed", "learning_rate", "episodic_return", "episodic_length", "finite"}
)
"""Metric names that are not a loss's to report."""


def reported(info: Any) -> dict[str, Array]:
    """A loss's reported values by name (``LossInfo`` or any NamedTuple's fields, or a mapping's items), each a
    scalar; ValueError for anything else, or a name that another metric has (``RESERVED``)."""
    items = info._asdict() if hasattr(info, "_asdict") else dict(info) if isinstance(info, Mapping) else None
    if items is None:
        raise ValueError(f"a loss reports a {type(info).__name__}; allowed: a NamedTuple or a mapping of scalars")
    for name, value in items.items():
        if not isinstance(name, str) or not name.isidentifier() or name in RESERVED:
            raise ValueError(f"a loss reports {name!r}; allowed: names that are identifiers, not {sorted(RESERVED)}")
        if jnp.shape(value) != ():
            raise ValueError(f"a loss reports {name} of shape {jnp.shape(value)}; allowed: scalars")
    return {name: jnp.asarray(value, jnp.float32) for name, value in items.items()}
