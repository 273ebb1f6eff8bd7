"""The run directory is one object that owns every write (``ppo_eqx.host.run_dir.RunDirectory``), pinned to the
directory it was given, never through a link, deleting only what its manifest lists (issue 41): first the object
itself, then real ``ppo-eqx`` processes as a careful user and an unlucky machine would start them."""

import json
import os
import shutil
import signal
from pathlib import Path

import pytest

from ppo_eqx.errors import RunDirError
from ppo_eqx.host.run_dir.directory import RunDirectory
from ppo_eqx.host.run_dir.manifest import check_contents, refuse_strangers, strangers

from .processes import Child, ppo_eqx, run_child
from .run_files import checkpoint_names, interrupted_copy, iterations, tiny

MANIFEST = ".ppo-eqx-manifest.jsonl"


# --- the object --------------------------------------------------------------------------------------------------


@pytest.mark.unit
def test_it_writes_where_it_was_opened_after_its_path_is_repointed(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    latest = tmp_path / "latest"
    latest.symlink_to("a")
    with RunDirectory.at(latest) as directory:
        directory.write("config.json", b"{}")
        assert directory.in_place()
        latest.unlink()
        latest.symlink_to("b")  # runs/latest repointed to another run
        assert not directory.in_place()
        directory.make_dir("checkpoints")
        directory.write("checkpoints/iter_000001.json", b"{}")
        assert directory.where() == str((tmp_path / "a").resolve())
    assert sorted(os.listdir(tmp_path / "a")) == [MANIFEST, "checkpoints", "config.json"]
    assert os.listdir(tmp_path / "b") == []


@pytest.mark.unit
def test_it_never_writes_through_a_link_inside_it(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    run = tmp_path / "run"
    run.mkdir()
    (run / "checkpoints").symlink_to(outside)
    (run / "metrics.jsonl").symlink_to(outside / "mine.txt")
    with RunDirectory.at(run) as directory:
        with pytest.raises(RunDirError, match="checkpoints is a symbolic link"):
            directory.make_dir("checkpoints")
        with pytest.raises(RunDirError, match="is a symbolic link"):
            directory.write("checkpoints/iter_000001.eqx", b"x")
        with pytest.raises(RunDirError, match="metrics.jsonl is a symbolic link"):
            directory.append("metrics.jsonl")
    assert os.listdir(outside) == []


@pytest.mark.unit
def test_it_deletes_only_what_it_listed(tmp_path):
    (tmp_path / "summary.json").write_text("a user's")
    with RunDirectory.at(tmp_path) as directory:
        assert not directory.delete("summary.json")
        directory.write("config.json", b"{}")
        assert directory.delete("config.json")
    assert sorted(os.listdir(tmp_path)) == [MANIFEST, "summary.json"]


@pytest.mark.unit
def test_what_a_directory_holds_beside_its_run_is_found_in_one_pass(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    run = tmp_path / "run"
    with RunDirectory.at(run) as directory:
        directory.write("config.json", b"{}")
        directory.make_dir("checkpoints")
        directory.write("checkpoints/iter_000001.json", b"{}")
    (run / "summary.json").write_text("a user's")  # a look-alike
    (run / "notes.txt").write_text("a user's")  # no name of a run's: not a stranger
    (run / "checkpoints" / "iter_000002.eqx").write_bytes(b"a user's")  # a look-alike inside checkpoints/
    (run / "metrics.jsonl").symlink_to(outside / "mine.txt")  # a link, and a look-alike
    (run / ".eval.json.tmp").write_text("")  # the temporary of a look-alike
    found = strangers(run)
    assert found.look_alikes == [".eval.json.tmp", "checkpoints/iter_000002.eqx", "metrics.jsonl", "summary.json"]
    assert found.links == ["metrics.jsonl"]
    with pytest.raises(RunDirError, match="holds .*summary.json: named as a run's files"):
        check_contents(run, [], overwrite=True)
    for name in ("summary.json", ".eval.json.tmp", "checkpoints/iter_000002.eqx"):
        (run / name).unlink()
    with pytest.raises(RunDirError, match="holds metrics.jsonl: named as a run's files"):
        check_contents(run, [], overwrite=True)  # the link is a look-alike too: named so first
    with pytest.raises(RunDirError, match="metrics.jsonl is a symbolic link"):
        refuse_strangers(run, run, links_only=True)  # as a resumed run's directory is checked
    (run / "metrics.jsonl").unlink()
    assert strangers(run) == ([], [])
    with pytest.raises(RunDirError, match="already holds a run"):
        check_contents(run, [], overwrite=False)
    assert check_contents(run, [], overwrite=True) == [
        ("file", "config.json"),
        ("dir", "checkpoints"),
        ("file", "checkpoints/iter_000001.json"),
    ]


@pytest.mark.unit
def test_a_hard_linked_backup_keeps_what_it_held(tmp_path):
    run, backup = tmp_path / "run", tmp_path / "backup"
    with RunDirectory.at(run) as directory:
        directory.write("config.json", b"{}")
        os.close(directory.append("metrics.jsonl"))
    backup.mkdir()
    for name in (MANIFEST, "metrics.jsonl"):
        os.link(run / name, backup / name)  # cp -al run backup
    before = {name: (backup / name).read_bytes() for name in (MANIFEST, "metrics.jsonl")}
    with RunDirectory.at(run) as directory:
        directory.write("summary.json", b"{}")
        fd = directory.append("metrics.jsonl")
        os.write(fd, b'{"iteration": 1}\n')
        os.close(fd)
    assert {name: (backup / name).read_bytes() for name in before} == before
    assert b"summary.json" in (run / MANIFEST).read_bytes()


# --- real processes ----------------------------------------------------------------------------------------------


def finished_run(path: Path, iterations_: int = 4, keep: int = 3) -> Path:
    code, _, err = run_child(ppo_eqx(*tiny(path, iterations_, keep=keep), "--no-tensorboard"))
    assert code == 0, err
    return path


def stopped_run(finished: Path, tmp_path: Path, at: int) -> Path:
    """A copy of the finished run ``finished`` as one killed after its checkpoint of iteration ``at`` leaves it."""
    return interrupted_copy(finished, tmp_path / "run", at)


@pytest.fixture(scope="module")
def eight_iterations(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One finished run of 8 iterations that kept every checkpoint, trained once for the tests that stop copies of
    it (their ``xdist_group`` keeps them on one worker, so it is trained once there)."""
    return finished_run(tmp_path_factory.mktemp("eight") / "finished", 8, keep=8)


@pytest.mark.subprocess
def test_a_run_whose_link_is_repointed_stops_with_a_checkpoint_in_its_own_directory(tmp_path):
    """``runs/latest`` repointed at another run while this one trains: nothing of the other is touched, this one
    stops in one line (exit 1) with a whole checkpoint in its own directory, and resumes from there."""
    other = finished_run(tmp_path / "other")
    other_before = {p.name: p.read_bytes() for p in (other / "checkpoints").iterdir()}
    latest = tmp_path / "latest"
    (tmp_path / "mine").mkdir()
    latest.symlink_to("mine")
    with Child(ppo_eqx(*tiny(latest, 12, checkpoint_every=1, keep=1), "--no-tensorboard")) as child:
        child.wait_until(
            "two rows",
            lambda: (tmp_path / "mine" / "metrics.jsonl").exists() and len(iterations(tmp_path / "mine")) >= 2,
        )
        latest.unlink()
        latest.symlink_to("other")
        code = child.finish()
        err = [line for line in child.err if line.strip()]
    assert code == 1, err
    assert len(err) == 1 and "no longer leads to this run's directory" in err[0], err
    assert f"--resume {(tmp_path / 'mine').resolve()}" in err[0]
    assert {p.name: p.read_bytes() for p in (other / "checkpoints").iterdir()} == other_before
    mine = checkpoint_names(tmp_path / "mine")
    assert mine and len(mine) == 2, mine
    code, _, err = run_child(ppo_eqx("train", "--resume", str(tmp_path / "mine"), "--no-progress", "--no-tensorboard"))
    assert code == 0, err


@pytest.mark.subprocess
def test_overwrite_of_a_run_whose_checkpoints_are_a_link_is_refused_before_anything_is_deleted(tmp_path):
    run = finished_run(tmp_path / "run")
    outside = tmp_path / "outside"
    shutil.move(run / "checkpoints", outside)
    (run / "checkpoints").symlink_to(outside)
    (outside / "iter_000099.json").write_text("a user's")
    before = sorted(p.name for p in run.iterdir()), sorted(p.name for p in outside.iterdir())
    code, _, err = run_child(ppo_eqx(*tiny(run), "--overwrite"))
    assert code == 2 and len(err) == 1 and "checkpoints is a symbolic link" in err[0], err
    assert (sorted(p.name for p in run.iterdir()), sorted(p.name for p in outside.iterdir())) == before


@pytest.mark.subprocess
@pytest.mark.xdist_group("eight-iterations")
def test_resume_prunes_only_the_checkpoints_its_run_wrote(tmp_path, eight_iterations):
    run = stopped_run(eight_iterations, tmp_path, 4)
    users = {run / "checkpoints" / f"iter_000003.{ext}": b"mine" for ext in ("eqx", "json")}
    for path, data in users.items():
        path.write_bytes(data)
    code, _, err = run_child(
        ppo_eqx("train", "--resume", str(run), "--keep-checkpoints", "1", "--no-progress", "--no-tensorboard")
    )
    assert code == 0, err
    assert all(path.read_bytes() == data for path, data in users.items())
    assert checkpoint_names(run) == sorted([*(p.name for p in users), "iter_000008.eqx", "iter_000008.json"])


@pytest.mark.subprocess
def test_a_resume_leaves_a_hard_linked_backups_manifest_as_it_was(tmp_path):
    run = stopped_run(finished_run(tmp_path / "finished", 4, keep=8), tmp_path, 2)
    backup = tmp_path / "backup"
    backup.mkdir()
    os.link(run / MANIFEST, backup / MANIFEST)
    before = (backup / MANIFEST).read_bytes()
    code, _, err = run_child(ppo_eqx("train", "--resume", str(run), "--no-progress"))  # a new events file: listed
    assert code == 0, err
    assert (backup / MANIFEST).read_bytes() == before
    assert (run / MANIFEST).read_bytes().startswith(before) and (run / MANIFEST).read_bytes() != before


CRAFTED = {
    "an iteration of 10**12": ({"iteration": 10**12}, "its iteration is 1000000000000"),
    "arrays outside the checkpoint": ({"arrays": "../../../etc/passwd"}, "its arrays are '../../../etc/passwd'"),
    "arrays of another checkpoint": ({"arrays": "iter_000002.eqx"}, "allowed: iter_000004.eqx"),
    "a size that is no size": ({"arrays_bytes": -1}, "its arrays_bytes is -1"),
    "a hash that is no hash": ({"arrays_sha256": ["x"]}, "its arrays_sha256 is"),
}


@pytest.mark.subprocess
@pytest.mark.xdist_group("eight-iterations")
@pytest.mark.parametrize("case", CRAFTED)
def test_a_crafted_checkpoint_json_is_one_line_and_nothing_is_touched(tmp_path, case, eight_iterations):
    run = stopped_run(eight_iterations, tmp_path, 4)
    newest = run / "checkpoints" / "iter_000004.json"
    metadata = json.loads(newest.read_text())
    changes, words = CRAFTED[case]
    newest.write_text(json.dumps({**metadata, **changes}))
    before = {p.relative_to(run): p.read_bytes() for p in run.rglob("*") if p.is_file()}
    for command in (("train", "--resume", str(run)), ("eval", str(run), "--episodes", "1")):
        code, _, err = run_child(ppo_eqx(*command, "--no-progress") if command[0] == "train" else ppo_eqx(*command))
        assert code == 2 and len(err) == 1 and words in err[0], (command, err)
        assert not any("Traceback" in line for line in err)
    assert {p.relative_to(run): p.read_bytes() for p in run.rglob("*") if p.is_file()} == before


@pytest.mark.subprocess
@pytest.mark.parametrize("signum", [signal.SIGHUP, signal.SIGUSR1])
def test_sighup_and_sigusr1_stop_a_run_as_sigterm_does(tmp_path, signum):
    run = tmp_path / "run"
    with Child(ppo_eqx(*tiny(run, 12, checkpoint_every=1), "--no-tensorboard")) as child:
        child.wait_until("a row", lambda: (run / "metrics.jsonl").exists() and len(iterations(run)) >= 1)
        child.send(signum)
        code = child.finish()
    name = signal.Signals(signum).name
    assert code == 128 + signum, child.err
    assert any(f"stopped by {name}" in line and "--resume" in line for line in child.err), child.err
    names = checkpoint_names(run)
    assert all(name.removesuffix(".eqx") + ".json" in names for name in names if name.endswith(".eqx")), names
    code, _, err = run_child(ppo_eqx("train", "--resume", str(run), "--no-progress", "--no-tensorboard"))
    assert code == 0, err


@pytest.mark.subprocess
def test_a_run_without_a_manifest_is_refused_to_resume_in_one_line(tmp_path):
    run = finished_run(tmp_path / "run", 2)
    (run / MANIFEST).unlink()  # as an earlier ppo-eqx left it
    before = sorted(p.name for p in run.iterdir())
    code, _, err = run_child(ppo_eqx("train", "--resume", str(run), "--no-progress"))
    assert code == 2 and len(err) == 1 and "holds no list of what its run wrote" in err[0], err
    assert sorted(p.name for p in run.iterdir()) == before


@pytest.mark.subprocess
def test_a_closed_pipe_on_stdout_never_stops_training(tmp_path):
    """``ppo-eqx train ... | head -2``: the output stops, the run goes on to its end, whole."""
    import subprocess
    import sys

    from .processes import ROOT, worker_env

    run = tmp_path / "run"
    process = subprocess.Popen(
        [sys.executable, *ppo_eqx(*tiny(run, 4), "--no-tensorboard")],
        env=worker_env(),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None and process.stderr is not None
    first = process.stdout.readline()
    process.stdout.close()  # as head does after its lines
    err = process.stderr.read()
    process.stderr.close()
    assert process.wait(timeout=180) == 0, err
    assert "ppo-eqx" in first and "Traceback" not in err and "Exception ignored" not in err, err
    assert iterations(run) == [1, 2, 3, 4] and (run / "summary.json").exists()


@pytest.mark.subprocess
@pytest.mark.xdist_group("eight-iterations")
def test_a_resumed_run_keeps_the_checkpoints_it_was_started_to_keep(tmp_path, eight_iterations):
    # Started to keep 8: say 2, as its newest checkpoint records it.
    stopped = stopped_run(eight_iterations, tmp_path, 4)
    newest = stopped / "checkpoints" / "iter_000004.json"
    newest.write_text(json.dumps({**json.loads(newest.read_text()), "keep_checkpoints": 2}))
    assert [name for name in checkpoint_names(stopped) if name.endswith(".json")] == [
        "iter_000002.json",
        "iter_000004.json",
    ]
    code, _, err = run_child(ppo_eqx("train", "--resume", str(stopped), "--no-progress", "--no-tensorboard"))
    assert code == 0, err
    assert [name for name in checkpoint_names(stopped) if name.endswith(".json")] == [
        "iter_000006.json",
        "iter_000008.json",
    ]


# --- the library checks what it is given --------------------------------------------------------------------------


@pytest.mark.envpool
def test_a_restore_of_other_envs_and_a_closed_trainer_are_refused(tmp_path):
    import ppo_eqx

    config = ppo_eqx.PPOConfig.for_task("CartPole-v1", total_timesteps=4 * 512)
    with ppo_eqx.Trainer(config) as trainer:
        checkpoint = trainer.checkpoint()
    with pytest.raises(RuntimeError, match="this Trainer is closed"):
        trainer.dispatch()
    with pytest.raises(RuntimeError, match="this Trainer is closed"):
        list(ppo_eqx.run(trainer))
    with pytest.raises(ppo_eqx.ConfigError, match=r"restore holds envs of shape \(4,\); config's are \(8,\)"):
        ppo_eqx.Trainer(config.replace(num_envs=8, total_timesteps=8 * 512), restore=checkpoint)


@pytest.mark.unit
def test_sweep_values_equal_in_float32_are_refused():
    from ppo_eqx import ConfigError, PPOConfig

    with pytest.raises(ConfigError, match="are the same float32 number"):
        PPOConfig(sweep={"learning_rate": [1e-3, 1e-3 + 1e-12]}).validate()
    assert PPOConfig(sweep={"learning_rate": [1e-3, 2e-3]}).validate().num_agents == 2
