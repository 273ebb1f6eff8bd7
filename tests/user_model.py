"""A model and an optimizer of the user's (issue 51), as a user would write them outside ppo_eqx: a policy that
subclasses the abstract ``CategoricalPolicy`` (no concrete model of ppo_eqx's), a factory ``(spec, key) -> model``,
and an optimizer factory ``(hyperparameters, sizes) -> optax.GradientTransformation``. The tests' stand-ins for
``--network MODULE:CALLABLE`` and ``--optimizer MODULE:CALLABLE`` (``tests/test_user_model.py``)."""

import math

import equinox as eqx
import jax
import jax.numpy as jnp
import optax

from ppo_eqx import CategoricalPolicy

HIDDEN = 32


class TinyPolicy(CategoricalPolicy):
    """One hidden layer of ``HIDDEN`` tanh units shared by a linear actor and critic."""

    hidden: eqx.nn.Linear
    actor: eqx.nn.Linear
    critic: eqx.nn.Linear
    obs_shape: tuple[int, ...] = eqx.field(static=True)

    def __init__(self, obs_shape, num_actions, *, key):
        hidden_key, actor_key, critic_key = jax.random.split(key, 3)
        self.obs_shape = tuple(obs_shape)
        self.hidden = eqx.nn.Linear(math.prod(obs_shape), HIDDEN, key=hidden_key)
        self.actor = eqx.nn.Linear(HIDDEN, num_actions, key=actor_key)
        self.critic = eqx.nn.Linear(HIDDEN, 1, key=critic_key)

    @property
    def num_actions(self) -> int:
        return int(self.actor.out_features)

    def __call__(self, obs, *, prepared=False):
        x = jnp.tanh(jax.vmap(self.hidden)(obs.reshape(obs.shape[0], -1).astype(jnp.float32)))
        return jax.vmap(self.actor)(x), jax.vmap(self.critic)(x)[:, 0]


def make_tiny(spec, key):
    """What ``--network tests.user_model:make_tiny`` calls."""
    return TinyPolicy(spec.obs_shape, spec.num_actions, key=key)


def sgd(hyperparameters, sizes):
    """What ``--optimizer tests.user_model:sgd`` calls: clipping, then momentum SGD at the agent's learning rate
    (no injected learning rate: its runs report none)."""
    return optax.chain(
        optax.clip_by_global_norm(hyperparameters.max_grad_norm), optax.sgd(hyperparameters.learning_rate, momentum=0.9)
    )


def not_a_policy(spec, key):
    """A factory that breaks the contract: it returns no model."""
    return {"weights": jnp.zeros(3)}


def wrong_actions(spec, key):
    """A factory that makes a model of another task's actions."""
    return TinyPolicy(spec.obs_shape, spec.num_actions + 1, key=key)


def raises(spec, key):
    raise RuntimeError("the user's factory failed")


def not_an_optimizer(hyperparameters, sizes):
    return "adam"
