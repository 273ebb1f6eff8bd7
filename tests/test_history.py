"""History survives a kill (issue 23): TensorBoard shows every iteration that metrics.jsonl has, after SIGKILL and
after kill/resume cycles; a damaged metrics.jsonl is refused or repaired on resume, never extended into gaps or
duplicates."""

import concurrent.futures
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest

from .processes import Child, ppo_eqx, run_child
from .run_files import BATCH, interrupted_copy, iterations, metrics_rows, snapshot, tensorboard_points, tiny

pytestmark = pytest.mark.subprocess

TAGS = {"losses/value_loss": "value_loss", "losses/entropy": "entropy"}
"""TensorBoard tags (CleanRL's) and the metrics.jsonl fields they plot."""


class Stage(NamedTuple):
    rows: list[dict]
    points: dict[str, list[tuple[int, float]]]


def stage(run_dir: Path) -> Stage:
    return Stage(metrics_rows(run_dir), {tag: tensorboard_points(run_dir, tag) for tag in TAGS})


def kill_after(args: list[str], iteration: int) -> None:
    """Run ``ppo-eqx ARGS`` and SIGKILL it once it has written the metrics of ``iteration`` (it prints the
    iteration's line after its row)."""
    with Child(ppo_eqx(*args)) as child:
        child.wait_for_line(f"step {iteration * BATCH} ")
        child.kill()


@pytest.fixture(scope="module")
def stages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Stage]:
    """A 4-iteration run (a checkpoint after each) killed after iteration 2, resumed and killed after iteration 3,
    resumed to its end; the run directory read after each."""
    run_dir = tmp_path_factory.mktemp("history") / "run"
    resume = ["train", "--resume", str(run_dir), "--no-progress"]
    kill_after(tiny(run_dir, 4, checkpoint_every=1), 2)
    found = {"killed": stage(run_dir)}
    kill_after(resume, 3)
    found["killed-again"] = stage(run_dir)
    code, out, err = run_child(ppo_eqx(*resume))
    assert code == 0, out + err
    found["finished"] = stage(run_dir)
    return found


@pytest.mark.parametrize("tag", list(TAGS))
@pytest.mark.parametrize(
    "moment",
    ["killed", "killed-again", "finished"],
)
@pytest.mark.xdist_group("history-stages")
def test_tensorboard_shows_every_iteration_that_metrics_has(stages: dict[str, Stage], moment: str, tag: str) -> None:
    rows, points = stages[moment].rows, stages[moment].points[tag]
    assert [step for step, _ in points] == [row["global_step"] for row in rows]
    assert [value for _, value in points] == [np.float32(row[TAGS[tag]]) for row in rows]


@pytest.mark.parametrize("moment", ["killed", "killed-again", "finished"])
@pytest.mark.xdist_group("history-stages")
def test_metrics_has_each_iteration_once_in_order_after_kills(stages: dict[str, Stage], moment: str) -> None:
    steps = [row["global_step"] for row in stages[moment].rows]
    assert steps == [BATCH * i for i in range(1, len(steps) + 1)]
    assert len(steps) >= {"killed": 2, "killed-again": 3, "finished": 4}[moment]


def damage(run_dir: Path, how: str, original: list[str]) -> None:
    """Damage the metrics.jsonl of a run stopped after its checkpoint of iteration 2 (``original``: the finished
    run's lines, iterations 1 to 4)."""
    metrics = run_dir / "metrics.jsonl"
    lines = {
        "row-missing-in-the-middle": [original[1]],
        "row-duplicated": [original[0], original[0], original[1]],
        "garbage-line-in-the-middle": [original[0], "}{ not json", original[1]],
        "row-beyond-the-checkpoint": original[:3],
        "rows-out-of-order": [original[1], original[0]],
    }
    if how == "file-missing":
        metrics.unlink()
    else:
        metrics.write_text("".join(line + "\n" for line in lines[how]))


DAMAGES = [
    "row-missing-in-the-middle",
    "row-duplicated",
    "garbage-line-in-the-middle",
    "row-beyond-the-checkpoint",
    "rows-out-of-order",
    "file-missing",
]


class Resumed(NamedTuple):
    run_dir: Path
    before: dict[str, bytes]
    code: int
    out: list[str]
    err: list[str]


@pytest.fixture(scope="module")
def resumed(cli_run: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Resumed]:
    """Each damage of ``DAMAGES`` done to a copy of a run stopped at its checkpoint of iteration 2, then
    ``train --resume``, two at a time."""
    original = (cli_run / "metrics.jsonl").read_text().splitlines()
    root = tmp_path_factory.mktemp("damaged")

    def resume(how: str) -> Resumed:
        run_dir = interrupted_copy(cli_run, root / how, at=2)
        damage(run_dir, how, original)
        before = snapshot(run_dir)
        return Resumed(run_dir, before, *run_child(ppo_eqx("train", "--resume", str(run_dir), "--no-progress")))

    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip(DAMAGES, pool.map(resume, DAMAGES), strict=True))


@pytest.mark.parametrize("how", DAMAGES)
@pytest.mark.xdist_group("history-resumed")
def test_a_damaged_metrics_file_is_refused_or_repaired_never_extended(resumed: dict[str, Resumed], how: str) -> None:
    result = resumed[how]
    if result.code == 2:  # refused: one line, nothing changed
        assert len(result.err) == 1 and result.err[0].startswith("ppo-eqx: error: "), result.err
        assert "metrics.jsonl" in result.err[0]
        assert snapshot(result.run_dir) == result.before
    else:  # repaired: every iteration once, in order
        assert result.code == 0, result.out + result.err
        assert iterations(result.run_dir) == [1, 2, 3, 4]


def test_a_huge_line_in_metrics_costs_no_more_memory_than_a_row(tmp_path: Path) -> None:
    """A line of 64 MiB (a copy gone wrong, a user's stray write) among the rows is skipped as damage is, read in
    pieces: the peak memory of reading the file stays far below the line's size (it was 3.4x a 1 GB line)."""
    import json
    import tracemalloc

    from ppo_eqx.host.resume import checked_metrics

    rows = [json.dumps({"iteration": i, "loss": 0.5}) for i in (1, 2)]
    path = tmp_path / "metrics.jsonl"
    with path.open("w") as file:
        file.write(rows[0] + "\n" + '{"iteration": 9, "x": "' + "a" * (64 << 20) + '"}\n' + rows[1] + "\n")
    tracemalloc.start()
    try:
        kept = checked_metrics(path, 2)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert kept == [row + "\n" for row in rows]
    assert peak < 16 << 20, peak
