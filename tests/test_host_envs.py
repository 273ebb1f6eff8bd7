"""EnvPool's envs stepped from a host loop, the policy on the default device or the host's CPU (``--rollout-on
host-envs``, ``host.host_envs``; issues 40, 52).

The host-envs run computes what the one-program run computes: the same keys, seeds and actions, each half's
actions drawn as those rows of the whole batch, so its states and metrics are the one-program run's to float32
rounding (the policy sees half the rows at a time); a run resumed from a checkpoint is the uninterrupted one bit
for bit; where it cannot run, one line and nothing written.
"""

import json
import textwrap
from pathlib import Path
from types import SimpleNamespace

import equinox as eqx
import jax
import numpy as np
import pytest

import ppo_eqx
from ppo_eqx.core.envs import EnvSpec, backend
from ppo_eqx.host.host_envs import HostEnvsPlacement
from ppo_eqx.host.placement import OneDevice, act_device_for

from .comparisons import resumes_in_a_process_as_it_ran
from .processes import ROOT, run_child, worker_env
from .processes import ppo_eqx as ppo_eqx_args
from .run_files import tiny

pytestmark = pytest.mark.subprocess


def _train(config: ppo_eqx.PPOConfig, placement: object) -> tuple[list, list[np.ndarray], list[np.ndarray]]:
    """The metrics rows, the learned arrays (model, optimiser, keys, counts) and the env statistics' arrays."""
    with ppo_eqx.Trainer(config, placement=placement) as trainer:  # type: ignore[arg-type]
        records = [row[0] for row in ppo_eqx.run_agents(trainer)]
        checkpoint = trainer.checkpoint()
    learned = eqx.filter(eqx.tree_at(lambda c: c.envs, checkpoint, None), eqx.is_array)
    envs = eqx.filter(checkpoint.envs, eqx.is_array)
    return records, [np.asarray(x) for x in jax.tree.leaves(learned)], [np.asarray(x) for x in jax.tree.leaves(envs)]


@pytest.mark.envpool
@pytest.mark.parametrize(
    ("env_id", "num_envs", "extra"),
    [
        pytest.param("CartPole-v1", 3, {}, id="cartpole-halves-of-1-and-2"),
        pytest.param("Breakout-v5", 4, {}, id="breakout-halves-of-2"),
        # MuJoCo's preset: observations and rewards normalised, so one pool (the statistics are the pool's).
        pytest.param("Hopper-v4", 3, {}, id="hopper-normalised"),
        pytest.param("InvertedPendulum-v4", 1, {}, id="pendulum-one-env"),
        pytest.param("InvertedPendulum-v4", 4, {"normalize_obs": False}, id="pendulum-rewards-normalised-halves-of-2"),
        # Actor threads (issue 49): three actors of 1, 2 and 2 envs (one pool, two halves, two halves), and two.
        pytest.param("CartPole-v1", 5, {"actor_threads": 3}, id="cartpole-3-actors"),
        pytest.param("Breakout-v5", 4, {"actor_threads": 2}, id="breakout-2-actors-halves-of-1"),
    ],
)
def test_the_host_envs_run_computes_what_one_program_computes(env_id: str, num_envs: int, extra: dict) -> None:
    # 4 iterations in segments of 2: the second segment's envs are made afresh, its programs reused.
    config = ppo_eqx.PPOConfig.for_task(
        env_id, num_envs=num_envs, num_steps=16, num_minibatches=2, update_epochs=1,
        total_timesteps=num_envs * 16 * 4, checkpoint_every=2, **extra,
    )  # fmt: skip
    one, one_arrays, one_envs = _train(config, OneDevice())
    loop, loop_arrays, loop_envs = _train(config, HostEnvsPlacement(config.actor_threads or 1))
    floats = [(a, b) for a, b in zip(one_arrays, loop_arrays, strict=True) if a.dtype.kind == "f"]
    diff = max(float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))) for a, b in floats if a.size)
    # Each Adam step moves a parameter by at most about 3.2 x the learning rate: two runs whose gradients differ by
    # float32 rounding alone stay far below that bound; another batch (a wrong action, key or env) is far above.
    steps = config.num_iterations * config.num_minibatches * config.update_epochs
    assert diff <= 2 * 3.2 * config.learning_rate * steps / 10, diff
    ints = [(a, b) for a, b in zip(one_arrays, loop_arrays, strict=True) if a.dtype.kind != "f"]
    assert all(np.array_equal(a, b) for a, b in ints)  # the keys, the iteration, Adam's count
    # The episodes and normalisation statistics: MuJoCo's physics grows float32 rounding in the actions of halves
    # into a few hundredths of a return; a wrong reward, done or count is far off.
    assert all(np.allclose(a, b, rtol=1e-2, atol=0.1, equal_nan=True) for a, b in zip(one_envs, loop_envs, strict=True))
    assert [row["global_step"] for row in loop] == [row["global_step"] for row in one]
    for a, b in zip(one, loop, strict=True):
        assert a["episodic_return"] == b["episodic_return"] or np.isnan(a["episodic_return"]) == np.isnan(
            b["episodic_return"]
        ), (a, b)
        assert abs(a["loss"] - b["loss"]) <= 1e-3 * max(1.0, abs(a["loss"])), (a, b)


