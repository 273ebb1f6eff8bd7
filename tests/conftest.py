import fcntl
import os
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    derandomize=True,
    deadline=None,
    database=None,
    max_examples=40,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", deadline=None, max_examples=25, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# The tiers (registered in pyproject.toml): each test is in exactly one, so that `pytest -m unit` is a
# complete fast loop and a new test says what it costs. A module's `pytestmark` names its tier; a test
# marked otherwise itself is in that tier instead.
TIERS = ("unit", "compile", "envpool", "subprocess", "tpu")


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects, so that it sees each test's one tier
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    wrong = []
    for item in items:
        own = [mark for mark in item.own_markers if mark.name in TIERS]
        inherited = [mark for node in item.listchain()[:-1] for mark in node.own_markers if mark.name in TIERS]
        if len(own) > 1 or not (own or inherited):
            wrong.append(f"  {item.nodeid}: {' and '.join(mark.name for mark in own) or 'no tier'}")
        elif not own:
            item.own_markers.append(inherited[-1])  # the closest: a class's tier before its module's
    for item in items:  # the tiers now sit on the tests alone, where `-m` finds one per test
        for node in item.listchain()[:-1]:
            node.own_markers[:] = [mark for mark in node.own_markers if mark.name not in TIERS]
    if wrong:
        raise pytest.UsageError(
            "every test is in exactly one tier, pytest.mark.unit, .compile, .envpool, .subprocess or .tpu "
            "(pyproject.toml says which): a module's `pytestmark = pytest.mark.unit`, and a decorator on each test "
            "that differs:\n" + "\n".join(wrong)
        )


@pytest.fixture(scope="session")
def cli_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished tiny CartPole run (``run_files.tiny``: 4 iterations, checkpoints after 2 and 4) that
    ``ppo-eqx train`` wrote in a process of its own. Tests copy it before they change anything.

    Under xdist the workers share one: the first to ask trains it, in the session's temporary directory (each
    worker's parent), while the others wait on a lock."""
    from .processes import ppo_eqx, run_child
    from .run_files import tiny

    shared = os.environ.get("PYTEST_XDIST_WORKER") is not None
    root = tmp_path_factory.getbasetemp().parent if shared else tmp_path_factory.mktemp("cli_run")
    run_dir = root / "cli_run"
    with open(root / "cli_run.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (run_dir / "summary.json").is_file():
            if run_dir.exists():  # a worker that failed to train it left it half made
                shutil.rmtree(run_dir)
            code, out, err = run_child(ppo_eqx(*tiny(run_dir)))
            assert code == 0, "\n".join(out + err)[-4000:]
    return run_dir
