"""A call's collectives as Chrome trace events: the ``trace.json`` of ``--dist-trace-dir``.

The JSON object form of the Trace Event Format, which Perfetto (ui.perfetto.dev) and
``chrome://tracing`` load. Times are microseconds since :attr:`Timeline.origin`. Where the
format leaves a choice:

- ``pid`` is the rank and ``tid`` the group's place in :attr:`Timeline.groups` plus one (a
  thread 0 is the kernel's idle thread to some viewers); metadata events name and sort them
  (``rank 1``, ``the default group``).
- Each collective a rank entered is a complete event (``ph: "X"``). One still in flight when
  the traces were taken, or whose end is not known, lasts to :attr:`Timeline.duration` and
  its ``args`` say so (``"ended": false``).
- A collective a rank never reached is an instant (``ph: "i"``) on that rank's track of the
  group, at the time the first of its peers entered it; left out when no peer's time is known.
- One flow per collective that two or more ranks entered (``id`` per ``(group, seq)``): its
  start (``s``) on the first rank to enter it, a step (``t``) on each next one, its end
  (``f``) on the last, so the arrows follow the ranks' arrival and end at the rank the others
  waited for. Each sits at the start of the slice it binds to, on its thread, with its
  category, and binds to the enclosing slice (``bp: "e"``): Perfetto binds a flow event to
  the slice open on its thread, Chrome DevTools to the slice with the same category, thread
  and time.
- The mark (:attr:`Timeline.mark`) is a global instant (``ph: "i"``, ``s: "g"``) named with
  :attr:`Timeline.mark_text`, where its collective was first entered.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

from harness.protocol.traces import COMPLETED, IN_FLIGHT, ISSUED, RAISED
from harness.timeline.model import NEVER_REACHED, Span, Timeline

CATEGORY = "collective"
"""The ``cat`` of a collective's slices and of its flow events (equal, see the module)."""

FLOW_NAME = "collective"
"""The ``name`` of every flow event: a flow is told apart by its id."""

_MIN_DUR = 0.001
"""The shortest slice, in microseconds: a slice of no length may be closed before the flow
event at its start binds to it."""

_COLOURS = {
    COMPLETED: "good",
    IN_FLIGHT: "terrible",
    RAISED: "bad",
    ISSUED: "yellow",
    NEVER_REACHED: "grey",
}
"""``cname`` per state: chrome://tracing's reserved colour names (Perfetto colours by name)."""

# Among events at one time, a slice precedes the flow events that bind to it: viewers read
# events in time order, ties in file order, and a flow binds to a slice already open.
_SLICE, _FLOW, _INSTANT, _MARK = range(4)


def document(timeline: Timeline) -> dict[str, Any]:
    """The trace-event document of ``timeline``.

    Args:
        timeline: The call's collectives across its ranks.

    Returns:
        ``{"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {...}}``, plain JSON
        data (``json.dumps`` writes it as is); the timed events in time order, after the
        metadata events.
    """
    tids = {group.id: index + 1 for index, group in enumerate(timeline.groups)}
    names = {group.id: group.name for group in timeline.groups}
    timed: list[tuple[float, int, int, dict[str, Any]]] = []

    def add(kind: int, event: dict[str, Any]) -> None:
        timed.append((event["ts"], kind, len(timed), event))

    entered: dict[tuple[str, int], list[tuple[float, Span]]] = defaultdict(list)
    for span, start, end in _placed(timeline):
        event = _slice(timeline, span, start, end, tids[span.group], names[span.group])
        add(_SLICE, event)
        if span.seq > 0:
            entered[span.key].append((start, span))
    for flow_id, key in enumerate(sorted(k for k, v in entered.items() if len(v) > 1), 1):
        for event in _flow(flow_id, sorted(entered[key], key=lambda e: (e[0], e[1].rank)), tids):
            add(_FLOW, event)
    for span in timeline.spans:
        arrivals = entered.get(span.key)
        if span.state == NEVER_REACHED and arrivals:
            first = min(start for start, _ in arrivals)
            add(_INSTANT, _never_reached(span, first, tids[span.group], names[span.group]))
    if timeline.mark is not None:
        add(_MARK, _mark(timeline, entered.get(timeline.mark, []), tids))
    timed.sort(key=lambda item: item[:3])
    return {
        "traceEvents": [*_metadata(timeline, tids, names), *(item[3] for item in timed)],
        "displayTimeUnit": "ms",
        "otherData": _other_data(timeline, tids),
    }


def _us(seconds: float) -> float:
    """Seconds as microseconds, to the nanosecond."""
    return round(seconds * 1e6, 3)


def _known(value: float | None) -> float | None:
    """``value``, or None where it is missing or not a number."""
    return value if value is not None and math.isfinite(value) else None


def _placed(timeline: Timeline) -> list[tuple[Span, float, float]]:
    """Each span a rank entered with a known start, as ``(span, start, end)`` in microseconds.

    Spans of one rank and group that overlap (issued from several threads) are cut where
    the next begins: slices on one thread must nest, and collectives do not.
    """
    tracks: dict[tuple[int, str], list[Span]] = defaultdict(list)
    for span in timeline.spans:
        if span.state != NEVER_REACHED and _known(span.start) is not None:
            tracks[span.rank, span.group].append(span)
    placed = []
    horizon = _us(_known(timeline.duration) or 0.0)
    for spans in tracks.values():
        spans.sort(key=lambda s: s.start or 0.0)
        for index, span in enumerate(spans):
            start = _us(span.start or 0.0)
            end_s = _known(span.end)
            end = _us(end_s) if end_s is not None else max(horizon, start)
            if index + 1 < len(spans):
                end = min(end, _us(spans[index + 1].start or 0.0))
            placed.append((span, start, max(end, start + _MIN_DUR)))
    return placed


