"""The policy of continuous actions, as CleanRL's ``ppo_continuous_action.py`` computes it: a diagonal Gaussian
whose mean is a 64-64 tanh MLP of the observation (its last layer started at gain 0.01), whose log standard
deviation is one learned vector started at 0 (state-independent), beside a 64-64 tanh critic (gain 1).
Log-probabilities and entropies are summed over the action's dimensions (``core.networks.GaussianPolicy``).

``GaussianActorCritic``'s call gives the mean ``[B, A]`` where the discrete model gives logits, and
``evaluate_actions`` takes float actions ``[B, A]``. The sampled action is what the loss sees; the env backend clips
it to its bounds on the way in, as CleanRL's ``ClipAction`` wrapper does."""

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, PRNGKeyArray, Shaped

from .checks import typechecked
from .networks import MLP, GaussianPolicy, NetworkInit, gaussian_logprob_entropy

__all__ = ["GaussianActorCritic", "gaussian_logprob_entropy"]


class GaussianActorCritic(GaussianPolicy):
    """Mean ``[B, A]`` and values ``[B]`` of a batch of vector observations ``[B, D]``; ``log_std`` ``[A]``."""

    actor: MLP
    critic: MLP
    log_std: Float[Array, " A"]
    obs_shape: tuple[int, ...] = eqx.field(static=True)

    def __init__(
        self, obs_shape: tuple[int, ...], action_dim: int, *, init: NetworkInit = "cleanrl", key: PRNGKeyArray
    ):
        if len(obs_shape) != 1:
            raise ValueError(f"observation shape {obs_shape}: continuous actions take a flat vector [D]")
        if action_dim < 1:
            raise ValueError(f"action_dim={action_dim}; allowed: 1 or more")
        _, actor_key, critic_key = jax.random.split(key, 3)  # ActorCritic's split: the same keys for its MLPs
        self.actor = MLP((obs_shape[0], 64, 64, action_dim), 0.01, init=init, key=actor_key)
        self.critic = MLP((obs_shape[0], 64, 64, 1), 1.0, init=init, key=critic_key)
        self.log_std = jnp.zeros((action_dim,), jnp.float32)
        self.obs_shape = tuple(obs_shape)

    @property
    def num_actions(self) -> int:
        """A: the action's dimensions."""
        return self.log_std.shape[-1]

    @typechecked
    def __call__(
        self, obs: Shaped[Array, " B *obs"], *, prepared: bool = False
    ) -> tuple[Float[Array, "B A"], Float[Array, " B"]]:
        """The mean ``[B, A]`` and the values ``[B]`` of a batch of observations (one observation: ``obs[None]``)."""
        if tuple(obs.shape[1:]) != self.obs_shape:
            raise ValueError(
                f"GaussianActorCritic takes a batch of observations [B, {self.obs_shape[0]}], not an array of shape "
                f"{list(obs.shape)}; for one observation pass obs[None]"
            )
        x = obs.astype(jnp.float32)
        return self.actor(x), self.critic(x)[:, 0]
