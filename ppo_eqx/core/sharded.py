"""Data parallelism: the PPO update with every minibatch split across the devices of a one-axis mesh.

Each device gathers the whole batch, standardises each minibatch's advantages with the whole minibatch's
mean and standard deviation, and computes the PPO loss and its gradient on its own shard of the minibatch;
one ``pmean`` per step averages the gradients, so the gradient is that of the one-device update. Then the
same optax step runs on every device, and the parameters and optimizer state stay replicated. The mesh may span
several processes (``jax.distributed.initialize``): the code is the same, XLA's collectives cross hosts.
"""

from collections.abc import Callable, Sequence
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from jaxtyping import Array, Int, PRNGKeyArray, PyTree

from ._types import Batch, LossInfo
from .hyperparameters import AgentHyperparameters, Sizes
from .networks import Policy
from .update import (
    Loss,
    OptimizerFactory,
    make_optimizer,
    minibatch_indices,
    minibatch_steps,
    model_loss,
    normalize_advantages,
    params_loss,
)


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
    model: Policy,
    opt_state: PyTree,
    batch: Batch,
    hyperparameters: AgentHyperparameters,
    *,
    mesh: Mesh,
    sizes: Sizes,
    loss: Loss = model_loss,
    optimizer: OptimizerFactory = make_optimizer,
    key: PRNGKeyArray,
) -> tuple[Policy, PyTree, LossInfo | Any]:
    """``ppo_eqx.core.update.update`` with each minibatch split evenly across the devices of ``mesh``.

    ``batch`` is time-major, ``[T, N, ...]`` with its N envs split over the devices (``shard_batch``); it is
    the batch ``update`` takes flattened to ``[T*N, ...]``, as the training iteration flattens its rollout.
    Same results and minibatches (the same permutations of the flattened batch, from ``key``) as ``update``
    on that flat batch; the results are replicated over ``mesh``. ``model``, ``opt_state``, ``hyperparameters``
    and ``key`` are replicated (``replicate``). N and the minibatch size must be multiples of the number of
    devices. How each device gets there: ``_local_update``; with a ``loss`` other than CleanRL's
    (``model_loss``), ``_whole_minibatch_update``.
    """
    (axis,) = mesh.axis_names
    num_shards = mesh.shape[axis]
    num_steps, num_envs = batch.actions.shape[:2]
    minibatch_size = num_steps * num_envs // sizes.num_minibatches
    if minibatch_size % num_shards or num_envs % num_shards:
        raise ValueError(
            f"minibatch size {minibatch_size} or envs {num_envs} is not a multiple of the {num_shards} devices"
        )
    params, static = eqx.partition(model, eqx.is_array)
    indices = minibatch_indices(
        num_steps * num_envs, num_minibatches=sizes.num_minibatches, update_epochs=sizes.update_epochs, key=key
    )
    indices = _gathered_rows(indices, num_steps, num_envs, num_shards)
    if loss is model_loss:
        local_update = _local_update(static, sizes, optimizer, axis=axis, shard_size=minibatch_size // num_shards)
    else:
        local_update = _whole_minibatch_update(static, sizes, loss, optimizer, axis=axis)
    replicated = PartitionSpec()
    params, opt_state, infos = jax.shard_map(
        local_update,
        mesh=mesh,
        in_specs=(replicated, replicated, PartitionSpec(None, axis), replicated, replicated),
        out_specs=(replicated, replicated, replicated),
        # The gradients are averaged explicitly (mean_over_devices): no implicit reduction of the replicated
        # parameters' cotangents; the results are the same on every device, as out_specs say.
        check_vma=False,
    )(params, opt_state, batch, indices, hyperparameters)
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
    static: PyTree, sizes: Sizes, optimizer: OptimizerFactory, *, axis: str, shard_size: int
) -> Callable[..., Any]:
    """What each device runs under ``shard_map``.

    A minibatch draws its rows from the whole batch, so each device first gathers the whole batch (one
    ``all_gather`` per call, of the observations already relaid out by ``model.prepare``). From it every
    device standardises each minibatch's advantages with the whole minibatch's mean and standard deviation,
    exactly as ``update`` does (with ``norm_adv``), and then computes the loss and its gradient on its own rows
    of each minibatch only. One collective per step averages the gradients (the mean of the devices'
    equal-sized shard means is the minibatch mean), one after the last step the loss diagnostics.
    """

    def mean_over_devices(grads: PyTree) -> PyTree:
        flat, unflatten = ravel_pytree(grads)
        return unflatten(jax.lax.pmean(flat, axis))  # one all-reduce for all the gradients

    def local_update(
        params: PyTree,
        opt_state: PyTree,
        shard: Batch,
        indices: Int[Array, "EM mb"],
        hyperparameters: AgentHyperparameters,
    ) -> tuple[PyTree, PyTree, LossInfo]:
        whole = _gather_whole(shard, eqx.combine(params, static), axis)
        first = jax.lax.axis_index(axis) * shard_size  # this device's rows of each minibatch
        own = jax.lax.dynamic_slice_in_dim(indices, first, shard_size, axis=1)
        minibatches = jax.vmap(normalize_advantages)(jnp.take(whole.advantages, indices, axis=0))
        normalized = jax.lax.dynamic_slice_in_dim(minibatches, first, shard_size, axis=1)
        advantages = jnp.where(hyperparameters.norm_adv, normalized, jnp.take(whole.advantages, own, axis=0))
        # The advantages are standardised here, with the whole minibatch's statistics (not the shard's).
        shard_loss = eqx.tree_at(lambda h: h.norm_adv, hyperparameters, jnp.asarray(False))
        params, opt_state, infos = minibatch_steps(
            params_loss(static, shard_loss),
            params,
            opt_state,
            whole,
            own,
            optimizer=optimizer(hyperparameters, sizes),
            unroll=sizes.minibatch_unroll,
            advantages=advantages,
            reduce_grads=mean_over_devices,
        )
        stacked = jnp.stack(infos)  # the devices' shard means -> the minibatch means, in one all-reduce
        return params, opt_state, LossInfo(*jax.lax.pmean(stacked, axis))

    return local_update


