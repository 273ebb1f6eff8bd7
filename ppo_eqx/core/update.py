"""The PPO update: shuffle the batch each epoch, split it into minibatches, one Adam step per minibatch."""

import dataclasses
from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import optax
from jaxtyping import Array, ArrayLike, Bool, Float, Int, PRNGKeyArray, PyTree

from ..config import PPOConfig
from ._types import Batch, LossInfo
from .loss import model_loss
from .networks import ActorCritic


def learning_rate_schedule(config: PPOConfig) -> optax.Schedule:
    """CleanRL's linear annealing: constant within an iteration, from ``learning_rate`` towards 0.

    ``learning_rate`` and ``anneal_lr`` may be arrays (one agent's values in a sweep, ``PPOConfig.sweep``)."""
    steps_per_iteration = config.num_minibatches * config.update_epochs

    def schedule(count: Int[ArrayLike, ""]) -> Float[ArrayLike, ""]:
        frac = 1.0 - (jnp.asarray(count) // steps_per_iteration) / config.num_iterations
        if not isinstance(config.anneal_lr, bool):
            frac = jnp.where(config.anneal_lr, frac, 1.0)
        return config.learning_rate * frac

    return schedule if config.anneal_lr is not False else optax.constant_schedule(config.learning_rate)


def make_optimizer(config: PPOConfig) -> optax.GradientTransformation:
    """Global-norm clipping, then Adam (eps=1e-5) with the learning rate as an inspectable hyperparameter."""
    return optax.chain(
        optax.clip_by_global_norm(config.max_grad_norm),
        optax.inject_hyperparams(optax.adam)(learning_rate=learning_rate_schedule(config), eps=1e-5),
    )


Hyperparameters = dict[str, Array]
"""Swept hyperparameters by field name: ``[A]`` arrays over the agents, or one agent's scalars."""


def agent_hyperparameters(config: PPOConfig) -> Hyperparameters:
    """Each swept hyperparameter of ``config`` as an ``[A]`` array over its ``num_agents`` agents (float32, or
    bool for the flags); ``{}`` without a sweep."""
    kinds = {field.name: field.type for field in dataclasses.fields(PPOConfig)}
    return {
        name: jnp.asarray(values, dtype=jnp.bool_ if kinds[name] is bool else jnp.float32)
        for name, values in config.agent_values().items()
    }


OptimizerFor = Callable[[PPOConfig], optax.GradientTransformation]
"""The optimizer of one agent's config (``update.make_optimizer``); its hyperparameters may be arrays."""
OPTIMIZER_FIELDS = ("learning_rate", "anneal_lr", "max_grad_norm")
"""The swept fields that ``make_optimizer`` reads."""


def swept_optimizer_fields(config: PPOConfig) -> list[str]:
    """The ``OPTIMIZER_FIELDS`` that ``config.sweep`` varies: each agent then needs its own optimizer."""
    return [name for name, _ in config.sweep if name in OPTIMIZER_FIELDS]


def current_learning_rate(opt_state: PyTree) -> Float[Array, ""]:
    """The learning rate that the last Adam step used (from ``make_optimizer``'s state)."""
    return opt_state[1].hyperparams["learning_rate"]


def minibatch_indices(
    batch_size: int, *, num_minibatches: int, update_epochs: int, key: PRNGKeyArray
) -> Int[Array, "EM mb"]:
    """A fresh permutation of the batch each epoch, split into ``num_minibatches`` rows (epoch-major)."""
    keys = jax.random.split(key, update_epochs)
    permutations = jax.vmap(lambda k: jax.random.permutation(k, batch_size))(keys)
    return permutations.reshape(update_epochs * num_minibatches, batch_size // num_minibatches)


LossFn = Callable[[PyTree, Batch], tuple[Float[Array, ""], LossInfo]]


def params_loss(
    static: PyTree,
    *,
    clip_coef: float | Float[Array, ""],
    vf_coef: float | Float[Array, ""],
    ent_coef: float | Float[Array, ""],
    norm_adv: bool | Bool[Array, ""],
    clip_vloss: bool | Bool[Array, ""],
) -> LossFn:
    """``model_loss`` as a function of the model's arrays (``static`` is the rest, from ``eqx.partition``), on
    minibatches whose observations are already ``prepare``d."""

    def loss_fn(params: PyTree, minibatch: Batch) -> tuple[Float[Array, ""], LossInfo]:
        return model_loss(
            eqx.combine(params, static),
            minibatch,
            clip_coef=clip_coef,
            vf_coef=vf_coef,
            ent_coef=ent_coef,
            norm_adv=norm_adv,
            clip_vloss=clip_vloss,
            prepared=True,
        )

    return loss_fn


def minibatch_steps(
    loss_fn: LossFn,
    params: PyTree,
    opt_state: PyTree,
    batch: Batch,
    indices: Int[Array, "EM mb"],
    *,
    optimizer: optax.GradientTransformation,
    unroll: int = 1,
    advantages: Float[Array, "EM mb"] | None = None,
    reduce_grads: Callable[[PyTree], PyTree] | None = None,
) -> tuple[PyTree, PyTree, LossInfo]:
    """One optimizer step on ``loss_fn`` per row of ``indices`` (the rows of ``batch`` in that minibatch), in a
    ``lax.scan`` with ``unroll``. Returns the parameters, optimizer state and every step's diagnostics.

    ``advantages``, if given, replace each minibatch's own (row k's for step k); ``reduce_grads`` is applied
    to the gradients before the optimizer step (the data-parallel update averages them across devices).
    """

    def step(
        carry: tuple[PyTree, PyTree], xs: tuple[Int[Array, " mb"], Float[Array, " mb"] | None]
    ) -> tuple[tuple[PyTree, PyTree], LossInfo]:
        params, opt_state = carry
        index, step_advantages = xs
        # The rows are a permutation, always in bounds: "clip" is XLA's own gather, where jnp's default ("fill")
        # adds a select over every gathered frame.
        minibatch = jax.tree.map(lambda x: jnp.take(x, index, axis=0, mode="clip"), batch)
        if step_advantages is not None:
            minibatch = minibatch._replace(advantages=step_advantages)
        (_, info), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, minibatch)
        if reduce_grads is not None:
            grads = reduce_grads(grads)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), info

    (params, opt_state), infos = jax.lax.scan(step, (params, opt_state), (indices, advantages), unroll=unroll)
    return params, opt_state, infos


