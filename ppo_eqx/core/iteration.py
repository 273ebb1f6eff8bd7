"""The one PPO iteration: collect a batch, update the model, as stages that every placement composes the same
way (``compose``): ``make_iteration`` runs them as one pure function on one device; the mesh placement
(``ppo_eqx.host.mesh``) runs the same stages as two programs with the batch sharded between them. With several
agents (``num_seeds`` seeds of each setting of a sweep) the iteration is one agent's, ``vmap``-ed over them.
``over_iterations`` runs many iterations in one program (envs written in JAX: up to the whole run).
"""

from collections.abc import Callable
from typing import Any, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int, PRNGKeyArray, PyTree

from ._types import Batch, EpisodeStats, SequenceBatch
from .checks import typechecked
from .collect import Carry, Collector
from .hyperparameters import AgentHyperparameters, Sizes
from .networks import Policy
from .recurrent import RecurrentPolicy
from .state import AgentKeys, TrainState
from .update import (
    Loss,
    OptimizerFactory,
    current_learning_rate,
    make_optimizer,
    model_loss,
    reported,
    sequence_update,
    update,
)

Metrics = dict[str, Float[Array, "*S"]]
"""Scalars of one iteration; with ``num_agents`` S > 1, one per agent."""
FINITE = "finite"
"""The metric that says whether the model and optimizer state are free of NaN and inf after the iteration (read
by the host loop with the other metrics, not logged)."""


@eqx.filter_jit
def all_finite(tree: PyTree) -> Bool[Array, ""]:
    """True when every floating-point leaf of ``tree`` is finite (no NaN, no inf)."""
    leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.inexact)]
    return jnp.all(jnp.stack(leaves)) if leaves else jnp.asarray(True)


class Collected(NamedTuple):
    """What the collect stage hands on: the envs' carry, the time-major batch ``[T, N, ...]`` with its advantages
    and returns, the state's next key and the key of the update."""

    carry: Carry
    batch: Batch | SequenceBatch
    key: AgentKeys
    update_key: PRNGKeyArray


def collect(
    model: Policy, carry: Carry, key: PRNGKeyArray, hyperparameters: AgentHyperparameters, *, collector: Collector
) -> Collected:
    """The first stage: split the key (into the next key, the rollout's and the update's: the order is part of a
    run), play ``num_steps`` steps and compute GAE with the agent's ``gamma`` and ``gae_lambda``."""
    key, rollout_key, update_key = jax.random.split(key, 3)
    h = hyperparameters
    carry, batch = collector.collect(model, carry, rollout_key, gamma=h.gamma, gae_lambda=h.gae_lambda)
    return Collected(carry, batch, key, update_key)


Update = Callable[
    [Policy, PyTree, Batch | SequenceBatch, AgentHyperparameters, PRNGKeyArray], tuple[Policy, PyTree, Any]
]
"""``update(model, opt_state, batch, hyperparameters, key) -> (model, opt_state, infos)`` on a time-major batch:
``one_device_update`` or the mesh's sharded update; ``infos`` what the loss reported at every step."""


def one_device_update(sizes: Sizes, loss: Loss = model_loss, optimizer: OptimizerFactory = make_optimizer) -> Update:
    """``update`` (descending ``loss`` with ``optimizer``) of the batch flattened to ``[T*N, ...]``."""

    def one_device(
        model: Policy,
        opt_state: PyTree,
        batch: Batch | SequenceBatch,
        hyperparameters: AgentHyperparameters,
        key: PRNGKeyArray,
    ) -> tuple[Policy, PyTree, Any]:
        if isinstance(batch, SequenceBatch):  # a recurrent policy's: whole env sequences
            assert isinstance(model, RecurrentPolicy)
            sequences = dict(sizes=sizes, loss=loss, optimizer=optimizer, key=key)
            return sequence_update(model, opt_state, batch, hyperparameters, **sequences)  # type: ignore[arg-type]
        flat = jax.tree.map(lambda x: x.reshape((-1, *x.shape[2:])), batch)
        return update(model, opt_state, flat, hyperparameters, sizes=sizes, loss=loss, optimizer=optimizer, key=key)

    return one_device


