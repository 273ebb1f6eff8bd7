"""Every failure is one line (issue 23): bad environment variables, symlink loops, ALE games without a usable
ROM, the bench scripts' arguments, absurd sweeps, and Ctrl-C at any moment of `train` and `eval`.

Each case runs the command line in a process of its own (``processes.Child``), as a user would; the bad-input
cases run two at a time in one fixture, the Ctrl-C cases one by one (they act at observed moments).
"""

import concurrent.futures
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import pytest

from .processes import Child, bench_script, ppo_eqx, worker_env
from .run_files import BATCH, tiny

pytestmark = pytest.mark.subprocess

NOISE = ("Traceback", "KeyboardInterrupt", "Exception ignored", "Fatal Python error")
"""Words of Python's own reports, which a one-line failure never shows."""
SWEEP_TIMEOUT_S = 20
"""An absurd sweep is refused before anything is computed: within this, even on a slow machine."""
ANY_SYMLINK_WORDS = ("symbolic link", "symlink")


class Case(NamedTuple):
    args: Callable[[Path, Path], list[str]]
    """(case directory, a finished run) -> the arguments of python: ``ppo_eqx(...)`` or ``bench_script(...)``."""
    words: tuple[str | tuple[str, ...], ...]
    """Each is in the error line (a tuple: one of its words is)."""
    env: dict[str, str] = {}
    absent: str = "run"
    """What must not exist in the case directory afterwards (nothing was written)."""
    forbidden: tuple[str, ...] = ()
    """Words the error line must not hold (it must not blame a good checkpoint)."""
    prefix: str = "ppo-eqx: error: "


def train(case: Path, run: Path, *extra: str) -> list[str]:
    return ppo_eqx(*tiny(case / "run", 1), *extra)


def evaluate(case: Path, run: Path, *extra: str) -> list[str]:
    return ppo_eqx("eval", str(run), "--episodes", "1", "--output", str(case / "eval.json"), *extra)


def report(*args: str) -> Callable[[Path, Path], list[str]]:
    def command(case: Path, run: Path) -> list[str]:
        paths = [str(run) if arg == "RUN" else str(case / arg[5:]) if arg.startswith("CASE/") else arg for arg in args]
        return bench_script("report", *paths, "--no-plots")

    return command


def absurd_sweep(case: Path, run: Path) -> list[str]:
    """2**20 agents: 1024 learning rates x 1024 seeds."""
    rates = ",".join(f"{2.5e-4 * (1 + i / 1024):.8g}" for i in range(1024))
    sweep = ["--sweep", f"learning-rate={rates}", "--num-seeds", "1024"]
    return ppo_eqx(*tiny(case / "run", 1), "--num-steps", "4", *sweep)


def ale(env_id: str) -> Callable[[Path, Path], list[str]]:
    def command(case: Path, run: Path) -> list[str]:
        args = ["--env-backend", "ale", "--env-id", env_id, "--num-envs", "2", "--num-steps", "8"]
        return ppo_eqx("train", *args, "--total-timesteps", "16", "--no-progress", "--run-dir", str(case / "run"))

    return command


def platform(name: str) -> dict[str, str]:
    return {"JAX_PLATFORMS": name}


EVAL_OUT = "eval.json"
UNUSABLE_ROMS = ("Combat-v5", "Joust-v5", "MazeCraze-v5", "Warlords-v5")
"""ALE ids whose ROM ale-py 0.12.1 ships but cannot load for one player (``ALEInterface.isSupportedROM`` is None):
ALE ends the process with exit 1 when one is made."""
CASES = {
    **{
        f"train-JAX_PLATFORMS={name}": Case(train, ("JAX_PLATFORMS", name), platform(name))
        for name in ("cuda", "tpu", "bogus")
    },
    **{  # the plan computes an env written in JAX before the devices are joined: checked before it (issue 53)
        f"train-gymnax-JAX_PLATFORMS={name}": Case(
            lambda case, run: train(case, run, "--env-backend", "gymnax"), ("JAX_PLATFORMS", name), platform(name)
        )
        for name in ("cuda", "tpu")
    },
    **{
        f"eval-JAX_PLATFORMS={name}": Case(
            evaluate, ("JAX_PLATFORMS", name), platform(name), EVAL_OUT, ("does not fit", "damaged")
        )
        for name in ("cuda", "tpu", "bogus")
    },
    "train-XLA_FLAGS-unknown-flag": Case(train, ("XLA_FLAGS", "--bogus_flag"), {"XLA_FLAGS": "--bogus_flag"}),
    "train-XLA_FLAGS-bad-value": Case(
        train, ("XLA_FLAGS", "abc"), {"XLA_FLAGS": "--xla_force_host_platform_device_count=abc"}
    ),
    "train-XLA_FLAGS-not-a-flag": Case(train, ("XLA_FLAGS", "garbage"), {"XLA_FLAGS": "garbage"}),
    "eval-XLA_FLAGS-unknown-flag": Case(
        evaluate, ("XLA_FLAGS", "--bogus_flag"), {"XLA_FLAGS": "--bogus_flag"}, EVAL_OUT
    ),
    "train-run-dir-symlink-loop": Case(
        lambda case, run: ppo_eqx(*tiny(case / "cycle", 1)), ("cycle", ANY_SYMLINK_WORDS), absent="cycle/x"
    ),
    "train-run-dir-inside-a-symlink-loop": Case(
        lambda case, run: ppo_eqx(*tiny(case / "cycle" / "run", 1)), ("cycle", ANY_SYMLINK_WORDS), absent="cycle/x"
    ),
    "train-resume-symlink-loop": Case(
        lambda case, run: ppo_eqx("train", "--resume", str(case / "cycle")), ("cycle", ANY_SYMLINK_WORDS), absent="x"
    ),
    "eval-path-symlink-loop": Case(
        lambda case, run: evaluate(case, case / "cycle"), ("cycle", ANY_SYMLINK_WORDS), absent=EVAL_OUT
    ),
    "eval-output-symlink-loop": Case(
        lambda case, run: ppo_eqx("eval", str(run), "--episodes", "1", "--output", str(case / "cycle")),
        ("cycle", ANY_SYMLINK_WORDS),
        absent="x",
    ),
    **{f"ale-{env_id}-rom-unusable": Case(ale(env_id), (env_id,)) for env_id in UNUSABLE_ROMS},
    "report-path-does-not-exist": Case(
        report("CASE/nowhere", "--out", "CASE/out"), ("nowhere",), absent="out", prefix="error: "
    ),
    "report-out-is-a-file": Case(
        report("RUN", "--out", "CASE/afile"), ("--out", "afile"), absent="x", prefix="error: "
    ),
    "report-out-inside-a-file": Case(
        report("RUN", "--out", "CASE/afile/out"), ("--out", "afile"), absent="x", prefix="error: "
    ),
    "report-out-unwritable": Case(
        report("RUN", "--out", "/sys/ppo-eqx-report"), ("--out", "/sys/ppo-eqx-report"), absent="x", prefix="error: "
    ),
    "report-resamples-0": Case(
        report("RUN", "--out", "CASE/out", "--resamples", "0"), ("--resamples", "0"), absent="out", prefix="error: "
    ),
    "report-resamples-negative": Case(
        report("RUN", "--out", "CASE/out", "--resamples", "-5"), ("--resamples", "-5"), absent="out", prefix="error: "
    ),
    "sweep-of-2**20-agents": Case(absurd_sweep, ("1048576",)),
}


