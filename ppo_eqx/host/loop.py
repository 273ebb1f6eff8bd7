"""The host loop: dispatch programs on a ``Trainer`` (an iteration each, or a chunk of them), read each one's
metrics as the next runs, and turn them into one record per agent and iteration (``run_agents``; ``run`` for one
agent, ``train`` from a config)."""

import contextlib
import math
import time
from collections.abc import Callable, Iterator
from typing import Any

import jax
import numpy as np

from ..config import PPOConfig
from ..core.iteration import FINITE
from ..errors import NonFiniteError
from .trainer import Dispatch, Trainer


def train(config: PPOConfig, *, num_iterations: int | None = None) -> Iterator[dict[str, float]]:
    """Train with ``config``, yielding one dict of host-side metrics per iteration (``run``); the trainer is closed
    when the loop ends or is left. Use ``Trainer`` and ``run`` to keep the final state."""
    with Trainer(config) as trainer:
        yield from run(trainer, num_iterations=num_iterations)


def run(trainer: Trainer, *, num_iterations: int | None = None) -> Iterator[dict[str, float]]:
    """The host loop over ``trainer.dispatch()``; stops after ``config.num_iterations`` in all (or
    ``num_iterations``).

    Each record holds ``iteration``, ``global_step``, ``sps`` (env steps per second of this iteration; of its
    chunk, where one program runs several), ``time_elapsed`` (seconds since the loop started, the first
    program's compile included, at the end of the program that ran the iteration) and the
    iteration's metrics as floats. Raises NonFiniteError (naming the iteration) instead of yielding an
    iteration whose loss or parameters are NaN or inf. For a single agent; ``run_agents`` yields every agent's.
    """
    if trainer.config.num_agents != 1:
        raise ValueError(f"run() is for one agent; use run_agents() for num_agents={trainer.config.num_agents}")
    for records in run_agents(trainer, num_iterations=num_iterations):
        yield records[0]


def agent_records(config: PPOConfig, iteration: int, metrics: dict[str, Any], seconds: float) -> list[dict[str, Any]]:
    """One host-side record per agent of an iteration's (fetched) metrics; ``seconds`` the iteration took."""
    # Each metric as floats once (float64 holds each float32 exactly): hundreds of agents make hundreds of rows.
    columns = {name: np.asarray(value, np.float64).reshape(-1).tolist() for name, value in metrics.items()}
    records = []
    for agent in range(config.num_agents):
        record: dict[str, Any] = {"iteration": iteration, "global_step": iteration * config.batch_size}
        record["sps"] = config.batch_size / seconds
        record.update({name: column[agent] for name, column in columns.items()})
        records.append(record)
    return records


def run_agents(
    trainer: Trainer,
    *,
    num_iterations: int | None = None,
    pause: Callable[[int], bool] | None = None,
    hold: Callable[[int], bool] | None = None,
    time_offset: float = 0.0,
    after_program: Callable[[], None] | None = None,
) -> Iterator[list[dict[str, float]]]:
    """``run`` for ``num_agents`` agents: one record per agent and iteration, each as a single run's.

    An agent's ``global_step`` and ``sps`` count its own ``num_envs * num_steps`` steps per iteration;
    ``time_elapsed`` starts at ``time_offset`` (the seconds a resumed run had trained before).

    The loop never waits for the device between programs: the program after the one ending at iteration k is
    dispatched before k's metrics are read, unless ``pause(k)`` is True (the caller will read the state after k:
    a checkpoint), in which case ``trainer.state`` is that of iteration k when k's records are yielded, or the
    program runs a host loop (``Dispatch.overlaps``); otherwise it may be ahead (``trainer.iteration``): keep
    iterating to receive those iterations' records. ``hold(k)`` True asks for k's state as a checkpoint only: where
    the trainer can keep a copy (``Trainer.holds``) it holds one (``checkpoint()`` is k's while k's records are
    yielded) and the next program runs meanwhile, elsewhere the loop pauses as for ``pause`` (``_ahead``). Each
    record's ``sps`` is its iteration's own. With programs of several iterations, ``pause`` is asked at each
    program's end, and their records come together after it; each program runs as many of its iterations as take
    about ``DISPATCH_SECONDS`` at the pace measured so far (one, the first time), so that a stop request (Ctrl-C) is
    acted on within seconds however slow an env is. ``after_program()`` is called once a program's records have all
    been taken, before the loop waits again (the command's writers write what they hold then).
    """
    if trainer.closed:
        raise RuntimeError("this Trainer is closed (its envs and programs are gone); make a new one")
    config, pause, hold = trainer.config, pause or _never, hold or _never
    start = last = time.perf_counter()
    total = config.num_iterations if num_iterations is None else num_iterations
    pace = _Pace()
    pending = trainer.dispatch(total, most=pace.most()) if trainer.iteration < total else None
    try:
        while pending is not None:
            # When the program ended: before the next is dispatched if it is done by then (a backend that ran it
            # within its dispatch, as XLA:CPU does with EnvPool's step), else once its metrics arrive.
            before_ahead = time.perf_counter()
            with _faults_of(pending):
                done = all(leaf.is_ready() for leaf in jax.tree.leaves(pending.metrics))
            ahead, failed = _ahead(trainer, pending, total, pause, hold, pace)
            with _faults_of(pending):
                rows = pending.rows(jax.device_get(pending.metrics))
            now = before_ahead if done else time.perf_counter()
            pace.measured(now - last, pending.count)
            yield from _records(config, rows, pending.first, (now - last) / pending.count, now - start + time_offset)
            trainer.release()
            if after_program is not None:
                after_program()
            if failed is not None:
                raise failed
            last = now
            if ahead is None and trainer.iteration < total:
                ahead = trainer.dispatch(total, most=pace.most())
            pending = ahead
    finally:
        trainer.release()


