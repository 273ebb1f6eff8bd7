"""One prepared check of ppo_eqx's speed on an accelerator machine, in under 8 minutes.

The one command to run on the device machine (one GPU, e.g. an H200 with 16 CPU cores), from the repository
root, with the package installed (``pip install -e '.[gpu]'``):

    python bench/device_check.py --json bench/results/device_check_h200.json

and on a CPU, to check that the script itself works (a minute or two; ``tests/test_device_check.py`` runs it):

    python bench/device_check.py --quick --json bench/results/device_check_cpu_quick.json

Parts, in this order, each in a fresh process (so a crash or a hang of one, e.g. EnvPool's async pool, is
recorded as an error string in its row and the next part runs; and each part's peak memory is its own). The
times are for one H200 (measured there on 2026-12-04: 240 s in all, ``bench/results/device_check_h200.json``),
each including about 5-10 s of process start and jax/CUDA initialisation; the JSON records what each part took
(``seconds``):

- ``environment`` (about 15 s): hardware, versions, backend, devices, the float32 matmul rate, what
  ``--conv-impl auto`` picks here, the device's memory limit.
- ``env_only_8``, ``_16``, ``_32``, ``_64`` (about 30 s, one process): env steps/s of EnvPool's XLA step alone
  (random actions, ``num_steps`` steps in a ``lax.scan``) for 8, 16, 32 and 64 envs: the ceilings.
- ``train_xla``, ``train_matmul`` (about 45-60 s each), and ``train_kernel`` on a CPU where the kernel builds:
  CleanRL's configuration (Breakout-v5, 8 envs x 128 steps, 4 minibatches, 4 epochs) with each convolution
  route: setup (envs and tracing), compile time, env steps/s of the timed iterations after warm-up, the median
  iteration, peak device memory (``peak_bytes_in_use``; None where the backend keeps no statistics, as the
  CPU), peak RSS, and the projected minutes for 10M steps (``(1e7 / steps_per_s + compile_s) / 60``).
- ``host_envs_NxT_actors_K`` (one process, about 20 s a setting on a TPU): ``--rollout-on host-envs`` with K actor
  threads for each of ``actor_grid`` (``--preset tpu``'s 64 envs x 32 steps in minibatches of 256 at host-envs'
  default count, K 0, first; CleanRL's 8 envs at 1 to 8 actors): env steps/s, the actors used, and the share of an
  iteration that the host loop's rollout takes. Beside EnvPool's own host step for the same env counts
  (``host_step``): the host's ceiling.
- ``gymnax_cartpole_1``, ``gymnax_cartpole_64`` (about 30 s each, where gymnax is installed): the env in the
  program (``--env-backend gymnax``): CartPole-v1 with its preset (CleanRL's ppo.py, 499,712 steps an agent) for
  1 and 64 seeds, the whole run as one program; compile and run seconds apart, and the final return.
- ``seeds_4``, ``seeds_8`` (about 60 s each): the train parts' configuration with ``--num-seeds`` 4 and 8 (one
  pool of S x 8 envs); steps/s of all agents together and per agent; the projection is for every agent to reach
  10M steps.
- ``async`` (about 45 s): EnvPool's async pool at CleanRL's batch size (16 envs, 8 per receive, 128 steps).

On a device whose programs cannot hold EnvPool's XLA step (a TPU: it is a CPU and CUDA call), the parts that
compile it (``env_only``, the device route's train parts, ``async``, ``seeds_*``, CleanRL's script) are recorded as
``cannot-run`` with the reason, not tried; the parts that never use the device run with ``JAX_PLATFORMS=cpu``.
On the TPU machine (``../shared/tpu/README.md``)::

    python bench/device_check.py --budget-s 420 --json bench/results/device_check_tpu_v5e.json

A global budget (``--budget-s``: 450 s; 360 s with ``--quick``, for a loaded CPU) bounds the whole run: each
part may use at most what is left of it (and ``--part-timeout-s``), and the parts that no longer fit are
recorded as skipped with a note. A part of many rows (the pool sizes, the threads, the actor grid) prints each
row as it is measured: one stopped by its limit keeps those, and its last row says where it stopped. JAX
preallocates GPU memory beside EnvPool: as CleanRL does, ``XLA_PYTHON_CLIENT_MEM_FRACTION`` is set to 0.6 unless
it is set already. The parent process imports jax only after every part has run, on the CPU, to print the table.
"""

