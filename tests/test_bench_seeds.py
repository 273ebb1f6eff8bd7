"""bench/seeds.py's table from fixed worker results: every agent's steps counted once, each clock once."""

from types import ModuleType

import pytest

from .bench_scripts import load_bench_script

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def seeds() -> ModuleType:
    return load_bench_script("seeds")


def worker_result(env_steps: int, seconds: float, compile_s: float = 3.0) -> dict:
    return {"compile_s": compile_s, "env_steps": env_steps, "seconds": seconds, "env_steps_per_s": env_steps / seconds}


def test_one_process_of_two_agents_is_what_its_worker_measured(seeds: ModuleType) -> None:
    # The user's case: 2 seeds x 3 iterations x 512 steps in one program, at 578 env steps/s all together.
    steps = 2 * 3 * 512
    row = seeds.summarise(seeds.ONE_PROCESS, [worker_result(steps, steps / 578)], agents=2, wall_s=20.0)
    assert row["env_steps_per_s"] == pytest.approx(578)  # not 1,156: the worker already counted both agents
    assert row["env_steps_per_s_per_agent"] == pytest.approx(289)
    assert (row["processes"], row["agents"], row["wall_s"]) == (1, 2, 20.0)


def test_processes_one_after_another_are_all_steps_over_all_seconds(seeds: ModuleType) -> None:
    results = [worker_result(1536, 3.0, compile_s=2.0), worker_result(1536, 6.0, compile_s=4.0)]
    row = seeds.summarise(seeds.ONE_AFTER_ANOTHER, results, agents=2, wall_s=30.0)
    assert row["env_steps_per_s"] == pytest.approx(3072 / 9.0)  # not the mean rate, (512 + 256) / 2
    assert row["env_steps_per_s_per_agent"] == pytest.approx(3072 / 9.0 / 2)
    assert (row["processes"], row["compile_s"]) == (2, 4.0)


def test_processes_at_once_add_their_rates(seeds: ModuleType) -> None:
    results = [worker_result(1536, 3.0), worker_result(1536, 6.0)]
    row = seeds.summarise(seeds.AT_ONCE, results, agents=2, wall_s=10.0)
    assert row["env_steps_per_s"] == pytest.approx(512 + 256)
    assert row["env_steps_per_s_per_agent"] == pytest.approx(384)


def test_one_agent_is_the_same_in_every_mode(seeds: ModuleType) -> None:
    result = worker_result(1536, 3.0)
    for mode in (seeds.ONE_PROCESS, seeds.ONE_AFTER_ANOTHER, seeds.AT_ONCE):
        assert seeds.summarise(mode, [result], agents=1, wall_s=5.0)["env_steps_per_s"] == pytest.approx(512)


def test_an_unknown_mode_is_refused(seeds: ModuleType) -> None:
    with pytest.raises(ValueError, match="unknown mode"):
        seeds.summarise("threads", [worker_result(1, 1.0)], agents=1, wall_s=1.0)
