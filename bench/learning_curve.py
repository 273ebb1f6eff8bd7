"""Learning shown, not claimed: train several seeds of one game in one program and plot their learning curves
beside random play's score.

    python bench/learning_curve.py                      # Breakout-v5, 1M env steps per agent, seeds 1 and 2
    python bench/learning_curve.py --plot-only --run-dir runs/learning_curve   # plot a run, finished or not
    python bench/learning_curve.py --env-backend gymnax --env-id Breakout-MinAtar --total-timesteps 10000000 \
        --num-seeds 4 --run-dir runs/breakout_minatar --out bench/results/learning_curve_breakout_minatar

Without --plot-only: a finished run in RUN_DIR (every agent's summary.json written) is only plotted; an
unfinished one is continued (`ppo-eqx train --resume RUN_DIR`) and then plotted; an empty or missing RUN_DIR
gets a new run (`ppo-eqx train --env-id ... --num-seeds ... --run-dir RUN_DIR`). The flags must then match the
run already there. Training runs as a child process with this interpreter; Ctrl-C stops it after its iteration
(checkpointed), and running this again continues it. Do not start this on a run that is still training
elsewhere: use --plot-only.

Writes OUT.png and OUT.json (the curves, each seed's final return, random play's score, CleanRL's published
10M-step return, the wall time, the hardware and the command). A run trained with settings this script has no
flags for (a preset, more envs: plotted with --plot-only) has them named in the caption and the JSON
(``settings_apart``) and in its training command; the script's command is then the plot's. The final return is the
report's convention (ppo_eqx_bench.stats.final_return: the mean over the last 10% of iterations). CleanRL's
published returns are at 10M steps, measured on a GPU: they are stated in the caption and the JSON, not drawn,
since a 1M-step curve is not comparable with them. A MinAtar game's published 10M-step PPO return (gymnax-blines',
the return that gymnax's README gives its PPO checkpoint) is drawn: a 10M-step run on gymnax is its like.

gymnax-blines reports its final policy played afresh, not its training episodes: `--eval-episodes 164` plays
each seed's final checkpoint for 164 episodes (`ppo-eqx eval`, sampled actions; its eval.json is kept in the
agent's directory and read again next time) and adds their mean to the caption and the JSON.
"""

import argparse
import json
import math
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # run from a checkout without installing the package
    sys.path.insert(0, str(REPO_ROOT))

from ppo_eqx.config import PPOConfig  # noqa: E402
from ppo_eqx.errors import ConfigError, RunDirError  # noqa: E402
from ppo_eqx.host.run_dir import names as rundir  # noqa: E402
from ppo_eqx.host.run_dir.manifest import holds_run  # noqa: E402
from ppo_eqx_bench import launch  # noqa: E402
from ppo_eqx_bench.anchors import ANCHORS_CSV, HUMAN_RANDOM_CSV, PUBLISHED_10M, AnchorError, load_anchors  # noqa: E402
from ppo_eqx_bench.runs import Run, find_run_dirs, load_run  # noqa: E402
from ppo_eqx_bench.stats import FINAL_FRACTION, WINDOW, final_return, steps_text  # noqa: E402

NO_RUN, UNFINISHED, FINISHED = "no run", "unfinished", "finished"
EVAL_JSON = "eval.json"
"""What `ppo-eqx eval AGENT_DIR` writes in the agent's directory."""
DEFAULTS = {
    "env_id": "Breakout-v5",
    "total_timesteps": 1_000_000,
    "num_seeds": 2,
    "seed": 1,
    "env_backend": "envpool",
    "network_init": "cleanrl",
}


SHOWN = (
    "num_envs", "num_steps", "num_minibatches", "update_epochs", "learning_rate", "anneal_lr", "gamma", "gae_lambda",
    "clip_coef", "clip_vloss", "ent_coef", "vf_coef", "max_grad_norm", "norm_adv", "loss", "rollout_on",
)  # fmt: skip
"""The settings a plot names where a run's differ from its task's defaults (``settings_apart``)."""


