"""The real training loop's speed: ``ppo_eqx.run`` for a fixed number of iterations after warm-up.

Reports env steps/s of the loop (median and overall over the timed iterations), the time per phase, the
compile time of the first iteration and the peak memory, beside this machine's ceilings measured in the
same run (see bench/microbench.py): the env-only rate, the float32 matmul rate and the compute limit

    limit_sps = 1 / (flops_per_env_step / matmul_rate + 1 / env_only_sps)

so the result is also given as a fraction of what this machine can do, and projected to a 10M-step run.

    python bench/train_speed.py --env-id Breakout-v5 --iterations 10 --json bench/results/train_speed.json

With ``--async-batch-size R`` the loop steps EnvPool's async pool (``num_envs`` envs, R per receive; a batch
is ``num_steps * R``), and the env-only ceiling is that pool's receive/send loop. ``cpu_s_per_1k_steps`` is
the process's CPU time (all threads, EnvPool's included) over the timed iterations, per 1000 env steps.

With ``--isa avx2`` the program runs as on an AVX2 CPU (AMD Zen 1-3, most laptops) as far as it can: the CPU
kernel built for AVX2 and XLA's own code capped at AVX2. XLA's matrix products (YNNPACK) choose their kernels
by the CPU and ignore the cap, so the limit's matmul rate is then OpenBLAS's AVX2 kernels' (NumPy's matmul with
``OPENBLAS_CORETYPE=Haswell``), XLA's own beside it in the JSON.

    python bench/train_speed.py --isa avx2 --json bench/results/train_speed_avx2.json

With ``--rollout-on device host host-envs --rounds 3`` the loop is timed on each placement of the rollout in turn,
alternated round by round in one process (a row per placement and round): a ratio between placements is then
measured side by side, on the same machine in the same minutes.

    python bench/train_speed.py --rollout-on device host host-envs --rounds 3 \
        --json bench/results/train_speed_placements.json

``host-envs:K`` names host-envs with K actor threads (``--actor-threads``; plain ``host-envs`` takes the machine's
choice, one on a CPU):

    python bench/train_speed.py --rollout-on device host-envs:1 host-envs:2 --rounds 3 \
        --json bench/results/train_speed_actors.json
"""

import argparse
import dataclasses
import os
import statistics
import time

import jax
from _common import (
    add_config_args,
    add_isa_arg,
    async_env_only_sps,
    blas_matmul_rate,
    compute_limit_sps,
    config_from_args,
    device_memory_mib,
    env_only_sps,
    environment,
    matmul_rate,
    model_flops,
    peak_rss_mib,
    run_as_isa,
    write_results,
)

from ppo_eqx import EnvSpec, PPOConfig, Trainer, make_async_pool, make_optimizer, make_pool, run
from ppo_eqx.config import ROLLOUT_PLACES


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_args(parser)
    add_isa_arg(parser)
    parser.add_argument(
        "--warmup",
        type=int,
        default=4,
        help="iterations run before timing (they also cover the background compile of the next env segment)",
    )
    parser.add_argument("--iterations", type=int, default=10, help="timed iterations")
    parser.add_argument(
        "--rollout-on",
        nargs="+",
        type=placement_arg,
        default=["auto"],
        help="the placements of the rollout to time (PPOConfig.rollout_on; host-envs:K for K actor threads), in "
        "turn, each round",
    )
    parser.add_argument("--rounds", type=int, default=1, help="rounds over the placements, alternated")
    parser.add_argument(
        "--async-batch-size",
        type=int,
        default=0,
        help="EnvPool's async mode: envs per receive, a divisor of --num-envs below it (default: 0, synchronous)",
    )
    return parser.parse_args()


