"""A run's envs and its fresh state. The envs: the seeds of a pool's envs (``pool_env_seeds``), which of them this
process steps (``EnvShare``), and a pool with the collector that fits it (``make_collector``). The state: its
agents (``fresh_agents``) and the checkpoint it would be saved as at iteration 0 (``init_checkpoint``), which
loading a checkpoint also builds, without running anything, as the tree its arrays load into
(``checkpoint.load_checkpoint``)."""

import functools
import os
from typing import Any, NamedTuple, cast

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Int

from ..config import PPOConfig
from ..core.collect import Collector, InitialMemory, async_collector, jax_env_collector, sync_collector
from ..core.envs import AsyncPool, EnvBackend, EnvSpec, EnvThreads, Pool, segment_env_seeds
from ..core.envs.normalize import check_normalizable, normalize_pool
from ..core.hyperparameters import AgentHyperparameters
from ..core.networks import ConvRoute, NetworkInit
from ..core.recurrent import RecurrentPolicy
from ..core.state import Checkpoint, ModelFactory, init_agents
from ..core.update import OptimizerFactory, make_optimizer
from ..errors import ConfigError
from ..settings import Sizes
from .compiled import OwnJit, own_jit
from .host_cpu import on_the_host_cpu
from .named import backend_named

# --- the envs ---------------------------------------------------------------------------------------------------------


class EnvShare(NamedTuple):
    """Which envs of the run this process steps: ``count`` from ``first`` (all of them when ``count`` is None);
    ``total`` is the run's number when it is more (see ``rollout``'s ``total_envs``)."""

    first: int = 0
    count: int | None = None
    total: int | None = None


def pool_env_seeds(config: PPOConfig, iteration: int) -> list[int]:
    """Seeds of the ``num_agents * num_envs`` envs of one pool that play from ``iteration`` on: agent k's
    ``num_envs`` envs come k-th, with the seeds that its single run (``config.agent_configs()[k]``) gives them."""
    return [s for agent in config.agent_configs() for s in segment_env_seeds(agent.seed, iteration, config.num_envs)]


