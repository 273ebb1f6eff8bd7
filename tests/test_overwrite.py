"""`--overwrite` deletes only what the old run wrote, and bench/atari57.py resumes what it can (issue 23).

A user keeps things inside a run directory: an independent run trained there (``--run-dir D/seed2``), a copy of a
run, notes, an old checkpoints folder, a checkpoint of their own among the run's. Overwriting the run in D must
delete the old run's files (and its agents' directories, for a ``--num-seeds`` run) and keep everything else,
naming what it kept in one line.
"""

import json
import shutil
from pathlib import Path
from typing import NamedTuple

import pytest

from .processes import bench_script, ppo_eqx, run_child
from .run_files import BATCH, checkpoint_names, interrupted_copy, iterations, snapshot, tiny

pytestmark = pytest.mark.subprocess


def train(*args: str) -> list[str]:
    """Run ``ppo-eqx train ARGS`` to its end (exit 0); its output lines, stdout then stderr."""
    code, out, err = run_child(ppo_eqx("train", *args))
    assert code == 0, out + err
    return out + err


def new_run(run_dir: Path, *extra: str) -> list[str]:
    """A one-iteration run in ``run_dir`` (seed 3 unless ``extra`` says otherwise), overwriting what is there."""
    return train(*tiny(run_dir, 1)[1:], "--seed", "3", "--overwrite", *extra)


class Overwritten(NamedTuple):
    run_dir: Path
    before: dict[str, bytes]
    """Every file under the run directory before the overwrite."""
    output: list[str]
    """The overwriting run's output lines."""
    independent: Path
    """A copy of the independent run D/seed2, made before the overwrite."""


# What the user put into D, besides the old run: (path in D, made by).
USERS = {
    "seed2": "an independent run, `train --run-dir D/seed2`",
    "lr=0.1/seed1": "a copy of that run",
    "notes.txt": "a user's file",
    "checkpoints-old": "a user's directory",
    "checkpoints/my-best.eqx": "a user's file among the run's checkpoints",
}


