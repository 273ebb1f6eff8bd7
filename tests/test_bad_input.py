"""Bad input never costs data (issue 17): every flag of ``ppo-eqx train`` and ``ppo-eqx eval`` given a bad value
exits 2 with one line and leaves a finished run byte for byte as it was; faults after a run has started exit 1
with one line and keep what was written before. In-process through ``cli.main`` (CartPole); the few cases that
train take seconds, the hundreds that must not are refused before anything compiles.
"""

import dataclasses
import errno
import faulthandler
import json
import os
import shutil
import sys
from pathlib import Path

import jax
import pytest

import ppo_eqx.cli.train_command as train_command
import ppo_eqx.cli.writers as writers
from ppo_eqx.cli import main
from ppo_eqx.config import FIELD_CHOICES, FIELD_RANGES, INT32_MAX, PPOConfig
from ppo_eqx.host.checkpoint import list_checkpoints, read_arrays, read_metadata

from .run_files import listing

pytestmark = pytest.mark.subprocess

TINY = ["--env-id", "CartPole-v1", "--total-timesteps", "1024", "--num-envs", "4", "--num-steps", "128"]
QUIET = ["--no-tensorboard", "--no-progress"]
LONG_DIGITS = "9" * 5000  # beyond int32 and float32 (float() makes it inf), and Python's 4300-digit int limit
LONG_TEXT = "x" * 5000
MAX_LINE = 400  # an error line echoes a value cut short, never 5000 characters of it


def snapshot(root: Path) -> dict[str, bytes | str | None]:
    """Every file (its bytes), directory (None) and symlink (its target) under ``root``."""
    tree: dict[str, bytes | str | None] = {}
    for path in sorted(root.rglob("*")):
        key = str(path.relative_to(root))
        tree[key] = f"-> {os.readlink(path)}" if path.is_symlink() else None if path.is_dir() else path.read_bytes()
    return tree


def error_line(capsys) -> str:
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("ppo-eqx: error: "), err
    assert "Traceback" not in captured.err
    assert len(err[0]) <= MAX_LINE, err[0][:200]
    return err[0]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """A finished tiny CartPole run: 2 iterations, the checkpoint of iteration 2, no TensorBoard."""
    run_dir = tmp_path_factory.mktemp("finished") / "run"
    assert main(["train", *TINY, *QUIET, "--run-dir", str(run_dir)]) == 0
    assert (run_dir / "checkpoints" / "iter_000002.json").is_file()
    return run_dir


@pytest.fixture
def must_not_start(monkeypatch):
    """A case that got past the checks would train, or join a distributed run: fail it at once instead."""

    def train(*args, **kwargs):
        raise AssertionError("bad input reached the Supervisor: it would have trained")

    def join(*args, **kwargs):
        raise AssertionError("bad input reached jax.distributed.initialize")

    # Where train_command looks it up: patching supervisor's own name would also be bound for good by a first
    # import of train_command made while the patch is on.
    monkeypatch.setattr(train_command, "Supervisor", train)
    monkeypatch.setattr(jax.distributed, "initialize", join)


