"""hardware.py: what /proc/cpuinfo says about the CPU, and the record every run directory and bench result holds."""

import json
import os
import platform
import sys
import types
from pathlib import Path

import pytest

from ppo_eqx.cli.hardware import X86_64_LEVELS, cpu_info, hardware_info, x86_64_level

pytestmark = pytest.mark.unit

# /proc/cpuinfo's first CPU (of 2) on the machines these fixtures stand for; the flags as those kernels list them.
EPYC_ROME = """\
processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 23
model\t\t: 49
model name\t: AMD EPYC 7B12
stepping\t: 0
flags\t\t: fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx fxsr sse sse2 ht \
syscall nx mmxext fxsr_opt pdpe1gb rdtscp lm constant_tsc rep_good nopl nonstop_tsc cpuid extd_apicid tsc_known_freq \
pni pclmulqdq ssse3 fma cx16 sse4_1 sse4_2 x2apic movbe popcnt aes xsave avx f16c rdrand hypervisor lahf_lm \
cmp_legacy cr8_legacy abm sse4a misalignsse 3dnowprefetch osvw topoext ssbd ibrs ibpb stibp vmmcall fsgsbase \
tsc_adjust bmi1 avx2 smep bmi2 rdseed adx smap clflushopt clwb sha_ni xsaveopt xsavec xgetbv1 clzero xsaveerptr \
arat npt nrip_save umip rdpid

processor\t: 1
vendor_id\t: AuthenticAMD
cpu family\t: 23
model\t\t: 49
model name\t: AMD EPYC 7B12
"""

XEON_ICE_LAKE = """\
processor\t: 0
vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: 106
model name\t: Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz
stepping\t: 6
flags\t\t: fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx fxsr sse sse2 ss ht \
syscall nx pdpe1gb rdtscp lm constant_tsc rep_good nopl xtopology nonstop_tsc cpuid aperfmperf tsc_known_freq pni \
pclmulqdq ssse3 fma cx16 pcid sse4_1 sse4_2 x2apic movbe popcnt tsc_deadline_timer aes xsave avx f16c rdrand \
hypervisor lahf_lm abm 3dnowprefetch invpcid_single ssbd ibrs ibpb stibp ibrs_enhanced fsgsbase tsc_adjust bmi1 \
avx2 smep bmi2 erms invpcid avx512f avx512dq rdseed adx smap avx512ifma clflushopt clwb avx512cd sha_ni avx512bw \
avx512vl xsaveopt xsavec xgetbv1 xsaves wbnoinvd ida arat avx512vbmi pku ospke avx512_vbmi2 gfni vaes vpclmulqdq \
avx512_vnni avx512_bitalg tme avx512_vpopcntdq rdpid md_clear flush_l1d arch_capabilities

processor\t: 1
vendor_id\t: GenuineIntel
"""

AVX512_ICE_LAKE = ["avx512f", "avx512dq", "avx512cd", "avx512bw", "avx512vl", "avx512_vnni"]  # no bf16, no AMX

