"""The library writes under the same owner as the command line (issue 53): ``save_checkpoint`` into a run directory
takes its lock (refused, naming the holder, while another process holds it), prunes only its own run's
checkpoints (never a finished run's it saves beside), and a resumed copy made by ``cp -al`` replaces its hard-linked
lock file instead of rewriting the original's."""

import fcntl
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

import ppo_eqx
from ppo_eqx.cli import main
from ppo_eqx.errors import RunDirError
from ppo_eqx.host.checkpoint import list_checkpoints
from ppo_eqx.host.run_dir.names import LOCK

from .run_files import tiny

pytestmark = pytest.mark.envpool


def _checkpoint(iterations: int = 1) -> tuple[ppo_eqx.PPOConfig, ppo_eqx.Checkpoint, ppo_eqx.EnvSpec]:
    config = ppo_eqx.PPOConfig.for_task("CartPole-v1", total_timesteps=4 * 128 * iterations, learning_rate=1e-3)
    with ppo_eqx.Trainer(config) as trainer:
        list(ppo_eqx.run(trainer))
        return config, trainer.checkpoint(), trainer.spec


def test_save_checkpoint_is_refused_while_another_process_holds_the_directory(tmp_path: Path) -> None:
    config, checkpoint, spec = _checkpoint()
    run = tmp_path / "run"
    run.mkdir()
    (run / LOCK).write_text(json.dumps({"pid": os.getpid(), "host": os.uname().nodename, "since": "now",
                                        "command": "ppo-eqx train"}) + "\n")  # fmt: skip
    holder = os.open(run, os.O_RDONLY | os.O_DIRECTORY)  # another open file: as another process's lock
    fcntl.flock(holder, fcntl.LOCK_EX | fcntl.LOCK_NB)
    try:
        with pytest.raises(RunDirError, match=r"is in use by pid \d+ on host .*\(ppo-eqx train since now\)"):
            ppo_eqx.save_checkpoint(run, checkpoint, config, spec, keep=1)
    finally:
        os.close(holder)
    assert not (run / "checkpoints").exists()
    path = ppo_eqx.save_checkpoint(run, checkpoint, config, spec, keep=1)  # free again: it writes
    assert path.exists()


@pytest.mark.subprocess
def test_a_library_save_beside_a_finished_run_prunes_its_own_checkpoints_alone(tmp_path: Path, capsys) -> None:
    run = tmp_path / "run"
    assert main(tiny(run, 4, checkpoint_every=1, keep=5)) == 0
    theirs = [p.name for p in list_checkpoints(run)]
    assert theirs == [f"iter_00000{i}.json" for i in (1, 2, 3, 4)]
    config, checkpoint, spec = _checkpoint()  # another run's (another config), at iteration 1
    checkpoint = checkpoint.__class__(checkpoint.model, checkpoint.opt_state, checkpoint.key, checkpoint.envs,
                                      checkpoint.iteration + 10)  # fmt: skip
    for _ in range(2):
        ppo_eqx.save_checkpoint(run, checkpoint, config, spec, keep=1)
    assert [p.name for p in list_checkpoints(run)] == [*theirs, "iter_000011.json"]


@pytest.mark.subprocess
def test_a_resumed_hard_linked_copy_leaves_the_original_lock_file_alone(tmp_path: Path) -> None:
    run, copy = tmp_path / "run", tmp_path / "copy"
    assert main(tiny(run, 4)) == 0
    last = list_checkpoints(run)[-1]  # the copy goes on from iteration 2
    subprocess.run(["cp", "-al", str(run), str(copy)], check=True)
    for name in (last.name, last.with_suffix(".eqx").name):
        (copy / "checkpoints" / name).unlink()
    before = (run / LOCK).read_bytes()
    assert os.stat(run / LOCK).st_ino == os.stat(copy / LOCK).st_ino  # one file, two names
    assert main(["train", "--resume", str(copy), "--no-progress", "--no-tensorboard"]) == 0
    assert (run / LOCK).read_bytes() == before
    assert os.stat(run / LOCK).st_ino != os.stat(copy / LOCK).st_ino
    shutil.rmtree(copy)
