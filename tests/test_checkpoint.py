import errno
import hashlib
import json

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ppo_eqx.host.run_dir.directory as run_directory
from ppo_eqx import ActorCritic, Checkpoint, CheckpointError, PPOConfig
from ppo_eqx.core.envs import EnvSpec, env_spec, segment_env_seeds
from ppo_eqx.core.state import init_agents
from ppo_eqx.host import kernel_build
from ppo_eqx.host.checkpoint import (
    check_same_run,
    list_checkpoints,
    load_checkpoint,
    read_checkpoint,
    read_metadata,
    resolve_checkpoint,
    save_checkpoint,
)
from ppo_eqx.host.fresh import fresh_agents, init_checkpoint
from ppo_eqx.host.run_dir.directory import RunDirectory

from .comparisons import leaves_equal

pytestmark = pytest.mark.envpool

CARTPOLE = PPOConfig(env_id="CartPole-v1", total_timesteps=8 * 512, num_envs=4, clip_coef=0.2, checkpoint_every=2)


def at_iteration(checkpoint: Checkpoint, iteration: int, seed: int = 0) -> Checkpoint:
    """A checkpoint whose every float differs from the fresh one: random parameters, Adam moments and stats."""
    params, static = eqx.partition(checkpoint, eqx.is_inexact_array)
    keys = iter(jax.random.split(jax.random.PRNGKey(seed), len(jax.tree.leaves(params))))
    params = jax.tree.map(lambda x: jax.random.normal(next(keys), x.shape, x.dtype), params)
    return eqx.tree_at(lambda c: c.iteration, eqx.combine(params, static), jnp.int32(iteration))


@pytest.fixture(scope="module")
def spec():
    return env_spec(CARTPOLE.env_id)


@pytest.fixture
def fresh(spec):
    return init_checkpoint(CARTPOLE, spec, conv_impl="matmul")


def test_save_then_load_gives_back_every_array_bit_for_bit(tmp_path, spec, fresh):
    saved = at_iteration(fresh, 4)
    path = save_checkpoint(tmp_path, saved, CARTPOLE, spec, keep=3, extra={"reason": "test"})
    assert path == tmp_path / "checkpoints" / "iter_000004.json"
    metadata = read_metadata(path)
    assert (metadata["iteration"], metadata["global_step"], metadata["reason"]) == (4, 4 * 512, "test")
    assert metadata["config"] == CARTPOLE.to_dict()
    loaded = load_checkpoint(read_checkpoint(path), CARTPOLE, spec)
    assert leaves_equal(loaded, saved)
    assert not leaves_equal(loaded, fresh)  # the comparison can fail
    assert int(loaded.iteration) == 4
    # A run directory, the .json and the .eqx all name the same checkpoint.
    assert resolve_checkpoint(tmp_path) == resolve_checkpoint(path.with_suffix(".eqx")) == path


def test_only_the_newest_checkpoints_are_kept_and_never_a_users_own(tmp_path, spec, fresh):
    with RunDirectory.at(tmp_path) as directory:  # arrays whose metadata a kill never let be written: listed
        directory.make_dir("checkpoints")
        directory.write("checkpoints/iter_000003.eqx", b"half")
    users = {tmp_path / "checkpoints" / f"iter_000001.{ext}": b"mine" for ext in ("eqx", "json")}
    for path, data in users.items():  # a user's own, named as a checkpoint: not the directory's to delete
        path.write_bytes(data)
    for iteration in (2, 4, 6, 8, 10):
        save_checkpoint(tmp_path, at_iteration(fresh, iteration), CARTPOLE, spec, keep=3)
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir() if p not in users)
    assert names == [f"iter_{i:06d}.{ext}" for i in (6, 8, 10) for ext in ("eqx", "json")]
    assert all(path.read_bytes() == data for path, data in users.items())


def test_a_newer_checkpoint_of_someone_elses_is_not_a_reason_to_delete_the_one_written(tmp_path, spec, fresh):
    foreign = save_checkpoint(tmp_path / "elsewhere", at_iteration(fresh, 8), CARTPOLE, spec, keep=1)
    (tmp_path / "checkpoints").mkdir()
    for suffix in (".json", ".eqx"):
        (tmp_path / "checkpoints" / foreign.with_suffix(suffix).name).write_bytes(
            foreign.with_suffix(suffix).read_bytes()
        )
    path = save_checkpoint(tmp_path, at_iteration(fresh, 2), CARTPOLE, spec, keep=1)
    assert path.exists() and path.with_suffix(".eqx").exists()
    assert (tmp_path / "checkpoints" / "iter_000008.json").exists()  # not this directory's: kept


