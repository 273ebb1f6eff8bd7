"""The PPO objective and the update that descends it. The objective: ``ppo_loss`` on arrays, ``model_loss`` on a
model and a batch, and ``Loss``, what any loss that the update descends is (``model_loss`` by default; a user's own,
reporting values of its own). The update: shuffle the batch each epoch, split it into minibatches, one optimizer
step per minibatch."""

import functools
from collections.abc import Callable, Mapping
from typing import Any, Protocol, cast, runtime_checkable

import equinox as eqx
import jax
import jax.numpy as jnp
import optax
from jaxtyping import Array, ArrayLike, Float, Int, PRNGKeyArray, PyTree

from ._types import Batch, LossInfo, SequenceBatch
from .checks import check_actions, check_fields, one_agent, typechecked
from .hyperparameters import AgentHyperparameters, Sizes
from .minibatch import row_taker
from .networks import Policy
from .recurrent import RecurrentPolicy

# --- the objective ----------------------------------------------------------------------------------------------------


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


# --- the update -------------------------------------------------------------------------------------------------------


def learning_rate_schedule(hyperparameters: AgentHyperparameters, sizes: Sizes) -> optax.Schedule:
    """CleanRL's linear annealing: constant within an iteration, from ``learning_rate`` towards 0 over
    ``sizes.num_iterations`` (constant without ``anneal_lr``)."""
    steps_per_iteration = sizes.num_minibatches * sizes.update_epochs

    def schedule(count: Int[ArrayLike, ""]) -> Float[ArrayLike, ""]:
        frac = 1.0 - (jnp.asarray(count) // steps_per_iteration) / sizes.num_iterations
        return hyperparameters.learning_rate * jnp.where(hyperparameters.anneal_lr, frac, 1.0)

    return schedule


OptimizerFactory = Callable[[AgentHyperparameters, Sizes], optax.GradientTransformation]
"""``optimizer(hyperparameters, sizes)``: one agent's ``optax.GradientTransformation`` from its hyperparameters (arrays:
a sweep's agents each have their own) and the run's sizes; called inside the iteration (its state is the agent's, in
every checkpoint). ``make_optimizer`` (CleanRL's) is one; ``PPOConfig.optimizer`` names one of the user's."""


def make_optimizer(hyperparameters: AgentHyperparameters, sizes: Sizes) -> optax.GradientTransformation:
    """One agent's optimizer: global-norm clipping at ``max_grad_norm``, then Adam (eps=1e-5) whose learning rate,
    ``learning_rate_schedule``, is injected state (read back by ``current_learning_rate``). Built inside the
    iteration from the agent's arrays, so that every agent of a program has its own."""
    return optax.chain(
        optax.clip_by_global_norm(hyperparameters.max_grad_norm),
        optax.inject_hyperparams(optax.adam)(learning_rate=learning_rate_schedule(hyperparameters, sizes), eps=1e-5),
    )


def current_learning_rate(opt_state: PyTree) -> Float[Array, ""] | None:
    """The learning rate that the last step used, where the optimizer's state holds one as an injected
    hyperparameter (``make_optimizer``'s does: ``optax.inject_hyperparams``); None where it holds none (an optimizer
    of the user's without one: its runs report no ``learning_rate``)."""

    def injected(node: Any) -> bool:  # optax's InjectHyperparamsState (and its stateful kin) hold ``hyperparams``
        return isinstance(getattr(node, "hyperparams", None), Mapping) and "learning_rate" in node.hyperparams

    states = [node for node in jax.tree.leaves(opt_state, is_leaf=injected) if injected(node)]
    return states[0].hyperparams["learning_rate"] if states else None


def minibatch_indices(
    batch_size: int, *, num_minibatches: int, update_epochs: int, key: PRNGKeyArray
) -> Int[Array, "EM mb"]:
    """A fresh permutation of the batch each epoch, split into ``num_minibatches`` rows (epoch-major)."""
    keys = jax.random.split(key, update_epochs)
    permutations = jax.vmap(lambda k: jax.random.permutation(k, batch_size))(keys)
    return permutations.reshape(update_epochs * num_minibatches, batch_size // num_minibatches)


LossFn = Callable[[PyTree, Any], tuple[Float[Array, ""], Any]]


def params_loss(static: PyTree, hyperparameters: AgentHyperparameters, loss: Loss = model_loss) -> LossFn:
    """``loss`` as a function of the model's arrays (``static`` is the rest, from ``eqx.partition``), on
    minibatches whose observations are already ``prepare``d. What it reports has a ``loss``: the scalar it returns,
    where a mapping it reports has none."""

    def loss_fn(params: PyTree, minibatch: Batch | SequenceBatch) -> tuple[Float[Array, ""], Any]:
        value, info = loss(eqx.combine(params, static), minibatch, hyperparameters, prepared=True)
        if isinstance(info, Mapping) and "loss" not in info:
            info = {"loss": value, **info}
        return value, info

    return loss_fn


def minibatch_steps(
    loss_fn: LossFn,
    params: PyTree,
    opt_state: PyTree,
    batch: Batch | SequenceBatch,
    indices: Int[Array, "EM mb"],
    *,
    optimizer: optax.GradientTransformation,
    unroll: int = 1,
    advantages: Float[Array, "EM mb"] | None = None,
    reduce_grads: Callable[[PyTree], PyTree] | None = None,
    select: Callable[[Any, Array], Any] | None = None,
) -> tuple[PyTree, PyTree, LossInfo | Any]:
    """One optimizer step on ``loss_fn`` per row of ``indices`` (the rows of ``batch`` in that minibatch), in a
    ``lax.scan`` with ``unroll``. Returns the parameters, optimizer state and what the loss reported at every step.

    ``advantages``, if given, replace each minibatch's own (row k's for step k); ``reduce_grads`` is applied
    to the gradients before the optimizer step (the data-parallel update averages them across devices);
    ``select(batch, index)`` is a minibatch (default: the rows ``index`` of every field, ``row_taker``).
    """
    take = row_taker(batch) if select is None else functools.partial(select, batch)

    def step(
        carry: tuple[PyTree, PyTree], xs: tuple[Int[Array, " mb"], Float[Array, " mb"] | None]
    ) -> tuple[tuple[PyTree, PyTree], LossInfo | Any]:
        params, opt_state = carry
        index, step_advantages = xs
        minibatch = take(index)
        if step_advantages is not None:
            minibatch = minibatch._replace(advantages=step_advantages)
        (_, info), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, minibatch)
        if reduce_grads is not None:
            grads = reduce_grads(grads)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), info

    (params, opt_state), infos = jax.lax.scan(step, (params, opt_state), (indices, advantages), unroll=unroll)
    return params, opt_state, infos