# --- the table of ppo-eqx train's bad values --------------------------------------------------------------------
#
# Config flags, derived from PPOConfig's fields:
#   int fields    always bad: not a number (abc), not an integer (1.5), nan, inf, 1e39, empty, 5000 digits;
#                 bad by the field's range (config.FIELD_RANGES): -1, 0, 2147483648 (beyond int32).
#                 So 0 is fine for --seed and --async-batch-size.
#   float fields  always bad: abc, nan, inf, -inf, 1e39 (beyond float32), empty, 5000 digits (inf);
#                 bad by range: -1, 0 and 1e-39 (subnormal, flushed to 0) where the field must be > 0
#                 (learning rate, max grad norm), 1.5 and 2147483648 where it is a probability (gamma, lambda).
#                 0 and 2147483648 are fine for the loss weights (clip, entropy, value coefficients).
#   str fields    env_id: empty, 5000 characters, not a task (nan, 0, lower case), a continuous task
#                 whose observations are a dict (dm_control's CheetahRun-v1); choices (conv_impl, env_backend): empty,
#                 5000 characters, any other word.
#   bool fields   a value (--anneal-lr=1, --no-anneal-lr=0): argparse's switches take none.
#   --sweep       no NAME=, no values, an empty value, an unknown name, a name that one program cannot sweep
#                 (shapes, seeds, the env), a value that does not parse or is out of the field's range, a
#                 repeated value, one setting in all, a name given twice or also given as its own flag.
# Run flags:
#   --run-dir     empty, 5000 characters, a 256-character name, an existing file, a path inside a file, and the
#                 run's own checkpoints/ (a run inside another run's files, which an --overwrite of that run
#                 would delete).
#   --resume      empty, 5000 characters, no such directory, a file; with config flags or --overwrite it
#                 contradicts them (the same exit 2 before anything is read).
#   --keep-checkpoints, --devices, --num-processes, --process-id: integers in their ranges (1 .. 2**31-1,
#                 1 .. 2**16, 1 .. 2**16, 0 .. 2**16) and below; --devices 65536 is more than jax sees here;
#                 --process-id 2 is not below --num-processes 2.
#   --coordinator-address: empty, 5000 characters, no port, port 0 / 99999 / -1 / abc / none, no host, and
#                 any of the three multi-host flags without the others.
#   --wandb-project-name, --wandb-entity: unused without --track, so any text is fine (an empty or long name
#                 included); with --track W&B judges them, and W&B is not installed here: --track itself is
#                 the bad input (and --track with --num-seeds 2).
#   switches      --overwrite=1, --no-tensorboard=1, --no-progress=1, --track=1, --distributed=1.
# Combinations that validate() refuses, and argparse's own: unknown flag, a flag without its value, a stray word.

INT_ALWAYS_BAD = ("abc", "1.5", "nan", "inf", "1e39", "", LONG_DIGITS)
INT_RANGE_PROBES = (-1, 0, 2**31)
FLOAT_ALWAYS_BAD = ("abc", "nan", "inf", "-inf", "1e39", "", LONG_DIGITS)
FLOAT_RANGE_PROBES = ("-1", "0", "1e-39", "1.5", "2147483648")
STR_BAD = {
    "env_id": ("", LONG_TEXT, "nan", "0", "cartpole-v1", "CheetahRun-v1"),
}
CHOICE_BAD = ("", LONG_TEXT, "nan", "AUTO")
SWEEP_BAD = (
    "",
    LONG_TEXT,
    "learning-rate",
    "learning-rate=",
    "learning-rate=,",
    "learning-rate=0.1,",
    "learning-rate=abc,0.1",
    f"learning-rate={LONG_DIGITS},0.1",
    "learning-rate=nan,0.1",
    "learning-rate=-1,0.1",
    "learning-rate=1e-39,0.1",
    "gamma=0.9,1.5",
    "ent-coef=0.1,1e39",
    "norm-adv=true,maybe",
    "norm-adv=1,0",
    "learning-rate=0.1,0.1",
    "learning-rate=0.1",
    "bogus=1,2",
    f"{LONG_TEXT}=1,2",
    "num-envs=4,8",
    "num-steps=64,128",
    "num-minibatches=2,4",
    "update-epochs=1,2",
    "total-timesteps=1024,2048",
    "seed=1,2",
    "num-seeds=1,2",
    "env-id=CartPole-v1,Acrobot-v1",
    "conv-impl=xla,matmul",
    "checkpoint-every=1,2",
    "async-batch-size=0,2",
    "sweep=1,2",
)


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def int_values(low: int, high: int) -> list[str]:
    extra = [high + 1] if high + 1 < 2**31 else []
    return [*INT_ALWAYS_BAD, *(str(v) for v in (*INT_RANGE_PROBES, *extra) if not low <= v <= high)]


def config_cases() -> list[tuple[str, ...]]:
    cases: list[tuple[str, ...]] = []
    for field in dataclasses.fields(PPOConfig):
        name = flag(field.name)
        if field.type is bool:
            cases += [(f"{name}=1",), (f"--no-{name[2:]}=0",)]
        elif field.name in FIELD_CHOICES:
            cases += [(f"{name}={value}",) for value in CHOICE_BAD]
        elif field.type is str:
            cases += [(f"{name}={value}",) for value in STR_BAD[field.name]]
        elif field.type is int:
            low, high, _ = FIELD_RANGES[field.name]
            cases += [(f"{name}={value}",) for value in int_values(int(low), int(high))]
        elif field.type is float:
            low, high, _ = FIELD_RANGES[field.name]
            bad = [v for v in FLOAT_RANGE_PROBES if not low <= float(v) <= high]
            cases += [(f"{name}={value}",) for value in (*FLOAT_ALWAYS_BAD, *bad)]
        elif field.name == "sweep":
            cases += [(f"--sweep={value}",) for value in SWEEP_BAD]
        else:
            raise AssertionError(f"PPOConfig.{field.name} has a type this table does not know: {field.type}")
    return cases


