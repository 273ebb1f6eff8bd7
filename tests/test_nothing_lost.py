"""Nothing the user owns is touched, whatever is in the directory, the environment or the process (issue 32).

Each case is a real process, as a user or an adversary would start it, and every case directory is compared
byte for byte (files, directories, links, FIFOs) before and after. The classes, each with cases beyond the
examples the issue gives:

- the run's bookkeeping (lock, manifest, every file a run writes, their temporaries) cannot be written by another
  ppo-eqx command (``eval --output``, ``--video``), through a link or a ``..`` either; the lock holds when its file
  is replaced, deleted, or turned into a FIFO or a link while the run trains;
- the manifest is untrusted input: a line that names the directory itself, a path outside it, a user's file, or
  is not a manifest line at all is refused in one line, and nothing is deleted;
- a directory holding files named like a run's, without a run, is refused before anything is written;
  ``--overwrite`` deletes only what ppo-eqx wrote and says what it deleted and what it kept;
- what can be known before the run directory is written is checked before (memory, the environment variables
  that change results or abort); a fault after it says how to go on, and that way works;
- the library checks what the command line checks.
"""

import concurrent.futures
import json
import os
import shutil
import signal
import stat
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import pytest

from .processes import ROOT, Child, ppo_eqx, run_child, worker_env
from .run_files import BATCH, checkpoint_names, interrupted_copy, iterations, metrics_rows, tiny

pytestmark = pytest.mark.subprocess

NOISE = ("Traceback", "Fatal Python error", "Exception ignored", "F1204", "Check failed")
LOCK, MANIFEST = ".ppo-eqx.lock", ".ppo-eqx-manifest.jsonl"


def tree(root: Path) -> dict[str, object]:
    """Everything under ``root``: a file's bytes, a link's target, a directory, a FIFO (never opened)."""
    found: dict[str, object] = {}
    for path in sorted(root.rglob("*")):
        key = str(path.relative_to(root))
        mode = path.lstat().st_mode
        if stat.S_ISLNK(mode):
            found[key] = f"-> {os.readlink(path)}"
        elif stat.S_ISDIR(mode):
            found[key] = "dir"
        elif stat.S_ISFIFO(mode):
            found[key] = "fifo"
        else:
            found[key] = path.read_bytes()
    return found


class Runs(NamedTuple):
    one: Path
    """A finished one-agent CartPole run (4 iterations, checkpoints 2 and 4)."""
    seeds: Path
    """A finished two-agent run (``--num-seeds 2``, 2 iterations)."""


class Case(NamedTuple):
    prepare: Callable[[Path, Runs], list[str]]
    """Makes what the case needs in its directory; returns the interpreter's arguments."""
    words: tuple[str, ...] = ()
    """Each is in the error line."""
    env: dict[str, str] = {}
    forbidden: tuple[str, ...] = ()
    """Words the error line must not hold (a good checkpoint is not blamed)."""


# --- what the cases start from ------------------------------------------------------------------------------------


def user_files(case: Path) -> None:
    """A user's things in and beside the run: notes, a folder of their own, and files outside the run."""
    (case / "run" / "notes.txt").write_text("lr 2.5e-4 looked best\n")
    (case / "run" / "mine").mkdir()
    (case / "run" / "mine" / "config.json").write_text('{"mine": true}\n')
    (case / "outside").mkdir()
    (case / "outside" / "config.json").write_text('{"outside": true}\n')
    (case / "outside" / "thesis.tex").write_text("\\section{Results}\n")


def copy_run(case: Path, runs: Runs, *, at: int | None = None) -> Path:
    """The finished run copied to ``case/run`` (``at``: as if killed after its checkpoint of that iteration)."""
    run = case / "run"
    if at is None:
        shutil.copytree(runs.one, run)
    else:
        interrupted_copy(runs.one, run, at=at)
    user_files(case)
    return run


