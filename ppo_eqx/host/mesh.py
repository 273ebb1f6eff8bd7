"""Data parallelism: the PPO update with every minibatch split across the devices of a one-axis mesh.

Each device gathers the whole batch, standardises each minibatch's advantages with the whole minibatch's
mean and standard deviation, and computes the PPO loss and its gradient on its own shard of the minibatch;
one ``pmean`` per step averages the gradients, so the gradient is that of the one-device update. Then the
same optax step runs on every device, and the parameters and optimizer state stay replicated. The mesh may span
several processes (``jax.distributed.initialize``): the code is the same, XLA's collectives cross hosts.
"""

from collections.abc import Sequence
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.experimental import multihost_utils
from jax.flatten_util import ravel_pytree
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from jaxtyping import Array, Float, Int, PRNGKeyArray, PyTree, Shaped

from ..config import PPOConfig
from ..core._types import Batch, LossInfo
from ..core.collect import Collector
from ..core.iteration import (
    FINITE,
    Metrics,
    TrainState,
    episode_metrics,
    fresh_episodes,
    update_metrics,
    update_settings,
)
from ..core.loss import normalize_advantages
from ..core.networks import ActorCritic
from ..core.update import OptimizerFor, minibatch_indices, minibatch_steps, params_loss
from ..errors import ConfigError
from .checkpoint import Checkpoint, all_finite
from .trainer import EnvShare


def make_mesh(devices: Sequence[jax.Device] | None = None, *, axis_name: str = "data") -> Mesh:
    """A one-axis mesh over ``devices`` (default ``jax.devices()``: every device of every process)."""
    return Mesh(np.asarray(jax.devices() if devices is None else devices), (axis_name,))


def shard_batch(batch: Batch, mesh: Mesh) -> Batch:
    """This process's envs of a time-major batch (``[T, n, ...]``) as global arrays split over ``mesh`` by env.

    One process: ``batch`` is the whole batch. Several: each passes its own envs, an equal number each, in
    the mesh's process order; the global batch (``[T, N, ...]``) holds them side by side along axis 1.
    """
    sharding = NamedSharding(mesh, PartitionSpec(None, mesh.axis_names[0]))
    return jax.tree.map(lambda x: jax.make_array_from_process_local_data(sharding, np.asarray(x)), batch)


def replicate(tree: PyTree, mesh: Mesh) -> PyTree:
    """The arrays of ``tree`` (identical in every process) as global arrays replicated over ``mesh``."""
    sharding = NamedSharding(mesh, PartitionSpec())
    return jax.tree.map(
        lambda x: jax.make_array_from_process_local_data(sharding, np.asarray(x)) if eqx.is_array(x) else x, tree
    )


def sharded_update(
    model: ActorCritic,
    opt_state: PyTree,
    batch: Batch,
    *,
    mesh: Mesh,
    optimizer: optax.GradientTransformation,
    num_minibatches: int,
    update_epochs: int,
    clip_coef: float | Float[Array, ""],
    vf_coef: float | Float[Array, ""],
    ent_coef: float | Float[Array, ""],
    norm_adv: bool = True,
    clip_vloss: bool = False,
    unroll: int = 1,
    key: PRNGKeyArray,
) -> tuple[ActorCritic, PyTree, LossInfo]:
    """``ppo_eqx.core.update.update`` with each minibatch split evenly across the devices of ``mesh``.

    ``batch`` is time-major, ``[T, N, ...]`` with its N envs split over the devices (``shard_batch``); it is
    the batch ``update`` takes flattened to ``[T*N, ...]``, as the training iteration flattens its rollout.
    Same results and minibatches (the same permutations of the flattened batch, from ``key``) as ``update``
    on that flat batch; the results are replicated over ``mesh``. ``model``, ``opt_state`` and ``key`` are
    replicated (``replicate``). N and the minibatch size must be multiples of the number of devices. How each
    device gets there: ``_local_update``.
    """
    (axis,) = mesh.axis_names
    num_shards = mesh.shape[axis]
    num_steps, num_envs = batch.actions.shape[:2]
    minibatch_size = num_steps * num_envs // num_minibatches
    if minibatch_size % num_shards or num_envs % num_shards:
        raise ValueError(
            f"minibatch size {minibatch_size} or envs {num_envs} is not a multiple of the {num_shards} devices"
        )
    params, static = eqx.partition(model, eqx.is_array)
    indices = minibatch_indices(
        num_steps * num_envs, num_minibatches=num_minibatches, update_epochs=update_epochs, key=key
    )
    indices = _gathered_rows(indices, num_steps, num_envs, num_shards)
    # Advantages are standardised beforehand, with the whole minibatch's statistics (not the shard's).
    loss_fn = params_loss(
        static, clip_coef=clip_coef, vf_coef=vf_coef, ent_coef=ent_coef, norm_adv=False, clip_vloss=clip_vloss
    )
    local_update = _local_update(
        loss_fn, static, optimizer, axis=axis, shard_size=minibatch_size // num_shards, norm_adv=norm_adv, unroll=unroll
    )
    replicated = PartitionSpec()
    params, opt_state, infos = jax.shard_map(
        local_update,
        mesh=mesh,
        in_specs=(replicated, replicated, PartitionSpec(None, axis), replicated),
        out_specs=(replicated, replicated, replicated),
        # The gradients are averaged explicitly (mean_over_devices): no implicit reduction of the replicated
        # parameters' cotangents; the results are the same on every device, as out_specs say.
        check_vma=False,
    )(params, opt_state, batch, indices)
    return eqx.combine(params, static), opt_state, infos


