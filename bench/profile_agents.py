"""Where a many-agent program of envs written in JAX spends its device time: ppo-eqx's (``--num-seeds A`` on gymnax's
CartPole-v1, CleanRL's ppo.py settings) and, given a PureJaxRL checkout, PureJaxRL's ``ppo.py`` vmapped over as
many seeds, profiled in one process (one start of the device) with ``jax.profiler`` and read back with
``jax.profiler.ProfileData``: each program's wall time for ``--iterations`` iterations after a warm-up run, the
device's busy time, and its operations by total time (each operation's name, XLA's own). For the TPU machine
(issue 50; ``../shared/tpu/README.md``, the PureJaxRL checkout carried from ``.peers/``)::

    python bench/profile_agents.py --agents 256 --iterations 40 --purejaxrl .peers/purejaxrl_root \\
        --json bench/results/profile_agents_tpu_v5e.json

On a CPU the operations are read from XLA's host threads instead of a device's plane.
"""

import argparse
import collections
import glob
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE / "peer_runners")]

import jax  # noqa: E402
import numpy as np  # noqa: E402

TOP = 40


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--agents", type=int, default=256, help="seeds in one program (default: 256)")
    parser.add_argument("--iterations", type=int, default=40, help="iterations profiled (default: 40)")
    parser.add_argument(
        "--env-id", default="CartPole-v1", help="gymnax's task for ppo-eqx, with its preset (default: CartPole-v1)"
    )
    parser.add_argument("--purejaxrl", type=Path, default=None, help="a PureJaxRL checkout (holds purejaxrl/ppo.py)")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args(argv)
    if args.agents < 1 or args.iterations < 1:
        parser.error("--agents and --iterations: allowed: 1 or more")
    if args.purejaxrl is not None and args.env_id != "CartPole-v1":
        parser.error(f"--purejaxrl with --env-id {args.env_id}: PureJaxRL's side is CleanRL's CartPole-v1 only")
    return args


def operations(trace_dir: str) -> dict[str, Any]:
    """The profiled operations of ``trace_dir``'s trace: on each device's plane, the line of XLA's operations (on a
    CPU, XLA's host threads), summed by name: total seconds, count, and the busy time of all of them."""
    from jax.profiler import ProfileData

    paths = glob.glob(f"{trace_dir}/**/*.xplane.pb", recursive=True)
    profile = ProfileData.from_file(paths[0])
    planes = [plane for plane in profile.planes if plane.name.startswith("/device:")]
    totals: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0])
    modules = 0.0
    for plane in planes or [plane for plane in profile.planes if plane.name == "/host:CPU"]:
        for line in plane.lines:
            wanted = line.name == "XLA Ops" if planes else line.name.startswith("tf_XLA")
            if line.name == "XLA Modules":
                modules += sum(event.duration_ns for event in line.events) / 1e9
            if not wanted:
                continue
            for event in line.events:
                totals[event.name][0] += event.duration_ns / 1e9
                totals[event.name][1] += 1
    busy = sum(seconds for seconds, _ in totals.values())
    top = sorted(totals.items(), key=lambda item: -item[1][0])[:TOP]
    return {
        "planes": [plane.name for plane in profile.planes],
        "ops_s": busy,
        "modules_s": modules,
        "top": [{"op": name, "s": seconds, "count": count} for name, (seconds, count) in top],
    }


def profiled(run: Callable[[], Any]) -> dict[str, Any]:
    """``run()`` once warm, then once under the profiler: its wall time and its operations."""
    jax.block_until_ready(run())
    with tempfile.TemporaryDirectory(prefix="profile_agents_") as trace_dir:
        start = time.perf_counter()
        with jax.profiler.trace(trace_dir):
            jax.block_until_ready(run())
        wall = time.perf_counter() - start
        return {"wall_s": wall, **operations(trace_dir)}


def ppo_eqx_program(env_id: str, agents: int, iterations: int) -> tuple[Callable[[], Any], int]:
    """ppo-eqx's program of ``iterations`` iterations of ``agents`` agents on ``env_id``, as ``ppo-eqx train``
    runs it; with the env steps of one iteration of one agent."""
    from ppo_eqx import PPOConfig, Trainer

    preset = PPOConfig.for_task(env_id, "gymnax")
    steps = preset.num_envs * preset.num_steps
    config = PPOConfig.for_task(
        env_id,
        "gymnax",
        num_seeds=agents,
        total_timesteps=steps * iterations * 1000,
        iterations_per_dispatch=iterations,
        checkpoint_every=iterations * 1000,
    )
    trainer = Trainer(config)
    trainer.compile()
    return (lambda: trainer.dispatch().metrics), steps


