"""bench/continuous_time.py's summary (issue 52): each task's returns over its seeds, the slowest process against
a tenth of CleanRL's wall time, hand-computed."""

import pytest

from .bench_scripts import load_bench_script

pytestmark = pytest.mark.unit


def row(program: str, task: str, seed: int, ret: float, wall: float) -> dict:
    return {"program": program, "task": task, "seed": seed, "return": ret, "wall_s": wall, "curve": []}


def test_the_summary_holds_each_task_to_its_return_and_a_tenth_of_cleanrls_time() -> None:
    bench = load_bench_script("continuous_time")
    rows = [
        row("ppo-eqx", "Hopper-v4", 1, 2000.0, 50.0),
        row("ppo-eqx", "Hopper-v4", 2, 3000.0, 70.0),
        row("cleanrl", "Hopper-v4", 1, 2400.0, 600.0),
        row("ppo-eqx", "HalfCheetah-v4", 1, 1500.0, 40.0),
    ]
    lines = {line["task"]: line for line in bench.summary(rows)}
    assert set(lines) == {"Hopper-v4", "HalfCheetah-v4"}  # Walker2d has no rows
    hopper = lines["Hopper-v4"]
    assert hopper["mean"] == 2500.0 and hopper["std"] == pytest.approx(707.1068, abs=1e-3)  # stdev of 2000, 3000
    assert hopper["wall_max_s"] == 70.0 and hopper["bound_s"] == 60.0 and hopper["within_bound"] is False
    assert hopper["reaches_target"] is True  # 2,500 >= CleanRL's 2,382.86
    cheetah = lines["HalfCheetah-v4"]
    assert cheetah["std"] == 0.0 and "bound_s" not in cheetah  # no CleanRL run of it: no bound stated
    assert cheetah["reaches_target"] is True  # 1,500 >= 1,442.64


def test_the_time_to_return_is_when_the_mean_over_the_runs_first_reaches_it() -> None:
    bench = load_bench_script("continuous_time")
    a = [[10.0, 0, 100.0], [20.0, 0, 300.0], [30.0, 0, 200.0]]
    b = [[15.0, 0, 100.0], [25.0, 0, 200.0]]
    # At 20 s: a 300 and b 100 (held since 15 s), mean 200; at 10 s b has not reported yet.
    assert bench.seconds_to_target([a, b], 200.0) == 20.0
    assert bench.seconds_to_target([a, b], 100.0) == 15.0
    assert bench.seconds_to_target([a, b], 251.0) is None  # 250 at most (20-25 s: 300 and 100 or 200)
