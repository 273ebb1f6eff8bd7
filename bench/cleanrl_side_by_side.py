"""CleanRL's ``ppo_atari_envpool_xla_jax.py`` beside ``ppo-eqx train``: same machine, same settings, one run.

CleanRL's script is not part of this project: fetch it (github.com/vwxyzjn/cleanrl, ``cleanrl/``), patch what
EnvPool 1.2 needs (docs/performance.md lists the changes), and give its path and the python of a venv that runs
it. The two programs run one after the other, each as its own process, with CleanRL's settings on the same
env, seed, envs and total steps, and for each this reports, from the outside:

- ``steady_sps``: the median env steps/s over the iterations after the first two (compilation excluded);
- ``first_iteration_s``: wall seconds from the process's start until its first iteration is finished;
- ``second_iteration_extra_s``: how much longer the second iteration took than a steady one (a recompile);
- ``peak_rss_mib``: the peak resident memory of the process and its children (sampled every 0.1 s, and the
  kernel's own maximum for the process, whichever is higher);

CleanRL's iteration ends are the times its ``global_step=`` lines arrive on its stdout (it prints one per
iteration after fetching the episode statistics from the device); ppo-eqx's are the time its "compiled" line
arrives plus the iteration times of its metrics.jsonl.

    python bench/cleanrl_side_by_side.py --cleanrl-script ~/cleanrl/ppo_atari_envpool_xla_jax.py \\
        --cleanrl-python ~/cleanrl/venv/bin/python --iterations 6
    python bench/cleanrl_side_by_side.py ... --isa avx2   # both capped at AVX2, on an AVX-512 machine

``--isa avx2`` sets ``XLA_FLAGS=--xla_cpu_max_isa=AVX2`` for both processes and ``PPO_EQX_KERNEL_ISA=avx2`` for
ppo-eqx (the ISA its C++ kernel is built for); the results say whether the installed ppo_eqx reads that
variable. This module stays free of jax: it only starts and watches the two processes.
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
VECTOR_FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16")
KERNEL_ISA_VARIABLE = "PPO_EQX_KERNEL_ISA"
AVX2_XLA_FLAG = "--xla_cpu_max_isa=AVX2"
MIN_ITERATIONS = 3  # the first two are compile and recompile; a steady rate needs at least one more

CLEANRL_STEP = re.compile(r"^global_step=(\d+), avg_episodic_return=")
CLEANRL_SPS = re.compile(r"^SPS: (\d+)$")
PPO_EQX_COMPILED = re.compile(r"^ppo-eqx: compiled one iteration in ([0-9.]+) s")

Line = tuple[float, str]  # (seconds since the process started, the line without its newline)


# ---------------------------------------------------------------- the machine


def cpu_description(cpuinfo: str, logical_cpus: int | None) -> dict[str, Any]:
    """Model, family and the vector extensions that decide the speed, from /proc/cpuinfo's first processor."""
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip(), value.strip())
    flags = set(fields.get("flags", "").split())
    family, model = fields.get("cpu family"), fields.get("model")
    return {
        "cpu_model": fields.get("model name"),
        "cpu_family": int(family) if family and family.isdigit() else family,
        "cpu_model_number": int(model) if model and model.isdigit() else model,
        "vector_flags": {flag: flag in flags for flag in VECTOR_FLAGS},
        "logical_cpus": logical_cpus,
    }


def this_cpu() -> dict[str, Any]:
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        text = ""
    return cpu_description(text, os.cpu_count())


# ---------------------------------------------------------------- reading the two programs


def cleanrl_iteration_ends(lines: Sequence[Line], batch_size: int) -> tuple[list[float], list[int]]:
    """When each of CleanRL's iterations ended (its ``global_step=`` lines), and the SPS it printed itself.

    CleanRL's own ``SPS:`` is global_step over the time since its start, compilation included: recorded, not
    used for the steady rate.
    """
    ends, own_sps = [], []
    for seconds, text in lines:
        if match := CLEANRL_STEP.match(text):
            step = int(match.group(1))
            if step != (len(ends) + 1) * batch_size:
                raise ValueError(f"CleanRL printed global_step={step} after {len(ends)} iterations of {batch_size}")
            ends.append(seconds)
        elif match := CLEANRL_SPS.match(text):
            own_sps.append(int(match.group(1)))
    return ends, own_sps


