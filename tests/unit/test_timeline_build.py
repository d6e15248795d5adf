"""The timeline of a call built from hand-made rank traces: spans on one time axis, spans
never reached, the mark where the verdicts point, ranks whose trace is unknown."""

from __future__ import annotations

from array import array

from harness.controller import verdicts
from harness.controller.verdicts import HANG, MISMATCH
from harness.errors import RankError
from harness.protocol.traces import (
    COMPLETED,
    IN_FLIGHT,
    Collective,
    GroupHistory,
    Op,
    RankTrace,
)
from harness.timeline.build import build, from_error
from harness.timeline.model import NEVER_REACHED

NAN = float("nan")
EVENS = "0,2/1"
ALL_REDUCE = Op(
    "all_reduce",
    "all_reduce(SUM, float32[4])",
    "ar SUM 4",
    reduce_op="SUM",
    tensors=("float32[4]",),
)
ALL_GATHER = Op("all_gather", "all_gather(float32[2, 3])", "ag 2x3", tensors=("float32[2, 3]",))


def history(
    group: str,
    ranks: tuple[int, ...] | None,
    ops: list[Op],
    times: list[tuple[float, float]] | None,
) -> GroupHistory:
    """A group's history of ``ops`` (one call site each line), with those start/end times."""
    distinct = list(dict.fromkeys(ops))
    stamps = array("d", [t for pair in times for t in pair]).tobytes() if times else b""
    return GroupHistory(
        group,
        ranks,
        len(ops),
        tuple(distinct),
        array("I", [distinct.index(op) for op in ops]).tobytes(),
        tuple(("/src/test_model.py", 10 + i) for i in range(len(ops))),
        array("I", range(len(ops))).tobytes(),
        times=stamps,
    )


def trace(*histories: GroupHistory, recent: tuple[Collective, ...] = ()) -> RankTrace:
    return RankTrace(recent=recent, groups={h.group: h for h in histories})


def mismatch_traces() -> dict[int, RankTrace | None]:
    """4 ranks: 3 all_reduces on the default group (rank 3's third is an all_gather), one on
    ranks 0 and 2 between the second and third."""
    traces: dict[int, RankTrace | None] = {}
    for rank in range(4):
        third = ALL_GATHER if rank == 3 else ALL_REDUCE
        base = 100.0 + rank * 0.001
        default = history(
            "",
            None,
            [ALL_REDUCE, ALL_REDUCE, third],
            [(base, base + 0.005), (base + 0.01, base + 0.015), (base + 0.03, base + 0.035)],
        )
        groups = [default]
        if rank in (0, 2):
            groups.append(history(EVENS, (0, 2), [ALL_REDUCE], [(base + 0.02, base + 0.025)]))
        traces[rank] = trace(*groups)
    return traces


def test_a_mismatch_is_marked_where_the_verdict_points() -> None:
    traces = mismatch_traces()
    states = dict.fromkeys(range(4), verdicts.DONE)
    found = verdicts.findings(traces, states, 4)
    timeline = build(
        traces,
        4,
        test="t.py::test_step",
        backend="gloo",
        failure="CollectiveMismatch: ...\nsecond line",
        marks=[(f.group, f.seq, f.kind) for f in found],
        verdicts=[f.text for f in found],
    )
    assert timeline.failure == "CollectiveMismatch: ..."
    assert [g.id for g in timeline.groups] == ["", EVENS]
    assert timeline.groups[0].name == "the default group"
    assert timeline.groups[0].ranks == (0, 1, 2, 3)
    assert timeline.groups[1].ranks == (0, 2)
    assert len(timeline.spans) == 4 * 3 + 2
    assert timeline.mark == ("", 3)
    assert timeline.mark_kind == MISMATCH
    assert timeline.mark_text == found[0].text
    assert timeline.origin == 100.0
    first = timeline.spans[0]
    assert (first.rank, first.group, first.seq, first.op) == (0, "", 1, "all_reduce")
    assert first.start == 0.0
    assert first.end is not None
    assert abs(first.end - 0.005) < 1e-9
    assert first.shapes == ((4,),)
    assert first.dtype == "float32"
    assert first.reduce_op == "SUM"
    assert first.site == "test_model.py:10"
    assert first.state == COMPLETED
    # By rank, then in the order issued (across groups, by start).
    rank0 = [(s.group, s.seq) for s in timeline.spans if s.rank == 0]
    assert rank0 == [("", 1), ("", 2), (EVENS, 1), ("", 3)]
    gather = next(s for s in timeline.spans if s.rank == 3 and s.seq == 3)
    assert gather.op == "all_gather"
    assert gather.shapes == ((2, 3),)
    assert gather.reduce_op is None
    assert abs(timeline.duration - 0.038) < 1e-9
    assert timeline.ranks_unknown == ()


