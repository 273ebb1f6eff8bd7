"""The recurrent policy (``--network lstm``, issue 51) beside the feedforward one: speed and learning.

``speed``: env steps/s of the training loop with each network, alternated round by round in one process (a ratio
between them is measured side by side): CartPole-v1 on EnvPool with CleanRL's ppo.py preset, and Breakout-v5 with
CleanRL's Atari settings::

    python bench/recurrent.py speed --rounds 3 --json bench/results/recurrent_speed.json

``learn``: returns on tasks that need memory, each network over ``--seeds``, the mean episodic return of the last
tenth of each run: the cue task (``ppo_eqx_bench/memory_env.py``: a cue seen at an episode's first step, acted on
``delay`` steps later; optimum 1, chance 0.5) and Breakout-MinAtar with frames hidden (``Flicker``: each observation
blanked with probability 0.5, gymnax-blines' preset), which a feedforward policy can only guess through::

    python bench/recurrent.py learn --task cue --steps 200000 --seeds 1 2 3 4 5 --json bench/results/recurrent_cue.json
    python bench/recurrent.py learn --task flicker-breakout --steps 3000000 --seeds 1 2 \\
        --json bench/results/recurrent_flicker_breakout.json
"""

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parents[1]))  # ppo_eqx_bench, from a checkout

import jax  # noqa: E402
import numpy as np  # noqa: E402
from _common import environment, write_results  # noqa: E402

import ppo_eqx  # noqa: E402
from ppo_eqx_bench.memory_env import Cue, Flicker  # noqa: E402

NETWORKS = ("feedforward", "lstm")
CUE = {"num_envs": 16, "num_steps": 64}
"""The cue task's settings beside the vector preset: 16 envs in minibatches of 4 sequences each (the preset's 4 envs
give minibatches of one sequence, after which the LSTM learned the task and lost it again for one seed of three)."""
SPEED_TASKS: dict[str, dict[str, Any]] = {
    "CartPole-v1": {},  # the vector preset: 4 envs x 128 steps
    "Breakout-v5": {"num_envs": 8, "num_steps": 128},  # CleanRL's settings
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    speed = sub.add_parser("speed", help="env steps/s of each network, alternated")
    speed.add_argument("--rounds", type=int, default=3)
    speed.add_argument("--iterations", type=int, default=6, help="timed iterations a round (after 2 of warm-up)")
    speed.add_argument("--tasks", nargs="+", choices=sorted(SPEED_TASKS), default=list(SPEED_TASKS))
    learn = sub.add_parser("learn", help="returns of each network on a task that needs memory")
    learn.add_argument("--task", choices=("cue", "flicker-breakout"), default="cue")
    learn.add_argument("--steps", type=int, default=200_000, help="env steps of each run")
    learn.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    learn.add_argument("--delay", type=int, default=8, help="the cue task's steps between cue and decision")
    for command in (speed, learn):
        command.add_argument("--json", type=Path, default=None, help="also write the results here")
    return parser.parse_args(argv)


def timed_loop(config: ppo_eqx.PPOConfig, iterations: int) -> float:
    """Env steps/s of ``iterations`` of ``config``'s loop after a compile and two of warm-up."""
    with ppo_eqx.Trainer(config) as trainer:
        trainer.compile()
        for _ in range(2):
            jax.block_until_ready(trainer.dispatch().metrics)
        start = time.perf_counter()
        for _ in range(iterations):
            jax.block_until_ready(trainer.dispatch().metrics)
        return config.batch_size * iterations / (time.perf_counter() - start)


def speed(args: argparse.Namespace) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    rows = []
    for task in args.tasks:
        for round_ in range(1, args.rounds + 1):
            for network in NETWORKS:
                steps = (2 + args.iterations) * 1024 * 8  # the annealing's horizon only: never reached
                config = ppo_eqx.PPOConfig.for_task(
                    task, network=network, total_timesteps=steps, checkpoint_every=10**6, **SPEED_TASKS[task]
                )
                sps = timed_loop(config, args.iterations)
                rows.append({"task": task, "round": round_, "network": network, "env_steps_per_s": sps})
                print(f"# {task} round {round_} {network}: {sps:,.0f} env steps/s", flush=True)
    ratios = {}
    for task in args.tasks:
        each = [
            lstm["env_steps_per_s"] / ff["env_steps_per_s"]
            for ff, lstm in zip(*(_of(rows, task, network) for network in NETWORKS), strict=True)
        ]
        ratios[task] = {"median": statistics.median(each), "min": min(each), "max": max(each)}
    return rows, {"lstm_over_feedforward": ratios}


def _of(rows: list[dict[str, Any]], task: str, network: str) -> list[dict[str, Any]]:
    return [row for row in rows if row["task"] == task and row["network"] == network]


def learn(args: argparse.Namespace) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    rows = []
    for network in NETWORKS:
        for seed in args.seeds:
            env = Cue(args.delay) if args.task == "cue" else Flicker.breakout()
            settings = CUE if args.task == "cue" else {}
            config = ppo_eqx.PPOConfig.for_task(env, network=network, seed=seed, total_timesteps=args.steps, **settings)
            start = time.perf_counter()
            with ppo_eqx.Trainer(config, env=env) as trainer:
                returns = [record["episodic_return"] for record in ppo_eqx.run(trainer)]
            tail = returns[-max(1, len(returns) // 10) :]
            row = {
                "task": args.task,
                "network": network,
                "seed": seed,
                "steps": config.num_iterations * config.batch_size,
                "last_tenth_return": float(np.nanmean(tail)),
                "curve": [float(r) for r in returns],
                "seconds": time.perf_counter() - start,
            }
            rows.append(row)
            print(f"# {args.task} {network} seed {seed}: {row['last_tenth_return']:.3f} in {row['seconds']:.0f} s")
    summary = {}
    for network in NETWORKS:
        finals = [row["last_tenth_return"] for row in rows if row["network"] == network]
        summary[network] = {"mean": float(np.mean(finals)), "std": float(np.std(finals)), "min": min(finals)}
    return rows, {"last_tenth_return": summary}


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    rows, summary = speed(args) if args.command == "speed" else learn(args)
    header = {"command": " ".join(sys.argv), "environment": environment(None), **summary}
    write_results(rows, header, args.json)


if __name__ == "__main__":
    main()
