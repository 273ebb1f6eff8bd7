"""``HostEnvsPlacement`` (``--rollout-on host-envs``): EnvPool's envs stepped from a host loop through its host API, the
policy's forward pass jitted on the default device (the accelerator), the envs in two halves so that one half
steps while the policy acts for the other; the route LeanRL, Sample Factory and moolib take on a GPU.

Each step, for each half in turn: receive its envs' step, act on their observations on the device, send the
actions (``send`` returns at once: EnvPool's threads step that half while the host acts for the other). After
``num_steps`` steps one program stacks the recorded steps, counts the episodes, computes GAE and runs the update.
It computes what the one-program iteration computes (``core.iteration.make_iteration``: the same keys split in
the same order, the same seeds, each half's actions those of its rows of the whole batch: ``rollout``'s
``total_envs``), to float32 rounding: the policy sees half the rows at a time.
"""

import threading
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, PRNGKeyArray, PyTree

from ..config import PPOConfig
from ..core._types import Batch, EnvOutput, EpisodeStats
from ..core.collect import Collector, no_prime, stats_of
from ..core.envs import EnvBackend, EnvSpec, HostBackend, HostPool
from ..core.gae import compute_gae
from ..core.hyperparameters import AgentHyperparameters, Sizes
from ..core.iteration import Metrics, collect, episode_metrics, make_stages
from ..core.loss import Loss, model_loss
from ..core.networks import ActorCritic
from ..core.rollout import RolloutCarry, act, count_step, fresh_episodes
from ..core.state import Checkpoint, TrainState
from ..errors import ConfigError
from .compiled import own_jit, same_static
from .pools import EnvShare, env_threads


def check_host_envs(config: PPOConfig, env_backend: EnvBackend, spec: EnvSpec | None = None) -> None:
    """ConfigError where ``rollout_on='host-envs'`` cannot run ``config`` with ``env_backend`` (and ``spec``'s env)."""
    said = f"rollout_on={config.rollout_on!r}"
    if not isinstance(env_backend, HostBackend):
        raise ConfigError(
            f"{said} steps envs through a host API, and env_backend={env_backend.name!r} has none; allowed: "
            "env_backend='envpool', or rollout_on='device' or 'auto'"
        )
    if spec is not None and spec.continuous:
        raise ConfigError(
            f"{said} with {spec.env_id}'s continuous actions: not built yet; allowed: rollout_on='device' or 'auto'"
        )
    refused = {
        f"{config.num_agents} agents (num_seeds x sweep)": (config.num_agents > 1, "one"),
        f"async_batch_size {config.async_batch_size}": (config.async_batch_size > 0, "0"),
        "bootstrap_truncated": (config.bootstrap_truncated, "off"),
        "normalize_obs or normalize_reward": (
            config.normalize_obs or config.normalize_reward,
            "off (--no-normalize-obs --no-normalize-reward)",
        ),
    }
    for what, (bad, allowed) in refused.items():
        if bad:
            raise ConfigError(f"{said} with {what}: not built yet; allowed: {allowed}, or rollout_on='device'")


class _ActPrograms:
    """The programs a host loop runs, shared by every segment of a run (they hold no envs): ``act`` (one half's
    step on the device, two calls an env step) and ``stack`` (the rollout's steps stacked, GAE)."""

    def __init__(self, half_sizes: list[int], *, num_steps: int, device: Any):
        self.device = device
        total = sum(half_sizes) if len(half_sizes) > 1 else None
        # The model is flattened once a rollout and ``act`` takes its leaves: a jitted function of the model itself
        # would flatten it and compare its structure at every call, most of a step's time on a CPU.
        self.structure: tuple[Any, Any] | None = None
        traces, most = [0], len(set(half_sizes))

        def act_on(leaves: list[Array], obs: Any, key: PRNGKeyArray, t: Any, first: Any) -> tuple[Array, ...]:
            traces[0] += 1
            if traces[0] > most or self.structure is None:
                raise RuntimeError(f"the host loop's act program was traced {traces[0]} times, at most {most}")
            treedef, static = self.structure
            model = eqx.combine(jax.tree.unflatten(treedef, leaves), static)
            step_key = jax.random.split(key, num_steps)[t]  # step t's, as ``rollout`` splits its key
            return (obs, *act(model, obs, step_key, first_env=first, total_envs=total))

        self.act = jax.jit(act_on)
        self.stack = own_jit(_stacked, donate=(1,))

    def leaves(self, model: ActorCritic) -> list[Array]:
        """``model``'s array leaves, its structure (the same at every call) kept for ``act``."""
        params, static = eqx.partition(model, eqx.is_array)
        leaves, treedef = jax.tree.flatten(params)
        if self.structure is None:
            self.structure = (treedef, static)
        elif self.structure[0] != treedef or not same_static(self.structure[1], static):
            raise RuntimeError("the host loop's act program was called with another model's structure")
        return leaves


