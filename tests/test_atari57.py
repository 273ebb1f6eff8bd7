"""The Atari-57 runner without training: --dry-run output, resuming, and launching a fake trainer."""

import json
import math
import shlex
import subprocess
import sys
import textwrap
from dataclasses import astuple
from pathlib import Path
from types import ModuleType

import pytest

from ppo_eqx_bench.anchors import load_anchors
from ppo_eqx_bench.atari_games import ATARI_57

from .bench_scripts import load_bench_script

pytestmark = pytest.mark.unit

REPO_ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def runner() -> ModuleType:
    return load_bench_script("atari57")


def dry_run(runner: ModuleType, capsys: pytest.CaptureFixture[str], *argv: str) -> list[str]:
    assert runner.main(["--dry-run", *argv]) == 0  # before any `--`, after which all goes to the trainer
    return capsys.readouterr().out.splitlines()


def test_atari_57_is_the_sorted_set_of_57_v5_games() -> None:
    assert len(ATARI_57) == 57
    assert len(set(ATARI_57)) == 57
    assert list(ATARI_57) == sorted(ATARI_57)
    assert all(env_id.endswith("-v5") for env_id in ATARI_57)
    assert {"Pong-v5", "Breakout-v5", "MontezumaRevenge-v5", "Surround-v5", "Defender-v5"} <= set(ATARI_57)


def test_atari_57_is_the_games_of_both_shipped_reference_tables_in_order() -> None:
    cleanrl, human_random = load_anchors()
    assert list(cleanrl) == list(ATARI_57)
    assert list(human_random) == list(ATARI_57)
    values = [value for table in (cleanrl, human_random) for row in table.values() for value in astuple(row)]
    assert all(math.isfinite(value) for value in values)  # no empty cell


def test_the_shipped_scores_are_dqn_zoos() -> None:
    _, human_random = load_anchors()
    assert all(scores.human_score > scores.random_score for scores in human_random.values())
    assert (human_random["Breakout-v5"].random_score, human_random["Breakout-v5"].human_score) == (1.7, 30.5)
    assert (human_random["Pong-v5"].random_score, human_random["Pong-v5"].human_score) == (-20.7, 14.6)
    assert (human_random["Skiing-v5"].random_score, human_random["Skiing-v5"].human_score) == (-17098.1, -4336.9)


