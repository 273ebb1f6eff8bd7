"""Compile time and peak memory of the training loop as num_steps, num_envs and iterations grow.

Runs bench/train_speed.py once per setting, each in a fresh process (peak RSS is per process), and tabulates
compile time, peak RSS and speed. Compile time must stay flat (the rollout and the update are loops, not
unrolled code) and memory must grow only with the rollout buffer (num_steps x num_envs frames), never with
the number of iterations.

    python bench/scaling.py --json bench/results/scaling.json
"""

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import write_results

HERE = Path(__file__).resolve().parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env-id", default="Breakout-v5")
    parser.add_argument("--num-steps", type=int, nargs="+", default=[64, 128, 256])
    parser.add_argument("--num-envs", type=int, nargs="+", default=[4, 8, 16])
    parser.add_argument("--iterations", type=int, default=3, help="timed iterations per setting")
    parser.add_argument("--long-iterations", type=int, default=20, help="one run this long checks RSS over time")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    settings = [(steps, 8, args.iterations) for steps in args.num_steps]
    settings += [(128, envs, args.iterations) for envs in args.num_envs if envs != 8]
    settings.append((128, 8, args.long_iterations))
    rows = []
    for num_steps, num_envs, iterations in settings:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "result.json"
            command = [
                sys.executable,
                str(HERE / "train_speed.py"),
                "--env-id",
                args.env_id,
                "--num-steps",
                str(num_steps),
                "--num-envs",
                str(num_envs),
                "--warmup",
                "1",
                "--iterations",
                str(iterations),
                "--json",
                str(out),
            ]
            subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
            result = json.loads(out.read_text())
        row, header = result["rows"][0], result["header"]
        rss = header["rss_by_iteration_mib"]
        rows.append(
            {
                "num_steps": num_steps,
                "num_envs": num_envs,
                "iterations": iterations + 1,
                "compile_s": row["compile_s"],
                "rss_after_compile_mib": header["rss_after_compile_mib"],
                "rss_first_iteration_mib": rss[0],
                "rss_last_iteration_mib": rss[-1],
                "loop_sps": row["loop_sps"],
                "fraction_of_limit": row["fraction_of_limit"],
            }
        )
        print(
            f"# num_steps={num_steps} num_envs={num_envs}: compile {row['compile_s']:.1f} s, "
            f"RSS {rss[0]:.0f} -> {rss[-1]:.0f} MiB",
            flush=True,
        )
    write_results(rows, {"env_id": args.env_id, "environment": header["environment"]}, args.json)


if __name__ == "__main__":
    main()
