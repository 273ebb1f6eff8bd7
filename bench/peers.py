"""ppo-eqx beside PureJaxRL and rejax on the same gymnax task, each in a fresh process of its own Python.

Each peer runs from its own checkout or venv (given as paths; nothing of theirs is imported here or into ppo_eqx)
through a small runner in ``bench/peer_runners/`` that its Python executes: the task's settings, the whole run
compiled as one program (``jax.jit``, compile and run timed apart), vmapped over ``--agents`` seeds. ppo-eqx runs
as its users run it, ``ppo-eqx train --env-backend gymnax --num-seeds A`` with its preset (``run_ppo_eqx.py``): its
compile time is the one it prints, its run time the loop's (metrics and checkpoints written included). Reported per
(task, agents, peer): compile seconds, run seconds, their sum (the wall time including compile), the time to a
return of 475 on CartPole (compile + the run's share up to the first iteration whose ``episodic_return``
reaches it; median over agents), how many agents got there, and the final ``episodic_return`` (CleanRL's: the
mean over envs of each env's last finished episode), mean over agents.

Tasks (``bench/peer_runners/_common.py`` has every setting): ``cartpole``, CleanRL's ppo.py on CartPole-v1
(499,712 steps); ``breakout``, gymnax-blines' PPO on Breakout-MinAtar (``--breakout-iterations`` of 8,192 steps).

    python bench/peers.py --purejaxrl .peers/purejaxrl \\
        --purejaxrl-python .peers/gymnax/bin/python --rejax-python .peers/gymnax/bin/python \\
        --ppo-eqx-python .venv/bin/python --tasks cartpole --agents 1 64 --json bench/results/peers_cartpole.json

This script imports neither jax nor ppo_eqx; the table is also written beside the JSON (``.md``).
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RUNNERS = HERE / "peer_runners"
PEERS = ("purejaxrl", "rejax", "ppo-eqx")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--purejaxrl", type=Path, help="PureJaxRL checkout (holds purejaxrl/ppo.py)")
    parser.add_argument("--purejaxrl-python", type=Path, help="a Python with gymnax, flax and distrax")
    parser.add_argument("--rejax-python", type=Path, help="a Python with rejax and gymnax")
    parser.add_argument(
        "--ppo-eqx-python",
        type=Path,
        default=Path(sys.executable),
        help="a Python with ppo_eqx[gymnax] (default: this one)",
    )
    parser.add_argument(
        "--ppo-eqx",
        type=Path,
        default=None,
        help="the ppo-eqx command (default: the one beside --ppo-eqx-python; on the TPU machine, a script that runs "
        "python3 -m ppo_eqx)",
    )
    parser.add_argument("--peers", nargs="+", choices=PEERS, default=list(PEERS), help="(default: all)")
    parser.add_argument("--tasks", nargs="+", choices=("cartpole", "breakout"), default=["cartpole"])
    parser.add_argument("--agents", nargs="+", type=int, default=[1, 64], help="seeds vmapped (default: 1 64)")
    parser.add_argument("--breakout-iterations", type=int, default=122, help="(default: %(default)s, ~1M steps)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=1800, help="seconds allowed to one run")
    parser.add_argument(
        "--stall", type=float, default=120, help="end a run that used under 1 CPU second in this many seconds"
    )
    parser.add_argument(
        "--xla-flags", default=None, help="XLA_FLAGS for every run (e.g. --xla_cpu_multi_thread_eigen=false)"
    )
    parser.add_argument("--json", type=Path, required=True, help="write the results here (and the table as .md)")
    args = parser.parse_args(argv)
    for count in args.agents:
        if count < 1:
            parser.error(f"--agents {count}: allowed: 1 or more")
    if "purejaxrl" in args.peers and (args.purejaxrl is None or args.purejaxrl_python is None):
        parser.error("the purejaxrl peer needs --purejaxrl and --purejaxrl-python (or leave it out of --peers)")
    if "rejax" in args.peers and args.rejax_python is None:
        parser.error("the rejax peer needs --rejax-python (or leave it out of --peers)")
    return args


def machine() -> dict[str, Any]:
    """The CPU model, its AVX-512 support and the cores this process may use: a figure's context."""
    model, flags = platform.processor(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and ":" in line:
                model = line.split(":", 1)[1].strip()
            elif line.startswith("flags") and ":" in line:
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return {"cpu": model, "avx512f": "avx512f" in flags, "cores": len(os.sched_getaffinity(0))}


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of process ``pid`` (Linux ``/proc``), None where it cannot be read."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def wait_or_stall(process: subprocess.Popen, timeout: float, stall: float) -> str | None:
    """Wait for ``process``; end it (and say why) past ``timeout`` or when it has used less than one CPU second in
    ``stall`` seconds: XLA:CPU can wedge with every thread idle (a timer thread still ticks now and then)."""
    start = last_change = time.monotonic()
    last_cpu = cpu_seconds(process.pid)
    while process.poll() is None:
        time.sleep(2)
        now, cpu = time.monotonic(), cpu_seconds(process.pid)
        if cpu is None or last_cpu is None or cpu - last_cpu >= 1.0:
            last_cpu, last_change = cpu, now
        reason = None
        if now - start > timeout:
            reason = f"timed out after {timeout:.0f} s"
        elif cpu is not None and now - last_change > stall:
            reason = f"stalled: under 1 CPU second in {stall:.0f} s (an XLA:CPU hang; see --xla-flags)"
        if reason:
            process.kill()
            process.wait()
            return reason
    return None


def run_runner(python: Path, runner: str, extra: list[str], task: str, agents: int, args: argparse.Namespace) -> dict:
    """One peer's run in a fresh process of ``python``; its JSON result, or ``{"error": ...}``."""
    with tempfile.TemporaryDirectory() as tmp:
        out, log = Path(tmp) / "result.json", Path(tmp) / "stderr.txt"
        # absolute, not resolved: a venv's python is a link that must keep its venv; the runner runs in RUNNERS
        command = [str(python.absolute()), str(RUNNERS / runner), "--task", task, "--num-agents", str(agents)]
        command += ["--seed", str(args.seed), "--out", str(out), *extra]
        if task == "breakout":
            command += ["--num-iterations", str(args.breakout_iterations)]
        env = dict(os.environ, **({"XLA_FLAGS": args.xla_flags} if args.xla_flags else {}))
        start = time.perf_counter()
        with log.open("w") as stderr:
            process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr, cwd=RUNNERS, env=env)
            failed = wait_or_stall(process, args.timeout, args.stall)
        if failed:
            return {"error": failed, "command": command}
        if process.returncode != 0 or not out.is_file():
            last = log.read_text().strip().splitlines()[-1:] or [f"exit {process.returncode}"]
            return {"error": last, "command": command}
        result = json.loads(out.read_text())
        result.update(command=command, subprocess_s=time.perf_counter() - start, xla_flags=args.xla_flags)
        return result


