"""``HostEnvsPlacement`` (``--rollout-on host-envs``): EnvPool's envs stepped through its host API by actor threads on
the host (``host_loop.HostLoop``), the policy's forward pass and the learning on the default device (the accelerator;
a policy of vectors acts on the host's CPU there, ``placement.act_device_for``); the route LeanRL, Sample Factory and
moolib take on a GPU, and with several actor threads (``actor_threads``) the Sebulba manner, in which Cleanba trains
on TPUs. ``auto`` takes it for continuous tasks (MuJoCo's, float64 on the host), whose step would otherwise be a call
out of the program that costs more than the step, and on a device whose programs cannot call EnvPool's XLA step (a
TPU).

Each actor steps its envs in two halves, one stepping while the policy acts for the other; after ``num_steps``
steps one program takes what the actors gathered, counts the episodes, normalises the rewards and computes GAE;
the update is the one-program run's. Normalised observations are counted and scaled by the act program as they come
back (one actor and one pool then: the statistics are the pool's). It computes what the one-program iteration
computes (``core.iteration.make_iteration``), to float32 rounding (``host_loop`` says how).
"""

import threading
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jaxtyping import PyTree

from ..config import PPOConfig
from ..core._types import EpisodeStats
from ..core.collect import Collector, no_prime, stats_of
from ..core.envs import EnvBackend, EnvSpec, HostBackend
from ..core.envs.normalize import NormalizedHandle, kept, start_statistics
from ..core.hyperparameters import AgentHyperparameters, Sizes
from ..core.iteration import Metrics, collect, episode_metrics, make_stages
from ..core.networks import Policy
from ..core.rollout import RolloutCarry, fresh_episodes
from ..core.state import Checkpoint, TrainState
from ..core.update import Loss, OptimizerFactory, make_optimizer, model_loss
from ..errors import ConfigError
from .compiled import own_jit
from .fresh import EnvShare, env_threads
from .host_loop import ActPrograms, HostLoop


def check_host_envs(config: PPOConfig, env_backend: EnvBackend, spec: EnvSpec | None = None) -> None:
    """ConfigError where ``rollout_on='host-envs'`` cannot run ``config`` with ``env_backend`` (and ``spec``'s env)."""
    said = f"rollout_on={config.rollout_on!r}"
    if not isinstance(env_backend, HostBackend):
        raise ConfigError(
            f"{said} steps envs through a host API, and env_backend={env_backend.name!r} has none; allowed: "
            "env_backend='envpool', or rollout_on='device' or 'auto'"
        )
    refused = {
        f"{config.num_agents} agents (num_seeds x sweep)": (config.num_agents > 1, "one"),
        f"async_batch_size {config.async_batch_size}": (config.async_batch_size > 0, "0"),
        "bootstrap_truncated": (config.bootstrap_truncated, "off"),
    }
    for what, (bad, allowed) in refused.items():
        if bad:
            raise ConfigError(f"{said} with {what}: not built yet; allowed: {allowed}, or rollout_on='device'")


class Normalizing(NamedTuple):
    """CleanRL's normalisation of observations and rewards (``core.envs.normalize``) as a host loop does it: the
    observations counted and scaled by ``act`` as each step comes back, the rewards by the stacking program."""

    obs: bool
    reward: bool
    gamma: float


def normalizing(config: PPOConfig) -> Normalizing | None:
    if not (config.normalize_obs or config.normalize_reward):
        return None
    return Normalizing(config.normalize_obs, config.normalize_reward, config.gamma)