def update(
    model: ActorCritic,
    opt_state: PyTree,
    batch: Batch,
    *,
    optimizer: optax.GradientTransformation,
    num_minibatches: int,
    update_epochs: int,
    clip_coef: float | Float[Array, ""],
    vf_coef: float | Float[Array, ""],
    ent_coef: float | Float[Array, ""],
    norm_adv: bool | Bool[Array, ""] = True,
    clip_vloss: bool | Bool[Array, ""] = False,
    unroll: int = 1,
    key: PRNGKeyArray,
) -> tuple[ActorCritic, PyTree, LossInfo]:
    """``update_epochs`` passes over ``batch`` in ``num_minibatches`` minibatches, one optimizer step each.

    Returns the new model and optimizer state, and the loss diagnostics of every step, shaped
    ``[update_epochs * num_minibatches]`` (epoch-major). The steps run in one ``lax.scan`` with ``unroll``.
    """
    # Relayout the observations once for all epochs (a no-op for vector observations).
    batch = batch._replace(obs=model.prepare(batch.obs))
    params, static = eqx.partition(model, eqx.is_array)
    indices = minibatch_indices(
        batch.actions.shape[0], num_minibatches=num_minibatches, update_epochs=update_epochs, key=key
    )

    loss_fn = params_loss(
        static, clip_coef=clip_coef, vf_coef=vf_coef, ent_coef=ent_coef, norm_adv=norm_adv, clip_vloss=clip_vloss
    )
    params, opt_state, infos = minibatch_steps(
        loss_fn, params, opt_state, batch, indices, optimizer=optimizer, unroll=unroll
    )
    return eqx.combine(params, static), opt_state, infos