MULTI_HOST = ("--coordinator-address=localhost:1234", "--num-processes=2", "--process-id=0")


def run_flag_cases() -> list[tuple[str, ...]]:
    cases: list[tuple[str, ...]] = []
    for value in (
        "",
        LONG_TEXT,
        "a/" + "x" * 256,
        "{run}/config.json",
        "{run}/config.json/sub",
        "{run}/checkpoints",
        "{run}/checkpoints/new",
    ):
        cases.append((f"--run-dir={value}",))
    for value in ("", LONG_TEXT, "{tmp}/nowhere", "{run}/config.json", "{run}"):
        cases.append((f"--resume={value}",))
    cases += [(f"--keep-checkpoints={value}",) for value in int_values(1, INT32_MAX)]
    cases += [(f"--devices={value}",) for value in (*int_values(1, 2**16), "65536")]
    for value in ("", LONG_TEXT, "localhost", "host:99999", ":123", "host:0", "host:-1", "host:abc", "host:"):
        cases.append((f"--coordinator-address={value}", *MULTI_HOST[1:]))
    for value in int_values(1, 2**16):
        cases.append((MULTI_HOST[0], f"--num-processes={value}", MULTI_HOST[2]))
    for value in (*int_values(0, 2**16), "2"):
        cases.append((*MULTI_HOST[:2], f"--process-id={value}"))
    cases += [(MULTI_HOST[0],), (MULTI_HOST[1],), (MULTI_HOST[2],), MULTI_HOST[:2], MULTI_HOST[1:]]
    if not _installed("wandb"):
        cases += [("--track",), ("--track", "--wandb-project-name="), ("--track", "--num-seeds=2")]
    cases += [(f"{switch}=1",) for switch in ("--overwrite", "--no-tensorboard", "--no-progress", "--track")]
    cases.append(("--distributed=1",))
    return cases


COMBINATIONS = [
    ("--num-minibatches=3",),  # does not divide the batch
    ("--total-timesteps=100",),  # less than one batch
    ("--async-batch-size=3",),  # does not divide num_envs
    ("--async-batch-size=4",),  # not below num_envs
    ("--num-seeds=2", "--async-batch-size=2"),  # async with several seeds
    ("--sweep=gamma=0.9,0.99", "--async-batch-size=2"),  # async with several settings
    ("--sweep=gamma=0.9,0.99", "--sweep=gamma=0.8,0.7"),  # a name given twice
    ("--gamma=0.9", "--sweep=gamma=0.8,0.7"),  # a name given as its flag too
    ("--sweep=gamma=0.9,0.99", "--num-seeds=1073741824"),  # transitions per iteration beyond int32
    ("--seed=2147483647", "--num-envs=8"),  # env seeds beyond int32 (EnvPool refuses them)
    ("--seed=2147483645",),  # the last of 4 envs gets seed 2147483648: beyond int32
    ("--num-seeds=2147483647",),  # transitions per iteration beyond int32
    ("--num-envs=65536", "--num-steps=65536"),  # transitions per iteration beyond int32
    ("--bootstrap-truncated", "--async-batch-size=2"),  # the async rollout bootstraps no time limit
    ("--env-backend=gymnax", "--async-batch-size=2"),  # gymnax has no async pool (or is not installed)
    ("--env-backend=gymnax", "--env-id=Pong-v5"),  # not a gymnax task (or gymnax is not installed)
    ("--no-such-flag",),
    ("--num-envs",),  # no value
    ("stray",),
]


