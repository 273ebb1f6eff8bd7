"""Fuzzing the doors a run is read through (issue 41): hypothesis drives random flag values into ``ppo-eqx train``
and random bytes or JSON into a finished run's ``config.json``, its newest checkpoint's ``.json`` and its manifest,
then ``train --resume``. Every outcome is exit 0 (the input was good: the run was planned, or it was finished) or
exit 2 with one ``ppo-eqx: error:`` line, never a traceback; on a refusal nothing in the directory changed.

In this process (``ppo_eqx.cli.main``): a traceback is an exception hypothesis shows. A new run that would train
is stopped where ``Supervisor`` would start, so that an accepted example costs its planning only."""

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ppo_eqx.cli import command_line, main, train_command
from ppo_eqx.host.checkpoint import list_checkpoints

from .test_nothing_lost import tree

pytestmark = pytest.mark.subprocess

MANIFEST = ".ppo-eqx-manifest.jsonl"
EXAMPLES = os.environ.get("FUZZ_EXAMPLES")
"""How many examples each test tries: 25, the same ones each time, in CI; ``FUZZ_EXAMPLES=500`` new ones each time."""
FUZZ = settings(
    max_examples=int(EXAMPLES or 25),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large],
    derandomize=not EXAMPLES,
)
SKIPPED = {
    # Their values name code to import or machines to join, or change what is written where: not input to fuzz.
    "--env-backend", "--loss", "--resume", "--run-dir", "--overwrite", "--track", "--distributed",
    "--coordinator-address", "--num-processes", "--process-id", "--devices", "--wandb-project-name",
    "--wandb-entity", "-h", "--help", "--sweep", "--no-tensorboard", "--no-progress",
}  # fmt: skip


class Planned(Exception):
    """A new run got as far as its Supervisor: every check took its input."""


def _flags() -> dict[str, object]:
    """train's flags: each with its choices (a list), as a switch (None), or taking any value (True)."""
    parser = command_line.build_parser()
    train = next(a for a in parser._actions if getattr(a, "choices", None) and "train" in a.choices).choices["train"]  # type: ignore[union-attr]
    flags: dict[str, object] = {}
    for action in train._actions:
        for option in action.option_strings:
            if option in SKIPPED or not option.startswith("--"):
                continue
            flags[option] = None if action.nargs == 0 else list(action.choices) if action.choices else True
    return flags


FLAGS = _flags()
VALUES = st.one_of(
    st.integers(-(2**70), 2**70).map(str),
    st.integers(-3, 300).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["0", "1e-3", "0.5", "nan", "-inf", "1e309", "", " ", "--", "-1", "3.", "0x10", "1_000"]),
    st.text(max_size=12),
)


@st.composite
def flag_values(draw: st.DrawFn) -> list[str]:
    argv: list[str] = []
    for flag in draw(st.lists(st.sampled_from(sorted(FLAGS)), min_size=1, max_size=4, unique=True)):
        kind = FLAGS[flag]
        if kind is None:
            argv.append(flag)
        elif isinstance(kind, list):
            argv += [flag, draw(st.one_of(st.sampled_from(kind), VALUES))]
        else:
            argv += [flag, draw(VALUES)]
    return argv


def one_line_or_done(code: int, err: str) -> None:
    lines = err.strip().splitlines()
    if code == 2:
        assert len(lines) == 1 and lines[0].startswith("ppo-eqx: error: "), err
    else:
        assert code == 0, (code, err)
    assert "Traceback" not in err, err


@pytest.fixture
def planned_only(monkeypatch: pytest.MonkeyPatch) -> None:
    def stop(*args: object, **kwargs: object) -> None:
        raise Planned

    monkeypatch.setattr(train_command, "Supervisor", stop)


@pytest.mark.usefixtures("planned_only")
@FUZZ
@given(argv=flag_values())
def test_random_flag_values_are_planned_or_refused_in_one_line(argv: list[str], capsys: pytest.CaptureFixture) -> None:
    with tempfile.TemporaryDirectory() as root:
        run_dir = Path(root) / "run"
        base = ["train", "--env-id", "CartPole-v1", "--num-envs", "4", "--num-steps", "16", "--total-timesteps", "64"]
        capsys.readouterr()
        try:
            code = main([*base, "--no-progress", "--no-tensorboard", "--run-dir", str(run_dir), *argv])
        except Planned:
            code = 0
        one_line_or_done(code, capsys.readouterr().err)
        if code == 2:
            assert not run_dir.exists(), argv


JSONS = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)


def _mutated_json(original: dict, draw: st.DrawFn) -> bytes:
    """``original`` with one key's value replaced, dropped or added, or other JSON, or other bytes."""
    how = draw(st.sampled_from(["value", "drop", "add", "json", "bytes", "cut"]))
    data = dict(original)
    if how == "value" and data:
        data[draw(st.sampled_from(sorted(data)))] = draw(JSONS)
    elif how == "drop" and data:
        data.pop(draw(st.sampled_from(sorted(data))))
    elif how == "add":
        data[draw(st.text(max_size=10))] = draw(JSONS)
    elif how == "json":
        return json.dumps(draw(JSONS)).encode()
    elif how == "bytes":
        return draw(st.binary(max_size=64))
    else:
        text = json.dumps(original).encode()
        return text[: draw(st.integers(0, max(0, len(text) - 1)))]
    return json.dumps(data).encode()


@st.composite
def damage(draw: st.DrawFn) -> tuple[str, object]:
    target = draw(st.sampled_from(["config.json", "checkpoint", "manifest"]))
    if target == "manifest":
        lines = draw(
            st.lists(
                st.one_of(
                    JSONS.map(json.dumps),
                    st.sampled_from(['["file", "config.json"]', '["file", "../x"]', '["dir", "/etc"]', "[", ""]),
                    st.text(max_size=20),
                ),
                max_size=3,
            )
        )
        return target, lines
    return target, draw(st.data())


@FUZZ
@given(change=damage())
def test_random_files_in_a_finished_run_are_resumed_or_refused_in_one_line(
    cli_run: Path, change: tuple[str, object], capsys: pytest.CaptureFixture
) -> None:
    target, what = change
    with tempfile.TemporaryDirectory() as root:
        run = Path(root) / "run"
        shutil.copytree(cli_run, run, symlinks=True)
        if target == "manifest":
            with open(run / MANIFEST, "a") as manifest:
                manifest.writelines(f"{line}\n" for line in what)  # type: ignore[union-attr]
        else:
            path = run / "config.json" if target == "config.json" else list_checkpoints(run)[-1]
            path.write_bytes(_mutated_json(json.loads(path.read_text()), what.draw))  # type: ignore[union-attr]
        before = tree(run)
        capsys.readouterr()
        code = main(["train", "--resume", str(run), "--no-progress"])
        one_line_or_done(code, capsys.readouterr().err)
        if code == 2:
            assert tree(run) == before
