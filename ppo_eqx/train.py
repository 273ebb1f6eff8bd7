"""TrainState, the one jitted PPO iteration (rollout, GAE, update), and the host loop.

The envs of a run live in segments of ``config.checkpoint_every`` iterations: each segment's envs are made
afresh and seeded from (seed, first iteration of the segment) alone, so a run restored from a checkpoint at a
segment boundary goes on exactly as the uninterrupted run did.

With ``config.num_seeds`` S > 1 the program trains S independent agents, with seeds ``seed`` .. ``seed + S - 1``,
on one pool of ``S * num_envs`` envs: the model, optimizer state, key and episode statistics carry a leading
``S`` axis, the iteration is ``vmap``-ed over it, and agent s's envs are those of the single-seed run with
seed ``seed + s``. Agent s computes what that run computes, up to the order in which XLA sums (see README).

With ``config.async_batch_size`` R > 0 the pool is EnvPool's async one (``make_async_env``): each rollout step
receives R envs, and each segment's pool is primed (``prime_async``) before its first iteration.
"""

import concurrent.futures
import math
import time
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple, cast

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jaxtyping import Array, Bool, Float, Int, Key, PRNGKeyArray, PyTree, Shaped, UInt32

from ._types import Batch, EpisodeStats, LossInfo
from .config import ConvImpl, PPOConfig
from .envs import AsyncEnv, EnvSpec, EnvStep, make_async_env, make_env, seeds_env_step
from .gae import compute_gae, compute_gae_by_env
from .networks import ActorCritic
from .rollout import (
    AsyncRolloutCarry,
    RolloutCarry,
    async_rollout,
    init_async_carry,
    init_episode_stats,
    prime_async,
    rollout,
)
from .update import current_learning_rate, make_optimizer, update

Metrics = dict[str, Float[Array, "*S"]]
"""Scalars of one iteration; with `num_seeds` S > 1, one per agent."""
AgentKeys = Key[Array, "*S"] | UInt32[Array, "*S 2"]
"""A PRNG key, or with ``num_seeds`` S > 1 one per agent."""


class TrainState(eqx.Module):
    """Everything one iteration reads and writes. ``iteration`` counts finished iterations."""

    model: ActorCritic
    opt_state: PyTree
    carry: RolloutCarry | AsyncRolloutCarry
    key: AgentKeys
    iteration: Int[Array, ""]


class Checkpoint(eqx.Module):
    """What a checkpoint holds: the TrainState less the envs (EnvPool's state cannot be saved).

    ``stats`` keeps the last finished episode of every env; its running episodes are dropped on restore, as
    the envs are made afresh.
    """

    model: ActorCritic
    opt_state: PyTree
    key: AgentKeys
    stats: EpisodeStats
    iteration: Int[Array, ""]


def segment_env_seeds(seed: int, iteration: int, num_envs: int) -> list[int] | None:
    """EnvPool seeds of the envs that play from ``iteration`` on, a function of ``(seed, iteration)`` only.

    ``None`` for iteration 0: EnvPool's own seeding (env i gets ``seed + i``), as CleanRL's script. Later
    segments draw ``num_envs`` seeds below 2**31 from NumPy's ``SeedSequence((seed, iteration))``.
    """
    if iteration == 0:
        return None
    entropy = [seed % 2**32, iteration]
    return [int(s) % 2**31 for s in np.random.SeedSequence(entropy).generate_state(num_envs)]


def pool_env_seeds(config: PPOConfig, iteration: int) -> list[int] | None:
    """EnvPool seeds of the ``num_seeds * num_envs`` envs of one pool that play from ``iteration`` on.

    Agent s's ``num_envs`` envs come s-th, with the seeds that the single-seed run with seed ``seed + s`` gives
    its envs (EnvPool's own ``seed + s + i`` in the first segment, made explicit). ``None`` for a single seed's
    first segment, as ``segment_env_seeds``.
    """
    if config.num_seeds == 1:
        return segment_env_seeds(config.seed, iteration, config.num_envs)
    seeds = []
    for agent in config.agent_configs():
        own = segment_env_seeds(agent.seed, iteration, config.num_envs)
        seeds += [agent.seed + i for i in range(config.num_envs)] if own is None else own
    return seeds


def agent_obs(config: PPOConfig, pool_obs: np.ndarray) -> Shaped[Array, "..."]:
    """The pool's observations ``[S*N, *obs]`` as the agents see them: ``[S, N, *obs]`` (``[N, *obs]`` for one)."""
    obs = jnp.asarray(pool_obs)
    return obs if config.num_seeds == 1 else obs.reshape((config.num_seeds, config.num_envs) + obs.shape[1:])


