"""What training threads from one iteration to the next (``TrainState``), what a checkpoint keeps of it
(``Checkpoint``: the state with what the collector keeps of the envs), a fresh run's agents (``init_agents``), and
one fresh agent's whole state from a key (``init_train_state``, for the pure path without a ``Trainer``)."""

from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Int, Key, PRNGKeyArray, PyTree, UInt32

from ._types import EpisodeStats
from .collect import Carry, Collector
from .envs import EnvSpec
from .gaussian import GaussianActorCritic
from .hyperparameters import AgentHyperparameters, Hyperparameters, Sizes
from .networks import ActorCritic, ConvRoute, NetworkInit, Policy
from .rollout import init_episode_stats
from .update import OptimizerFactory, make_optimizer

AgentKeys = Key[Array, "*S"] | UInt32[Array, "*S 2"]
"""A PRNG key, or with ``num_agents`` S > 1 one per agent."""
ModelFactory = Callable[[EnvSpec, PRNGKeyArray], Policy]
"""``model(spec, key)``: a fresh model (a ``Policy``) for ``spec``'s observations and actions, started from ``key``;
pure, so that a run's agents can be made by one ``vmap``. ``default_model`` is ppo_eqx's; ``PPOConfig.network`` names
one of the user's."""


def default_model(
    spec: EnvSpec, key: PRNGKeyArray, *, conv_impl: ConvRoute = "xla", init: NetworkInit = "cleanrl"
) -> Policy:
    """ppo_eqx's model of ``spec``'s task (``network="feedforward"``): ``ActorCritic`` by the observations' kind
    (CleanRL's Nature CNN, its 64-64 MLPs, gymnax-blines' 256-256 on grids), ``GaussianActorCritic`` for continuous
    actions; its convolutions computed by ``conv_impl``, its layers started as ``init`` says."""
    if spec.continuous:
        return GaussianActorCritic(spec.obs_shape, spec.num_actions, init=init, key=key)
    return ActorCritic(spec.obs_shape, spec.num_actions, kind=spec.kind, conv_impl=conv_impl, init=init, key=key)


class TrainState(eqx.Module):
    """Everything one iteration reads and writes. ``iteration`` counts finished iterations; ``hyperparameters``
    are the agents' own (read, never changed). With S > 1 agents every array but the env handle and
    ``iteration`` has a leading ``S`` axis."""

    model: Policy
    opt_state: PyTree
    carry: Carry
    key: AgentKeys
    iteration: Int[Array, ""]
    hyperparameters: AgentHyperparameters


class Checkpoint(eqx.Module):
    """What a checkpoint holds: the training state less the hyperparameters (the checkpoint's config has them),
    with what the collector keeps of the envs (``Collector.save``).

    ``envs`` is, for a host backend (EnvPool, ALE: their env state cannot be saved), the episode statistics: the
    last finished episode of every env is kept and the running ones are dropped on restore, as the envs are made
    afresh. For a backend whose env state is data (gymnax) it is the whole rollout carry (env state, env keys,
    observations, episode statistics): a restored run goes on exactly as the uninterrupted one. With
    ``num_agents`` S > 1 every field but ``iteration`` has a leading ``S`` axis.
    """

    model: Policy
    opt_state: PyTree
    key: AgentKeys
    envs: PyTree
    iteration: Int[Array, ""]