def test_a_full_disk_leaves_the_previous_checkpoint_intact(tmp_path, spec, fresh, monkeypatch):
    previous = save_checkpoint(tmp_path, at_iteration(fresh, 2, seed=1), CARTPOLE, spec, keep=3)
    before = {p.name: p.read_bytes() for p in (tmp_path / "checkpoints").iterdir()}
    real_write = run_directory.write_all

    def write_half_then_fail(fd, data):
        real_write(fd, data[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(run_directory, "write_all", write_half_then_fail)
    with pytest.raises(OSError) as raised:
        save_checkpoint(tmp_path, at_iteration(fresh, 4, seed=2), CARTPOLE, spec, keep=3)
    assert raised.value.errno == errno.ENOSPC
    # Nothing new is left behind (no temporary file, no half checkpoint), the old one is byte for byte the same.
    assert {p.name: p.read_bytes() for p in (tmp_path / "checkpoints").iterdir()} == before
    loaded = load_checkpoint(read_checkpoint(previous), CARTPOLE, spec)
    assert leaves_equal(loaded, at_iteration(fresh, 2, seed=1))


def test_non_finite_parameters_are_never_checkpointed(tmp_path, spec, fresh):
    poisoned = eqx.tree_at(lambda c: c.model.actor.layers[0].bias, fresh, replace_fn=lambda b: b.at[3].set(jnp.inf))
    with pytest.raises(FloatingPointError, match="non-finite parameters at iteration 0"):
        save_checkpoint(tmp_path, poisoned, CARTPOLE, spec, keep=3)
    assert list_checkpoints(tmp_path) == []


def damage(path, how: str) -> None:
    arrays = path.with_suffix(".eqx")
    if how == "truncated":
        arrays.write_bytes(arrays.read_bytes()[:-100])
    elif how == "flipped byte":
        data = bytearray(arrays.read_bytes())
        data[len(data) // 2] ^= 0xFF
        arrays.write_bytes(bytes(data))
    elif how == "arrays missing":
        arrays.unlink()
    elif how == "metadata not json":
        path.write_text('{"format_version": 1, "iter')
    elif how == "metadata lacks fields":
        path.write_text('{"format_version": 1}')
    elif how == "future format":
        path.write_text(json.dumps({**json.loads(path.read_text()), "format_version": 99}))


@pytest.mark.parametrize(
    ("how", "message"),
    [
        ("truncated", "is truncated or damaged"),
        ("flipped byte", "is damaged: its SHA-256 differs"),
        ("arrays missing", "is incomplete: iter_000002.eqx is missing"),
        ("metadata not json", "is damaged: its metadata is not JSON"),
        ("metadata lacks fields", "is damaged: its metadata lacks"),
        ("future format", "has format version 99"),
    ],
)
def test_damaged_checkpoints_are_refused_with_one_line(tmp_path, spec, fresh, how, message):
    path = save_checkpoint(tmp_path, at_iteration(fresh, 2), CARTPOLE, spec, keep=3)
    damage(path, how)
    with pytest.raises(CheckpointError, match=message) as raised:
        read_checkpoint(path)
    assert "\n" not in str(raised.value)


def test_a_checkpoint_of_another_architecture_or_run_is_refused(tmp_path, spec, fresh):
    acrobot = PPOConfig(env_id="Acrobot-v1", total_timesteps=8 * 512, num_envs=4)
    acrobot_spec = env_spec("Acrobot-v1")
    fresh_acrobot = init_checkpoint(acrobot, acrobot_spec, conv_impl="matmul")
    checkpoint = read_checkpoint(save_checkpoint(tmp_path, fresh_acrobot, acrobot, acrobot_spec, keep=3))
    with pytest.raises(
        CheckpointError, match=r"belongs to another run: .*env_id='Acrobot-v1' \(this run: 'CartPole-v1'\)"
    ):
        check_same_run(checkpoint, CARTPOLE)
    with pytest.raises(
        CheckpointError, match=r"is for observations \(6,\) and 3 actions; CartPole-v1 has \(4,\) and 2"
    ):
        load_checkpoint(checkpoint, CARTPOLE, spec)
    # Metadata that lies about the shapes still cannot load arrays of the wrong shape into this model.
    lying = checkpoint._replace(metadata={**checkpoint.metadata, "obs_shape": [4], "num_actions": 2})
    # (refused by the model's signature in its metadata; by the arrays' shapes where a checkpoint has none)
    with pytest.raises(CheckpointError, match="does not fit this model .CartPole-v1.: .*changed shape|other shapes"):
        load_checkpoint(lying, CARTPOLE, spec)


# What a fresh run's checkpoint holds, as 1a886d4 (checkpoint format 1) wrote it: this code reads and writes the same
# arrays in the same order (a change of the tree needs a new FORMAT_VERSION). Its layout, the arrays as zeros: the
# values come from orthogonal initialisations (QR factorisations), which LAPACK rounds differently on different CPUs
# (an AMD EPYC's bytes differed from those of the machine that wrote 1a886d4's), so they are not the format's to fix;
# tests/test_networks.py and test_one_agent_computed_as_one_program_... check the values themselves.
FORMAT_1_LAYOUT_SHA256 = {
    "one agent": "488493995e23da20ce50836680532258107783f1cc78461ca8a3f785393f2b02",
    "a sweep of 2 x 2 seeds": "10889c06de2f146b8d6c76547067da9f8c44924371590d97544b0c5e0c5749bc",
}


@pytest.mark.parametrize("case", sorted(FORMAT_1_LAYOUT_SHA256))
def test_a_fresh_checkpoint_has_the_layout_that_format_1_wrote(tmp_path, spec, case):
    one = case == "one agent"
    config = CARTPOLE if one else CARTPOLE.replace(num_seeds=2, sweep={"learning_rate": [1e-3, 2.5e-4]})
    checkpoint = init_checkpoint(config, spec, conv_impl="matmul")
    zeros = jax.tree.map(lambda x: jnp.zeros_like(x) if eqx.is_array(x) else x, checkpoint)
    path = save_checkpoint(tmp_path, zeros, config, spec, keep=1)
    assert hashlib.sha256(path.with_suffix(".eqx").read_bytes()).hexdigest() == FORMAT_1_LAYOUT_SHA256[case]


def test_building_a_model_or_loading_a_checkpoint_starts_no_compiler(tmp_path, monkeypatch):
    atari = PPOConfig(total_timesteps=1024)
    atari_spec = env_spec(atari.env_id)
    path = save_checkpoint(tmp_path, init_checkpoint(atari, atari_spec, conv_impl="matmul"), atari, atari_spec, keep=1)

    def compiles(*args: object) -> None:
        raise AssertionError("the CPU kernel was looked for, built or loaded")

    for name in ("unavailable_reason", "load", "build", "built", "cache_problem", "library_path", "find_compiler"):
        monkeypatch.setattr(kernel_build, name, compiles)
    model = ActorCritic(atari_spec.obs_shape, atari_spec.num_actions, conv_impl="kernel", key=jax.random.PRNGKey(0))
    loaded = load_checkpoint(read_checkpoint(path), atari, atari_spec, conv_impl="kernel")
    assert isinstance(loaded.model, ActorCritic)
    assert model.conv_impl == loaded.model.conv_impl == "kernel"


FRESH_CASES = {
    "vector": (EnvSpec("CartPole-v1", (4,), np.dtype(np.float32), 2, "vector"), {}),
    "grid, gymnax-blines' init": (
        EnvSpec("Breakout-MinAtar", (10, 10, 4), np.dtype(np.float32), 3, "grid"),
        {"network_init": "gymnax-blines"},
    ),
    "frames": (EnvSpec("Breakout-v5", (4, 84, 84), np.dtype(np.uint8), 4, "frames"), {"seed": 7}),
}


@pytest.mark.compile
@pytest.mark.parametrize("case", sorted(FRESH_CASES))
def test_one_agent_computed_as_one_program_is_the_bits_of_each_operation_run_alone(case):
    """A fresh run's agent is computed in one compiled program (a short run's start); its result is the one of
    running ``init_agents`` operation by operation, bit for bit (NaN where NaN: episode statistics start so)."""
    spec, changes = FRESH_CASES[case]
    config = CARTPOLE.replace(**changes).validate()
    alone = init_agents(
        spec,
        config.agent_hyperparameters(),
        config.seed,
        num_envs=config.num_envs,
        sizes=config.sizes,
        conv_impl="matmul",
        network_init=config.network_init,  # type: ignore[arg-type]
    )
    together = fresh_agents(config, spec, conv_impl="matmul")
    pairs = zip(jax.tree.leaves(alone), jax.tree.leaves(together), strict=True)
    assert all(np.array_equal(np.asarray(a), np.asarray(b), equal_nan=True) and a.dtype == b.dtype for a, b in pairs)


@pytest.mark.unit
def test_missing_checkpoints_are_named(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        resolve_checkpoint(tmp_path / "iter_000002.eqx")
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(CheckpointError, match="holds no checkpoint"):
        resolve_checkpoint(tmp_path)


@pytest.mark.unit
def test_segment_seeds_depend_on_seed_and_iteration_only():
    assert segment_env_seeds(7, 0, 4) == [7, 8, 9, 10]  # EnvPool's own seeding, as CleanRL: env i gets seed + i
    seeds = segment_env_seeds(1, 50, 8)
    assert seeds == segment_env_seeds(1, 50, 8)
    assert len(set(seeds)) == 8 and all(0 <= s < 2**31 for s in seeds)
    assert seeds != segment_env_seeds(1, 100, 8) and seeds != segment_env_seeds(2, 50, 8)
    # The first envs of a bigger pool are seeded as the smaller pool's: seeds are drawn per env in order.
    assert segment_env_seeds(1, 50, 16)[:8] == seeds


def test_a_state_made_on_the_host_cpu_lands_as_if_made_on_the_default_device() -> None:
    """What an accelerator's run makes on its host's CPU (``host_cpu.on_the_host_cpu``) is put on the default device
    uncommitted, as arrays made there are, each value and dtype kept: typed PRNG keys and bfloat16 too."""
    from ppo_eqx.host.host_cpu import _on_the_default_device

    made = {
        "keys": jax.random.split(jax.random.key(3), 2),
        "weights": jnp.arange(5.0, dtype=jnp.bfloat16),
        "count": jnp.asarray(7, jnp.int32),
    }
    moved = jax.tree.map(_on_the_default_device, made)
    assert np.array_equal(jax.random.key_data(moved["keys"]), jax.random.key_data(made["keys"]))
    assert jax.random.key_impl(moved["keys"]) == jax.random.key_impl(made["keys"])
    for name in ("weights", "count"):
        assert moved[name].dtype == made[name].dtype and np.array_equal(moved[name], made[name])
    for x in jax.tree.leaves(moved):
        assert x.devices() == {jax.devices()[0]} and not x.committed


def test_an_accelerators_fresh_agents_are_made_on_the_host_cpu_with_the_same_bits(spec: EnvSpec) -> None:
    """``on_the_host_cpu`` as on an accelerator (the platform given): the agents it makes are the bits the plain
    call makes, put on the default device uncommitted; under ``eval_shape`` nothing is computed."""
    from ppo_eqx.host.host_cpu import on_the_host_cpu

    config = PPOConfig(env_id="CartPole-v1", num_envs=2, num_steps=8, num_seeds=2)
    plain = fresh_agents(config, spec, conv_impl="matmul")
    made = on_the_host_cpu(lambda: fresh_agents(config, spec, conv_impl="matmul"), platform="tpu")
    plain_leaves, made_leaves = jax.tree.leaves(plain), jax.tree.leaves(made)
    assert len(plain_leaves) == len(made_leaves)
    for want, got in zip(plain_leaves, made_leaves, strict=True):
        if jnp.issubdtype(want.dtype, jax.dtypes.prng_key):
            want, got = jax.random.key_data(want), jax.random.key_data(got)
        assert got.dtype == want.dtype and np.asarray(got).tobytes() == np.asarray(want).tobytes()  # NaN too
        assert not got.committed
    made_here = lambda: fresh_agents(config, spec, conv_impl="matmul")  # noqa: E731
    shaped = eqx.filter_eval_shape(lambda: on_the_host_cpu(made_here, platform="tpu"))
    assert [x.shape for x in jax.tree.leaves(shaped)] == [x.shape for x in plain_leaves]


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Breakout-MinAtar"])
def test_gymnaxs_spec_read_on_the_host_cpu_is_the_spec(env_id: str) -> None:
    """On an accelerator the plan reads gymnax's spec on the host's CPU (``named.backend_and_spec``): the same
    spec, field for field, as read on the default device."""
    pytest.importorskip("gymnax")
    from ppo_eqx.host.host_cpu import on_the_host_cpu
    from ppo_eqx.host.named import backend_and_spec, backend_named

    chosen, spec = backend_and_spec("gymnax", env_id)
    moved = on_the_host_cpu(lambda: backend_named("gymnax").spec(env_id), platform="tpu")
    assert backend_named("gymnax") is chosen and moved == spec