class LearningCurveError(Exception):
    """Why the script stops; the message is one line."""


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env-id", default=DEFAULTS["env_id"], help="(default: %(default)s)")
    parser.add_argument(
        "--total-timesteps", type=int, default=DEFAULTS["total_timesteps"], help="per agent (default: %(default)s)"
    )
    parser.add_argument("--num-seeds", type=int, default=DEFAULTS["num_seeds"], help="(default: %(default)s)")
    parser.add_argument("--seed", type=int, default=DEFAULTS["seed"], help="the first seed (default: %(default)s)")
    parser.add_argument(
        "--env-backend", default=DEFAULTS["env_backend"], help="envpool, ale or gymnax (default: %(default)s)"
    )
    parser.add_argument(
        "--network-init", default=DEFAULTS["network_init"], help="cleanrl or gymnax-blines (default: %(default)s)"
    )
    parser.add_argument("--run-dir", type=Path, default=Path("runs/learning_curve"), help="(default: %(default)s)")
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("bench/results/learning_curve"),
        help="writes OUT.png and OUT.json (default: %(default)s)",
    )
    parser.add_argument(
        "--plot-only", action="store_true", help="train nothing: plot what RUN_DIR holds, finished or not"
    )
    parser.add_argument(
        "--eval-episodes",
        type=int,
        default=0,
        help="play each seed's final policy for this many episodes (`ppo-eqx eval`, sampled actions, envs of "
        "its own) and report their mean beside the training curve: gymnax-blines' way of reporting (default: 0, "
        "none)",
    )
    args = parser.parse_args(argv)
    if args.total_timesteps < 1 or args.num_seeds < 1:
        parser.error("--total-timesteps and --num-seeds must be positive")
    if args.eval_episodes < 0:
        parser.error(f"--eval-episodes {args.eval_episodes}: allowed: 0 (none) or a positive number of episodes")
    return args


# ---- reading the run directory ----


def saved_config(run_dir: Path) -> dict[str, Any] | None:
    """The run's own config: seeds.json of a several-agent run, else config.json; None when neither exists."""
    for name in (rundir.SEEDS_CONFIG, rundir.CONFIG):
        path = run_dir / name
        if path.is_file():
            try:
                config = json.loads(path.read_text())
            except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
                raise LearningCurveError(f"cannot read {path}: {error}") from None
            if not isinstance(config, dict):
                raise LearningCurveError(f"{path} is not a config")
            return config
    return None


def run_state(run_dir: Path) -> str:
    """NO_RUN, UNFINISHED or FINISHED (every agent's summary.json exists) for the run in ``run_dir``."""
    if not holds_run(run_dir):
        return NO_RUN
    config = saved_config(run_dir)
    if config is None:
        raise LearningCurveError(f"{run_dir} holds part of a run but no {rundir.SEEDS_CONFIG} or {rundir.CONFIG}")
    try:
        names = PPOConfig.from_dict(config).agent_names()
    except ConfigError as error:
        raise LearningCurveError(f"{run_dir}: its config is not valid: {error}") from None
    agents = rundir.agent_dirs(run_dir, names)
    return FINISHED if all((agent / rundir.SUMMARY).is_file() for agent in agents) else UNFINISHED


def read_runs(run_dir: Path) -> list[Run]:
    """Every agent's run under ``run_dir``, finished or not, by seed; one that cannot be read yet is skipped
    with a note (an agent that has not logged its first iteration)."""
    runs = []
    for path in find_run_dirs(run_dir):
        try:
            runs.append(load_run(path, include_unfinished=True))
        except RunDirError as error:
            print(f"note: skipped {path}: {error}", file=sys.stderr)
    return sorted(runs, key=lambda run: (run.seed, str(run.run_dir)))


# ---- the curves (pure) ----


def _finite_or_none(value: float) -> float | None:
    return float(value) if math.isfinite(value) else None


def seed_curve(run: Run, run_dir: Path) -> dict[str, Any]:
    """One agent's curve as JSON-ready data: null where no episode finished in an iteration."""
    try:
        name = str(run.run_dir.relative_to(run_dir))
    except ValueError:
        name = str(run.run_dir)
    return {
        "seed": run.seed,
        "agent": name,
        "finished": run.finished,
        "global_step": [int(step) for step in run.global_step],
        "episodic_return": [_finite_or_none(value) for value in run.episodic_return],
        "final_return": _finite_or_none(final_return(run.episodic_return)),
        "final_step": run.final_step,
        "wall_seconds": run.final_seconds,
    }


def describe_hardware(hardware: dict[str, Any] | None) -> str:
    """ "2-core CPU" (or the accelerator, "1 x TPU v5 lite", or the GPU's name) from a run's hardware.json."""
    if not hardware:
        return "hardware unknown"
    if hardware.get("accelerator"):
        return str(hardware["accelerator"])
    if hardware.get("gpu_name"):
        return str(hardware["gpu_name"])
    cores = hardware.get("cpu_count")
    return f"{cores}-core CPU" if cores else "CPU"