GRAVITON2 = """\
processor\t: 0
BogoMIPS\t: 243.75
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp ssbs
CPU implementer\t: 0x41
CPU architecture: 8
CPU variant\t: 0x3
CPU part\t: 0xd0c
CPU revision\t: 1
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cpuinfo"
    path.write_text(text)
    return path


def test_avx2_only_epyc(tmp_path: Path) -> None:
    assert cpu_info(write(tmp_path, EPYC_ROME)) == {
        "cpu_model": "AMD EPYC 7B12",
        "cpu_vendor": "AuthenticAMD",
        "cpu_family": 23,
        "cpu_model_number": 49,
        "cpu_vector_extensions": ["sse4_2", "avx", "avx2", "fma", "f16c"],
        "cpu_x86_64_level": "x86-64-v3",
    }


def test_avx512_xeon(tmp_path: Path) -> None:
    assert cpu_info(write(tmp_path, XEON_ICE_LAKE)) == {
        "cpu_model": "Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz",
        "cpu_vendor": "GenuineIntel",
        "cpu_family": 6,
        "cpu_model_number": 106,
        "cpu_vector_extensions": ["sse4_2", "avx", "avx2", "fma", "f16c", *AVX512_ICE_LAKE],
        "cpu_x86_64_level": "x86-64-v4",
    }


def test_arm_numbers_are_hexadecimal(tmp_path: Path) -> None:
    assert cpu_info(write(tmp_path, GRAVITON2)) == {
        "cpu_model": platform.processor() or None,  # ARM's cpuinfo names no model
        "cpu_vendor": "0x41",
        "cpu_family": 8,
        "cpu_model_number": 0xD0C,
        "cpu_vector_extensions": ["asimd"],
        "cpu_x86_64_level": None,
    }


def test_without_cpuinfo(tmp_path: Path) -> None:
    assert cpu_info(tmp_path / "absent") == {
        "cpu_model": platform.processor() or None,
        "cpu_vendor": None,
        "cpu_family": None,
        "cpu_model_number": None,
        "cpu_vector_extensions": [],
        "cpu_x86_64_level": None,
    }


@pytest.mark.parametrize("level", range(len(X86_64_LEVELS)))
def test_a_level_needs_every_one_of_its_extensions(level: int) -> None:
    flags = {flag for _, required in X86_64_LEVELS[: level + 1] for flag in required}
    name = X86_64_LEVELS[level][0]
    below = X86_64_LEVELS[level - 1][0] if level else None
    assert x86_64_level(flags | {"avx512f"}) == name  # one extension of the next level is not the level
    for missing in X86_64_LEVELS[level][1]:
        assert x86_64_level(flags - {missing}) == below, missing


def test_hardware_info_has_every_field(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_max_isa=AVX2")
    info = hardware_info(conv_impl="matmul")
    assert set(info) == {
        *cpu_info(),
        "cpu_count",
        "gpu_name",
        "accelerator",
        "jax_version",
        "jaxlib_version",
        "envpool_version",
        "ale_py_version",
        "python_version",
        "platform",
        "xla_flags",
        "conv_impl",
        "kernel_isa",
        "runs_at_once",
    }
    assert info["cpu_count"] == os.cpu_count()
    assert info["python_version"] == ".".join(map(str, sys.version_info[:3]))
    assert info["xla_flags"] == "--xla_cpu_max_isa=AVX2"
    assert info["conv_impl"] == "matmul"
    assert info["runs_at_once"] is None  # alone, unless bench/atari57.py says otherwise
    monkeypatch.setenv("PPO_EQX_RUNS_AT_ONCE", "8")
    assert hardware_info()["runs_at_once"] == 8
    json.dumps(info)  # what run directories store


def test_an_accelerator_is_named_by_its_count_and_kind(monkeypatch: pytest.MonkeyPatch) -> None:
    """A TPU (which ``gpu_name`` does not name) is recorded: how many JAX sees, and their kind."""
    from ppo_eqx.cli import hardware

    tpu, cpu = types.SimpleNamespace(platform="tpu", device_kind="TPU v5 lite"), types.SimpleNamespace(platform="cpu")
    monkeypatch.setattr(hardware, "_devices", lambda: [tpu, tpu, cpu])
    info = hardware_info()
    assert info["accelerator"] == "2 x TPU v5 lite" and info["gpu_name"] is None


def test_hardware_info_without_a_route_or_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    info = hardware_info()
    assert info["conv_impl"] is None and info["xla_flags"] is None and info["kernel_isa"] is None


@pytest.mark.parametrize("isa", ["avx512", "avx2"])
def test_the_kernel_route_records_what_the_kernel_is_built_for(monkeypatch: pytest.MonkeyPatch, isa: str) -> None:
    from ppo_eqx.host import kernel_build

    monkeypatch.setattr(kernel_build, "isa", lambda: isa)
    assert hardware_info("kernel")["kernel_isa"] == isa
    assert hardware_info("matmul")["kernel_isa"] is None  # the kernel is not what ran
