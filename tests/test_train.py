import logging
import math

import equinox as eqx
import jax
import numpy as np
import pytest

from ppo_eqx import PPOConfig, Trainer, async_collector, init_state, make_iteration, make_prime, run, sync_collector

from .fake_env import SPEC, counting_async_pool, counting_pool

pytestmark = pytest.mark.unit

CARTPOLE = PPOConfig(env_id="CartPole-v1", total_timesteps=4 * 512, num_envs=4, clip_coef=0.2)


@pytest.mark.compile
def test_the_iteration_is_pure_and_runs_on_a_fake_env():
    config = PPOConfig(
        env_id="fake", total_timesteps=5 * 64, num_envs=2, num_steps=32, num_minibatches=2, update_epochs=2
    )
    collector = sync_collector(counting_pool(config.num_envs), num_steps=32)
    state = init_state(config, SPEC, collector, conv_impl="matmul")
    iteration = eqx.filter_jit(make_iteration(collector, config.sizes))
    first, metrics = iteration(state)
    again, metrics_again = iteration(state)  # same input, same output: nothing hidden is consumed
    assert jax.tree.all(
        jax.tree.map(
            lambda a, b: bool(np.array_equal(a, b)), eqx.filter(first, eqx.is_array), eqx.filter(again, eqx.is_array)
        )
    )
    assert metrics == metrics_again
    assert int(first.iteration) == 1
    assert float(metrics["learning_rate"]) == pytest.approx(2.5e-4)
    # Env 0's games last 2 steps and earn action + 1 per step: between 2 and 6.
    assert 2.0 <= float(first.carry.stats.returned_episode_returns[0]) <= 6.0


@pytest.mark.envpool
def test_the_jitted_iteration_compiles_once(caplog):
    trainer = Trainer(CARTPOLE)
    # assert_max_traces(1) inside the Trainer raises on a second trace; XLA's compile log must agree.
    with jax.log_compiles(True), caplog.at_level(logging.WARNING):
        records = list(run(trainer))
    compiles = [r for r in caplog.records if "Finished XLA compilation of jit(iteration)" in r.getMessage()]
    assert len(compiles) == 1
    assert [r["iteration"] for r in records] == [1, 2, 3, 4]
    assert [r["global_step"] for r in records] == [512, 1024, 1536, 2048]
    for record in records:
        for key in ("loss", "policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction", "sps"):
            assert math.isfinite(record[key]), key
    assert records[-1]["learning_rate"] == pytest.approx(2.5e-4 * 0.25)


@pytest.mark.envpool
def test_same_seed_same_metrics():
    def metrics(seed):
        return [
            {k: v for k, v in r.items() if k not in ("sps", "time_elapsed")}
            for r in run(Trainer(CARTPOLE.replace(seed=seed)))
        ]

    first = metrics(3)
    assert first == metrics(3)
    assert first != metrics(4)


@pytest.mark.compile
def test_the_async_iteration_is_pure_and_runs_on_a_fake_pool():
    config = PPOConfig(
        env_id="fake",
        total_timesteps=5 * 64,
        num_envs=4,
        async_batch_size=2,
        num_steps=32,
        num_minibatches=2,
        update_epochs=2,
    )
    pool = counting_async_pool(config.num_envs, config.async_batch_size)
    collector = async_collector(pool, num_steps=32)
    state = eqx.filter_jit(make_prime(collector, config.sizes))(init_state(config, SPEC, collector, conv_impl="matmul"))
    iteration = eqx.filter_jit(make_iteration(collector, config.sizes))
    first, metrics = iteration(state)
    again, metrics_again = iteration(state)
    assert jax.tree.all(
        jax.tree.map(
            lambda a, b: bool(np.array_equal(a, b)), eqx.filter(first, eqx.is_array), eqx.filter(again, eqx.is_array)
        )
    )
    assert metrics == metrics_again
    assert int(first.iteration) == 1
    # 32 receives of 2 envs: 64 env steps in all, on top of the pending ones that priming sent.
    assert int(first.carry.handle.counter.sum() - state.carry.handle.counter.sum()) == config.batch_size == 64
    assert all(np.isfinite(float(metrics[name])) for name in ("loss", "value_loss", "entropy", "approx_kl"))