def test_dry_run_prints_every_command_seed_major(
    runner: ModuleType, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    sweep = tmp_path / "sweep"
    lines = dry_run(
        runner,
        capsys,
        "--games",
        "Pong-v5",
        "Breakout-v5",
        "--seeds",
        "1",
        "2",
        "--total-timesteps",
        "2048",
        "--sweep-dir",
        str(sweep),
        "--",
        "--num-envs",
        "4",
        "--no-tensorboard",
    )
    assert lines == [
        f"ppo-eqx train --env-id Pong-v5 --seed 1 --total-timesteps 2048 --run-dir {sweep}/Pong-v5__seed1 "
        "--num-envs 4 --no-tensorboard",
        f"ppo-eqx train --env-id Breakout-v5 --seed 1 --total-timesteps 2048 --run-dir {sweep}/Breakout-v5__seed1 "
        "--num-envs 4 --no-tensorboard",
        f"ppo-eqx train --env-id Pong-v5 --seed 2 --total-timesteps 2048 --run-dir {sweep}/Pong-v5__seed2 "
        "--num-envs 4 --no-tensorboard",
        f"ppo-eqx train --env-id Breakout-v5 --seed 2 --total-timesteps 2048 --run-dir {sweep}/Breakout-v5__seed2 "
        "--num-envs 4 --no-tensorboard",
    ]
    assert not sweep.exists()  # a dry run creates nothing


def test_dry_run_defaults_are_57_games_times_seeds_1_2_3_at_10m_steps(
    runner: ModuleType, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    lines = dry_run(runner, capsys, "--sweep-dir", str(tmp_path))
    assert len(lines) == 171
    assert (
        lines[0]
        == f"ppo-eqx train --env-id Alien-v5 --seed 1 --total-timesteps 10000000 --run-dir {tmp_path}/Alien-v5__seed1"
    )
    assert lines[57].startswith("ppo-eqx train --env-id Alien-v5 --seed 2 ")
    assert lines[-1].startswith("ppo-eqx train --env-id Zaxxon-v5 --seed 3 ")


def test_dry_run_skips_finished_runs_and_overwrites_interrupted_ones(
    runner: ModuleType, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    (tmp_path / "Pong-v5__seed1").mkdir()
    (tmp_path / "Pong-v5__seed1" / "summary.json").write_text("{}")  # finished
    (tmp_path / "Breakout-v5__seed1").mkdir()
    (tmp_path / "Breakout-v5__seed1" / "metrics.jsonl").write_text("{}\n")  # killed mid-run
    (tmp_path / "Pong-v5__seed2").mkdir()  # killed before it wrote anything
    (tmp_path / "Pong-v5__seed3.log").write_text("")  # only a log: the run directory does not exist
    lines = dry_run(
        runner,
        capsys,
        "--games",
        "Pong-v5",
        "Breakout-v5",
        "--seeds",
        "1",
        "2",
        "3",
        "--total-timesteps",
        "100",
        "--sweep-dir",
        str(tmp_path),
    )
    assert lines == [
        f"ppo-eqx train --env-id Breakout-v5 --seed 1 --total-timesteps 100 --run-dir {tmp_path}/Breakout-v5__seed1 "
        "--overwrite",
        f"ppo-eqx train --env-id Pong-v5 --seed 2 --total-timesteps 100 --run-dir {tmp_path}/Pong-v5__seed2 "
        "--overwrite",
        f"ppo-eqx train --env-id Breakout-v5 --seed 2 --total-timesteps 100 --run-dir {tmp_path}/Breakout-v5__seed2",
        f"ppo-eqx train --env-id Pong-v5 --seed 3 --total-timesteps 100 --run-dir {tmp_path}/Pong-v5__seed3",
        f"ppo-eqx train --env-id Breakout-v5 --seed 3 --total-timesteps 100 --run-dir {tmp_path}/Breakout-v5__seed3",
    ]


def test_dry_run_quotes_paths_for_the_shell(
    runner: ModuleType, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    sweep = tmp_path / "my sweep"
    (line,) = dry_run(
        runner,
        capsys,
        "--games",
        "Pong-v5",
        "--seeds",
        "4",
        "--sweep-dir",
        str(sweep),
        "--launcher",
        "srun python -m ppo_eqx",
    )
    assert shlex.split(line) == [
        "srun",
        "python",
        "-m",
        "ppo_eqx",
        "train",
        "--env-id",
        "Pong-v5",
        "--seed",
        "4",
        "--total-timesteps",
        "10000000",
        "--run-dir",
        f"{sweep}/Pong-v5__seed4",
    ]


@pytest.mark.parametrize(
    "extra", [["--seed", "3"], ["--run-dir=x"], ["--env-id", "Pong-v5"], ["--total-timesteps", "1"]]
)
def test_flags_the_runner_sets_are_refused_after_the_separator(runner: ModuleType, extra: list[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        runner.main(["--dry-run", "--", *extra])
    assert exit_info.value.code == 2


FAKE_TRAINER = textwrap.dedent(
    """
    import argparse, json, pathlib, sys
    parser = argparse.ArgumentParser()
    parser.add_argument("command")
    parser.add_argument("--env-id")
    parser.add_argument("--seed", type=int)
    parser.add_argument("--total-timesteps", type=int)
    parser.add_argument("--run-dir", type=pathlib.Path)
    parser.add_argument("--overwrite", action="store_true")
    parser.add_argument("--marker")
    args = parser.parse_args()
    args.run_dir.mkdir(parents=True, exist_ok=True)
    (args.run_dir / "argv.json").write_text(json.dumps(sys.argv[1:]))
    print("fake training", args.env_id, args.seed, "marker", args.marker)
    if args.env_id == "Fail-v5":
        print("boom", file=sys.stderr)
        sys.exit(3)
    (args.run_dir / "summary.json").write_text(json.dumps({"global_step": args.total_timesteps}))
    """
)


@pytest.mark.subprocess
def test_launching_runs_logs_and_resumes(
    runner: ModuleType, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    trainer = tmp_path / "fake_trainer.py"
    trainer.write_text(FAKE_TRAINER)
    sweep = tmp_path / "sweep"
    (sweep / "Breakout-v5__seed1").mkdir(parents=True)  # interrupted before
    argv = [
        "--games",
        "Pong-v5",
        "Breakout-v5",
        "Fail-v5",
        "--seeds",
        "1",
        "--total-timesteps",
        "64",
        "--sweep-dir",
        str(sweep),
        "--jobs",
        "2",
        "--launcher",
        f"{shlex.quote(sys.executable)} {trainer}",
        "--",
        "--marker",
        "hello",
    ]

    assert runner.main(argv) == 1  # one run failed
    captured = capsys.readouterr()
    assert "finished 2, skipped 0, failed 1" in captured.out
    assert f"failed: Fail-v5 seed 1, see {sweep}/Fail-v5__seed1.log" in captured.out
    assert "not among the 57 Atari games: Fail-v5" in captured.err
    pong_argv = json.loads((sweep / "Pong-v5__seed1" / "argv.json").read_text())
    assert pong_argv == [
        "train",
        "--env-id",
        "Pong-v5",
        "--seed",
        "1",
        "--total-timesteps",
        "64",
        "--run-dir",
        f"{sweep}/Pong-v5__seed1",
        "--marker",
        "hello",
    ]
    assert "--overwrite" in json.loads((sweep / "Breakout-v5__seed1" / "argv.json").read_text())
    pong_log = (sweep / "Pong-v5__seed1.log").read_text()
    assert pong_log.startswith("# ") and "fake training Pong-v5 1 marker hello" in pong_log
    assert "boom" in (sweep / "Fail-v5__seed1.log").read_text()  # stderr goes to the log too

    pong_summary_mtime = (sweep / "Pong-v5__seed1" / "summary.json").stat().st_mtime_ns
    assert runner.main(argv) == 1  # again: the finished runs are skipped, the failed one is retried
    captured = capsys.readouterr()
    assert "finished 0, skipped 2, failed 1" in captured.out
    assert "start Fail-v5 seed 1 (--overwrite)" in captured.out
    assert "start Pong-v5" not in captured.out and "start Breakout-v5" not in captured.out
    assert (sweep / "Pong-v5__seed1" / "summary.json").stat().st_mtime_ns == pong_summary_mtime


@pytest.mark.subprocess
def test_a_launcher_that_cannot_start_fails_the_runs(
    runner: ModuleType, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    argv = ["--games", "Pong-v5", "--seeds", "1", "2", "--sweep-dir", str(tmp_path), "--launcher", "/no/such/ppo-eqx"]
    assert runner.main(argv) == 1
    assert "finished 0, skipped 0, failed 2" in capsys.readouterr().out
    assert "cannot start" in (tmp_path / "Pong-v5__seed2.log").read_text()


def test_all_finished_exits_zero(runner: ModuleType, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    (tmp_path / "Pong-v5__seed1").mkdir()
    (tmp_path / "Pong-v5__seed1" / "summary.json").write_text("{}")
    assert runner.main(["--games", "Pong-v5", "--seeds", "1", "--sweep-dir", str(tmp_path), "--launcher", "false"]) == 0
    assert "finished 0, skipped 1, failed 0" in capsys.readouterr().out


@pytest.mark.subprocess
def test_help_runs_as_a_script() -> None:
    result = subprocess.run(
        [sys.executable, str(REPO_ROOT / "bench" / "atari57.py"), "--help"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    for flag in ("--games", "--seeds", "--total-timesteps", "--jobs", "--sweep-dir", "--dry-run"):
        assert flag in result.stdout


# --- the plan: how many runs at once, with how many env threads (issue 31) ----------------------------------------

H200_MACHINE = {"cores": 16, "gpus": ["GPU 0: NVIDIA H200 (UUID: x)"], "memory_available_gib": 120.0}


@pytest.mark.parametrize(
    ("facts", "runs", "jobs", "threads"),
    [
        pytest.param({"cores": 2, "gpus": [], "memory_available_gib": 20.0}, 171, 1, 0, id="cpu-only-one-at-a-time"),
        pytest.param(H200_MACHINE, 171, 8, 2, id="16-cores-and-a-gpu-eight-runs-of-two-threads"),
        pytest.param({**H200_MACHINE, "memory_available_gib": 7.0}, 171, 3, 2, id="memory-bounds-the-runs"),
        pytest.param(H200_MACHINE, 3, 3, 2, id="no-more-runs-than-there-are"),
        pytest.param({**H200_MACHINE, "cores": 1}, 171, 1, 2, id="one-core-still-one-run"),
    ],
)
def test_the_plan_fills_the_machine_and_no_more(runner: ModuleType, facts, runs, jobs, threads) -> None:
    plan = runner.plan_concurrency(facts, runs)
    assert (plan.jobs, plan.threads) == (jobs, threads), plan
    if facts["gpus"]:
        assert plan.pin and plan.gpu_memory_fraction == pytest.approx(0.9 / jobs, abs=1e-3)
        slots = [plan.run_flags(slot) for slot in range(plan.jobs)]
        first_cores = [int(flags[flags.index("--thread-affinity-offset") + 1]) for flags in slots]
        # Every run's threads on cores of their own: slot k from core k * threads on.
        assert first_cores == [slot * threads for slot in range(jobs)]
    else:
        assert not plan.pin and plan.gpu_memory_fraction is None


def test_a_runs_flags_and_environment_carry_the_plan(runner: ModuleType, tmp_path: Path) -> None:
    plan = runner.plan_concurrency(H200_MACHINE, 171)
    run = runner.PlannedRun("Pong-v5", 1, tmp_path / "Pong-v5__seed1", interrupted=False)
    args = runner.run_args(run, 10_000_000, [], plan, slot=3)
    assert args[-4:] == ["--num-threads", "2", "--thread-affinity-offset", "6"]
    assert runner.run_args(run, 10_000_000, ["--num-threads", "4"], plan, slot=3)[-2:] == ["--num-threads", "4"]
    resumed = runner.PlannedRun("Pong-v5", 1, run.run_dir, interrupted=True, resumable=True)
    assert "--num-threads" not in runner.run_args(resumed, 10_000_000, [], plan, slot=3)  # its own config
    env = runner.run_env(plan)
    assert env["PPO_EQX_RUNS_AT_ONCE"] == "8"


FAKE_STEADY_TRAINER = textwrap.dedent(
    """
    import json, pathlib, sys, time
    run_dir = pathlib.Path(sys.argv[sys.argv.index("--run-dir") + 1])
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "argv.json").write_text(json.dumps(sys.argv[1:]))
    with open(run_dir / "metrics.jsonl", "a") as metrics:
        for iteration in range(1, 10**6):
            metrics.write(json.dumps({"iteration": iteration, "global_step": iteration * 1024}) + "\\n")
            metrics.flush()
            time.sleep(0.05)
    """
)


@pytest.mark.subprocess
def test_measuring_the_plan_reports_the_aggregate_and_keeps_nothing(runner: ModuleType, tmp_path: Path) -> None:
    trainer = tmp_path / "steady.py"
    trainer.write_text(FAKE_STEADY_TRAINER)
    sweep, out = tmp_path / "sweep", tmp_path / "measured.json"
    argv = ["--games", "Pong-v5", "Breakout-v5", "Alien-v5", "--seeds", "1", "--sweep-dir", str(sweep), "--jobs", "2"]
    argv += ["--measure-s", "1.5", "--json", str(out), "--launcher", f"{shlex.quote(sys.executable)} {trainer}"]
    assert runner.main(argv) == 0
    measured = json.loads(out.read_text())
    assert measured["header"]["jobs"] == 2 and [row["env_id"] for row in measured["rows"]] == ["Pong-v5", "Breakout-v5"]
    # Each fake run writes an iteration of 1024 steps every 0.05 s: about 20,480 steps/s, 40,960 for the two.
    assert 10_000 < measured["header"]["aggregate_env_steps_per_s"] < 50_000, measured
    assert sum(row["env_steps_per_s"] for row in measured["rows"]) == pytest.approx(
        measured["header"]["aggregate_env_steps_per_s"]
    )
    assert not any(sweep.iterdir())  # the measured runs' directories and logs are gone


@pytest.mark.parametrize("where", ["a file", "under a file"])
def test_a_sweep_dir_that_cannot_be_a_directory_is_one_line(
    runner: ModuleType, capsys: pytest.CaptureFixture[str], tmp_path: Path, where: str
) -> None:
    """``--sweep-dir FILE`` was a FileExistsError traceback: now one line, exit 2, the file untouched."""
    (tmp_path / "notes").write_text("mine\n")
    target = tmp_path / "notes" if where == "a file" else tmp_path / "notes" / "sweep"
    with pytest.raises(SystemExit) as stopped:
        runner.main(["--sweep-dir", str(target), "--jobs", "1", "--games", "Pong-v5", "--seeds", "1"])
    message = capsys.readouterr().err.strip().splitlines()[-1] if stopped.value.code == 2 else str(stopped.value.code)
    assert "--sweep-dir" in message and str(target) in message, message
    assert (tmp_path / "notes").read_text() == "mine\n"