def fresh_episodes(stats: EpisodeStats) -> EpisodeStats:
    """Statistics for new envs: no running episode, the last finished ones kept."""
    return stats._replace(
        episode_returns=jnp.zeros_like(stats.episode_returns),
        episode_lengths=jnp.zeros_like(stats.episode_lengths),
    )


def init_agents(
    config: PPOConfig, spec: EnvSpec, optimizer: optax.GradientTransformation
) -> tuple[ActorCritic, PyTree, AgentKeys, EpisodeStats]:
    """A fresh run's model, optimizer state, key and episode statistics.

    With ``num_seeds`` S > 1 each is stacked over a leading ``S`` axis (``eqx.filter_vmap`` over the seeds),
    agent s initialised as the single-seed run with seed ``seed + s``.
    """

    def init(seed: int | Int[Array, ""]) -> tuple[ActorCritic, PyTree, PRNGKeyArray, EpisodeStats]:
        key, model_key = jax.random.split(jax.random.PRNGKey(seed))
        conv_impl = cast(ConvImpl, config.conv_impl)  # validated by PPOConfig
        model = ActorCritic(spec.obs_shape, spec.num_actions, conv_impl=conv_impl, key=model_key)
        opt_state = optimizer.init(eqx.filter(model, eqx.is_array))
        return model, opt_state, key, init_episode_stats(config.num_envs)

    if config.num_seeds == 1:
        return init(config.seed)
    return eqx.filter_vmap(init)(config.seed + jnp.arange(config.num_seeds))


def init_train_state(
    config: PPOConfig, spec: EnvSpec, handle: Any, first_obs: np.ndarray, optimizer: optax.GradientTransformation
) -> TrainState:
    model, opt_state, key, stats = init_agents(config, spec, optimizer)
    carry = RolloutCarry(handle, agent_obs(config, first_obs), stats)
    return TrainState(model, opt_state, carry, key, jnp.zeros((), jnp.int32))


def init_checkpoint(config: PPOConfig, spec: EnvSpec) -> Checkpoint:
    """A fresh run's checkpoint; under ``eqx.filter_eval_shape`` the "like" tree that a checkpoint loads into."""
    model, opt_state, key, stats = init_agents(config, spec, make_optimizer(config))
    return Checkpoint(model, opt_state, key, stats, jnp.zeros((), jnp.int32))


@eqx.filter_jit
def all_finite(tree: PyTree) -> Bool[Array, ""]:
    """True when every floating-point leaf of ``tree`` is finite (no NaN, no inf)."""
    leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.inexact)]
    return jnp.all(jnp.stack(leaves)) if leaves else jnp.asarray(True)


def rollout_batch(
    config: PPOConfig,
    model: ActorCritic,
    env_step: EnvStep,
    carry: RolloutCarry,
    *,
    key: PRNGKeyArray,
    first_env: int = 0,
    total_envs: int | None = None,
) -> tuple[RolloutCarry, Batch]:
    """``config.num_steps`` steps of every env and their GAE: the time-major batch (``[T, N, ...]``) to learn from.

    ``first_env`` and ``total_envs`` say which envs of a larger run these are (see ``rollout``).
    """
    carry, transitions, last_value = rollout(
        model, env_step, carry, num_steps=config.num_steps, key=key, first_env=first_env, total_envs=total_envs
    )
    advantages, returns = compute_gae(
        transitions.rewards,
        transitions.values,
        transitions.dones,
        last_value,
        gamma=config.gamma,
        gae_lambda=config.gae_lambda,
    )
    t = transitions
    return carry, Batch(t.obs, t.actions, t.logprobs, t.values, advantages, returns)


def async_rollout_batch(
    config: PPOConfig, model: ActorCritic, env: AsyncEnv, carry: AsyncRolloutCarry, *, key: PRNGKeyArray
) -> tuple[AsyncRolloutCarry, Batch]:
    """``rollout_batch`` of an async pool: ``config.num_steps`` receives of ``config.async_batch_size`` envs and
    their GAE, env by env (``compute_gae_by_env``); the batch is ``[T, R, ...]``."""
    carry, t = async_rollout(model, env, carry, num_steps=config.num_steps, key=key)
    advantages, returns = compute_gae_by_env(
        t.rewards,
        t.values,
        t.next_values,
        t.dones,
        t.env_ids,
        num_envs=config.num_envs,
        gamma=config.gamma,
        gae_lambda=config.gae_lambda,
    )
    return carry, Batch(t.obs, t.actions, t.logprobs, t.values, advantages, returns)


