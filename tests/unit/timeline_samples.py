"""Timelines built by hand, for the trace writers' tests: a mismatch and a hang in a world of
4 ranks with 2 groups, and a big one."""

from __future__ import annotations

from dataclasses import replace

from harness.controller.verdicts import HANG, MISMATCH
from harness.protocol.traces import COMPLETED, IN_FLIGHT
from harness.timeline.model import NEVER_REACHED, Group, Span, Timeline

DEFAULT = Group("", "the default group", (0, 1, 2, 3))
EVENS = Group("0,2/1", "the group of ranks 0, 2", (0, 2))


def span(
    rank: int,
    group: Group,
    seq: int,
    op: str = "all_reduce",
    *,
    start: float | None = None,
    end: float | None = None,
    state: str = COMPLETED,
    shape: tuple[int, ...] = (4,),
) -> Span:
    """One span; ``start`` defaults to ``seq * 0.01`` and ``end`` to 5 ms after it."""
    reduce_op = "SUM" if op in ("all_reduce", "reduce_scatter") else None
    if state == NEVER_REACHED:
        start = end = None
    else:
        start = seq * 0.01 + rank * 0.001 if start is None else start
        end = None if state == IN_FLIGHT else (start + 0.005 if end is None else end)
    dims = ", ".join(map(str, shape))
    text = f"{op}({reduce_op + ', ' if reduce_op else ''}float32[{dims}])"
    return Span(
        rank,
        group.id,
        seq,
        op,
        text,
        (shape,),
        "float32",
        reduce_op,
        f"test_model.py:{10 + seq}" if state != NEVER_REACHED else "",
        start,
        end,
        state,
    )


def mismatch() -> Timeline:
    """4 ranks: two all_reduces on the default group, one on ranks 0 and 2; at #3 of the
    default group rank 3 calls all_gather where the others call all_reduce."""
    spans = []
    for rank in range(4):
        spans += [span(rank, DEFAULT, 1), span(rank, DEFAULT, 2)]
        if rank in EVENS.ranks:
            spans.append(span(rank, EVENS, 1, start=0.025 + rank * 0.001))
        op = "all_gather" if rank == 3 else "all_reduce"
        spans.append(span(rank, DEFAULT, 3, op))
    return Timeline(
        test="tests/test_model.py::test_step[ws4]",
        failure="collectives differ: #3 on the default group: rank 3 called all_gather, "
        "ranks 0, 1, 2 all_reduce",
        world_size=4,
        backend="gloo",
        groups=(DEFAULT, EVENS),
        spans=tuple(spans),
        mark=("", 3),
        mark_kind=MISMATCH,
        mark_text="rank 3 called all_gather(float32[4]), ranks 0, 1, 2 all_reduce(SUM, float32[4])",
        origin=100.0,
        duration=0.05,
    )


def hang() -> Timeline:
    """4 ranks: ranks 0 and 2 wait in #2 on their group; rank 2 never reached it because it
    hangs in #3 of the default group, where rank 3 never arrives (it returned)."""
    spans = []
    for rank in range(4):
        spans += [span(rank, DEFAULT, 1), span(rank, DEFAULT, 2)]
    spans += [
        span(0, EVENS, 1),
        span(2, EVENS, 1),
        span(0, EVENS, 2, state=IN_FLIGHT),
        span(2, EVENS, 2, state=NEVER_REACHED),
        span(1, DEFAULT, 3, state=IN_FLIGHT),
        span(2, DEFAULT, 3, state=IN_FLIGHT),
        span(3, DEFAULT, 3, state=NEVER_REACHED),
        span(0, DEFAULT, 3, state=NEVER_REACHED),
    ]
    spans.sort(key=lambda s: (s.rank, s.start is None, s.start or 0.0))
    return Timeline(
        test="tests/test_model.py::test_hang",
        failure="hang: rank 3 returned; ranks 1, 2 wait in #3 all_reduce on the default group",
        world_size=4,
        backend="gloo",
        groups=(DEFAULT, EVENS),
        spans=tuple(spans),
        mark=("", 3),
        mark_kind=HANG,
        mark_text="ranks 1, 2 are in all_reduce(SUM, float32[4]); ranks 0, 3 never reached it",
        origin=100.0,
        duration=0.2,
    )


def big(ranks: int = 8, collectives: int = 200) -> Timeline:
    """``ranks`` ranks, each ``collectives`` completed all_reduces on the default group."""
    group = Group("", "the default group", tuple(range(ranks)))
    spans = tuple(
        span(rank, group, seq, start=seq * 0.002 + rank * 0.0001, end=seq * 0.002 + 0.0015)
        for rank in range(ranks)
        for seq in range(1, collectives + 1)
    )
    return Timeline(
        test="tests/test_big.py::test_many",
        failure="",
        world_size=ranks,
        backend="gloo",
        groups=(group,),
        spans=spans,
        origin=0.0,
        duration=(collectives + 1) * 0.002,
    )


def without(timeline: Timeline, rank: int) -> Timeline:
    """``timeline`` as if ``rank``'s trace were missing (the rank died, or did not answer)."""
    spans = tuple(s for s in timeline.spans if s.rank != rank)
    return replace(timeline, spans=spans, ranks_unknown=(rank,), mark=None, mark_kind="")