def placement_arg(text: str) -> str:
    """A placement of ``ROLLOUT_PLACES``, or ``host-envs:K`` (host-envs with K actor threads)."""
    place, _, actors = text.partition(":")
    if place not in ROLLOUT_PLACES or (actors and (place != "host-envs" or not actors.isdigit() or int(actors) < 1)):
        raise argparse.ArgumentTypeError(f"{text!r}; allowed: {', '.join(ROLLOUT_PLACES)}, or host-envs:K (K >= 1)")
    return text


def placed_config(config: PPOConfig, place: str) -> PPOConfig:
    """``config`` on the placement ``place`` names (``placement_arg``)."""
    rollout_on, _, actors = place.partition(":")
    return config.replace(rollout_on=rollout_on, actor_threads=int(actors or config.actor_threads))


@dataclasses.dataclass
class LoopTimes:
    """What the training loop took: its records past warm-up and the process's memory and CPU time around them."""

    compile_s: float
    setup_s: float
    records: list[dict]
    rss_after_compile: float
    rss_by_iteration: list[float]
    cpu_s_per_1k_steps: float
    bare_sps: float
    conv_impl: str


def time_loop(config: PPOConfig, warmup: int, iterations: int) -> LoopTimes:
    """The loop through ``ppo_eqx.run`` (warm-up, then timed iterations), and the bare jitted iteration beside it:
    as many iterations dispatched back to back, read once at the end."""
    start = time.perf_counter()
    trainer = Trainer(config)
    setup_s = time.perf_counter() - start
    compile_s = trainer.compile()
    rss_after_compile = peak_rss_mib()
    records, rss_by_iteration, cpu_times = [], [], [time.process_time()]
    for record in run(trainer, num_iterations=warmup + iterations):
        records.append(record)
        cpu_times.append(time.process_time())
        rss_by_iteration.append(peak_rss_mib())
        print(
            f"# iteration {record['iteration']}: {record['sps']:.0f} steps/s, peak RSS {peak_rss_mib():.0f} MiB",
            flush=True,
        )
    bare_start = time.perf_counter()
    for _ in range(iterations):
        trainer.dispatch()
    jax.block_until_ready(trainer.state)
    bare_sps = config.batch_size * iterations / (time.perf_counter() - bare_start)
    trainer.close()
    timed = records[warmup:]
    cpu_s_per_1k_steps = (cpu_times[-1] - cpu_times[warmup]) / (config.batch_size * len(timed)) * 1000
    return LoopTimes(
        compile_s, setup_s, timed, rss_after_compile, rss_by_iteration, cpu_s_per_1k_steps, bare_sps, trainer.conv_impl
    )


def env_ceiling(config: PPOConfig) -> tuple[float, EnvSpec]:
    """The env-only rate of envs made as the loop makes them (sync pool, or async pool's receive/send loop)."""
    if config.async_batch_size:
        pool = make_async_pool(config.env_id, config.num_envs, config.async_batch_size, seed=config.seed)
        env_sps = async_env_only_sps(
            pool.env, pool.handle, pool.spec.num_actions, config.num_steps, config.async_batch_size, 5
        )
    else:
        pool = make_pool(config.env_id, config.num_envs, seed=config.seed)
        env_sps = env_only_sps(
            pool.step, pool.handle, pool.spec.num_actions, config.num_steps, config.num_envs, repeats=5
        )
    pool.close()
    return env_sps, pool.spec


def result_row(config: PPOConfig, loop: LoopTimes, env_sps: float, limit: float) -> dict:
    """The one row of results: the loop's rate beside the bare iteration's and this machine's limit."""
    step_times = [config.batch_size / r["sps"] for r in loop.records]
    loop_sps = config.batch_size * len(step_times) / sum(step_times)
    return {
        "env_id": config.env_id,
        "rollout_on": config.rollout_on if not config.actor_threads else f"{config.rollout_on}:{config.actor_threads}",
        "actor_threads": config.actor_threads,
        "num_envs": config.num_envs,
        "async_batch_size": config.async_batch_size,
        "num_steps": config.num_steps,
        "loop_sps": loop_sps,
        "bare_iteration_sps": loop.bare_sps,
        "loop_over_bare": loop_sps / loop.bare_sps,
        "cpu_s_per_1k_steps": loop.cpu_s_per_1k_steps,
        "median_sps": statistics.median(r["sps"] for r in loop.records),
        "env_only_sps": env_sps,
        "limit_sps": limit,
        "fraction_of_limit": loop_sps / limit,
        "compile_s": loop.compile_s,
        "projected_10M_min": (1e7 / loop_sps + loop.compile_s) / 60,
        "peak_rss_mib": peak_rss_mib(),
    }


