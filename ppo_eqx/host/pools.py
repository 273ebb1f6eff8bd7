"""The envs of a run: the seeds of a pool's envs (``pool_env_seeds``), which of them this process steps
(``EnvShare``), and a pool with the collector that fits it (``make_collector``)."""

import os
from typing import NamedTuple

from ..config import PPOConfig
from ..core.collect import Collector, InitialMemory, async_collector, jax_env_collector, sync_collector
from ..core.envs import AsyncPool, EnvBackend, EnvThreads, Pool, segment_env_seeds
from ..core.envs.normalize import check_normalizable, normalize_pool
from ..errors import ConfigError


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


def env_threads(config: PPOConfig, num_envs: int) -> EnvThreads:
    """The threads that step a pool of ``num_envs`` envs: ``config.num_threads``, or where it is 0 one per env, at
    most one per core this process may run on (EnvPool's own default counts every core of the machine, those a
    container or ``taskset`` withholds too); pinned from ``config.thread_affinity_offset`` on."""
    count = config.num_threads or min(num_envs, len(os.sched_getaffinity(0)))
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
