"""What a run ran on, so that wall-clock numbers can be read beside their hardware."""

import importlib.metadata
import os
import platform
from pathlib import Path
from typing import Any


def _package_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str | None:
    """The first `model name` of /proc/cpuinfo (x86), else `Hardware`/`Processor` (ARM), else platform's."""
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError:
        text = ""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and value.strip():
            fields.setdefault(key.strip(), value.strip())
    for key in ("model name", "Hardware", "Processor", "cpu model"):
        if key in fields:
            return fields[key]
    return platform.processor() or None


def _gpu_name() -> str | None:
    """device_kind of the first GPU JAX sees, or None without one (or without a working jax)."""
    try:
        import jax  # lazily: reading the hardware of a CPU-only machine should not need a backend
    except ImportError:
        return None
    try:
        devices = jax.devices()
    except RuntimeError:
        return None
    gpus = [device for device in devices if device.platform in ("gpu", "cuda", "rocm")]
    return gpus[0].device_kind if gpus else None


def hardware_info() -> dict[str, Any]:
    """A JSON-serialisable description of this machine and of the versions that time a run.

    Keys: cpu_model, cpu_count (logical CPUs, os.cpu_count()), gpu_name (None without a GPU),
    jax_version, jaxlib_version, envpool_version (None when not installed), python_version, platform.
    EnvPool is never imported: its version comes from the package metadata.
    """
    return {
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "gpu_name": _gpu_name(),
        "jax_version": _package_version("jax"),
        "jaxlib_version": _package_version("jaxlib"),
        "envpool_version": _package_version("envpool"),
        "python_version": platform.python_version(),
        "platform": platform.platform(),
    }
