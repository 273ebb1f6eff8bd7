"""bench/cleanrl_side_by_side.py's own logic, without CleanRL: reading the two programs' output, the
summary figures, the memory sampler, the ISA environments and the argument checks."""

import sys
from pathlib import Path
from types import ModuleType

import pytest

from .bench_scripts import load_bench_script

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_bench_script("cleanrl_side_by_side")


CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 23
model\t\t: 49
model name\t: AMD EPYC 7B12
flags\t\t: fpu sse2 avx fma avx2 bmi2

processor\t: 1
cpu family\t: 25
model name\t: not the first
flags\t\t: avx512f
"""


def test_the_first_processor_names_the_cpu_and_its_vector_extensions(bench: ModuleType) -> None:
    cpu = bench.cpu_description(CPUINFO, 2)
    assert (cpu["cpu_model"], cpu["cpu_family"], cpu["cpu_model_number"]) == ("AMD EPYC 7B12", 23, 49)
    assert cpu["vector_flags"] == {
        "avx2": True,
        "fma": True,
        "avx512f": False,
        "avx512_vnni": False,
        "avx512_bf16": False,
    }
    assert cpu["logical_cpus"] == 2


def test_an_unreadable_cpuinfo_gives_unknowns_not_an_error(bench: ModuleType) -> None:
    cpu = bench.cpu_description("", None)
    assert cpu["cpu_model"] is None and not any(cpu["vector_flags"].values())


# What CleanRL's script prints, between jax's and tyro's warnings, once per iteration of 8 x 128 steps.
CLEANRL_LINES = [
    (3.0, "/venv/lib/python3.11/site-packages/tyro/_parsers.py:365: UserWarning: The field `target-kl` ..."),
    (114.5, "global_step=1024, avg_episodic_return=0.0"),
    (114.6, "SPS: 8"),
    (172.0, "global_step=2048, avg_episodic_return=1.0"),
    (172.1, "SPS: 11"),
    (186.0, "global_step=3072, avg_episodic_return=1.5"),
    (186.1, "SPS: 16"),
]


def test_cleanrl_iterations_end_at_its_global_step_lines(bench: ModuleType) -> None:
    ends, own_sps = bench.cleanrl_iteration_ends(CLEANRL_LINES, 1024)
    assert ends == [114.5, 172.0, 186.0]
    assert own_sps == [8, 11, 16]


def test_a_skipped_cleanrl_iteration_is_an_error(bench: ModuleType) -> None:
    lines = [line for line in CLEANRL_LINES if "2048" not in line[1]]
    with pytest.raises(ValueError, match="global_step=3072 after 1 iterations"):
        bench.cleanrl_iteration_ends(lines, 1024)


def test_ppo_eqx_iterations_end_after_its_compile_line_by_their_own_times(bench: ModuleType) -> None:
    lines = [
        (1.0, "ppo-eqx: Breakout-v5, 3 iterations of 1024 steps, ..."),
        (10.0, "ppo-eqx: compiled one iteration in 7.5 s"),
    ]
    records = [{"iteration": 1, "sps": 512.0}, {"iteration": 2, "sps": 1024.0}, {"iteration": 3, "sps": 256.0}]
    assert bench.ppo_eqx_iteration_ends(lines, records, 1024) == pytest.approx([12.0, 13.0, 17.0])


def test_ppo_eqx_without_its_compile_line_or_with_a_missing_record_is_an_error(bench: ModuleType) -> None:
    records = [{"iteration": 1, "sps": 512.0}, {"iteration": 3, "sps": 512.0}]
    with pytest.raises(ValueError, match="compiled one iteration"):
        bench.ppo_eqx_iteration_ends([(1.0, "ppo-eqx: done")], records, 1024)
    with pytest.raises(ValueError, match="record 2 is iteration 3"):
        bench.ppo_eqx_iteration_ends([(1.0, "ppo-eqx: compiled one iteration in 1.0 s")], records, 1024)


def test_summary_by_hand(bench: ModuleType) -> None:
    # Iteration times 100 (first, from the start), 60 (a recompile), then 10, 10 and 11 seconds.
    row = bench.summarise([100.0, 160.0, 170.0, 180.0, 191.0], 1000)
    assert row["first_iteration_s"] == 100.0
    assert row["steady_iteration_s"] == pytest.approx(10.0)
    assert row["steady_sps"] == pytest.approx(100.0)  # the median of 100, 100 and 90.9 steps/s
    assert row["second_iteration_s"] == pytest.approx(60.0)
    assert row["second_iteration_extra_s"] == pytest.approx(50.0)
    assert (row["iterations"], row["steady_iterations"]) == (5, 3)


def test_the_steady_rate_is_the_median_of_rates(bench: ModuleType) -> None:
    # Two steady iterations of 10 and 20 s: rates 100 and 50, median 75 (not 1000 / 15 = 66.7).
    assert bench.summarise([5.0, 6.0, 16.0, 36.0], 1000)["steady_sps"] == pytest.approx(75.0)


def test_two_iterations_give_no_steady_rate(bench: ModuleType) -> None:
    with pytest.raises(ValueError, match="needs at least 3"):
        bench.summarise([100.0, 160.0], 1024)


def test_the_sampler_keeps_the_largest_value_and_skips_gaps(bench: ModuleType) -> None:
    values = iter([10, None, 300, 20])

    def measure() -> int | None:
        return next(values, None)

    sampler = bench.PeakSampler(measure, interval=0.001).start()
    while sampler.samples < 3:
        pass
    assert sampler.stop() == 300
    assert sampler.samples == 3


def test_avx2_caps_both_programs_and_sets_the_kernel_isa_for_ppo_eqx_alone(
    bench: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XLA_FLAGS", "--xla_dump_to=/tmp/x")
    monkeypatch.delenv("PPO_EQX_KERNEL_ISA", raising=False)
    cleanrl, ppo_eqx = bench.environments("avx2")
    assert cleanrl["XLA_FLAGS"] == ppo_eqx["XLA_FLAGS"] == "--xla_dump_to=/tmp/x --xla_cpu_max_isa=AVX2"
    assert "PPO_EQX_KERNEL_ISA" not in cleanrl and ppo_eqx["PPO_EQX_KERNEL_ISA"] == "avx2"
    assert cleanrl["PYTHONUNBUFFERED"] == ppo_eqx["PYTHONUNBUFFERED"] == "1"
    native, native_ppo_eqx = bench.environments("native")
    assert native["XLA_FLAGS"] == "--xla_dump_to=/tmp/x" and "PPO_EQX_KERNEL_ISA" not in native_ppo_eqx


@pytest.fixture()
def script(tmp_path: Path) -> list[str]:
    path = tmp_path / "ppo_atari_envpool_xla_jax.py"
    path.write_text("print('not run')\n")
    return ["--cleanrl-script", str(path), "--cleanrl-python", sys.executable]


def test_iterations_set_the_total_steps_and_the_isa_the_results_file(bench: ModuleType, script: list[str]) -> None:
    args = bench.parse_args([*script, "--iterations", "4", "--num-envs", "4"])
    assert (args.iterations, args.total_timesteps) == (4, 4 * 4 * 128)
    assert args.json.name == "cleanrl_side_by_side.json"
    args = bench.parse_args([*script, "--total-timesteps", "5000", "--isa", "avx2"])
    assert (args.iterations, args.total_timesteps) == (4, 4096)  # whole iterations of 8 x 128
    assert args.json.name == "cleanrl_side_by_side_avx2.json"
    assert bench.parse_args(script).iterations == 6


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--iterations", "2"], "--iterations 2: allowed: 3 or more"),
        (["--total-timesteps", "3071"], "--total-timesteps 3071: allowed: at least 3 iterations of 1024 steps"),
        (["--iterations", "4", "--total-timesteps", "8192"], "not allowed with argument"),
        (["--num-envs", "0"], "--num-envs 0: allowed: 1 or more"),
        (["--isa", "avx512"], "invalid choice: 'avx512'"),
        (["--timeout", "0"], "--timeout 0.0: allowed: a positive number"),
    ],
)
def test_bad_settings_are_one_line_and_status_2(
    bench: ModuleType, script: list[str], flags: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stopped:
        bench.parse_args([*script, *flags])
    assert stopped.value.code == 2
    assert message in capsys.readouterr().err


def test_a_missing_script_or_python_is_refused(
    bench: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nowhere.py"
    with pytest.raises(SystemExit) as stopped:
        bench.parse_args(["--cleanrl-script", str(missing), "--cleanrl-python", sys.executable])
    assert stopped.value.code == 2 and f"--cleanrl-script {missing}: no such file" in capsys.readouterr().err
    with pytest.raises(SystemExit) as stopped:
        bench.parse_args(["--cleanrl-script", __file__, "--cleanrl-python", str(tmp_path)])
    assert stopped.value.code == 2 and f"--cleanrl-python {tmp_path}: not an executable file" in capsys.readouterr().err


# A child that prints, then starts a grandchild holding 200 MiB while it holds little itself.
CHILD = """
import subprocess, sys, time
print("first", flush=True)
time.sleep(0.3)
subprocess.run([sys.executable, "-c", "import time; b = bytearray(b'x') * (200 * 2**20); time.sleep(1.0)"], check=True)
print("second", flush=True)
"""


@pytest.mark.subprocess
def test_a_watched_process_has_its_lines_stamped_and_its_tree_memory_measured(
    bench: ModuleType, tmp_path: Path
) -> None:
    finished = bench.run_watched([sys.executable, "-c", CHILD], {"PATH": "/usr/bin:/bin"}, tmp_path, timeout_s=60)
    assert finished.returncode == 0
    assert [text for _, text in finished.lines] == ["first", "second"]
    (first, _), (second, _) = finished.lines
    assert 0 < first < first + 1.0 < second < finished.wall_s  # the grandchild slept 1 s between the two lines
    assert finished.sampled_peak_bytes >= 200 * 2**20  # the grandchild's memory, counted in the tree
    assert finished.peak_rss_mib >= 200
    assert finished.maxrss_bytes > 0


def test_an_avx2_figure_with_an_avx512_kernel_says_so(bench: ModuleType) -> None:
    ignored = {"resolved": "kernel", "reads_kernel_isa_variable": False}
    assert "ignores PPO_EQX_KERNEL_ISA" in bench.avx2_caveat("avx2", ignored)
    assert bench.avx2_caveat("native", ignored) is None
    assert bench.avx2_caveat("avx2", {"resolved": "matmul", "reads_kernel_isa_variable": False}) is None
    assert bench.avx2_caveat("avx2", {"resolved": "kernel", "reads_kernel_isa_variable": True}) is None
