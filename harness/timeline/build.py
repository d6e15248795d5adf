"""The :class:`~harness.timeline.model.Timeline` of a call, built from its ranks' traces.

Each rank's trace holds, per process group, every collective it issued (up to
``SEQUENCE_CAP``) with when it started and returned, on ``time.monotonic()``'s clock, which
every process of a machine shares: the spans of all ranks go on one axis, zero at the
earliest start. A collective that a member of its group issued but another member did not
(it returned, raised, hung elsewhere or died first) is a span of that member too, in state
``NEVER_REACHED``, so the picture shows the gap. The collective to point at is the one the
call's verdicts point at (:func:`harness.controller.verdicts.findings`, kept on the error as
``DistributedError.marks``): nothing is compared here anew.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from harness.controller.verdicts import HANG, MISMATCH
from harness.errors import DistributedError
from harness.protocol.traces import (
    COMPLETED,
    DEFAULT_GROUP,
    IN_FLIGHT,
    Op,
    RankTrace,
    group_names,
    issued,
)
from harness.timeline.model import NEVER_REACHED, Group, Span, Timeline

__all__ = ["build", "from_error"]

_KINDS = (MISMATCH, HANG)


def build(
    traces: Mapping[int, RankTrace | None],
    world_size: int,
    *,
    test: str,
    backend: str,
    failure: str = "",
    marks: Sequence[tuple[str, int, str]] = (),
    verdicts: Sequence[str] = (),
    origin: float | None = None,
    taken: float | None = None,
) -> Timeline:
    """The timeline of one call.

    Args:
        traces: Per rank, its trace (None or missing: unknown, the rank died or did not
            answer).
        world_size: How many ranks the world had (the default group's members).
        test: What ran (a pytest node id, a function's name).
        backend: The world's backend (``"gloo"``).
        failure: How the call ended, one line ('' for a pass; only the first line is kept).
        marks: The verdicts' ``(group, seq, kind)``, as ``DistributedError.marks``: the first
            with a collective (``seq`` >= 1) is marked.
        verdicts: The verdict lines, in the order of ``marks``: the mark's says what is wrong.
        origin: The time zero (``time.monotonic()``, e.g. when the call started); default:
            the earliest start in the traces.
        taken: When the traces were taken (``time.monotonic()``): where spans still in
            flight end in the picture; default: the latest time in the traces.

    Returns:
        The timeline; its spans by rank, then in the order each rank issued them.
    """
    known = {rank: trace for rank, trace in traces.items() if trace is not None}
    members: dict[str, tuple[int, ...] | None] = {}
    for rank in sorted(known):
        for group, history in known[rank].groups.items():
            members.setdefault(group, history.ranks)
    names = group_names(sorted(members), members)
    order = sorted(members, key=lambda g: (g != DEFAULT_GROUP, g))
    groups = tuple(
        Group(
            g,
            names[g],
            tuple(range(world_size)) if members[g] is None else tuple(members[g] or ()),
        )
        for g in order
    )
    raw: list[tuple[int, str, int, Op, str, float, float, str]] = []
    for each in groups:
        raw += _group_spans(each, known)
    starts = [start for *_, start, _, _ in raw if start == start]
    if origin is None:
        origin = min(starts, default=0.0)
    latest = max((t for item in raw for t in item[5:7] if t == t), default=origin)
    if taken is not None:
        latest = max(latest, taken)
    shown: dict[int, tuple[tuple[tuple[int, ...], ...], str | None]] = {}
    rank_of_group = {group.id: index for index, group in enumerate(groups)}
    spans = []
    for rank, group_id, seq, op, site, start, end, state in raw:
        if id(op) not in shown:
            described = issued(op, (), site)
            shown[id(op)] = (described.shapes, described.dtype)
        shapes, dtype = shown[id(op)]
        spans.append(
            Span(
                rank=rank,
                group=group_id,
                seq=seq,
                op=op.name,
                text=op.text,
                shapes=shapes,
                dtype=dtype,
                reduce_op=op.reduce_op or None,
                site=site,
                start=None if start != start else start - origin,
                end=None if end != end else end - origin,
                state=state,
            )
        )
    spans.sort(
        key=lambda s: (
            s.rank,
            s.start is None,
            s.start or 0.0,
            rank_of_group[s.group],
            s.seq,
        )
    )
    mark, kind, text = _mark(marks, verdicts)
    return Timeline(
        test=test,
        failure=failure.strip().split("\n", 1)[0],
        world_size=world_size,
        backend=backend,
        groups=groups,
        spans=tuple(spans),
        ranks_unknown=tuple(r for r in range(world_size) if traces.get(r) is None),
        mark=mark,
        mark_kind=kind,
        mark_text=text,
        origin=origin,
        duration=max(latest - origin, 0.0),
    )


def from_error(
    error: DistributedError,
    world_size: int,
    *,
    test: str,
    backend: str,
    taken: float | None = None,
) -> Timeline:
    """The timeline of a failed call, from its error (its ``collectives``, ``verdicts``,
    ``marks`` and ``summary``); see :func:`build`."""
    return build(
        error.collectives,
        world_size,
        test=test,
        backend=backend,
        failure=f"{type(error).__name__}: {error.summary}",
        marks=error.marks,
        verdicts=error.verdicts,
        taken=taken,
    )


def _group_spans(
    group: Group, known: Mapping[int, RankTrace]
) -> list[tuple[int, str, int, Op, str, float, float, str]]:
    """The spans of one group, per member rank whose trace is known: those it issued, then
    those a peer issued and it did not (``NEVER_REACHED``)."""
    issued_by = {}
    for rank in group.ranks:
        trace = known.get(rank)
        if trace is not None:
            history = trace.groups.get(group.id)
            issued_by[rank] = history.spans() if history is not None else []
    longest = max(issued_by.values(), key=len, default=[])
    found = []
    for rank, items in issued_by.items():
        states = {c.seq: c.state for c in known[rank].recent if c.group == group.id and c.seq}
        for index, (op, site, start, end) in enumerate(items):
            seq = index + 1
            state = states.get(seq)
            if state is None:
                # Not among the last few records: it returned if its end was noted; with no
                # times at all (not recorded), it is taken as completed.
                state = IN_FLIGHT if start == start and end != end else COMPLETED
            found.append((rank, group.id, seq, op, site, start, end, state))
        nan = float("nan")
        for index in range(len(items), len(longest)):
            op = _issued_at(issued_by, index)
            found.append((rank, group.id, index + 1, op, "", nan, nan, NEVER_REACHED))
    return found


def _issued_at(issued_by: Mapping[int, list[tuple[Op, str, float, float]]], index: int) -> Op:
    """The op of collective ``index + 1`` as the first member that issued it called it."""
    return next(items[index][0] for items in issued_by.values() if len(items) > index)


def _mark(
    marks: Sequence[tuple[str, int, str]], verdicts: Sequence[str]
) -> tuple[tuple[str, int] | None, str, str]:
    """The collective to point at, its kind and what is wrong there: the first verdict's
    that names a collective."""
    for index, (group, seq, kind) in enumerate(marks):
        if seq >= 1 and kind in _KINDS:
            text = verdicts[index] if index < len(verdicts) else ""
            return (group, seq), kind, text
    return None, "", ""
