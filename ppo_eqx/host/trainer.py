"""TrainState, the one jitted PPO iteration (collect, update), and the Trainer that composes the parts.

A ``Trainer`` composes three parts, each behind a small interface: an env backend (``envs.EnvBackend``) makes
the pools; a collector (``collect.sync_collector`` or ``collect.async_collector``) turns a pool into batches;
a placement runs the iteration (``OneDevice`` here: one jitted program; ``parallel.MeshPlacement``: the update sharded
over devices and hosts).

The envs of a run live in segments of ``config.checkpoint_every`` iterations: each segment's envs are made
afresh and seeded from (seed, first iteration of the segment) alone, so a run restored from a checkpoint at a
segment boundary goes on exactly as the uninterrupted run did.

With ``config.num_agents`` A > 1 the program trains A independent agents (``num_seeds`` seeds of each setting of
``config.sweep``) on one pool of ``A * num_envs`` envs: the model, optimizer state, key and episode statistics
carry a leading ``A`` axis, the iteration is ``vmap``-ed over it, and agent k's envs are those of the single run
of ``config.agent_configs()[k]``. Agent k computes what that run computes, up to float rounding (see README).
"""

import concurrent.futures
import math
import time
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple, Protocol, runtime_checkable

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax

from ..config import PPOConfig
from ..core.collect import Collector, async_collector, sync_collector
from ..core.envs import AsyncPool, EnvBackend, EnvSpec, Pool, backend, segment_env_seeds
from ..core.iteration import FINITE, Metrics, TrainState, fresh_episodes, make_iteration, make_prime
from ..core.update import OptimizerFor, make_optimizer, swept_optimizer_fields
from .checkpoint import Checkpoint, all_finite, init_checkpoint


def pool_env_seeds(config: PPOConfig, iteration: int) -> list[int]:
    """Seeds of the ``num_agents * num_envs`` envs of one pool that play from ``iteration`` on: agent k's
    ``num_envs`` envs come k-th, with the seeds that its single run (``config.agent_configs()[k]``) gives them."""
    return [s for agent in config.agent_configs() for s in segment_env_seeds(agent.seed, iteration, config.num_envs)]


@runtime_checkable
class Program(Protocol):
    """A segment's compiled iteration, as a placement builds it."""

    def __call__(self, state: TrainState) -> tuple[TrainState, Metrics]: ...
    def prime(self, state: TrainState) -> TrainState: ...
    def compile(self, state: TrainState) -> None: ...


class EnvShare(NamedTuple):
    """Which envs of the run this process steps: ``count`` from ``first`` (all of them when ``count`` is None);
    ``total`` is the run's number when it is more (see ``rollout``'s ``total_envs``)."""

    first: int = 0
    count: int | None = None
    total: int | None = None


@runtime_checkable
class Placement(Protocol):
    """Where the iteration runs: which envs are this process's, how the state is laid out, the program."""

    share: EnvShare

    def place(self, checkpoint: Checkpoint, collector: Collector) -> TrainState: ...
    def program(
        self, config: PPOConfig, collector: Collector, optimizer: optax.GradientTransformation | OptimizerFor
    ) -> Program: ...
    def checkpoint(self, state: TrainState) -> Checkpoint: ...


def _checked(
    unchecked: Callable[[TrainState], tuple[TrainState, Metrics]],
) -> Callable[[TrainState], tuple[TrainState, Metrics]]:
    """``unchecked`` with the ``FINITE`` metric added, so that the host learns it with the others, not after."""

    def iteration(state: TrainState) -> tuple[TrainState, Metrics]:
        state, metrics = unchecked(state)
        return state, {**metrics, FINITE: all_finite((state.model, state.opt_state))}

    return iteration


class _Jitted:
    """The iteration and the priming of one segment, each one ``eqx.filter_jit`` traced at most once."""

    def __init__(self, config: PPOConfig, collector: Collector, optimizer: optax.GradientTransformation | OptimizerFor):
        iteration = eqx.debug.assert_max_traces(_checked(make_iteration(config, collector, optimizer)), max_traces=1)
        prime = eqx.debug.assert_max_traces(make_prime(config, collector), max_traces=1)
        self._iteration = eqx.filter_jit(iteration, donate="all")
        self._prime = eqx.filter_jit(prime, donate="all")

    def __call__(self, state: TrainState) -> tuple[TrainState, Metrics]:
        return self._iteration(state)

    def prime(self, state: TrainState) -> TrainState:
        return self._prime(state)

    def compile(self, state: TrainState) -> None:
        self._prime.lower(state).compile()  # pyright: ignore[reportFunctionMemberAccess]
        self._iteration.lower(state).compile()  # pyright: ignore[reportFunctionMemberAccess]