def ppo_eqx_iteration_ends(lines: Sequence[Line], records: Sequence[dict[str, Any]], batch_size: int) -> list[float]:
    """When each of ppo-eqx's iterations ended: its "compiled" line, then each iteration's own time.

    metrics.jsonl's ``sps`` is that iteration's steps over its time; ``time_elapsed`` is not used, as a record is
    written only once the next iteration has been dispatched (which on the CPU runs it).
    """
    compiled = [seconds for seconds, text in lines if PPO_EQX_COMPILED.match(text)]
    if not compiled:
        raise ValueError("ppo-eqx printed no 'ppo-eqx: compiled one iteration in ... s' line")
    ends, now = [], compiled[0]
    for number, record in enumerate(records, start=1):
        if record["iteration"] != number:
            raise ValueError(f"metrics.jsonl's record {number} is iteration {record['iteration']}")
        now += batch_size / record["sps"]
        ends.append(now)
    return ends


def summarise(ends: Sequence[float], batch_size: int) -> dict[str, float]:
    """Steady rate, time to the first finished iteration and the second iteration's extra time, from the
    seconds (since the process started) at which each iteration ended."""
    if len(ends) < MIN_ITERATIONS:
        raise ValueError(f"{len(ends)} iterations finished; a steady rate needs at least {MIN_ITERATIONS}")
    durations = [later - earlier for earlier, later in zip(ends, ends[1:], strict=False)]  # iterations 2, 3, ...
    steady = durations[1:]
    steady_s = statistics.median(steady)
    return {
        "steady_sps": statistics.median(batch_size / seconds for seconds in steady),
        "steady_iteration_s": steady_s,
        "first_iteration_s": ends[0],
        "second_iteration_s": durations[0],
        "second_iteration_extra_s": durations[0] - steady_s,
        "iterations": len(ends),
        "steady_iterations": len(steady),
    }


# ---------------------------------------------------------------- watching a process


class PeakSampler:
    """Calls ``measure()`` every ``interval`` seconds on a thread until ``stop()``; ``peak`` is the largest value.

    ``measure`` returns bytes, or None once there is nothing left to measure.
    """

    def __init__(self, measure: Callable[[], int | None], interval: float = 0.1):
        self.measure, self.interval = measure, interval
        self.peak = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while True:
            value = self.measure()
            if value is not None:
                self.peak = max(self.peak, value)
                self.samples += 1
            if self._stop.wait(self.interval):
                return

    def start(self) -> "PeakSampler":
        self._thread.start()
        return self

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


def tree_rss(pid: int) -> int | None:
    """Resident bytes of process ``pid`` and all its descendants now; None once it is gone."""
    import psutil

    try:
        root = psutil.Process(pid)
        processes = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return None
    total = 0
    for process in processes:
        try:
            total += process.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total


@dataclass
class Finished:
    command: list[str]
    returncode: int
    wall_s: float
    lines: list[Line] = field(default_factory=list)
    sampled_peak_bytes: int = 0
    maxrss_bytes: int = 0  # the kernel's maximum resident size of the process (wait4), its children's included

    @property
    def peak_rss_mib(self) -> float:
        return max(self.sampled_peak_bytes, self.maxrss_bytes) / 2**20

    def tail(self, count: int = 30) -> str:
        return "\n".join(text for _, text in self.lines[-count:])


def run_watched(command: list[str], env: dict[str, str], cwd: Path, timeout_s: float) -> Finished:
    """Run ``command``, time-stamping each line of its output (stdout and stderr) and sampling its memory."""
    start = time.perf_counter()
    process = subprocess.Popen(
        command, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
    )
    sampler = PeakSampler(lambda: tree_rss(process.pid)).start()
    timer = threading.Timer(timeout_s, process.kill)
    timer.start()
    lines: list[Line] = []
    assert process.stdout is not None
    with process.stdout:
        for text in process.stdout:
            lines.append((time.perf_counter() - start, text.rstrip("\n")))
    # wait4 reaps the process and reports its own maximum RSS, which sampling can miss between two samples.
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    wall_s = time.perf_counter() - start
    timer.cancel()
    return Finished(
        command=command,
        returncode=process.returncode,
        wall_s=wall_s,
        lines=lines,
        sampled_peak_bytes=sampler.stop(),
        maxrss_bytes=usage.ru_maxrss * 1024,  # KiB on Linux
    )


