"""`ppo-eqx train` runs that are stopped, killed, resumed, or given bad input (CartPole, in-process)."""

import errno
import importlib
import json
import os
import shutil
import signal
import sys
import types

import pytest

import ppo_eqx.host.run_dir.directory as run_directory
from ppo_eqx import PPOConfig
from ppo_eqx.cli import main
from ppo_eqx.core.envs import env_spec
from ppo_eqx.host.checkpoint import list_checkpoints, load_checkpoint, read_checkpoint, read_metadata

from .comparisons import leaves_equal, metrics
from .run_files import interrupted_copy

pytestmark = pytest.mark.subprocess

train_module = importlib.import_module("ppo_eqx.host.trainer")
iteration_module = importlib.import_module("ppo_eqx.core.iteration")

# 4 iterations of 512 steps, checkpoints after iterations 2 and 4.
TINY = ["--env-id", "CartPole-v1", "--total-timesteps", "2048", "--checkpoint-every", "2"]
QUIET = ["--no-progress", "--no-tensorboard"]


def train(run_dir, *extra: str) -> int:
    return main(["train", *TINY, "--run-dir", str(run_dir), *QUIET, *extra])


def resume(run_dir, *extra: str) -> int:
    return main(["train", "--resume", str(run_dir), *QUIET, *extra])


def snapshot(run_dir) -> dict[str, bytes]:
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file()}


def error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("ppo-eqx: error: ")
    return err[0]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """An uninterrupted tiny run: the reference that resumed runs must equal."""
    run_dir = tmp_path_factory.mktemp("reference") / "run"
    assert train(run_dir) == 0
    return run_dir


def copy_run(source, tmp_path):
    target = tmp_path / "run"
    shutil.copytree(source, target)
    return target


def test_a_finished_run_has_its_checkpoints_and_nothing_to_resume(finished_run, tmp_path, capsys):
    assert [p.name for p in list_checkpoints(finished_run)] == ["iter_000002.json", "iter_000004.json"]
    assert [row["iteration"] for row in metrics(finished_run)] == [1, 2, 3, 4]
    run_dir = copy_run(finished_run, tmp_path)
    before = snapshot(run_dir)
    capsys.readouterr()
    assert resume(run_dir) == 0
    assert "finished at iteration 4; nothing to resume" in capsys.readouterr().out
    assert snapshot(run_dir) == before


def test_a_finished_run_is_said_before_a_device_is_joined(finished_run, tmp_path, monkeypatch, capsys):
    """A finished run's ``--resume`` says so at once: joining devices, checking memory or resolving the
    convolutions' route (which for ``conv_impl="kernel"`` may build the kernel) would be work for nothing."""
    command = importlib.import_module("ppo_eqx.cli.train_command")

    def not_now(*args, **kwargs):
        raise AssertionError("a finished run joined devices or resolved a route")

    monkeypatch.setattr(command, "start_processes", not_now)
    monkeypatch.setattr(command, "on_these_devices", not_now)
    run_dir = copy_run(finished_run, tmp_path)
    capsys.readouterr()
    assert resume(run_dir) == 0
    assert "finished at iteration 4; nothing to resume" in capsys.readouterr().out


def test_a_resumed_run_is_read_again_under_its_lock(finished_run, tmp_path):
    """``--resume`` plans from what the run holds, then reads it again once it holds the run's lock: a run that
    another process trained on to its end meanwhile has nothing left to resume and no directory is opened to write.
    A process of several does not read it again (its plan is every process's), and takes the directory."""
    from ppo_eqx.cli.command_line import build_parser
    from ppo_eqx.cli.plan import plan_resume
    from ppo_eqx.cli.take import take_run_dir

    run_dir = interrupted_copy(finished_run, tmp_path / "run", at=2)
    args = build_parser().parse_args(["train", "--resume", str(run_dir)])
    plan = plan_resume(args, {})
    assert plan.start_iteration == 2 and plan.nothing_to_resume is None
    for name in ("checkpoints/iter_000004.json", "checkpoints/iter_000004.eqx", "metrics.jsonl", "summary.json"):
        shutil.copy2(finished_run / name, run_dir / name)  # trained to its end by another process meanwhile
    before = unlocked(snapshot(run_dir))

    again, lock, directory = take_run_dir(plan, args, writes=True, one_process=True)
    assert lock is not None
    lock.release()
    assert again.start_iteration == 4 and directory is None
    assert again.nothing_to_resume == f"ppo-eqx: {run_dir} finished at iteration 4; nothing to resume"

    several, lock, directory = take_run_dir(plan, args, writes=True, one_process=False)
    assert lock is not None and directory is not None
    directory.close()
    lock.release()
    assert several.start_iteration == 2 and directory.path == run_dir
    assert unlocked(snapshot(run_dir)) == before