def evaluate(target: str, *, flag: str = "--output", run: str = "run") -> Callable[[Path, Runs], list[str]]:
    """``eval`` of the copied run writing ``--output`` (or ``--video``) to ``target`` (relative to the case)."""

    def prepare(case: Path, runs: Runs) -> list[str]:
        copy_run(case, runs)
        shutil.copytree(runs.seeds, case / "seeds")
        shutil.copytree(runs.one, case / "other")
        (case / "outside" / "lock.json").symlink_to(case / "run" / LOCK)
        (case / "outside" / "clip.gif").symlink_to(case / "run" / LOCK)
        (case / "outside" / "manifest.json").symlink_to(case / "run" / MANIFEST)
        return ppo_eqx("eval", str(case / run), "--episodes", "1", flag, str(case / target))

    return prepare


EVAL_CASES = {
    "eval-output-the-lock": Case(evaluate(f"run/{LOCK}"), ("--output", LOCK)),
    "eval-output-the-manifest": Case(evaluate(f"run/{MANIFEST}"), ("--output", MANIFEST)),
    "eval-output-the-manifest-by-dotdot": Case(evaluate(f"run/checkpoints/../{MANIFEST}"), ("--output",)),
    "eval-output-the-lock-through-a-link": Case(evaluate("outside/lock.json"), ("--output", "lock.json")),
    "eval-output-the-manifest-through-a-link": Case(evaluate("outside/manifest.json"), ("--output",)),
    "eval-video-the-lock-through-a-link": Case(evaluate("outside/clip.gif", flag="--video"), ("--video",)),
    "eval-output-a-temporary-of-config": Case(evaluate("run/.config.json.tmp"), ("--output", ".config.json.tmp")),
    "eval-output-a-temporary-of-summary": Case(evaluate("run/.summary.json.tmp"), ("--output",)),
    "eval-output-another-runs-lock": Case(evaluate(f"other/{LOCK}"), ("--output", LOCK)),
    "eval-output-another-runs-manifest": Case(evaluate(f"other/{MANIFEST}"), ("--output", MANIFEST)),
    "eval-output-a-seeds-runs-lock": Case(evaluate(f"seeds/{LOCK}", run="seeds/seed1"), ("--output", LOCK)),
    "eval-output-an-agents-manifest": Case(
        evaluate(f"seeds/seed2/{MANIFEST}", run="seeds/seed1"), ("--output", MANIFEST)
    ),
    "eval-output-its-agents-manifest": Case(
        evaluate(f"seeds/seed1/{MANIFEST}", run="seeds/seed1"), ("--output", MANIFEST)
    ),
}


def damaged_manifest(
    line: str | bytes, *, command: str = "overwrite", setup: Callable[[Path], None] | None = None
) -> Callable[[Path, Runs], list[str]]:
    """The copied run, its manifest with ``line`` appended (then a newline: not a line cut short by a kill), and
    ``train --overwrite`` of it (``command="resume"``: a resume of it, killed after iteration 2)."""

    def prepare(case: Path, runs: Runs) -> list[str]:
        run = copy_run(case, runs, at=2 if command == "resume" else None)
        if setup is not None:
            setup(case)
        text = line.encode() if isinstance(line, str) else line
        with open(run / MANIFEST, "ab") as manifest:
            manifest.write(text.replace(b"CASE", str(case).encode()) + b"\n")
        if command == "resume":
            return ppo_eqx("train", "--resume", str(run), "--no-progress")
        return ppo_eqx(*tiny(run, 1), "--overwrite")

    return prepare


def link_outside(case: Path) -> None:
    (case / "run" / "link").symlink_to(case / "outside")


def manifest_replaced(kind: str) -> Callable[[Path, Runs], list[str]]:
    """The copied run, its manifest a FIFO, a directory or a link to a user's file; ``train --overwrite``."""

    def prepare(case: Path, runs: Runs) -> list[str]:
        run = copy_run(case, runs)
        (run / MANIFEST).unlink()
        if kind == "fifo":
            os.mkfifo(run / MANIFEST)
        elif kind == "dir":
            (run / MANIFEST).mkdir()
        else:
            (case / "outside" / "list.jsonl").write_text('["tree", "."]\n')
            (run / MANIFEST).symlink_to(case / "outside" / "list.jsonl")
        return ppo_eqx(*tiny(run, 1), "--overwrite")

    return prepare


