"""What ``ppo-eqx train`` spends before its first iteration, part by part (``cli.stopwatch``; issue 50)."""

from pathlib import Path

import pytest

from ppo_eqx.cli import stopwatch
from ppo_eqx.cli.stopwatch import Stopwatch, process_age

pytestmark = pytest.mark.unit


class _Clock:
    def __init__(self) -> None:
        self.now = 10.0

    def perf_counter(self) -> float:
        return self.now


def test_laps_add_up_to_the_parts_in_order(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = _Clock()
    monkeypatch.setattr(stopwatch, "time", clock)
    watch = Stopwatch()
    for part, seconds in (("imports", 1.0), ("plan", 0.5), ("compile", 3.0), ("plan", 0.25)):
        clock.now += seconds
        watch.lap(part)
    assert watch.seconds() == {"imports": 1.0, "plan": 0.75, "compile": 3.0, "total": 4.75}
    assert watch.line() == "first iteration after 4.8 s: imports 1.0, checks 0.8, compile 3.0"
    with pytest.raises(ValueError, match="allowed: python, flags"):
        watch.lap("lunch")


def test_the_process_age_is_read_from_proc(tmp_path: Path) -> None:
    import os

    ticks = os.sysconf("SC_CLK_TCK")
    stat, uptime = tmp_path / "stat", tmp_path / "uptime"
    fields = ["S"] + ["0"] * 18 + [str(100 * ticks)] + ["0"] * 10  # field 22 (starttime) after "pid (comm) "
    stat.write_text("1234 (ppo-eqx (a name)) " + " ".join(fields))
    uptime.write_text("102.5 300.0\n")
    assert process_age(stat, uptime) == pytest.approx(2.5)
    assert process_age(tmp_path / "missing", uptime) == 0.0
    assert 0.0 <= process_age() < 24 * 3600  # this process's own