class OneDevice:
    """The whole iteration as one jitted program on the default device; every env in this process."""

    share = EnvShare()

    def place(self, checkpoint: Checkpoint, collector: Collector) -> TrainState:
        carry = collector.carry(fresh_episodes(checkpoint.stats))
        return TrainState(checkpoint.model, checkpoint.opt_state, carry, checkpoint.key, checkpoint.iteration)

    def program(
        self, config: PPOConfig, collector: Collector, optimizer: optax.GradientTransformation | OptimizerFor
    ) -> Program:
        return _Jitted(config, collector, optimizer)

    def checkpoint(self, state: TrainState) -> Checkpoint:
        return Checkpoint(state.model, state.opt_state, state.key, state.carry.stats, state.iteration)


class _Segment(NamedTuple):
    """The envs that play from iteration ``start`` on, their collector and the program compiled for them."""

    start: int
    pool: Pool | AsyncPool
    collector: Collector
    program: Program


def make_collector(
    env_backend: EnvBackend, config: PPOConfig, seeds: list[int], share: EnvShare
) -> tuple[Pool | AsyncPool, Collector]:
    """A pool of ``seeds`` envs and its collector: EnvPool's async one when ``config.async_batch_size`` > 0."""
    settings = {"num_steps": config.num_steps, "gamma": config.gamma, "gae_lambda": config.gae_lambda}
    if config.async_batch_size:
        pool = env_backend.make_async(config.env_id, seeds, config.async_batch_size)
        return pool, async_collector(pool, **settings)
    pool = env_backend.make(config.env_id, seeds)
    return pool, sync_collector(
        pool, num_agents=config.num_agents, first_env=share.first, total_envs=share.total, **settings
    )


class NonFiniteError(FloatingPointError):
    """The loss or the parameters became NaN or inf; ``record`` is the iteration's metrics (of the first agent
    that went wrong), ``records`` those of every agent."""

    def __init__(self, message: str, record: dict[str, Any], records: list[dict[str, Any]] | None = None):
        super().__init__(message)
        self.record = record
        self.records = [record] if records is None else records