MANIFEST_CASES = {
    **{
        f"manifest-{name}": Case(damaged_manifest(line), (MANIFEST,))
        for name, line in {
            "tree-dot-slash": '["tree", "./"]',
            "tree-dot": '["tree", "."]',
            "tree-dot-dot-slash-dot": '["tree", "./."]',
            "run-dot-slash": '["run", "./"]',
            "dir-dot-slash": '["dir", "./"]',
            "tree-empty": '["tree", ""]',
            "file-dotdot": '["file", "../outside/thesis.tex"]',
            "file-absolute": '["file", "CASE/outside/thesis.tex"]',
            "tree-absolute": '["tree", "CASE/outside"]',
            "file-a-users-file": '["file", "notes.txt"]',
            "tree-a-users-dir": '["tree", "mine"]',
            "run-a-users-dir": '["run", "mine"]',
            "tree-checkpoints": '["tree", "checkpoints"]',
            "file-through-checkpoints-dotdot": '["file", "checkpoints/../notes.txt"]',
            "run-seed-dotdot": '["run", "seed2/.."]',
            "number": "5",
            "string": '"config.json"',
            "null": "null",
            "object": '{"kind": "file", "path": "config.json"}',
            "one-item": '["file"]',
            "three-items": '["file", "config.json", "again"]',
            "path-a-number": '["file", 5]',
            "kind-a-list": '[["file"], "config.json"]',
            "unknown-kind": '["everything", "config.json"]',
            "deeply-nested": "[" * 100_000 + "]" * 100_000,
            "nul-in-path": '["file", "config.json\\u0000x"]',
        }.items()
    },
    "manifest-not-utf8": Case(damaged_manifest(b"\xff\xfe\x00garbage"), (MANIFEST,)),
    "manifest-file-through-a-link": Case(
        damaged_manifest('["file", "link/config.json"]', setup=link_outside), (MANIFEST,)
    ),
    "manifest-tree-through-a-link": Case(damaged_manifest('["tree", "link"]', setup=link_outside), (MANIFEST,)),
    "manifest-resume-tree-dot-slash": Case(damaged_manifest('["tree", "./"]', command="resume"), (MANIFEST,)),
    "manifest-resume-number": Case(damaged_manifest("5", command="resume"), (MANIFEST,)),
    "manifest-is-a-fifo": Case(manifest_replaced("fifo"), (MANIFEST,)),
    "manifest-is-a-directory": Case(manifest_replaced("dir"), (MANIFEST,)),
    "manifest-is-a-link-to-a-users-file": Case(manifest_replaced("link"), (MANIFEST,)),
}


def look_alike(*names: str, extra: tuple[str, ...] = ()) -> Callable[[Path, Runs], list[str]]:
    """A directory holding only the user's files named like a run's (``NAME/`` a directory); a new run in it."""

    def prepare(case: Path, runs: Runs) -> list[str]:
        run = case / "run"
        for name in names:
            path = run / name.rstrip("/")
            path.parent.mkdir(parents=True, exist_ok=True)
            if name.endswith("/"):
                path.mkdir()
                (path / "kept.txt").write_text("mine\n")
            else:
                path.write_text('{"written": "by hand"}\n')
        return ppo_eqx(*tiny(run, 1), *extra)

    return prepare