class HostLoop:
    """The envs of one segment in (at most) two ``HostPool`` halves; called as a collector's ``collect``: the host
    loop of one rollout (``programs.act`` for each half in turn), then ``programs.stack``."""

    def __init__(self, pools: list[HostPool], programs: _ActPrograms, *, num_steps: int):
        self.pools, self.programs, self.num_steps = pools, programs, num_steps
        sizes = [int(pool.first_obs.shape[0]) for pool in pools]
        self.firsts = [sum(sizes[:h]) for h in range(len(pools))]
        self.total = sum(sizes)
        self.obs = [pool.first_obs for pool in pools]

    @property
    def first_obs(self) -> np.ndarray:
        return np.concatenate([pool.first_obs for pool in self.pools])

    def _act_and_send(self, h: int, leaves: list[Array], key: PRNGKeyArray, t: int) -> tuple[Array, ...]:
        step = self.programs.act(leaves, self.obs[h], key, np.int32(t), np.int32(self.firsts[h]))
        self.pools[h].send(np.asarray(step[1]))
        return step  # the observations (on the device now), actions, log-probabilities, values

    def __call__(
        self, model: ActorCritic, carry: RolloutCarry, key: PRNGKeyArray, *, gamma: Any, gae_lambda: Any
    ) -> tuple[RolloutCarry, Batch]:
        """``Collector.collect``: one rollout with ``key`` (``rollout``'s), its batch with GAE. Half h acts for
        step t + 1 as soon as its step t is received, while the other half steps."""
        pools, steps, halves = self.pools, self.num_steps, range(len(self.pools))
        on_device: list[list[tuple[Array, ...]]] = [[] for _ in range(steps)]
        host = {name: np.zeros((steps, self.total), dtype) for name, dtype in _HOST_ROWS.items()}
        leaves = self.programs.leaves(model)
        for h in halves:
            on_device[0].append(self._act_and_send(h, leaves, key, 0))
        for t in range(steps):
            for h in halves:
                out: EnvOutput = pools[h].recv()
                rows = slice(self.firsts[h], self.firsts[h] + len(out.obs))
                for name in _HOST_ROWS:
                    host[name][t, rows] = np.asarray(getattr(out, name))
                self.obs[h] = np.asarray(out.obs)
                if t + 1 < steps:
                    on_device[t + 1].append(self._act_and_send(h, leaves, key, t + 1))
        last_obs = jax.device_put(np.concatenate(self.obs), self.programs.device)
        return self.programs.stack(model, carry.stats, on_device, host, last_obs, gamma, gae_lambda)

    def compile(self, model: ActorCritic, carry: RolloutCarry, key: PRNGKeyArray, hyperparameters: Any) -> Any:
        """Compile ``act`` (for each size of half) and ``stack`` for states like these; returns the shapes of what
        a call returns."""
        zero, programs = np.int32(0), self.programs
        leaves = programs.leaves(model)
        # A call of ``act`` on zeros for each half, as the loop calls it (``lower`` with shapes alone would compile
        # another entry of jax's caches than the call finds): its outputs stand for every step's.
        step = [programs.act(leaves, np.zeros_like(pool.first_obs), key, zero, zero) for pool in self.pools]
        host = {name: np.zeros((self.num_steps, self.total), dtype) for name, dtype in _HOST_ROWS.items()}
        h = hyperparameters
        args = (model, carry.stats, [step] * self.num_steps, host, carry.obs, h.gamma, h.gae_lambda)
        programs.stack.compile(*args)
        on_device = jax.sharding.SingleDeviceSharding(programs.device)  # as the stacking program's outputs are
        shapes = jax.eval_shape(_stacked, *args)
        return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=on_device), shapes)

    def close(self) -> None:
        for pool in self.pools:
            pool.close()


_HOST_ROWS = {"reward": np.float32, "done": np.bool_, "raw_reward": np.float32, "game_over": np.bool_}
"""What the host keeps of each step: rows ``[T, N]`` that go to the device once, with the rollout's last step."""


