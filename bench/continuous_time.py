"""Continuous control judged by wall time (issue 52): ``ppo-eqx train`` and CleanRL's ``ppo_continuous_action.py``
as whole processes, one after the other on one machine, each to its end, timed from its start to its exit.

``run`` appends one JSON line per process to ``--rows`` (a run killed half-way keeps the processes before it)::

    python bench/continuous_time.py run --rows bench/results/continuous_time.jsonl --program ppo-eqx \\
        --preset fast --tasks HalfCheetah-v4 Hopper-v4 Walker2d-v4 --seeds 1 2 3 4 5
    python bench/continuous_time.py run --rows bench/results/continuous_time.jsonl --program cleanrl \\
        --cleanrl-python .peers/crl/bin/python --cleanrl-script .peers/crl/ppo_continuous_action.py \\
        --tasks HalfCheetah-v4 Hopper-v4 Walker2d-v4 --seeds 1

``report`` reads the rows and writes the table (markdown, stdout; JSON with ``--json``) and the curves (``--png``,
return against seconds since each process started).

A run's return is what it reports over its last 10 iterations: ppo-eqx's mean ``episodic_return`` of its last 10
rows of ``metrics.jsonl``; CleanRL's mean over the episodes that ended in its last 10 iterations (20,480 steps).
The curve: the same measure after each iteration, against the seconds since the process started (ppo-eqx's rows
placed by ``time_elapsed``, aligned to the process's exit; CleanRL's episodes by when the line reached this script,
its output unbuffered). Each row names its machine.
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
TARGETS = {"HalfCheetah-v4": 1442.64, "Hopper-v4": 2382.86, "Walker2d-v4": 2287.95}
"""CleanRL's published returns at 1M steps (its docs, ppo_continuous_action.py on gymnasium's MuJoCo)."""
CLEANRL_ITERATION = 2048
EPISODE = re.compile(r"global_step=(\d+), episodic_return=\[?([-0-9.e+]+)")


def run_ppo_eqx(task: str, seed: int, preset: str, scratch: Path) -> dict[str, Any]:
    run_dir = scratch / f"ppo-eqx-{task}-{seed}"
    command = [sys.executable, "-m", "ppo_eqx", "train", "--env-id", task, "--seed", str(seed), "--no-progress",
               "--no-tensorboard", "--run-dir", str(run_dir)] + (["--preset", preset] if preset else [])  # fmt: skip
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=False, cwd=HERE.parents[1])
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"ppo-eqx failed on {task} seed {seed}: {done.stderr.strip().splitlines()[-1:]}")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    end = rows[-1]["time_elapsed"]
    curve = []
    for k in range(len(rows)):
        window = [r["episodic_return"] for r in rows[max(0, k - 9) : k + 1] if r["episodic_return"] is not None]
        if window:
            curve.append([round(wall - (end - rows[k]["time_elapsed"]), 2), rows[k]["global_step"],
                          statistics.fmean(window)])  # fmt: skip
    startup = re.search(r"first iteration after ([0-9.]+) s", done.stderr)
    return {"steps": rows[-1]["global_step"], "wall_s": round(wall, 2), "return": curve[-1][2], "curve": curve,
            "startup_s": float(startup.group(1)) if startup else None}  # fmt: skip


def run_cleanrl(task: str, seed: int, args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if args.cleanrl_pythonpath:
        env["PYTHONPATH"] = args.cleanrl_pythonpath
    command = [args.cleanrl_python, str(Path(args.cleanrl_script).resolve()), "--env-id", task, "--seed", str(seed),
               "--total-timesteps", str(args.cleanrl_steps), "--no-cuda"]  # fmt: skip
    start = time.perf_counter()
    episodes = []
    with subprocess.Popen(command, cwd=scratch, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                          text=True) as child:  # fmt: skip
        assert child.stdout is not None
        for line in child.stdout:
            if found := EPISODE.search(line):
                episodes.append((time.perf_counter() - start, int(found.group(1)), float(found.group(2))))
    wall = time.perf_counter() - start
    if child.returncode != 0 or not episodes:
        raise SystemExit(f"CleanRL's script failed on {task} seed {seed} (exit {child.returncode})")
    steps = args.cleanrl_steps // CLEANRL_ITERATION * CLEANRL_ITERATION
    curve = []
    for k in range(1, steps // CLEANRL_ITERATION + 1):
        end = k * CLEANRL_ITERATION
        window = [r for t, s, r in episodes if end - 10 * CLEANRL_ITERATION < s <= end]
        at = [t for t, s, _ in episodes if s <= end]
        if window and at:
            curve.append([round(at[-1], 2), end, statistics.fmean(window)])
    return {"steps": steps, "wall_s": round(wall, 2), "return": curve[-1][2], "curve": curve}


def run(args: argparse.Namespace) -> None:
    # The machine named by a process of its own that exits before the runs: jax's backend held here would keep an
    # accelerator (a TPU opens to one process at a time) from the processes timed.
    probe = ("import json, sys; sys.path.insert(0, sys.argv[1]); from _common import environment; "
             "print(json.dumps(environment(None)))")  # fmt: skip
    named = subprocess.run([sys.executable, "-c", probe, str(HERE.parent)], capture_output=True, text=True, check=True)
    machine = json.loads(named.stdout.strip().splitlines()[-1])
    with tempfile.TemporaryDirectory() as scratch:
        for task in args.tasks:
            for seed in args.seeds:
                if args.program == "ppo-eqx":
                    row = run_ppo_eqx(task, seed, args.preset, Path(scratch))
                else:
                    row = run_cleanrl(task, seed, args, Path(scratch))
                row = {"program": args.program, "preset": args.preset if args.program == "ppo-eqx" else None,
                       "task": task, "seed": seed, **row, "machine": machine}  # fmt: skip
                with args.rows.open("a") as rows:
                    rows.write(json.dumps(row) + "\n")
                print(f"# {args.program} {task} seed {seed}: {row['return']:.0f} after {row['steps']} steps in "
                      f"{row['wall_s']:.0f} s", flush=True)  # fmt: skip


def seconds_to_target(curves: list[list[list[float]]], target: float) -> float | None:
    """The first second at which the mean over ``curves`` (each ``[seconds, steps, return]`` rows, a run's return
    over its last 10 iterations, held from one row to the next) reaches ``target``, every run having reported; None
    if it never does."""
    for t in sorted({row[0] for curve in curves for row in curve}):
        held = [[r for s, _, r in curve if s <= t] for curve in curves]
        if all(held) and statistics.fmean(values[-1] for values in held) >= target:
            return t
    return None


def summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One line per task: ppo-eqx's returns over its seeds and wall times beside CleanRL's wall time for its run."""
    lines = []
    for task, target in TARGETS.items():
        ours = [r for r in rows if r["task"] == task and r["program"] == "ppo-eqx"]
        theirs = [r for r in rows if r["task"] == task and r["program"] == "cleanrl"]
        if not ours:
            continue
        returns = [r["return"] for r in ours]
        line: dict[str, Any] = {
            "task": task, "target": target, "seeds": [r["seed"] for r in ours],
            "returns": [round(x) for x in returns], "mean": statistics.fmean(returns),
            "std": statistics.stdev(returns) if len(returns) > 1 else 0.0,
            "wall_s": [r["wall_s"] for r in ours], "wall_max_s": max(r["wall_s"] for r in ours),
        }  # fmt: skip
        if theirs:
            line["cleanrl_wall_s"] = statistics.fmean(r["wall_s"] for r in theirs)
            line["cleanrl_returns"] = [round(r["return"]) for r in theirs]
            line["bound_s"] = line["cleanrl_wall_s"] / 10
            line["within_bound"] = line["wall_max_s"] <= line["bound_s"]
        line["reaches_target"] = line["mean"] >= target
        line["seconds_to_target"] = seconds_to_target([r["curve"] for r in ours], target)
        if theirs:
            line["cleanrl_seconds_to_target"] = seconds_to_target([r["curve"] for r in theirs], target)
        lines.append(line)
    return lines


