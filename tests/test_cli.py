import json
import os
import subprocess
import sys

import pytest

from ppo_eqx.cli import main
from ppo_eqx.host import kernel_build

pytestmark = pytest.mark.subprocess

TINY_CARTPOLE = ["train", "--env-id", "CartPole-v1", "--total-timesteps", "1024", "--no-progress"]


def error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("ppo-eqx: error: ")
    return err[0]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["train", "--env-id", "Breakout-v9"], "env_id='Breakout-v9' is not an EnvPool task; did you mean Breakout-v5"),
        (["train", "--env-id", "NoSuchGame"], "env_id='NoSuchGame' is not an EnvPool task"),
        (["train", "--num-minibatches", "3"], "num_minibatches=3 does not divide the batch"),
        (["train", "--num-envs", "0"], "num_envs=0 must be a positive integer"),
        (["train", "--total-timesteps", "100"], "total_timesteps=100 is smaller than one batch"),
        (["train", "--learning-rate", "fast"], "argument --learning-rate: invalid float value: 'fast'"),
        (["train", "--conv-impl", "fft"], "argument --conv-impl: invalid choice: 'fft'"),
        (["train", "--no-such-flag"], "unrecognized arguments: --no-such-flag"),
        (["fly"], "invalid choice: 'fly'"),
        (["train", "--devices", "0"], "argument --devices: 0 is out of range; allowed: 1 .. 65536"),
        (["train", "--devices", "64"], "--devices 64: jax sees 1 cpu device(s); on CPU set XLA_FLAGS="),
        (["train", "--process-id", "0"], "--process-id needs --coordinator-address, --num-processes too"),
        (
            ["train", "--coordinator-address", "127.0.0.1:1", "--num-processes", "2", "--process-id", "2"],
            "--process-id 2 must be in 0 .. 1",
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_2(argv, message, capsys, tmp_path):
    assert main([*argv, "--run-dir", str(tmp_path / "run")] if argv[0] == "train" else argv) == 2
    assert message in error_line(capsys)
    assert not (tmp_path / "run").exists()  # nothing was created for a rejected config


def test_the_cpu_kernel_where_it_cannot_build_is_refused_before_anything_is_written(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("PPO_EQX_CACHE", str(tmp_path / "cache"))  # not built there yet
    monkeypatch.setenv("CXX", str(tmp_path / "no-compiler"))
    monkeypatch.setattr(kernel_build, "_loaded", {})  # not the kernel this process already loaded
    argv = ["train", "--env-id", "Breakout-v5", "--conv-impl", "kernel", "--run-dir", str(tmp_path / "run")]
    assert main(argv) == 2
    line = error_line(capsys)
    assert "--conv-impl kernel is unavailable: " in line and "no-compiler could not build cpu_kernel.cc" in line
    assert "--conv-impl kernel is unavailable" in line and "allowed: auto, matmul or xla" in line
    assert not (tmp_path / "run").exists()


def test_a_run_directory_holding_a_run_is_refused_and_kept(capsys, tmp_path):
    run_dir = tmp_path / "run"
    assert main([*TINY_CARTPOLE, "--run-dir", str(run_dir)]) == 0
    before = {str(p): p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    capsys.readouterr()
    assert main([*TINY_CARTPOLE, "--run-dir", str(run_dir), "--seed", "2"]) == 2
    assert "already holds a run; pass --overwrite" in error_line(capsys)
    assert {str(p): p.read_bytes() for p in run_dir.rglob("*") if p.is_file()} == before
    assert main([*TINY_CARTPOLE, "--run-dir", str(run_dir), "--seed", "2", "--overwrite"]) == 0
    assert json.loads((run_dir / "config.json").read_text())["seed"] == 2
    assert len((run_dir / "metrics.jsonl").read_text().splitlines()) == 2


def test_an_unwritable_run_directory_is_reported(capsys, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main([*TINY_CARTPOLE, "--run-dir", str(blocker)]) == 2
    assert "is a file, not a directory" in error_line(capsys)
    assert main([*TINY_CARTPOLE, "--run-dir", str(blocker / "below")]) == 2
    assert f"{blocker} is a file, not a directory" in error_line(capsys)


def test_run_directory_contents(capsys, tmp_path):
    run_dir = tmp_path / "run"
    assert main([*TINY_CARTPOLE, "--run-dir", str(run_dir), "--learning-rate", "1e-3", "--no-anneal-lr"]) == 0
    out = capsys.readouterr().out
    assert "ppo-eqx: done, 1024 steps" in out
    config = json.loads((run_dir / "config.json").read_text())
    # The vector preset (num_envs 4, clip_coef 0.2) under the explicit flags.
    assert (config["num_envs"], config["clip_coef"], config["learning_rate"], config["anneal_lr"]) == (
        4,
        0.2,
        1e-3,
        False,
    )
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [row["global_step"] for row in rows] == [512, 1024]
    required = {
        "global_step",
        "episodic_return",
        "episodic_length",
        "sps",
        "learning_rate",
        "policy_loss",
        "value_loss",
        "entropy",
        "approx_kl",
        "clip_fraction",
        "time_elapsed",
        "iteration",
    }
    assert all(required <= set(row) for row in rows)
    assert rows[-1]["learning_rate"] == pytest.approx(1e-3)
    assert json.loads((run_dir / "summary.json").read_text())["global_step"] == 1024
    hardware = json.loads((run_dir / "hardware.json").read_text())
    assert {"cpu_count", "jax_version"} <= set(hardware)
    assert (hardware["conv_impl"], hardware["kernel_isa"]) == ("matmul", None)  # vectors: no convolutions
    assert "convolutions: matmul" in out
    assert list(run_dir.glob("events.out.tfevents.*"))
    # What the start took, part by part, in one line (in this process: no interpreter start is counted).
    startup = [line for line in out.splitlines() if line.startswith("ppo-eqx: first iteration after ")]
    assert len(startup) == 1, out
    for part in (
        "flags",
        "imports",
        "checks",
        "devices",
        "run directory",
        "writers",
        "envs and first state",
        "compile",
    ):
        assert f" {part} " in startup[0], startup


def tiny_breakout(run_dir, env: dict[str, str]) -> subprocess.CompletedProcess:
    """Two Breakout iterations of 16 steps through the command line, in a process of its own; it must exit 0."""
    tiny = ["--num-envs", "2", "--num-steps", "8", "--num-minibatches", "1", "--update-epochs", "1"]
    result = subprocess.run(
        [sys.executable, "-m", "ppo_eqx", "train", "--env-id", "Breakout-v5", "--total-timesteps", "16", *tiny]
        + ["--run-dir", str(run_dir), "--no-progress", "--no-tensorboard"],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    return result


@pytest.mark.skipif(
    kernel_build.find_compiler() is None or not kernel_build.cpu_supports("avx2"), reason="needs a compiler and AVX2"
)
def test_auto_takes_the_avx2_kernel_says_so_and_records_it(tmp_path):
    # The kernel built for AVX2 alone (as on AMD Zen 1-3), once, by `ppo-eqx build-kernel`: "auto" takes it, the
    # first line and hardware.json say so.
    avx2 = {**os.environ, kernel_build.ISA_VARIABLE: "avx2"}
    built = subprocess.run(
        [sys.executable, "-m", "ppo_eqx", "build-kernel"], capture_output=True, text=True, timeout=600, env=avx2
    )
    assert built.returncode == 0 and "built the CPU kernel for avx2" in built.stdout, built.stdout + built.stderr
    run_dir = tmp_path / "run"
    result = tiny_breakout(run_dir, avx2)
    assert "convolutions: kernel (avx2)" in result.stdout.splitlines()[0]
    hardware = json.loads((run_dir / "hardware.json").read_text())
    assert (hardware["conv_impl"], hardware["kernel_isa"]) == ("kernel", "avx2")


def test_the_console_script_exits_non_zero_without_a_traceback(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "ppo_eqx", "train", "--env-id", "Pong-v4x", "--run-dir", str(tmp_path / "r")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "ppo-eqx: error: env_id='Pong-v4x' is not an EnvPool task; did you mean Pong-v5?"
    ]


@pytest.mark.unit
def test_the_cli_packages_main_stays_the_function_after_a_command_ran(capsys):
    """``from ppo_eqx.cli import main`` after a command has run (and loaded the flags' module) is still the
    function: a submodule named ``main`` would have replaced the package's attribute with itself."""
    import importlib

    import ppo_eqx.cli

    assert ppo_eqx.cli.main(["train", "--num-envs", "0"]) == 2
    assert "num_envs=0" in error_line(capsys)
    assert callable(importlib.import_module("ppo_eqx.cli").main)


def test_auto_where_the_kernel_is_not_built_takes_matmuls_and_says_how_to_build_it(tmp_path):
    """A first Atari run on a CPU starts no compiler: the matmuls, and a line naming `ppo-eqx build-kernel`."""
    if kernel_build.find_compiler() is None or not kernel_build.cpu_supports("native"):
        pytest.skip("where the kernel cannot be built, nothing is said of it")
    result = tiny_breakout(tmp_path / "run", {**os.environ, "PPO_EQX_CACHE": str(tmp_path / "empty-cache")})
    lines = result.stdout.splitlines()
    assert "convolutions: matmul" in lines[0]
    assert any("ppo-eqx build-kernel builds it" in line for line in lines), lines
    assert not (tmp_path / "empty-cache").exists()  # nothing was built