@pytest.mark.envpool
def test_an_async_trainer_primes_each_segment_of_cartpole_envs():
    config = CARTPOLE.replace(num_envs=4, async_batch_size=2, total_timesteps=6 * 256, checkpoint_every=2)
    with Trainer(config) as trainer:
        records = list(run(trainer))
    assert [r["global_step"] for r in records] == [256 * i for i in range(1, 7)]
    for record in records:
        for key in ("loss", "policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction"):
            assert math.isfinite(record[key]), key
    # CartPole pays 1 a step, and nothing on the step that resets the env (counted in the next episode's length).
    episode_return, length = records[-1]["episodic_return"], records[-1]["episodic_length"]
    assert 8 <= length - 1 <= episode_return <= length <= 501


class _Clock:
    """A stand-in for ``time.perf_counter`` that moves only when told: timing tests that a loaded machine cannot
    upset."""

    def __init__(self) -> None:
        self.now = 100.0

    def perf_counter(self) -> float:
        return self.now


class _SleepingTrainer(Trainer):
    """Iterations that take ``seconds`` of ``clock`` each inside ``step()`` (a backend that runs them within the
    dispatch, as XLA:CPU does with EnvPool's step), with ready metrics; no envs, no model."""

    def __init__(self, seconds: float, iterations: int, clock: _Clock):  # not super().__init__(): no envs
        self.config = PPOConfig(env_id="CartPole-v1", num_envs=4, num_steps=128, total_timesteps=512 * iterations)
        self.iteration, self.seconds, self.clock = 0, seconds, clock
        self.metrics = {"loss": jax.numpy.float32(0.5), "finite": jax.numpy.asarray(True)}

    def dispatch(self, until=None, most=None):
        from ppo_eqx.host.trainer import Dispatch

        self.clock.now += self.seconds
        self.iteration += 1
        return Dispatch(self.iteration, 1, dict(self.metrics), False)


def test_each_record_times_its_own_iteration_when_the_dispatch_runs_it(monkeypatch: pytest.MonkeyPatch):
    from ppo_eqx.host import loop

    clock = _Clock()
    monkeypatch.setattr(loop, "time", clock)
    trainer = _SleepingTrainer(seconds=0.05, iterations=5, clock=clock)
    records = [records[0] for records in loop.run_agents(trainer)]
    assert [r["iteration"] for r in records] == [1, 2, 3, 4, 5]
    # 512 steps in 0.05 s each: 10,240 steps/s, the first and the last too (not twice as long, not ~0).
    for record in records:
        assert record["sps"] == pytest.approx(10_240), record
    assert records[-1]["time_elapsed"] == pytest.approx(0.25)


class _Late:
    """A metric of a program whose update ends ``ready_at`` on ``clock``: not ready before, and read (``device_get``)
    by waiting for it."""

    def __init__(self, value: object, ready_at: float, clock: _Clock):
        self.value, self.ready_at, self.clock = np.asarray(value), ready_at, clock

    def is_ready(self) -> bool:
        return self.clock.now >= self.ready_at

    def copy_to_host_async(self) -> None:
        self.clock.now = max(self.clock.now, self.ready_at)

    def __array__(self, dtype=None, copy=None):
        return self.value


class _HostLoopTrainer(_SleepingTrainer):
    """Each dispatch runs a rollout of ``seconds`` on the host, then dispatches an update that ends ``update``
    seconds later (``--rollout-on host-envs`` and ``host`` on an accelerator)."""

    def __init__(self, seconds: float, update: float, iterations: int, clock: _Clock):
        super().__init__(seconds, iterations, clock)
        self.update = update

    def dispatch(self, until=None, most=None):
        from ppo_eqx.host.trainer import Dispatch

        self.clock.now += self.seconds
        self.iteration += 1
        metrics = {name: _Late(value, self.clock.now + self.update, self.clock) for name, value in self.metrics.items()}
        return Dispatch(self.iteration, 1, metrics, False, overlaps=False)  # pyright: ignore[reportArgumentType]