LOOK_ALIKES = {
    "summary": ("summary.json",),
    "hardware": ("hardware.json",),
    "eval": ("eval.json",),
    "summary-hardware-eval": ("summary.json", "hardware.json", "eval.json"),
    "wandb-json": ("wandb.json",),
    "events": ("events.out.tfevents.1700000000.somehost",),
    "wandb-dir": ("wandb/",),
    "a-temporary": (".config.json.tmp",),
    "config": ("config.json",),
    "metrics": ("metrics.jsonl",),
    "seeds": ("seeds.json",),
    "checkpoints-dir": ("checkpoints/",),
}
LOOK_ALIKE_CASES = {
    **{
        f"new-run-beside-{name}": Case(look_alike(*files), (files[0].rstrip("/"),))
        for name, files in LOOK_ALIKES.items()
    },
    **{
        f"overwrite-beside-{name}": Case(look_alike(*files, extra=("--overwrite",)), (files[0].rstrip("/"),))
        for name, files in LOOK_ALIKES.items()
    },
    "new-seeds-run-beside-an-agents-summary": Case(
        look_alike("seed1/summary.json", extra=("--num-seeds", "2")), ("summary.json",)
    ),
    "new-seeds-run-beside-an-agents-hardware": Case(
        look_alike("seed2/hardware.json", extra=("--num-seeds", "2", "--overwrite")), ("hardware.json",)
    ),
}


def train_new(*extra: str) -> Callable[[Path, Runs], list[str]]:
    def prepare(case: Path, runs: Runs) -> list[str]:
        return ppo_eqx(*tiny(case / "run", 1), *extra)

    return prepare


def breakout(*extra: str) -> Callable[[Path, Runs], list[str]]:
    def prepare(case: Path, runs: Runs) -> list[str]:
        args = ["train", "--env-id", "Breakout-v5", "--no-progress", "--run-dir", str(case / "run"), *extra]
        return ppo_eqx(*args)

    return prepare


def resume(prepare_run: Callable[[Path], None] | None = None) -> Callable[[Path, Runs], list[str]]:
    """A resume of the copied run, killed after iteration 2; ``prepare_run`` changes the copy first."""

    def prepare(case: Path, runs: Runs) -> list[str]:
        run = copy_run(case, runs, at=2)
        if prepare_run is not None:
            prepare_run(run)
        return ppo_eqx("train", "--resume", str(run), "--no-progress")

    return prepare


def lock_as(kind: str) -> Callable[[Path], None]:
    def replace(run: Path) -> None:
        (run / LOCK).unlink()
        if kind == "fifo":
            os.mkfifo(run / LOCK)
        elif kind == "dir":
            (run / LOCK).mkdir()
        else:
            (run / LOCK).symlink_to("/dev/null")

    return replace


def gymnax_missing() -> bool:
    import importlib.util

    return importlib.util.find_spec("gymnax") is None