def test_a_hang_shows_the_collective_in_flight_and_never_reached() -> None:
    times = [(10.0, 10.1), (10.2, 10.3)]
    traces: dict[int, RankTrace | None] = {
        0: trace(history("", None, [ALL_REDUCE, ALL_REDUCE], times)),
        1: trace(
            history("", None, [ALL_REDUCE] * 3, [*times, (10.4, NAN)]),
            recent=(Collective("", 3, ALL_REDUCE, "/src/test_model.py", 12, IN_FLIGHT),),
        ),
        2: None,
    }
    states = {0: verdicts.DONE, 1: verdicts.RUNNING, 2: verdicts.DIED}
    found = verdicts.findings(traces, states, 3)
    timeline = build(
        traces,
        3,
        test="t.py::test_hang",
        backend="gloo",
        marks=[(f.group, f.seq, f.kind) for f in found],
        verdicts=[f.text for f in found],
        taken=11.0,
    )
    assert timeline.mark == ("", 3)
    assert timeline.mark_kind == HANG
    assert timeline.ranks_unknown == (2,)
    flight = next(s for s in timeline.spans if s.rank == 1 and s.seq == 3)
    assert flight.state == IN_FLIGHT
    assert flight.end is None
    assert flight.start is not None
    assert abs(flight.start - 0.4) < 1e-9
    never = next(s for s in timeline.spans if s.rank == 0 and s.seq == 3)
    assert never.state == NEVER_REACHED
    assert never.start is None
    assert never.site == ""
    assert never.op == "all_reduce"
    assert never.text == ALL_REDUCE.text
    assert [s.rank for s in timeline.spans] == [0, 0, 0, 1, 1, 1]
    assert timeline.duration == 1.0  # until the traces were taken


def test_a_member_that_never_issued_on_a_group_gets_its_spans_never_reached() -> None:
    traces: dict[int, RankTrace | None] = {
        0: trace(history(EVENS, (0, 2), [ALL_REDUCE], [(1.0, NAN)])),
        1: trace(),
        2: trace(),
    }
    timeline = build(traces, 3, test="t", backend="gloo")
    assert [(s.rank, s.state) for s in timeline.spans] == [(0, IN_FLIGHT), (2, NEVER_REACHED)]
    assert timeline.mark is None
    assert timeline.mark_kind == ""


def test_traces_without_times_keep_the_spans_without_them() -> None:
    traces: dict[int, RankTrace | None] = {
        0: trace(history("", None, [ALL_REDUCE], None)),
        1: trace(history("", None, [ALL_REDUCE], None)),
    }
    timeline = build(traces, 2, test="t", backend="gloo", origin=5.0)
    assert [(s.start, s.end, s.state) for s in timeline.spans] == [(None, None, COMPLETED)] * 2
    assert timeline.origin == 5.0
    assert timeline.duration == 0.0


def test_an_error_gives_its_collectives_verdicts_and_mark() -> None:
    error = RankError("rank 3 raised ValueError: no")
    error.collectives = mismatch_traces()
    error.verdicts = ["a verdict without a collective", "collective #3 differs"]
    error.marks = [("", 0, ""), ("", 3, MISMATCH)]
    timeline = from_error(error, 4, test="t.py::test_x", backend="gloo")
    assert timeline.failure == "RankError: rank 3 raised ValueError: no"
    assert timeline.mark == ("", 3)
    assert timeline.mark_text == "collective #3 differs"
    assert timeline.test == "t.py::test_x"
    assert timeline.world_size == 4


def test_an_error_without_collectives_is_an_empty_timeline() -> None:
    timeline = from_error(RankError("rank 0 crashed"), 2, test="t", backend="gloo")
    assert timeline.spans == ()
    assert timeline.groups == ()
    assert timeline.ranks_unknown == (0, 1)