def make_prime(env: AsyncEnv) -> Callable[[TrainState], TrainState]:
    """``prime_async`` of a fresh async pool (the state's carry from ``init_async_carry``) with the state's model;
    the state's key is split for it."""

    def prime(state: TrainState) -> TrainState:
        key, prime_key = jax.random.split(state.key)
        carry = prime_async(state.model, env, cast(AsyncRolloutCarry, state.carry), key=prime_key)
        return TrainState(state.model, state.opt_state, carry, key, state.iteration)

    return prime


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
    config: PPOConfig, env_step: EnvStep | AsyncEnv, optimizer: optax.GradientTransformation
) -> Callable[[TrainState], tuple[TrainState, Metrics]]:
    """The pure PPO iteration: ``num_steps`` env steps, GAE, ``update_epochs`` epochs of minibatch steps.

    Metrics follow CleanRL: the losses are those of the last minibatch step, ``clip_fraction`` is the mean
    over all steps, ``episodic_return``/``episodic_length`` the mean over envs of each env's last finished
    episode (NaN until one has finished).

    With ``config.num_seeds`` S > 1, ``env_step`` steps a pool of ``S * num_envs`` envs and the iteration is
    that of one agent ``vmap``-ed over S: the state's arrays carry a leading ``S`` axis except the env handle
    and the iteration counter, which are shared, and every metric is ``[S]``.

    With ``config.async_batch_size`` R > 0, ``env_step`` is an async pool (``AsyncEnv``), already primed, and
    the batch is ``num_steps`` receives of R envs (``async_rollout_batch``); the update and metrics are the same.
    """
    if isinstance(env_step, AsyncEnv) != (config.async_batch_size > 0):
        raise ValueError(
            f"async_batch_size={config.async_batch_size} needs {'an' if config.async_batch_size else 'no'} AsyncEnv"
        )
    if config.num_seeds > 1:
        return _seeds_iteration(config, cast(EnvStep, env_step), optimizer)

    def collect(
        model: ActorCritic, carry: RolloutCarry | AsyncRolloutCarry, key: PRNGKeyArray
    ) -> tuple[RolloutCarry | AsyncRolloutCarry, Batch]:
        if isinstance(env_step, AsyncEnv):
            return async_rollout_batch(config, model, env_step, cast(AsyncRolloutCarry, carry), key=key)
        return rollout_batch(config, model, env_step, cast(RolloutCarry, carry), key=key)

    def iteration(state: TrainState) -> tuple[TrainState, Metrics]:
        key, rollout_key, update_key = jax.random.split(state.key, 3)
        carry, batch = collect(state.model, state.carry, rollout_key)
        model, opt_state, infos = update(
            state.model,
            state.opt_state,
            jax.tree.map(lambda x: x.reshape((-1, *x.shape[2:])), batch),
            optimizer=optimizer,
            **update_settings(config),
            key=update_key,
        )
        metrics = {**episode_metrics(carry.stats), **update_metrics(opt_state, infos)}
        return TrainState(model, opt_state, carry, key, state.iteration + 1), metrics

    return iteration


def _seeds_iteration(
    config: PPOConfig, env_step: EnvStep, optimizer: optax.GradientTransformation
) -> Callable[[TrainState], tuple[TrainState, Metrics]]:
    agent = make_iteration(config.replace(num_seeds=1), seeds_env_step(env_step, config.num_seeds), optimizer)

    def iteration(state: TrainState) -> tuple[TrainState, Metrics]:
        axes = jax.tree.map(lambda x: 0 if eqx.is_array(x) else None, state)
        axes = eqx.tree_at(lambda s: (s.carry.handle, s.iteration), axes, (None, None), is_leaf=lambda x: x is None)
        return eqx.filter_vmap(agent, in_axes=(axes,), out_axes=(axes, 0))(state)

    return iteration


class _Segment(NamedTuple):
    """The envs that play from iteration ``start`` on, and the iteration compiled against their pool."""

    start: int
    pool: Any
    handle: Any
    first_obs: np.ndarray | None
    """The envs' first observations; None for an async pool, which ``prime`` starts instead."""
    iteration: Callable[[TrainState], tuple[TrainState, Metrics]]
    prime: Callable[[TrainState], TrainState] | None = None


class NonFiniteError(FloatingPointError):
    """The loss or the parameters became NaN or inf; ``record`` is the iteration's metrics (of the first agent
    that went wrong), ``records`` those of every agent."""

    def __init__(self, message: str, record: dict[str, Any], records: list[dict[str, Any]] | None = None):
        super().__init__(message)
        self.record = record
        self.records = [record] if records is None else records