def _slice(
    timeline: Timeline, span: Span, start: float, end: float, tid: int, group: str
) -> dict[str, Any]:
    """The complete event of one collective on one rank."""
    args: dict[str, Any] = {
        "op": span.op,
        "text": span.text,
        "group": group,
        "seq": span.seq,
        "state": span.state,
        "site": span.site,
        "shapes": [list(shape) for shape in span.shapes],
        "dtype": span.dtype,
        "reduce_op": span.reduce_op,
        "ended": _known(span.end) is not None,
    }
    if span.state == IN_FLIGHT:
        args["note"] = "still in flight when the traces were taken: drawn to the trace's end"
    elif _known(span.end) is None:
        args["note"] = "its end is not known: drawn to the trace's end"
    if timeline.mark == span.key:
        args["mark"] = timeline.mark_text or timeline.mark_kind
    return {
        "name": span.text or span.op,
        "cat": CATEGORY,
        "ph": "X",
        "ts": start,
        "dur": round(end - start, 3),
        "pid": span.rank,
        "tid": tid,
        "cname": _COLOURS.get(span.state, "generic_work"),
        "args": args,
    }


def _flow(
    flow_id: int, arrivals: list[tuple[float, Span]], tids: dict[str, int]
) -> list[dict[str, Any]]:
    """The flow events joining one collective across the ranks that entered it, in the
    order they entered it."""
    events = []
    for index, (start, span) in enumerate(arrivals):
        phase = "s" if index == 0 else "f" if index == len(arrivals) - 1 else "t"
        event: dict[str, Any] = {
            "name": FLOW_NAME,
            "cat": CATEGORY,
            "ph": phase,
            "id": flow_id,
            "ts": start,
            "pid": span.rank,
            "tid": tids[span.group],
        }
        if phase != "s":
            event["bp"] = "e"
        events.append(event)
    return events


def _never_reached(span: Span, first: float, tid: int, group: str) -> dict[str, Any]:
    """The instant of a collective ``span.rank`` never reached, when its first peer entered it."""
    return {
        "name": f"never reached: {span.text or span.op}",
        "cat": "never reached",
        "ph": "i",
        "s": "t",
        "ts": first,
        "pid": span.rank,
        "tid": tid,
        "cname": _COLOURS[NEVER_REACHED],
        "args": {"op": span.op, "text": span.text, "group": group, "seq": span.seq},
    }


def _mark(
    timeline: Timeline, arrivals: list[tuple[float, Span]], tids: dict[str, int]
) -> dict[str, Any]:
    """The global instant of the mark, where its collective was first entered."""
    assert timeline.mark is not None
    group, seq = timeline.mark
    if arrivals:
        ts, first = min(arrivals, key=lambda e: (e[0], e[1].rank))
        rank = first.rank
    else:
        ts, rank = _us(_known(timeline.duration) or 0.0), 0
    return {
        "name": timeline.mark_text or f"{timeline.mark_kind} at #{seq}",
        "cat": "mark",
        "ph": "i",
        "s": "g",
        "ts": ts,
        "pid": rank,
        "tid": tids.get(group, 1),
        "args": {
            "kind": timeline.mark_kind,
            "group": group,
            "seq": seq,
            "failure": timeline.failure,
        },
    }


def _metadata(
    timeline: Timeline, tids: dict[str, int], names: dict[str, str]
) -> list[dict[str, Any]]:
    """The events naming and ordering each rank's process and each group's thread in it."""
    events: list[dict[str, Any]] = []
    members: dict[int, set[str]] = defaultdict(set)
    for group in timeline.groups:
        for rank in group.ranks:
            members[rank].add(group.id)
    for span in timeline.spans:
        members[span.rank].add(span.group)
    for rank in sorted(set(range(timeline.world_size)) | set(members)):
        missing = " (no trace)" if rank in timeline.ranks_unknown else ""
        events += [
            {
                "name": "process_name",
                "ph": "M",
                "pid": rank,
                "args": {"name": f"rank {rank}{missing}"},
            },
            {"name": "process_sort_index", "ph": "M", "pid": rank, "args": {"sort_index": rank}},
        ]
        for group_id in sorted(members[rank], key=tids.__getitem__):
            tid = tids[group_id]
            events += [
                {
                    "name": "thread_name",
                    "ph": "M",
                    "pid": rank,
                    "tid": tid,
                    "args": {"name": names[group_id]},
                },
                {
                    "name": "thread_sort_index",
                    "ph": "M",
                    "pid": rank,
                    "tid": tid,
                    "args": {"sort_index": tid},
                },
            ]
    return events


def _other_data(timeline: Timeline, tids: dict[str, int]) -> dict[str, Any]:
    """What the trace is of: the test, how it ended, its world and groups, the mark."""
    mark = None
    if timeline.mark is not None:
        mark = {
            "kind": timeline.mark_kind,
            "group": timeline.mark[0],
            "seq": timeline.mark[1],
            "text": timeline.mark_text,
        }
    return {
        "test": timeline.test,
        "failure": timeline.failure,
        "world_size": timeline.world_size,
        "backend": timeline.backend,
        "ranks_unknown": list(timeline.ranks_unknown),
        "mark": mark,
        "groups": [
            {"id": g.id, "name": g.name, "ranks": list(g.ranks), "tid": tids[g.id]}
            for g in timeline.groups
        ],
        "origin_monotonic_s": timeline.origin,
        "duration_s": timeline.duration,
    }
