"""Where the iteration runs: the ``Placement`` protocol the ``Trainer`` composes, and ``OneDevice``, the whole
iteration as one jitted program on the default device (``ppo_eqx.host.mesh.MeshPlacement`` is the other)."""

from typing import NamedTuple, Protocol, runtime_checkable

import equinox as eqx

from ..config import PPOConfig
from ..core.collect import Collector
from ..core.envs import EnvSpec
from ..core.iteration import Metrics, make_iteration, make_prime
from ..core.networks import ConvRoute
from ..core.state import Checkpoint, TrainState, fresh_episodes
from ..hyperparameters import AgentHyperparameters, Sizes
from .checkpoint import init_checkpoint


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

    def place(
        self, checkpoint: Checkpoint, collector: Collector, hyperparameters: AgentHyperparameters
    ) -> TrainState: ...
    def program(self, collector: Collector, sizes: Sizes) -> Program: ...
    def checkpoint(self, state: TrainState) -> Checkpoint: ...


class _Jitted:
    """The iteration and the priming of one segment, each one ``eqx.filter_jit`` traced at most once."""

    def __init__(self, collector: Collector, sizes: Sizes):
        iteration = eqx.debug.assert_max_traces(make_iteration(collector, sizes), max_traces=1)
        prime = eqx.debug.assert_max_traces(make_prime(collector, sizes), max_traces=1)
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

    def place(self, checkpoint: Checkpoint, collector: Collector, hyperparameters: AgentHyperparameters) -> TrainState:
        carry = collector.carry(fresh_episodes(checkpoint.stats))
        return TrainState(
            checkpoint.model, checkpoint.opt_state, carry, checkpoint.key, checkpoint.iteration, hyperparameters
        )

    def program(self, collector: Collector, sizes: Sizes) -> Program:
        return _Jitted(collector, sizes)

    def checkpoint(self, state: TrainState) -> Checkpoint:
        return Checkpoint(state.model, state.opt_state, state.key, state.carry.stats, state.iteration)


def init_state(config: PPOConfig, spec: EnvSpec, collector: Collector, *, conv_impl: ConvRoute) -> TrainState:
    """A fresh run's training state on one device: ``config``'s agents (``init_checkpoint``) with the carry of
    ``collector``'s envs, ready for ``make_iteration(collector, config.sizes)`` (after ``make_prime``'s priming,
    for an async collector)."""
    checkpoint = init_checkpoint(config, spec, conv_impl=conv_impl)
    return OneDevice().place(checkpoint, collector, config.agent_hyperparameters())
