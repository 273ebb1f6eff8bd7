"""ppo-eqx on a task of ``bench/peers.py``: the command a user runs, ``ppo-eqx train --env-backend gymnax``, timed.

    .venv/bin/python bench/peer_runners/run_ppo_eqx.py --task cartpole --num-agents 64 --out r.json

The task's settings are ppo-eqx's own preset for the env (CleanRL's ppo.py for CartPole-v1, gymnax-blines' for
MinAtar: the same numbers as the other runners' ``TASKS``, bar the value-loss clipping that PureJaxRL and rejax
apply to CartPole and CleanRL's preset does not); only the seeds, ``--num-seeds`` and, for ``--num-iterations``,
``--total-timesteps`` are given. The compile time is the one ``ppo-eqx train`` prints, the run time its last
``time_elapsed`` (the loop, from the first dispatch to the last program's end, with the metrics and checkpoints it
writes); the curve is each agent's ``metrics.jsonl``.
"""

import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROCESS_START = time.perf_counter()

import numpy as np  # noqa: E402
from _common import parse_args, report, task_settings  # noqa: E402

COMPILED = re.compile(r"^ppo-eqx: compiled .* in ([0-9.]+) s$")


def main() -> None:
    args = parse_args(__doc__, "the ppo-eqx program (default: the one beside this Python, else python -m ppo_eqx)")
    settings = task_settings(args)
    beside = Path(sys.executable).with_name("ppo-eqx")
    if args.peer_path is not None:
        ppo_eqx = [str(args.peer_path)]
    else:  # where no command is installed beside the Python (the TPU machine's bundle), the module
        ppo_eqx = [str(beside)] if beside.is_file() else [sys.executable, "-m", "ppo_eqx"]
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        command = [*ppo_eqx, "train", "--env-backend", "gymnax", "--env-id", settings["env_id"]]
        command += ["--total-timesteps", str(settings["total_timesteps"]), "--seed", str(args.seed)]
        command += ["--num-seeds", str(args.num_agents), "--run-dir", str(run_dir), "--no-progress"]
        start = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        command_s = time.perf_counter() - start
        if done.returncode != 0:
            sys.exit(f"{' '.join(command)} failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
        compiled = [float(m.group(1)) for line in done.stdout.splitlines() if (m := COMPILED.match(line))]
        # One agent writes RUN_DIR/metrics.jsonl; several, RUN_DIR/seedK/metrics.jsonl: in the order of K.
        paths = sorted(run_dir.rglob("metrics.jsonl"), key=lambda path: path.parent.name.removeprefix("seed").zfill(12))
        curves = [[json.loads(line) for line in path.read_text().splitlines()] for path in paths]
    returns = np.asarray(
        [[np.nan if r["episodic_return"] is None else r["episodic_return"] for r in c] for c in curves]
    )
    run_s = max(c[-1]["time_elapsed"] for c in curves)
    notes = [f"ppo-eqx train, the whole command: {command_s:.1f} s (process start, imports and writing included)"]
    report("ppo-eqx", args, settings, returns, compiled[0], run_s, PROCESS_START, notes)


if __name__ == "__main__":
    main()
