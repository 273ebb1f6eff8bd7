"""Where one PPO update spends its time: each compiled op of ``update``, timed by the JAX profiler.

By default the process is pinned to one core first, so that no two ops overlap and each op's time is its
own (on several cores XLA runs independent ops at once and their trace times include each other). For each
op (fusion, dot, library call) of the update's minibatch step the table gives its output shape, the JAX
operation it came from, its milliseconds per minibatch step and share of the update; for matrix products
and calls to ppo_eqx's CPU kernel also GFLOP/s and that as a fraction of the float32 matmul rate measured on
the same cores in the same run.
The batch is random frames of the env's shape; the frames' values do not change the time.

    python bench/profile_update.py --env-id Breakout-v5 --json bench/results/profile_update.json
"""

import argparse
import gzip
import json
import math
import os
import re
import tempfile
from collections import defaultdict
from pathlib import Path


def parse_args() -> argparse.Namespace:
    from _common import add_config_args, add_isa_arg

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_args(parser)
    add_isa_arg(parser)
    parser.add_argument("--all-cores", action="store_true", help="do not pin to one core (op times then overlap)")
    parser.add_argument("--calls", type=int, default=3, help="traced calls of the whole update (default: 3)")
    parser.add_argument("--top", type=int, default=30, help="ops listed, the slowest first (default: 30)")
    return parser.parse_args()


_COMPUTATION = re.compile(r"^(?:ENTRY )?%(\S+) \(.*\{$")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%(\S+) = (\w+)\[([\d,]*)\][^ ]* ([\w-]+)\(([^)]*)\)(.*)$")


def hlo_instructions(hlo_text: str) -> dict[str, dict]:
    """Each instruction that runs as its own op (not the inside of a fusion) of an optimized HLO module:
    dtype, shape, opcode, operand names, JAX op name."""
    table = {}
    inside_fusion = False
    for line in hlo_text.splitlines():
        computation = _COMPUTATION.match(line)
        if computation:
            inside_fusion = "fused" in computation.group(1) or "wrapped" in computation.group(1)
            continue
        match = _INSTRUCTION.match(line)
        if not match or inside_fusion:
            continue
        name, dtype, dims, opcode, operands, rest = match.groups()
        op_name = re.search(r'op_name="([^"]*)"', rest)
        target = re.search(r'custom_call_target="([^"]*)"', rest)
        table[name] = {
            "dtype": dtype,
            "shape": tuple(int(d) for d in dims.split(",") if d),
            "opcode": opcode,
            "operands": [o.strip().lstrip("%") for o in operands.split(",") if o.strip().startswith("%")],
            "op_name": op_name.group(1) if op_name else "",
            "target": target.group(1) if target else "",
        }
    return table


