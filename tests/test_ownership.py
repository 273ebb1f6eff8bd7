"""A run directory has one owner at a time (issue 23): real `ppo-eqx` processes contending for one directory.

Each test acts at moments it observes (a checkpoint file appears, a line is printed, an import completes),
never after a fixed sleep alone. A run that is "training" while another command runs is stopped with SIGSTOP
right after its first checkpoint: it holds whatever it holds, and the machine stays free for the other one.
"""

import os
import re
import shutil
import signal
import socket
from pathlib import Path
from typing import NamedTuple

import pytest

from .processes import Child, ppo_eqx
from .run_files import BATCH, checkpoint_names, interrupted_copy, iterations, snapshot, tiny

pytestmark = pytest.mark.subprocess

HOST = socket.gethostname()
STARTED = ("run directory", "resuming")
"""Words of the lines a `train` prints once it has taken its run directory (before it compiles)."""


def refusal(child: Child) -> str:
    """The one line a refused command printed; AssertionError unless it printed exactly one error line and exited 2."""
    assert child.finish() == 2, child.out + child.err
    assert len(child.err) == 1 and child.err[0].startswith("ppo-eqx: error: "), child.err
    return child.err[0]


def names_holder(line: str, holder: Child) -> bool:
    """Whether an error line names the process that holds the run directory: its pid and its host."""
    return re.search(rf"(?<!\d){holder.pid}(?!\d)", line) is not None and HOST in line


def run_until_refused_or_started(args: list[str]) -> Child:
    """Start ``args`` and wait until it exits or says it has taken its run directory; in that case it is not
    refused (the tests then fail), and it is killed at once rather than trained to its end. Returns it ended."""
    child = Child(args)
    child.wait_until(
        "an exit or a start", lambda: not child.running() or any(w in line for line in child.out for w in STARTED)
    )
    child.kill()
    child.finish()
    return child


class Holder(NamedTuple):
    child: Child
    run_dir: Path
    files: dict[str, bytes]


@pytest.fixture(scope="module")
def holder(tmp_path_factory: pytest.TempPathFactory):
    """A run of 3 iterations, stopped (SIGSTOP) right after its first checkpoint: it trains, as far as anyone
    else can tell, until ``test_the_training_run_finishes_intact_after_every_refusal`` lets it go on."""
    run_dir = tmp_path_factory.mktemp("holder") / "run"
    with Child(ppo_eqx(*tiny(run_dir, 3, checkpoint_every=1))) as child:
        child.wait_for_file(run_dir / "checkpoints" / "iter_000001.json")
        child.send(signal.SIGSTOP)
        yield Holder(child, run_dir, snapshot(run_dir))


@pytest.mark.xdist_group("ownership-holder")
def test_eval_reads_a_run_while_it_trains(holder: Holder) -> None:
    """Reading is not owning: eval plays the newest checkpoint of a run in training (and writes only eval.json)."""
    with Child(ppo_eqx("eval", str(holder.run_dir), "--episodes", "2")) as child:
        assert child.finish() == 0, child.out + child.err
    files = snapshot(holder.run_dir)
    assert files.pop("eval.json") and files == holder.files
    (holder.run_dir / "eval.json").unlink()


@pytest.mark.parametrize(
    "command",
    [
        pytest.param(lambda run: tiny(run, 3, checkpoint_every=1), id="train-the-same-run-dir"),
        pytest.param(lambda run: [*tiny(run, 3), "--overwrite"], id="train-overwrite"),
        pytest.param(lambda run: [*tiny(run, 2), "--seed", "2", "--overwrite"], id="overwrite-other-seed"),
        pytest.param(lambda run: ["train", "--resume", str(run), "--no-progress"], id="resume"),
    ],
)
@pytest.mark.xdist_group("ownership-holder")
def test_a_second_train_while_one_trains_is_refused_naming_the_holder(holder: Holder, command) -> None:
    child = run_until_refused_or_started(ppo_eqx(*command(holder.run_dir)))
    line = refusal(child)
    assert names_holder(line, holder.child), line
    assert str(holder.run_dir) in line
    assert snapshot(holder.run_dir) == holder.files


@pytest.mark.xdist_group("ownership-holder")
def test_the_training_run_finishes_intact_after_every_refusal(holder: Holder) -> None:
    """After the refusals above (and one more here, so that this test means the same when run alone)."""
    run_until_refused_or_started(ppo_eqx(*tiny(holder.run_dir, 3), "--overwrite"))
    holder.child.send(signal.SIGCONT)
    assert holder.child.finish() == 0, holder.child.out + holder.child.err
    assert iterations(holder.run_dir) == [1, 2, 3]
    assert checkpoint_names(holder.run_dir) == [f"iter_00000{i}.{ext}" for i in (1, 2, 3) for ext in ("eqx", "json")]
    assert '"seed": 1,' in (holder.run_dir / "config.json").read_text()


@pytest.mark.parametrize(
    "start",
    [
        pytest.param("new", id="two-identical-new-runs"),
        pytest.param("resume", id="two-resumes-of-one-run"),
    ],
)
def test_of_two_starts_at_once_exactly_one_trains(cli_run: Path, tmp_path: Path, start: str) -> None:
    run_dir = tmp_path / "run"
    if start == "new":
        args, expected = tiny(run_dir, 2), [1, 2]
    else:
        interrupted_copy(cli_run, run_dir, at=2)
        args, expected = ["train", "--resume", str(run_dir), "--no-progress"], [1, 2, 3, 4]
    with Child(ppo_eqx(*args)) as first, Child(ppo_eqx(*args)) as second:
        codes = [first.finish(), second.finish()]
    assert sorted(codes) == [0, 2], (first.out + first.err, second.out + second.err)
    winner, loser = (first, second) if codes[0] == 0 else (second, first)
    assert names_holder(refusal(loser), winner)
    assert iterations(run_dir) == expected