def prepare(case: Path) -> None:
    case.mkdir(parents=True)
    (case / "cycle").symlink_to("cycle")
    (case / "afile").write_text("a file, not a directory\n")


class Result(NamedTuple):
    code: int | None
    """The exit status; None when the process did not exit within its time (and was killed)."""
    out: list[str]
    err: list[str]


def case_dir(root: Path, name: str) -> Path:
    """The directory of a case: named by its position, so that no word of the case's name is in its paths."""
    return root / f"case{list(CASES).index(name)}"


def run_case(name: str, case: Case, run: Path, root: Path) -> Result:
    directory = case_dir(root, name)
    prepare(directory)
    env = worker_env() | case.env
    timeout = SWEEP_TIMEOUT_S if name.startswith("sweep") else None
    with Child(case.args(directory, run), env=env) as child:
        try:
            code = child.finish(timeout) if timeout else child.finish()
        except AssertionError:
            code = None
        return Result(code, child.out, child.err)


class Results(NamedTuple):
    root: Path
    """The cases' directories are in here."""
    by_case: dict[str, Result]


@pytest.fixture(scope="module")
def results(cli_run: Path, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Results:
    """The selected cases of ``CASES`` (all, unless ``-k`` chose) run to their end, two at a time."""
    root = tmp_path_factory.mktemp("one_line")
    test = test_bad_input_is_one_line_exit_2_and_nothing_written.__name__
    items = [item for item in request.session.items if isinstance(item, pytest.Function) and item.originalname == test]
    selected = [str(item.callspec.params["name"]) for item in items]
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        futures = {name: pool.submit(run_case, name, CASES[name], cli_run, root) for name in selected}
        return Results(root, {name: future.result() for name, future in futures.items()})


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.xdist_group("one-line-results")
def test_bad_input_is_one_line_exit_2_and_nothing_written(results: Results, name: str) -> None:
    case, result = CASES[name], results.by_case[name]
    directory = case_dir(results.root, name)
    assert result.code == 2, result
    assert len(result.err) == 1 and result.err[0].startswith(case.prefix), result.err
    line = result.err[0]
    for word in case.words:
        alternatives = (word,) if isinstance(word, str) else word
        assert any(w.lower() in line.lower() for w in alternatives), (word, line)
    assert not any(word in line for word in case.forbidden), line
    assert not any(word in "\n".join(result.out + result.err) for word in NOISE)
    assert not os.path.lexists(directory / case.absent)


class Moment(NamedTuple):
    command: str
    arrive: Callable[[Child], None]
    """Waits until the moment has come."""


MOMENTS = {
    "train-while-importing-jax": Moment("train", lambda child: child.wait_for_import("jax")),
    "train-while-compiling": Moment("train", lambda child: child.wait_for_line("run directory")),
    "train-during-the-first-iteration": Moment("train", lambda child: child.wait_for_line("compiled one iteration")),
    "train-later": Moment("train", lambda child: child.wait_for_line(f"step {2 * BATCH} ")),
    "eval-while-importing-jax": Moment("eval", lambda child: child.wait_for_import("jax")),
    "eval-while-playing": Moment("eval", lambda child: child.wait_for_line("evaluating")),
}


@pytest.mark.parametrize("name", list(MOMENTS))
def test_ctrl_c_at_any_moment_stops_in_a_couple_of_lines(cli_run: Path, tmp_path: Path, name: str) -> None:
    moment = MOMENTS[name]
    if moment.command == "train":
        args = ppo_eqx(*tiny(tmp_path / "run", 4))
    else:
        args = ppo_eqx("eval", str(cli_run), "--episodes", "1000", "--output", str(tmp_path / "eval.json"))
    with Child(args, profile_imports=True) as child:
        moment.arrive(child)
        child.send(signal.SIGINT)
        code = child.finish()
    assert code in (130, -signal.SIGINT), (code, child.err)
    assert len(child.err) <= 2, child.err
    assert not any(word in "\n".join(child.out + child.err) for word in NOISE), child.err
    assert not (tmp_path / "eval.json").exists()