def python_output(python: str, code: str, env: dict[str, str]) -> str:
    done = subprocess.run([python, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"{python} -c ... failed: {done.stderr.strip().splitlines()[-1:]}")
    return done.stdout.strip()


def package_versions(python: str, env: dict[str, str], names: Sequence[str]) -> dict[str, str | None]:
    """The installed versions in ``python``'s environment, read from package metadata (nothing is imported)."""
    code = (
        "import importlib.metadata as m, json\n"
        "def v(n):\n"
        "    try:\n"
        "        return m.version(n)\n"
        "    except m.PackageNotFoundError:\n"
        "        return None\n"
        f"print(json.dumps({{n: v(n) for n in {list(names)!r}}}))"
    )
    return json.loads(python_output(python, code, env))


def conv_route(python: str, env: dict[str, str], conv_impl: str) -> dict[str, Any]:
    """What ppo-eqx's ``--conv-impl`` resolves to for Atari frames in ``env``, and whether the installed ppo_eqx
    reads PPO_EQX_KERNEL_ISA at all (if not, the variable is ignored)."""
    resolved = python_output(
        python,
        f"from ppo_eqx import resolve_conv_impl; print(resolve_conv_impl({conv_impl!r}, (4, 84, 84)))",
        env,
    ).splitlines()[-1]
    reads_variable = python_output(
        python,
        "import importlib.util, pathlib\n"
        "root = pathlib.Path(importlib.util.find_spec('ppo_eqx').origin).parent\n"
        f"print(any({KERNEL_ISA_VARIABLE!r} in p.read_text() for p in root.rglob('*.py')))",
        env,
    )
    return {"conv_impl": conv_impl, "resolved": resolved, "reads_kernel_isa_variable": reads_variable == "True"}


def ppo_eqx_environment(python: str, env: dict[str, str], conv_impl: str) -> dict[str, Any]:
    """Where ppo-eqx's figures hold (bench/_common.py's ``environment``), as ppo-eqx's process sees it: its
    XLA_FLAGS, its convolution route and the ISA its kernel is built for under ``env``."""
    code = (
        "import json, jax\n"
        "from ppo_eqx import resolve_conv_impl\n"
        "from ppo_eqx.cli.hardware import hardware_info\n"
        f"info = hardware_info(resolve_conv_impl({conv_impl!r}, (4, 84, 84)))\n"
        "info['backend'] = jax.default_backend()\n"
        "print(json.dumps(info))"
    )
    return json.loads(python_output(python, code, env).splitlines()[-1])


def avx2_caveat(isa: str, route: dict[str, Any]) -> str | None:
    """Why an ``--isa avx2`` figure of ppo-eqx is not an AVX2 one, or None when it is."""
    if isa == "avx2" and route["resolved"] == "kernel" and not route["reads_kernel_isa_variable"]:
        return (
            f"the installed ppo_eqx ignores {KERNEL_ISA_VARIABLE}: its C++ kernel runs AVX-512 code and only XLA's "
            "code is capped at AVX2 (--conv-impl matmul runs what an AVX2-only CPU gets from this ppo_eqx)"
        )
    return None


# ---------------------------------------------------------------- the run


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cleanrl-script", type=Path, required=True, help="CleanRL's ppo_atari_envpool_xla_jax.py")
    parser.add_argument("--cleanrl-python", type=Path, required=True, help="the python of a venv that runs it")
    parser.add_argument(
        "--ppo-eqx-python", type=Path, default=Path(sys.executable), help="the python with ppo_eqx (default: this one)"
    )
    length = parser.add_mutually_exclusive_group()
    length.add_argument("--iterations", type=int, default=None, help="iterations each program runs (default: 6)")
    length.add_argument("--total-timesteps", type=int, default=None, help="env steps each program runs instead")
    parser.add_argument("--isa", choices=("native", "avx2"), default="native", help="cap both programs at AVX2")
    parser.add_argument("--env-id", default="Breakout-v5")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--num-envs", type=int, default=8)
    parser.add_argument("--num-steps", type=int, default=128)
    parser.add_argument("--conv-impl", default="auto", help="ppo-eqx's --conv-impl (default: auto)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds after which a program is killed")
    parser.add_argument(
        "--json",
        type=Path,
        default=None,
        help="where to write the results (default: bench/results/cleanrl_side_by_side.json, _avx2.json with "
        "--isa avx2)",
    )
    args = parser.parse_args(argv)

    def refuse(message: str) -> None:
        parser.error(message)  # one line naming the value and what is allowed; exit status 2

    if not args.cleanrl_script.is_file():
        refuse(f"--cleanrl-script {args.cleanrl_script}: no such file; allowed: the path of CleanRL's script")
    for flag, python in (("--cleanrl-python", args.cleanrl_python), ("--ppo-eqx-python", args.ppo_eqx_python)):
        if not (python.is_file() and os.access(python, os.X_OK)):
            refuse(f"{flag} {python}: not an executable file; allowed: a venv's bin/python")
    for flag in ("num_envs", "num_steps"):
        if getattr(args, flag) < 1:
            refuse(f"--{flag.replace('_', '-')} {getattr(args, flag)}: allowed: 1 or more")
    batch_size = args.num_envs * args.num_steps
    if args.total_timesteps is not None:
        if args.total_timesteps < MIN_ITERATIONS * batch_size:
            refuse(
                f"--total-timesteps {args.total_timesteps}: allowed: at least {MIN_ITERATIONS} iterations of "
                f"{batch_size} steps ({MIN_ITERATIONS * batch_size})"
            )
        args.iterations = args.total_timesteps // batch_size
    elif args.iterations is None:
        args.iterations = 6
    elif args.iterations < MIN_ITERATIONS:
        refuse(f"--iterations {args.iterations}: allowed: {MIN_ITERATIONS} or more (the first two compile)")
    args.total_timesteps = args.iterations * batch_size  # both programs run whole iterations only
    if args.timeout <= 0:
        refuse(f"--timeout {args.timeout}: allowed: a positive number of seconds")
    if args.json is None:
        args.json = RESULTS / (
            "cleanrl_side_by_side.json" if args.isa == "native" else "cleanrl_side_by_side_avx2.json"
        )
    return args


def environments(isa: str) -> tuple[dict[str, str], dict[str, str]]:
    """The environments of CleanRL's process and of ppo-eqx's: this one, unbuffered, with the ISA cap."""
    base = dict(os.environ, PYTHONUNBUFFERED="1")
    if isa == "avx2":
        base["XLA_FLAGS"] = " ".join(filter(None, [base.get("XLA_FLAGS"), AVX2_XLA_FLAG]))
    return base, dict(base, **({KERNEL_ISA_VARIABLE: "avx2"} if isa == "avx2" else {}))


def settings_flags(args: argparse.Namespace) -> list[str]:
    """CleanRL's settings, given to both programs in the same words."""
    return [
        *("--env-id", args.env_id, "--seed", str(args.seed), "--num-envs", str(args.num_envs)),
        *("--num-steps", str(args.num_steps), "--total-timesteps", str(args.total_timesteps)),
    ]


def run_cleanrl(args: argparse.Namespace, env: dict[str, str], work: Path) -> tuple[Finished, dict[str, Any]]:
    command = [str(args.cleanrl_python), str(args.cleanrl_script.resolve()), *settings_flags(args)]
    finished = checked(run_watched(command, env, work / "cleanrl", args.timeout))
    ends, own_sps = cleanrl_iteration_ends(finished.lines, args.num_envs * args.num_steps)
    row = summarise(ends, args.num_envs * args.num_steps)
    return finished, {**row, "own_last_sps": own_sps[-1] if own_sps else None}


def run_ppo_eqx(args: argparse.Namespace, env: dict[str, str], work: Path) -> tuple[Finished, dict[str, Any]]:
    run_dir = work / "ppo_eqx_run"
    command = [
        *(str(args.ppo_eqx_python), "-m", "ppo_eqx", "train", *settings_flags(args)),
        *("--conv-impl", args.conv_impl, "--run-dir", str(run_dir), "--no-progress"),
    ]
    finished = checked(run_watched(command, env, work / "ppo_eqx", args.timeout))
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    ends = ppo_eqx_iteration_ends(finished.lines, records, args.num_envs * args.num_steps)
    row = summarise(ends, args.num_envs * args.num_steps)
    hardware = json.loads((run_dir / "hardware.json").read_text())
    config = json.loads((run_dir / "config.json").read_text())
    return finished, {**row, "run_dir_hardware": hardware, "run_dir_conv_impl": config.get("conv_impl")}


def checked(finished: Finished) -> Finished:
    if finished.returncode != 0:
        sys.exit(f"{' '.join(finished.command)} exited with {finished.returncode}:\n{finished.tail()}")
    return finished


def git_commit() -> str | None:
    done = subprocess.run(["git", "-C", str(ROOT), "describe", "--always", "--dirty"], capture_output=True, text=True)
    return done.stdout.strip() or None


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    cleanrl_env, ppo_eqx_env = environments(args.isa)
    versions = ("jax", "jaxlib", "envpool", "flax", "optax", "equinox", "torch", "numpy")
    header: dict[str, Any] = {
        "cpu": this_cpu(),
        "isa": args.isa,
        "xla_flags": ppo_eqx_env.get("XLA_FLAGS"),
        "kernel_isa": ppo_eqx_env.get(KERNEL_ISA_VARIABLE),
        "settings": {
            "env_id": args.env_id,
            "seed": args.seed,
            "num_envs": args.num_envs,
            "num_steps": args.num_steps,
            "iterations": args.iterations,
            "total_timesteps": args.total_timesteps,
        },
        "ppo_eqx_commit": git_commit(),
        "ppo_eqx_conv_route": conv_route(str(args.ppo_eqx_python), ppo_eqx_env, args.conv_impl),
        "environment": ppo_eqx_environment(str(args.ppo_eqx_python), ppo_eqx_env, args.conv_impl),
        "cleanrl_script": str(args.cleanrl_script.resolve()),
        "cleanrl_versions": package_versions(str(args.cleanrl_python), cleanrl_env, versions),
        "ppo_eqx_versions": package_versions(str(args.ppo_eqx_python), ppo_eqx_env, versions),
    }
    if caveat := avx2_caveat(args.isa, header["ppo_eqx_conv_route"]):
        header["caveat"] = caveat
        print(f"# warning: {caveat}", flush=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="cleanrl_side_by_side_") as tmp:
        work = Path(tmp)
        (work / "cleanrl").mkdir()  # CleanRL writes runs/ into its working directory
        (work / "ppo_eqx").mkdir()
        for name, runner, env in (("cleanrl", run_cleanrl, cleanrl_env), ("ppo-eqx", run_ppo_eqx, ppo_eqx_env)):
            print(f"# running {name} ({args.iterations} iterations, --isa {args.isa}) ...", flush=True)
            finished, row = runner(args, env, work)
            extra = {key: row.pop(key) for key in list(row) if key.startswith("run_dir_")}
            header.update({f"ppo_eqx_{key}": value for key, value in extra.items()})
            rows.append(
                {
                    "program": name,
                    **row,
                    "peak_rss_mib": finished.peak_rss_mib,
                    "sampled_peak_rss_mib": finished.sampled_peak_bytes / 2**20,
                    "maxrss_mib": finished.maxrss_bytes / 2**20,
                    "wall_s": finished.wall_s,
                }
            )
            header.setdefault("commands", {})[name] = " ".join(finished.command)
    cleanrl, ppo_eqx = rows
    header["ratios_ppo_eqx_over_cleanrl"] = {
        "steady_sps": ppo_eqx["steady_sps"] / cleanrl["steady_sps"],
        "first_iteration_s": ppo_eqx["first_iteration_s"] / cleanrl["first_iteration_s"],
        "peak_rss_mib": ppo_eqx["peak_rss_mib"] / cleanrl["peak_rss_mib"],
    }
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _common import write_results  # jax comes with it: only now, after the measured processes

    write_results(rows, header, args.json)


if __name__ == "__main__":
    main()
