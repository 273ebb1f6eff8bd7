"""``ppo-eqx train`` beside CleanRL's ``ppo_continuous_action.py`` on one MuJoCo task, whole processes, alternated.

    python bench/cleanrl_continuous_speed.py --cleanrl-python .peers/torch/bin/python \\
        --cleanrl-script .peers/ppo_continuous_action.py --json bench/results/cleanrl_continuous_speed.json

Each round runs ppo-eqx (its continuous preset, ``--total-timesteps OURS``) and then CleanRL's script (its
defaults, ``--total-timesteps THEIRS``, ``--no-cuda``; torch and gymnasium's MuJoCo in a venv outside this
project), each timed from its start to its exit. A rate is the steps a process trained over its whole wall time
(its start, compiles and imports included); the ratio is taken within a round. The machine is in the header.
"""

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def timed(command: list[str], cwd: Path) -> float:
    start = time.perf_counter()
    subprocess.run(command, cwd=cwd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cleanrl-python", required=True)
    parser.add_argument("--cleanrl-script", type=Path, required=True)
    parser.add_argument("--env-id", default="HalfCheetah-v4")
    parser.add_argument("--ours", type=int, default=1_000_000, help="ppo-eqx's steps a round")
    parser.add_argument("--theirs", type=int, default=100_352, help="CleanRL's steps a round (49 iterations)")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for k in range(args.rounds):
            run_dir = Path(scratch) / f"ours{k}"
            ours = timed(
                [sys.executable, "-m", "ppo_eqx", "train", "--env-id", args.env_id, "--total-timesteps",
                 str(args.ours), "--no-progress", "--run-dir", str(run_dir)],
                Path.cwd(),
            )  # fmt: skip
            theirs = timed(
                [args.cleanrl_python, str(args.cleanrl_script.resolve()), "--env-id", args.env_id,
                 "--total-timesteps", str(args.theirs), "--no-cuda"],
                Path(scratch),
            )  # fmt: skip
            row = {
                "round": k,
                "ppo_eqx_steps": args.ours,
                "ppo_eqx_s": round(ours, 1),
                "ppo_eqx_steps_per_s": round(args.ours / ours, 1),
                "cleanrl_steps": args.theirs,
                "cleanrl_s": round(theirs, 1),
                "cleanrl_steps_per_s": round(args.theirs / theirs, 1),
            }
            row["ratio"] = round(row["ppo_eqx_steps_per_s"] / row["cleanrl_steps_per_s"], 2)
            rows.append(row)
            print(json.dumps(row), flush=True)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _common import environment, write_results  # jax comes with it: only now, after the measured processes

    header = {"environment": environment(None), "env_id": args.env_id, "cleanrl_script": args.cleanrl_script.name}
    write_results(rows, header, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