def init_agents(
    spec: EnvSpec,
    hyperparameters: AgentHyperparameters,
    seeds: int | Int[Array, ""] | Int[Array, " S"],
    *,
    num_envs: int,
    sizes: Sizes,
    conv_impl: ConvRoute,
    network_init: NetworkInit = "cleanrl",
    model: ModelFactory | None = None,
    optimizer: OptimizerFactory = make_optimizer,
) -> Checkpoint:
    """A fresh run's model, optimizer state, key and episode statistics (as ``envs``), at iteration 0: agent k's
    from ``PRNGKey(seeds[k])`` and its ``hyperparameters``, the model from ``model`` (default: ``default_model``,
    its convolutions by ``conv_impl``, its layers started as ``network_init`` says) and the state of ``optimizer``,
    each stacked over a leading ``S`` axis when ``sizes.num_agents`` > 1 (``eqx.filter_vmap`` over the agents);
    one agent's, unstacked, otherwise (its seed an int, or a scalar int32 array: ``PRNGKey`` of either is the same).
    """

    def init(seed: int | Int[Array, ""], agent: AgentHyperparameters) -> tuple[Policy, PyTree, Array, EpisodeStats]:
        made, opt_state, key = fresh_agent(
            spec,
            agent,
            sizes,
            conv_impl=conv_impl,
            network_init=network_init,
            model=model,
            optimizer=optimizer,
            key=jax.random.PRNGKey(seed),
        )
        return made, opt_state, key, init_episode_stats(num_envs)

    if sizes.num_agents == 1:
        made, opt_state, key, stats = init(seeds, hyperparameters)
    else:
        init_agent = eqx.filter_vmap(init, in_axes=(0, hyperparameters.axes()))
        made, opt_state, key, stats = init_agent(seeds, hyperparameters)
    return Checkpoint(made, opt_state, key, stats, jnp.zeros((), jnp.int32))


def fresh_agent(
    spec: EnvSpec,
    hyperparameters: AgentHyperparameters,
    sizes: Sizes,
    *,
    conv_impl: ConvRoute = "xla",
    network_init: NetworkInit = "cleanrl",
    model: ModelFactory | None = None,
    optimizer: OptimizerFactory = make_optimizer,
    key: Key[Array, ""] | UInt32[Array, "2"],
) -> tuple[Policy, PyTree, Key[Array, ""] | UInt32[Array, "2"]]:
    """One agent's model (for ``spec``'s observations and actions: ``model``'s, default ``default_model`` with
    ``conv_impl`` and ``network_init``), its ``optimizer``'s state and the key its run goes on with, from ``key``:
    split in two, the second half starts the model."""
    key, model_key = jax.random.split(key)
    if model is None:
        made = default_model(spec, model_key, conv_impl=conv_impl, init=network_init)
    else:
        made = model(spec, model_key)
    opt_state = optimizer(hyperparameters, sizes).init(eqx.filter(made, eqx.is_array))
    return made, opt_state, key


def init_train_state(
    collector: Collector,
    spec: EnvSpec,
    hyperparameters: Hyperparameters | AgentHyperparameters,
    sizes: Sizes,
    *,
    num_envs: int,
    conv_impl: ConvRoute = "xla",
    network_init: NetworkInit = "cleanrl",
    model: ModelFactory | None = None,
    optimizer: OptimizerFactory = make_optimizer,
    key: Key[Array, ""] | UInt32[Array, "2"],
) -> TrainState:
    """One fresh agent's training state, ready for ``make_iteration(collector, sizes)``: its model, optimizer state
    and key (``fresh_agent``), the carry of ``collector``'s ``num_envs`` fresh envs, and ``hyperparameters`` (given
    as Python values, ``Hyperparameters``, or as arrays). Pure: it composes with the iteration and a
    ``lax.scan`` in one jitted program (docs/design.md, "The pure functions"). For several agents, ``vmap`` it
    over their keys (``sizes.num_agents`` stays 1 inside: ``Trainer`` does the rest)."""
    if sizes.num_agents != 1:
        raise ValueError(f"init_train_state: sizes.num_agents={sizes.num_agents}; allowed: 1 (vmap for more)")
    if isinstance(hyperparameters, Hyperparameters):
        hyperparameters = AgentHyperparameters.of([hyperparameters])
    made, opt_state, key = fresh_agent(
        spec,
        hyperparameters,
        sizes,
        conv_impl=conv_impl,
        network_init=network_init,
        model=model,
        optimizer=optimizer,
        key=key,
    )
    carry = collector.carry(init_episode_stats(num_envs))
    return TrainState(made, opt_state, carry, key, jnp.zeros((), jnp.int32), hyperparameters)