import argparse
import importlib.util
import json
import math
import os
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parents[1]))  # ppo_eqx_bench, from a checkout (jax-free)

from ppo_eqx.presets import TPU_FRAMES_PRESET  # noqa: E402  (jax-free)
from ppo_eqx_bench.atari_games import ATARI_57  # noqa: E402

ATARI_SHAPE = (4, 84, 84)
TPU_SHAPE = tuple(TPU_FRAMES_PRESET[name] for name in ("num_envs", "num_steps", "num_minibatches"))
"""``--preset tpu``'s envs, steps and minibatches: the actor grid's first setting."""
MIN_PART_S = 20.0  # a part started with less of the budget left would only be killed


@dataclass(frozen=True)
class Settings:
    env_id: str = "Breakout-v5"
    env_only_sizes: tuple[int, ...] = (8, 16, 32, 64)
    env_only_repeats: int = 5
    num_envs: int = 8  # CleanRL's configuration: 8 envs x 128 steps, 4 minibatches, 4 epochs
    num_steps: int = 128
    num_minibatches: int = 4
    update_epochs: int = 4
    warmup: int = 3
    iterations: int = 30
    seeds: tuple[int, ...] = (4, 8)
    seeds_iterations: int = 10
    async_num_envs: int = 16  # 8 per receive x 128 steps: CleanRL's batch of 1024
    async_batch_size: int = 8
    gymnax_env_id: str = "CartPole-v1"
    gymnax_seeds: tuple[int, ...] = (1, 64)
    gymnax_timesteps: int = 500_000  # an agent's; the preset's for CartPole-v1
    host_sizes: tuple[int, ...] = (8, 64)  # EnvPool's own host step, ALE's vector env, the XLA step on the CPU
    host_threads: tuple[int, ...] = (0, 2, 4, 8)  # 0: EnvPool's default (one per env, at most the cores)
    host_steps: int = 200
    # host-envs' actor threads (issue 49): (num_envs, num_steps, num_minibatches, actor_threads), one process, in
    # the order they matter: `--preset tpu`'s (64 envs at CleanRL's update density, minibatches of 256, 4 epochs; 0:
    # host-envs' default count), CleanRL's settings at 1, 2 and 4 actors, then the rest. A part stopped by its
    # limit keeps the settings it measured.
    actor_grid: tuple[tuple[int, int, int, int], ...] = (
        (*TPU_SHAPE, 0), (8, 128, 4, 1), (8, 128, 4, 2), (8, 128, 4, 4),
        (*TPU_SHAPE, 2), (*TPU_SHAPE, 8), (8, 128, 4, 8),
    )  # fmt: skip
    actor_iterations: int = 10
    atari57_games: int = 8  # the plan's first runs, measured together for atari57_measure_s
    atari57_measure_s: float = 60.0
    budget_s: float = 450.0
    quick: bool = False


FULL = Settings()
# Every part, as small as it gets: a check that the script runs, not a measurement. The XLA route's
# convolution gradients are slow on the CPU (the reason for the other routes), so the update is one epoch.
QUICK = Settings(
    env_only_sizes=(8, 16),
    env_only_repeats=2,
    num_envs=4,
    num_steps=16,
    num_minibatches=2,
    update_epochs=1,
    warmup=1,
    iterations=2,
    seeds=(2,),
    seeds_iterations=2,
    async_num_envs=4,
    async_batch_size=2,
    gymnax_seeds=(2,),  # one part: the quick run checks that it works, and CI runs it
    gymnax_timesteps=4 * 512,
    host_sizes=(8,),
    host_threads=(0, 2),
    host_steps=20,
    actor_grid=((4, 16, 2, 2),),
    actor_iterations=2,
    atari57_games=1,
    atari57_measure_s=5.0,
    budget_s=360.0,
    quick=True,
)