@typechecked
def update(
    model: Policy,
    opt_state: PyTree,
    batch: Batch,
    hyperparameters: AgentHyperparameters,
    *,
    sizes: Sizes,
    loss: Loss = model_loss,
    optimizer: OptimizerFactory = make_optimizer,
    key: PRNGKeyArray,
) -> tuple[Policy, PyTree, LossInfo | Any]:
    """``sizes.update_epochs`` passes over ``batch`` in ``sizes.num_minibatches`` minibatches, one step each of
    the agent's ``optimizer`` (default CleanRL's, ``make_optimizer``) on ``loss`` (default CleanRL's,
    ``model_loss``; any ``Loss``), both with ``hyperparameters``.

    Returns the new model and optimizer state, and what the loss reported at every step (``LossInfo`` for
    ``model_loss``), each value shaped ``[update_epochs * num_minibatches]`` (epoch-major). The steps run in one
    ``lax.scan`` with ``sizes.minibatch_unroll``.
    """
    _check_update(model, batch, hyperparameters, sizes)
    # Relayout the observations once for all epochs (a no-op for vector observations).
    batch = batch._replace(obs=model.prepare(batch.obs))
    params, static = eqx.partition(model, eqx.is_array)
    indices = minibatch_indices(
        batch.actions.shape[0], num_minibatches=sizes.num_minibatches, update_epochs=sizes.update_epochs, key=key
    )
    params, opt_state, infos = minibatch_steps(
        params_loss(static, hyperparameters, loss),
        params,
        opt_state,
        batch,
        indices,
        optimizer=optimizer(hyperparameters, sizes),
        unroll=sizes.minibatch_unroll,
    )
    return eqx.combine(params, static), opt_state, infos


