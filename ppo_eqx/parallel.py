"""Data parallelism: the PPO update with every minibatch split across the devices of a one-axis mesh.

Each device computes the PPO loss and its gradient on its shard of each minibatch; the advantages are
standardised with the mean and standard deviation of the whole minibatch and the loss is the mean over the
whole minibatch (both taken with ``pmean``), so the gradient is that of the one-device update. Then the same
optax step runs on every device, and the parameters and optimizer state stay replicated. The mesh may span
several processes (``jax.distributed.initialize``): the code is the same, XLA's collectives cross hosts.
"""

from collections.abc import Sequence

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from jaxtyping import Array, Float, Int, PRNGKeyArray, PyTree

from ._types import Batch, LossInfo
from .loss import model_loss, normalize_advantages
from .networks import ActorCritic
from .update import minibatch_indices, minibatch_steps


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
    """``ppo_eqx.update.update`` with each minibatch split evenly across the devices of ``mesh``.

    ``batch`` is time-major, ``[T, N, ...]`` with its N envs split over the devices (``shard_batch``); it is
    the batch ``update`` takes flattened to ``[T*N, ...]``, as the training iteration flattens its rollout.
    Same results and minibatches (the same permutations of the flattened batch, from ``key``) as ``update``
    on that flat batch; the results are replicated over ``mesh``. ``model``, ``opt_state`` and ``key`` are
    replicated (``replicate``). N and the minibatch size must be multiples of the number of devices.

    A minibatch draws its rows from the whole batch, so each device first gathers the whole batch (one
    ``all_gather`` per call, of the observations already relaid out by ``model.prepare``) and then only
    computes on its own rows of each minibatch: the data crosses devices once, the gradients once per step.
    """
    (axis,) = mesh.axis_names
    num_shards = mesh.shape[axis]
    num_steps, num_envs = batch.actions.shape[:2]
    batch_size = num_steps * num_envs
    minibatch_size = batch_size // num_minibatches
    if minibatch_size % num_shards or num_envs % num_shards:
        raise ValueError(
            f"minibatch size {minibatch_size} or envs {num_envs} is not a multiple of the {num_shards} devices"
        )
    shard_size = minibatch_size // num_shards
    params, static = eqx.partition(model, eqx.is_array)
    indices = minibatch_indices(batch_size, num_minibatches=num_minibatches, update_epochs=update_epochs, key=key)
    # Row t*N + i of the flat batch (env i = d*n + j of device d) is row d*T*n + t*n + j of the gathered one.
    envs_per_shard = num_envs // num_shards
    step, env = jnp.divmod(indices, num_envs)
    shard, column = jnp.divmod(env, envs_per_shard)
    indices = (shard * num_steps + step) * envs_per_shard + column

    def loss_fn(params: PyTree, minibatch: Batch) -> tuple[Float[Array, ""], LossInfo]:
        if norm_adv:
            minibatch = minibatch._replace(advantages=normalize_advantages(minibatch.advantages, axis_name=axis))
        loss, info = model_loss(
            eqx.combine(params, static),
            minibatch,
            clip_coef=clip_coef,
            vf_coef=vf_coef,
            ent_coef=ent_coef,
            norm_adv=False,
            clip_vloss=clip_vloss,
            prepared=True,
        )
        # Every reduction in the loss is a mean over the minibatch, and the shards are equal in size: the
        # mean of the devices' means is the minibatch mean. Its gradient (shard_map transposes the implicit
        # broadcast of the replicated parameters to a psum) is then the mean of the devices' gradients.
        return jax.lax.pmean(loss, axis), jax.tree.map(lambda x: jax.lax.pmean(x, axis), info)

    def local_update(
        params: PyTree, opt_state: PyTree, shard: Batch, indices: Int[Array, "EM mb"]
    ) -> tuple[PyTree, PyTree, LossInfo]:
        shard = jax.tree.map(lambda x: x.reshape((-1, *x.shape[2:])), shard)
        shard = shard._replace(obs=eqx.combine(params, static).prepare(shard.obs))
        whole = jax.tree.map(lambda x: jax.lax.all_gather(x, axis, tiled=True), shard)
        own = jax.lax.dynamic_slice_in_dim(indices, jax.lax.axis_index(axis) * shard_size, shard_size, axis=1)
        return minibatch_steps(loss_fn, params, opt_state, whole, own, optimizer=optimizer, unroll=unroll)

    replicated = PartitionSpec()
    params, opt_state, infos = jax.shard_map(
        local_update,
        mesh=mesh,
        in_specs=(replicated, replicated, PartitionSpec(None, axis), replicated),
        out_specs=(replicated, replicated, replicated),
        # The gradient of the pmean-ed loss is the mean gradient only with replication tracked (see loss_fn).
        check_vma=True,
    )(params, opt_state, batch, indices)
    return eqx.combine(params, static), opt_state, infos