def learn(
    model: Policy,
    opt_state: PyTree,
    batch: Batch | SequenceBatch,
    hyperparameters: AgentHyperparameters,
    key: PRNGKeyArray,
    *,
    update: Update,
) -> tuple[Policy, PyTree, Metrics]:
    """The second stage: ``update``, then its metrics (CleanRL's: the learning rate after the update, where the
    optimizer's state holds one, then every value the loss reported, ``loss_metrics``) and ``FINITE``."""
    model, opt_state, infos = update(model, opt_state, batch, hyperparameters, key)
    learning_rate = current_learning_rate(opt_state)
    metrics = {**({} if learning_rate is None else {"learning_rate": learning_rate}), **loss_metrics(infos)}
    return model, opt_state, {**metrics, FINITE: all_finite((model, opt_state))}


def loss_metrics(infos: Any) -> Metrics:
    """What a loss reported at every minibatch step (``core.update.reported`` of each value ``[E*M]``), as CleanRL
    reports its losses: the last step's value, and the mean over the steps of ``clip_fraction``."""
    stacked = infos._asdict() if hasattr(infos, "_asdict") else dict(infos)
    reported(jax.tree.map(lambda x: x[-1], stacked))  # names and shapes checked, as one step's
    return {name: value.mean() if name == "clip_fraction" else value[-1] for name, value in stacked.items()}


def episode_metrics(stats: EpisodeStats) -> Metrics:
    """CleanRL's ``episodic_return`` and ``episodic_length``: the mean over envs of each env's last finished
    episode (NaN until one has finished)."""
    finished = jnp.any(jnp.isfinite(stats.returned_episode_returns))
    return {
        "episodic_return": jnp.where(finished, jnp.nanmean(stats.returned_episode_returns), jnp.nan),
        "episodic_length": jnp.where(finished, jnp.nanmean(stats.returned_episode_lengths), jnp.nan),
    }


Iteration = Callable[[TrainState], tuple[TrainState, Metrics]]


def compose(
    collect_stage: Callable[[TrainState], Collected],
    learn_stage: Callable[[TrainState, Collected], tuple[Policy, PyTree, Metrics]],
    episode_stats: Callable[[EpisodeStats], EpisodeStats] = lambda stats: stats,
) -> Iteration:
    """The iteration from its two stages: ``collect_stage`` (``collect``), then ``learn_stage`` (``learn``) on the
    collected batch; the metrics are ``episode_metrics`` of the carry's statistics (as ``episode_stats`` gives
    them: every process's envs, on a mesh), then ``learn``'s."""

    def iteration(state: TrainState) -> tuple[TrainState, Metrics]:
        collected = collect_stage(state)
        model, opt_state, learned = learn_stage(state, collected)
        metrics = {**episode_metrics(episode_stats(collected.carry.stats)), **learned}
        next_state = TrainState(
            model, opt_state, collected.carry, collected.key, state.iteration + 1, state.hyperparameters
        )
        return next_state, metrics

    return iteration


Chunk = Callable[[TrainState, Int[Array, ""]], tuple[TrainState, Metrics]]
"""``chunk(state, count) -> (state, metrics)``: ``count`` iterations in one program, each metric ``[K, *S]``."""