def _stacked(
    model: ActorCritic,
    stats: EpisodeStats,
    on_device: list[list[tuple[Array, ...]]],
    host: dict[str, Array],
    last_obs: Array,
    gamma: Any,
    gae_lambda: Any,
) -> tuple[RolloutCarry, Batch]:
    """The rollout's steps as ``rollout`` returns them, its episodes counted and GAE computed (``collect``)."""
    obs, actions, logprobs, values = (
        jnp.stack([jnp.concatenate([half[i] for half in step]) for step in on_device]) for i in range(4)
    )

    def count(stats: EpisodeStats, row: tuple[Float[Array, " N"], Bool[Array, " N"]]) -> tuple[EpisodeStats, None]:
        return count_step(stats, *row), None

    stats, _ = jax.lax.scan(count, stats, (host["raw_reward"], host["game_over"]))
    _, last_value = model(last_obs)
    advantages, returns = compute_gae(
        host["reward"], values, host["done"], last_value, gamma=gamma, gae_lambda=gae_lambda
    )
    carry = RolloutCarry(jnp.zeros((), jnp.int32), last_obs, stats)
    return carry, Batch(obs, actions, logprobs, values, advantages, returns)


class HostEnvsPlacement:
    """``Placement``: the envs stepped by a host loop (``HostLoop``), everything else on the default device; every
    env in this process. Its segments' collectors come from ``make_collector``; the programs are compiled once and
    shared by the segments."""

    share = EnvShare()

    def __init__(self) -> None:
        self.device = jax.devices()[0]
        self._act: _ActPrograms | None = None
        self._learn: dict[tuple[Sizes, Loss], _LearnPrograms] = {}
        # The segments share the programs: the next one's compile (in the trainer's background thread) and this
        # one's iteration take turns, so that neither traces a program the other is tracing.
        self._turns = threading.Lock()

    def make_collector(
        self, env_backend: EnvBackend, config: PPOConfig, seeds: list[int], share: EnvShare
    ) -> tuple[HostLoop, Collector]:
        """The segment's envs in two halves (one where there is a single env) and the collector that runs them."""
        check_host_envs(config, env_backend)
        half = len(seeds) // 2
        parts = [seeds[:half], seeds[half:]] if half else [seeds]
        assert isinstance(env_backend, HostBackend)
        pools = [env_backend.make_host(config.env_id, part, threads=env_threads(config, len(part))) for part in parts]
        if self._act is None:
            self._act = _ActPrograms([len(part) for part in parts], num_steps=config.num_steps, device=self.device)
        loop = HostLoop(pools, self._act, num_steps=config.num_steps)

        def carry(stats: EpisodeStats) -> RolloutCarry:
            return RolloutCarry(jnp.zeros((), jnp.int32), jax.device_put(loop.first_obs, self.device), stats)

        def restore(stats: EpisodeStats) -> RolloutCarry:
            return carry(fresh_episodes(stats))

        return loop, Collector(carry, no_prime, loop, stats_of, restore, True)

    def place(self, checkpoint: Checkpoint, collector: Collector, hyperparameters: AgentHyperparameters) -> TrainState:
        carry = collector.restore(checkpoint.envs)
        return TrainState(
            checkpoint.model, checkpoint.opt_state, carry, checkpoint.key, checkpoint.iteration, hyperparameters
        )

    def program(self, collector: Collector, sizes: Sizes, *, loss: Loss = model_loss) -> "_HostEnvsProgram":
        if not isinstance(collector.collect, HostLoop):
            raise TypeError("HostEnvsPlacement runs the collectors of its own make_collector")
        learning = self._learn.get((sizes, loss))
        if learning is None:  # the learning stage holds no envs: every segment's program shares it
            learning = self._learn[(sizes, loss)] = _LearnPrograms(make_stages(collector, sizes, loss=loss).learn)
        return _HostEnvsProgram(collector, learning, self._turns)

    def checkpoint(self, state: TrainState, collector: Collector) -> Checkpoint:
        return Checkpoint(state.model, state.opt_state, state.key, collector.save(state.carry), state.iteration)


class _LearnPrograms:
    """The learning stage (``core.iteration.make_stages``) and the episode metrics, as programs of their own."""

    def __init__(self, learn_stage: Callable[..., tuple[ActorCritic, PyTree, Metrics]]):
        self.learn = own_jit(learn_stage, donate=(1, 2, 3, 4))
        self.episode = own_jit(episode_metrics)
        self.compiled = False


class _HostEnvsProgram:
    """One iteration a call (``Program.length`` 1): the host loop, then the learning program."""

    length = 1

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
