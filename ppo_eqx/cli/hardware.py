"""What a run ran on, so that wall-clock numbers can be read beside their hardware.

jax-free at import: jax is imported only to name a GPU and, on the "kernel" route, the CPU kernel's ISA.
"""

import importlib.metadata
import os
import platform
from pathlib import Path
from typing import Any

CPUINFO = Path("/proc/cpuinfo")

# The vector extensions that set how fast XLA's code and ppo_eqx's CPU kernel run, as /proc/cpuinfo spells them:
# x86's AVX2/FMA (x86-64-v3) and AVX-512 (v4) widths, the bf16/VNNI/AMX units oneDNN uses where they exist, and
# ARM's NEON (asimd) and SVE.
VECTOR_EXTENSIONS = (
    "sse4_2",
    "avx",
    "avx2",
    "fma",
    "f16c",
    "avx_vnni",
    "avx512f",
    "avx512dq",
    "avx512cd",
    "avx512bw",
    "avx512vl",
    "avx512_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
    "asimd",
    "sve",
    "sve2",
)

# The x86-64 psABI microarchitecture levels (what -march=x86-64-v3 builds for), each a superset of the one before.
X86_64_LEVELS = (
    ("x86-64-v2", ("cx16", "lahf_lm", "popcnt", "pni", "sse4_1", "sse4_2", "ssse3")),
    ("x86-64-v3", ("avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave")),
    ("x86-64-v4", ("avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl")),
)