def actor_parts(seeds: list[int], actors: int, *, halves: bool = True) -> list[list[list[int]]]:
    """``seeds`` (the envs in row order) split among at most ``actors`` actors, as evenly as contiguous runs
    allow, and each actor's share in two halves (where ``halves`` and it has two envs or more): the envs of each of
    the segment's pools."""
    count = max(1, min(actors, len(seeds)))
    bounds = [len(seeds) * k // count for k in range(count + 1)]
    parts = [seeds[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    return [[part[: len(part) // 2], part[len(part) // 2 :]] if halves and len(part) > 1 else [part] for part in parts]


class HostEnvsPlacement:
    """``Placement``: the envs stepped by a host loop (``HostLoop``), everything else on the default device; every
    env in this process. Its segments' collectors come from ``make_collector``; the programs are compiled once and
    shared by the segments."""

    share = EnvShare()

    def __init__(self, actor_threads: int = 1, act_device: Any = None) -> None:
        if not isinstance(actor_threads, int) or actor_threads < 1:
            raise ValueError(f"actor_threads={actor_threads!r}; allowed: a positive integer")
        self.device = jax.devices()[0]
        # Where the policy acts: the default device, or another (the host's CPU: ``placement.act_device_for``).
        self.act_device = self.device if act_device is None else act_device
        self.actor_threads = actor_threads
        self._act: ActPrograms | None = None
        self._learn: dict[tuple[Sizes, Loss, OptimizerFactory], _LearnPrograms] = {}
        # The segments share the programs: the next one's compile (in the trainer's background thread) and this
        # one's iteration take turns, so that neither traces a program the other is tracing.
        self._turns = threading.Lock()

    def make_collector(
        self, env_backend: EnvBackend, config: PPOConfig, seeds: list[int], share: EnvShare, memory: Any = None
    ) -> tuple[HostLoop, Collector]:
        """The segment's envs, split among the actors (``actor_parts``), and the collector that runs them."""
        check_host_envs(config, env_backend)
        if memory is not None:
            raise ConfigError(f"rollout_on={config.rollout_on!r} carries no recurrent memory; allowed: 'device'")
        normalize = normalizing(config)
        parts = actor_parts(seeds, self.actor_threads, halves=normalize is None or not normalize.obs)
        assert isinstance(env_backend, HostBackend)
        # One pool of each actor steps while its other waits for the policy: the actors share the cores. (Each
        # pool a thread per env: 64 envs of 4 actors ran 64 threads on a TPU v5e's 13-core host, where EnvPool's
        # own 64-env pool, the ceiling, runs one per core.)
        sharing = len(parts)
        actors = [
            [
                env_backend.make_host(config.env_id, part, threads=env_threads(config, len(part), sharing=sharing))
                for part in group
            ]
            for group in parts
        ]
        if self._act is None:
            sizes = [len(part) for group in parts for part in group]
            self._act = ActPrograms(
                sizes, num_steps=config.num_steps, device=self.device, normalize=normalize, act_device=self.act_device
            )
        loop = HostLoop(actors, self._act, num_steps=config.num_steps)

        def carry(stats: EpisodeStats, start: NormalizedHandle | None = None) -> RolloutCarry:
            if normalize is None:
                return RolloutCarry(jnp.zeros((), jnp.int32), jax.device_put(loop.first_obs, self.device), stats)
            handle, first_obs = start_statistics(loop.first_obs, obs=normalize.obs, start=start)
            return RolloutCarry(handle, first_obs, stats)

        if normalize is not None:  # a checkpoint keeps the statistics (``normalize.kept``); they go on from it

            def restore_statistics(saved: RolloutCarry) -> RolloutCarry:
                return carry(fresh_episodes(saved.stats), saved.handle)

            return loop, Collector(carry, no_prime, loop, kept, restore_statistics, True)

        def restore(stats: EpisodeStats) -> RolloutCarry:
            return carry(fresh_episodes(stats))

        return loop, Collector(carry, no_prime, loop, stats_of, restore, True)

    def place(self, checkpoint: Checkpoint, collector: Collector, hyperparameters: AgentHyperparameters) -> TrainState:
        carry = collector.restore(checkpoint.envs)
        return TrainState(
            checkpoint.model, checkpoint.opt_state, carry, checkpoint.key, checkpoint.iteration, hyperparameters
        )

    def program(
        self,
        collector: Collector,
        sizes: Sizes,
        *,
        loss: Loss = model_loss,
        optimizer: OptimizerFactory = make_optimizer,
    ) -> "_HostEnvsProgram":
        if not isinstance(collector.collect, HostLoop):
            raise TypeError("HostEnvsPlacement runs the collectors of its own make_collector")
        learning = self._learn.get((sizes, loss, optimizer))
        if learning is None:  # the learning stage holds no envs: every segment's program shares it
            stages = make_stages(collector, sizes, loss=loss, optimizer=optimizer)
            learning = self._learn[(sizes, loss, optimizer)] = _LearnPrograms(stages.learn)
        return _HostEnvsProgram(collector, learning, self._turns)

    def checkpoint(self, state: TrainState, collector: Collector) -> Checkpoint:
        return Checkpoint(state.model, state.opt_state, state.key, collector.save(state.carry), state.iteration)

    def rollout_record(self) -> dict[str, Any]:
        policy, learn = (f"{d.platform}:{d.id}" for d in (self.act_device, self.device))
        return {"on": "host-envs", "policy_device": policy, "learn_device": learn, "actor_threads": self.actor_threads}


class _LearnPrograms:
    """The learning stage (``core.iteration.make_stages``) and the episode metrics, as programs of their own."""

    def __init__(self, learn_stage: Callable[..., tuple[Policy, PyTree, Metrics]]):
        self.learn = own_jit(learn_stage, donate=(1, 2, 3, 4))
        self.episode = own_jit(episode_metrics)
        self.compiled = False


class _HostEnvsProgram:
    """One iteration a call (``Program.length`` 1): the host loop, then the learning program."""

    length = 1
    host_loop = True

    def __init__(self, collector: Collector, learning: _LearnPrograms, turns: threading.Lock):
        assert isinstance(collector.collect, HostLoop)
        self.collector, self.loop, self.learning, self._turns = collector, collector.collect, learning, turns

    def __call__(self, state: TrainState, count: int = 1) -> tuple[TrainState, Metrics]:
        with self._turns:
            return self._iteration(state)

    def _iteration(self, state: TrainState) -> tuple[TrainState, Metrics]:
        # The one iteration's first stage, outside any program: it splits the key, then runs the host loop (the
        # collector's ``collect``).
        h = state.hyperparameters
        collected = collect(state.model, state.carry, state.key, h, collector=self.collector)
        episode = self.learning.episode(collected.carry.stats)
        model, opt_state, learned = self.learning.learn(
            h, state.model, state.opt_state, collected.batch, collected.update_key
        )
        next_state = TrainState(model, opt_state, collected.carry, collected.key, state.iteration + 1, h)
        return next_state, {**episode, **learned}

    def prime(self, state: TrainState) -> TrainState:
        return state

    def compile(self, state: TrainState) -> None:
        """Compile the host loop's programs and the learning one, for states shaped as ``state`` (once: the
        segments after the first find them compiled)."""
        with self._turns:
            if not self.learning.compiled:
                self._compile(state)
                self.learning.compiled = True

    def _compile(self, state: TrainState) -> None:
        h, carry = state.hyperparameters, state.carry
        assert isinstance(carry, RolloutCarry)
        _, batch = self.loop.compile(state.model, carry, state.key, h)
        self.learning.episode.compile(carry.stats)
        self.learning.learn.compile(h, state.model, state.opt_state, batch, state.key)