def main() -> None:
    args = parse_args()
    run_as_isa(args.isa)
    # CleanRL's hyperparameters; total_timesteps only sets the learning-rate annealing horizon.
    config = config_from_args(args, async_batch_size=args.async_batch_size)
    # The matmul rate before and after the loop: on a shared machine it varies by a factor of 2 from one second to
    # the next, and the ceiling is the best the machine showed.
    matmul_before, blas_before = matmul_rate(), blas_matmul_rate()
    runs = []
    for round_ in range(args.rounds):
        for place in args.rollout_on:
            placed = placed_config(config, place)
            print(f"# round {round_ + 1} of {args.rounds}: rollout_on={place}", flush=True)
            runs.append((round_, placed, time_loop(placed, args.warmup, args.iterations)))
    loop = runs[-1][2]
    # Ceilings in the same process, after the loops, on envs made the same way.
    env_sps, spec = env_ceiling(config)
    ceilings = model_flops(config, spec, make_optimizer(config.agent_hyperparameters(), config.sizes))
    matmul_after, blas_after = matmul_rate(), blas_matmul_rate()
    xla_gflops, blas_gflops = max(matmul_before, matmul_after) / 1e9, max(blas_before, blas_after) / 1e9
    ceilings.update(matmul_gflops=blas_gflops if args.isa else xla_gflops, env_only_sps=env_sps)
    limit = compute_limit_sps(ceilings)
    header = {
        "environment": environment(loop.conv_impl),  # the route "auto" chose, and the kernel's ISA
        "isa_cap": args.isa,  # None: this CPU's own ISA
        "openblas_coretype": os.environ.get("OPENBLAS_CORETYPE"),
        **ceilings,
        "matmul_gflops_before_after": [matmul_before / 1e9, matmul_after / 1e9],  # XLA's
        "blas_matmul_gflops_before_after": [blas_before / 1e9, blas_after / 1e9],  # NumPy's OpenBLAS
        "matmul_rate_of_the_limit": "openblas" if args.isa else "xla",
        "setup_s": loop.setup_s,
        "rss_after_compile_mib": loop.rss_after_compile,
        "rss_by_iteration_mib": loop.rss_by_iteration,
        "device_peak_mib": device_memory_mib(),
        "iterations_timed": len(loop.records),
        "backend": jax.default_backend(),
        "final_loss": loop.records[-1]["loss"],
        "rounds": args.rounds,
    }
    rows = [{"round": r + 1, **result_row(placed, times, env_sps, limit)} for r, placed, times in runs]
    if len(args.rollout_on) > 1:
        header["placements_over_first"] = placement_ratios(rows, args.rollout_on)
    write_results(rows, header, args.json)


def placement_ratios(rows: list[dict], places: list[str]) -> dict[str, dict[str, float]]:
    """Each placement's loop rate over the first's, round by round (the rows of one round ran minutes apart)."""
    first = {row["round"]: row["loop_sps"] for row in rows if row["rollout_on"] == places[0]}
    ratios: dict[str, dict[str, float]] = {}
    for place in places[1:]:
        each = [row["loop_sps"] / first[row["round"]] for row in rows if row["rollout_on"] == place]
        ratios[place] = {"median": statistics.median(each), "min": min(each), "max": max(each)}
    return ratios


if __name__ == "__main__":
    main()