def purejaxrl_program(path: Path, agents: int, iterations: int) -> Callable[[], Any]:
    """PureJaxRL's ``make_train`` (CleanRL's ppo.py settings, as ``peer_runners/run_purejaxrl.py``) vmapped over
    ``agents`` keys, ``iterations`` updates."""
    import gymnax
    from _common import TASKS, FiveValueStep
    from run_purejaxrl import stand_in_modules

    stand_in_modules()
    sys.path.insert(0, str(path / "purejaxrl"))
    make = gymnax.make
    gymnax.make = lambda env_id, **kwargs: (lambda env, params: (FiveValueStep(env), params))(*make(env_id, **kwargs))
    import ppo  # PureJaxRL's ppo.py

    task = TASKS["cartpole"]
    config = {
        "LR": task["learning_rate"], "NUM_ENVS": task["num_envs"], "NUM_STEPS": task["num_steps"],
        "TOTAL_TIMESTEPS": task["num_envs"] * task["num_steps"] * iterations, "UPDATE_EPOCHS": task["update_epochs"],
        "NUM_MINIBATCHES": task["num_minibatches"], "GAMMA": task["gamma"], "GAE_LAMBDA": task["gae_lambda"],
        "CLIP_EPS": task["clip_coef"], "ENT_COEF": task["ent_coef"], "VF_COEF": task["vf_coef"],
        "MAX_GRAD_NORM": task["max_grad_norm"], "ACTIVATION": task["activation"], "ENV_NAME": task["env_id"],
        "ANNEAL_LR": task["anneal_lr"], "DEBUG": False,
    }  # fmt: skip
    train = ppo.make_train(config)

    def program(keys: Any) -> Any:
        return jax.vmap(train)(keys)["metrics"]["returned_episode_returns"][:, :, -1, :]

    keys = jax.random.split(jax.random.PRNGKey(1), agents)
    compiled = jax.jit(program).lower(keys).compile()
    return lambda: compiled(keys)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    start = time.perf_counter()
    program, steps_per_iteration = ppo_eqx_program(args.env_id, args.agents, args.iterations)
    print(f"ppo-eqx: built and compiled in {time.perf_counter() - start:.1f} s", flush=True)
    rows = [{"program": "ppo-eqx", "compile_s": time.perf_counter() - start, **profiled(program)}]
    print(f"ppo-eqx: {rows[0]['wall_s']:.3f} s wall profiled", flush=True)
    if args.purejaxrl is not None:
        start = time.perf_counter()
        program = purejaxrl_program(args.purejaxrl, args.agents, args.iterations)
        print(f"purejaxrl: built and compiled in {time.perf_counter() - start:.1f} s", flush=True)
        rows.append({"program": "purejaxrl", "compile_s": time.perf_counter() - start, **profiled(program)})
    steps = args.agents * steps_per_iteration * args.iterations  # PureJaxRL's CartPole: 4 x 128 as ppo-eqx's
    for row in rows:
        # The profiler's own cost inflates the wall time many times over (13.3 s for a 0.9 s program on the TPU
        # v5e): the device's time in the program (its "XLA Modules" line) is the figure to compare.
        row["env_steps_per_s"] = steps / row["wall_s"]
        row["env_steps_per_device_s"] = steps / row["modules_s"] if row["modules_s"] else None
        device = f"{row['env_steps_per_device_s']:,.0f}" if row["modules_s"] else "-"
        print(f"{row['program']}: the device's program {row['modules_s']:.3f} s ({device} env steps a device "
              f"second); {row['wall_s']:.3f} s wall under the profiler; operations, nested ones too, "
              f"{row['ops_s']:.3f} s")  # fmt: skip
        for op in row["top"][:15]:
            print(f"  {op['s']:.4f} s  {op['count']:6d}  {op['op'][:100]}")
    header = {
        "command": " ".join(sys.argv),
        "env_id": args.env_id,
        "agents": args.agents,
        "iterations": args.iterations,
        "devices": [str(device) for device in jax.devices()],
        "device_kind": jax.devices()[0].device_kind,
        "jax_version": jax.__version__,
        "numpy": np.__version__,
    }
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"header": header, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
