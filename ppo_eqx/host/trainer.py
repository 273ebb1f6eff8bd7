"""The ``Trainer``: it composes an env backend (``core.envs.EnvBackend``: makes the pools), a collector
(``core.collect``: turns a pool into batches) and a placement (``placement.OneDevice``, or
``mesh.MeshPlacement``: where the iteration runs), and owns the envs of a run, segment by segment.

The envs of a host backend (EnvPool, ALE) live in segments of ``config.checkpoint_every`` iterations: each
segment's envs are made afresh and seeded from (seed, first iteration of the segment) alone, so a run restored
from a checkpoint at a segment boundary goes on exactly as the uninterrupted run did. A backend whose env state
is data (gymnax) has one pool for the whole run: its state is saved in every checkpoint instead.

With ``config.num_agents`` S > 1 the program trains S independent agents (``num_seeds`` seeds of each setting of
``config.sweep``) on one pool of ``S * num_envs`` envs: agent k's envs are those of the single run of
``config.agent_configs()[k]``, and agent k computes what that run computes, up to float rounding (see README).
"""

import concurrent.futures
import contextlib
import time
from types import TracebackType
from typing import TYPE_CHECKING, Any, NamedTuple, cast

import equinox as eqx
import jax
import jax.numpy as jnp

from ..config import PPOConfig
from ..core.collect import Collector
from ..core.envs import AsyncPool, EnvBackend, EnvSpec, Pool
from ..core.envs.jax_env import env_backend_of
from ..core.iteration import Metrics
from ..core.networks import ConvRoute, NetworkInit, conv_route_of
from ..core.state import Checkpoint, ModelFactory
from ..core.update import Loss, OptimizerFactory, check_loss
from ..errors import ConfigError
from .fresh import init_checkpoint, make_collector, memory_of, pool_env_seeds
from .kernel_build import ready, resolve_conv_impl_for
from .named import backend_named, check_backend, check_user_code, loss_named, network_named, optimizer_named
from .placement import Placement, Program, placement_for

if TYPE_CHECKING:
    from .host_loop import HostLoop


class Dispatch(NamedTuple):
    """One program's run, dispatched (not waited for): ``count`` iterations, the last of which is ``end``, and
    their metrics, device arrays: stacked ``[K, ...]`` (the first ``count`` rows) when ``stacked``, else the one
    iteration's."""

    end: int
    count: int
    metrics: Metrics
    stacked: bool
    overlaps: bool = True
    """Whether the next program may be dispatched before these metrics are read: False where the program's dispatch
    runs a host loop (``Program.host_loop``), which waits for this one's update anyway."""

    @property
    def first(self) -> int:
        """The program's first iteration."""
        return self.end - self.count + 1

    def rows(self, fetched: dict[str, Any]) -> list[dict[str, Any]]:
        """Each iteration's metrics, oldest first, from ``jax.device_get(self.metrics)``."""
        if not self.stacked:
            return [fetched]
        return [{name: value[i] for name, value in fetched.items()} for i in range(self.count)]


class _Segment(NamedTuple):
    """The envs that play from iteration ``start`` on, their collector and the program compiled for them."""

    start: int
    pool: "Pool | AsyncPool | HostLoop"
    collector: Collector
    program: Program


