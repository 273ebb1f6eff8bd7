"""The model interface (issue 51): what the rollout, the loss and evaluation call of a model, as abstract Equinox
modules. A model of your own subclasses one of the abstract classes here, never a concrete model (Equinox's
abstract/final pattern), so nothing it does changes what ours do:

- ``Policy``: ``__call__(obs) -> (outputs [B, A], values [B])``, where ``outputs`` are what the action
  distribution is made of; ``sample``, ``mode`` and ``log_prob_entropy`` of that distribution; ``obs_shape`` and
  ``num_actions``. ``evaluate_actions`` follows from them; ``prepare`` (a relayout of a whole batch's observations,
  done once for all epochs) is the identity unless a model says otherwise.
- ``CategoricalPolicy``: discrete actions, ``outputs`` the logits (``ActorCritic``): implement ``__call__`` alone.
- ``GaussianPolicy``: continuous actions, ``outputs`` the mean of a diagonal Gaussian whose log standard deviation is
  the model's ``log_std`` (``GaussianActorCritic``): implement ``__call__`` and hold ``log_std``.
- ``RecurrentPolicy`` (``core.recurrent``): a policy with a memory per env, carried through the rollout and
  replayed over whole sequences by the update.
"""

import abc
import math

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PRNGKeyArray, Shaped

from .checks import check_actions, typechecked

LOG_2PI = math.log(2 * math.pi)

Actions = Int[Array, " B"] | Float[Array, "B A"]
"""A batch of actions: ``[B]`` ints for discrete ones, ``[B, A]`` floats for continuous ones."""


class Policy(eqx.Module):
    """What the rollout, the loss and evaluation call of a model (abstract)."""

    obs_shape: eqx.AbstractVar[tuple[int, ...]]
    """The shape of one observation (a batch is ``[B, *obs_shape]``)."""
    num_actions: eqx.AbstractVar[int]
    """A: the actions to choose among (discrete), or the action's dimensions (continuous)."""

    @abc.abstractmethod
    def __call__(
        self, obs: Shaped[Array, " B *obs"], *, prepared: bool = False
    ) -> tuple[Float[Array, "B A"], Float[Array, " B"]]:
        """The distribution's ``outputs`` ``[B, A]`` (logits, or a Gaussian's mean) and the values ``[B]`` of a batch
        of observations; ``prepared``: the observations went through ``prepare`` already."""

    @abc.abstractmethod
    def sample(
        self,
        key: PRNGKeyArray,
        outputs: Float[Array, "N A"],
        *,
        first_env: int | Int[Array, ""] = 0,
        total_envs: int | None = None,
    ) -> tuple[Actions, Float[Array, " N"]]:
        """One action per row of ``outputs``, and its log-probability. With ``total_envs`` the rows are rows
        ``first_env ..`` of a ``[total_envs, A]`` batch, each drawing that row's noise of the whole batch (a process's
        share of the envs, or a host loop's half, draws what the whole rollout would)."""

    @abc.abstractmethod
    def mode(self, outputs: Float[Array, "N A"]) -> Actions:
        """The distribution's most likely action per row (greedy evaluation)."""

    @abc.abstractmethod
    def log_prob_entropy(
        self, outputs: Float[Array, "B A"], actions: Actions
    ) -> tuple[Float[Array, " B"], Float[Array, " B"]]:
        """The log-probability of ``actions`` and the distribution's entropy, per row."""

    def prepare(self, obs: Shaped[Array, " B *obs"]) -> Shaped[Array, " B *prepared"]:
        """Observations relaid out for the model, once for all epochs of an update (the identity here)."""
        return obs

    def evaluate_actions(
        self, obs: Shaped[Array, " B *obs"], actions: Actions, *, prepared: bool = False
    ) -> tuple[Float[Array, " B"], Float[Array, " B"], Float[Array, " B"]]:
        """Log-probability of ``actions``, the policy's entropy and the value, each ``[B]``."""
        outputs, value = self(obs, prepared=prepared)
        logprob, entropy = self.log_prob_entropy(outputs, actions)
        return logprob, entropy, value


