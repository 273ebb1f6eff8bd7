"""The PPO objective: ``ppo_loss`` on arrays, ``model_loss`` on a model and a batch."""

import jax.numpy as jnp
from jaxtyping import Array, Float

from ._types import Batch, LossInfo
from .checks import one_agent, typechecked
from .hyperparameters import AgentHyperparameters
from .networks import ActorCritic


def normalize_advantages(advantages: Float[Array, " B"]) -> Float[Array, " B"]:
    """``(a - mean) / (std + 1e-8)`` over the minibatch (CleanRL's ``norm_adv``)."""
    return (advantages - advantages.mean()) / (advantages.std() + 1e-8)


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
) -> tuple[Float[Array, ""], LossInfo]:
    """CleanRL's PPO loss on a flat minibatch; every reduction is a mean over ``B``.

    ``loss = policy_loss - ent_coef * mean(entropy) + vf_coef * value_loss``. With ``norm_adv`` the
    advantages are standardised within the minibatch, ``(a - mean) / (std + 1e-8)``. With ``clip_vloss``
    the value loss is the larger of the plain and the clipped squared error (CleanRL's torch version; its
    JAX version ignores the flag). The settings are one agent's ``hyperparameters`` (scalar arrays): both
    sides of each flag are computed and one is selected.
    """
    one_agent(hyperparameters, "ppo_loss")
    h = hyperparameters
    log_ratio = new_logprob - old_logprob
    ratio = jnp.exp(log_ratio)
    advantages = jnp.where(h.norm_adv, normalize_advantages(advantages), advantages)
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


@typechecked
def model_loss(
    model: ActorCritic, batch: Batch, hyperparameters: AgentHyperparameters, *, prepared: bool = False
) -> tuple[Float[Array, ""], LossInfo]:
    """``ppo_loss`` of ``model`` on ``batch``; differentiate it with ``eqx.filter_value_and_grad``.

    ``prepared``: ``batch.obs`` already went through ``model.prepare``.
    """
    new_logprob, entropy, new_value = model.evaluate_actions(batch.obs, batch.actions, prepared=prepared)
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