def over_iterations(iteration: Iteration, length: int) -> Chunk:
    """Up to ``length`` iterations as one pure function: ``chunk(state, count)`` runs ``count`` of them (an int32
    array from 1 to ``length``: one program runs any number) in a ``lax.fori_loop``, the state threaded through.

    Every metric gains a leading axis of ``length`` rows: row i holds iteration i of the chunk, the rows from
    ``count`` on are zeros. Each iteration computes what it computes alone in this program: a run split into
    chunks elsewhere (a resumed one) gives the same results bit for bit.
    """

    def chunk(state: TrainState, count: Int[Array, ""]) -> tuple[TrainState, Metrics]:
        shapes = jax.eval_shape(iteration, state)[1]
        rows = {name: jnp.zeros((length, *x.shape), x.dtype) for name, x in shapes.items()}

        def body(i: Int[Array, ""], loop: tuple[TrainState, Metrics]) -> tuple[TrainState, Metrics]:
            state, rows = loop
            state, metrics = iteration(state)
            return state, {name: rows[name].at[i].set(metrics[name]) for name in rows}

        return jax.lax.fori_loop(0, count, body, (state, rows))

    return chunk


@typechecked
def make_iteration(
    collector: Collector, sizes: Sizes, *, loss: Loss = model_loss, optimizer: OptimizerFactory = make_optimizer
) -> Iteration:
    """The pure PPO iteration on one device: ``collect`` (``num_steps`` env steps and GAE), then ``learn``
    (``update_epochs`` epochs of minibatch steps on ``loss`` with ``optimizer``, default CleanRL's). Its metrics
    follow CleanRL's (``learn``, ``episode_metrics``), with ``FINITE`` besides.

    With ``sizes.num_agents`` S > 1 the collector is one agent's (``sync_collector(num_agents=S)``) and the
    iteration is that agent's ``vmap``-ed over S (``over_agents``): every metric is ``[S]``.
    """
    update = one_device_update(sizes, loss, optimizer)

    def collect_stage(state: TrainState) -> Collected:
        return collect(state.model, state.carry, state.key, state.hyperparameters, collector=collector)

    def learn_stage(state: TrainState, collected: Collected) -> tuple[Policy, PyTree, Metrics]:
        return learn(
            state.model, state.opt_state, collected.batch, state.hyperparameters, collected.update_key, update=update
        )

    iteration = compose(collect_stage, learn_stage)
    return iteration if sizes.num_agents == 1 else over_agents(iteration, shared_handle=collector.shared_handle)


def agent_axes(state: TrainState, *, shared_handle: bool = True) -> TrainState:
    """``vmap`` axes of a state stacked over agents: 0 for every array but the counter and, with ``shared_handle``
    (``Collector.shared_handle``: one host pool for all agents), the env handle; the hyperparameters' own
    (``AgentHyperparameters.axes``: shared ones unmapped)."""
    axes = jax.tree.map(lambda x: 0 if eqx.is_array(x) else None, state)
    if not shared_handle:
        return eqx.tree_at(lambda s: (s.iteration, s.hyperparameters), axes, (None, state.hyperparameters.axes()))
    own = (None, None, state.hyperparameters.axes())
    return eqx.tree_at(lambda s: (s.carry.handle, s.iteration, s.hyperparameters), axes, own, is_leaf=_is_none)


def _is_none(x: object) -> bool:
    return x is None


def over_agents(iteration: Iteration, *, shared_handle: bool = True) -> Iteration:
    """One agent's iteration ``vmap``-ed over the leading ``S`` axis of a stacked state (``agent_axes``)."""

    def agents(state: TrainState) -> tuple[TrainState, Metrics]:
        axes = agent_axes(state, shared_handle=shared_handle)
        return eqx.filter_vmap(iteration, in_axes=(axes,), out_axes=(axes, 0))(state)

    return agents


class Stages(NamedTuple):
    """The iteration's two stages as functions of their arrays, for a placement that compiles them apart (the
    rollout on the host's CPU, the learning on an accelerator: ``ppo_eqx.host.split``). Each is ``vmap``-ed over
    the agents when ``sizes.num_agents`` > 1, as ``make_iteration`` is; the hyperparameters come first.

    ``collect(hyperparameters, model, carry, key) -> (carry, batch, key, update_key, episode metrics)`` and
    ``learn(hyperparameters, model, opt_state, batch, update_key) -> (model, opt_state, metrics)``: together they
    compute what ``make_iteration`` computes, the metrics being the episode's and then the learning's.
    """

    collect: Callable[..., tuple[Carry, Batch | SequenceBatch, AgentKeys, PRNGKeyArray, Metrics]]
    learn: Callable[..., tuple[Policy, PyTree, Metrics]]