BEFORE_THE_DIRECTORY = {
    # 2.1e9 transitions of 28 KiB frames (60 TB); 16 agents of 65,536 envs (3.7 TB): beyond any machine.
    "breakout-beyond-any-memory": Case(
        breakout("--num-envs", "1048576", "--num-steps", "2047", "--total-timesteps", str(1048576 * 2047)),
        ("memory", "num_envs"),
    ),
    "breakout-seeds-beyond-any-memory": Case(
        breakout("--num-envs", "65536", "--num-steps", "2000", "--num-seeds", "16", "--total-timesteps", "131072000"),
        ("memory", "16 agents"),
    ),
    "train-JAX_DEBUG_NANS=1": Case(train_new(), ("JAX_DEBUG_NANS",), {"JAX_DEBUG_NANS": "1"}),
    "train-JAX_DEBUG_NANS=true": Case(train_new(), ("JAX_DEBUG_NANS",), {"JAX_DEBUG_NANS": "true"}),
    "train-JAX_DISABLE_JIT=1": Case(train_new(), ("JAX_DISABLE_JIT",), {"JAX_DISABLE_JIT": "1"}),
    "resume-JAX_DEBUG_NANS=1": Case(resume(), ("JAX_DEBUG_NANS",), {"JAX_DEBUG_NANS": "1"}),
    # jax reads these at import (a bad value was a 66-83 line traceback) or computes under them (after the
    # run directory was written): each is one line naming the variable and what it takes.
    "train-JAX_ENABLE_X64=maybe": Case(train_new(), ("JAX_ENABLE_X64", "'maybe'", "true"), {"JAX_ENABLE_X64": "maybe"}),
    "resume-JAX_ENABLE_X64=2": Case(resume(), ("JAX_ENABLE_X64", "false"), {"JAX_ENABLE_X64": "2"}),
    "train-JAX_DEFAULT_MATMUL_PRECISION=bogus": Case(
        train_new(), ("JAX_DEFAULT_MATMUL_PRECISION", "highest"), {"JAX_DEFAULT_MATMUL_PRECISION": "bogus"}
    ),
    "train-JAX_NUMPY_RANK_PROMOTION=raise": Case(
        train_new(), ("JAX_NUMPY_RANK_PROMOTION", "allow"), {"JAX_NUMPY_RANK_PROMOTION": "raise"}
    ),
    "train-JAX_NUMPY_RANK_PROMOTION=sometimes": Case(
        train_new(), ("JAX_NUMPY_RANK_PROMOTION", "warn"), {"JAX_NUMPY_RANK_PROMOTION": "sometimes"}
    ),
    "train-JAX_NUMPY_DTYPE_PROMOTION=strict": Case(
        train_new(), ("JAX_NUMPY_DTYPE_PROMOTION", "standard"), {"JAX_NUMPY_DTYPE_PROMOTION": "strict"}
    ),
    "eval-JAX_NUMPY_DTYPE_PROMOTION=strict": Case(
        evaluate("eval_out.json"), ("JAX_NUMPY_DTYPE_PROMOTION",), {"JAX_NUMPY_DTYPE_PROMOTION": "strict"}
    ),
    # 1.28 G transitions of CartPole: 49 GiB of batch, and 610 GiB of activations in one minibatch of 320 M.
    "cartpole-ten-million-envs": Case(
        train_new("--num-envs", "10000000", "--num-steps", "128", "--total-timesteps", "2000000000"),
        ("memory", "num_envs=10000000"),
    ),
    "resume-under-JAX_ENABLE_X64": Case(
        resume(), ("JAX_ENABLE_X64",), {"JAX_ENABLE_X64": "1"}, forbidden=("damaged", "does not fit")
    ),
    "resume-under-other-XLA_FLAGS": Case(
        resume(), ("XLA_FLAGS",), {"XLA_FLAGS": "--xla_cpu_enable_fast_math=true"}, forbidden=("damaged",)
    ),
    "resume-lock-file-a-fifo": Case(resume(lock_as("fifo")), (LOCK,)),
    "resume-lock-file-a-directory": Case(resume(lock_as("dir")), (LOCK,)),
    "resume-lock-file-a-link-to-dev-null": Case(resume(lock_as("null")), (LOCK,)),
    **(
        {}
        if gymnax_missing()
        else {
            "train-gymnax-XLA_FLAGS-unknown-flag": Case(
                train_new("--env-backend", "gymnax"), ("XLA_FLAGS", "--xla_bogus"), {"XLA_FLAGS": "--xla_bogus"}
            ),
        }
    ),
}

CASES = {**EVAL_CASES, **MANIFEST_CASES, **LOOK_ALIKE_CASES, **BEFORE_THE_DIRECTORY}


class Result(NamedTuple):
    code: int | None
    out: list[str]
    err: list[str]
    before: dict[str, object]
    after: dict[str, object]


def case_dir(root: Path, name: str) -> Path:
    return root / f"case{list(CASES).index(name)}"


def run_case(name: str, runs: Runs, root: Path) -> Result:
    case = case_dir(root, name)
    case.mkdir()
    args = CASES[name].prepare(case, runs)
    before = tree(case)
    with Child(args, env=worker_env() | CASES[name].env) as child:
        try:
            code: int | None = child.finish(120)
        except AssertionError:
            code = None
        return Result(code, child.out, child.err, before, tree(case))


