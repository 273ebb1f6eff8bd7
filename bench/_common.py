"""Timing, ceilings and output shared by the bench scripts."""

import argparse
import json
import os
import resource
import statistics
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ppo_eqx import PPOConfig  # noqa: E402
from ppo_eqx.config import CONV_IMPLS  # noqa: E402


def add_config_args(parser: argparse.ArgumentParser) -> None:
    """The PPOConfig fields a bench varies, with CleanRL's Atari defaults, and ``--json``."""
    parser.add_argument("--env-id", default="Breakout-v5")
    parser.add_argument("--num-envs", type=int, default=8)
    parser.add_argument("--num-steps", type=int, default=128)
    parser.add_argument("--num-minibatches", type=int, default=4)
    parser.add_argument("--update-epochs", type=int, default=4)
    parser.add_argument("--conv-impl", choices=CONV_IMPLS, default=PPOConfig().conv_impl)
    parser.add_argument("--minibatch-unroll", type=int, default=1)
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")


class IsaCap(NamedTuple):
    """How ``--isa`` caps a process at an ISA: the CPU kernel's ``$PPO_EQX_KERNEL_ISA``, XLA's
    ``--xla_cpu_max_isa`` and OpenBLAS's ``$OPENBLAS_CORETYPE`` (the reference matmul under the cap)."""

    kernel: str
    xla: str
    openblas: str


ISA_CAPS = {"avx2": IsaCap("avx2", "AVX2", "Haswell"), "avx512": IsaCap("avx512", "AVX512", "SkylakeX")}


def add_isa_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--isa",
        choices=sorted(ISA_CAPS),
        default=None,
        help="run as on a CPU with this ISA at most: the CPU kernel built for it ($PPO_EQX_KERNEL_ISA), XLA's own "
        "code capped at it (XLA_FLAGS=--xla_cpu_max_isa) and the limit's matmul rate from OpenBLAS's kernels for it "
        "($OPENBLAS_CORETYPE; XLA's matmuls ignore the cap); the script restarts itself with these set, so that "
        "they hold from before jax starts (default: this CPU's own)",
    )


