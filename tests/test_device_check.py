"""bench/device_check.py on this CPU: ``--quick`` runs every part and records finite numbers; a spent budget
skips parts with a note; a failing part is an error string, not an abort."""

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from .bench_scripts import BENCH_DIR, load_bench_script

SCRIPT = BENCH_DIR / "device_check.py"

# One tier per test (tests/conftest.py): the parts step EnvPool in processes of their own, so "subprocess".
pytestmark = pytest.mark.subprocess


def run_check(json_path: Path, *flags: str, timeout: float) -> dict[str, Any]:
    command = [sys.executable, str(SCRIPT), *flags, "--json", str(json_path)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return json.loads(json_path.read_text())


def numbers(row: dict[str, Any]) -> list[float]:
    return [v for v in row.values() if isinstance(v, int | float) and not isinstance(v, bool)]


def test_quick_runs_every_part_with_finite_numbers(tmp_path: Path) -> None:
    # A generous budget: on a loaded machine this checks that every part works, not how fast.
    results = run_check(tmp_path / "quick.json", "--quick", "--budget-s", "1200", timeout=1500)
    header, rows = results["header"], results["rows"]
    environment = header["environment"]
    assert environment["backend"] == "cpu"
    assert environment["matmul_gflops"] > 0 and math.isfinite(environment["matmul_gflops"])
    assert environment["xla_python_client_mem_fraction"] is not None
    kernel = ["train_kernel"] if environment["auto_conv_impl"] == "kernel" else []
    gymnax = ["gymnax_cartpole_2"] if importlib.util.find_spec("gymnax") else []
    expected = ["env_only_8", "env_only_16", "train_xla", "train_matmul", *kernel, *gymnax, "seeds_2", "async"]
    assert [row["part"] for row in rows] == expected == header["parts"]
    for row in rows:
        assert row["status"] == "ok", row
        assert all(math.isfinite(v) for v in numbers(row)), row
        assert row["env_steps_per_s"] > 0
    for row in rows[2:]:
        assert row["compile_s"] > 0 and row["peak_rss_mib"] > 0
        assert row["env_steps_per_s_per_agent"] * row["num_seeds"] == pytest.approx(row["env_steps_per_s"])
        assert row["device_peak_mib"] is None  # the CPU keeps no memory statistics
        assert row["part"].startswith("gymnax_") or row["projected_10M_min"] > 0
    for row in rows:
        if row["part"].startswith("gymnax_"):  # the whole run (4 iterations of 512 steps an agent) in one program
            assert row["iterations"] == 4 and row["run_s"] > 0
            assert row["wall_s"] == pytest.approx(row["compile_s"] + row["run_s"])
            assert row["final_return_mean"] >= 8  # CartPole's shortest episode is 8 steps
    # Every route computes the same numbers: the first loss after the same iterations agrees.
    losses = [row["loss"] for row in rows if row["part"].startswith("train_")]
    assert max(losses) - min(losses) < 1e-4


def test_a_spent_budget_skips_every_part_with_a_note(tmp_path: Path) -> None:
    results = run_check(tmp_path / "none.json", "--quick", "--budget-s", "0", timeout=300)
    assert results["header"]["environment"]["status"] == "skipped"
    assert {row["status"] for row in results["rows"]} == {"skipped"}
    assert all("budget" in row["note"] for row in results["rows"])


def test_a_failing_part_is_an_error_string() -> None:
    device_check = load_bench_script("device_check")
    with pytest.raises(RuntimeError, match="exit status 1: .*unknown part 'no such part'"):
        device_check.spawn_part("no such part", device_check.QUICK, {}, timeout_s=120)
