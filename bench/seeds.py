"""Many agents in one program against one process per agent: env steps/s summed over the agents.

Three ways to train A agents on this machine, the S seeds K..K+S-1 of the same config, or with ``--sweep`` the
seeds of each setting of a hyperparameter grid (A = settings x S):

- one process, ``--num-seeds S`` (and ``--sweep``): one EnvPool of A x num_envs envs, the iteration vmapped over
  the agents;
- A processes one after another (one agent each, as a runner of separate runs would);
- A processes at once, sharing the CPU.

Each runs in a fresh process: compile, ``--warmup`` iterations, then ``--iterations`` timed ones; each process
reports the env steps of its timed iterations (all its agents' together) and their seconds. Reported
(``summarise``): the compile time, the env steps/s of all agents together (in one process or one after another:
all timed steps over all timed seconds; at once: the sum of each process's rate), the same per agent (what
``ppo-eqx train`` logs as an agent's ``sps``), the wall time of the whole job (process start, env creation and
compile included) and the env-only ceiling (S x num_envs envs in one pool, random actions) measured in the same
run.

    python bench/seeds.py --env-id Breakout-v5 --num-seeds 2 --json bench/results/seeds.json
    python bench/seeds.py --num-seeds 1 --sweep learning-rate=0.001,0.00025 --sweep ent-coef=0.01,0.02 \
        --json bench/results/sweep.json
"""

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env-id", default="Breakout-v5")
    parser.add_argument("--num-seeds", type=int, default=2, help="agents S (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=1, help="first seed K (default: %(default)s)")
    parser.add_argument("--num-envs", type=int, default=8, help="envs per agent (default: %(default)s)")
    parser.add_argument("--num-steps", type=int, default=64, help="(default: %(default)s)")
    parser.add_argument("--warmup", type=int, default=1, help="iterations before timing (default: %(default)s)")
    parser.add_argument("--iterations", type=int, default=3, help="timed iterations (default: %(default)s)")
    parser.add_argument(
        "--sweep", action="append", default=[], metavar="NAME=V1,V2", help="as ppo-eqx train's (repeatable)"
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--agent", type=int, default=None, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def config_of(args: argparse.Namespace, seed: int, num_seeds: int):
    """The config of all the agents (``--sweep`` included)."""
    from ppo_eqx import PPOConfig
    from ppo_eqx.sweeps import sweep_item

    batch = args.num_envs * args.num_steps
    return PPOConfig(
        env_id=args.env_id,
        num_envs=args.num_envs,
        num_steps=args.num_steps,
        total_timesteps=batch * (args.warmup + args.iterations),
        checkpoint_every=10**9,  # one segment of envs: nothing is recompiled while timing
        seed=seed,
        num_seeds=num_seeds,
        sweep=tuple(sweep_item(text) for text in args.sweep),
    ).validate()


def worker(args: argparse.Namespace) -> None:
    """One process: train every agent (or agent ``--agent`` alone), print one JSON line of timings."""
    import jax

    from ppo_eqx import Trainer

    config = config_of(args, args.seed, args.num_seeds)
    trainer = Trainer(config if args.agent is None else config.agent_configs()[args.agent])
    compile_s = trainer.compile()
    for _ in range(args.warmup):
        jax.block_until_ready(trainer.dispatch().metrics)
    start = time.perf_counter()
    for _ in range(args.iterations):
        jax.block_until_ready(trainer.dispatch().metrics)
    seconds = time.perf_counter() - start
    trainer.close()
    steps = trainer.config.num_agents * args.iterations * trainer.config.batch_size  # every agent's steps
    timings = {"compile_s": compile_s, "env_steps": steps, "seconds": seconds, "env_steps_per_s": steps / seconds}
    print(json.dumps({**timings, "conv_impl": trainer.state.model.conv_impl}))


def spawn(args: argparse.Namespace, agent: int | None = None) -> subprocess.Popen:
    """A worker that trains every agent, or agent ``agent`` alone."""
    command = [sys.executable, str(HERE), "--worker", "--env-id", args.env_id, "--seed", str(args.seed)]
    command += ["--num-seeds", str(args.num_seeds), "--num-envs", str(args.num_envs)]
    command += ["--num-steps", str(args.num_steps), "--warmup", str(args.warmup), "--iterations", str(args.iterations)]
    command += [f"--sweep={text}" for text in args.sweep] + ([] if agent is None else ["--agent", str(agent)])
    return subprocess.Popen(command, stdout=subprocess.PIPE, text=True)


def result(process: subprocess.Popen) -> dict:
    out, _ = process.communicate()
    if process.returncode != 0:
        raise SystemExit(f"worker failed with exit status {process.returncode}")
    return json.loads(out.strip().splitlines()[-1])


ONE_PROCESS = "one process, --num-seeds/--sweep"
ONE_AFTER_ANOTHER = "processes one after another"
AT_ONCE = "processes at once"


def summarise(mode: str, results: list[dict], *, agents: int, wall_s: float) -> dict:
    """One row of the table from the workers' ``results`` (each: ``compile_s``, ``env_steps`` of all its
    agents' timed iterations, ``seconds`` they took) for ``agents`` agents trained in ``mode``.

    A worker's ``env_steps`` already counts all of its agents, so nothing is multiplied by ``agents`` here.
    Workers that ran one after another (or the one process) are one job: its steps over its seconds. Workers
    that ran at once each had their own clock over the same stretch of time: their rates add.
    """
    if mode == AT_ONCE:
        rate = sum(r["env_steps"] / r["seconds"] for r in results)
    elif mode in (ONE_PROCESS, ONE_AFTER_ANOTHER):
        rate = sum(r["env_steps"] for r in results) / sum(r["seconds"] for r in results)
    else:
        raise ValueError(f"unknown mode {mode!r}")
    return {
        "mode": mode,
        "processes": len(results),
        "agents": agents,
        "compile_s": max(r["compile_s"] for r in results),
        "env_steps_per_s": rate,
        "env_steps_per_s_per_agent": rate / agents,
        "wall_s": wall_s,
    }


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.worker:
        worker(args)
        return
    config = config_of(args, args.seed, args.num_seeds)
    agents = range(config.num_agents)
    rows = []

    def add(mode: str, results: list[dict], wall_s: float) -> None:
        rows.append(summarise(mode, results, agents=config.num_agents, wall_s=wall_s))
        print(f"# {mode}: {rows[-1]['env_steps_per_s']:.0f} env steps/s, {wall_s:.1f} s in all", flush=True)

    start = time.perf_counter()
    one = result(spawn(args))
    add(ONE_PROCESS, [one], time.perf_counter() - start)
    start = time.perf_counter()
    after = [result(spawn(args, agent)) for agent in agents]
    add(ONE_AFTER_ANOTHER, after, time.perf_counter() - start)
    start = time.perf_counter()
    processes = [spawn(args, agent) for agent in agents]
    together = [result(process) for process in processes]
    add(AT_ONCE, together, time.perf_counter() - start)

    from _common import environment, pool_env_only_sps, write_results

    pool_config = config.agent_configs()[0].replace(num_envs=config.num_agents * args.num_envs)
    ceiling = pool_env_only_sps(pool_config, repeats=3)
    header = {
        "env_id": args.env_id,
        "num_seeds": args.num_seeds,
        "sweep": config.to_dict()["sweep"],
        "num_agents": config.num_agents,
        "num_envs_per_agent": args.num_envs,
        "num_steps": args.num_steps,
        "timed_iterations": args.iterations,
        "env_only_sps": ceiling,
        "load_average": os.getloadavg(),  # on a shared machine, other jobs' share of the cores
        "environment": environment(one["conv_impl"]),  # every worker trains the same model
    }
    write_results(rows, header, args.json)


if __name__ == "__main__":
    main()