def _gathered_rows(indices: Int[Array, "EM mb"], num_steps: int, num_envs: int, num_shards: int) -> Int[Array, "EM mb"]:
    """Rows of the flat ``[T*N]`` batch as rows of the batch that ``all_gather`` puts together from the shards.

    Row ``t*N + i`` of the flat batch (env ``i = d*n + j`` of device d) is row ``d*T*n + t*n + j`` of the gathered one.
    """
    envs_per_shard = num_envs // num_shards
    step, env = jnp.divmod(indices, num_envs)
    shard, column = jnp.divmod(env, envs_per_shard)
    return (shard * num_steps + step) * envs_per_shard + column


def _local_update(
    loss_fn: Any,
    static: Any,
    optimizer: optax.GradientTransformation,
    *,
    axis: str,
    shard_size: int,
    norm_adv: bool,
    unroll: int,
) -> Any:
    """What each device runs under ``shard_map``.

    A minibatch draws its rows from the whole batch, so each device first gathers the whole batch (one
    ``all_gather`` per call, of the observations already relaid out by ``model.prepare``). From it every
    device standardises each minibatch's advantages with the whole minibatch's mean and standard deviation,
    exactly as ``update`` does, and then computes the loss and its gradient on its own rows of each
    minibatch only. One collective per step averages the gradients (the mean of the devices' equal-sized
    shard means is the minibatch mean), one after the last step the loss diagnostics.
    """

    def mean_over_devices(grads: PyTree) -> PyTree:
        flat, unflatten = ravel_pytree(grads)
        return unflatten(jax.lax.pmean(flat, axis))  # one all-reduce for all the gradients

    def local_update(
        params: PyTree, opt_state: PyTree, shard: Batch, indices: Int[Array, "EM mb"]
    ) -> tuple[PyTree, PyTree, LossInfo]:
        shard = jax.tree.map(lambda x: x.reshape((-1, *x.shape[2:])), shard)
        shard = shard._replace(obs=eqx.combine(params, static).prepare(shard.obs))
        whole = jax.tree.map(lambda x: jax.lax.all_gather(x, axis, tiled=True), shard)
        first = jax.lax.axis_index(axis) * shard_size  # this device's rows of each minibatch
        own = jax.lax.dynamic_slice_in_dim(indices, first, shard_size, axis=1)
        advantages = None
        if norm_adv:
            minibatches = jax.vmap(normalize_advantages)(jnp.take(whole.advantages, indices, axis=0))
            advantages = jax.lax.dynamic_slice_in_dim(minibatches, first, shard_size, axis=1)
        params, opt_state, infos = minibatch_steps(
            loss_fn,
            params,
            opt_state,
            whole,
            own,
            optimizer=optimizer,
            unroll=unroll,
            advantages=advantages,
            reduce_grads=mean_over_devices,
        )
        stacked = jnp.stack(infos)  # the devices' shard means -> the minibatch means, in one all-reduce
        return params, opt_state, LossInfo(*jax.lax.pmean(stacked, axis))

    return local_update


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