def matmul_flops(name: str, table: dict[str, dict]) -> float | None:
    """FLOPs of a two-operand matrix product ``[M, K] x [K, N]`` from its shapes (K = sqrt(|lhs||rhs|/|out|))."""
    entry = table.get(name)
    is_product = entry is not None and (entry["opcode"] == "dot" or entry["op_name"].endswith("dot_general"))
    if not is_product or len(entry["operands"]) != 2:
        return None
    lhs, rhs = (table.get(o) for o in entry["operands"])
    if lhs is None or rhs is None or len(lhs["shape"]) != 2 or len(rhs["shape"]) != 2:
        return None
    out = math.prod(entry["shape"])
    k = math.isqrt(math.prod(lhs["shape"]) * math.prod(rhs["shape"]) // out)
    if k * k * out != math.prod(lhs["shape"]) * math.prod(rhs["shape"]) or k < 2:
        return None
    return 2.0 * out * k


def kernel_flops(name: str, table: dict[str, dict]) -> float | None:
    """FLOPs of a call to one of ppo_eqx's convolution kernels (forward, input or weight gradient): two per
    multiply-add of every output position ``[B, oh, ow]`` with every kernel tap ``[k, k, C]`` and channel."""
    entry = table.get(name)
    if entry is None or not entry["target"].startswith("ppo_eqx_"):
        return None
    first, second = (table[o]["shape"] for o in entry["operands"][:2])
    if entry["target"].endswith("_forward"):  # (x, kernel, bias) -> y [B, oh, ow, O]
        positions, taps = entry["shape"], second[:3]
    elif entry["target"].endswith("_input_gradient"):  # (dy [B, oh, ow, O], kernel [k, k, O, C]) -> dx
        positions, taps = first, (second[0], second[1], second[3])
    else:  # weight gradient: (x, dy [B, oh, ow, O]) -> dkernel [k, k, C, O]
        positions, taps = second, entry["shape"][:3]
    return 2.0 * math.prod(positions) * math.prod(taps)


def product_flops(name: str, table: dict[str, dict]) -> float | None:
    """FLOPs of a matrix product or a kernel call; None for other ops."""
    return matmul_flops(name, table) or kernel_flops(name, table)


def describe(op_name: str) -> str:
    """The JAX operation an HLO op came from, said as forward or backward pass."""
    op_name = re.sub(r"^jit\([^)]*\)/", "", op_name).replace("while/body/closed_call/", "")
    return op_name.replace("transpose(jvp())/", "backward: ").replace("jvp()/", "forward: ")[-48:]


def thunk_times_us(trace_dir: str) -> dict[str, float]:
    """Total microseconds per traced event name in the profiler's Perfetto trace."""
    (path,) = Path(trace_dir).rglob("*.trace.json.gz")
    totals: dict[str, float] = defaultdict(float)
    for event in json.load(gzip.open(path))["traceEvents"]:
        if event.get("ph") == "X":
            totals[event["name"]] += event["dur"]
    return totals


def compiled_update(config):
    """The whole update (epochs x minibatches) of the config's model on a random batch, compiled: the jitted
    function, its arguments, its HLO's instruction table and the model's convolution route. Imports jax: call it
    after the process's CPU affinity is set."""
    import equinox as eqx
    import jax
    import jax.numpy as jnp
    import numpy as np

    from ppo_eqx import ActorCritic, Batch, env_spec, make_optimizer, resolve_conv_impl, update

    spec = env_spec(config.env_id)
    conv_impl = resolve_conv_impl(config.conv_impl, spec.obs_shape)  # type: ignore[arg-type]
    model = ActorCritic(spec.obs_shape, spec.num_actions, conv_impl=conv_impl, key=jax.random.PRNGKey(0))
    hyperparameters, sizes = config.agent_hyperparameters(), config.sizes
    opt_state = make_optimizer(hyperparameters, sizes).init(eqx.filter(model, eqx.is_array))
    rng = np.random.default_rng(0)
    size = config.batch_size
    f32 = lambda: jnp.asarray(rng.normal(size=size), jnp.float32)  # noqa: E731
    if np.issubdtype(np.dtype(spec.obs_dtype), np.integer):
        obs = rng.integers(0, 256, size=(size, *spec.obs_shape))
    else:
        obs = rng.normal(size=(size, *spec.obs_shape))
    actions = jnp.asarray(rng.integers(0, spec.num_actions, size), jnp.int32)
    batch = Batch(jnp.asarray(obs, jnp.dtype(spec.obs_dtype)), actions, f32() * 0.1 - 1.4, f32(), f32(), f32())
    params, static = eqx.partition(model, eqx.is_array)
    # jax.jit (not eqx.filter_jit) so that the compiled program's HLO text is at hand.
    full_update = jax.jit(lambda p, o, b, k: update(eqx.combine(p, static), o, b, hyperparameters, sizes=sizes, key=k))
    call_args = (params, opt_state, batch, jax.random.PRNGKey(1))
    table = hlo_instructions(full_update.lower(*call_args).compile().as_text())
    jax.block_until_ready(full_update(*call_args))
    return full_update, call_args, table, model.conv_impl


def traced_ops_ms(full_update, call_args, calls: int, table: dict) -> dict[str, float]:
    """Milliseconds per call of each of the program's ops, from a profiler trace of ``calls`` calls."""
    import jax

    with tempfile.TemporaryDirectory() as trace_dir:
        with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
            for _ in range(calls):
                jax.block_until_ready(full_update(*call_args))
        totals = thunk_times_us(trace_dir)
    return {name: us / calls / 1e3 for name, us in totals.items() if name in table}


def op_rows(ops: dict[str, float], table: dict, steps: int, flop_rate: float, top: int) -> list[dict]:
    """The ``top`` costliest ops: time per call, share of the update, GFLOP/s against the matmul rate."""
    update_ms = sum(ops.values())
    rows = []
    for name, ms in sorted(ops.items(), key=lambda item: -item[1])[:top]:
        entry = table[name]
        flops = product_flops(name, table)
        # Ops inside the minibatch loop run once per step; the rest (the relayout of the batch) once.
        per_step = ms / steps if "while/body" in entry["op_name"] else ms
        gflops = flops / (per_step / 1e3) / 1e9 if flops else None
        rows.append(
            {
                "op": name,
                "from": describe(entry["op_name"]),
                "shape": "x".join(map(str, entry["shape"])),
                "ms_per_call": per_step,
                "calls_per_update": steps if per_step != ms else 1,
                "share": ms / update_ms,
                "gflops": gflops,
                "fraction_of_matmul_rate": gflops * 1e9 / flop_rate if gflops else None,
            }
        )
    return rows


def main() -> None:
    args = parse_args()
    from _common import run_as_isa

    run_as_isa(args.isa)
    if not args.all_cores and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # before XLA sizes its thread pools
    from _common import blas_matmul_rate, config_from_args, environment, matmul_rate, write_results

    config = config_from_args(args)
    full_update, call_args, table, conv_impl = compiled_update(config)
    # Under --isa XLA's matmuls ignore the cap (bench/train_speed.py): the rate of the ISA is OpenBLAS's.
    flop_rate = blas_matmul_rate() if args.isa else matmul_rate()
    ops = traced_ops_ms(full_update, call_args, args.calls, table)
    steps = config.update_epochs * config.num_minibatches
    update_ms = sum(ops.values())
    products = sum(ms for name, ms in ops.items() if product_flops(name, table))
    header = {
        "environment": environment(conv_impl),
        "isa_cap": args.isa,
        "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "matmul_gflops": flop_rate / 1e9,
        "matmul_rate_from": "openblas" if args.isa else "xla",
        "update_ms": update_ms,
        "minibatch_steps": steps,
        "matrix_products_share": products / update_ms,
        "other_ops_share": 1 - products / update_ms,
    }
    write_results(op_rows(ops, table, steps, flop_rate, args.top), header, args.json)


if __name__ == "__main__":
    main()
