"""The ``Trainer``'s placement for data parallelism over a mesh of devices, which may span several processes:
each process rolls out its own envs, the update is ``core.sharded.sharded_update`` of the global batch, and the
stages of the iteration are those of one device (``core.iteration.compose``), with the batch sharded between them.
"""

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from jaxtyping import Array, PRNGKeyArray, PyTree, Shaped

from ..config import PPOConfig
from ..core._types import Batch, EpisodeStats, SequenceBatch
from ..core.collect import Collector
from ..core.envs import EnvBackend
from ..core.hyperparameters import AgentHyperparameters, Sizes
from ..core.iteration import Collected, Metrics, collect, compose, learn
from ..core.networks import Policy
from ..core.rollout import fresh_episodes
from ..core.sharded import replicate, shard_batch, sharded_update
from ..core.state import Checkpoint, TrainState
from ..core.update import Loss, OptimizerFactory, make_optimizer, model_loss
from ..errors import ConfigError
from .compiled import own_jit
from .fresh import EnvShare


def local(tree: PyTree) -> PyTree:
    """This process's copy of a replicated tree: each global array's first addressable shard (no copy)."""
    return jax.tree.map(lambda x: x.addressable_data(0) if isinstance(x, jax.Array) else x, tree)


def gather_envs(x: Shaped[Array, "n ..."]) -> np.ndarray:
    """Every process's per-env values, in process order: ``[n, ...]`` here -> ``[P*n, ...]`` (on the host)."""
    if jax.process_count() == 1:
        return np.asarray(x)
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def any_process(flag: bool) -> bool:
    """True in every process when ``flag`` is True in any of them (one collective; free in one process)."""
    if jax.process_count() == 1:
        return flag
    return bool(np.any(multihost_utils.process_allgather(np.asarray(flag))))


def check_mesh_config(config: PPOConfig, mesh: Mesh, env_backend: EnvBackend) -> None:
    """Raise ConfigError unless ``config`` can train on ``mesh`` with its envs from ``env_backend`` (``MeshPlacement``
    checks it as it is made: the command line makes it, with the backend its plan resolved, before anything is
    written)."""
    num_devices = mesh.size
    if config.num_seeds != 1:
        raise ConfigError(f"num_seeds={config.num_seeds} cannot train on a mesh of {num_devices} devices; allowed: 1")
    if config.sweep:
        raise ConfigError(
            f"a sweep of {len(config.settings)} settings cannot train on a mesh of {num_devices} devices; allowed: "
            "no sweep"
        )
    if config.async_batch_size:
        raise ConfigError(
            f"async_batch_size={config.async_batch_size} cannot train on a mesh of {num_devices} devices; allowed: 0"
        )
    if env_backend.state_is_data:
        raise ConfigError(
            f"env_backend={config.env_backend!r} cannot train on a mesh of {num_devices} devices (its envs run in the "
            "program: not done yet); allowed: envpool, ale"
        )
    if config.rollout_on in ("host", "host-envs"):
        raise ConfigError(
            f"rollout_on={config.rollout_on!r} cannot train on a mesh of {num_devices} devices (each process steps "
            "its envs in the mesh's program); allowed: rollout_on='device' or 'auto'"
        )
    if config.iterations_per_dispatch != 1:
        raise ConfigError(
            f"iterations_per_dispatch={config.iterations_per_dispatch} cannot train on a mesh of {num_devices} "
            "devices (each iteration is two programs there); allowed: 1"
        )
    if config.num_envs % num_devices or config.minibatch_size % num_devices:
        raise ConfigError(
            f"num_envs={config.num_envs} and the minibatch size {config.minibatch_size} must be multiples of the "
            f"{num_devices} devices"
        )


