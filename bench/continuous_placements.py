"""``ppo-eqx train`` on a continuous task with each placement of its rollout, whole processes, alternated.

    python bench/continuous_placements.py --env-id HalfCheetah-v4 --steps 61440 --rounds 2 \\
        --rollout-on device auto --json bench/results/continuous_placements.json

Each round runs ``ppo-eqx train --env-id ENV --total-timesteps STEPS --rollout-on P`` for every placement P in
turn, each timed from its start to its exit (imports and compiles included), and reads the loop's own time
(``time_elapsed`` of the last metrics row). ``auto`` is what a user gets; hardware.json says where it ran. A ratio
is taken within a round; the machine is in the header.
"""

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env-id", default="HalfCheetah-v4")
    parser.add_argument("--steps", type=int, default=61_440, help="steps a run (30 iterations of 2,048)")
    parser.add_argument("--rollout-on", nargs="+", default=["device", "auto"])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for k in range(args.rounds):
            for place in args.rollout_on:
                run_dir = Path(scratch) / f"{place}{k}"
                command = [
                    sys.executable, "-m", "ppo_eqx", "train", "--env-id", args.env_id, "--total-timesteps",
                    str(args.steps), "--rollout-on", place, "--no-progress", "--run-dir", str(run_dir),
                ]  # fmt: skip
                start = time.perf_counter()
                subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                wall = time.perf_counter() - start
                last = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])
                ran_on = json.loads((run_dir / "hardware.json").read_text())["rollout"]["on"]
                row = {
                    "round": k, "rollout_on": place, "ran_on": ran_on, "steps": args.steps,
                    "process_s": round(wall, 1), "process_steps_per_s": round(args.steps / wall, 1),
                    "loop_s": round(last["time_elapsed"], 1), "episodic_return": last["episodic_return"],
                }  # fmt: skip
                rows.append(row)
                print(json.dumps(row), flush=True)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _common import environment, write_results  # jax comes with it: only now, after the measured processes

    write_results(rows, {"environment": environment(None), "env_id": args.env_id}, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