def _gather_whole(shard: Batch, model: Policy, axis: str) -> Batch:
    """The whole batch on every device: this device's ``[T, n]`` shard flattened, its observations relaid out for
    ``model`` (``prepare``), gathered over ``axis`` (one ``all_gather`` per field)."""
    shard = jax.tree.map(lambda x: x.reshape((-1, *x.shape[2:])), shard)
    shard = shard._replace(obs=model.prepare(shard.obs))
    return jax.tree.map(lambda x: jax.lax.all_gather(x, axis, tiled=True), shard)


def _whole_minibatch_update(
    static: PyTree, sizes: Sizes, loss: Loss, optimizer: OptimizerFactory, *, axis: str
) -> Callable[..., Any]:
    """What each device runs under ``shard_map`` for a loss of the user's (``core.update.Loss``), which may use the
    minibatch's own statistics (a shard's would differ): every device gathers the whole batch and takes each
    minibatch step on the whole minibatch, in the one-device update's row order, so that it computes what one
    device computes (and the same on every device: no collective after the gather). The update's arithmetic is
    not split: a mesh then speeds up the rollout only."""

    def whole_update(
        params: PyTree,
        opt_state: PyTree,
        shard: Batch,
        indices: Int[Array, "EM mb"],
        hyperparameters: AgentHyperparameters,
    ) -> tuple[PyTree, PyTree, Any]:
        whole = _gather_whole(shard, eqx.combine(params, static), axis)
        return minibatch_steps(
            params_loss(static, hyperparameters, loss),
            params,
            opt_state,
            whole,
            indices,
            optimizer=optimizer(hyperparameters, sizes),
            unroll=sizes.minibatch_unroll,
        )

    return whole_update