def _package_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _first_cpu_fields(text: str) -> dict[str, str]:
    """The `key : value` fields of /proc/cpuinfo, each key's first non-empty value (the first CPU's, on x86)."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and value.strip():
            fields.setdefault(key.strip(), value.strip())
    return fields


def _int_or_none(text: str | None) -> int | None:
    """x86's decimal numbers, ARM's hexadecimal ones ("0xd0c"); None for anything else."""
    if text is None:
        return None
    try:
        return int(text, 16) if text.lower().startswith("0x") else int(text)
    except ValueError:
        return None


def x86_64_level(flags: set[str]) -> str | None:
    """The highest x86-64 level whose every extension is in ``flags``; None below x86-64-v2 or off x86."""
    level = None
    for name, required in X86_64_LEVELS:
        if not flags.issuperset(required):
            break
        level = name
    return level


def cpu_info(cpuinfo: Path = CPUINFO) -> dict[str, Any]:
    """The CPU as /proc/cpuinfo describes it.

    Keys: cpu_model (`model name` on x86; `Hardware`/`Processor` on ARM; else platform's), cpu_vendor
    (`vendor_id`, ARM's `CPU implementer`), cpu_family and cpu_model_number (x86's `cpu family` and `model`, as
    integers; ARM's `CPU architecture` and `CPU part`), cpu_vector_extensions (those of VECTOR_EXTENSIONS the CPU
    reports, in that order) and cpu_x86_64_level (``x86_64_level``). Fields the file lacks are None.
    """
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError:
        text = ""
    fields = _first_cpu_fields(text)
    model = next((fields[key] for key in ("model name", "Hardware", "Processor", "cpu model") if key in fields), None)
    flags = set((fields.get("flags") or fields.get("Features") or "").split())
    return {
        "cpu_model": model or platform.processor() or None,
        "cpu_vendor": fields.get("vendor_id") or fields.get("CPU implementer"),
        "cpu_family": _int_or_none(fields.get("cpu family") or fields.get("CPU architecture")),
        "cpu_model_number": _int_or_none(fields.get("model") or fields.get("CPU part")),
        "cpu_vector_extensions": [name for name in VECTOR_EXTENSIONS if name in flags],
        "cpu_x86_64_level": x86_64_level(flags),
    }


def _devices() -> list[Any]:
    """The devices JAX sees ([] without a working jax)."""
    try:
        import jax  # lazily: reading the hardware of a CPU-only machine should not need a backend
    except ImportError:
        return []
    try:
        return list(jax.devices())
    except RuntimeError:
        return []


def _gpu_name(devices: list[Any]) -> str | None:
    """device_kind of the first GPU of ``devices``, or None without one."""
    gpus = [device for device in devices if device.platform in ("gpu", "cuda", "rocm")]
    return gpus[0].device_kind if gpus else None


def _accelerator(devices: list[Any]) -> str | None:
    """The accelerators of ``devices``, e.g. "1 x TPU v5 lite" (their count and the first one's device_kind), or
    None where JAX sees only CPUs."""
    others = [device for device in devices if device.platform != "cpu"]
    return f"{len(others)} x {others[0].device_kind}" if others else None


def kernel_isa(conv_impl: str | None) -> str | None:
    """What ppo_eqx's CPU kernel is built for here ("avx512" or "avx2", ``kernel_build.isa()``) where the route is
    "kernel"; None on any other route."""
    if conv_impl != "kernel":
        return None
    from ..host import kernel_build  # lazily (it imports jax); where the route is "kernel" it is loaded

    return kernel_build.isa()


def hardware_info(conv_impl: str | None = None) -> dict[str, Any]:
    """A JSON-serialisable description of this machine and of the versions that time a run.

    Keys: those of ``cpu_info()``, cpu_count (logical CPUs, os.cpu_count()), gpu_name (None without a GPU),
    accelerator (``"1 x TPU v5 lite"``: the count and kind of the devices JAX sees that are not CPUs, else None),
    jax_version, jaxlib_version, envpool_version and ale_py_version (None when not installed), python_version,
    platform, xla_flags (the XLA_FLAGS environment variable, which can cap XLA's vector ISA; None when unset) and
    conv_impl (the convolution route the run used, as its caller resolved it; None when not given), kernel_isa
    (``kernel_isa(conv_impl)``: what the CPU kernel is built for on the "kernel" route, else None) and runs_at_once
    (how many runs shared the machine, where ``bench/atari57.py`` said so).
    EnvPool and ALE are never imported: their versions come from the package metadata.
    """
    devices = _devices()
    return {
        **cpu_info(),
        "cpu_count": os.cpu_count(),
        "gpu_name": _gpu_name(devices),
        "accelerator": _accelerator(devices),
        "jax_version": _package_version("jax"),
        "jaxlib_version": _package_version("jaxlib"),
        "envpool_version": _package_version("envpool"),
        "ale_py_version": _package_version("ale-py"),
        "python_version": platform.python_version(),
        "platform": platform.platform(),
        "xla_flags": os.environ.get("XLA_FLAGS") or None,
        "conv_impl": conv_impl,
        "kernel_isa": kernel_isa(conv_impl),
        "runs_at_once": _runs_at_once(),
    }


def _runs_at_once() -> int | None:
    """How many runs shared this machine (``PPO_EQX_RUNS_AT_ONCE``, which ``bench/atari57.py`` sets): a run's minutes
    are read beside it. None when nobody said."""
    try:
        return int(os.environ["PPO_EQX_RUNS_AT_ONCE"])
    except (KeyError, ValueError):
        return None


def where_it_ran(hardware: dict[str, Any]) -> str:
    """How the run's first line says where it runs, from its ``hardware.json`` record: ``convolutions: kernel
    (avx2), rollout: device``, or ``..., rollout: host (cpu:0, kernel), learning on cuda:0``."""
    return f"convolutions: {_route(hardware)}, rollout: {_rollout(hardware['rollout'])}"


def _route(hardware: dict[str, Any]) -> str:
    """The convolution route as the first line says it: ``kernel (avx2)``, ``matmul``, ``xla``."""
    isa = hardware["kernel_isa"]
    return hardware["conv_impl"] if isa is None else f"{hardware['conv_impl']} ({isa})"


def _rollout(record: dict[str, Any]) -> str:
    """Where the rollout ran, as the first line says it: ``device``, or ``host (cpu:0, kernel), learning on
    cuda:0``."""
    if record["on"] == "host-envs":
        policy, learn = record["policy_device"], record["learn_device"]
        learning = "" if learn == policy else f", learning on {learn}"
        return f"host-envs (envs on the host's CPU, the policy on {policy}{learning})"
    if record["on"] != "host":
        return record["on"]
    return f"host ({record['rollout_device']}, {record['rollout_conv_impl']}), learning on {record['learn_device']}"