class CategoricalPolicy(Policy):
    """A policy of discrete actions whose ``outputs`` are logits (abstract: implement ``__call__``)."""

    def sample(
        self,
        key: PRNGKeyArray,
        outputs: Float[Array, "N A"],
        *,
        first_env: int | Int[Array, ""] = 0,
        total_envs: int | None = None,
    ) -> tuple[Int[Array, " N"], Float[Array, " N"]]:
        action = sample_actions(key, outputs, first_env=first_env, total_envs=total_envs)
        logprob, _ = categorical_logprob_entropy(outputs, action)
        return action, logprob

    def mode(self, outputs: Float[Array, "N A"]) -> Int[Array, " N"]:
        return jnp.argmax(outputs, axis=-1).astype(jnp.int32)

    @typechecked
    def log_prob_entropy(
        self, outputs: Float[Array, "B A"], actions: Int[Array, " B"]
    ) -> tuple[Float[Array, " B"], Float[Array, " B"]]:
        check_actions(actions, outputs.shape[-1], "evaluate_actions")
        return categorical_logprob_entropy(outputs, actions)


class GaussianPolicy(Policy):
    """A policy of continuous actions: a diagonal Gaussian whose mean is ``outputs`` and whose log standard deviation
    is ``log_std`` (state-independent, learned), log-probabilities and entropies summed over the action's
    dimensions, as CleanRL's ``ppo_continuous_action.py`` (abstract: implement ``__call__``, hold ``log_std``)."""

    log_std: eqx.AbstractVar[Float[Array, " A"]]

    def sample(
        self,
        key: PRNGKeyArray,
        outputs: Float[Array, "N A"],
        *,
        first_env: int | Int[Array, ""] = 0,
        total_envs: int | None = None,
    ) -> tuple[Float[Array, "N A"], Float[Array, " N"]]:
        mean = outputs
        rows = mean.shape[0] if total_envs is None else total_envs
        noise = jax.random.normal(key, (rows, mean.shape[1]), mean.dtype)
        if total_envs is not None:
            noise = jax.lax.dynamic_slice_in_dim(noise, first_env, mean.shape[0])
        action = mean + jnp.exp(self.log_std) * noise
        logprob, _ = gaussian_logprob_entropy(mean, self.log_std, action)
        return action, logprob

    def mode(self, outputs: Float[Array, "N A"]) -> Float[Array, "N A"]:
        return outputs

    @typechecked
    def log_prob_entropy(
        self, outputs: Float[Array, "B A"], actions: Float[Array, "B A"]
    ) -> tuple[Float[Array, " B"], Float[Array, " B"]]:
        return gaussian_logprob_entropy(outputs, self.log_std, actions)


def sample_actions(
    key: PRNGKeyArray,
    logits: Float[Array, "N A"],
    *,
    first_env: int | Int[Array, ""] = 0,
    total_envs: int | None = None,
) -> Int[Array, " N"]:
    """One action per row of ``logits``, as ``jax.random.categorical(key, logits)``.

    With ``total_envs``, the rows are rows ``first_env ..`` of a ``[total_envs, A]`` batch, and each gets the
    action that ``categorical`` (Gumbel-max) draws for that row of the whole batch.
    """
    if total_envs is None:
        return jax.random.categorical(key, logits).astype(jnp.int32)
    gumbel = jax.random.gumbel(key, (total_envs, logits.shape[-1]), logits.dtype)
    noise = jax.lax.dynamic_slice_in_dim(gumbel, first_env, logits.shape[0])
    return jnp.argmax(logits + noise, axis=-1).astype(jnp.int32)


def categorical_logprob_entropy(
    logits: Float[Array, "B A"], actions: Int[Array, " B"]
) -> tuple[Float[Array, " B"], Float[Array, " B"]]:
    """Log-probability of ``actions`` under softmax(logits), and the distribution's entropy."""
    log_probs = jax.nn.log_softmax(logits)
    logprob = jnp.take_along_axis(log_probs, actions[:, None], axis=1)[:, 0]
    entropy = -jnp.sum(jnp.exp(log_probs) * log_probs, axis=-1)
    return logprob, entropy


def gaussian_logprob_entropy(
    mean: Float[Array, "B A"], log_std: Float[Array, " A"], actions: Float[Array, "B A"]
) -> tuple[Float[Array, " B"], Float[Array, " B"]]:
    """Log-density of ``actions`` under the diagonal Gaussian (``mean``, ``exp(log_std)``) and its entropy, each
    summed over the action's dimensions (torch's ``Normal(...).log_prob(a).sum(1)``, ``.entropy().sum(1)``)."""
    z = (actions - mean) * jnp.exp(-log_std)
    logprob = jnp.sum(-0.5 * z * z - log_std - 0.5 * LOG_2PI, axis=-1)
    entropy = jnp.broadcast_to(jnp.sum(0.5 + 0.5 * LOG_2PI + log_std), mean.shape[:1])
    return logprob, entropy
