"""The policy of continuous actions, as CleanRL's ``ppo_continuous_action.py`` computes it: a diagonal Gaussian
whose mean is a 64-64 tanh MLP of the observation (its last layer started at gain 0.01), whose log standard
deviation is one learned vector started at 0 (state-independent), beside a 64-64 tanh critic (gain 1).
Log-probabilities and entropies are summed over the action's dimensions.

``GaussianActorCritic`` is an ``ActorCritic`` (the functions that take a model take it too): its call gives the
mean ``[B, A]`` where the discrete model gives logits, and ``evaluate_actions`` takes float actions ``[B, A]``.
The sampled action is what the loss sees; the env backend clips it to its bounds on the way in, as CleanRL's
``ClipAction`` wrapper does."""

import math

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PRNGKeyArray, Shaped

from .checks import typechecked
from .networks import MLP, ActorCritic, NetworkInit

LOG_2PI = math.log(2 * math.pi)


class GaussianActorCritic(ActorCritic):
    """Mean ``[B, A]`` and values ``[B]`` of a batch of vector observations ``[B, D]``; ``log_std`` ``[A]``."""

    log_std: Float[Array, " A"]

    def __init__(
        self, obs_shape: tuple[int, ...], action_dim: int, *, init: NetworkInit = "cleanrl", key: PRNGKeyArray
    ):
        if len(obs_shape) != 1:
            raise ValueError(f"observation shape {obs_shape}: continuous actions take a flat vector [D]")
        if action_dim < 1:
            raise ValueError(f"action_dim={action_dim}; allowed: 1 or more")
        _, actor_key, critic_key = jax.random.split(key, 3)  # ActorCritic's split: the same keys for its MLPs
        self.torso = None
        self.actor = MLP((obs_shape[0], 64, 64, action_dim), 0.01, init=init, key=actor_key)
        self.critic = MLP((obs_shape[0], 64, 64, 1), 1.0, init=init, key=critic_key)
        self.log_std = jnp.zeros((action_dim,), jnp.float32)
        self.obs_shape, self.conv_impl = tuple(obs_shape), "matmul"

    @typechecked
    def evaluate_actions(  # pyright: ignore[reportIncompatibleMethodOverride]
        self, obs: Shaped[Array, " B *obs"], actions: Float[Array, "B A"], *, prepared: bool = False
    ) -> tuple[Float[Array, " B"], Float[Array, " B"], Float[Array, " B"]]:
        """Log-probability of ``actions`` (unclipped, as sampled), the policy's entropy and the value, each ``[B]``."""
        mean, value = self(obs, prepared=prepared)
        logprob, entropy = gaussian_logprob_entropy(mean, self.log_std, actions)
        return logprob, entropy, value

    def sample(
        self,
        key: PRNGKeyArray,
        mean: Float[Array, "N A"],
        *,
        first_env: int | Int[Array, ""] = 0,
        total_envs: int | None = None,
    ) -> tuple[Float[Array, "N A"], Float[Array, " N"]]:
        """One action per row of ``mean`` (``mean + std * normal``) and its log-probability. With ``total_envs``,
        the rows are rows ``first_env ..`` of a ``[total_envs, A]`` batch, each drawing that row's noise."""
        rows = mean.shape[0] if total_envs is None else total_envs
        noise = jax.random.normal(key, (rows, mean.shape[1]), mean.dtype)
        if total_envs is not None:
            noise = jax.lax.dynamic_slice_in_dim(noise, first_env, mean.shape[0])
        action = mean + jnp.exp(self.log_std) * noise
        logprob, _ = gaussian_logprob_entropy(mean, self.log_std, action)
        return action, logprob


def gaussian_logprob_entropy(
    mean: Float[Array, "B A"], log_std: Float[Array, " A"], actions: Float[Array, "B A"]
) -> tuple[Float[Array, " B"], Float[Array, " B"]]:
    """Log-density of ``actions`` under the diagonal Gaussian (``mean``, ``exp(log_std)``) and its entropy, each
    summed over the action's dimensions (torch's ``Normal(...).log_prob(a).sum(1)``, ``.entropy().sum(1)``)."""
    z = (actions - mean) * jnp.exp(-log_std)
    logprob = jnp.sum(-0.5 * z * z - log_std - 0.5 * LOG_2PI, axis=-1)
    entropy = jnp.broadcast_to(jnp.sum(0.5 + 0.5 * LOG_2PI + log_std), mean.shape[:1])
    return logprob, entropy
