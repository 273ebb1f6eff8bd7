"""Timing, ceilings and output shared by the bench scripts."""

import json
import resource
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def timed(fn: Callable[[], Any], repeats: int) -> tuple[float, list[float]]:
    """Median seconds of ``fn()`` over ``repeats`` calls, each ending in block_until_ready; and all times."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - start)
    return statistics.median(times), times


def compile_seconds(jitted: Any, *args: Any) -> tuple[Any, float]:
    """Lower and compile ``jitted`` for ``args``; returns the executable and the seconds it took."""
    start = time.perf_counter()
    compiled = jitted.lower(*args).compile()
    return compiled, time.perf_counter() - start


def xla_flops(compiled: Any) -> float | None:
    """XLA's own FLOP count of a compiled program (loops counted once per body, so use loop-free programs)."""
    analysis = compiled.cost_analysis()
    if isinstance(analysis, list):
        analysis = analysis[0] if analysis else {}
    flops = (analysis or {}).get("flops")
    return float(flops) if flops else None


def matmul_rate(size: int = 2048, repeats: int = 10) -> float:
    """The machine's float32 matmul rate in FLOP/s, on the default device."""
    a = jax.random.normal(jax.random.PRNGKey(0), (size, size), jnp.float32)
    matmul = jax.jit(lambda x: x @ x)
    jax.block_until_ready(matmul(a))
    seconds, _ = timed(lambda: matmul(a), repeats)
    return 2 * size**3 / seconds


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def device_memory_mib() -> float | None:
    stats = jax.devices()[0].memory_stats() or {}
    peak = stats.get("peak_bytes_in_use")
    return peak / 2**20 if peak else None


def write_results(rows: list[dict[str, Any]], header: dict[str, Any], json_path: Path | None) -> None:
    """Print ``rows`` as an aligned table and, with ``json_path``, write header and rows as JSON."""
    columns: list[str] = []
    for row in rows:
        columns += [key for key in row if key not in columns]

    def cell(value: Any) -> str:
        if isinstance(value, float):
            return f"{value:.4g}"
        return "" if value is None else str(value)

    table = [columns] + [[cell(row.get(c)) for c in columns] for row in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(columns))]
    for key, value in header.items():
        print(f"# {key}: {cell(value)}")
    for n, line in enumerate(table):
        print("  ".join(text.rjust(width) for text, width in zip(line, widths, strict=True)))
        if n == 0:
            print("  ".join("-" * width for width in widths))
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps({"header": header, "rows": rows}, indent=2, default=float) + "\n")
        print(f"# written to {json_path}")


def environment() -> dict[str, Any]:
    from ppo_eqx.hardware import hardware_info

    info = hardware_info()
    info["backend"] = jax.default_backend()
    return info


def fraction(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or not denominator:
        return None
    return float(np.float64(numerator) / denominator)