class MeshPlacement:
    """The ``Trainer``'s placement for data parallelism over ``mesh``, which may span several processes (hosts).

    Each process steps its own pool of ``num_envs / P`` envs: env i of the run (its seed as in the one-process
    run) lives in the process whose devices come ``i // (num_envs / P)``-th in the mesh, and draws the action it
    would draw there (``rollout``'s ``first_env``). Each process rolls out and computes GAE for its envs on its
    first device; the update is ``sharded_update`` of the global ``[T, N]`` batch, so the run computes what the
    one-device run computes, up to the order of floating-point sums.

    The model, optimizer state and hyperparameters are global arrays replicated over ``mesh``; the carry, key and
    iteration are the process's own (the key and iteration are the same everywhere). A ``Trainer``'s ``step`` and
    ``checkpoint`` are then collective: every process must call them, in the same order. ``checkpoint`` returns
    the one-process run's checkpoint, the same in every process (write it from one).
    """

    def __init__(self, config: PPOConfig, mesh: Mesh, env_backend: EnvBackend):
        check_mesh_config(config, mesh, env_backend)
        processes = jax.process_count()
        order = [d.process_index for d in mesh.devices.flat]
        positions = [i for i, p in enumerate(order) if p == jax.process_index()]
        contiguous = positions == list(range(positions[0], positions[0] + len(positions)))
        if not contiguous or len(positions) * processes != len(order):
            raise ValueError("each process must hold an equal, contiguous block of the mesh's devices")
        local_envs = config.num_envs // processes
        self.share = EnvShare(positions[0] // len(positions) * local_envs, local_envs, config.num_envs)
        self.mesh, self.config = mesh, config
        self._static: Any = None
        self._learn: Any = None

    def place(self, checkpoint: Checkpoint, collector: Collector, hyperparameters: AgentHyperparameters) -> TrainState:
        own = slice(self.share.first, self.share.first + (self.share.count or 0))
        stats = jax.tree.map(lambda x: jnp.asarray(np.asarray(x)[own]), checkpoint.envs)
        carry = collector.carry(fresh_episodes(stats))
        self._static = eqx.partition(checkpoint.model, eqx.is_array)[1]
        model, opt_state = replicate(checkpoint.model, self.mesh), replicate(checkpoint.opt_state, self.mesh)
        hyperparameters = replicate(hyperparameters, self.mesh)
        return TrainState(model, opt_state, carry, checkpoint.key, checkpoint.iteration, hyperparameters)

    def program(
        self,
        collector: Collector,
        sizes: Sizes,
        *,
        loss: Loss = model_loss,
        optimizer: OptimizerFactory = make_optimizer,
    ) -> "_MeshProgram":
        if self._learn is None:
            self._learn = jax.jit(self._learn_fn(sizes, loss, optimizer))
        return _MeshProgram(self, collector)

    def _learn_fn(self, sizes: Sizes, loss: Loss, optimizer: OptimizerFactory) -> Any:
        def update(
            model: Policy,
            opt_state: PyTree,
            batch: Batch | SequenceBatch,
            hyperparameters: AgentHyperparameters,
            key: PRNGKeyArray,
        ) -> Any:
            if isinstance(batch, SequenceBatch):  # refused before: a mesh carries no recurrent memory
                raise TypeError("the mesh's update takes flat batches, not a recurrent policy's sequences")
            return sharded_update(
                model,
                opt_state,
                batch,
                hyperparameters,
                mesh=self.mesh,
                sizes=sizes,
                loss=loss,
                optimizer=optimizer,
                key=key,
            )

        def learn_arrays(
            params: PyTree, opt_state: PyTree, batch: Batch, hyperparameters: AgentHyperparameters, key: PRNGKeyArray
        ) -> tuple[PyTree, PyTree, Metrics]:
            """``learn`` with ``sharded_update`` on the model's arrays (``jax.jit`` of this lowers for a batch of
            shapes alone)."""
            model = eqx.combine(params, self._static)
            model, opt_state, metrics = learn(model, opt_state, batch, hyperparameters, key, update=update)
            return eqx.filter(model, eqx.is_array), opt_state, metrics

        return learn_arrays

    def learn(self, state: TrainState, collected: Collected) -> tuple[Policy, PyTree, Metrics]:
        """The learn stage: the data-parallel update of this process's share of the batch, sharded over the mesh;
        the model, optimizer state and this process's copy of the metrics."""
        params = eqx.filter(state.model, eqx.is_array)
        if isinstance(collected.batch, SequenceBatch):  # refused before: a mesh carries no recurrent memory
            raise TypeError("the mesh's update takes flat batches, not a recurrent policy's sequences")
        batch, key = shard_batch(collected.batch, self.mesh), replicate(collected.update_key, self.mesh)
        params, opt_state, metrics = self._learn(params, state.opt_state, batch, state.hyperparameters, key)
        return eqx.combine(params, self._static), opt_state, {name: local(value) for name, value in metrics.items()}

    def compile_learn(self, state: TrainState) -> None:
        """Compile the sharded update for the global batch's shapes, dtypes and shardings."""
        mesh, obs = self.mesh, state.carry.obs
        steps_envs = (self.config.num_steps, self.config.num_envs)
        split = NamedSharding(mesh, PartitionSpec(None, mesh.axis_names[0]))
        floats = jax.ShapeDtypeStruct(steps_envs, jnp.float32, sharding=split)
        batch = Batch._make(
            [
                jax.ShapeDtypeStruct(steps_envs + obs.shape[1:], obs.dtype, sharding=split),
                jax.ShapeDtypeStruct(steps_envs, jnp.int32, sharding=split),
                *[floats] * 4,
            ]
        )
        key = jax.ShapeDtypeStruct(state.key.shape, state.key.dtype, sharding=NamedSharding(mesh, PartitionSpec()))
        params = eqx.filter(state.model, eqx.is_array)
        self._learn.lower(params, state.opt_state, batch, state.hyperparameters, key).compile()

    def checkpoint(self, state: TrainState, collector: Collector) -> Checkpoint:
        stats = jax.tree.map(lambda x: jnp.asarray(gather_envs(x)), state.carry.stats)
        return Checkpoint(local(state.model), local(state.opt_state), state.key, stats, state.iteration)

    def rollout_record(self) -> dict[str, Any]:
        return {"on": "device"}  # the mesh's two programs, on its devices


def every_process_stats(stats: EpisodeStats) -> EpisodeStats:
    """This process's episode statistics with the finished episodes of every process's envs (``gather_envs``),
    from which the run's ``episode_metrics`` are computed."""
    return stats._replace(
        returned_episode_returns=gather_envs(stats.returned_episode_returns),
        returned_episode_lengths=gather_envs(stats.returned_episode_lengths),
    )


class _MeshProgram:
    """One data-parallel iteration, ``compose``d as on one device from two programs: the collect stage of this
    process's envs (compiled against its pool), then the placement's sharded learn stage."""

    length = 1
    """One iteration a call (``Program.length``)."""

    def __init__(self, placement: MeshPlacement, collector: Collector):
        def collect_local(
            model_and_hyperparameters: tuple[Policy, AgentHyperparameters], carry: Any, key: PRNGKeyArray
        ) -> Collected:
            model, hyperparameters = model_and_hyperparameters
            return collect(model, carry, key, hyperparameters, collector=collector)

        self.placement, self.collector = placement, collector
        self._collect = own_jit(collect_local, donate="all-except-first")
        self._iteration = compose(self._collect_stage, placement.learn, every_process_stats)

    def _collect_stage(self, state: TrainState) -> Collected:
        return self._collect((local(state.model), local(state.hyperparameters)), state.carry, state.key)

    def __call__(self, state: TrainState, count: int = 1) -> tuple[TrainState, Metrics]:
        return self._iteration(state)

    def prime(self, state: TrainState) -> TrainState:
        carry, key = self.collector.prime(local(state.model), state.carry, state.key)
        return eqx.tree_at(lambda s: (s.carry, s.key), state, (carry, key))

    def compile(self, state: TrainState) -> None:
        model_and_hyperparameters = (local(state.model), local(state.hyperparameters))
        self._collect.compile(model_and_hyperparameters, state.carry, state.key)
        self.placement.compile_learn(state)
