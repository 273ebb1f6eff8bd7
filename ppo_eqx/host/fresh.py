"""A fresh run's state: its agents (``fresh_agents``) and the checkpoint it would be saved as at iteration 0
(``init_checkpoint``), which loading a checkpoint also builds, without running anything, as the tree its arrays
load into (``checkpoint.load_checkpoint``)."""

from typing import cast

import equinox as eqx
import jax.numpy as jnp

from ..config import PPOConfig
from ..core.envs import EnvBackend, EnvSpec, backend
from ..core.networks import ConvRoute, NetworkInit
from ..core.state import Checkpoint, init_agents
from .pools import EnvShare, make_collector, pool_env_seeds


def fresh_agents(config: PPOConfig, spec: EnvSpec, *, conv_impl: ConvRoute) -> Checkpoint:
    """A fresh run's agents at iteration 0 (``core.state.init_agents``), agent k initialised as the single run of
    ``config.agent_configs()[k]``, with fresh episode statistics as their ``envs``."""
    seeds = config.seed if config.num_agents == 1 else jnp.asarray([agent.seed for agent in config.agent_configs()])
    return init_agents(
        spec,
        config.agent_hyperparameters(),
        seeds,
        num_envs=config.num_envs,
        sizes=config.sizes,
        conv_impl=conv_impl,
        network_init=cast(NetworkInit, config.network_init),  # validate() allows only NETWORK_INITS
    )


def init_checkpoint(
    config: PPOConfig, spec: EnvSpec, *, conv_impl: ConvRoute, env_backend: EnvBackend | None = None
) -> Checkpoint:
    """A fresh run's checkpoint: its agents (``fresh_agents``) with what a checkpoint keeps of its envs, the
    episode statistics or, where the backend's env state is data (default: ``config.env_backend``'s), the carry of
    the run's first envs. Under ``eqx.filter_eval_shape`` the "like" tree that a checkpoint loads into (making
    gymnax's envs is pure: nothing runs)."""
    checkpoint = fresh_agents(config, spec, conv_impl=conv_impl)
    env_backend = env_backend or backend(config.env_backend)
    if not env_backend.state_is_data:
        return checkpoint
    _, collector = make_collector(env_backend, config, pool_env_seeds(config, 0), EnvShare())
    return eqx.tree_at(lambda c: c.envs, checkpoint, collector.save(collector.carry(checkpoint.envs)))
