"""Same seed, same run: train a few short runs through the CLI with two versions of ppo-eqx and compare them.

A refactor keeps behaviour when every run it trains equals the one the code before it trained: the same rows of
``metrics.jsonl`` (every field but the timings ``sps`` and ``time_elapsed``) and the same bytes in the final
checkpoint's arrays. The runs go through the command line alone, so any two versions can be compared (an old
checkout's venv against this one's)::

    python bench/same_seed.py run --ppo-eqx ../before/.venv/bin/ppo-eqx --out /tmp/same_seed/before
    python bench/same_seed.py run --ppo-eqx .venv/bin/ppo-eqx --out /tmp/same_seed/after
    python bench/same_seed.py compare /tmp/same_seed/before /tmp/same_seed/after

``compare`` prints one line per run and agent (rows compared, rows that differ, whether the checkpoint bytes are
equal) and exits 1 if anything differs. ``--cases`` picks some of ``CASES``.
"""

import argparse
import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path

QUIET = ["--no-progress", "--no-tensorboard"]
CARTPOLE = ["--env-id", "CartPole-v1", "--num-envs", "4", "--num-steps", "128", "--total-timesteps", "5120"]
CASES: dict[str, list[str]] = {
    # 10 iterations of 512 steps, the envs re-seeded every 2: five segments.
    "cartpole_segments": [*CARTPOLE, "--checkpoint-every", "2"],
    # Two seeds in one program, four segments.
    "cartpole_seeds": [*CARTPOLE, "--checkpoint-every", "3", "--num-seeds", "2"],
    # Two settings in one program: swept hyperparameters are arrays inside the vmapped iteration.
    "cartpole_sweep": [*CARTPOLE, "--checkpoint-every", "5", "--sweep", "learning-rate=0.001,0.00025"],
    # gymnax's CartPole, its envs inside the program: 10 iterations, 3 of them a dispatch.
    "gymnax_cartpole": [
        *CARTPOLE,
        "--env-backend",
        "gymnax",
        "--checkpoint-every",
        "6",
        "--iterations-per-dispatch",
        "3",
    ],
    # CleanRL's Atari settings, 5 iterations of 1024 steps.
    "breakout": ["--env-id", "Breakout-v5", "--total-timesteps", "5120"],
}
VOLATILE = frozenset({"sps", "time_elapsed"})
"""The metrics that time the run, which no two runs share."""


def run(ppo_eqx: str, out: Path, cases: list[str]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name in cases:
        start = time.perf_counter()
        command = [ppo_eqx, "train", *CASES[name], "--run-dir", str(out / name), "--overwrite", *QUIET]
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
        print(f"{name}: trained in {time.perf_counter() - start:.0f} s", flush=True)


def metric_files(run_dir: Path) -> list[Path]:
    """Every agent's metrics.jsonl in a run directory (the run's own, or each agent's below it)."""
    return sorted(run_dir.rglob("metrics.jsonl"))


def rows(path: Path) -> list[dict]:
    return [
        {key: value for key, value in json.loads(line).items() if key not in VOLATILE}
        for line in path.read_text().splitlines()
    ]


def final_arrays(run_dir: Path) -> str | None:
    """The SHA-256 of the newest checkpoint's arrays, None without a checkpoint."""
    checkpoints = sorted((run_dir / "checkpoints").glob("iter_*.eqx"))
    return hashlib.sha256(checkpoints[-1].read_bytes()).hexdigest() if checkpoints else None


def compare(before: Path, after: Path, cases: list[str]) -> int:
    """Print the differences of each case's runs; the number of cases that differ."""
    differing = 0
    for name in cases:
        old_files, new_files = metric_files(before / name), metric_files(after / name)
        old_names = [p.relative_to(before / name) for p in old_files]
        new_names = [p.relative_to(after / name) for p in new_files]
        problems = [] if old_names == new_names else [f"agents differ: {old_names} vs {new_names}"]
        compared = changed = 0
        for old, new in zip(old_files, new_files, strict=False):
            old_rows, new_rows = rows(old), rows(new)
            compared += max(len(old_rows), len(new_rows))
            changed += sum(a != b for a, b in zip(old_rows, new_rows, strict=False))
            changed += abs(len(old_rows) - len(new_rows))
        same_bytes = final_arrays(before / name) == final_arrays(after / name) is not None
        if changed or not same_bytes or problems or not compared:
            differing += 1
        print(
            f"{name}: {len(new_files)} agent(s), {compared} rows compared, {changed} differ; final checkpoint "
            f"arrays {'identical' if same_bytes else 'DIFFER'}{'; ' + '; '.join(problems) if problems else ''}"
        )
    return differing


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    train = commands.add_parser("run", help="train the cases with one ppo-eqx")
    train.add_argument("--ppo-eqx", default="ppo-eqx", help="the ppo-eqx command to run (default: ppo-eqx)")
    train.add_argument("--out", type=Path, required=True, help="directory for the runs, one per case")
    check = commands.add_parser("compare", help="compare two directories of runs")
    check.add_argument("before", type=Path)
    check.add_argument("after", type=Path)
    for command in (train, check):
        command.add_argument("--cases", nargs="+", choices=sorted(CASES), default=list(CASES))
    args = parser.parse_args(argv)
    if args.command == "run":
        run(args.ppo_eqx, args.out, args.cases)
        return 0
    differing = compare(args.before, args.after, args.cases)
    print(f"{differing} of {len(args.cases)} cases differ")
    return 1 if differing else 0


if __name__ == "__main__":
    sys.exit(main())
