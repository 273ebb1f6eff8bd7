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


FAKE_CLEANRL = """
import argparse, time
parser = argparse.ArgumentParser()
for name in ("--env-id", "--seed", "--num-envs", "--num-steps", "--total-timesteps"):
    parser.add_argument(name)
args = parser.parse_args()
batch = int(args.num_envs) * int(args.num_steps)
for iteration in range(1, int(args.total_timesteps) // batch + 1):
    time.sleep(0.05)
    print(f"global_step={iteration * batch}, avg_episodic_return=0.0", flush=True)
    print(f"SPS: {int(batch / 0.05)}", flush=True)
"""
HOST = ["host_step_8_t0", "host_step_8_t0_pinned", "host_step_8_t2", "host_step_8_t2_pinned"]
"""EnvPool's own host step, quick: 8 envs at its default threads and at 2, each unpinned and pinned from core 0."""


def test_quick_runs_every_part_with_finite_numbers(tmp_path: Path) -> None:
    # A generous budget: on a loaded machine this checks that every part works, not how fast. A stand-in for
    # CleanRL's script (it prints what CleanRL's prints), so that the side-by-side part runs as on a GPU machine.
    fake = tmp_path / "fake_cleanrl.py"
    fake.write_text(FAKE_CLEANRL)
    flags = ("--quick", "--budget-s", "1200", "--cleanrl-script", str(fake), "--cleanrl-python", sys.executable)
    results = run_check(tmp_path / "quick.json", *flags, timeout=1500)
    header, rows = results["header"], results["rows"]
    environment = header["environment"]
    assert environment["backend"] == "cpu"
    assert environment["matmul_gflops"] > 0 and math.isfinite(environment["matmul_gflops"])
    assert environment["xla_python_client_mem_fraction"] is not None
    topology = environment["cpu_topology"]
    assert topology["nproc"] >= 1 and topology["affinity_cpus"] >= 1 and topology["kernel"], topology
    auto = environment["auto_conv_impl"]
    ale = ["ale_vector_8_t0"] if importlib.util.find_spec("ale_py") else []
    expected = [*HOST, "env_only_8", "env_only_16", "env_only_cpu_8", *ale, f"train_{auto}"]
    expected += [f"train_{auto}_rollout_on_host", f"train_{auto}_rollout_on_host_envs", "host_envs_4x16_actors_2"]
    expected += ["cleanrl_side_by_side"]
    expected += ["atari57_plan"]
    assert [row["part"] for row in rows] == expected == header["parts"]
    for row in rows:
        assert row["status"] == "ok", row
        assert all(math.isfinite(v) for v in numbers(row)), row
    by_part = {row["part"]: row for row in rows}
    assert by_part["cleanrl_side_by_side"]["cleanrl_steady_sps"] > 0
    assert by_part["cleanrl_side_by_side"]["ppo-eqx_steady_sps"] > 0
    assert by_part["atari57_plan"]["env_steps_per_s"] > 0 and by_part["atari57_plan"]["runs_at_once"] == 1
    assert by_part[f"train_{auto}_rollout_on_host"]["rollout_on"] == "host"
    assert by_part[f"train_{auto}_rollout_on_host_envs"]["rollout_on"] == "host-envs"
    # The choice "auto" should make here: the fastest of the three placements, each measured above.
    choice = header["auto_rollout_on"]
    placements = {by_part[name]["rollout_on"]: by_part[name]["env_steps_per_s"] for name in by_part if
                  name.startswith(f"train_{auto}")}  # fmt: skip
    assert set(choice["env_steps_per_s"]) == {"device", "host", "host-envs"} == set(placements)
    assert choice["choice"] == max(placements, key=placements.__getitem__)
    assert choice["device_kind"] == environment["device_kind"]
    trained = [row for row in rows if row["part"].startswith(("train_", "async", "seeds_", "gymnax_"))]
    for row in rows:
        if row not in trained and row["part"] not in ("cleanrl_side_by_side", "atari57_plan"):
            assert row["env_steps_per_s"] > 0, row
    for row in trained:
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


SLOW_PART = """
import json, time
for threads in (1, 2):
    row = {"part": f"host_step_8_t{threads}", "status": "ok", "env_steps_per_s": 1000.0 * threads}
    print(json.dumps(row), flush=True)
print("a line of the part's own", flush=True)
time.sleep(120)
"""


def test_a_part_stopped_by_its_limit_keeps_the_rows_it_measured(tmp_path: Path, monkeypatch) -> None:
    device_check = load_bench_script("device_check")
    slow = tmp_path / "slow_part.py"
    slow.write_text(SLOW_PART)
    monkeypatch.setattr(device_check, "HERE", slow)  # the part's process runs this script instead
    with pytest.raises(device_check.PartStopped, match="timed out after 15 s, 2 rows measured") as stopped:
        device_check.spawn_part("host_step", device_check.QUICK, {}, timeout_s=15)
    assert [row["env_steps_per_s"] for row in stopped.value.rows] == [1000.0, 2000.0]


@pytest.mark.unit
def test_the_run_keeps_a_stopped_parts_rows_and_says_where_it_stopped(monkeypatch) -> None:
    device_check = load_bench_script("device_check")
    measured = [{"part": "host_envs_64x32_actors_default", "status": "ok", "env_steps_per_s": 9000.0}]

    def spawn(kind: str, settings: Any, options: Any, timeout_s: float) -> tuple[Any, float]:
        if kind == "environment":
            return {"backend": "tpu"}, 1.0
        raise device_check.PartStopped("timed out after 96 s, 1 rows measured", measured)

    monkeypatch.setattr(device_check, "spawn_part", spawn)
    monkeypatch.setattr(device_check, "measurement_parts", lambda *_: [("host_envs_actors", "host_envs_grid", {})])
    environment, rows = device_check.run_parts(device_check.QUICK, 180.0, {})
    assert environment["backend"] == "tpu"
    assert rows == [
        *measured,
        {"part": "host_envs_actors", "status": "error", "error": "timed out after 96 s, 1 rows measured"},
    ]


@pytest.mark.unit
def test_on_a_tpu_the_parts_that_compile_envpools_step_are_recorded_as_cannot_run() -> None:
    device_check = load_bench_script("device_check")
    tpu = {"backend": "tpu", "auto_conv_impl": "xla", "device_kind": "TPU v5 lite"}
    peers = {"cleanrl_script": "cleanrl.py", "cleanrl_python": "python"}
    parts = {
        name: (kind, options) for name, kind, options in device_check.measurement_parts(device_check.FULL, tpu, peers)
    }
    cannot = {name for name, (kind, _) in parts.items() if kind == "cannot"}
    assert cannot == {"env_only", "train_xla", "cleanrl_side_by_side", "train_matmul", "async", "seeds_4", "seeds_8"}
    assert all("XLA step" in parts[name][1]["note"] for name in cannot)
    ran = {name for name in parts if name not in cannot}
    assert {"host_step", "env_only_cpu", "train_xla_rollout_on_host", "train_xla_rollout_on_host_envs"} <= ran
    assert "host_envs_actors" in ran and "atari57_plan" in ran  # the CLI's auto takes host-envs there
    gpu = {**tpu, "backend": "gpu"}
    kinds = [kind for _, kind, _ in device_check.measurement_parts(device_check.FULL, gpu, peers)]
    assert "cannot" not in kinds