def make_stages(
    collector: Collector, sizes: Sizes, *, loss: Loss = model_loss, optimizer: OptimizerFactory = make_optimizer
) -> Stages:
    """``make_iteration``'s two stages apart (``Stages``)."""
    update = one_device_update(sizes, loss, optimizer)

    def collect_stage(
        hyperparameters: AgentHyperparameters, model: Policy, carry: Carry, key: PRNGKeyArray
    ) -> tuple[Carry, Batch | SequenceBatch, PRNGKeyArray, PRNGKeyArray, Metrics]:
        collected = collect(model, carry, key, hyperparameters, collector=collector)
        metrics = episode_metrics(collected.carry.stats)
        return collected.carry, collected.batch, collected.key, collected.update_key, metrics

    def learn_stage(
        hyperparameters: AgentHyperparameters,
        model: Policy,
        opt_state: PyTree,
        batch: Batch | SequenceBatch,
        key: PRNGKeyArray,
    ) -> tuple[Policy, PyTree, Metrics]:
        return learn(model, opt_state, batch, hyperparameters, key, update=update)

    if sizes.num_agents == 1:
        return Stages(collect_stage, learn_stage)

    def collect_agents(
        hyperparameters: AgentHyperparameters, model: Policy, carry: Carry, key: AgentKeys
    ) -> tuple[Carry, Batch | SequenceBatch, AgentKeys, PRNGKeyArray, Metrics]:
        carry_axes = _arrays(carry)
        if collector.shared_handle:
            carry_axes = eqx.tree_at(lambda c: c.handle, carry_axes, None, is_leaf=_is_none)
        in_axes = (hyperparameters.axes(), _arrays(model), carry_axes, 0)
        out_axes = (carry_axes, 0, 0, 0, 0)
        return eqx.filter_vmap(collect_stage, in_axes=in_axes, out_axes=out_axes)(hyperparameters, model, carry, key)

    def learn_agents(
        hyperparameters: AgentHyperparameters,
        model: Policy,
        opt_state: PyTree,
        batch: Batch | SequenceBatch,
        key: PRNGKeyArray,
    ) -> tuple[Policy, PyTree, Metrics]:
        in_axes = (hyperparameters.axes(), _arrays(model), _arrays(opt_state), 0, 0)
        vmapped = eqx.filter_vmap(learn_stage, in_axes=in_axes, out_axes=(_arrays(model), _arrays(opt_state), 0))
        return vmapped(hyperparameters, model, opt_state, batch, key)

    return Stages(collect_agents, learn_agents)


def _arrays(tree: PyTree) -> PyTree:
    """``vmap`` axes of a tree stacked over agents: 0 for each array, None for anything else."""
    return jax.tree.map(lambda x: 0 if eqx.is_array(x) else None, tree)


def make_prime(collector: Collector, sizes: Sizes) -> Callable[[TrainState], TrainState]:
    """``collector.prime`` of a fresh pool (the state's carry from ``collector.carry``) with the state's model;
    with ``num_agents`` S > 1, each agent's (``vmap``-ed as the iteration is)."""

    def prime(state: TrainState) -> TrainState:
        carry, key = collector.prime(state.model, state.carry, state.key)
        return eqx.tree_at(lambda s: (s.carry, s.key), state, (carry, key))

    if sizes.num_agents == 1:
        return prime

    def agents(state: TrainState) -> TrainState:
        axes = agent_axes(state, shared_handle=collector.shared_handle)
        return eqx.filter_vmap(prime, in_axes=(axes,), out_axes=axes)(state)

    return agents
