"""``HostEnvsPlacement`` (``--rollout-on host-envs``): EnvPool's envs stepped from a host loop through its host API, the
policy's forward pass jitted on the default device (the accelerator), the envs in two halves so that one half
steps while the policy acts for the other; the route LeanRL, Sample Factory and moolib take on a GPU. ``auto``
takes it for continuous tasks (MuJoCo's, float64 on the host), whose step would otherwise be a call out of the
program that costs more than the step.

Each step, for each half in turn: receive its envs' step, act on their observations on the device, send the
actions (``send`` returns at once: EnvPool's threads step that half while the host acts for the other); the step
goes into host buffers ``[T, N, ...]``. After ``num_steps`` steps one program takes the buffers, counts the
episodes, normalises the rewards (CleanRL's ``NormalizeReward``) and computes GAE; the update is the one-program
run's. Normalised observations are counted and scaled by the act program as they come back (one pool then: the
statistics are the pool's). It computes what the one-program iteration computes (``core.iteration.make_iteration``:
the same keys split in the same order, the same seeds, each half's actions those of its rows of the whole batch:
``rollout``'s ``total_envs``), to float32 rounding: the policy sees half the rows at a time, in a program of its
own.
"""

import functools
import threading
from collections.abc import Callable
from typing import Any, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, PRNGKeyArray, PyTree

from ..config import PPOConfig
from ..core._types import Batch, EnvOutput, EpisodeStats
from ..core.collect import Collector, no_prime, stats_of
from ..core.envs import EnvBackend, EnvSpec, HostBackend, HostPool
from ..core.envs.normalize import Moments, NormalizedHandle, kept, observed, scaled_rewards, start_statistics
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