@pytest.fixture(scope="module")
def seeds_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("seeds") / "run"
    code, out, err = run_child(ppo_eqx(*tiny(run, 2), "--num-seeds", "2"))
    assert code == 0, out + err
    return run


@pytest.fixture(scope="module")
def results(cli_run: Path, seeds_run: Path, tmp_path_factory, request: pytest.FixtureRequest) -> dict[str, Result]:
    """The selected cases run to their end, two at a time."""
    root = tmp_path_factory.mktemp("nothing_lost")
    test = test_refused_in_one_line_and_nothing_touched.__name__
    items = [item for item in request.session.items if isinstance(item, pytest.Function) and item.originalname == test]
    selected = [str(item.callspec.params["name"]) for item in items]
    runs = Runs(cli_run, seeds_run)
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        futures = {name: pool.submit(run_case, name, runs, root) for name in selected}
        return {name: future.result() for name, future in futures.items()}


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.xdist_group("nothing-lost-results")
def test_refused_in_one_line_and_nothing_touched(results: dict[str, Result], name: str) -> None:
    case, result = CASES[name], results[name]
    assert result.code == 2, result.out + result.err
    assert len(result.err) == 1 and result.err[0].startswith("ppo-eqx: error: "), result.err
    line = result.err[0]
    for word in case.words:
        assert word.lower() in line.lower(), (word, line)
    assert not any(word in line for word in case.forbidden), line
    assert not any(word in "\n".join(result.out + result.err) for word in NOISE), result.err
    changed = sorted(key for key in {*result.before, *result.after} if result.before.get(key) != result.after.get(key))
    assert not changed, changed


# --- --overwrite says what it deleted and what it kept ------------------------------------------------------------


def test_overwrite_deletes_only_the_runs_files_and_says_which(cli_run: Path, tmp_path: Path) -> None:
    """A run, a user's hand-written eval.json, notes and folder beside it: --overwrite names each deleted and kept
    thing, and the kept ones are byte for byte as they were."""
    run = copy_run(tmp_path, Runs(cli_run, cli_run))
    (run / "eval.json").write_text('{"my": "own results"}\n')
    kept_before = {name: tree(run).get(name) for name in ("eval.json", "notes.txt", "mine", "mine/config.json")}
    written = sorted(
        [*(p.name for p in run.glob("*.json*")), "metrics.jsonl", *(f"checkpoints/{n}" for n in checkpoint_names(run))]
    )
    written = [name for name in written if name not in ("eval.json", MANIFEST)]
    code, out, err = run_child(ppo_eqx(*tiny(run, 1), "--overwrite"))
    assert code == 0, out + err
    said = "\n".join(out)
    deleted_line = next(line for line in out if "deleted" in line)
    kept_line = next(line for line in out if "kept" in line)
    for name in written:
        assert name in deleted_line, (name, deleted_line)
    for name in ("eval.json", "notes.txt", "mine/"):
        assert name in kept_line and name not in deleted_line, (name, said)
    assert {name: tree(run).get(name) for name in kept_before} == kept_before
    assert iterations(run) == [1]


def test_a_manifest_cut_short_by_a_kill_is_no_damage(cli_run: Path, tmp_path: Path) -> None:
    run = copy_run(tmp_path, Runs(cli_run, cli_run))
    with open(run / MANIFEST, "a") as manifest:
        manifest.write('["file", "che')  # no newline: the last line of a write that a kill cut short
    code, out, err = run_child(ppo_eqx(*tiny(run, 1), "--overwrite"))
    assert code == 0, out + err
    assert (run / "notes.txt").read_text() == "lr 2.5e-4 looked best\n"


# --- the lock holds while a run trains, whatever happens to its file ---------------------------------------------


class Holder(NamedTuple):
    child: Child
    run_dir: Path


@pytest.fixture(scope="module")
def holder(tmp_path_factory: pytest.TempPathFactory):
    """A run of 3 iterations stopped (SIGSTOP) after its first checkpoint: it trains, as anyone else sees it."""
    run_dir = tmp_path_factory.mktemp("lock_holder") / "run"
    with Child(ppo_eqx(*tiny(run_dir, 3, checkpoint_every=1))) as child:
        child.wait_for_file(run_dir / "checkpoints" / "iter_000001.json")
        child.send(signal.SIGSTOP)
        yield Holder(child, run_dir)