@pytest.fixture(scope="module")
def single(cli_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Overwritten:
    """D holds a finished one-agent run (4 iterations, seed 1) and the user's things; then `train --run-dir D
    --overwrite --seed 3`."""
    run_dir = tmp_path_factory.mktemp("single") / "D"
    shutil.copytree(cli_run, run_dir)
    train(*tiny(run_dir / "seed2", 1)[1:])
    independent = shutil.copytree(run_dir / "seed2", run_dir.parent / "independent")
    shutil.copytree(run_dir / "seed2", run_dir / "lr=0.1" / "seed1")
    (run_dir / "notes.txt").write_text("lr 2.5e-4 looked best\n")
    (run_dir / "checkpoints-old").mkdir()
    (run_dir / "checkpoints-old" / "iter_000001.json").write_text("{}\n")
    shutil.copy(run_dir / "checkpoints" / "iter_000004.eqx", run_dir / "checkpoints" / "my-best.eqx")
    before = snapshot(run_dir)
    return Overwritten(run_dir, before, new_run(run_dir), independent)


@pytest.mark.parametrize(
    "kept",
    [
        pytest.param("seed2", id="independent-run-in-seed2"),
        pytest.param("lr=0.1/seed1", id="copied-run-in-a-setting-dir"),
        pytest.param("notes.txt", id="users-file"),
        pytest.param("checkpoints-old", id="users-dir-named-like-checkpoints"),
        pytest.param("checkpoints/my-best.eqx", id="users-file-among-the-checkpoints"),
    ],
)
@pytest.mark.xdist_group("overwrite-single")
def test_overwrite_keeps_what_the_old_run_did_not_write(single: Overwritten, kept: str) -> None:
    kept_before = {name: data for name, data in single.before.items() if Path(name).is_relative_to(kept)}
    assert kept_before  # the fixture made it
    assert {name: data for name, data in snapshot(single.run_dir).items() if name in kept_before} == kept_before


@pytest.mark.xdist_group("overwrite-single")
def test_overwrite_names_what_it_kept_in_one_line(single: Overwritten) -> None:
    lines = [line for line in single.output if "notes.txt" in line]
    assert len(lines) == 1, single.output
    assert all(Path(kept).parts[0] in lines[0] for kept in USERS), lines[0]


@pytest.mark.parametrize(
    "check",
    [
        pytest.param("config", id="config-json-is-the-new-runs"),
        pytest.param("metrics", id="metrics-only-the-new-runs-rows"),
        pytest.param("events", id="old-event-files-gone"),
        pytest.param("checkpoints", id="old-checkpoints-gone"),
        pytest.param("summary", id="summary-is-the-new-runs"),
    ],
)
@pytest.mark.xdist_group("overwrite-single")
def test_overwrite_deletes_what_the_old_run_wrote(single: Overwritten, check: str) -> None:
    run_dir, before = single.run_dir, single.before
    if check == "config":
        assert json.loads((run_dir / "config.json").read_text())["seed"] == 3
    elif check == "metrics":
        assert iterations(run_dir) == [1]
    elif check == "events":
        old = {name for name in before if name.startswith("events.out.tfevents.")}
        assert old and not old & {p.name for p in run_dir.glob("events.out.tfevents.*")}
    elif check == "checkpoints":
        assert {"iter_000001.eqx", "iter_000001.json"} <= set(checkpoint_names(run_dir))
        assert not {"iter_000002.json", "iter_000004.json", "iter_000004.eqx"} & set(checkpoint_names(run_dir))
    else:
        assert json.loads((run_dir / "summary.json").read_text())["global_step"] == BATCH


@pytest.fixture(scope="module")
def seeds(single: Overwritten, tmp_path_factory: pytest.TempPathFactory) -> Overwritten:
    """D holds a `--num-seeds 2` run (its agents in seed1/ and seed2/) and, in seed3/, an independent run of the
    user's; then a one-agent run overwrites D."""
    run_dir = tmp_path_factory.mktemp("seeds") / "D"
    train(*tiny(run_dir, 1)[1:], "--num-seeds", "2")
    shutil.copytree(single.independent, run_dir / "seed3")
    before = snapshot(run_dir)
    return Overwritten(run_dir, before, new_run(run_dir), single.independent)


@pytest.mark.parametrize(
    ("path", "kept"),
    [
        pytest.param("seed1", False, id="old-agent-seed1-gone"),
        pytest.param("seed2", False, id="old-agent-seed2-gone"),
        pytest.param("seeds.json", False, id="old-seeds-json-gone"),
        pytest.param("seed3", True, id="independent-run-in-seed3-kept"),
    ],
)
@pytest.mark.xdist_group("overwrite-single")
def test_overwriting_a_many_seed_run_deletes_its_agents_only(seeds: Overwritten, path: str, kept: bool) -> None:
    assert any(Path(name).is_relative_to(path) for name in seeds.before)
    after = snapshot(seeds.run_dir)
    if kept:
        assert {k: v for k, v in after.items() if Path(k).is_relative_to(path)} == {
            k: v for k, v in seeds.before.items() if Path(k).is_relative_to(path)
        }
    else:
        assert not (seeds.run_dir / path).exists()


def atari57(sweep_dir: Path, *extra: str) -> tuple[int, list[str], list[str]]:
    args = ["--games", "CartPole-v1", "--seeds", "1", "--total-timesteps", str(4 * BATCH), "--sweep-dir"]
    return run_child(bench_script("atari57", *args, str(sweep_dir), *extra))


@pytest.mark.parametrize(
    ("state", "expected"),
    [
        pytest.param("checkpoint", "--resume", id="interrupted-with-a-checkpoint-resumes"),
        pytest.param("no checkpoint", "--overwrite", id="interrupted-before-any-checkpoint-restarts"),
    ],
)
def test_atari57_never_overwrites_a_run_that_has_checkpoints(
    cli_run: Path, tmp_path: Path, state: str, expected: str
) -> None:
    run_dir = interrupted_copy(cli_run, tmp_path / "CartPole-v1__seed1", at=2)
    if state == "no checkpoint":
        shutil.rmtree(run_dir / "checkpoints")
    code, out, err = atari57(tmp_path, "--dry-run")
    assert code == 0, err
    (line,) = out
    assert expected in line.split() and str(run_dir) in line
    assert ({"--resume", "--overwrite"} - {expected}).isdisjoint(line.split())


def test_atari57_resumes_an_interrupted_run_from_its_checkpoint(cli_run: Path, tmp_path: Path) -> None:
    run_dir = interrupted_copy(cli_run, tmp_path / "CartPole-v1__seed1", at=2)
    rows_before = (run_dir / "metrics.jsonl").read_text()
    code, out, err = atari57(tmp_path)
    assert code == 0, out + err
    assert iterations(run_dir) == [1, 2, 3, 4]
    assert (run_dir / "metrics.jsonl").read_text().startswith(rows_before)  # rows 1 and 2 as they were written
    log = (tmp_path / "CartPole-v1__seed1.log").read_text()
    assert "--overwrite" not in log.splitlines()[0] and "resuming" in log