def check_mesh_config(config: PPOConfig, mesh: Mesh) -> None:
    """Raise ConfigError unless ``config`` can train on ``mesh`` (a ``MeshTrainer``'s checks, run early)."""
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

    The model and optimizer state are global arrays replicated over ``mesh``; the carry, key and iteration are
    the process's own (the key and iteration are the same everywhere). A ``Trainer``'s ``step``, ``checkpoint``
    and ``finite`` are then collective: every process must call them, in the same order. ``checkpoint`` returns
    the one-process run's checkpoint, the same in every process (write it from one).
    """

    def __init__(self, config: PPOConfig, mesh: Mesh):
        check_mesh_config(config, mesh)
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

    def place(self, checkpoint: Checkpoint, collector: Collector) -> TrainState:
        own = slice(self.share.first, self.share.first + (self.share.count or 0))
        stats = jax.tree.map(lambda x: jnp.asarray(np.asarray(x)[own]), checkpoint.stats)
        carry = collector.carry(fresh_episodes(stats))
        self._static = eqx.partition(checkpoint.model, eqx.is_array)[1]
        model, opt_state = replicate(checkpoint.model, self.mesh), replicate(checkpoint.opt_state, self.mesh)
        return TrainState(model, opt_state, carry, checkpoint.key, checkpoint.iteration)

    def program(
        self, config: PPOConfig, collector: Collector, optimizer: optax.GradientTransformation | OptimizerFor
    ) -> Any:
        if not isinstance(optimizer, optax.GradientTransformation):  # one agent here (check_mesh_config)
            optimizer = optimizer(config)
        if self._learn is None:
            self._learn = jax.jit(self._learn_fn(config, optimizer))
        return _MeshProgram(self, collector)

    def _learn_fn(self, config: PPOConfig, optimizer: optax.GradientTransformation) -> Any:
        def learn(params: PyTree, opt_state: PyTree, batch: Batch, key: PRNGKeyArray) -> tuple[PyTree, PyTree, Metrics]:
            """``sharded_update`` of the model's arrays (``jax.jit`` of this lowers for a batch of shapes alone)."""
            model, opt_state, infos = sharded_update(
                eqx.combine(params, self._static),
                opt_state,
                batch,
                mesh=self.mesh,
                optimizer=optimizer,
                **update_settings(config),
                key=key,
            )
            params = eqx.filter(model, eqx.is_array)
            return params, opt_state, {**update_metrics(opt_state, infos), FINITE: all_finite((params, opt_state))}

        return learn

    def learn(self, state: TrainState, batch: Batch, key: PRNGKeyArray) -> tuple[ActorCritic, PyTree, Metrics]:
        """The data-parallel update of one global batch; returns the model, optimizer state and metrics."""
        params = eqx.filter(state.model, eqx.is_array)
        params, opt_state, metrics = self._learn(params, state.opt_state, batch, replicate(key, self.mesh))
        return eqx.combine(params, self._static), opt_state, metrics

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
        self._learn.lower(eqx.filter(state.model, eqx.is_array), state.opt_state, batch, key).compile()

    def checkpoint(self, state: TrainState) -> Checkpoint:
        stats = jax.tree.map(lambda x: jnp.asarray(gather_envs(x)), state.carry.stats)
        return Checkpoint(local(state.model), local(state.opt_state), state.key, stats, state.iteration)


class _MeshProgram:
    """One data-parallel iteration: this process's rollout and GAE (compiled against its pool), then the
    sharded update of the global batch."""

    def __init__(self, placement: MeshPlacement, collector: Collector):
        def collect(model: ActorCritic, carry: Any, key: PRNGKeyArray) -> tuple[Any, Batch, PRNGKeyArray, PRNGKeyArray]:
            key, rollout_key, update_key = jax.random.split(key, 3)
            carry, batch = collector.collect(model, carry, rollout_key)
            return carry, batch, key, update_key

        self.placement, self.collector = placement, collector
        self._collect = eqx.filter_jit(eqx.debug.assert_max_traces(collect, max_traces=1), donate="all-except-first")

    def __call__(self, state: TrainState) -> tuple[TrainState, Metrics]:
        carry, batch, key, update_key = self._collect(local(state.model), state.carry, state.key)
        model, opt_state, metrics = self.placement.learn(state, shard_batch(batch, self.placement.mesh), update_key)
        metrics = {name: local(value) for name, value in metrics.items()}
        stats = carry.stats._replace(
            returned_episode_returns=gather_envs(carry.stats.returned_episode_returns),
            returned_episode_lengths=gather_envs(carry.stats.returned_episode_lengths),
        )
        metrics.update(episode_metrics(stats))
        return TrainState(model, opt_state, carry, key, state.iteration + 1), metrics

    def prime(self, state: TrainState) -> TrainState:
        carry, key = self.collector.prime(local(state.model), state.carry, state.key)
        return TrainState(state.model, state.opt_state, carry, key, state.iteration)

    def compile(self, state: TrainState) -> None:
        self._collect.lower(local(state.model), state.carry, state.key).compile()  # pyright: ignore
        self.placement.compile_learn(state)