class Trainer:
    """Owns the envs and the compiled iteration; ``state`` is the only thing that changes.

    ``dispatch()`` runs one program: one iteration, or with ``config.iterations_per_dispatch`` K > 1 up to K of
    them, never past a multiple of ``checkpoint_every`` (where checkpoints are written). For a host backend,
    after every ``config.checkpoint_every``-th iteration (but the last) the envs are replaced by new ones seeded
    from (seed, iteration) and reset; the running episodes are dropped from the statistics. The next segment's
    envs are made in a background thread while the current segment runs. Where the backend ``rebinds`` (ALE), the
    compiled iteration drives them; EnvPool's XLA call is bound to one pool, so there each segment has its own
    compiled iteration, compiled in that thread too. A backend whose env state is data (gymnax) keeps its one
    pool for the run. Each program is traced once: a retrace (a changed shape or dtype in the state) raises
    instead of silently recompiling.

    ``restore`` continues from a checkpoint: its model (with the convolutions it was loaded with), optimizer
    state, key and iteration, with the envs of the segment that starts at its iteration and the finished-episode
    statistics (or, where the env state is data, the envs as they were saved). ``conv_impl`` is how a fresh
    model computes its convolutions (default: ``config.conv_impl`` resolved here, ``resolve_conv_impl_for``);
    ``trainer.conv_impl`` is what the model computes. ``placement`` says
    where the iteration runs (default: what ``config.rollout_on`` asks for, ``placement_for``: ``OneDevice()``, or
    ``split.SplitPlacement`` with the rollout on the host's CPU; ``mesh.MeshPlacement`` for devices and hosts);
    ``env`` is an env object of the user's with gymnax's interface (or gymnax's ``(env, params)``, or a ``JaxEnv``:
    ``core.envs.jax_env``), for a config of ``PPOConfig.for_task(env)``; else ``env_backend`` makes the envs (default:
    ``config.env_backend``'s). ``spec`` is theirs (default: the backend's spec of ``config.env_id``: a caller that
    resolved both once passes them in). ``loss`` is the loss each minibatch step descends (``core.update.Loss``;
    default: the one ``config.loss`` names, CleanRL's ``model_loss`` unless it names one of the user's): the values
    it reports are metrics. ``model`` makes a fresh agent's model (``core.state.ModelFactory``: ``(spec, key) ->
    Policy``; default: the one ``config.network`` names, ppo_eqx's own unless it names one of the user's) and
    ``optimizer`` its optimizer (``core.update.OptimizerFactory``: ``(hyperparameters, sizes) ->
    optax.GradientTransformation``; default: the one ``config.optimizer`` names, CleanRL's Adam unless it names the
    user's); a model or an optimizer of the user's is traced once, here, and checked against the task. Use it as a
    context manager, or call ``close()`` when done.
    """

    _held: tuple[int, Checkpoint] | None = None
    """The iteration and checkpoint that ``hold()`` kept, until ``release()``."""

    def __init__(
        self,
        config: PPOConfig,
        *,
        restore: Checkpoint | None = None,
        placement: Placement | None = None,
        env_backend: EnvBackend | None = None,
        conv_impl: ConvRoute | None = None,
        spec: EnvSpec | None = None,
        env: Any = None,
        loss: Loss | None = None,
        model: ModelFactory | None = None,
        optimizer: OptimizerFactory | None = None,
    ):
        if not isinstance(config, PPOConfig):
            raise TypeError(f"config={config!r}; allowed: a PPOConfig (PPOConfig.for_task(env_id))")
        self.config = config.validate()
        self.loss = loss_named(config.loss) if loss is None else check_loss(loss)
        if env_backend is None:
            env_backend = backend_named(config.env_backend) if env is None else env_backend_of(env, config.env_backend)
        self.backend = env_backend
        self.spec: EnvSpec = spec or check_backend(self.backend, config.env_backend, config.env_id, config.seed)
        # The route a fresh model takes (a restored one has its own: nothing is resolved, or built, for it).
        route = conv_impl or (None if restore is None else conv_route_of(restore.model))
        route = route or resolve_conv_impl_for(config.conv_impl, self.spec)  # type: ignore[arg-type]
        self.model = (
            network_named(config.network, conv_impl=route, init=cast(NetworkInit, config.network_init))
            if model is None
            else model
        )
        self.optimizer = optimizer_named(config.optimizer) if optimizer is None else optimizer
        self._check_factories(restore)
        self._memory = memory_of(self.model, self.spec)
        self.placement = placement or placement_for(config, self.spec, self.backend)
        self._check_memory_carried()
        restore = self._first_checkpoint(restore, route)
        self.conv_impl: ConvRoute | None = conv_route_of(restore.model)
        ready(self.conv_impl)
        # The compiled program donates the state it is given: place a copy, so that ``restore`` stays the caller's.
        own: Checkpoint = jax.tree.map(_copy, restore)
        self.iteration = int(own.iteration)
        self._segment = self._make_segment(self.iteration)
        placed = self.placement.place(own, self._segment.collector, config.agent_hyperparameters())
        self.state = self._segment.program.prime(placed)
        # The state's shapes, dtypes and shardings in arrays that are never donated: later segments compile against it.
        self._example = jax.tree.map(_copy, self.state)
        self._closed = False
        self._prefetch = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="ppo-eqx-envs")
        self._next: concurrent.futures.Future[_Segment] | None = None
        self._prepare_after(self.iteration)

    def _check_memory_carried(self) -> None:
        """ConfigError where the policy is recurrent and the placement carries no memory per env."""
        if self._memory is not None and not getattr(self.placement, "carries_memory", False):
            raise ConfigError(
                f"network={self.config.network!r} is recurrent and {type(self.placement).__name__} (rollout_on="
                f"{self.config.rollout_on!r}) carries no memory per env; allowed: rollout_on='device' on one device"
            )

    def _first_checkpoint(self, restore: Checkpoint | None, route: ConvRoute) -> Checkpoint:
        """``restore``, checked against the config, or a fresh run's checkpoint at iteration 0 (``route``: the
        convolutions' of a fresh model)."""
        if restore is not None:
            _check_restore(restore, self.config)
            return restore
        return init_checkpoint(
            self.config,
            self.spec,
            conv_impl=route,
            env_backend=self.backend,
            model=self.model,
            optimizer=self.optimizer,
        )

    def _check_factories(self, restore: Checkpoint | None) -> None:
        """The model factory, optimizer and loss, those of the user's traced once against the task (ConfigError
        naming them: ``host.named.check_user_code``)."""
        restored = None if restore is None else restore.model
        if restored is not None and self.config.num_agents > 1:  # a stacked model: one agent's shapes
            restored = jax.tree.map(lambda x: x[0] if eqx.is_array(x) else x, restored)
        check_user_code(
            self.config, self.spec, model=self.model, optimizer=self.optimizer, loss=self.loss, restored=restored
        )

    def __enter__(self) -> "Trainer":
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()

    def _make_segment(self, start: int, program: Program | None = None) -> _Segment:
        share = self.placement.share
        seeds = pool_env_seeds(self.config, start)
        if share.count is not None:
            seeds = seeds[share.first : share.first + share.count]
        # A placement that steps the envs its own way (``HostEnvsPlacement``) makes them and their collector.
        make = getattr(self.placement, "make_collector", make_collector)
        pool, collector = make(self.backend, self.config, seeds, share, self._memory)
        program = program or self.placement.program(
            collector, self.config.sizes, loss=self.loss, optimizer=self.optimizer
        )
        return _Segment(start, pool, collector, program)

    def _make_compiled_segment(self, start: int) -> _Segment:
        if self.backend.rebinds:  # the program compiled for the first pool drives the new one: no compile
            return self._make_segment(start, self._segment.program)
        segment = self._make_segment(start)
        segment.program.compile(self._example)
        return segment

    def _prepare_after(self, start: int) -> None:
        """Make and compile the next segment's envs in the background, if the run gets there and has segments."""
        every = self.config.checkpoint_every
        next_start = (start // every + 1) * every
        if not self.backend.state_is_data and next_start < self.config.num_iterations:
            self._next = self._prefetch.submit(self._make_compiled_segment, next_start)

    def compile(self) -> float:
        """Compile the program ahead of the first dispatch; returns the seconds it took."""
        start = time.perf_counter()
        self._segment.program.compile(self.state)
        return time.perf_counter() - start

    def dispatch(self, until: int | None = None, *, most: int | None = None) -> Dispatch:
        """Run the program once (dispatched, not waited for): up to ``iterations_per_dispatch`` iterations (and at
        most ``most``), ending at the next multiple of ``checkpoint_every`` or at ``until`` (default: the run's end)
        if sooner; new envs after every ``checkpoint_every``-th iteration where the backend has segments. However
        many a program runs, each iteration computes what it computes alone (``core.iteration.over_iterations``)."""
        if self.closed:
            raise RuntimeError("this Trainer is closed (its envs and programs are gone); make a new one")
        config, program = self.config, self._segment.program
        every, until = config.checkpoint_every, config.num_iterations if until is None else until
        boundary = (self.iteration // every + 1) * every
        count = max(1, min(program.length, most or program.length, boundary - self.iteration, until - self.iteration))
        self.state, metrics = program(self.state, count)
        self.iteration += count
        renew = not self.backend.state_is_data and self.iteration % every == 0
        if renew and self.iteration < config.num_iterations:
            self._new_envs(self.iteration)
        return Dispatch(self.iteration, count, metrics, program.length > 1, not getattr(program, "host_loop", False))

    def _new_envs(self, iteration: int) -> None:
        if self._next is None:
            raise RuntimeError(f"no envs were prepared for iteration {iteration}")
        segment = self._next.result()
        if segment.start != iteration:
            raise RuntimeError(f"envs were prepared for iteration {segment.start}, not {iteration}")
        old, self._segment, self._next = self._segment, segment, None
        carry = segment.collector.restore(old.collector.save(self.state.carry))
        self.state = segment.program.prime(eqx.tree_at(lambda s: s.carry, self.state, carry))
        # The old envs' last steps may still run (dispatch is asynchronous) and their program reads the pool's
        # memory: it is freed with ``old``, so not before they are done.
        jax.block_until_ready(self.state)
        old.pool.close()
        self._prepare_after(iteration)

    @property
    def closed(self) -> bool:
        return getattr(self, "_closed", False)

    def checkpoint(self) -> Checkpoint:
        """The state to save now (the one ``hold()`` kept, while it holds one); the next ``dispatch()`` donates the
        state's arrays, so save it before, or hold it."""
        if self._held is not None:
            return self._held[1]
        return self.placement.checkpoint(self.state, self._segment.collector)

    @property
    def holds(self) -> bool:
        """Whether ``hold()`` can keep the state: where the env state is data (gymnax), not live envs."""
        return self.backend.state_is_data

    def hold(self) -> None:
        """Keep a copy of the state now (``self.iteration``'s), in buffers of its own on its devices, as what
        ``checkpoint()`` returns until ``release()``: the next program may be dispatched before the checkpoint is
        saved (a run's writes then overlap its programs). Only where ``holds``."""
        if not self.holds:
            raise RuntimeError(f"{self.backend.name}'s envs are live, not data: their state cannot be held")
        checkpoint = self.placement.checkpoint(self.state, self._segment.collector)
        self._held = (self.iteration, jax.tree.map(_copy, checkpoint))

    def release(self) -> None:
        """Drop the state ``hold()`` kept (if any)."""
        self._held = None

    @property
    def state_iteration(self) -> int:
        """The iteration of the state ``checkpoint()`` returns now: the held one's, else ``iteration``."""
        return self.iteration if self._held is None else self._held[0]

    def close(self) -> None:
        """Wait for the program under way (it steps this trainer's envs, which go with it), stop preparing envs
        (waiting for a compile under way) and let the worker thread go. A closed trainer dispatches nothing."""
        self._closed = True
        with contextlib.suppress(RuntimeError):  # a state whose arrays a failed dispatch donated
            jax.block_until_ready(self.state)
        if self._next is not None:
            self._next.cancel()
            self._next = None
        self._prefetch.shutdown(wait=True)


def _check_restore(restore: Checkpoint, config: PPOConfig) -> None:
    """ConfigError unless ``restore`` holds ``config``'s agents and envs (a checkpoint of another run would train
    with its own number of envs while the records count the config's)."""
    if not isinstance(restore, Checkpoint):
        raise TypeError(f"restore={type(restore).__name__}; allowed: a Checkpoint (ppo_eqx.load_checkpoint)")
    envs = restore.envs
    stats = getattr(envs, "stats", envs)
    returns = getattr(stats, "episode_returns", None)
    want = (config.num_envs,) if config.num_agents == 1 else (config.num_agents, config.num_envs)
    if returns is None or tuple(returns.shape) != want:
        shown = "no episode statistics" if returns is None else f"envs of shape {tuple(returns.shape)}"
        raise ConfigError(
            f"restore holds {shown}; config's are {want} (num_agents, num_envs); allowed: a checkpoint of this "
            "config's run (load_checkpoint with it)"
        )


def _copy(x: Any) -> Any:
    """An array's copy in buffers of its own, on its devices and as it is laid out there (a transfer, where
    ``jnp.copy`` would compile a program for each shape: a dozen of them at a run's start); anything else as it is.
    An array that spans several processes, whose devices this one cannot all reach, is copied by a program."""
    if not eqx.is_array(x):
        return x
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        return jnp.copy(x)
    return jax.device_put(x, x.sharding if isinstance(x, jax.Array) else None, may_alias=False)