# --- Parts: each runs in its own process and returns its rows (or, for the environment, the header's entry).


def measured(row: dict[str, Any]) -> dict[str, Any]:
    """``row``, printed as one JSON line as soon as it is measured: the parent keeps it if the part is stopped."""
    print(json.dumps(row), flush=True)
    return row


def environment_part(settings: Settings) -> dict[str, Any]:
    import jax
    from _common import environment, matmul_rate

    from ppo_eqx import resolve_conv_impl
    from ppo_eqx_bench.host_step import cpu_topology

    device = jax.devices()[0]
    limit = (device.memory_stats() or {}).get("bytes_limit")
    return {
        **environment(None),  # each train part's row names its conv_impl
        "cpu_topology": cpu_topology(),
        "devices": [str(d) for d in jax.devices()],
        "device_kind": device.device_kind,
        "device_limit_mib": limit / 2**20 if limit else None,
        "xla_python_client_mem_fraction": os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION"),
        "matmul_gflops": matmul_rate() / 1e9,
        "auto_conv_impl": resolve_conv_impl("auto", ATARI_SHAPE),
    }


def env_only_part(settings: Settings, *, on: str = "device") -> list[dict[str, Any]]:
    """EnvPool's XLA step alone in a jitted scan, on the default device or (``on="cpu"``) the host's CPU device."""
    import jax
    from _common import pool_env_only_sps

    from ppo_eqx import PPOConfig

    rows = []
    device = jax.devices("cpu")[0] if on == "cpu" else None
    sizes = settings.env_only_sizes if on == "device" else settings.host_sizes
    for num_envs in sizes:
        name = f"env_only_{num_envs}" if on == "device" else f"env_only_cpu_{num_envs}"
        row: dict[str, Any] = {"part": name, "num_envs": num_envs, "device": str(device or jax.devices()[0])}
        try:
            config = PPOConfig(env_id=settings.env_id, num_envs=num_envs, num_steps=settings.num_steps).validate()
            start = time.perf_counter()
            row["env_steps_per_s"] = pool_env_only_sps(config, repeats=settings.env_only_repeats, device=device)
            row.update(status="ok", seconds=time.perf_counter() - start)
        except Exception as error:  # one pool size failing leaves the others measured
            row.update(status="error", error=f"{type(error).__name__}: {error}")
        rows.append(measured(row))
    return rows


def host_step_part(settings: Settings, *, library: str) -> list[dict[str, Any]]:
    """EnvPool's own host ``step`` (``library="envpool"``: at its default threads and at each of
    ``host_threads``, unpinned and pinned from core 0) or ALE's vector env, from Python with NumPy actions: how fast
    this machine's CPUs step a sync pool when no jax program is in the way."""
    from ppo_eqx_bench.host_step import ale_vector_sps, envpool_host_sps

    rows = []
    for num_envs in settings.host_sizes:
        combos = [(t, a) for t in settings.host_threads for a in (-1, 0)] if library == "envpool" else [(0, -1)]
        for threads, affinity in combos:
            name = f"{'host_step' if library == 'envpool' else 'ale_vector'}_{num_envs}_t{threads}"
            row: dict[str, Any] = {
                "part": name + ("_pinned" if affinity >= 0 else ""),
                "num_envs": num_envs,
                "num_threads": threads,
                "thread_affinity_offset": affinity,
            }
            try:
                start = time.perf_counter()
                if library == "envpool":
                    sps = envpool_host_sps(
                        settings.env_id, num_envs, num_threads=threads, affinity=affinity, steps=settings.host_steps
                    )
                else:
                    sps = ale_vector_sps(settings.env_id, num_envs, steps=settings.host_steps)
                row.update(env_steps_per_s=sps, status="ok", seconds=time.perf_counter() - start)
            except Exception as error:  # one setting failing leaves the others measured
                row.update(status="error", error=f"{type(error).__name__}: {error}")
            rows.append(measured(row))
    return rows