# The policy on one device and the learning on another (``act_device``: a vector policy acts on the host's CPU where
# the learner is an accelerator): two host devices stand for them, forced in a process of its own.
ACT_ELSEWHERE = """
    import json
    import equinox as eqx, jax, numpy as np
    import ppo_eqx
    from ppo_eqx.host.host_envs import HostEnvsPlacement
    from ppo_eqx.host.placement import OneDevice, act_device_for

    def train(config, placement):
        with ppo_eqx.Trainer(config, placement=placement) as trainer:
            records = [row[0] for row in ppo_eqx.run_agents(trainer)]
            checkpoint = trainer.checkpoint()
        arrays = [np.asarray(x) for x in jax.tree.leaves(eqx.filter(checkpoint, eqx.is_array))]
        return records, arrays, checkpoint.model

    other = jax.devices()[1]
    results = {}
    for env_id, num_envs in (("Hopper-v4", 3), ("CartPole-v1", 4)):
        config = ppo_eqx.PPOConfig.for_task(
            env_id, num_envs=num_envs, num_steps=16, num_minibatches=2, update_epochs=1,
            total_timesteps=num_envs * 16 * 4, checkpoint_every=2,
        )
        placement = HostEnvsPlacement(1, act_device=other)
        one, one_arrays, _ = train(config, OneDevice())
        moved, moved_arrays, model = train(config, placement)
        acted_on = sorted({d.id for leaf in placement._act.leaves(model) for d in leaf.devices()})
        pairs = [(a, b) for a, b in zip(one_arrays, moved_arrays, strict=True) if a.size]
        results[env_id] = {
            "diff": max(float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64))))
                        for a, b in pairs if a.dtype.kind == "f"),
            "same_ints": all(np.array_equal(a, b) for a, b in pairs if a.dtype.kind != "f"),
            "losses": [[r["loss"] for r in one], [r["loss"] for r in moved]],
            "steps": config.num_iterations * config.num_minibatches * config.update_epochs,
            "learning_rate": config.learning_rate, "record": placement.rollout_record(), "acted_on": acted_on,
        }
    print(json.dumps(results))
"""