class Trainer:
    """Owns the envs, the optimizer and the compiled iteration; ``state`` is the only thing that changes.

    ``step()`` runs one iteration. After every ``config.checkpoint_every``-th iteration (but the last) the envs
    are replaced by new ones seeded from (seed, iteration) and reset; the running episodes are dropped from the
    statistics. The next segment's envs are made in a background thread while the current segment runs. Where
    the backend ``rebinds`` (ALE), the compiled iteration drives them; EnvPool's XLA call is bound to one pool,
    so there each segment has its own compiled iteration, compiled in that thread too. Each is traced once: a
    retrace (a changed shape or dtype in the state) raises instead of silently recompiling.

    ``restore`` continues from a checkpoint: its model, optimizer state, key, iteration and finished-episode
    statistics, with the envs of the segment that starts at its iteration. ``placement`` says where the
    iteration runs (default ``OneDevice()``; ``parallel.MeshPlacement`` for devices and hosts); ``env_backend``
    makes the envs (default: ``config.env_backend``'s). Call ``close()`` when done.
    """

    def __init__(
        self,
        config: PPOConfig,
        *,
        restore: Checkpoint | None = None,
        placement: Placement | None = None,
        env_backend: EnvBackend | None = None,
    ):
        self.config = config.validate()
        self.backend = env_backend or backend(config.env_backend)
        self.placement = placement or OneDevice()
        # One optimizer, or each agent's of a sweep that varies the optimizer's settings.
        self.optimizer: optax.GradientTransformation | OptimizerFor = (
            make_optimizer if swept_optimizer_fields(config) else make_optimizer(config)
        )
        self.iteration = 0 if restore is None else int(restore.iteration)
        self._segment = self._make_segment(self.iteration)
        self.spec: EnvSpec = self._segment.pool.spec
        restore = init_checkpoint(config, self.spec) if restore is None else restore
        self.state = self._segment.program.prime(self.placement.place(restore, self._segment.collector))
        # The state's shapes and dtypes in arrays that are never donated: later segments compile against it.
        self._example = jax.tree.map(lambda x: jnp.zeros_like(x) if eqx.is_array(x) else x, self.state)
        self._prefetch = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="ppo-eqx-envs")
        self._next: concurrent.futures.Future[_Segment] | None = None
        self._prepare_after(self.iteration)

    def _make_segment(self, start: int, program: Program | None = None) -> _Segment:
        share = self.placement.share
        seeds = pool_env_seeds(self.config, start)
        if share.count is not None:
            seeds = seeds[share.first : share.first + share.count]
        pool, collector = make_collector(self.backend, self.config, seeds, share)
        program = program or self.placement.program(self.config, collector, self.optimizer)
        return _Segment(start, pool, collector, program)

    def _make_compiled_segment(self, start: int) -> _Segment:
        if self.backend.rebinds:  # the program compiled for the first pool drives the new one: no compile
            return self._make_segment(start, self._segment.program)
        segment = self._make_segment(start)
        segment.program.compile(self._example)
        return segment

    def _prepare_after(self, start: int) -> None:
        """Make and compile the next segment's envs in the background, if the run gets there."""
        every = self.config.checkpoint_every
        next_start = (start // every + 1) * every
        if next_start < self.config.num_iterations:
            self._next = self._prefetch.submit(self._make_compiled_segment, next_start)

    def compile(self) -> float:
        """Compile the iteration ahead of the first step; returns the seconds it took."""
        start = time.perf_counter()
        self._segment.program.compile(self.state)
        return time.perf_counter() - start

    def step(self) -> Metrics:
        """One iteration (dispatched, not waited for); new envs after every ``checkpoint_every``-th."""
        self.state, metrics = self._segment.program(self.state)
        self.iteration += 1
        if self.iteration % self.config.checkpoint_every == 0 and self.iteration < self.config.num_iterations:
            self._new_envs(self.iteration)
        return metrics

    def _new_envs(self, iteration: int) -> None:
        if self._next is None:
            raise RuntimeError(f"no envs were prepared for iteration {iteration}")
        segment = self._next.result()
        if segment.start != iteration:
            raise RuntimeError(f"envs were prepared for iteration {segment.start}, not {iteration}")
        old, self._segment, self._next = self._segment, segment, None
        carry = segment.collector.carry(fresh_episodes(self.state.carry.stats))
        self.state = segment.program.prime(eqx.tree_at(lambda s: s.carry, self.state, carry))
        old.pool.close()
        self._prepare_after(iteration)

    def checkpoint(self) -> Checkpoint:
        """The state to save now; the next ``step()`` donates its arrays, so save it before."""
        return self.placement.checkpoint(self.state)

    def finite(self) -> bool:
        """Whether the model and the optimizer state are free of NaN and inf."""
        checkpoint = self.checkpoint()
        return bool(all_finite((checkpoint.model, checkpoint.opt_state)))

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
    are NaN or inf. For a single agent; ``run_seeds`` yields every agent's records.
    """
    if trainer.config.num_agents != 1:
        raise ValueError(f"run() is for one agent; use run_seeds() for num_agents={trainer.config.num_agents}")
    for records in run_seeds(trainer, num_iterations=num_iterations):
        yield records[0]


def agent_records(config: PPOConfig, iteration: int, metrics: dict[str, Any], seconds: float) -> list[dict[str, Any]]:
    """One host-side record per agent of an iteration's (fetched) metrics; ``seconds`` the iteration took."""
    records = []
    for agent in range(config.num_agents):
        record: dict[str, Any] = {"iteration": iteration, "global_step": iteration * config.batch_size}
        record["sps"] = config.batch_size / seconds
        record.update({name: float(np.reshape(value, -1)[agent]) for name, value in metrics.items()})
        records.append(record)
    return records


def run_seeds(
    trainer: Trainer, *, num_iterations: int | None = None, pause: Callable[[int], bool] | None = None
) -> Iterator[list[dict[str, float]]]:
    """``run`` for ``num_agents`` agents: one record per agent and iteration, each as a single run's.

    An agent's ``global_step`` and ``sps`` count its own ``num_envs * num_steps`` steps per iteration.

    The loop never waits for the device between iterations: iteration k+1 is dispatched before k's metrics
    are read, unless ``pause(k)`` is True (the caller will read the state after k: a checkpoint), in which case
    ``trainer.state`` is that of iteration k when k's records are yielded. Otherwise it may be one ahead
    (``trainer.iteration``): keep iterating to receive that iteration's records.
    """
    config, pause = trainer.config, pause or (lambda iteration: False)
    start = last = time.perf_counter()
    total = config.num_iterations if num_iterations is None else num_iterations
    pending = trainer.step() if trainer.iteration < total else None
    while pending is not None:
        iteration = trainer.iteration
        # When iteration k ended: before k+1 is dispatched if k is done by then (a backend that ran it within its
        # dispatch, as XLA:CPU does with EnvPool's step), else once its metrics arrive.
        before_ahead = time.perf_counter()
        done = all(leaf.is_ready() for leaf in jax.tree.leaves(pending))
        ahead = trainer.step() if iteration < total and not pause(iteration) else None
        metrics = jax.device_get(pending)
        finite = np.asarray(metrics.pop(FINITE)).all()
        now = before_ahead if done else time.perf_counter()
        records = agent_records(config, iteration, metrics, now - last)
        for record in records:
            record["time_elapsed"] = now - start
        last = now
        _check_finite(config, iteration, records, bool(finite))
        yield records
        pending = ahead if ahead is not None else trainer.step() if trainer.iteration < total else None


def _check_finite(config: PPOConfig, iteration: int, records: list[dict[str, Any]], finite: bool) -> None:
    names = config.agent_names()
    for agent, record in enumerate(records):
        if not math.isfinite(record["loss"]):
            which = f" of agent {names[agent]}" if config.num_agents > 1 else ""
            raise NonFiniteError(f"the loss{which} is {record['loss']} at iteration {iteration}", record, records)
    if not finite:
        raise NonFiniteError(f"the parameters are not finite after iteration {iteration}", records[0], records)
