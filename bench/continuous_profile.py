"""Where a continuous task's env step goes (issue 52): the host-envs route's iteration, split into the env step
(EnvPool's ``send`` and ``recv``), the policy (the act program: the forward pass, the action sampled, the step's
observations counted and scaled where they are normalised), the rollout's end (the steps stacked, rewards
normalised, GAE) and the learner (the update: the rest of the iteration), each in microseconds per env step and as
a share of the iteration; and, measured apart, what normalising the observations costs the act program::

    python bench/continuous_profile.py --env-id HalfCheetah-v4 --preset fast --iterations 30 \\
        --json bench/results/continuous_profile.json

The iterations are timed one at a time (each waited for), after two of warm-up, in one process; the parts are
wall-clock times taken around the calls the host loop makes (the act program waited for before its actions are
sent, as the loop itself waits for them), so the parts of an iteration add up to it, less the loop's own Python.
"""

import argparse
import collections
import functools
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import jax  # noqa: E402
import numpy as np  # noqa: E402
from _common import environment, write_results  # noqa: E402

import ppo_eqx  # noqa: E402
from ppo_eqx.host import host_loop  # noqa: E402

SPENT: dict[str, float] = collections.defaultdict(float)


def timed(part: str, fn: Any, *, wait: bool = False) -> Any:
    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        out = fn(*args, **kwargs)
        if wait:
            jax.block_until_ready(out)
        SPENT[part] += time.perf_counter() - start
        return out

    if hasattr(fn, "compile"):  # an own_jit program: the host loop compiles it ahead of the first call
        call.compile = fn.compile  # type: ignore[attr-defined]
    return call


def instrument() -> None:
    """Every host loop made from here on times its calls into ``SPENT``."""
    made = host_loop.HostLoop.__init__

    def init(self: host_loop.HostLoop, actors: Any, programs: host_loop.ActPrograms, *, num_steps: int) -> None:
        actors = [[pool._replace(send=timed("env", pool.send), recv=timed("env", pool.recv)) for pool in group]
                  for group in actors]  # fmt: skip
        made(self, actors, programs, num_steps=num_steps)
        if not getattr(programs, "timed", False):
            programs.act = timed("policy", programs.act, wait=True)
            programs.stack = timed("rollout's end", programs.stack, wait=True)
            programs.timed = True  # type: ignore[attr-defined]

    host_loop.HostLoop.__init__ = init  # type: ignore[method-assign]


def normalisation_cost(trainer: ppo_eqx.Trainer, repeats: int = 2000) -> dict[str, float]:
    """The act program's time per call with the observations counted and scaled, and without (microseconds)."""
    loop = trainer._segment.pool  # the segment's HostLoop
    programs = loop.programs
    leaves = programs.leaves(trainer.state.model)
    key_data = programs.keys(jax.random.key(0))
    moments = trainer.state.carry.handle.obs if programs.normalize is not None and programs.normalize.obs else None
    obs = np.asarray(loop.obs[0])
    act = programs.act.__wrapped__ if hasattr(programs.act, "__wrapped__") else programs.act
    out = {}
    for name, given in (("with", moments), ("without", None)):
        for k in range(repeats + 50):
            if k == 50:
                start = time.perf_counter()
            _, packed = act(leaves, given, obs, key_data[0], np.int32(0))
            np.asarray(packed)
        out[f"act_{name}_normalisation_us"] = (time.perf_counter() - start) / repeats * 1e6
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env-id", default="HalfCheetah-v4")
    parser.add_argument("--preset", default="fast")
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    instrument()
    config = ppo_eqx.PPOConfig.for_task(args.env_id, preset=args.preset, rollout_on="host-envs")
    with ppo_eqx.Trainer(config) as trainer:
        trainer.compile()
        for _ in range(2):
            jax.block_until_ready(trainer.dispatch(most=1).metrics)
        SPENT.clear()
        start = time.perf_counter()
        for _ in range(args.iterations):
            jax.block_until_ready(trainer.dispatch(most=1).metrics)
        wall = time.perf_counter() - start
        extra = normalisation_cost(trainer)
    steps = args.iterations * config.batch_size
    parts = dict(SPENT)
    parts["learner"] = wall - sum(parts.values())  # the update, and the loop's own Python between the calls
    rows = [
        {"part": part, "us_per_env_step": seconds / steps * 1e6, "share": seconds / wall}
        for part, seconds in parts.items()
    ]
    for row in rows:
        print(f"# {row['part']:>14}: {row['us_per_env_step']:7.2f} us per env step, {row['share']:6.1%}")
    print(f"# iteration: {wall / args.iterations * 1e3:.1f} ms, {steps / wall:,.0f} env steps/s; act program "
          f"{extra['act_with_normalisation_us']:.0f} us with the observations normalised, "
          f"{extra['act_without_normalisation_us']:.0f} us without")  # fmt: skip
    header = {"command": " ".join(sys.argv), "environment": environment(None), "env_id": args.env_id,
              "preset": args.preset, "num_envs": config.num_envs, "num_steps": config.num_steps,
              "env_steps_per_s": steps / wall, **extra}  # fmt: skip
    write_results(rows, header, args.json)


if __name__ == "__main__":
    main()