def env_threads(config: PPOConfig, num_envs: int, *, sharing: int = 1) -> EnvThreads:
    """The threads that step a pool of ``num_envs`` envs: ``config.num_threads``, or where it is 0 one per env, at
    most one per core this process may run on (EnvPool's own default counts every core of the machine, those a
    container or ``taskset`` withholds too), each of ``sharing`` pools that step at once taking its share of the
    cores; pinned from ``config.thread_affinity_offset`` on."""
    count = config.num_threads or min(num_envs, max(1, len(os.sched_getaffinity(0)) // sharing))
    return EnvThreads(min(count, num_envs), config.thread_affinity_offset)


def make_collector(
    env_backend: EnvBackend, config: PPOConfig, seeds: list[int], share: EnvShare, memory: InitialMemory | None = None
) -> tuple[Pool | AsyncPool, Collector]:
    """A pool of ``seeds`` envs and its collector: EnvPool's async one when ``config.async_batch_size`` > 0,
    ``jax_env_collector`` where the backend's env state is data, else ``sync_collector``; for a recurrent policy
    (its ``initial_memory``: ``memory``) a carry with a memory per env (the async pool has none: refused)."""
    if memory is not None and config.async_batch_size:
        raise ConfigError(
            f"async_batch_size={config.async_batch_size} with a recurrent network ({config.network}): its "
            "receives come in no fixed order of envs; allowed: 0"
        )
    threads = env_threads(config, len(seeds))
    if config.async_batch_size:
        pool = env_backend.make_async(config.env_id, seeds, config.async_batch_size, threads=threads)
        return pool, async_collector(pool, num_steps=config.num_steps)
    pool = env_backend.make(config.env_id, seeds, threads=threads)
    raw, renormalize = pool, None
    if config.normalize_obs or config.normalize_reward:
        check_normalizable(config.normalize_obs, config.normalize_reward, pool.spec, config.async_batch_size)
        settings = {
            "gamma": config.gamma,
            "obs": config.normalize_obs,
            "reward": config.normalize_reward,
            "num_agents": config.num_agents,
            "shared": not env_backend.state_is_data,
        }
        pool = normalize_pool(raw, **settings)
        renormalize = None if env_backend.state_is_data else lambda saved: normalize_pool(raw, **settings, start=saved)
    if env_backend.state_is_data:
        collector = jax_env_collector(
            pool,
            num_steps=config.num_steps,
            num_agents=config.num_agents,
            bootstrap_truncated=config.bootstrap_truncated,
            memory=memory,
        )
        return pool, collector
    collector = sync_collector(
        pool,
        num_steps=config.num_steps,
        num_agents=config.num_agents,
        first_env=share.first,
        total_envs=share.total,
        bootstrap_truncated=config.bootstrap_truncated,
        renormalize=renormalize,
        memory=memory,
    )
    return pool, collector


# --- the fresh state --------------------------------------------------------------------------------------------------


def fresh_agents(
    config: PPOConfig,
    spec: EnvSpec,
    *,
    conv_impl: ConvRoute,
    model: ModelFactory | None = None,
    optimizer: OptimizerFactory = make_optimizer,
) -> Checkpoint:
    """A fresh run's agents at iteration 0 (``core.state.init_agents``), agent k initialised as the single run of
    ``config.agent_configs()[k]``, with fresh episode statistics as their ``envs``: each a ``model`` (default
    ppo_eqx's, ``default_model``) with the state of its ``optimizer``.

    One agent's are computed as one compiled program, the same bits as its operations run one at a time
    (``tests/test_checkpoint.py``), where each of a few dozen operations would be compiled on its own first (a short
    run's start: docs/performance.md). Several agents' are computed operation by operation: in one
    program, their orthogonal initialisations' batched LAPACK QR factorisations can run at the same time, and
    jaxlib 0.10's CPU LAPACK splits a large batch over XLA's intra-op threads and waits for it from inside one, so
    that on 2 cores both threads can end up waiting (a deadlock; docs/performance.md). One matrix at a time, as one
    agent's are, it computes inline."""
    return on_the_host_cpu(lambda: _fresh_agents(config, spec, conv_impl, model, optimizer))


def _fresh_agents(
    config: PPOConfig,
    spec: EnvSpec,
    conv_impl: ConvRoute,
    model: ModelFactory | None,
    optimizer: OptimizerFactory,
) -> Checkpoint:
    network_init = cast(NetworkInit, config.network_init)  # validate() allows only NETWORK_INITS
    hyperparameters = config.agent_hyperparameters()
    if config.num_agents == 1:
        # One program per default device: jax traces a function again under another one (``jax.default_device``).
        device = jax.config.jax_default_device  # pyright: ignore[reportAttributeAccessIssue]
        made = (spec, config.num_envs, config.sizes, conv_impl, network_init, model, optimizer)
        program = _one_agent_program(*made, device)
        return program(jnp.asarray(config.seed, jnp.int32), hyperparameters)
    seeds = jnp.asarray([agent.seed for agent in config.agent_configs()])
    return init_agents(
        spec,
        hyperparameters,
        seeds,
        num_envs=config.num_envs,
        sizes=config.sizes,
        conv_impl=conv_impl,
        network_init=network_init,
        model=model,
        optimizer=optimizer,
    )


ONE_AGENT_PROGRAMS = 8
"""How many one-agent initialisation programs a process keeps (each a few memory maps: ``host.compiled``)."""


@functools.lru_cache(maxsize=ONE_AGENT_PROGRAMS)
def _one_agent_program(
    spec: EnvSpec,
    num_envs: int,
    sizes: Sizes,
    conv_impl: ConvRoute,
    network_init: NetworkInit,
    model: ModelFactory | None,
    optimizer: OptimizerFactory,
    device: Any,
) -> OwnJit:
    """One agent's fresh state as a program of its seed (an int32 array: ``PRNGKey`` of it is ``PRNGKey`` of the
    int) and hyperparameters, kept for the next trainer of a model like it in this process (a notebook, a test
    run), which would otherwise compile it again."""

    def fresh(seed: Int[Array, ""], hyperparameters: AgentHyperparameters) -> Checkpoint:
        return init_agents(
            spec,
            hyperparameters,
            seed,
            num_envs=num_envs,
            sizes=sizes,
            conv_impl=conv_impl,
            network_init=network_init,
            model=model,
            optimizer=optimizer,
        )

    return own_jit(fresh)


def memory_of(model: ModelFactory | None, spec: EnvSpec) -> InitialMemory | None:
    """The ``initial_memory`` of the models ``model`` makes for ``spec``, where they are recurrent
    (``core.recurrent.RecurrentPolicy``: the carry of their envs holds a memory); None otherwise (ppo_eqx's
    feedforward models). Read off the model's shape alone: nothing is computed."""
    if model is None:
        return None
    shaped = eqx.filter_eval_shape(model, spec, jax.random.key(0))
    return shaped.initial_memory if isinstance(shaped, RecurrentPolicy) else None


def init_checkpoint(
    config: PPOConfig,
    spec: EnvSpec,
    *,
    conv_impl: ConvRoute,
    env_backend: EnvBackend | None = None,
    model: ModelFactory | None = None,
    optimizer: OptimizerFactory = make_optimizer,
) -> Checkpoint:
    """A fresh run's checkpoint: its agents (``fresh_agents``) with what a checkpoint keeps of its envs, the
    episode statistics or, where the backend's env state is data (default: ``spec.source``, the env written in JAX,
    else ``config.env_backend``'s), the carry of the run's first envs; for a host pool that normalises its envs, the
    normalisation statistics too (``normalize.kept``). Under ``eqx.filter_eval_shape`` the "like"
    tree that a checkpoint loads into (making envs written in JAX is pure: nothing runs)."""
    checkpoint = fresh_agents(config, spec, conv_impl=conv_impl, model=model, optimizer=optimizer)
    env_backend = env_backend or cast(EnvBackend | None, spec.source) or backend_named(config.env_backend)
    if not env_backend.state_is_data and not (config.normalize_obs or config.normalize_reward):
        return checkpoint
    memory = memory_of(model, spec)
    _, collector = make_collector(env_backend, config, pool_env_seeds(config, 0), EnvShare(), memory)
    return eqx.tree_at(lambda c: c.envs, checkpoint, collector.save(collector.carry(checkpoint.envs)))