def isa_environment(isa: str, environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` capped at ``isa`` (``ISA_CAPS``): any other cap of XLA's replaced."""
    cap = ISA_CAPS[isa]
    flags = [flag for flag in environ.get("XLA_FLAGS", "").split() if not flag.startswith("--xla_cpu_max_isa=")]
    flags.append(f"--xla_cpu_max_isa={cap.xla}")
    return {
        **environ,
        "PPO_EQX_KERNEL_ISA": cap.kernel,
        "XLA_FLAGS": " ".join(flags),
        "OPENBLAS_CORETYPE": cap.openblas,
    }


def run_as_isa(isa: str | None) -> None:
    """Restart this script under ``isa_environment(isa)`` unless it already runs so (or ``isa`` is None). XLA
    reads its flags when its CPU backend starts, OpenBLAS its core type when it loads, and the kernel is built
    once a process, so all must be set before: a new process is the sure way."""
    if isa is None:
        return
    environ = isa_environment(isa, os.environ)
    if environ != dict(os.environ):
        sys.stdout.flush()
        os.execve(sys.executable, [sys.executable, *sys.argv], environ)


def config_from_args(args: argparse.Namespace, **changes: Any) -> PPOConfig:
    """CleanRL's hyperparameters with the bench's flags (and ``changes``) applied, validated."""
    return PPOConfig(
        env_id=args.env_id,
        num_envs=args.num_envs,
        num_steps=args.num_steps,
        num_minibatches=args.num_minibatches,
        update_epochs=args.update_epochs,
        conv_impl=args.conv_impl,
        minibatch_unroll=args.minibatch_unroll,
        **changes,
    ).validate()


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


def blas_matmul_rate(size: int = 2048, repeats: int = 10) -> float:
    """The float32 matmul rate in FLOP/s of NumPy's BLAS (OpenBLAS, with the kernels ``$OPENBLAS_CORETYPE``
    names): the limit's rate under ``--isa``, where XLA's own matmuls (YNNPACK) ignore ``--xla_cpu_max_isa``."""
    a = np.random.default_rng(0).normal(size=(size, size)).astype(np.float32)
    a @ a
    seconds, _ = timed(lambda: a @ a, repeats)
    return 2 * size**3 / seconds


def env_only_program(env_step: Callable, num_actions: int, num_steps: int, num_envs: int) -> tuple[Any, Any]:
    """A jitted ``lax.scan`` of ``num_steps`` env steps with random actions, and those actions."""
    actions = jax.random.randint(jax.random.PRNGKey(0), (num_steps, num_envs), 0, num_actions, jnp.int32)

    @jax.jit
    def env_only(handle, actions):
        def step(handle, action):
            handle, out = env_step(handle, action)
            return handle, out.reward

        return jax.lax.scan(step, handle, actions)

    return env_only, actions


def env_only_sps(
    env_step: Callable,
    handle: Any,
    num_actions: int,
    num_steps: int,
    num_envs: int,
    repeats: int,
    device: Any = None,
) -> float:
    """Env steps per second of EnvPool's XLA step alone: the ceiling of any rollout. ``device``: where the
    program runs (default: jax's default device; ``jax.devices("cpu")[0]`` on a GPU machine: the host's CPU)."""
    program, actions = env_only_program(env_step, num_actions, num_steps, num_envs)
    if device is not None:
        handle, actions = jax.device_put((handle, actions), device)
    handle, _ = jax.block_until_ready(program(handle, actions))
    times = []
    for _ in range(repeats):  # the handle threaded through, as a rollout threads it
        start = time.perf_counter()
        handle, _ = jax.block_until_ready(program(handle, actions))
        times.append(time.perf_counter() - start)
    return num_steps * num_envs / statistics.median(times)


def pool_env_only_sps(config: PPOConfig, repeats: int, device: Any = None) -> float:
    """``env_only_sps`` of a synchronous pool of ``config.num_envs`` envs made for this measurement alone."""
    from ppo_eqx import make_pool

    pool = make_pool(config.env_id, config.num_envs, seed=config.seed)
    try:
        return env_only_sps(
            pool.step, pool.handle, pool.spec.num_actions, config.num_steps, config.num_envs, repeats, device
        )
    finally:
        pool.close()


def async_env_only_sps(env: Any, handle: Any, num_actions: int, num_steps: int, batch_size: int, repeats: int) -> float:
    """``env_only_sps`` of an async pool (``make_async_env``): receives of ``batch_size`` envs, random actions sent."""
    actions = jax.random.randint(jax.random.PRNGKey(0), (num_steps, batch_size), 0, num_actions, jnp.int32)

    @jax.jit
    def env_only(handle, actions):
        def step(handle, action):
            handle, env_ids, out = env.recv(handle)
            return env.send(handle, env_ids, action), out.reward

        return jax.lax.scan(step, handle, actions)

    handle, _ = jax.block_until_ready(env_only(handle, actions))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        handle, _ = jax.block_until_ready(env_only(handle, actions))
        times.append(time.perf_counter() - start)
    return num_steps * batch_size / statistics.median(times)


def model_flops(config: Any, spec: Any, optimizer: Any) -> dict[str, float]:
    """FLOPs of one PPO env step, counted by XLA's cost analysis of loop-free programs.

    The model is computed with plain convolutions here (``conv_impl="xla"``): these are the model's FLOPs,
    whatever formulation the training uses (the "matmul" one computes a few more, which must not raise the
    limit). One env step costs one forward pass in the rollout and ``update_epochs`` forward-and-backward
    passes (with the optimizer step) per sample in the update.
    """
    import equinox as eqx

    from ppo_eqx import ActorCritic, Batch, model_loss

    model = ActorCritic(spec.obs_shape, spec.num_actions, conv_impl="xla", key=jax.random.PRNGKey(0))
    params, static = eqx.partition(model, eqx.is_array)
    size = config.minibatch_size
    obs = jnp.zeros((size, *spec.obs_shape), jnp.dtype(spec.obs_dtype))
    zeros = jnp.zeros((size,), jnp.float32)
    batch = Batch(obs, jnp.zeros((size,), jnp.int32), zeros - 1.0, zeros, zeros + 1.0, zeros)
    hyperparameters = config.agent_hyperparameters()

    def train_step(params, opt_state, batch):
        grads = jax.grad(lambda p: model_loss(eqx.combine(p, static), batch, hyperparameters)[0])(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return eqx.apply_updates(params, updates), opt_state

    forward = jax.jit(lambda p, o: eqx.combine(p, static)(o)).lower(params, obs).compile()
    train = jax.jit(train_step).lower(params, optimizer.init(params), batch).compile()
    forward_flops = (xla_flops(forward) or 0.0) / size
    train_flops = (xla_flops(train) or 0.0) / size
    return {
        "forward_mflop_per_frame": forward_flops / 1e6,
        "train_mflop_per_sample": train_flops / 1e6,
        "mflop_per_env_step": (forward_flops + config.update_epochs * train_flops) / 1e6,
    }


def compute_limit_sps(ceilings: dict[str, float]) -> float:
    """Env steps/s if every FLOP ran at the matmul rate and the env's own time were added serially."""
    seconds = ceilings["mflop_per_env_step"] * 1e6 / (ceilings["matmul_gflops"] * 1e9)
    return 1.0 / (seconds + 1.0 / ceilings["env_only_sps"])


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def device_memory_mib() -> float | None:
    stats = jax.devices()[0].memory_stats() or {}
    peak = stats.get("peak_bytes_in_use")
    return peak / 2**20 if peak else None


def write_results(rows: list[dict[str, Any]], header: dict[str, Any], json_path: Path | None) -> None:
    """Print ``rows`` as an aligned table and, with ``json_path``, write header and rows as JSON.

    ``header["environment"]`` (``environment()``) says where the figures hold: every result records it.
    """
    if "environment" not in header:
        raise ValueError("a bench result's header needs its 'environment' (bench/_common.py's environment())")
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


def environment(conv_impl: str | None) -> dict[str, Any]:
    """``hardware_info`` and jax's backend. ``conv_impl``: the route the bench's model computed its convolutions
    with (``model.conv_impl``, what "auto" resolved to); None where the rows differ and each row names its own."""
    from ppo_eqx.cli.hardware import hardware_info

    info = hardware_info(conv_impl)
    info["backend"] = jax.default_backend()
    return info


def fraction(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or not denominator:
        return None
    return float(np.float64(numerator) / denominator)
