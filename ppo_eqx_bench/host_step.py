"""EnvPool's (and ALE's) own host step, timed from Python with NumPy actions and no jax: how fast a machine's
CPUs step a sync pool when nothing else is in the way (``bench/device_check.py``'s ``host_step`` and
``ale_vector`` parts), what the machine's CPUs are (``cpu_topology``), and how long making EnvPool's pools stops the
process's other Python threads (``envpool_make_stall``: the trainer makes the next segment's envs on a thread of
its own while the actors step).

The envs are made with CleanRL's options (``episodic_life``, ``reward_clip``, EnvPool's defaults for the rest:
``ppo_eqx.core.envs.envpool``), seeded ``seed + i``; actions are uniform random.
"""

import os
import platform
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np


def _timed_steps(step: Any, num_envs: int, num_actions: int, steps: int, warmup: int) -> float:
    """Env steps per second of ``step(actions)`` over ``steps`` calls after ``warmup`` untimed ones."""
    rng = np.random.default_rng(0)
    actions = rng.integers(0, num_actions, size=(warmup + steps, num_envs), dtype=np.int32)
    for i in range(warmup):
        step(actions[i])
    start = time.perf_counter()
    for i in range(warmup, warmup + steps):
        step(actions[i])
    return num_envs * steps / (time.perf_counter() - start)


def _envpool(env_id: str, num_envs: int, *, seed: int, **options: Any) -> Any:
    """An EnvPool pool of ``num_envs`` envs seeded ``seed + i``, with CleanRL's options and ``options``."""
    import envpool

    return envpool.make(
        env_id, env_type="gymnasium", num_envs=num_envs, seed=seed, episodic_life=True, reward_clip=True, **options
    )


def envpool_host_sps(
    env_id: str, num_envs: int, *, num_threads: int = 0, affinity: int = -1, steps: int = 200, warmup: int = 20
) -> float:
    """Env steps per second of EnvPool's ``step`` (a sync pool: every env steps at once) from Python."""
    pool = _envpool(env_id, num_envs, seed=1, num_threads=num_threads, thread_affinity_offset=affinity)
    try:
        pool.reset()
        return _timed_steps(pool.step, num_envs, int(pool.action_space.n), steps, warmup)
    finally:
        pool.close()


def stall_while(work: Callable[[], Any], tick_s: float = 0.001) -> dict[str, float]:
    """Run ``work()`` while another thread sleeps ``tick_s`` at a time: the seconds ``work`` took, the seconds that
    thread was stopped (the waits longer than 10 ms, summed: ``work`` held the GIL) and the longest wait."""
    waits: list[float] = []
    done = threading.Event()

    def tick() -> None:
        last = time.perf_counter()
        while not done.is_set():
            time.sleep(tick_s)
            now = time.perf_counter()
            waits.append(now - last)
            last = now

    ticker = threading.Thread(target=tick, daemon=True)
    ticker.start()
    time.sleep(50 * tick_s)  # the ticker under way before the work starts
    start = time.perf_counter()
    try:
        work()
    finally:
        took = time.perf_counter() - start
        done.set()
        ticker.join()
    return {"work_s": took, "stalled_s": sum(w for w in waits if w > 0.01), "longest_s": max(waits, default=0.0)}


def envpool_make_stall(env_id: str, pools: int, envs_per_pool: int) -> dict[str, float]:
    """``stall_while`` of making ``pools`` EnvPool pools of ``envs_per_pool`` envs each (as host-envs' actors hold
    them); the pools are closed after."""
    made: list[Any] = []

    def make() -> None:
        for k in range(pools):
            made.append(_envpool(env_id, envs_per_pool, seed=1 + k * envs_per_pool))

    try:
        return stall_while(make)
    finally:
        for pool in made:
            pool.close()


def ale_vector_sps(env_id: str, num_envs: int, *, num_threads: int = 0, steps: int = 200, warmup: int = 20) -> float:
    """Env steps per second of ALE's own vector env (``ale_py.vector_env.AtariVectorEnv``, EnvPool's design)."""
    from ale_py.vector_env import AtariVectorEnv

    game = "".join("_" + c.lower() if c.isupper() else c for c in env_id.split("-")[0]).lstrip("_")
    env = AtariVectorEnv(game, num_envs, num_threads=num_threads, episodic_life=True, reward_clipping=True)
    try:
        env.reset(seed=np.arange(1, num_envs + 1))
        return _timed_steps(env.step, num_envs, int(env.single_action_space.n), steps, warmup)  # pyright: ignore[reportAttributeAccessIssue]
    finally:
        env.close()


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def cpu_topology() -> dict[str, Any]:
    """What this machine's CPUs are, as the kernel and ``lscpu`` say: threads per core, cores per socket,
    sockets, NUMA nodes, ``nproc``, the CPUs this process may run on (its affinity), the cgroup's CPU limit
    (``cpu.max``: quota and period in microseconds; v1's ``cfs_quota_us``/``cfs_period_us``) and the kernel."""
    lscpu: dict[str, str] = {}
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10, check=False).stdout
        for line in text.splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("Model name", "Thread(s) per core", "Core(s) per socket", "Socket(s)", "NUMA node(s)"):
                lscpu[key.strip()] = value.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    affinity = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    quota = _read("/sys/fs/cgroup/cpu.max")
    if quota is None:
        v1 = (_read("/sys/fs/cgroup/cpu/cpu.cfs_quota_us"), _read("/sys/fs/cgroup/cpu/cpu.cfs_period_us"))
        quota = None if None in v1 else f"{v1[0]} {v1[1]}"
    return {
        "lscpu": lscpu,
        "nproc": os.cpu_count(),
        "affinity_cpus": len(affinity),
        "affinity": _ranges(affinity),
        "cgroup_cpu_max": quota,
        "kernel": platform.release(),
    }


def _ranges(cpus: list[int]) -> str:
    """``[0, 1, 2, 5]`` as ``0-2,5``."""
    parts: list[str] = []
    for cpu in cpus:
        if parts and parts[-1].split("-")[-1] == str(cpu - 1):
            parts[-1] = f"{parts[-1].split('-')[0]}-{cpu}"
        else:
            parts.append(str(cpu))
    return ",".join(parts)