def script_command(config: dict[str, Any], out: Path) -> str:
    """The command that trains such a run afresh (in the default run directory) and plots it."""
    args = ["python", "bench/learning_curve.py"]
    for name in DEFAULTS:
        value = config.get(name, DEFAULTS[name])
        if name != "network_init" or value != DEFAULTS[name]:
            args += ["--" + name.replace("_", "-"), str(value)]
    return shlex.join([*args, "--out", str(out)])


def settings_apart(config: dict[str, Any]) -> dict[str, Any]:
    """The run's preset and network where they are not the defaults, and its settings among ``SHOWN`` that they do
    not give (``PPOConfig.for_task``: the task's preset over CleanRL's defaults), in the order of ``SHOWN``: what a
    run trained elsewhere (``--plot-only``) was trained with beyond this script's flags."""
    chosen = {name: saved_setting(config, name) for name in ("preset", "network")}
    try:
        task = PPOConfig.for_task(str(config["env_id"]), saved_setting(config, "env_backend"), **chosen).to_dict()
    except (ConfigError, ImportError, KeyError) as error:
        raise LearningCurveError(f"cannot tell the run's settings from its task's defaults: {error}") from None
    apart = {name: value for name, value in chosen.items() if value != getattr(PPOConfig(), name)}
    return apart | {name: config[name] for name in SHOWN if name in config and config[name] != task[name]}


def flags_of(settings: dict[str, Any]) -> list[str]:
    """``ppo-eqx train``'s flags that set ``settings`` (``--no-NAME`` for a false boolean)."""
    flags: list[str] = []
    for name, value in settings.items():
        flag = name.replace("_", "-")
        flags += [f"--{flag}" if value else f"--no-{flag}"] if isinstance(value, bool) else [f"--{flag}", str(value)]
    return flags


def train_args(
    env_id: str,
    total_timesteps: int,
    num_seeds: int,
    seed: int,
    run_dir: Path,
    env_backend: str = "envpool",
    network_init: str = "cleanrl",
    apart: dict[str, Any] | None = None,
) -> list[str]:
    """`ppo-eqx train`'s arguments for a new run (``--network-init`` only where it is not the default; ``apart``,
    settings beyond this script's flags, as ``settings_apart`` gives them)."""
    init = [] if network_init == DEFAULTS["network_init"] else ["--network-init", network_init]
    return [
        "train",
        *init,
        "--env-backend",
        env_backend,
        "--env-id",
        env_id,
        "--total-timesteps",
        str(total_timesteps),
        "--num-seeds",
        str(num_seeds),
        "--seed",
        str(seed),
        *flags_of(apart or {}),
        "--run-dir",
        str(run_dir),
        "--no-progress",
    ]


