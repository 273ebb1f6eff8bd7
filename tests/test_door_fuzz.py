"""A fuzz of the doors user code comes in by (issue 53): hypothesis draws an env, a loss, a backend, a network or an
optimizer of the user's that breaks one contract (a shape, a dtype, an arity, a return, an exception of any kind
and message, ``sys.exit`` with any status, a value that is not finite at any step, a host function that fails at any
call), and ``ppo-eqx train`` runs it in a fresh process (``tests/door_fuzz.py``, told what to break by ``DOOR_FUZZ``).

Every example ends in one ``ppo-eqx: error:`` line and no traceback; a break the door sees is exit 2 with nothing
written; one that only a run meets (a late non-finite value, a late failing call) is exit 2 at the door or exit 1
mid-run, its checkpoints kept. The user's own files are untouched either way."""

import json
import math
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from ppo_eqx.core.update import RESERVED
from ppo_eqx.host.checkpoint import list_checkpoints

from .door_fuzz import EXCEPTIONS
from .processes import ROOT, ppo_eqx, run_child, worker_env

pytestmark = pytest.mark.subprocess

EXAMPLES = os.environ.get("FUZZ_EXAMPLES")
"""How many examples: 16, the same ones each time, in CI; ``FUZZ_EXAMPLES=200`` new ones each time."""
FUZZ = settings(
    max_examples=int(EXAMPLES or 16),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    derandomize=not EXAMPLES,
)
RUN = ["--num-envs", "4", "--num-steps", "32", "--total-timesteps", "1024", "--checkpoint-every", "2", "--no-progress"]
"""8 iterations of 128 steps: 256 steps of each env (4 episodes of ``door_fuzz.LENGTH``), 128 updates."""
MID_RUN = {"callback", "value"}
"""Breaks that happen only as the run goes: the door may not see them (exit 1 then)."""

FAILURE = st.one_of(
    st.fixed_dictionaries(
        {"how": st.just("exit"), "code": st.one_of(st.none(), st.integers(-300, 300), st.text(max_size=40))}
    ),
    st.fixed_dictionaries(
        {
            "how": st.just("raise"),
            "exception": st.sampled_from(sorted(EXCEPTIONS)),
            "message": st.one_of(st.text(max_size=200), st.text(min_size=2000, max_size=3000)),
        }
    ),
)
CALLED_BACK = FAILURE.filter(lambda failure: failure.get("exception") != "Unprintable")
"""What a host function of the user's may do. Not an exception whose message cannot be made: jaxlib aborts the
process formatting it (``nanobind::python_error``, exit -6) before any Python code sees it; a limit of jax's."""
NOT_FINITE = st.sampled_from([float("nan"), float("inf"), float("-inf")])


def _fails(*where: str) -> st.SearchStrategy[dict[str, Any]]:
    return st.builds(lambda w, f: {"break": "fails", "where": w, **f}, st.sampled_from(where), FAILURE)


def _case(**fixed: Any) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries({key: value if isinstance(value, st.SearchStrategy) else st.just(value)
                                  for key, value in fixed.items()})  # fmt: skip


