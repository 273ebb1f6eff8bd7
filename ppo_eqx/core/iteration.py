"""The one PPO iteration as a pure function: collect a batch, update the model (``make_iteration``), with the
state it threads (``TrainState``) and the metrics it reports; ``vmap``-ed over agents (``num_seeds`` seeds of each
setting of a sweep) when there are several.
"""

from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import optax
from jaxtyping import Array, Float, Int, PyTree

from ..config import PPOConfig
from ..host.checkpoint import AgentKeys
from ._types import EpisodeStats, LossInfo
from .collect import Carry, Collector
from .networks import ActorCritic
from .update import (
    Hyperparameters,
    OptimizerFor,
    agent_hyperparameters,
    current_learning_rate,
    swept_optimizer_fields,
    update,
)

Metrics = dict[str, Float[Array, "*S"]]
"""Scalars of one iteration; with ``num_agents`` A > 1, one per agent."""
FINITE = "finite"
"""The metric that a Trainer's compiled iteration adds: whether the model and optimizer state are free of NaN and
inf after it (read by the host loop with the other metrics, not logged)."""


class TrainState(eqx.Module):
    """Everything one iteration reads and writes. ``iteration`` counts finished iterations."""

    model: ActorCritic
    opt_state: PyTree
    carry: Carry
    key: AgentKeys
    iteration: Int[Array, ""]


def fresh_episodes(stats: EpisodeStats) -> EpisodeStats:
    """Statistics for new envs: no running episode, the last finished ones kept."""
    return stats._replace(
        episode_returns=jnp.zeros_like(stats.episode_returns),
        episode_lengths=jnp.zeros_like(stats.episode_lengths),
    )


def update_settings(config: PPOConfig) -> dict[str, Any]:
    """The keyword arguments of ``update`` (and ``parallel.sharded_update``) that ``config`` sets."""
    return {
        "num_minibatches": config.num_minibatches,
        "update_epochs": config.update_epochs,
        "clip_coef": config.clip_coef,
        "vf_coef": config.vf_coef,
        "ent_coef": config.ent_coef,
        "norm_adv": config.norm_adv,
        "clip_vloss": config.clip_vloss,
        "unroll": config.minibatch_unroll,
    }


def episode_metrics(stats: EpisodeStats) -> Metrics:
    """CleanRL's ``episodic_return`` and ``episodic_length``: the mean over envs of each env's last finished
    episode (NaN until one has finished)."""
    finished = jnp.any(jnp.isfinite(stats.returned_episode_returns))
    return {
        "episodic_return": jnp.where(finished, jnp.nanmean(stats.returned_episode_returns), jnp.nan),
        "episodic_length": jnp.where(finished, jnp.nanmean(stats.returned_episode_lengths), jnp.nan),
    }


def update_metrics(opt_state: PyTree, infos: LossInfo) -> Metrics:
    """The learning rate after the update, the last minibatch step's losses, the mean clip fraction."""
    return {
        "learning_rate": current_learning_rate(opt_state),
        "loss": infos.loss[-1],
        "policy_loss": infos.policy_loss[-1],
        "value_loss": infos.value_loss[-1],
        "entropy": infos.entropy[-1],
        "approx_kl": infos.approx_kl[-1],
        "clip_fraction": infos.clip_fraction.mean(),
    }


def make_iteration(
    config: PPOConfig, collector: Collector, optimizer: optax.GradientTransformation | OptimizerFor
) -> Callable[[TrainState], tuple[TrainState, Metrics]]:
    """The pure PPO iteration: ``collector.collect`` (``num_steps`` env steps and GAE), then ``update_epochs``
    epochs of minibatch steps.

    Metrics follow CleanRL: the losses are those of the last minibatch step, ``clip_fraction`` is the mean
    over all steps, ``episodic_return``/``episodic_length`` the mean over envs of each env's last finished
    episode (NaN until one has finished).

    With ``config.num_agents`` A > 1 (``num_seeds`` seeds of each of a sweep's settings) the collector is one
    agent's (``sync_collector(num_agents=A)``) and the iteration is that agent's ``vmap``-ed over A: the state's
    arrays carry a leading ``A`` axis except the env handle and the iteration counter, which are shared, and
    every metric is ``[A]``. Each agent's swept hyperparameters (``agent_hyperparameters``) are arrays mapped
    along with its state. ``optimizer`` is the optimizer, or, when the sweep varies one of
    ``OPTIMIZER_FIELDS``, a function from an agent's config to its optimizer (``update.make_optimizer``).
    """
    varied = swept_optimizer_fields(config)
    if isinstance(optimizer, optax.GradientTransformation) and varied:
        raise ValueError(
            f"the sweep varies the optimizer's {', '.join(varied)}: pass a function from an agent's config to its "
            "optimizer (update.make_optimizer), not one optimizer"
        )

    def iteration(state: TrainState, hyperparameters: Hyperparameters) -> tuple[TrainState, Metrics]:
        agent = config.replace(**hyperparameters) if hyperparameters else config
        agent_optimizer = optimizer if isinstance(optimizer, optax.GradientTransformation) else optimizer(agent)
        key, rollout_key, update_key = jax.random.split(state.key, 3)
        carry, batch = collector.collect(
            state.model, state.carry, rollout_key, gamma=agent.gamma, gae_lambda=agent.gae_lambda
        )
        flat = jax.tree.map(lambda x: x.reshape((-1, *x.shape[2:])), batch)
        model, opt_state, infos = update(
            state.model, state.opt_state, flat, optimizer=agent_optimizer, **update_settings(agent), key=update_key
        )
        metrics = {**episode_metrics(carry.stats), **update_metrics(opt_state, infos)}
        return TrainState(model, opt_state, carry, key, state.iteration + 1), metrics

    if config.num_agents == 1:
        return lambda state: iteration(state, {})
    return over_agents(iteration, agent_hyperparameters(config))


def agent_axes(state: TrainState) -> TrainState:
    """``vmap`` axes of a state stacked over agents: 0 for every array but the shared env handle and counter."""
    axes = jax.tree.map(lambda x: 0 if eqx.is_array(x) else None, state)
    return eqx.tree_at(lambda s: (s.carry.handle, s.iteration), axes, (None, None), is_leaf=lambda x: x is None)


def over_agents(
    iteration: Callable[[TrainState, Hyperparameters], tuple[TrainState, Metrics]],
    hyperparameters: Hyperparameters,
) -> Callable[[TrainState], tuple[TrainState, Metrics]]:
    """One agent's iteration ``vmap``-ed over the leading ``A`` axis of a stacked state (``agent_axes``) and of
    the agents' ``hyperparameters``."""

    def agents(state: TrainState) -> tuple[TrainState, Metrics]:
        axes = agent_axes(state)
        return eqx.filter_vmap(iteration, in_axes=(axes, 0), out_axes=(axes, 0))(state, hyperparameters)

    return agents


def make_prime(config: PPOConfig, collector: Collector) -> Callable[[TrainState], TrainState]:
    """``collector.prime`` of a fresh pool (the state's carry from ``collector.carry``) with the state's model;
    with ``num_agents`` A > 1, each agent's (``vmap``-ed as the iteration is)."""

    def prime(state: TrainState) -> TrainState:
        carry, key = collector.prime(state.model, state.carry, state.key)
        return TrainState(state.model, state.opt_state, carry, key, state.iteration)

    if config.num_agents == 1:
        return prime

    def agents(state: TrainState) -> TrainState:
        axes = agent_axes(state)
        return eqx.filter_vmap(prime, in_axes=(axes,), out_axes=axes)(state)

    return agents