class _ActPrograms:
    """The programs a host loop runs, shared by every segment of a run (they hold no envs): ``keys`` (a rollout's
    step keys, once), ``act`` (one half's step on the device, two calls an env step), ``observe`` (a rollout's
    last observations counted and scaled, where they are normalised) and ``stack`` (the rollout's steps stacked,
    GAE)."""

    def __init__(self, half_sizes: list[int], *, num_steps: int, device: Any, normalize: Normalizing | None):
        self.device, self.normalize = device, normalize
        total = sum(half_sizes) if len(half_sizes) > 1 else None
        # The model is flattened once a rollout and ``act`` takes its leaves: a jitted function of the model itself
        # would flatten it and compare its structure at every call, most of a step's time on a CPU.
        self.structure: tuple[Any, Any] | None = None
        self.impl: Any = None
        # A trace for each size of half, and one more where ``act`` also counts and scales observations.
        traces, most = [0], len(set(half_sizes)) + int(normalize is not None and normalize.obs)

        def act_on(
            leaves: list[Array], moments: Moments | None, obs: Any, key_data: Any, first: Any
        ) -> tuple[Moments | None, Array | None, Array, Float[Array, "N 2"]]:
            traces[0] += 1
            if traces[0] > most or self.structure is None:
                raise RuntimeError(f"the host loop's act program was traced {traces[0]} times, at most {most}")
            scaled = None
            if moments is not None:  # a step's raw observations: counted, then scaled, as ``normalize_pool`` does
                moments, obs = observed(moments, jnp.asarray(obs, jnp.float32))
                scaled = obs
            treedef, static = self.structure
            model = eqx.combine(jax.tree.unflatten(treedef, leaves), static)
            step_key = jax.random.wrap_key_data(key_data, impl=self.impl)  # step t's, as ``rollout`` splits its key
            action, logprob, value = act(model, obs, step_key, first_env=first, total_envs=total)
            # The scaled observations go back to the host's buffers; raw ones are there already.
            return moments, scaled, action, jnp.stack([logprob, value], axis=-1)

        def step_keys(key: PRNGKeyArray) -> Array:
            return jax.random.key_data(jax.random.split(key, num_steps))

        self.act = jax.jit(act_on)
        self._keys = jax.jit(step_keys)
        self.observe = jax.jit(observed)
        self.stack = own_jit(functools.partial(_stacked, normalize=normalize), donate=(1,))

    def keys(self, key: PRNGKeyArray) -> np.ndarray:
        """The data of ``rollout``'s step keys for ``key``, on the host: row t is step t's."""
        self.impl = jax.random.key_impl(key)
        return np.asarray(self._keys(key))

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
    loop of one rollout (``programs.act`` for each half in turn), its steps written into host buffers ``[T, N,
    ...]``, then ``programs.stack`` on them."""

    def __init__(self, pools: list[HostPool], programs: _ActPrograms, *, num_steps: int):
        self.pools, self.programs, self.num_steps = pools, programs, num_steps
        sizes = [int(pool.first_obs.shape[0]) for pool in pools]
        self.rows = [slice(sum(sizes[:h]), sum(sizes[: h + 1])) for h in range(len(pools))]
        self.total = sum(sizes)
        self.obs = [pool.first_obs for pool in pools]
        self.buffers: dict[str, np.ndarray] | None = None

    @property
    def first_obs(self) -> np.ndarray:
        return np.concatenate([pool.first_obs for pool in self.pools])

    def _act_and_send(
        self, h: int, t: int, leaves: list[Array], moments: Moments | None, obs: Any, key_data: np.ndarray
    ) -> Moments | None:
        """Half ``h``'s step ``t``: act on ``obs`` (raw, counted and scaled first where ``moments`` are given), send
        the actions, and write the step into the buffers."""
        first = np.int32(self.rows[h].start)
        moments, acted_on, actions, logprob_value = self.programs.act(leaves, moments, obs, key_data, first)
        buffers, rows = self.buffers, self.rows[h]
        assert buffers is not None
        buffers["actions"][t, rows] = actions = np.asarray(actions)
        self.pools[h].send(actions)
        buffers["obs"][t, rows] = obs if acted_on is None else np.asarray(acted_on)
        buffers["logprob_value"][t, rows] = np.asarray(logprob_value)
        return moments

    def __call__(
        self, model: ActorCritic, carry: RolloutCarry, key: PRNGKeyArray, *, gamma: Any, gae_lambda: Any
    ) -> tuple[RolloutCarry, Batch]:
        """``Collector.collect``: one rollout with ``key`` (``rollout``'s), its batch with GAE. Half h acts for
        step t + 1 as soon as its step t is received, while the other half steps. Where observations are
        normalised (one pool), ``act`` counts and scales each step's as it comes back (the rollout's first are
        ``carry.obs``, counted and scaled already)."""
        pools, steps, halves = self.pools, self.num_steps, range(len(self.pools))
        leaves, key_data = self.programs.leaves(model), self.programs.keys(key)
        if self.buffers is None:
            self.buffers = self._buffers(leaves, key_data)
        buffers = self.buffers
        observing = isinstance(carry.handle, NormalizedHandle) and self.programs.normalize.obs  # type: ignore[union-attr]
        moments: Moments | None = carry.handle.obs if observing else None
        for h in halves:  # the rollout's first observations: raw, or (normalised) the carry's, scaled already
            obs = np.asarray(carry.obs) if observing else self.obs[h]
            self._act_and_send(h, 0, leaves, None, obs, key_data[0])
            if observing:
                buffers["obs"][0, self.rows[h]] = obs
        for t in range(steps):
            for h in halves:
                out: EnvOutput = pools[h].recv()
                for name in _HOST_ROWS:
                    buffers[name][t, self.rows[h]] = getattr(out, name)
                self.obs[h] = np.asarray(out.obs)
                if t + 1 < steps:
                    moments = self._act_and_send(h, t + 1, leaves, moments, self.obs[h], key_data[t + 1])
        if moments is not None:
            moments, last_obs = self.programs.observe(moments, self.obs[0])
            handle = carry.handle._replace(obs=moments)
        else:
            last_obs, handle = jax.device_put(np.concatenate(self.obs), self.programs.device), carry.handle
        # jax may read NumPy buffers in place: they are written again only after the next rollout's first ``act``
        # has returned, and it waits for the update that waits for this program.
        return self.programs.stack(model, carry.stats, handle, buffers, last_obs, gamma, gae_lambda)

    def _buffers(self, leaves: list[Array], key_data: np.ndarray) -> dict[str, np.ndarray]:
        """The host buffers of a rollout's steps: the observations acted on (float32 where they are normalised),
        the actions, and log-probabilities beside values (shaped by one call of ``act`` on zeros)."""
        _, _, actions, logprob_value = self.programs.act(
            leaves, None, np.zeros_like(self.obs[0]), key_data[0], np.int32(0)
        )
        normalize, obs = self.programs.normalize, self.obs[0]
        buffers = {name: np.zeros((self.num_steps, self.total), dtype) for name, dtype in _HOST_ROWS.items()}
        obs_dtype = np.float32 if normalize is not None and normalize.obs else obs.dtype
        buffers["obs"] = np.zeros((self.num_steps, self.total, *obs.shape[1:]), obs_dtype)
        for name, x in (("actions", actions), ("logprob_value", logprob_value)):
            buffers[name] = np.zeros((self.num_steps, self.total, *x.shape[1:]), x.dtype)
        return buffers

    def compile(self, model: ActorCritic, carry: RolloutCarry, key: PRNGKeyArray, hyperparameters: Any) -> Any:
        """Compile ``act`` (for each size of half), ``observe`` and ``stack`` for states like these; returns the
        shapes of what a call returns."""
        programs = self.programs
        leaves, key_data = programs.leaves(model), programs.keys(key)
        # A call of ``act`` on zeros for each half, as the loop calls it (``lower`` with shapes alone would compile
        # another entry of jax's caches than the call finds).
        for obs in self.obs:
            programs.act(leaves, None, np.zeros_like(obs), key_data[0], np.int32(0))
        handle = carry.handle
        if isinstance(handle, NormalizedHandle) and programs.normalize and programs.normalize.obs:
            programs.act(leaves, handle.obs, np.zeros_like(self.obs[0]), key_data[0], np.int32(0))
            programs.observe(handle.obs, np.zeros_like(self.obs[0]))
        if self.buffers is None:
            self.buffers = self._buffers(leaves, key_data)
        h = hyperparameters
        args = (model, carry.stats, handle, self.buffers, carry.obs, h.gamma, h.gae_lambda)
        programs.stack.compile(*args)
        on_device = jax.sharding.SingleDeviceSharding(programs.device)  # as the stacking program's outputs are
        shapes = jax.eval_shape(functools.partial(_stacked, normalize=programs.normalize), *args)
        return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=on_device), shapes)

    def close(self) -> None:
        for pool in self.pools:
            pool.close()


_HOST_ROWS = {
    "reward": np.float32,
    "done": np.bool_,
    "raw_reward": np.float32,
    "game_over": np.bool_,
    "truncated": np.bool_,
}
"""What the host keeps of each env step besides what the policy did: rows ``[T, N]``."""


def _stacked(
    model: ActorCritic,
    stats: EpisodeStats,
    handle: Any,
    steps: dict[str, Array],
    last_obs: Array,
    gamma: Any,
    gae_lambda: Any,
    *,
    normalize: Normalizing | None,
) -> tuple[RolloutCarry, Batch]:
    """The rollout's steps (``HostLoop``'s buffers, ``[T, N, ...]``) as ``rollout`` returns them, its episodes
    counted, its rewards normalised (where ``normalize.reward``, as ``normalize_pool`` does, step by step) and GAE
    computed (``collect``)."""
    logprobs, values = steps["logprob_value"][..., 0], steps["logprob_value"][..., 1]

    def count(stats: EpisodeStats, row: tuple[Float[Array, " N"], Bool[Array, " N"]]) -> tuple[EpisodeStats, None]:
        return count_step(stats, *row), None

    stats, _ = jax.lax.scan(count, stats, (steps["raw_reward"], steps["game_over"]))
    rewards = steps["reward"]
    if normalize is not None and normalize.reward:

        def scale(carry: tuple[Moments, Array], row: tuple[Array, Array, Array]) -> tuple[tuple[Moments, Array], Array]:
            reward, done, truncated = row
            moments, discounted, scaled = scaled_rewards(*carry, reward, done & ~truncated, gamma=normalize.gamma)
            return (moments, discounted), scaled

        (return_moments, discounted), rewards = jax.lax.scan(
            scale, (handle.returns, handle.discounted), (rewards, steps["done"], steps["truncated"])
        )
        handle = handle._replace(returns=return_moments, discounted=discounted)
    _, last_value = model(last_obs)
    advantages, returns = compute_gae(rewards, values, steps["done"], last_value, gamma=gamma, gae_lambda=gae_lambda)
    batch = Batch(steps["obs"], steps["actions"], logprobs, values, advantages, returns)
    return RolloutCarry(handle, last_obs, stats), batch


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
        """The segment's envs in two halves (one pool where there is a single env, or where observations are
        normalised: their statistics are of the whole pool) and the collector that runs them."""
        check_host_envs(config, env_backend)
        normalize = normalizing(config)
        half = 0 if normalize is not None and normalize.obs else len(seeds) // 2
        parts = [seeds[:half], seeds[half:]] if half else [seeds]
        assert isinstance(env_backend, HostBackend)
        pools = [env_backend.make_host(config.env_id, part, threads=env_threads(config, len(part))) for part in parts]
        if self._act is None:
            sizes = [len(part) for part in parts]
            self._act = _ActPrograms(sizes, num_steps=config.num_steps, device=self.device, normalize=normalize)
        loop = HostLoop(pools, self._act, num_steps=config.num_steps)

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

    def program(self, collector: Collector, sizes: Sizes, *, loss: Loss = model_loss) -> "_HostEnvsProgram":
        if not isinstance(collector.collect, HostLoop):
            raise TypeError("HostEnvsPlacement runs the collectors of its own make_collector")
        learning = self._learn.get((sizes, loss))
        if learning is None:  # the learning stage holds no envs: every segment's program shares it
            learning = self._learn[(sizes, loss)] = _LearnPrograms(make_stages(collector, sizes, loss=loss).learn)
        return _HostEnvsProgram(collector, learning, self._turns)

    def checkpoint(self, state: TrainState, collector: Collector) -> Checkpoint:
        return Checkpoint(state.model, state.opt_state, state.key, collector.save(state.carry), state.iteration)

    def rollout_record(self) -> dict[str, Any]:
        return {"on": "host-envs", "policy_device": f"{self.device.platform}:{self.device.id}"}


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
