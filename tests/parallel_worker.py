"""Subprocess side of tests/test_parallel.py: jax must see its devices (or its peers) before it starts.

    python tests/parallel_worker.py devices OUT.npz               2 host-platform devices in one process
    python tests/parallel_worker.py process PORT ID OUT.npz       process ID of 2 on 127.0.0.1:PORT

Each writes the 1-device ``update``'s parameters and loss diagnostics (``ref/model/i``,
``ref/info/FIELD``) and the sharded update's (``got/...``, with ``got/opt_state/i``), for a CartPole-shaped
MLP batch (``mlp/``) and, with ``devices``, an Atari-shaped CNN batch (``cnn/``).
"""

import os
import sys

if __name__ == "__main__" and sys.argv[1] == "devices":
    os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2"

from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
from jaxtyping import install_import_hook  # noqa: E402

with install_import_hook("ppo_eqx", "beartype.beartype"):  # as pytest's --jaxtyping-packages
    import equinox as eqx
    import jax
    import jax.numpy as jnp

    import ppo_eqx
    from ppo_eqx import ActorCritic, AgentHyperparameters, Batch, PPOConfig, make_optimizer, update
    from ppo_eqx.core.sharded import make_mesh, replicate, shard_batch, sharded_update
    from tests.user_env import kl_penalty

LOSSES = {"kl": kl_penalty(0.5)}
"""The cases that descend a loss of the user's (CleanRL's plus a KL penalty, of the minibatch's statistics as
CleanRL's is: the mesh must compute what one device computes for it)."""

CONFIG = PPOConfig(num_minibatches=2, update_epochs=2, clip_vloss=True)
"""The update's settings: 2 epochs of 2 minibatches, CleanRL's coefficients, the value loss clipped."""
CASES = {"mlp": ((4,), 2, (4, 16)), "cnn": ((4, 84, 84), 4, (4, 8)), "kl": ((4,), 2, (4, 16))}
"""Each case's obs shape, actions and ``[T, N]``; "kl" is "mlp" descending a loss of the user's (``LOSSES``)."""


def make_batch(obs_shape: tuple[int, ...], num_actions: int, size: tuple[int, ...], seed: int = 0) -> Batch:
    """A random batch of ``size`` transitions (``[T, N]``: time-major, as ``sharded_update`` takes it)."""
    rng = np.random.default_rng(seed)
    normal = lambda: rng.normal(size=size).astype(np.float32)  # noqa: E731
    if len(obs_shape) == 3:
        obs = rng.integers(0, 256, (*size, *obs_shape), dtype=np.uint8)
    else:
        obs = rng.normal(size=(*size, *obs_shape)).astype(np.float32)
    actions = rng.integers(0, num_actions, size).astype(np.int32)
    fields = (obs, actions, normal() * 0.1 - 0.7, normal(), normal() + 0.3, normal())
    return Batch(*(jnp.asarray(x) for x in fields))


def flat(batch: Batch) -> Batch:
    """A time-major ``[T, N, ...]`` batch as ``update`` takes it: ``[T*N, ...]``."""
    return jax.tree.map(lambda x: x.reshape((-1, *x.shape[2:])), batch)


def run(case: str, *, process_envs: slice | None) -> dict[str, Any]:
    obs_shape, num_actions, size = CASES[case]
    model = ActorCritic(obs_shape, num_actions, conv_impl="matmul", key=jax.random.PRNGKey(0))
    settings, sizes = AgentHyperparameters.of([CONFIG]), CONFIG.sizes
    opt_state = make_optimizer(settings, sizes).init(eqx.filter(model, eqx.is_array))
    batch = make_batch(obs_shape, num_actions, size)
    key = jax.random.PRNGKey(1)

    local = jax.local_devices()[0]
    on_local = lambda tree: jax.device_put(tree, local)  # noqa: E731
    loss = LOSSES.get(case, ppo_eqx.model_loss)
    reference = eqx.filter_jit(lambda m, o, b, h, k: update(m, o, b, h, sizes=sizes, loss=loss, key=k))
    ref_model, _, ref_infos = reference(*map(on_local, (model, opt_state, flat(batch), settings, key)))

    mesh = make_mesh()
    own = batch if process_envs is None else jax.tree.map(lambda x: x[:, process_envs], batch)
    sharded = eqx.filter_jit(lambda m, o, b, h, k: sharded_update(m, o, b, h, mesh=mesh, sizes=sizes, loss=loss, key=k))
    got_model, got_opt_state, got_infos = sharded(
        replicate(model, mesh),
        replicate(opt_state, mesh),
        shard_batch(own, mesh),
        replicate(settings, mesh),
        replicate(key, mesh),
    )

    out: dict[str, Any] = {}
    for name, (new_model, infos) in [("ref", (ref_model, ref_infos)), ("got", (got_model, got_infos))]:
        # The sharded results are replicated global arrays: each process reads its own device's copy.
        read = lambda x: np.asarray(x.addressable_data(0) if name == "got" else x)  # noqa: E731
        for i, leaf in enumerate(jax.tree.leaves(eqx.filter(new_model, eqx.is_array))):
            out[f"{case}/{name}/model/{i}"] = read(leaf)
        for field, value in (infos if isinstance(infos, dict) else infos._asdict()).items():
            out[f"{case}/{name}/info/{field}"] = read(value)
    for i, leaf in enumerate(jax.tree.leaves(got_opt_state)):
        out[f"{case}/got/opt_state/{i}"] = np.asarray(leaf.addressable_data(0))
    out[f"{case}/moved"] = np.asarray(
        max(
            float(jnp.max(jnp.abs(a - b)))
            for a, b in zip(
                jax.tree.leaves(eqx.filter(model, eqx.is_array)),
                jax.tree.leaves(eqx.filter(ref_model, eqx.is_array)),
                strict=True,
            )
        )
    )
    return out


def main() -> None:
    mode = sys.argv[1]
    if mode == "devices":
        assert jax.device_count() == 2, jax.devices()
        results = {**run("mlp", process_envs=None), **run("cnn", process_envs=None), **run("kl", process_envs=None)}
        np.savez(sys.argv[2], **results)
        return
    port, process_id, path = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    jax.distributed.initialize(
        coordinator_address=f"127.0.0.1:{port}",
        num_processes=2,
        process_id=process_id,
        initialization_timeout=60,
        heartbeat_timeout_seconds=10,
        shutdown_timeout_seconds=10,
    )
    assert jax.process_count() == 2 and jax.device_count() == 2 and jax.local_device_count() == 1, jax.devices()
    # shard_batch puts the processes' envs side by side in the mesh's device order.
    position = [d.process_index for d in make_mesh().devices.flat].index(jax.process_index())
    _, _, (_, num_envs) = CASES["mlp"]
    results = run("mlp", process_envs=slice(position * num_envs // 2, (position + 1) * num_envs // 2))
    np.savez(path, **results)
    jax.distributed.shutdown()


if __name__ == "__main__":
    main()