def runners(args: argparse.Namespace) -> dict[str, Callable[[str, int], dict]]:
    table: dict[str, Callable[[str, int], dict]] = {}
    if "purejaxrl" in args.peers:
        extra = ["--peer-path", str(args.purejaxrl.resolve())]
        table["purejaxrl"] = lambda t, a: run_runner(args.purejaxrl_python, "run_purejaxrl.py", extra, t, a, args)
    if "rejax" in args.peers:
        table["rejax"] = lambda t, a: run_runner(args.rejax_python, "run_rejax.py", [], t, a, args)
    if "ppo-eqx" in args.peers:
        own = [] if args.ppo_eqx is None else ["--peer-path", str(args.ppo_eqx.resolve())]
        table["ppo-eqx"] = lambda t, a: run_runner(args.ppo_eqx_python, "run_ppo_eqx.py", own, t, a, args)
    return table


def summary(result: dict) -> dict[str, Any]:
    """The table's row of one result."""
    if "error" in result:
        return {"error": result["error"]}
    times = [t for t in result["time_to_target_per_agent_s"] if t is not None]
    return {
        "steps_per_agent": result["steps_per_agent"],
        "compile_s": result["compile_s"],
        "run_s": result["run_s"],
        "wall_s": result["wall_s"],
        "time_to_target_median_s": statistics.median(times) if times else None,
        "agents_at_target": len(times),
        "final_return_mean": result["final_return_mean"],
        "last5pct_return_mean": result["last5pct_return_mean"],
    }


def markdown(rows: list[dict[str, Any]], context: dict[str, Any]) -> str:
    lines = [
        f"Peers on {context['cpu']} ({context['cores']} cores, AVX-512: {context['avx512f']}), {context['date']}.",
        "Wall = compile + run (one program). Time to 475: median over agents; 'at 475': agents that got there.",
        "",
        "| task | agents | peer | steps/agent | compile s | run s | wall s | time to 475 s | at 475 | final return |",
        "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in rows:
        s = row["summary"]
        head = f"| {row['task']} | {row['agents']} | {row['peer']} |"
        if "error" in s:
            lines.append(f"{head} {s['error']} | | | | | | |")
            continue
        target = "-" if s["time_to_target_median_s"] is None else f"{s['time_to_target_median_s']:.1f}"
        at = f"{s['agents_at_target']}/{row['agents']}" if row["task"] == "cartpole" else "-"
        lines.append(
            f"{head} {s['steps_per_agent']:,} | {s['compile_s']:.1f} | {s['run_s']:.1f} | {s['wall_s']:.1f} | "
            f"{target} | {at} | {s['final_return_mean']:.1f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    table = runners(args)
    context = {**machine(), "date": time.strftime("%Y-%m-%d"), "argv": sys.argv}
    rows = []
    for task in args.tasks:
        for agents in args.agents:
            for peer, run in table.items():
                result = run(task, agents)
                row = {"task": task, "agents": agents, "peer": peer, "summary": summary(result)}
                rows.append({**row, "result": result})
                print(json.dumps({k: rows[-1][k] for k in ("task", "agents", "peer", "summary")}), flush=True)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"context": context, "rows": rows}, indent=1) + "\n")
    args.json.with_suffix(".md").write_text(markdown(rows, context))
    print(markdown(rows, context))


if __name__ == "__main__":
    main()
