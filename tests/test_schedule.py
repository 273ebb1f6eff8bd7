"""The checkpoint schedule (``cli.schedule``) against a run's iterations walked one by one."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ppo_eqx.cli.schedule import checkpoint_reason, is_boundary, stops_after

pytestmark = pytest.mark.unit


@given(every=st.integers(1, 50), length=st.integers(1, 200))
def test_segments_end_at_each_interval_and_at_the_last_iteration(every, length):
    ends = [i for i in range(1, length + 1) if is_boundary(i, checkpoint_every=every, num_iterations=length)]
    expected = sorted({*range(every, length + 1, every), length})
    assert ends == expected


@given(
    every=st.integers(1, 20),
    length=st.integers(1, 60),
    stop_at=st.one_of(st.none(), st.integers(1, 60)),
    behind=st.booleans(),
)
def test_a_run_checkpoints_at_boundaries_and_once_where_it_stops(every, length, stop_at, behind):
    """Walk a run: a stop requested during ``stop_at`` is acted on after that iteration, or, where the state is a
    program ahead (``behind``), after the next one, whose records show that state."""
    saved, stopped_after = [], None
    for iteration in range(1, length + 1):
        stop = "SIGTERM" if stop_at is not None and iteration >= stop_at else None
        # The state ran ahead once, as a dispatched program does (never past a boundary: the loop pauses there).
        ahead = (
            behind
            and stop_at == iteration
            and not is_boundary(iteration, checkpoint_every=every, num_iterations=length)
        )
        current = not ahead
        reason = checkpoint_reason(iteration, checkpoint_every=every, num_iterations=length, stop=stop, current=current)
        if reason is not None:
            saved.append((iteration, reason))
        if stops_after(stop=stop, current=current):
            stopped_after = iteration
            break
    last = length if stopped_after is None else stopped_after
    boundaries = [i for i in range(every, last + 1, every)] + ([length] if last == length and length % every else [])
    assert [i for i, reason in saved if reason == "periodic"] == boundaries
    ran_ahead = (
        behind and stop_at is not None and not is_boundary(stop_at, checkpoint_every=every, num_iterations=length)
    )
    if stop_at is None or stop_at > length:
        assert stopped_after is None
    else:
        assert stopped_after == (stop_at + 1 if ran_ahead else stop_at)
        assert saved[-1][0] == stopped_after  # a whole checkpoint of the state it stops with
        assert saved[-1][1] in ("periodic", "SIGTERM")