def test_a_policy_acting_on_another_device_than_the_learner_computes_the_same() -> None:
    """The model's leaves and the observations' statistics move to the act device each rollout and back: the run
    is the one program's to float32 rounding (Hopper: normalised observations; CartPole: halves)."""
    env = worker_env() | {"XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    code, out, err = run_child(["-c", textwrap.dedent(ACT_ELSEWHERE)], env=env, cwd=ROOT)
    assert code == 0, "\n".join(out + err)[-4000:]
    for env_id, result in json.loads(out[-1]).items():
        assert result["record"]["policy_device"] == "cpu:1" and result["acted_on"] == [1], (env_id, result)
        assert result["record"]["learn_device"] == "cpu:0", (env_id, result)
        assert result["diff"] <= 2 * 3.2 * result["learning_rate"] * result["steps"] / 10, (env_id, result)
        assert result["same_ints"], (env_id, result)
        one, moved = result["losses"]
        assert all(abs(a - b) <= 1e-3 * max(1.0, abs(a)) for a, b in zip(one, moved, strict=True)), (env_id, result)


@pytest.mark.unit
def test_a_vector_policy_acts_on_the_hosts_cpu_where_the_learner_is_an_accelerator(monkeypatch) -> None:
    def spec(kind: str) -> EnvSpec:
        return EnvSpec("Some-v0", (4,), np.dtype(np.float32), 2, kind)  # type: ignore[arg-type]

    cpu, accelerator = jax.devices("cpu")[0], SimpleNamespace(platform="tpu")
    assert act_device_for(spec("vector"), accelerator) == cpu
    assert act_device_for(spec("frames"), accelerator) is accelerator
    assert act_device_for(spec("vector"), cpu) is cpu

    def no_cpu(backend: str | None = None) -> list:
        raise RuntimeError(f"Unknown backend {backend}")

    monkeypatch.setattr(jax, "devices", no_cpu)  # jax started without its CPU backend (JAX_PLATFORMS=tpu)
    assert act_device_for(spec("vector"), accelerator) is accelerator


@pytest.mark.envpool
def test_envpools_host_pool_steps_as_its_xla_step_does() -> None:
    """``make_host``'s halves (each env seeded as in the one pool) give the rows of the one pool's XLA step."""
    envpool = backend("envpool")
    seeds = [5, 6, 7, 8]
    pool = envpool.make("Breakout-v5", seeds)
    halves = [envpool.make_host("Breakout-v5", seeds[:2]), envpool.make_host("Breakout-v5", seeds[2:])]  # type: ignore[attr-defined]
    step = jax.jit(pool.step)
    handle = pool.handle
    assert np.array_equal(np.asarray(pool.first_obs), np.concatenate([h.first_obs for h in halves]))
    actions = np.random.default_rng(0).integers(0, 4, (60, 4)).astype(np.int32)
    try:
        for row in actions:
            handle, out = step(handle, row)
            for h, half in enumerate(halves):
                half.send(row[2 * h : 2 * h + 2])
            got = [half.recv() for half in halves]
            for name in ("obs", "reward", "done", "raw_reward", "game_over", "truncated"):
                joined = np.concatenate([np.asarray(getattr(g, name)) for g in got])
                assert np.array_equal(np.asarray(getattr(out, name)), joined), name
    finally:
        pool.close()
        for half in halves:
            half.close()


def test_a_host_envs_run_resumes_bit_exact_and_says_where_it_ran(tmp_path: Path) -> None:
    finished = tmp_path / "finished"
    code, out, err = run_child(ppo_eqx_args(*tiny(finished, 4), "--rollout-on", "host-envs"))
    assert code == 0, out + err
    first = next(line for line in out if "run directory" in line)
    assert "rollout: host-envs (envs on the host's CPU, the policy on cpu:0)" in first, first
    hardware = json.loads((finished / "hardware.json").read_text())
    want = {"on": "host-envs", "policy_device": "cpu:0", "learn_device": "cpu:0", "actor_threads": 1}
    assert hardware["rollout"] == want, hardware
    resumes_in_a_process_as_it_ran(finished, tmp_path / "resumed", at=2)


def test_a_normalised_mujoco_host_envs_run_resumes_bit_exact(tmp_path: Path) -> None:
    """The statistics of observations and returns go on from the checkpoint, as the uninterrupted run had them."""
    finished = tmp_path / "finished"
    args = [
        "train", "--env-id", "Hopper-v4", "--num-steps", "64", "--num-minibatches", "2", "--update-epochs", "2",
        "--total-timesteps", "256", "--checkpoint-every", "2", "--no-progress", "--run-dir", str(finished),
        "--rollout-on", "host-envs",
    ]  # fmt: skip
    code, out, err = run_child(ppo_eqx_args(*args))
    assert code == 0, out + err
    resumes_in_a_process_as_it_ran(finished, tmp_path / "resumed", at=2)


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        pytest.param(("--num-seeds", "2"), ("2 agents",), id="two-seeds"),
        pytest.param(("--async-batch-size", "2"), ("async_batch_size 2",), id="async"),
        pytest.param(("--bootstrap-truncated",), ("bootstrap_truncated",), id="bootstrap-truncated"),
        pytest.param(("--env-id", "Breakout-v5", "--env-backend", "ale"), ("host API", "'ale'"), id="ale"),
    ],
)
def test_a_host_envs_run_where_it_cannot_run_is_one_line(tmp_path: Path, extra: tuple[str, ...], words) -> None:
    if "ale" in extra:
        pytest.importorskip("ale_py")
    code, out, err = run_child(ppo_eqx_args(*tiny(tmp_path / "run", 1), "--rollout-on", "host-envs", *extra))
    assert code == 2 and len(err) == 1 and err[0].startswith("ppo-eqx: error: rollout_on='host-envs'"), out + err
    assert all(word in err[0] for word in words), err
    assert not (tmp_path / "run").exists()