def curve_data(
    runs: Sequence[Run],
    config: dict[str, Any],
    run_dir: Path,
    *,
    random_score: float | None,
    cleanrl_10m: dict[str, Any] | None,
    out: Path,
    window: int = WINDOW,
    published: dict[str, Any] | None = None,
    evals: Sequence[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Everything the plot and the JSON show, JSON-ready (no NaN: null instead). ``evals``: each run's final
    policy played afresh (``final_policy_eval``), in the order of ``runs``."""
    if not runs:
        raise ValueError("curve_data needs at least one run")
    seeds = [seed_curve(run, run_dir) for run in runs]
    if evals is not None:
        for seed, played in zip(seeds, evals, strict=True):
            seed["eval"] = played
    hardware = next((run.hardware for run in runs if run.hardware), None)
    env_id = str(config.get("env_id", runs[0].env_id))
    total_timesteps = config.get("total_timesteps")
    num_seeds = config.get("num_seeds", len(runs))
    first_seed = int(config.get("seed", runs[0].seed))
    apart = settings_apart({"env_id": env_id, **config})
    hyperparameters = "gymnax-blines' hyperparameters" if published else "CleanRL's hyperparameters"
    if saved_setting(config, "network_init") != "cleanrl":
        hyperparameters += ", gymnax-blines' initialisation"
    if apart:
        hyperparameters += ", " + ", ".join(f"{name}={value}" for name, value in apart.items())
    # A run with settings this script has no flags for is plotted, not trained, by it.
    plotted = shlex.join(
        ["python", "bench/learning_curve.py", "--plot-only", "--run-dir", str(run_dir), "--out", str(out)]
    )
    return {
        "env_id": env_id,
        "total_timesteps": total_timesteps,
        "num_seeds": num_seeds,
        "finished": all(run.finished for run in runs),
        "steps_done": min(run.final_step for run in runs),
        "config": config,
        "run_dir": str(run_dir),
        "moving_average_iterations": window,
        "final_return_convention": f"mean episodic_return over the last {FINAL_FRACTION:.0%} of iterations "
        "(ppo_eqx_bench.stats.final_return)",
        "seeds": seeds,
        "random_score": random_score,
        "random_score_source": f"ppo_eqx_bench/data/{HUMAN_RANDOM_CSV}",
        "cleanrl_10m_return": cleanrl_10m,
        "published_return": published,
        "eval_mean_return": None if evals is None else float(sum(e["mean_return"] for e in evals) / len(evals)),
        "settings_apart": apart,
        "hyperparameters_text": hyperparameters,
        "wall_seconds": max(run.final_seconds for run in runs),  # the agents trained together, in one program
        "hardware": hardware,
        "hardware_text": describe_hardware(hardware),
        "command": plotted if apart else script_command({"num_seeds": len(runs), **config}, out),
        "train_command": shlex.join(
            [
                "ppo-eqx",
                *train_args(
                    env_id,
                    int(total_timesteps or 0),
                    int(num_seeds),
                    first_seed,
                    run_dir,
                    str(config.get("env_backend", DEFAULTS["env_backend"])),
                    saved_setting(config, "network_init"),
                    apart,
                ),
            ]
        ),
    }


def reference_scores(env_id: str) -> tuple[float | None, dict[str, Any] | None]:
    """Random play's score and CleanRL's published 10M-step return of ``env_id`` from the shipped tables;
    None for a game that is not in them (CartPole-v1)."""
    try:
        anchors, human_random = load_anchors()
    except AnchorError as error:
        raise LearningCurveError(str(error)) from None
    scores = human_random.get(env_id)
    random_score = _finite_or_none(scores.random_score) if scores else None
    anchor = anchors.get(env_id)
    cleanrl = None
    if anchor and math.isfinite(anchor.cleanrl_return_mean):
        cleanrl = {
            "mean": anchor.cleanrl_return_mean,
            "std": _finite_or_none(anchor.cleanrl_return_std),
            "seeds": 3,
            "steps": 10_000_000,
            "label": "CleanRL at 10M steps (GPU)",
            "source": f"ppo_eqx_bench/data/{ANCHORS_CSV}",
            "note": "published for 10M steps per run, measured on a GPU: not comparable with a shorter run",
        }
    return random_score, cleanrl


def published_return(env_id: str) -> dict[str, Any] | None:
    """The published 10M-step PPO return of a MinAtar game (``PUBLISHED_10M``); None for any other task."""
    if env_id not in PUBLISHED_10M:
        return None
    return {
        "mean": PUBLISHED_10M[env_id],
        "steps": 10_000_000,
        "label": "gymnax-blines' PPO at 10M steps",
        "source": "gymnax's README (gymnax-blines' PPO checkpoints), as issue 25 quotes it",
    }


def json_text(data: dict[str, Any]) -> str:
    """``data`` as JSON with one line per top-level field and per seed (the curves are long), no NaN."""

    def dump(value: Any) -> str:
        return json.dumps(value, allow_nan=False)

    fields = []
    for key, value in data.items():
        if key == "seeds":
            seeds = ",\n".join(f"  {dump(seed)}" for seed in value)
            fields.append(f" {dump(key)}: [\n{seeds}\n ]")
        else:
            fields.append(f" {dump(key)}: {dump(value)}")
    return "{\n" + ",\n".join(fields) + "\n}\n"


def write_outputs(data: dict[str, Any], out: Path) -> tuple[Path, Path]:
    """OUT.png and OUT.json."""
    out.parent.mkdir(parents=True, exist_ok=True)
    png, json_path = out.with_name(out.name + ".png"), out.with_name(out.name + ".json")
    from ppo_eqx_bench.plots import learning_curve_figure  # matplotlib only when plotting

    learning_curve_figure(data).savefig(png, dpi=100)
    json_path.write_text(json_text(data))
    return png, json_path


# ---- training ----


def run_ppo_eqx(arguments: list[str], doing: str) -> int:
    """``ppo-eqx ARGUMENTS`` said and run to its end (``launch.run_to_end``); its exit status. LearningCurveError
    naming ``doing`` when it cannot start."""
    print(f"learning_curve.py: {shlex.join([*launch.train_command(), *arguments])}", flush=True)
    try:
        return launch.run_to_end(arguments)
    except OSError as error:
        raise LearningCurveError(f"cannot start {doing}: {error}") from None


def train(arguments: list[str]) -> None:
    """Run ``ppo-eqx ARGUMENTS`` to its end (``launch.run_to_end``); LearningCurveError if it fails."""
    returncode = run_ppo_eqx(arguments, "training")
    if returncode in (130, 143):  # the trainer's exit after SIGINT or SIGTERM, checkpointed
        raise LearningCurveError(f"training stopped (exit {returncode}); run this again to continue it")
    if returncode != 0:
        raise LearningCurveError(f"training failed (exit {returncode}; its output is above)")


def final_policy_eval(run: Run, episodes: int) -> dict[str, Any]:
    """``run``'s final policy played for ``episodes`` episodes (sampled actions, evaluation envs of its own):
    the agent's eval.json, played by `ppo-eqx eval AGENT_DIR --episodes N` unless it already holds those
    episodes of the final checkpoint."""
    path = run.run_dir / EVAL_JSON
    record = _read_eval(path)
    wanted = {"episodes": episodes, "greedy": False, "global_step": run.final_step}
    if record is None or any(record.get(name) != value for name, value in wanted.items()):
        returncode = run_ppo_eqx(["eval", str(run.run_dir), "--episodes", str(episodes)], "the evaluation")
        if returncode != 0:
            raise LearningCurveError(f"the evaluation of {run.run_dir} failed (exit {returncode}; its output is above)")
        record = _read_eval(path)
        if record is None:
            raise LearningCurveError(f"the evaluation of {run.run_dir} wrote no {EVAL_JSON}")
    return {"episodes": record["episodes"], "mean_return": record["mean_return"], "seed": record.get("seed")}


def _read_eval(path: Path) -> dict[str, Any] | None:
    """An agent's eval.json; None when there is none or it cannot be read (then it is played again)."""
    try:
        record = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return record if isinstance(record, dict) and "mean_return" in record else None


def saved_setting(config: dict[str, Any], name: str) -> Any:
    """A setting of a saved config; a field it lacks (saved before the field existed, as ``network_init``) has
    PPOConfig's default, as ``PPOConfig.from_dict`` reads it."""
    return config.get(name, getattr(PPOConfig(), name))


def _check_matches(config: dict[str, Any], args: argparse.Namespace) -> None:
    """A run already in RUN_DIR is only continued or plotted when the flags ask for that run."""
    wanted = {name: getattr(args, name) for name in DEFAULTS}
    saved = {name: saved_setting(config, name) for name in DEFAULTS}
    differ = [f"{name}={saved[name]!r}" for name, value in wanted.items() if saved[name] != value]
    if differ:
        raise LearningCurveError(
            f"{args.run_dir} holds another run ({', '.join(differ)}); pass its flags, --plot-only, or another --run-dir"
        )


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    run_dir: Path = args.run_dir
    try:
        state = run_state(run_dir)
        if args.plot_only and state == NO_RUN:
            raise LearningCurveError(f"{run_dir}: no run there to plot")
        if not args.plot_only and state != FINISHED:
            if state == UNFINISHED:
                _check_matches(saved_config(run_dir) or {}, args)
                train(["train", "--resume", str(run_dir), "--no-progress"])
            else:
                train(
                    train_args(
                        args.env_id,
                        args.total_timesteps,
                        args.num_seeds,
                        args.seed,
                        run_dir,
                        args.env_backend,
                        args.network_init,
                    )
                )
            if run_state(run_dir) != FINISHED:
                raise LearningCurveError(f"training ended without finishing {run_dir}; run this again to continue")
        elif not args.plot_only:
            _check_matches(saved_config(run_dir) or {}, args)
        if args.eval_episodes and run_state(run_dir) != FINISHED:
            raise LearningCurveError(
                f"--eval-episodes {args.eval_episodes} plays finished runs' final policies; {run_dir} is not finished"
            )
        runs = read_runs(run_dir)
        if not runs:
            raise LearningCurveError(f"{run_dir}: no agent has logged an iteration yet")
        evals = [final_policy_eval(run, args.eval_episodes) for run in runs] if args.eval_episodes else None
        config = saved_config(run_dir) or runs[0].config
        env_id = str(config.get("env_id", runs[0].env_id))
        random_score, cleanrl = reference_scores(env_id)
        data = curve_data(
            runs,
            config,
            run_dir,
            random_score=random_score,
            cleanrl_10m=cleanrl,
            out=args.out,
            published=published_return(env_id),
            evals=evals,
        )
        png, json_path = write_outputs(data, args.out)
    except (LearningCurveError, RunDirError, OSError) as error:
        print(f"learning_curve.py: {error}", file=sys.stderr)
        return 1
    for seed in data["seeds"]:
        final = "none yet" if seed["final_return"] is None else f"{seed['final_return']:.2f}"
        print(f"seed {seed['seed']}: {steps_text(seed['final_step'])} steps, final return {final}")
    print(f"written {png} and {json_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