def replace_by_rename(run: Path) -> None:
    (run.parent / "lock.new").write_text("{}\n")
    os.replace(run.parent / "lock.new", run / LOCK)


def replace_by_eval(run: Path) -> None:
    run_child(ppo_eqx("eval", str(run), "--episodes", "1", "--output", str(run / LOCK)))


def replace_by(kind: str) -> Callable[[Path], None]:
    def replace(run: Path) -> None:
        (run / LOCK).unlink(missing_ok=True)
        if kind == "fifo":
            os.mkfifo(run / LOCK)
        elif kind == "null":
            (run / LOCK).symlink_to("/dev/null")

    return replace


ATTACKS = {
    "lock-replaced-by-eval-output": replace_by_eval,
    "lock-replaced-by-a-rename": replace_by_rename,
    "lock-deleted": replace_by("nothing"),
    "lock-replaced-by-a-fifo": replace_by("fifo"),
    "lock-replaced-by-a-link-to-dev-null": replace_by("null"),
}
SECOND = {
    "resume": lambda run: ["train", "--resume", str(run), "--no-progress"],
    "overwrite": lambda run: [*tiny(run, 2), "--overwrite"],
}


@pytest.mark.parametrize("second", list(SECOND))
@pytest.mark.parametrize("attack", list(ATTACKS))
@pytest.mark.xdist_group("nothing-lost-holder")
def test_the_lock_holds_whatever_happens_to_its_file(holder: Holder, attack: str, second: str) -> None:
    ATTACKS[attack](holder.run_dir)
    before = {k: v for k, v in tree(holder.run_dir).items() if k != LOCK}
    with Child(ppo_eqx(*SECOND[second](holder.run_dir))) as child:
        child.wait_until(
            "an exit or a start", lambda: not child.running() or any("run directory" in x for x in child.out)
        )
        child.kill()
        code = child.finish()
    assert code == 2, child.out + child.err
    assert len(child.err) == 1 and child.err[0].startswith("ppo-eqx: error: "), child.err
    assert {k: v for k, v in tree(holder.run_dir).items() if k != LOCK} == before


@pytest.mark.xdist_group("nothing-lost-holder")
def test_the_held_run_finishes_whole_after_every_attack(holder: Holder) -> None:
    replace_by_rename(holder.run_dir)
    holder.child.send(signal.SIGCONT)
    assert holder.child.finish() == 0, holder.child.out + holder.child.err
    assert iterations(holder.run_dir) == [1, 2, 3]


# --- a fault after the run directory is written says how to go on, and that way works ----------------------------


def test_a_run_killed_before_its_first_checkpoint_is_retried_by_the_same_command(tmp_path: Path) -> None:
    run = tmp_path / "run"
    args = ppo_eqx(*tiny(run, 2, checkpoint_every=2))
    with Child(args) as child:
        child.wait_for_file(run / "hardware.json")
        child.kill()
    assert not checkpoint_names(run)
    code, out, err = run_child(args)
    assert code == 0, out + err
    assert iterations(run) == [1, 2]


def test_a_run_killed_after_a_checkpoint_is_refused_a_plain_retry_naming_resume(tmp_path: Path) -> None:
    run = tmp_path / "run"
    args = ppo_eqx(*tiny(run, 3, checkpoint_every=1))
    with Child(args) as child:
        child.wait_for_file(run / "checkpoints" / "iter_000001.json")
        child.kill()
    before = tree(run)
    code, out, err = run_child(args)
    assert code == 2 and len(err) == 1 and f"--resume {run}" in err[0], out + err
    assert {k: v for k, v in tree(run).items() if k != LOCK} == {k: v for k, v in before.items() if k != LOCK}
    code, out, err = run_child(ppo_eqx("train", "--resume", str(run), "--no-progress"))
    assert code == 0, out + err
    assert iterations(run) == [1, 2, 3]


