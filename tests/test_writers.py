"""The run's TensorBoard events, serialised by hand (``cli.writers.scalars_event``), against protobuf's own."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tensorboardX.proto.event_pb2 import Event  # pyright: ignore[reportAttributeAccessIssue]
from tensorboardX.proto.summary_pb2 import Summary  # pyright: ignore[reportAttributeAccessIssue]

from ppo_eqx.cli.writers import scalars_event

pytestmark = pytest.mark.unit

finite = st.floats(allow_nan=False, allow_infinity=False)


@given(
    wall_time=st.floats(0, 4e9),
    step=st.integers(0, 2**63 - 1),
    values=st.dictionaries(st.text(min_size=1, max_size=40), finite, max_size=20),
)
@settings(max_examples=200, deadline=None)
def test_scalars_event_parses_as_protobufs_message(wall_time: float, step: int, values: dict[str, float]) -> None:
    """Any tags (a user's loss names them: any text), any finite values (rounded to float32 as protobuf rounds them,
    beyond its range an infinity), any step: the same message, field for field."""
    want = Event(
        wall_time=wall_time,
        step=step,
        summary=Summary(value=[Summary.Value(tag=tag, simple_value=value) for tag, value in values.items()]),
    )
    got = Event.FromString(scalars_event(wall_time, step, values))
    assert got == want
    for parsed, value in zip(got.summary.value, values.values(), strict=True):
        with np.errstate(over="ignore"):
            rounded = float(np.float32(value))
        assert parsed.simple_value == rounded or (math.isnan(rounded) and math.isnan(parsed.simple_value))