def test_each_record_times_its_own_iteration_when_a_host_loop_runs_it(monkeypatch: pytest.MonkeyPatch):
    from ppo_eqx.host import loop

    clock = _Clock()
    monkeypatch.setattr(loop, "time", clock)
    trainer = _HostLoopTrainer(seconds=0.04, update=0.01, iterations=5, clock=clock)
    records = [records[0] for records in loop.run_agents(trainer)]
    assert [r["iteration"] for r in records] == [1, 2, 3, 4, 5]
    # 512 steps in 0.04 + 0.01 s each, the last too: not the next rollout's time, not the last update's alone.
    for record in records:
        assert record["sps"] == pytest.approx(10_240), record
    assert records[-1]["time_elapsed"] == pytest.approx(0.25)


class _Faulty(_Late):
    """A metric of a program that failed (a host callback raised): reading it raises the program's fault."""

    def __array__(self, dtype=None, copy=None):
        raise RuntimeError("the program of this metric failed")


class _FailingTrainer(_SleepingTrainer):
    """Programs dispatched ahead of their reading, as on XLA:CPU with a JAX env; iteration ``fails``'s fault is met
    only where its metrics are read, after the next program was dispatched."""

    def __init__(self, fails: int, iterations: int, clock: _Clock):
        super().__init__(0.01, iterations, clock)
        self.fails = fails

    def dispatch(self, until=None, most=None):
        from ppo_eqx.host.trainer import Dispatch

        self.clock.now += self.seconds
        self.iteration += 1
        kind = _Faulty if self.iteration == self.fails else _Late
        metrics = {name: kind(value, self.clock.now, self.clock) for name, value in self.metrics.items()}
        return Dispatch(self.iteration, 1, metrics, False)  # pyright: ignore[reportArgumentType]


def test_a_fault_met_reading_a_program_names_that_programs_iterations(monkeypatch: pytest.MonkeyPatch):
    """The program after the failing one is already dispatched when the fault is met; the error names the failing
    program's iteration (the supervisor's line says it), not every iteration in flight."""
    from ppo_eqx.host import loop

    clock = _Clock()
    monkeypatch.setattr(loop, "time", clock)
    trainer = _FailingTrainer(fails=3, iterations=6, clock=clock)
    read = []
    with pytest.raises(RuntimeError, match="the program of this metric failed") as caught:
        for records in loop.run_agents(trainer):
            read.append(records[0]["iteration"])
    assert read == [1, 2]
    assert trainer.iteration == 4  # iteration 4 was dispatched before 3's metrics were read
    assert getattr(caught.value, loop.FAULT_ITERATIONS) == (3, 3)


class _ChunkTrainer(_SleepingTrainer):
    """A program of up to 250 iterations (an env written in JAX), each taking ``seconds`` of ``clock``: how many it
    runs is what the loop asks for (``most``)."""

    length = 250

    def __init__(self, seconds: float, iterations: int, clock: _Clock):
        super().__init__(seconds, iterations, clock)
        self.counts: list[int] = []

    def dispatch(self, until=None, most=None):
        from ppo_eqx.host.trainer import Dispatch

        count = min(self.length, most or self.length, self.config.num_iterations - self.iteration)
        self.counts.append(count)
        self.clock.now += self.seconds * count
        self.iteration += count
        rows = {name: jax.numpy.repeat(value[None], self.length, axis=0) for name, value in self.metrics.items()}
        return Dispatch(self.iteration, count, rows, True)  # pyright: ignore[reportArgumentType]


def test_a_program_of_many_iterations_runs_about_ten_seconds_of_them_however_slow(monkeypatch: pytest.MonkeyPatch):
    from ppo_eqx.host import loop

    clock = _Clock()
    monkeypatch.setattr(loop, "time", clock)
    slow = _ChunkTrainer(seconds=2.0, iterations=30, clock=clock)  # a slow env: 2 s an iteration
    records = [records[0] for records in loop.run_agents(slow)]
    assert [r["iteration"] for r in records] == list(range(1, 31))
    # One iteration until the pace is known (the next program is dispatched before the first's time is read), then
    # 10 s of iterations a program.
    assert slow.counts[:3] == [1, 1, 5] and max(slow.counts) == 5
    assert all(r["sps"] == pytest.approx(512 / 2.0) for r in records)
    fast = _ChunkTrainer(seconds=0.001, iterations=600, clock=clock)
    list(loop.run_agents(fast))
    assert fast.counts == [1, 1, 250, 250, 98]  # the program's own length bounds a fast one