def unlocked(files: dict[str, bytes]) -> dict[str, bytes]:
    """A snapshot without the lock file, which names whoever took the lock last."""
    return {name: data for name, data in files.items() if name != ".ppo-eqx.lock"}


def break_run(run_dir, how: str) -> None:
    checkpoints = run_dir / "checkpoints"
    newest = checkpoints / "iter_000004.eqx"
    if how == "no config":
        (run_dir / "config.json").unlink()
    elif how == "config not json":
        (run_dir / "config.json").write_text("{ not json")
    elif how == "impossible config":
        config = json.loads((run_dir / "config.json").read_text())
        (run_dir / "config.json").write_text(json.dumps({**config, "num_minibatches": 3}))
    elif how == "no checkpoint":
        shutil.rmtree(checkpoints)
    elif how == "truncated":
        newest.write_bytes(newest.read_bytes()[:1000])
    elif how == "corrupted":
        data = bytearray(newest.read_bytes())
        data[-10] ^= 0x01
        newest.write_bytes(bytes(data))
    elif how == "arrays missing":
        newest.unlink()
    elif how == "another run's checkpoint":
        config = json.loads((run_dir / "config.json").read_text())
        (run_dir / "config.json").write_text(json.dumps({**config, "seed": 2}))


@pytest.mark.parametrize(
    ("how", "message"),
    [
        ("no config", "no run there (RUN/config.json is missing)"),
        ("config not json", "cannot read RUN/config.json"),
        ("impossible config", "num_minibatches=3 does not divide the batch"),
        ("no checkpoint", "RUN holds no checkpoint"),
        ("truncated", "checkpoint RUN/checkpoints/iter_000004.eqx is truncated or damaged: 1000 bytes"),
        ("corrupted", "checkpoint RUN/checkpoints/iter_000004.eqx is damaged: its SHA-256 differs"),
        ("arrays missing", "is incomplete: iter_000004.eqx is missing"),
        ("another run's checkpoint", "belongs to another run: seed=1 (this run: 2)"),
    ],
)
def test_a_bad_resume_is_one_line_and_touches_nothing(finished_run, tmp_path, capsys, how, message):
    run_dir = copy_run(finished_run, tmp_path)
    break_run(run_dir, how)
    before = snapshot(run_dir)
    capsys.readouterr()
    assert resume(run_dir) == 2
    assert message.replace("RUN", str(run_dir)) in error_line(capsys)
    assert snapshot(run_dir) == before


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--seed", "2"], "--resume continues the run with its own config (RUN/config.json); drop --seed"),
        (["--overwrite"], "--resume and --overwrite contradict each other"),
        (["--keep-checkpoints", "0"], "argument --keep-checkpoints: 0 is out of range; allowed: 1 .. 2147483647"),
    ],
)
def test_resume_flags_that_contradict_the_run_are_refused(finished_run, tmp_path, capsys, argv, message):
    run_dir = copy_run(finished_run, tmp_path)
    before = snapshot(run_dir)
    capsys.readouterr()
    assert resume(run_dir, *argv) == 2
    assert message.replace("RUN", str(run_dir)) in error_line(capsys)
    assert snapshot(run_dir) == before
    assert resume(tmp_path / "nowhere") == 2
    assert f"--resume {tmp_path / 'nowhere'}: no such run directory" in error_line(capsys)