def script_part(settings: Settings, *, script: str, args: list[str]) -> dict[str, Any]:
    """Another bench script run whole in this part's process (its JSON read back): CleanRL's own script beside
    ``ppo-eqx train`` (``cleanrl_side_by_side.py``), the 57-game plan measured for a minute (``atari57.py``)."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="device_check_") as tmp:
        out = Path(tmp) / "result.json"
        args = [a.replace("{tmp}", tmp) for a in args]
        at = args.index("--") if "--" in args else len(args)  # what follows "--" is the script's trainer's
        command = [sys.executable, str(HERE.parent / script), *args[:at], "--json", str(out), *args[at:]]
        done = subprocess.run(command, text=True, capture_output=True)
        if done.returncode != 0 or not out.exists():
            tail = " | ".join(done.stderr.strip().splitlines()[-4:])
            raise RuntimeError(f"{script} exited {done.returncode}: {tail[-1200:]}")
        return json.loads(out.read_text())


def train_part(
    settings: Settings, *, conv_impl: str, num_seeds: int = 1, async_batch_size: int = 0, rollout_on: str = "device"
) -> dict:
    """Compile, warm up, then time ``trainer.dispatch().metrics``; only the public Trainer API is used."""
    import jax
    import numpy as np
    from _common import device_memory_mib, peak_rss_mib

    from ppo_eqx import PPOConfig, Trainer

    num_envs = settings.async_num_envs if async_batch_size else settings.num_envs
    iterations = settings.seeds_iterations if num_seeds > 1 else settings.iterations
    agent_batch = (async_batch_size or num_envs) * settings.num_steps
    config = PPOConfig(
        env_id=settings.env_id,
        num_envs=num_envs,
        num_steps=settings.num_steps,
        num_minibatches=settings.num_minibatches,
        update_epochs=settings.update_epochs,
        conv_impl=conv_impl,
        num_seeds=num_seeds,
        async_batch_size=async_batch_size,
        rollout_on=rollout_on,
        total_timesteps=agent_batch * (settings.warmup + iterations),  # counts each agent's steps
        checkpoint_every=10**9,  # one segment of envs: nothing is remade or recompiled while timing
    ).validate()
    start = time.perf_counter()
    trainer = Trainer(config)
    setup_s = time.perf_counter() - start
    try:
        compile_s = trainer.compile()
        for _ in range(settings.warmup):
            jax.block_until_ready(trainer.dispatch().metrics)
        times, metrics = [], {}
        for _ in range(iterations):
            start = time.perf_counter()
            metrics = jax.block_until_ready(trainer.dispatch().metrics)
            times.append(time.perf_counter() - start)
    finally:
        trainer.close()
    steps_per_s = num_seeds * config.batch_size * iterations / sum(times)
    per_agent = steps_per_s / num_seeds
    return {
        "env_id": config.env_id,
        "num_envs": num_envs,
        "num_steps": config.num_steps,
        "num_minibatches": config.num_minibatches,
        "update_epochs": config.update_epochs,
        "num_seeds": num_seeds,
        "async_batch_size": async_batch_size,
        "conv_impl": conv_impl,
        "rollout_on": rollout_on,
        "setup_s": setup_s,
        "compile_s": compile_s,
        "iterations_timed": iterations,
        "median_iteration_s": statistics.median(times),
        "env_steps_per_s": steps_per_s,
        "env_steps_per_s_per_agent": per_agent,
        "projected_10M_min": (1e7 / per_agent + compile_s) / 60,
        "device_peak_mib": device_memory_mib(),
        "peak_rss_mib": peak_rss_mib(),
        "loss": float(np.mean(metrics["loss"])),
    }


def host_envs_grid_part(settings: Settings) -> list[dict[str, Any]]:
    """``--rollout-on host-envs`` for each of ``settings.actor_grid`` in one process (one start of the device): env
    steps/s of the timed iterations after warm-up, and the share of each iteration that the host loop's rollout
    took (the rest waits for the update on the device)."""
    import jax
    from _common import device_memory_mib

    from ppo_eqx import PPOConfig, Trainer

    rows = []
    for num_envs, num_steps, num_minibatches, actors in settings.actor_grid:
        row: dict[str, Any] = {
            "part": f"host_envs_{num_envs}x{num_steps}_actors_{actors or 'default'}",
            "num_envs": num_envs,
            "num_steps": num_steps,
            "num_minibatches": num_minibatches,
            "actor_threads": actors,
        }
        try:
            config = PPOConfig(
                env_id=settings.env_id, num_envs=num_envs, num_steps=num_steps, num_minibatches=num_minibatches,
                update_epochs=settings.update_epochs, rollout_on="host-envs", actor_threads=actors,
                total_timesteps=num_envs * num_steps * (settings.warmup + settings.actor_iterations),
                checkpoint_every=10**9,
            ).validate()  # fmt: skip
            start = time.perf_counter()
            with Trainer(config) as trainer:
                row["actor_threads_used"] = trainer.placement.rollout_record()["actor_threads"]
                compile_s = trainer.compile()
                for _ in range(settings.warmup):
                    jax.block_until_ready(trainer.dispatch().metrics)
                rollouts, totals = [], []
                for _ in range(settings.actor_iterations):
                    start = time.perf_counter()
                    dispatched = trainer.dispatch()
                    rollouts.append(time.perf_counter() - start)
                    jax.block_until_ready(dispatched.metrics)
                    totals.append(time.perf_counter() - start)
            row.update(
                status="ok",
                compile_s=compile_s,
                env_steps_per_s=config.batch_size * len(totals) / sum(totals),
                rollout_share=sum(rollouts) / sum(totals),
                median_iteration_s=statistics.median(totals),
                device_peak_mib=device_memory_mib(),
            )
        except Exception as error:  # one setting failing leaves the others measured
            row.update(status="error", error=f"{type(error).__name__}: {error}")
        rows.append(measured(row))
    return rows


def gymnax_part(settings: Settings, *, num_seeds: int) -> dict[str, Any]:
    """The env in the program: ``settings.gymnax_env_id`` with its preset, the whole run as one dispatch."""
    import jax
    import numpy as np
    from _common import device_memory_mib, peak_rss_mib

    from ppo_eqx import PPOConfig, Trainer

    config = PPOConfig.for_task(
        settings.gymnax_env_id, "gymnax", total_timesteps=settings.gymnax_timesteps, num_seeds=num_seeds
    )
    config = replace(config, iterations_per_dispatch=config.num_iterations, checkpoint_every=config.num_iterations)
    start = time.perf_counter()
    with Trainer(config.validate()) as trainer:
        setup_s = time.perf_counter() - start
        compile_s = trainer.compile()
        start = time.perf_counter()
        metrics = jax.block_until_ready(trainer.dispatch().metrics)
        run_s = time.perf_counter() - start
    returns = np.asarray(metrics["episodic_return"]).reshape(config.num_iterations, -1)[-1]  # each agent's last
    steps = num_seeds * config.batch_size * config.num_iterations
    return {
        "env_id": config.env_id,
        "env_backend": "gymnax",
        "num_envs": config.num_envs,
        "num_steps": config.num_steps,
        "num_seeds": num_seeds,
        "iterations": config.num_iterations,
        "setup_s": setup_s,
        "compile_s": compile_s,
        "run_s": run_s,
        "wall_s": compile_s + run_s,
        "env_steps_per_s": steps / run_s,
        "env_steps_per_s_per_agent": steps / run_s / num_seeds,
        "final_return_mean": float(np.nanmean(returns)),
        "device_peak_mib": device_memory_mib(),
        "peak_rss_mib": peak_rss_mib(),
    }


def run_part(kind: str, settings: Settings, options: dict[str, Any]) -> Any:
    if kind == "environment":
        return environment_part(settings)
    if kind == "env_only":
        return env_only_part(settings, **options)
    if kind == "host_step":
        return host_step_part(settings, **options)
    if kind == "script":
        return script_part(settings, **options)
    if kind == "train":
        return train_part(settings, **options)
    if kind == "gymnax":
        return gymnax_part(settings, **options)
    if kind == "host_envs_grid":
        return host_envs_grid_part(settings)
    raise ValueError(f"unknown part {kind!r}")


# --- The parent: runs the parts one after another in fresh processes, within the budget.


PROGRAM_PLATFORMS = ("cpu", "gpu")
"""Where a program can hold EnvPool's XLA step (``ppo_eqx.core.envs.envpool``'s ``compiles_on``): elsewhere (a TPU)
the parts that compile it are recorded as ``cannot-run``, not tried."""


def measurement_parts(
    settings: Settings, environment: dict[str, Any], peers: dict[str, Any]
) -> list[tuple[str, str, dict[str, Any]]]:
    """(name, kind, options) of every part after the environment, in the order they run: first where the env
    step's time goes (EnvPool's host step, its XLA step on the device and on the host's CPU, ALE's), then
    CleanRL's configuration on each placement of the rollout, host-envs' actor threads, CleanRL's own script beside
    it and the 57-game plan, then the rest (the budget skips what no longer fits, from the end). On a device whose
    programs cannot hold EnvPool's XLA step, the parts that compile it are of kind ``cannot`` (recorded with why)."""
    auto = environment.get("auto_conv_impl", "xla")
    backend = environment.get("backend", "cpu")
    in_program = backend in PROGRAM_PLATFORMS
    cannot = {"note": f"EnvPool's XLA step is a CPU and CUDA call: a {backend.upper()} program cannot hold it"}
    parts: list[tuple[str, str, dict[str, Any]]] = [("host_step", "host_step", {"library": "envpool"})]
    parts += [("env_only", "env_only", {}) if in_program else ("env_only", "cannot", cannot)]
    parts.append(("env_only_cpu", "env_only", {"on": "cpu"}))
    if importlib.util.find_spec("ale_py") is not None:
        parts.append(("ale_vector", "host_step", {"library": "ale"}))
    parts += [
        (f"train_{auto}", "train", {"conv_impl": auto}) if in_program else (f"train_{auto}", "cannot", cannot),
        # The host's rollout takes the CPU's own route for "auto" (matmul, or the kernel where it is built).
        (f"train_{auto}_rollout_on_host", "train", {"conv_impl": "auto", "rollout_on": "host"}),
        (f"train_{auto}_rollout_on_host_envs", "train", {"conv_impl": auto, "rollout_on": "host-envs"}),
        ("host_envs_actors", "host_envs_grid", {}),
    ]
    if peers.get("cleanrl_script") and not in_program:
        parts.append(("cleanrl_side_by_side", "cannot", {"note": "CleanRL's script compiles EnvPool's XLA step"}))
    elif peers.get("cleanrl_script"):
        args = ["--cleanrl-script", peers["cleanrl_script"], "--cleanrl-python", peers["cleanrl_python"]]
        args += ["--iterations", str(max(3, settings.warmup + settings.iterations // 3)), "--conv-impl", auto]
        args += [
            "--env-id",
            settings.env_id,
            "--num-envs",
            str(settings.num_envs),
            "--num-steps",
            str(settings.num_steps),
        ]
        parts.append(("cleanrl_side_by_side", "script", {"script": "cleanrl_side_by_side.py", "args": args}))
    games = ["--games", *list(ATARI_57)[: settings.atari57_games], "--seeds", "1", "--sweep-dir", "{tmp}/sweep"]
    measure = ["--jobs", "auto", "--measure-s", str(settings.atari57_measure_s)]
    if settings.num_envs < FULL.num_envs:
        measure += ["--", "--num-envs", str(settings.num_envs), "--num-steps", str(settings.num_steps)]
    parts.append(("atari57_plan", "script", {"script": "atari57.py", "args": games + measure}))
    if settings.quick:  # the parts below have run on a GPU machine before, and each has its own tests on a CPU
        return parts
    routes = [route for route in ("xla", "matmul", "kernel") if route != auto]
    if not (backend == "cpu" and auto == "kernel"):
        routes.remove("kernel")  # the CPU kernel exists on the CPU only, and only where it builds
    device_parts = [(f"train_{route}", "train", {"conv_impl": route}) for route in routes]
    device_parts.append(("async", "train", {"conv_impl": auto, "async_batch_size": settings.async_batch_size}))
    device_parts += [(f"seeds_{s}", "train", {"conv_impl": auto, "num_seeds": s}) for s in settings.seeds]
    parts += device_parts if in_program else [(name, "cannot", cannot) for name, _, _ in device_parts]
    if importlib.util.find_spec("gymnax") is not None:
        name = settings.gymnax_env_id.split("-")[0].lower()
        parts += [(f"gymnax_{name}_{s}", "gymnax", {"num_seeds": s}) for s in settings.gymnax_seeds]
    return parts


class PartStopped(RuntimeError):
    """A part stopped by its limit; ``rows``: those it printed as measured (``measured``) before."""

    def __init__(self, message: str, rows: list[dict[str, Any]]):
        super().__init__(message)
        self.rows = rows


def spawn_part(kind: str, settings: Settings, options: dict[str, Any], timeout_s: float) -> tuple[Any, float]:
    """Run one part in a fresh process; its result (the last line of its stdout, JSON) and its seconds. Past
    ``timeout_s``, ``PartStopped`` with the rows the part printed before."""
    command = [sys.executable, str(HERE), "--part", kind, "--settings", json.dumps(asdict(settings))]
    command += ["--options", json.dumps(options)]
    start = time.perf_counter()
    # Parts that never use the accelerator run without opening it (a TPU's start costs 15 s a process).
    host_only = kind == "host_step" or (kind == "env_only" and options.get("on") == "cpu")
    env = {**os.environ, "JAX_PLATFORMS": "cpu"} if host_only else None
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired as stopped:
        out = stopped.stdout or b""  # bytes whatever ``text`` says (subprocess.run's documentation)
        printed = (out.decode(errors="replace") if isinstance(out, bytes) else out).splitlines()
        rows = [json.loads(line) for line in printed if line.startswith("{") and line.endswith("}")]
        raise PartStopped(f"timed out after {timeout_s:.0f} s, {len(rows)} rows measured", rows) from None
    seconds = time.perf_counter() - start
    lines = [line for line in done.stdout.splitlines() if line.startswith(("{", "["))]
    if done.returncode != 0 or not lines:
        tail = " | ".join(done.stderr.strip().splitlines()[-6:])
        raise RuntimeError(f"exit status {done.returncode}: {tail[-1500:]}")
    return json.loads(lines[-1]), seconds


def has_only_finite_numbers(row: dict[str, Any]) -> bool:
    return all(math.isfinite(v) for v in row.values() if isinstance(v, float))


def run_parts(
    settings: Settings, part_timeout_s: float, peers: dict[str, Any]
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Every part, one after another, each in a fresh process: the environment and the rows of the table."""
    deadline = time.perf_counter() + settings.budget_s

    def attempt(name: str, kind: str, options: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        """The part's result (None unless it ran) and its status row."""
        if kind == "cannot":
            print(f"# {name}: cannot run here: {options['note']}", flush=True)
            return None, {"part": name, "status": "cannot-run", "note": options["note"]}
        left = deadline - time.perf_counter()
        if left < MIN_PART_S:
            note = f"skipped: {left:.0f} s of the {settings.budget_s:.0f} s budget left"
            print(f"# {name}: {note}", flush=True)
            return None, {"part": name, "status": "skipped", "note": note}
        try:
            result, seconds = spawn_part(kind, settings, options, min(left, part_timeout_s))
        except PartStopped as error:
            print(f"# {name}: error: {error}", flush=True)
            return error.rows or None, {"part": name, "status": "error", "error": str(error)}
        except RuntimeError as error:
            print(f"# {name}: error: {error}", flush=True)
            return None, {"part": name, "status": "error", "error": str(error)}
        print(f"# {name}: {seconds:.1f} s", flush=True)
        return result, {"part": name, "status": "ok", "seconds": seconds}

    environment, env_row = attempt("environment", "environment", {})
    environment = env_row if environment is None else {**environment, "seconds": env_row["seconds"]}
    rows = []
    for name, kind, options in measurement_parts(settings, environment, peers):
        result, row = attempt(name, kind, options)
        if result is None:
            kept = [row]
        elif kind in ("env_only", "host_step", "host_envs_grid"):
            # One row per pool size (and threads), each with its own status; a part stopped keeps those measured.
            kept = result if row["status"] == "ok" else [*result, row]
        elif kind == "script":
            kept = [{**row, **script_summary(result)}]
        else:
            kept = [{**row, **result}]
        for row in kept:
            if row["status"] == "ok" and not has_only_finite_numbers(row):
                row.update(status="error", error="a measured number is not finite")
        rows += kept
    return environment, rows


def auto_rollout_on(environment: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The placement of the rollout that ``rollout_on="auto"`` should take on this machine: the fastest of CleanRL's
    configuration's train parts (each placement on the route "auto" chose), with the rates it chose from. The
    device kind is the key of ``ppo_eqx.host.placement.MEASURED_ROLLOUT``, where a measured choice is written."""
    auto = environment.get("auto_conv_impl", "xla")
    rates = {
        row["rollout_on"]: row["env_steps_per_s"]
        for row in rows
        if row.get("status") == "ok" and row["part"].startswith(f"train_{auto}") and "env_steps_per_s" in row
    }
    choice = max(rates, key=rates.__getitem__) if rates else None
    return {"device_kind": environment.get("device_kind"), "choice": choice, "env_steps_per_s": rates}


def script_summary(result: dict[str, Any]) -> dict[str, Any]:
    """A script part's row: its headline figures (env steps/s of each program, or the plan's aggregate), and its
    whole output under ``result``."""
    rows = result.get("rows", [])
    summary: dict[str, Any] = {}
    for row in rows:
        if "program" in row:  # cleanrl_side_by_side.py: one row per program
            summary[f"{row['program']}_steady_sps"] = row.get("steady_sps")
    if "aggregate_env_steps_per_s" in result.get("header", {}):  # atari57.py --measure-s
        summary["env_steps_per_s"] = result["header"]["aggregate_env_steps_per_s"]
        summary["runs_at_once"] = result["header"].get("jobs")
    return {**summary, "result": result}


def main(argv: list[str] | None = None) -> None:
    # Before any jax import, in this process or a part's (each part imports jax when it runs).
    os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.6")
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny settings, for a CPU: a minute or two")
    parser.add_argument("--budget-s", type=float, default=None, help="the whole run's limit (default: 450, 360)")
    parser.add_argument("--part-timeout-s", type=float, default=180.0, help="one part's limit (default: 180)")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    parser.add_argument(
        "--cleanrl-script", type=Path, default=None,
        help="CleanRL's ppo_atari_envpool_xla_jax.py, patched for EnvPool 1.2 (docs/performance.md): run beside "
        "ppo-eqx train in the same call (cleanrl_side_by_side.py); without it that part is skipped",
    )  # fmt: skip
    parser.add_argument("--cleanrl-python", type=Path, default=Path(sys.executable), help="the python that runs it")
    parser.add_argument("--part", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--settings", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--options", default="{}", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.part is not None:  # inside a part's process
        settings = Settings(**{k: tuple(v) if isinstance(v, list) else v for k, v in json.loads(args.settings).items()})
        print(json.dumps(run_part(args.part, settings, json.loads(args.options))), flush=True)
        return

    settings = QUICK if args.quick else FULL
    if args.budget_s is not None:
        settings = replace(settings, budget_s=args.budget_s)
    start = time.perf_counter()
    peers = {
        "cleanrl_script": str(args.cleanrl_script.resolve()) if args.cleanrl_script else None,
        "cleanrl_python": str(args.cleanrl_python),
    }
    environment, rows = run_parts(settings, args.part_timeout_s, peers)
    header = {
        "command": " ".join([Path(sys.argv[0]).name, *(sys.argv[1:] if argv is None else argv)]),
        "auto_rollout_on": auto_rollout_on(environment, rows),
        "quick": args.quick,
        "settings": asdict(settings),
        "environment": environment,
        "peers": peers,
        "parts": [row["part"] for row in rows],
        "total_s": time.perf_counter() - start,
    }
    os.environ["JAX_PLATFORMS"] = "cpu"  # every part has run: the table needs no accelerator
    from _common import write_results

    write_results(rows, header, args.json)


if __name__ == "__main__":
    main()