class Trainer:
    """Owns the envs, the optimizer and the compiled iteration; ``state`` is the only thing that changes.

    ``step()`` runs one jitted iteration. After every ``config.checkpoint_every``-th iteration (but the last)
    the envs are replaced by new ones seeded from (seed, iteration) and reset; the running episodes are
    dropped from the statistics. EnvPool's XLA call is bound to one pool, so each segment of envs has its
    own compiled iteration; the next one is made and compiled in a background thread while the current
    segment runs. Each is traced once: a retrace (a changed shape or dtype in the state) raises instead of
    silently recompiling.

    ``restore`` continues from a checkpoint: its model, optimizer state, key, iteration and finished-episode
    statistics, with the envs of the segment that starts at its iteration. Call ``close()`` when done.

    With ``config.num_seeds`` S > 1 one pool holds the envs of all S agents (``pool_env_seeds``) and the state
    is stacked over S (see ``make_iteration``). With ``config.async_batch_size`` > 0 each segment's pool is
    async and is primed (``make_prime``, compiled with the iteration) with the model of the moment it starts.
    """

    def __init__(self, config: PPOConfig, *, restore: Checkpoint | None = None):
        self.config = config.validate()
        self.optimizer = make_optimizer(config)
        start = 0 if restore is None else int(restore.iteration)
        self.spec, self._segment = self._make_envs(start)
        self.state = self._initial_state(restore)
        # The state's shapes and dtypes in arrays that are never donated: later segments compile against it.
        self._example = jax.tree.map(lambda x: jnp.zeros_like(x) if eqx.is_array(x) else x, self.state)
        self._prefetch = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="ppo-eqx-envs")
        self._next: concurrent.futures.Future[_Segment] | None = None
        self._prepare_after(start)

    def _initial_state(self, restore: Checkpoint | None) -> TrainState:
        config, segment = self.config, self._segment
        if restore is None:
            model, opt_state, key, stats = init_agents(config, self.spec, self.optimizer)
            restore = Checkpoint(model, opt_state, key, stats, jnp.zeros((), jnp.int32))
        carry = self._fresh_carry(segment, fresh_episodes(restore.stats))
        state = TrainState(restore.model, restore.opt_state, carry, restore.key, restore.iteration)
        return state if segment.prime is None else segment.prime(state)

    def _fresh_carry(self, segment: _Segment, stats: EpisodeStats) -> RolloutCarry | AsyncRolloutCarry:
        """The carry of a segment's new envs: their first observations, or an async pool's carry to prime."""
        if segment.first_obs is None:
            return init_async_carry(segment.handle, self.spec.obs_shape, self.spec.obs_dtype, stats)
        return RolloutCarry(segment.handle, agent_obs(self.config, segment.first_obs), stats)

    def _make_envs(self, start: int) -> tuple[EnvSpec, _Segment]:
        config = self.config
        if config.async_batch_size:
            return self._make_async_envs(start)
        pool_config = config.replace(num_envs=config.num_seeds * config.num_envs, num_seeds=1)
        spec, handle, env_step, pool, first_obs = make_env(pool_config, env_seed=pool_env_seeds(config, start))
        iteration = eqx.debug.assert_max_traces(make_iteration(config, env_step, self.optimizer), max_traces=1)
        return spec, _Segment(start, pool, jnp.asarray(handle), first_obs, eqx.filter_jit(iteration, donate="all"))

    def _make_async_envs(self, start: int) -> tuple[EnvSpec, _Segment]:
        spec, handle, env, pool = make_async_env(self.config, env_seed=pool_env_seeds(self.config, start))
        iteration = eqx.debug.assert_max_traces(make_iteration(self.config, env, self.optimizer), max_traces=1)
        prime = eqx.debug.assert_max_traces(make_prime(env), max_traces=1)
        iteration, prime = eqx.filter_jit(iteration, donate="all"), eqx.filter_jit(prime, donate="all")
        return spec, _Segment(start, pool, jnp.asarray(handle), None, iteration, prime)

    def _make_compiled_envs(self, start: int) -> _Segment:
        _, segment = self._make_envs(start)
        segment.iteration.lower(self._example).compile()  # type: ignore[attr-defined]
        if segment.prime is not None:
            segment.prime.lower(self._example).compile()  # type: ignore[attr-defined]
        return segment

    def _prepare_after(self, start: int) -> None:
        """Make and compile the next segment's envs in the background, if the run gets there."""
        every = self.config.checkpoint_every
        next_start = (start // every + 1) * every
        if next_start < self.config.num_iterations:
            self._next = self._prefetch.submit(self._make_compiled_envs, next_start)

    def compile(self) -> float:
        """Compile the iteration ahead of the first step; returns the seconds it took."""
        start = time.perf_counter()
        self._segment.iteration.lower(self.state).compile()  # type: ignore[attr-defined]
        return time.perf_counter() - start

    def step(self) -> Metrics:
        self.state, metrics = self._segment.iteration(self.state)
        iteration = int(self.state.iteration)
        if iteration % self.config.checkpoint_every == 0 and iteration < self.config.num_iterations:
            self._new_envs(iteration)
        return metrics

    def _new_envs(self, iteration: int) -> None:
        if self._next is None:
            raise RuntimeError(f"no envs were prepared for iteration {iteration}")
        segment = self._next.result()
        if segment.start != iteration:
            raise RuntimeError(f"envs were prepared for iteration {segment.start}, not {iteration}")
        old, self._segment, self._next = self._segment, segment, None
        carry = self._fresh_carry(segment, fresh_episodes(self.state.carry.stats))
        self.state = eqx.tree_at(lambda s: s.carry, self.state, carry)
        if segment.prime is not None:
            self.state = segment.prime(self.state)
        old.pool.close()
        self._prepare_after(iteration)

    def checkpoint(self) -> Checkpoint:
        """The state to save now; the next ``step()`` donates its arrays, so save it before."""
        state = self.state
        return Checkpoint(state.model, state.opt_state, state.key, state.carry.stats, state.iteration)

    def finite(self) -> bool:
        """Whether the model and the optimizer state are free of NaN and inf."""
        return bool(all_finite((self.state.model, self.state.opt_state)))

    def close(self) -> None:
        """Stop preparing envs (waiting for a compile under way) and let the worker thread go."""
        if self._next is not None:
            self._next.cancel()
            self._next = None
        self._prefetch.shutdown(wait=True)


def train(config: PPOConfig, *, num_iterations: int | None = None) -> Iterator[dict[str, float]]:
    """Train with ``config``, yielding one dict of host-side metrics per iteration.

    Each dict holds ``iteration``, ``global_step``, ``sps`` (env steps per second of this iteration),
    ``time_elapsed`` (seconds since the trainer was built, compilation included) and the iteration's
    metrics as floats. The final state is ``Trainer.state``; use ``Trainer`` directly to keep it.
    """
    trainer = Trainer(config)
    try:
        yield from run(trainer, num_iterations=num_iterations)
    finally:
        trainer.close()


def run(trainer: Trainer, *, num_iterations: int | None = None) -> Iterator[dict[str, float]]:
    """The host loop over ``trainer.step()``; stops after ``config.num_iterations`` in all.

    Raises NonFiniteError (naming the iteration) instead of yielding an iteration whose loss or parameters
    are NaN or inf. For a single seed; ``run_seeds`` yields every agent's records.
    """
    if trainer.config.num_seeds != 1:
        raise ValueError(f"run() is for one seed; use run_seeds() for num_seeds={trainer.config.num_seeds}")
    for records in run_seeds(trainer, num_iterations=num_iterations):
        yield records[0]


def run_seeds(trainer: Trainer, *, num_iterations: int | None = None) -> Iterator[list[dict[str, float]]]:
    """``run`` for ``num_seeds`` agents: one record per agent and iteration, each as a single-seed run's.

    An agent's ``global_step`` and ``sps`` count its own ``num_envs * num_steps`` steps per iteration.
    """
    config = trainer.config
    start = time.perf_counter()
    last = start
    total = config.num_iterations if num_iterations is None else num_iterations
    while int(trainer.state.iteration) < total:
        metrics = jax.device_get(trainer.step())
        now = time.perf_counter()
        iteration = int(trainer.state.iteration)
        records = []
        for agent in range(config.num_seeds):
            record: dict[str, float] = {"iteration": iteration, "global_step": iteration * config.batch_size}
            record["sps"] = config.batch_size / (now - last)
            record["time_elapsed"] = now - start
            record.update({name: float(np.reshape(value, -1)[agent]) for name, value in metrics.items()})
            records.append(record)
        last = now
        for agent, record in enumerate(records):
            if not math.isfinite(record["loss"]):
                which = f" of seed {config.seed + agent}" if config.num_seeds > 1 else ""
                raise NonFiniteError(f"the loss{which} is {record['loss']} at iteration {iteration}", record, records)
        if not trainer.finite():
            raise NonFiniteError(f"the parameters are not finite after iteration {iteration}", records[0], records)
        yield records
