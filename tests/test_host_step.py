"""ppo_eqx_bench.host_step's stall probe: a call that holds the GIL stops the other Python threads for its length,
one that releases it (a sleep) does not; EnvPool's make, measured as the bench measures it."""

import threading
import time

import pytest

from ppo_eqx_bench.host_step import envpool_make_stall, stall_while


@pytest.mark.unit
def test_a_call_that_holds_the_gil_stalls_the_ticker_for_its_length_and_a_sleep_does_not() -> None:
    held = stall_while(lambda: sum(range(30_000_000)))  # one C call: the GIL is not let go inside it
    assert held["work_s"] > 0.05
    assert held["stalled_s"] >= 0.9 * held["work_s"] - 0.02
    assert held["longest_s"] <= held["work_s"] + 0.1
    slept = stall_while(lambda: time.sleep(0.3))
    assert slept["work_s"] >= 0.3
    assert slept["stalled_s"] < 0.5 * slept["work_s"]


@pytest.mark.unit
def test_the_works_error_reaches_the_caller_and_the_ticker_stops() -> None:
    def fail() -> None:
        raise ValueError("made to fail")

    before = threading.active_count()
    with pytest.raises(ValueError, match="made to fail"):
        stall_while(fail)
    assert threading.active_count() == before


@pytest.mark.envpool
def test_envpool_make_is_measured_with_its_pools_closed_after() -> None:
    pytest.importorskip("envpool")
    measured = envpool_make_stall("Breakout-v5", pools=2, envs_per_pool=2)
    assert set(measured) == {"work_s", "stalled_s", "longest_s"}
    assert measured["work_s"] > 0 and 0 <= measured["stalled_s"] <= measured["work_s"] + 0.1