def report(args: argparse.Namespace) -> None:
    rows = [json.loads(line) for line in args.rows.read_text().splitlines() if line.strip()]
    lines = summary(rows)
    heads = ["task", "ppo-eqx returns (seeds)", "mean ± std", "CleanRL's 1M", "each process", "mean at CleanRL's"]
    print("| " + " | ".join([*heads, "CleanRL's 1M run", "1/10 of it"]) + " |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for line in lines:
        cleanrl, reached = line.get("cleanrl_wall_s"), line["seconds_to_target"]
        print(f"| {line['task']} | {', '.join(f'{x:,}' for x in line['returns'])} | {line['mean']:,.0f} ± "
              f"{line['std']:,.0f} | {line['target']:,.0f} | {min(line['wall_s']):.0f}-{line['wall_max_s']:.0f} s | "
              + (f"{reached:.0f} s | " if reached is not None else "not reached | ")
              + (f"{cleanrl:,.0f} s | {cleanrl / 10:.0f} s |" if cleanrl else "| |"))  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps({"summary": lines, "rows": rows}, indent=1) + "\n")
    if args.png:
        plot(rows, args.png)


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = [task for task in TARGETS if any(r["task"] == task for r in rows)]
    figure, axes = plt.subplots(1, len(tasks), figsize=(5 * len(tasks), 4), squeeze=False)
    for axis, task in zip(axes[0], tasks, strict=True):
        for row in (r for r in rows if r["task"] == task):
            seconds, _, returns = zip(*row["curve"], strict=True)
            ours = row["program"] == "ppo-eqx"
            label = ("ppo-eqx --preset fast" if ours else "CleanRL's script") if row["seed"] == 1 else None
            axis.plot(seconds, returns, color="C0" if ours else "C3", alpha=0.7, linewidth=1, label=label)
        axis.axhline(TARGETS[task], color="grey", linestyle="--", linewidth=1, label="CleanRL's 1M return")
        axis.set_xscale("log")
        axis.set_title(task)
        axis.set_xlabel("seconds since the process started")
        axis.set_ylabel("return (last 10 iterations)")
        axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    runs = sub.add_parser("run", help="run processes, one after the other, appending a row each")
    runs.add_argument("--rows", type=Path, required=True)
    runs.add_argument("--program", choices=("ppo-eqx", "cleanrl"), required=True)
    runs.add_argument("--preset", default="fast", help="ppo-eqx's --preset ('' for the task's default)")
    runs.add_argument("--tasks", nargs="+", choices=sorted(TARGETS), default=list(TARGETS))
    runs.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    runs.add_argument("--cleanrl-python")
    runs.add_argument("--cleanrl-script")
    runs.add_argument("--cleanrl-pythonpath", help="PYTHONPATH for CleanRL's process (a compatibility shim)")
    runs.add_argument("--cleanrl-steps", type=int, default=1_000_000)
    reports = sub.add_parser("report", help="the table and the curves from the rows")
    reports.add_argument("--rows", type=Path, required=True)
    reports.add_argument("--json", type=Path)
    reports.add_argument("--png", type=Path)
    args = parser.parse_args(argv)
    if args.command == "run" and args.program == "cleanrl" and not (args.cleanrl_python and args.cleanrl_script):
        parser.error("--program cleanrl needs --cleanrl-python and --cleanrl-script")
    run(args) if args.command == "run" else report(args)


if __name__ == "__main__":
    main()
