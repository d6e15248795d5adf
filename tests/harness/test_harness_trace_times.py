"""When each collective started and returned, as real ranks record it: on the clock the
controller reads too, in order, the one a rank is stuck in without an end; a passing call's
traces come back only when its options ask (``CallOptions.keep_traces``)."""

from __future__ import annotations

import math
import time

import torch
import torch.distributed as dist

import harness
from harness.protocol.messages import CallOptions
from harness.protocol.traces import COMPLETED, IN_FLIGHT


def three_all_reduces() -> None:
    tensor = torch.ones(2)
    for _ in range(3):
        dist.all_reduce(tensor)


def rank_1_leaves_early() -> None:
    dist.all_reduce(torch.ones(2))
    if dist.get_rank() == 1:
        return
    dist.all_reduce(torch.ones(2))


def test_a_passing_call_brings_its_times_back_when_asked(world2: harness.World) -> None:
    before = time.monotonic()
    outcome = world2.call(three_all_reduces, options=CallOptions(60, keep_traces=True))
    after = time.monotonic()
    assert outcome.error is None
    assert sorted(outcome.traces) == [0, 1]
    for trace in outcome.traces.values():
        assert trace is not None
        spans = trace.groups[""].spans()
        assert [op.name for op, *_ in spans] == ["all_reduce"] * 3
        times = [t for _, _, start, end in spans for t in (start, end)]
        # One clock for every process of the machine: the controller's brackets the ranks'.
        assert before <= times[0]
        assert times[-1] <= after
        assert times == sorted(times)
    plain = world2.call(three_all_reduces, options=CallOptions(60))
    assert plain.error is None
    assert plain.traces == {}


def test_a_collective_a_rank_is_stuck_in_has_no_end(world2: harness.World) -> None:
    outcome = world2.call(rank_1_leaves_early, options=CallOptions(60))
    error = outcome.error
    assert isinstance(error, harness.WorldHang)
    stuck = error.collectives[0]
    assert stuck is not None
    (_, _, start1, end1), (_, _, start2, end2) = stuck.groups[""].spans()
    assert start1 <= end1 <= start2
    assert math.isnan(end2)
    assert [c.state for c in stuck.recent] == [COMPLETED, IN_FLIGHT]
    assert error.marks == [("", 2, "hang")]