FAULT_ITERATIONS = "ppo_eqx_iterations"
"""The attribute ``run_agents`` sets on an error that reading a program's metrics raised: the program's iterations,
``(first, last)``; the fault is theirs, not those of the program dispatched after it."""


@contextlib.contextmanager
def _faults_of(pending: Dispatch) -> Iterator[None]:
    """An error raised in the block (a program's fault, met where its metrics are read) named with its iterations."""
    try:
        yield
    except Exception as error:
        with contextlib.suppress(AttributeError, TypeError):  # a built-in exception without a __dict__
            setattr(error, FAULT_ITERATIONS, (pending.first, pending.end))
        raise


def _ahead(
    trainer: Trainer,
    pending: Dispatch,
    total: int,
    pause: Callable[[int], bool],
    hold: Callable[[int], bool],
    pace: "_Pace",
) -> tuple[Dispatch | None, Exception | None]:
    """The program after ``pending``, dispatched before ``pending``'s metrics are read where it may be (``run_agents``:
    not paused, ``pending``'s state held where a checkpoint is due), with the error its dispatch raised (XLA:CPU runs
    a program there), which ``run_agents`` raises after ``pending``'s records. A program whose dispatch runs a host
    loop is followed once its metrics are read: the next one's loop waits for its update anyway, and its time ends
    where its update does, not after the next one's rollout."""
    end = pending.end
    if end >= total or pause(end):
        return None, None
    if hold(end):
        if not (trainer.holds and pending.overlaps):
            return None, None
        trainer.hold()
    if not pending.overlaps:
        return None, None
    try:
        return trainer.dispatch(total, most=pace.most()), None
    except Exception as error:  # raised by its dispatch: the records before it first
        return None, error


def _records(
    config: PPOConfig, rows: list[dict[str, Any]], first: int, seconds: float, elapsed: float
) -> Iterator[list[dict[str, Any]]]:
    """The records of a program's ``rows`` (iterations ``first`` on), each iteration ``seconds`` long, all at
    ``elapsed`` (``time_elapsed``); NonFiniteError where an iteration's update was not finite."""
    for iteration, metrics in enumerate(rows, start=first):
        finite = np.asarray(metrics.pop(FINITE)).all()
        records = agent_records(config, iteration, metrics, seconds)
        for record in records:
            record["time_elapsed"] = elapsed
        _check_finite(config, iteration, records, bool(finite))
        yield records


def _never(iteration: int) -> bool:
    return False


DISPATCH_SECONDS = 10.0
"""About how long one program of several iterations may run (``iterations_per_dispatch``): the loop acts on a stop
request, writes checkpoints and reads metrics between programs."""


class _Pace:
    """How many iterations the next program may run: one until an iteration's time is known, then as many as take
    about ``DISPATCH_SECONDS`` (the program's own length bounds it: ``Trainer.dispatch``)."""

    def __init__(self) -> None:
        self.per_iteration: float | None = None

    def measured(self, seconds: float, iterations: int) -> None:
        self.per_iteration = max(seconds, 0.0) / max(iterations, 1)

    def most(self) -> int:
        if self.per_iteration is None:
            return 1
        return max(1, int(DISPATCH_SECONDS / max(self.per_iteration, 1e-9)))


def _check_finite(config: PPOConfig, iteration: int, records: list[dict[str, Any]], finite: bool) -> None:
    names = config.agent_names()
    for agent, record in enumerate(records):
        if not math.isfinite(record["loss"]):
            which = f" of agent {names[agent]}" if config.num_agents > 1 else ""
            raise NonFiniteError(f"the loss{which} is {record['loss']} at iteration {iteration}", record, records)
    if not finite:
        raise NonFiniteError(f"the parameters are not finite after iteration {iteration}", records[0], records)