def _installed(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


TRAIN_CASES = config_cases() + run_flag_cases() + COMBINATIONS


def case_id(argv: tuple[str, ...]) -> str:
    text = " ".join(argv)
    return text if len(text) <= 60 else f"{text[:40]}...({len(text)} chars)"


def fill(argv: tuple[str, ...], run: Path, tmp: Path) -> list[str]:
    return [part.replace("{run}", str(run)).replace("{tmp}", str(tmp)) for part in argv]


@pytest.mark.parametrize("argv", TRAIN_CASES, ids=[case_id(a) for a in TRAIN_CASES])
def test_bad_train_input_exits_2_and_touches_nothing(argv, finished_run, tmp_path, capsys, must_not_start):
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    before = snapshot(tmp_path)
    capsys.readouterr()
    # Over a finished run with --overwrite: refused before the old run is cleared.
    assert main(["train", *TINY, *QUIET, "--run-dir", str(run), "--overwrite", *fill(argv, run, tmp_path)]) == 2
    error_line(capsys)
    assert snapshot(tmp_path) == before
    # Into a new path: refused before the path (or any parent) is created.
    assert main(["train", *TINY, *QUIET, "--run-dir", str(tmp_path / "new" / "run"), *fill(argv, run, tmp_path)]) == 2
    error_line(capsys)
    assert snapshot(tmp_path) == before


def test_the_table_covers_every_train_flag():
    from ppo_eqx.cli.command_line import build_parser

    train = build_parser()._subparsers._group_actions[0].choices["train"]  # type: ignore[union-attr]
    flags = {option for action in train._actions for option in action.option_strings if option.startswith("--")}
    flags -= {"--help", "--wandb-project-name", "--wandb-entity"}  # unused without --track (see the table)
    covered = {part.split("=")[0] for argv in TRAIN_CASES for part in argv}
    assert flags - covered == set()


# --- ppo-eqx eval ----------------------------------------------------------------------------------------------

EVENTS = "events.out.tfevents.1700000000.host"
EVAL_CASES = [
    ("",),
    (LONG_TEXT,),
    ("{tmp}/nowhere",),
    ("{run}/config.json",),  # not a checkpoint
    ("{run}/checkpoints",),  # neither a run directory nor a checkpoint
    ("{run}/checkpoints/iter_000009.json",),
    *[("{run}", f"--episodes={value}") for value in int_values(1, 10**6)],
    *[("{run}", f"--seed={value}") for value in int_values(0, INT32_MAX)],
    *[
        ("{run}", f"--output={value}")
        for value in (
            "",
            LONG_TEXT,
            "{tmp}/" + "x" * 256,
            "{run}/config.json",
            "{run}/hardware.json",
            "{run}/metrics.jsonl",
            "{run}/summary.json",
            "{run}/seeds.json",
            "{run}/wandb.json",
            "{run}/checkpoints/iter_000002.json",
            "{run}/checkpoints/iter_000002.eqx",
            "{run}/checkpoints",
            "{run}/checkpoints/new.json",  # a new file among the checkpoints
            f"{{run}}/{EVENTS}",
            "{run}/events.out.tfevents.new",
            "{run}/../run/metrics.jsonl",  # the same file by another name
            "{tmp}/link.json",  # a symlink to the run's config.json
            "{run}",  # directories
            "{tmp}",
            "{tmp}/dir.mp4",
            "{run}/config.json/eval.json",  # inside a file
            "{tmp}/missing/eval.json",  # a missing parent directory
            "{tmp}/other/metrics.jsonl",  # another run's own files
            "{tmp}/other/checkpoints/new.json",
        )
    ],
    *[
        ("{run}", f"--video={value}")
        for value in (
            "",
            LONG_TEXT,
            "{tmp}/video.avi",
            "{tmp}/video",
            "{run}/config.json",
            "{run}/checkpoints/video.mp4",
            f"{{run}}/{EVENTS}.gif",
            "{run}",
            "{tmp}/dir.mp4",
            "{run}/config.json/video.mp4",
            "{tmp}/missing/video.gif",
            "{tmp}/other/checkpoints/video.mp4",
        )
    ],
    ("{run}", "--output={tmp}/same.gif", "--video={tmp}/same.gif"),
    ("{run}", "--output={tmp}/same.mp4", "--video={tmp}/./same.mp4"),
    ("{run}", "--video={run}/eval.json"),  # the default output, and not a video
    ("{run}", "--greedy=1"),
    ("{run}", "--no-such-flag"),
    ("{run}", "{run}"),
    (),
]


@pytest.mark.parametrize("argv", EVAL_CASES, ids=[case_id(a) for a in EVAL_CASES])
def test_bad_eval_input_exits_2_and_writes_nothing(argv, finished_run, tmp_path, capsys, monkeypatch):
    def play(*args, **kwargs):
        raise AssertionError("bad input reached the evaluation")

    monkeypatch.setattr("ppo_eqx.cli.eval_command._play", play)
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    shutil.copytree(finished_run, tmp_path / "other")
    (run / EVENTS).write_bytes(b"events")
    (tmp_path / "dir.mp4").mkdir()
    (tmp_path / "link.json").symlink_to(run / "config.json")
    before = snapshot(tmp_path)
    capsys.readouterr()
    assert main(["eval", *fill(argv, run, tmp_path)]) == 2
    error_line(capsys)
    assert snapshot(tmp_path) == before  # no eval.json, no video, nothing else


# --- the data-loss cases that users found ----------------------------------------------------------------------

FOUND = [
    ("--env-id", "CheetahRun-v1"),  # found as Ant-v4 when continuous actions were refused; now dm_control's dict
    ("--learning-rate", "inf"),
    ("--seed", "2147483647", "--num-envs", "8"),  # a seed EnvPool refuses
]


@pytest.mark.parametrize("argv", FOUND, ids=[case_id(a) for a in FOUND])
def test_overwrite_with_bad_input_keeps_the_old_run(argv, finished_run, tmp_path, capsys, must_not_start):
    run = tmp_path / "runs" / "x"
    shutil.copytree(finished_run, run)
    before = snapshot(run)
    capsys.readouterr()
    assert main(["train", *TINY, *QUIET, *argv, "--run-dir", str(run), "--overwrite"]) == 2
    error_line(capsys)
    assert snapshot(run) == before


def test_bad_input_creates_nothing_so_the_corrected_retry_runs(tmp_path, capsys):
    run = tmp_path / "runs" / "x"
    for argv in FOUND:
        assert main(["train", *TINY, *QUIET, *argv, "--run-dir", str(run)]) == 2
        error_line(capsys)
        assert not (tmp_path / "runs").exists()
    assert main(["train", *TINY, *QUIET, "--run-dir", str(run)]) == 0  # not "already holds a run"
    assert (run / "checkpoints" / "iter_000002.json").is_file()


def test_overwrite_of_a_seeds_run_by_one_seed_clears_the_old_agents(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", *TINY, *QUIET, "--num-seeds", "2", "--run-dir", str(run)]) == 0
    assert listing(run) == ["checkpoints", "seed1", "seed2", "seeds.json"]
    before = snapshot(run)
    # A bad overwrite keeps both agents; eval refuses the two-agent checkpoint without writing.
    assert main(["train", *TINY, *QUIET, "--gamma", "2", "--run-dir", str(run), "--overwrite"]) == 2
    error_line(capsys)
    assert main(["eval", str(run), "--output", str(tmp_path / "eval.json")]) == 2
    assert "eval takes one agent's" in error_line(capsys)
    assert snapshot(run) == before
    # A good one replaces the seeds' run whole: no seedK/ left to be read as a run of its own.
    assert main(["train", *TINY, *QUIET, "--run-dir", str(run), "--overwrite"]) == 0
    assert listing(run) == [
        "checkpoints",
        "config.json",
        "hardware.json",
        "metrics.jsonl",
        "summary.json",
    ]
    assert json.loads((run / "config.json").read_text())["num_seeds"] == 1


@pytest.mark.parametrize(
    ("address", "message"),
    [
        ("localhost", "--coordinator-address 'localhost' is not HOST:PORT"),
        ("host:99999", "--coordinator-address 'host:99999' is not HOST:PORT"),
        (":123", "--coordinator-address ':123' is not HOST:PORT"),
    ],
)
def test_malformed_multi_host_flags_are_one_line(address, message, tmp_path, capsys, must_not_start):
    argv = ["train", *TINY, *QUIET, "--run-dir", str(tmp_path / "run")]
    assert main([*argv, "--coordinator-address", address, "--num-processes", "2", "--process-id", "0"]) == 2
    assert message in error_line(capsys)
    assert not (tmp_path / "run").exists()


# --- faults after the start: exit 1, one line, what was written before intact ----------------------------------

FOUR_ITERATIONS = ["--env-id", "CartPole-v1", "--total-timesteps", "2048", "--num-envs", "4", "--num-steps", "128"]
ENOSPC = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


@pytest.fixture
def watchdog():
    """A writer that blocks forever would hang the test run: end the process with the stacks after 5 minutes."""
    faulthandler.dump_traceback_later(300, exit=True, file=sys.__stderr__)  # pyright: ignore[reportArgumentType]
    yield
    faulthandler.cancel_dump_traceback_later()


def assert_intact(run: Path, rows_at_least: int) -> None:
    """The rows of metrics.jsonl are whole JSON, and every checkpoint kept is whole (size and SHA-256)."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) >= rows_at_least
    assert [row["iteration"] for row in rows] == list(range(1, len(rows) + 1))
    checkpoints = list_checkpoints(run)
    assert checkpoints, "the checkpoint written before the fault is gone"
    for path in checkpoints:
        read_arrays(path, read_metadata(path))
    assert json.loads((run / "config.json").read_text())["total_timesteps"] == 2048


def disk_fills_under_tensorboard(monkeypatch, *, after_iteration: int) -> None:
    """TensorBoard's events file fails with ENOSPC once the metrics of ``after_iteration`` are written."""
    real_records_write, real_run_write, real_flush = (
        writers.EventsFile.write_records,
        writers.RunWriter.write,
        writers.RunWriter.flush,
    )
    full, seen = [], []

    def records_write(self, records):
        if full:
            raise ENOSPC
        real_records_write(self, records)

    def run_write(self, record):
        real_run_write(self, record)
        seen.append(record["iteration"])

    def flush(self):
        real_flush(self)
        if seen and seen[-1] >= after_iteration:
            full.append(seen[-1])

    monkeypatch.setattr(writers.EventsFile, "write_records", records_write)
    monkeypatch.setattr(writers.RunWriter, "write", run_write)
    monkeypatch.setattr(writers.RunWriter, "flush", flush)


def test_a_full_disk_under_tensorboard_stops_with_one_line(tmp_path, capsys, monkeypatch, watchdog):
    disk_fills_under_tensorboard(monkeypatch, after_iteration=1)  # the second iteration's events fail
    run = tmp_path / "run"
    capsys.readouterr()
    code = main(["train", *FOUR_ITERATIONS, "--checkpoint-every", "1", "--no-progress", "--run-dir", str(run)])
    line = error_line(capsys)
    assert code == 1
    assert "No space left on device" in line
    assert_intact(run, rows_at_least=1)
    assert not (run / "summary.json").exists()


def test_a_full_disk_under_metrics_jsonl_stops_with_one_line(tmp_path, capsys, monkeypatch, watchdog):
    class FillsAfterOneRow:
        def __init__(self, file):
            self.file, self.rows = file, 0

        def write(self, text: str) -> int:
            if self.rows == 1:
                self.file.write(text[: len(text) // 2])  # a row cut short, as a full disk leaves it
                raise ENOSPC
            self.rows += 1
            return self.file.write(text)

        def __getattr__(self, name):
            return getattr(self.file, name)

    real_open = writers.open_appending
    monkeypatch.setattr(writers, "open_appending", lambda fd: FillsAfterOneRow(real_open(fd)))
    run = tmp_path / "run"
    capsys.readouterr()
    code = main(["train", *FOUR_ITERATIONS, *QUIET, "--checkpoint-every", "1", "--run-dir", str(run)])
    line = error_line(capsys)
    assert code == 1
    assert "could not write the metrics of iteration 2" in line and "No space left on device" in line
    checkpoints = list_checkpoints(run)
    assert [path.name for path in checkpoints] == ["iter_000001.json"]
    read_arrays(checkpoints[0], read_metadata(checkpoints[0]))
    rows = (run / "metrics.jsonl").read_text().splitlines()
    assert json.loads(rows[0])["iteration"] == 1


def test_a_full_disk_under_tensorboard_in_the_last_iteration_is_not_done(tmp_path, capsys, monkeypatch, watchdog):
    disk_fills_under_tensorboard(monkeypatch, after_iteration=1)  # the last iteration's events fail
    run = tmp_path / "run"
    code = main(["train", *TINY, "--no-progress", "--run-dir", str(run)])
    assert code == 1
    assert "No space left on device" in error_line(capsys)
    assert not (run / "summary.json").exists()