def test_a_fault_before_the_first_checkpoint_says_to_run_the_command_again(tmp_path: Path) -> None:
    """A run that fails at its first iteration (a learning rate that makes the loss NaN) says what it left."""
    run = tmp_path / "run"
    code, out, err = run_child(ppo_eqx(*tiny(run, 2), "--learning-rate", "3e38", "--max-grad-norm", "3e38"))
    assert code == 1 and len(err) == 1, out + err
    assert "--overwrite" in err[0] or "again" in err[0], err


def test_the_environment_that_changes_results_is_recorded(tmp_path: Path) -> None:
    run = tmp_path / "run"
    env = worker_env() | {"JAX_ENABLE_X64": "1"}
    code, out, err = run_child(ppo_eqx(*tiny(run, 1)), env=env)
    assert code == 0, out + err
    recorded = json.loads((run / "hardware.json").read_text())["environment"]
    assert recorded["JAX_ENABLE_X64"] == "1", recorded
    assert metrics_rows(run)[0]["global_step"] == BATCH


# --- the library checks what the command line checks --------------------------------------------------------------

LIBRARY = {
    "save_checkpoint-keep-0": ("save(keep=0)", ("keep",)),
    "save_checkpoint-keep-negative": ("save(keep=-1)", ("keep",)),
    "save_checkpoint-keep-a-float": ("save(keep=1.5)", ("keep",)),
    "save_checkpoint-keep-a-bool": ("save(keep=True)", ("keep",)),
    "save_checkpoint-another-envs-spec": ("save(keep=3, spec=ppo_eqx.env_spec('Acrobot-v1'))", ("Acrobot-v1",)),
    "evaluate-a-3-action-model": ("play(model_for(3), config)", ("3", "2", "actions")),
    "evaluate-a-cartpole-model-on-breakout": (
        "play(checkpoint.model, config.replace(env_id='Breakout-v5'))",
        ("Breakout-v5", "observations"),
    ),
    "evaluate-0-episodes": ("play(checkpoint.model, config, episodes=0)", ("episodes",)),
    "evaluate-a-float-of-episodes": ("play(checkpoint.model, config, episodes=2.5)", ("episodes",)),
}
LIBRARY_PRELUDE = """
    import json
    import sys
    from pathlib import Path
    import jax
    import ppo_eqx
    from ppo_eqx.core.networks import ActorCritic

    run = Path(sys.argv[1])
    file = ppo_eqx.read_checkpoint(run)
    config = ppo_eqx.PPOConfig.from_dict(json.loads((run / "config.json").read_text()))
    spec = ppo_eqx.env_spec(config.env_id)
    checkpoint = ppo_eqx.load_checkpoint(file, config, spec)

    def save(keep, spec=spec):
        return ppo_eqx.save_checkpoint(run, checkpoint, config, spec, keep=keep)

    def model_for(actions):
        return ActorCritic(spec.obs_shape, actions, key=jax.random.key(0))

    def play(model, config, episodes=2):
        return ppo_eqx.evaluate(model, config, episodes=episodes, seed=1, key=jax.random.key(0))
"""


@pytest.mark.parametrize("name", list(LIBRARY))
def test_the_library_refuses_what_the_command_line_refuses(cli_run: Path, tmp_path: Path, name: str) -> None:
    call, words = LIBRARY[name]
    run = shutil.copytree(cli_run, tmp_path / "run")
    before = tree(run)
    script = textwrap.dedent(LIBRARY_PRELUDE) + f"\n{call}\n"
    code, out, err = run_child(["-c", script, str(run)], cwd=ROOT)
    assert code == 1, out + err
    last = err[-1]
    assert last.startswith(("ValueError:", "TypeError:", "ppo_eqx.errors.")), err[-5:]
    for word in words:
        assert word in last, (word, last)
    assert tree(run) == before
