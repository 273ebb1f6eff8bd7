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
