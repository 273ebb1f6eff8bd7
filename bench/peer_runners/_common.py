"""What both peer runners share: the task's settings, the six-to-five-value step adapter, timing and the report.

Run by a peer's own Python (its venv), never by ppo_eqx's: this module imports jax, numpy and gymnax only.
"""

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import numpy as np

TASKS: dict[str, dict[str, Any]] = {
    # CleanRL's ppo.py (Args of cleanrl/ppo.py): 976 iterations of 4 x 128 = 499,712 steps.
    "cartpole": {
        "env_id": "CartPole-v1",
        "num_envs": 4,
        "num_steps": 128,
        "num_iterations": 976,
        "num_minibatches": 4,
        "update_epochs": 4,
        "learning_rate": 2.5e-4,
        "anneal_lr": True,
        "gamma": 0.99,
        "gae_lambda": 0.95,
        "clip_coef": 0.2,
        "ent_coef": 0.01,
        "vf_coef": 0.5,
        "max_grad_norm": 0.5,
        "hidden": (64, 64),
        "activation": "tanh",
        "target_return": 475.0,
    },
    # gymnax-blines' agents/Breakout-MinAtar/ppo.yaml: 64 envs x 128 steps, 8 minibatches, 4 epochs, constant
    # lr 5e-4 (its warm-up goes from 5e-4 to 5e-4), gamma 0.999, an MLP of 2 x 256 ReLU on the flattened grid.
    # The number of iterations is set by --num-iterations (10M steps is 1220; a CPU bench runs fewer).
    "breakout": {
        "env_id": "Breakout-MinAtar",
        "num_envs": 64,
        "num_steps": 128,
        "num_iterations": 1220,
        "num_minibatches": 8,
        "update_epochs": 4,
        "learning_rate": 5e-4,
        "anneal_lr": False,
        "gamma": 0.999,
        "gae_lambda": 0.95,
        "clip_coef": 0.2,
        "ent_coef": 0.01,
        "vf_coef": 0.5,
        "max_grad_norm": 0.5,
        "hidden": (256, 256),
        "activation": "relu",
        "target_return": None,
    },
}


def parse_args(description: str, peer_path_help: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--task", choices=sorted(TASKS), required=True)
    parser.add_argument("--num-agents", type=int, default=1, help="agents (seeds) vmapped in one program")
    parser.add_argument("--num-iterations", type=int, default=None, help="override the task's iterations")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--peer-path", type=Path, default=None, help=peer_path_help)
    parser.add_argument("--out", type=Path, required=True, help="write the JSON result here")
    args = parser.parse_args()
    if args.num_agents < 1:
        parser.error(f"--num-agents={args.num_agents}; allowed: 1 or more")
    return args


def task_settings(args: argparse.Namespace) -> dict[str, Any]:
    settings = dict(TASKS[args.task])
    if args.num_iterations is not None:
        settings["num_iterations"] = args.num_iterations
    settings["total_timesteps"] = settings["num_iterations"] * settings["num_envs"] * settings["num_steps"]
    return settings


class FiveValueStep:
    """A gymnax 1.0 env with the pre-1.0 step: ``(obs, state, reward, terminated | truncated, info)``.

    ``info`` keeps only what the wrapper above it adds: gymnax 1.0's ``final_observation`` is one observation per
    env and step, which a peer that stacks ``info`` over the whole run (PureJaxRL) would keep in memory.
    """

    def __init__(self, env: Any):
        self._env = env

    def __getattr__(self, name: str) -> Any:
        if name == "_env":  # not set yet (copy.deepcopy builds the object without __init__)
            raise AttributeError(name)
        return getattr(self._env, name)

    def __deepcopy__(self, memo: dict) -> "FiveValueStep":
        return self  # holds no state (rejax deep-copies its config, env included)

    def reset(self, key: Any, params: Any = None) -> tuple[Any, Any]:
        return self._env.reset(key, params)

    def step(self, key: Any, state: Any, action: Any, params: Any = None) -> tuple[Any, Any, Any, Any, dict]:
        obs, state, reward, terminated, truncated, info = self._env.step(key, state, action, params)
        kept = {k: v for k, v in info.items() if k not in ("final_observation", "discount", "terminated", "truncated")}
        return obs, state, reward, terminated | truncated, kept


def timed_run(program: Callable, *inputs: Any) -> tuple[Any, float, float]:
    """``jax.jit(program)`` compiled (seconds timed) then run to completion (seconds timed)."""
    start = time.perf_counter()
    compiled = jax.jit(program).lower(*inputs).compile()
    compiled_at = time.perf_counter()
    out = jax.block_until_ready(compiled(*inputs))
    return out, compiled_at - start, time.perf_counter() - compiled_at


def episodic_returns(last_returns: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """CleanRL's ``episodic_return`` per agent and iteration: the mean over envs of each env's last finished
    episode's return at the iteration's end, NaN until one has finished. Both ``[A, I, N]``; result ``[A, I]``."""
    summed = np.where(valid, last_returns, 0.0).sum(-1)
    count = valid.sum(-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(count > 0, summed / np.maximum(count, 1), np.nan)


def report(
    peer: str,
    args: argparse.Namespace,
    settings: dict[str, Any],
    returns: np.ndarray,
    compile_s: float,
    run_s: float,
    process_start: float,
    notes: list[str],
) -> None:
    """Write the JSON result: timings, the return curve (mean over agents), final returns, time to the target.

    Time to the target return is ``compile_s + run_s * i / I`` for the first iteration ``i`` (1-based) whose
    ``episodic_return`` reaches it: the run is one program, so its iterations take equal time.
    """
    num_agents, num_iterations = returns.shape
    steps_per_iteration = settings["num_envs"] * settings["num_steps"]
    target = settings["target_return"]
    first: list[int | None] = []
    if target is not None:
        for agent in returns:
            reached = np.flatnonzero(np.nan_to_num(agent, nan=-np.inf) >= target)
            first.append(int(reached[0]) + 1 if reached.size else None)
    time_to_target = [None if i is None else compile_s + run_s * i / num_iterations for i in first]
    tail = max(1, num_iterations // 20)
    result = {
        "peer": peer,
        "task": args.task,
        "env_id": settings["env_id"],
        "num_agents": num_agents,
        "seed": args.seed,
        "settings": {k: list(v) if isinstance(v, tuple) else v for k, v in settings.items()},
        "steps_per_agent": num_iterations * steps_per_iteration,
        "compile_s": compile_s,
        "run_s": run_s,
        "wall_s": compile_s + run_s,
        "process_s": time.perf_counter() - process_start,
        "final_return_per_agent": [float(x) for x in returns[:, -1]],
        "final_return_mean": float(np.nanmean(returns[:, -1])),
        "last5pct_return_mean": float(np.nanmean(returns[:, -tail:])),
        "target_return": target,
        "iteration_at_target_per_agent": first,
        "time_to_target_per_agent_s": time_to_target,
        "curve_steps": [int((i + 1) * steps_per_iteration) for i in range(num_iterations)],
        "curve_return_mean": [None if np.isnan(x) else float(x) for x in np.nanmean(returns, axis=0)],
        "jax_version": jax.__version__,
        "backend": jax.default_backend(),
        "python": sys.version.split()[0],
        "notes": notes,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(
        f"{peer} {args.task} agents={num_agents}: compile {compile_s:.1f}s run {run_s:.1f}s "
        f"final {result['final_return_mean']:.1f} at-target {first[:4]}"
    )