def test_a_full_disk_stops_the_run_and_keeps_the_last_checkpoint(finished_run, tmp_path, capsys, monkeypatch):
    run_dir = tmp_path / "run"
    real_write = run_directory.write_all
    calls = []

    def disk_fills_at_the_second_checkpoint(fd, data):
        arrays = data[:1] not in (b"{", b"[")  # not the JSON files, nor the manifest's lines: a checkpoint's arrays
        calls.append(len(data)) if arrays else None
        if arrays and len(calls) == 2:  # the second checkpoint's arrays
            real_write(fd, data[: len(data) // 3])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_write(fd, data)

    monkeypatch.setattr(run_directory, "write_all", disk_fills_at_the_second_checkpoint)
    capsys.readouterr()
    assert train(run_dir) == 1
    line = error_line(capsys)
    assert "could not write the checkpoint of iteration 4" in line and "No space left on device" in line
    assert f"the previous checkpoint {run_dir / 'checkpoints' / 'iter_000002.json'} is intact" in line
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["iter_000002.eqx", "iter_000002.json"]
    monkeypatch.undo()
    # The kept checkpoint is whole, and resuming from it gives the uninterrupted run.
    path = run_dir / "checkpoints" / "iter_000002.json"
    reference = finished_run / "checkpoints" / "iter_000002.json"
    spec = env_spec("CartPole-v1")
    config = PPOConfig.from_dict(read_metadata(path)["config"])
    assert leaves_equal(
        load_checkpoint(read_checkpoint(path), config, spec), load_checkpoint(read_checkpoint(reference), config, spec)
    )
    assert resume(run_dir) == 0
    assert metrics(run_dir) == metrics(finished_run)
    assert (run_dir / "checkpoints" / "iter_000004.eqx").read_bytes() == (
        finished_run / "checkpoints" / "iter_000004.eqx"
    ).read_bytes()


@pytest.mark.parametrize("name", ["config.json", ".ppo-eqx-manifest.jsonl"])
def test_a_full_disk_at_the_start_names_the_file_it_could_not_write(tmp_path, capsys, monkeypatch, name):
    """ "No space left on device" alone named no path (issue 41): now the line names the file."""
    run_dir = tmp_path / "run"
    real_write = run_directory.write_all

    def full_for(fd, data):
        if (name == "config.json" and data[:1] == b"{") or (name != "config.json" and data[:1] == b"["):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_write(fd, data)

    monkeypatch.setattr(run_directory, "write_all", full_for)
    capsys.readouterr()
    assert train(run_dir) in (1, 2)
    line = error_line(capsys)
    assert "No space left on device" in line and str(run_dir / name) in line, line


def test_non_finite_parameters_stop_the_run_and_keep_the_last_good_checkpoint(tmp_path, capsys, monkeypatch):
    real_update = iteration_module.update
    steps_of_3 = 3 * 4 * 4  # the optimizer's count after iteration 3: 4 epochs of 4 minibatches each

    def poisoned_at_iteration_3(model, opt_state, batch, hyperparameters, **settings):
        """The update, whose model comes out of iteration 3 with a NaN (its last step's loss still finite)."""
        model, opt_state, infos = real_update(model, opt_state, batch, hyperparameters, **settings)
        bias = model.critic.layers[-1].bias
        bias = iteration_module.jnp.where(opt_state[1].count == steps_of_3, iteration_module.jnp.nan, bias)
        return iteration_module.eqx.tree_at(lambda m: m.critic.layers[-1].bias, model, bias), opt_state, infos

    monkeypatch.setattr(iteration_module, "update", poisoned_at_iteration_3)
    run_dir = tmp_path / "run"
    capsys.readouterr()
    assert train(run_dir) == 1
    last_good = run_dir / "checkpoints" / "iter_000002.json"
    assert error_line(capsys) == (
        f"ppo-eqx: error: the parameters are not finite after iteration 3; the last good checkpoint is "
        f"{last_good}; stopping"
    )
    assert list_checkpoints(run_dir) == [last_good]
    assert [row["iteration"] for row in metrics(run_dir)] == [1, 2, 3]
    assert not (run_dir / "summary.json").exists()


def test_sigint_checkpoints_and_says_how_to_resume(finished_run, tmp_path, capsys, monkeypatch, request):
    # Python's own handler, however pytest was started (a background job starts with SIGINT ignored).
    started_with = signal.signal(signal.SIGINT, signal.default_int_handler)
    request.addfinalizer(lambda: signal.signal(signal.SIGINT, started_with))
    real_dispatch = train_module.Trainer.dispatch

    def interrupted_during_iteration_3(self, until=None, most=None):
        if int(self.state.iteration) == 2:
            os.kill(os.getpid(), signal.SIGINT)
        return real_dispatch(self, until, most=most)

    monkeypatch.setattr(train_module.Trainer, "dispatch", interrupted_during_iteration_3)
    run_dir = tmp_path / "run"
    capsys.readouterr()
    assert train(run_dir) == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (
        f"ppo-eqx: stopped by SIGINT after iteration 3; checkpoint {run_dir / 'checkpoints' / 'iter_000003.json'}; "
        f"continue with: ppo-eqx train --resume {run_dir}"
    )
    assert read_metadata(run_dir / "checkpoints" / "iter_000003.json")["reason"] == "SIGINT"
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # handlers are given back
    monkeypatch.undo()
    # A stop between segment boundaries: the resumed envs are seeded from (seed, 3), so the run goes on
    # deterministically but not as the uninterrupted one; the iterations before the stop are the same.
    again = tmp_path / "again"
    shutil.copytree(run_dir, again)
    assert resume(run_dir) == 0 and resume(again) == 0
    assert metrics(run_dir) == metrics(again)
    assert metrics(run_dir)[:3] == metrics(finished_run)[:3]
    assert [row["iteration"] for row in metrics(run_dir)] == [1, 2, 3, 4]


class FakeWandb(types.ModuleType):
    """Just enough of wandb: init() returns a run that records what it is given."""

    def __init__(self):
        super().__init__("wandb")
        self.runs: list[types.SimpleNamespace] = []

    def init(self, **kwargs):
        run = types.SimpleNamespace(kwargs=kwargs, logged=[], finished=False)
        run.log = lambda data, step: run.logged.append((step, data))
        run.finish = lambda: setattr(run, "finished", True)
        self.runs.append(run)
        return run


def test_track_logs_cleanrls_tags_to_wandb_only_when_asked(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # not installed
    capsys.readouterr()
    assert train(tmp_path / "no-wandb", "--track") == 2
    assert error_line(capsys) == "ppo-eqx: error: --track needs Weights & Biases: pip install wandb"
    assert not (tmp_path / "no-wandb").exists()

    fake = FakeWandb()
    monkeypatch.setitem(sys.modules, "wandb", fake)
    argv = ["--total-timesteps", "1024", "--checkpoint-every", "50"]
    assert main(["train", "--env-id", "CartPole-v1", *argv, "--run-dir", str(tmp_path / "run"), *QUIET]) == 0
    assert fake.runs == []  # off unless --track
    assert main(["train", "--env-id", "CartPole-v1", *argv, "--run-dir", str(tmp_path / "run2"), *QUIET,
                 "--track", "--wandb-project-name", "p", "--wandb-entity", "e"]) == 0  # fmt: skip
    (run,) = fake.runs
    assert (run.kwargs["project"], run.kwargs["entity"], run.kwargs["config"]["env_id"]) == ("p", "e", "CartPole-v1")
    assert [step for step, _ in run.logged] == [512, 1024]
    rows = metrics(tmp_path / "run2")
    assert [data["losses/value_loss"] for _, data in run.logged] == [row["value_loss"] for row in rows]
    assert run.finished
    assert json.loads((tmp_path / "run2" / "wandb.json").read_text())["id"] == run.kwargs["id"]


def test_overwrite_replaces_checkpoints_too(finished_run, tmp_path, capsys):
    run_dir = copy_run(finished_run, tmp_path)
    capsys.readouterr()
    assert train(run_dir, "--seed", "3") == 2
    assert f"already holds a run; pass --overwrite to replace it or --resume {run_dir}" in error_line(capsys)
    assert main(["train", "--env-id", "CartPole-v1", "--total-timesteps", "512", "--run-dir", str(run_dir),
                 *QUIET, "--overwrite"]) == 0  # fmt: skip
    assert [p.name for p in list_checkpoints(run_dir)] == ["iter_000001.json"]