class Killed(NamedTuple):
    run_dir: Path
    pid: int


@pytest.fixture(scope="module")
def killed(tmp_path_factory: pytest.TempPathFactory) -> Killed:
    """A run of 2 iterations killed with SIGKILL after its first checkpoint: whatever it held is stale."""
    run_dir = tmp_path_factory.mktemp("killed") / "run"
    with Child(ppo_eqx(*tiny(run_dir, 2, checkpoint_every=1))) as child:
        child.wait_for_file(run_dir / "checkpoints" / "iter_000001.json")
        child.kill()
        return Killed(run_dir, child.pid)


def lock_files(run_dir: Path, pid: int) -> list[Path]:
    """The files in or beside ``run_dir`` (not its metrics, events or checkpoints) that name process ``pid``."""
    found = []
    candidates = [*run_dir.iterdir(), *run_dir.parent.glob(f"{run_dir.name}?*")]
    for path in candidates:
        if path.is_file() and path.name != "metrics.jsonl" and not path.name.startswith("events.out.tfevents"):
            if re.search(rf"(?<!\d){pid}(?!\d)", path.read_text(errors="replace")):
                found.append(path)
    return found


def reuse_pid(run_dir: Path, killed: Killed) -> None:
    """Make the dead run's lock name a live process that holds no lock (its pid reused): this test's process."""
    (lock,) = lock_files(run_dir, killed.pid)
    lock.write_text(re.sub(rf"(?<!\d){killed.pid}(?!\d)", str(os.getpid()), lock.read_text()))


@pytest.mark.parametrize(
    ("prepare", "command", "expected"),
    [
        pytest.param(None, ["train", "--resume", "RUN", "--no-progress"], [1, 2], id="resume-after-sigkill"),
        pytest.param(None, [*tiny(Path("RUN"), 2), "--overwrite"], [1, 2], id="overwrite-after-sigkill"),
        pytest.param(reuse_pid, ["train", "--resume", "RUN", "--no-progress"], [1, 2], id="lock-names-a-live-pid"),
    ],
)
@pytest.mark.xdist_group("ownership-killed")
def test_a_stale_lock_of_a_dead_run_does_not_stop_the_next(killed: Killed, tmp_path: Path, prepare, command, expected):
    run_dir = tmp_path / "run"
    shutil.copytree(killed.run_dir, run_dir)  # the copy keeps whatever the dead run left, lock files too
    if prepare is not None:
        prepare(run_dir, killed)
    with Child(ppo_eqx(*[str(run_dir) if arg == "RUN" else arg for arg in command])) as child:
        assert child.finish() == 0, child.out + child.err
    assert iterations(run_dir) == expected


@pytest.mark.xdist_group("ownership-killed")
def test_the_lock_of_a_killed_run_names_its_process_and_host(killed: Killed) -> None:
    (lock,) = lock_files(killed.run_dir, killed.pid)
    assert HOST in lock.read_text()


def test_default_run_names_of_two_runs_started_in_the_same_second_differ(tmp_path: Path) -> None:
    """No --run-dir: two runs whose clocks read the same second (time.time frozen in both) get two directories."""
    frozen = tmp_path / "frozen"
    frozen.mkdir()
    (frozen / "sitecustomize.py").write_text("import time\ntime.time = lambda: 1800000000.0\n")
    from .processes import worker_env

    env = worker_env()
    env["PYTHONPATH"] = os.pathsep.join([str(frozen), env["PYTHONPATH"]])
    args = ppo_eqx("train", "--env-id", "CartPole-v1", "--total-timesteps", str(BATCH), "--no-progress")
    with Child(args, env=env, cwd=tmp_path) as first, Child(args, env=env, cwd=tmp_path) as second:
        codes = [first.finish(), second.finish()]
    assert codes == [0, 0], (first.err, second.err)
    runs = sorted((tmp_path / "runs").iterdir())
    assert len(runs) == 2 and all(iterations(run) == [1] for run in runs), runs


def test_eval_reads_a_whole_checkpoint_while_training_prunes_it(tmp_path: Path) -> None:
    """eval is stopped after it chose the newest checkpoint and before it read the arrays (while it imports the
    env package), until training has written the next checkpoint and deleted that one (--keep-checkpoints 1)."""
    run_dir = tmp_path / "run"
    with Child(ppo_eqx(*tiny(run_dir, 8, checkpoint_every=1, keep=1))) as trainer:
        trainer.wait_for_file(run_dir / "checkpoints" / "iter_000001.json")
        with Child(ppo_eqx("eval", str(run_dir), "--episodes", "2"), profile_imports=True) as evaluation:
            evaluation.wait_for_import("envpool")
            evaluation.send(signal.SIGSTOP)
            chosen = set(checkpoint_names(run_dir))
            trainer.wait_until("the next checkpoint", lambda: not chosen & set(checkpoint_names(run_dir)))
            evaluation.send(signal.SIGCONT)
            assert evaluation.finish() == 0, evaluation.err
        assert any("return" in line for line in evaluation.out)
        trainer.kill()