ENV = st.one_of(
    _fails("factory", "default_params", "observation_space", "action_space", "reset", "step"),
    _case(**{"break": "returns", "value": st.sampled_from(["none", "int", "str", "list", "class"])}),
    _case(**{"break": "missing", "name": st.sampled_from(["reset", "step", "observation_space", "action_space"])}),
    _case(**{"break": "reset_arity", "count": st.sampled_from([0, 1, 3])}),
    _case(**{"break": "step_arity", "count": st.sampled_from([0, 1, 2, 3, 4, 7, 8, 10])}),
    _case(**{"break": "shape", "field": st.sampled_from(["reward", "obs"]), "extra": st.integers(1, 4)}),
    _case(**{"break": "dtype", "field": st.sampled_from(["reward", "obs"]), "dtype": st.just("str")}),
    _case(
        **{"break": "value", "field": st.sampled_from(["reward", "obs"]), "value": NOT_FINITE, "at": st.integers(0, 63)}
    ),  # fmt: skip
    st.builds(lambda after, f: {"break": "callback", "after": after, **f}, st.integers(1, 900), CALLED_BACK),
)
LOSS = st.one_of(
    _fails("loss"),
    _case(**{"break": "shape", "extra": st.integers(1, 4)}),
    _case(**{"break": "dtype", "dtype": st.sampled_from(["int32", "bool", "int8", "uint8"])}),
    _case(**{"break": "returns", "value": st.sampled_from(["loss", "tuple1", "tuple3", "list"])}),
    _case(**{"break": "reports", "value": st.sampled_from(["str", "list", "none", "int"])}),
    _case(
        **{
            "break": "metric_name",
            "name": st.one_of(st.text(max_size=20), st.sampled_from(sorted(RESERVED))).filter(
                lambda name: not name.isidentifier() or name in RESERVED
            ),
        }
    ),  # fmt: skip
    _case(**{"break": "metric_value", "value": st.sampled_from(["str", "array", "none", "dict"])}),
    _case(**{"break": "value", "value": NOT_FINITE, "after": st.integers(1, 100)}),
    st.just({"break": "not_differentiable"}),
    st.builds(lambda after, f: {"break": "callback", "after": after, **f}, st.integers(1, 100), CALLED_BACK),
)
BACKEND = st.one_of(
    _fails("spec", "make"),
    _case(
        **{
            "break": "returns",
            "of": st.sampled_from(["spec", "make"]),
            "value": st.sampled_from(["none", "dict", "str"]),
        }
    ),  # fmt: skip
)
NETWORK = st.one_of(
    _fails("network"),
    _case(**{"break": "returns", "value": st.sampled_from(["none", "int", "str", "params"])}),
    _case(**{"break": "sizes", "extra": st.integers(1, 3)}),
)
OPTIMIZER = st.one_of(
    _fails("optimizer"), _case(**{"break": "returns", "value": st.sampled_from(["none", "adam", "str", "tuple"])})
)
CLOCK = ["--env-id", "tests.door_fuzz:clock"]
DOORS = st.one_of(
    st.tuples(st.just(["--env-id", "tests.door_fuzz:env"]), ENV),
    st.tuples(st.just([*CLOCK, "--loss", "tests.door_fuzz:loss"]), LOSS),
    st.tuples(st.just([*CLOCK, "--loss", "tests.door_fuzz:loss_of_two"]), st.just({"break": "signature"})),
    st.tuples(st.just(["--env-id", "Clock-v0", "--env-backend", "tests.door_fuzz:backend_object"]), BACKEND),
    st.tuples(st.just([*CLOCK, "--network", "tests.door_fuzz:network"]), NETWORK),
    st.tuples(st.just([*CLOCK, "--optimizer", "tests.door_fuzz:optimizer"]), OPTIMIZER),
)


LATE_KEY_ERROR = {"how": "raise", "exception": "KeyError", "message": "a\nb"}


def _files(root: Path) -> dict[str, bytes]:
    return {str(path.relative_to(root)): path.read_bytes() for path in sorted(root.rglob("*")) if path.is_file()}


@FUZZ
@given(door=DOORS)
@example(door=(["--env-id", "tests.door_fuzz:env"], {"break": "value", "field": "obs", "value": math.nan, "at": 40}))
@example(door=([*CLOCK, "--loss", "tests.door_fuzz:loss"], {"break": "value", "value": math.inf, "after": 40}))
@example(door=(["--env-id", "tests.door_fuzz:env"], {"break": "callback", "after": 700, **LATE_KEY_ERROR}))
def test_user_code_that_breaks_a_contract_ends_in_one_line(tmp_path_factory: pytest.TempPathFactory, door) -> None:
    flags, broken = door
    home = tmp_path_factory.mktemp("user")  # the user's working directory and a file of theirs in it
    (home / "notes.txt").write_text("the user's own file\n")
    before = _files(home)
    run = home / "run"
    env = {**worker_env(), "DOOR_FUZZ": json.dumps(broken), "PYTHONPATH": str(ROOT)}
    code, out, err = run_child(ppo_eqx("train", *flags, *RUN, "--run-dir", str(run)), env=env, cwd=home)
    said = f"{broken}: exit {code}\n" + "\n".join(err[-20:])
    errors = [line for line in err if line.startswith("ppo-eqx: error: ")]
    assert len(errors) == 1, said
    assert not any("Traceback" in line for line in out + err), said
    assert all(line.startswith("ppo-eqx: ") for line in err), said  # ppo-eqx's own lines, nothing else
    assert len(errors[0]) < 1500, said  # a user's message of thousands of characters is cut
    if code == 2 or broken["break"] not in MID_RUN:
        assert code == 2, said
        assert not run.exists(), said
    else:
        assert code == 1, said
        kept = list_checkpoints(run)
        assert (str(kept[-1]) in errors[0]) if kept else ("no checkpoint" in errors[0]), said  # what is kept
    assert {name: data for name, data in _files(home).items() if not name.startswith("run/")} == before, said
