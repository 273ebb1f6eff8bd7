"""The test run's own machinery: with ``-n`` and ``--dist loadgroup`` (pyproject's addopts) the tests of one
``xdist_group`` run on one worker, so that a module fixture that trains runs once (tests/test_history.py's,
tests/test_failures_one_line.py's). pytest 9.2 with pytest-xdist 3.8 broke it: this fails there."""

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.subprocess

GROUPED = """
import pytest

@pytest.mark.xdist_group("one")
@pytest.mark.parametrize("i", range(6))
def test_grouped(i):
    pass
"""


def test_the_tests_of_one_xdist_group_run_on_one_worker(tmp_path: Path) -> None:
    (tmp_path / "test_grouped.py").write_text(GROUPED)
    command = [sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-v", "-p", "no:cacheprovider"]
    done = subprocess.run([*command, "test_grouped.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    passed = [line.split() for line in done.stdout.splitlines() if " PASSED " in line]
    assert done.returncode == 0 and len(passed) == 6, done.stdout[-2000:] + done.stderr[-2000:]
    assert len({words[0] for words in passed}) == 1, done.stdout  # one worker, [gw0] or [gw1]