@pytest.mark.envpool
def test_auto_steps_a_continuous_envpool_task_from_the_host_where_it_can() -> None:
    """A call out of the program a step costs more than MuJoCo's step: ``auto`` is host-envs for such a task, and
    the one program where host-envs cannot run the config (several agents) or is not asked for."""
    from ppo_eqx.host.placement import placement_for

    envpool = backend("envpool")
    spec = envpool.spec("HalfCheetah-v4")
    config = ppo_eqx.PPOConfig.for_task("HalfCheetah-v4")
    assert config.rollout_on == "auto"
    assert isinstance(placement_for(config, spec, envpool), HostEnvsPlacement)
    for other in (config.replace(num_seeds=2), config.replace(rollout_on="device")):
        assert isinstance(placement_for(other, spec, envpool), OneDevice)
    breakout = ppo_eqx.PPOConfig.for_task("Breakout-v5")
    assert isinstance(placement_for(breakout, envpool.spec("Breakout-v5"), envpool), OneDevice)


@pytest.mark.envpool
@pytest.mark.parametrize(("env_id", "atari"), [("HalfCheetah-v4", False), ("Breakout-v5", True)])
def test_envpools_c_calls_step_as_its_public_api(env_id: str, atari: bool) -> None:
    """``make_host`` calls EnvPool's C++ ``send``/``recv`` without its Python wrapper: the same arrays out, step for
    step, as the wrapper's ``send`` and ``recv`` on a twin pool (terminated, truncated and Atari's infos too)."""
    from ppo_eqx.core.envs import BACKEND_THREADS
    from ppo_eqx.core.envs.envpool import _make, _raw_calls

    public, twin = _make(env_id, [3, 4], BACKEND_THREADS), _make(env_id, [3, 4], BACKEND_THREADS)
    try:
        public.reset()
        twin.reset()
        raw = _raw_calls(twin, atari)
        assert raw is not None  # EnvPool's private names as this version has them
        send, recv = raw
        rng = np.random.default_rng(0)
        for _ in range(200):
            actions = rng.integers(0, 4, 2).astype(np.int32) if atari else rng.uniform(-1, 1, (2, 6))
            public.send(actions)
            send(actions)
            want, got = public.recv(), recv()
            for a, b in zip(want[:4], got[:4], strict=True):
                assert np.array_equal(a, b)
            for name in ("terminated", "reward") if atari else ():
                assert np.array_equal(want[4][name], got[4][name]), name
    finally:
        public.close()
        twin.close()
