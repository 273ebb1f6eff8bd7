"""ppo_eqx.host.mesh: the sharded update equals the one-device update, on 2 devices and on 2 processes.

jax fixes its devices (and its peers) when it starts, so the 2-device and 2-process runs happen in
subprocesses (tests/parallel_worker.py) that write both updates' results to an .npz file.
Observed on CPU: parameters within 3e-8 (absolute) of the one-device update, which moves them by 1e-3; the
loss diagnostics within 2.4e-7. Standardising the advantages with each shard's own statistics instead of
the minibatch's moves the parameters 1.3e-3 away, far outside the tolerance.
"""

import subprocess
import sys
from typing import Any

import equinox as eqx
import jax
import numpy as np
import pytest

from ppo_eqx import ActorCritic, AgentHyperparameters, PPOConfig, make_optimizer, update
from ppo_eqx.core.sharded import make_mesh, replicate, shard_batch, sharded_update
from ppo_eqx.errors import ConfigError
from ppo_eqx.host.mesh import check_mesh_config
from ppo_eqx.host.named import backend_named as backend

from .parallel_worker import CONFIG, flat, make_batch
from .processes import ROOT, TIMEOUT_S, free_port, run_processes, worker_env

pytestmark = pytest.mark.unit

WORKER = str(ROOT / "tests" / "parallel_worker.py")
# Parameters: the observed 3e-8 with margin for other CPUs' kernels; the update itself moves them by ~1e-3.
PARAMS_ATOL = 1e-6
INFO_RTOL, INFO_ATOL = 1e-5, 1e-6


def assert_same_update(results: Any, case: str) -> None:
    """The sharded update's parameters and loss diagnostics equal the one-device update's."""
    assert float(results[f"{case}/moved"]) > 1e-4  # the update did move the parameters
    models = sorted(k for k in results.files if k.startswith(f"{case}/ref/model/"))
    assert models
    for ref in models:
        np.testing.assert_allclose(results[ref.replace("/ref/", "/got/")], results[ref], rtol=0, atol=PARAMS_ATOL)
    for ref in (k for k in results.files if k.startswith(f"{case}/ref/info/")):
        assert results[ref].shape == (4,)  # 2 epochs x 2 minibatches
        np.testing.assert_allclose(
            results[ref.replace("/ref/", "/got/")], results[ref], rtol=INFO_RTOL, atol=INFO_ATOL, err_msg=ref
        )


@pytest.mark.compile
def test_one_device_mesh_gives_the_plain_update():
    model = ActorCritic((4,), 2, key=jax.random.PRNGKey(0))
    settings, sizes = AgentHyperparameters.of([CONFIG]), CONFIG.sizes
    opt_state = make_optimizer(settings, sizes).init(eqx.filter(model, eqx.is_array))
    batch = make_batch((4,), 2, (4, 8), seed=5)
    mesh = make_mesh(jax.devices()[:1])
    key = jax.random.PRNGKey(1)
    want, _, want_infos = eqx.filter_jit(update)(model, opt_state, flat(batch), settings, sizes=sizes, key=key)
    got, _, got_infos = eqx.filter_jit(sharded_update)(
        replicate(model, mesh),
        replicate(opt_state, mesh),
        shard_batch(batch, mesh),
        replicate(settings, mesh),
        mesh=mesh,
        sizes=sizes,
        key=key,
    )
    leaves = lambda m: jax.tree.leaves(eqx.filter(m, eqx.is_array))  # noqa: E731
    for a, b in zip(leaves(got), leaves(want), strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=PARAMS_ATOL)
    np.testing.assert_allclose(got_infos.loss, want_infos.loss, rtol=INFO_RTOL, atol=INFO_ATOL)


def test_minibatch_must_split_evenly_over_the_devices():
    model = ActorCritic((4,), 2, key=jax.random.PRNGKey(0))
    settings, sizes = AgentHyperparameters.of([CONFIG]), CONFIG.replace(update_epochs=1).sizes
    mesh = make_mesh(jax.devices()[:1] * 3)  # only its shape counts: the check comes before anything runs
    with pytest.raises(ValueError, match="is not a multiple of the 3 devices"):
        sharded_update(
            model,
            make_optimizer(settings, sizes).init(eqx.filter(model, eqx.is_array)),
            make_batch((4,), 2, (2, 10)),
            settings,
            mesh=mesh,
            sizes=sizes,
            key=jax.random.PRNGKey(1),
        )


@pytest.mark.subprocess
def test_two_devices_give_the_one_device_update(tmp_path):
    out = tmp_path / "devices.npz"
    done = subprocess.run(
        [sys.executable, WORKER, "devices", str(out)],
        env=worker_env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    results = np.load(out)
    assert_same_update(results, "mlp")  # CartPole-shaped: 64 vectors of 4, two 64-64 MLPs
    assert_same_update(results, "cnn")  # Atari-shaped: 32 uint8 frames of 4x84x84, Nature CNN
    assert_same_update(results, "kl")  # the MLP descending a loss of the user's (tests/user_env.py)
    assert "kl/got/info/kl_penalty" in results.files


@pytest.mark.subprocess
def test_two_processes_give_the_one_process_update(tmp_path):
    """Two processes with one CPU device each (gloo collectives over localhost), a 2-device global mesh."""
    port = free_port()
    outs = [tmp_path / f"process{i}.npz" for i in range(2)]
    run_processes([[sys.executable, WORKER, "process", str(port), str(i), str(out)] for i, out in enumerate(outs)])
    first, second = (np.load(out) for out in outs)
    for name in first.files:  # both processes hold the same replicated results, bit for bit
        np.testing.assert_array_equal(first[name], second[name], err_msg=name)
    assert any("/got/opt_state/" in name for name in first.files)
    assert_same_update(first, "mlp")


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"num_envs": 3, "num_steps": 4, "num_minibatches": 1}, "num_envs=3 and the minibatch size 12 must be"),
        ({"num_envs": 4, "num_steps": 3, "num_minibatches": 4}, "num_envs=4 and the minibatch size 3 must be"),
        ({"num_seeds": 2}, "num_seeds=2 cannot train on a mesh of 2 devices"),
        ({"num_envs": 16, "async_batch_size": 8}, "async_batch_size=8 cannot train on a mesh of 2 devices"),
        ({"env_backend": "gymnax"}, "env_backend='gymnax' cannot train on a mesh of 2 devices"),
        ({"iterations_per_dispatch": 4}, "iterations_per_dispatch=4 cannot train on a mesh of 2 devices"),
    ],
)
def test_a_config_that_cannot_split_over_the_mesh_is_refused(changes, message):
    if changes.get("env_backend") == "gymnax":
        pytest.importorskip("gymnax")  # without it the refusal names the missing backend (tests/test_backends.py)
    mesh = make_mesh(jax.devices()[:1] * 2)  # only its shape counts
    config = PPOConfig(**changes).validate()
    with pytest.raises(ConfigError, match=message):
        check_mesh_config(config, mesh, backend(config.env_backend))