def sequence_update(
    model: RecurrentPolicy,
    opt_state: PyTree,
    batch: SequenceBatch,
    hyperparameters: AgentHyperparameters,
    *,
    sizes: Sizes,
    loss: Loss = model_loss,
    optimizer: OptimizerFactory = make_optimizer,
    key: PRNGKeyArray,
) -> tuple[RecurrentPolicy, PyTree, LossInfo | Any]:
    """``update`` of a recurrent policy on whole env sequences (CleanRL's ``ppo_atari_lstm.py``): each epoch the N
    envs of the time-major ``batch`` are shuffled and split into ``num_minibatches`` groups, and each minibatch is
    its envs' whole ``[T, n]`` sequences with the memory they started from, which ``loss`` replays
    (``RecurrentPolicy.evaluate_sequences``)."""
    num_envs = batch.actions.shape[1]
    if sizes.update_epochs < 1 or sizes.num_minibatches < 1 or num_envs % sizes.num_minibatches:
        raise ValueError(
            f"sequence_update: num_minibatches={sizes.num_minibatches} must divide the {num_envs} envs (minibatches "
            f"are whole env sequences), update_epochs={sizes.update_epochs} at least 1"
        )
    one_agent(hyperparameters, "sequence_update")
    batch = batch._replace(obs=model.sequence_prepare(batch.obs))
    params, static = eqx.partition(model, eqx.is_array)
    indices = minibatch_indices(
        num_envs, num_minibatches=sizes.num_minibatches, update_epochs=sizes.update_epochs, key=key
    )

    def select(batch: SequenceBatch, envs: Int[Array, " n"]) -> SequenceBatch:
        def columns(x: Array) -> Array:
            return jnp.take(x, envs, axis=1, mode="clip")

        memory = jax.tree.map(lambda x: jnp.take(x, envs, axis=0, mode="clip"), batch.memory)
        return SequenceBatch(*(columns(x) for x in batch[:-1]), memory)  # type: ignore[arg-type]

    params, opt_state, infos = minibatch_steps(
        params_loss(static, hyperparameters, loss),
        params,
        opt_state,
        batch,
        indices,
        optimizer=optimizer(hyperparameters, sizes),
        unroll=sizes.minibatch_unroll,
        select=select,
    )
    return eqx.combine(params, static), opt_state, infos


def _check_update(model: Policy, batch: Batch, hyperparameters: AgentHyperparameters, sizes: Sizes) -> None:
    """What ``update``'s annotations cannot say: the batch's fields, its observations against the model's, the
    actions within the model's (when known), and minibatches that split the batch."""
    if sizes.update_epochs < 1:
        raise ValueError(f"update: sizes.update_epochs={sizes.update_epochs}; allowed: 1 or more")
    if sizes.num_minibatches < 1:
        raise ValueError(f"update: sizes.num_minibatches={sizes.num_minibatches}; allowed: 1 or more")
    check_fields(batch, "batch", "update")
    if tuple(batch.obs.shape[1:]) != model.obs_shape:
        raise ValueError(
            f"update: batch.obs has shape {list(batch.obs.shape)}; allowed: [B, {', '.join(map(str, model.obs_shape))}]"
            " (the model's observations)"
        )
    size = batch.actions.shape[0]
    if size % sizes.num_minibatches:
        raise ValueError(
            f"update: sizes.num_minibatches={sizes.num_minibatches} does not divide the batch of {size}; allowed: "
            f"a divisor of {size}"
        )
    if batch.actions.ndim == 1:  # discrete: each in the model's range (continuous actions are any real)
        check_actions(batch.actions, model.num_actions, "update", "batch.actions")
    one_agent(hyperparameters, "update")
