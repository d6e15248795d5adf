"""Where each part of the timeline picture goes (:func:`layout`): lanes, tracks, boxes, the
shortened time axis and the summarised stretches of a huge trace, in pixels.

Time runs left to right in seconds since :attr:`Timeline.origin`, on one axis for every rank
(:class:`~harness.timeline.axis.Axis`, which shortens long idle stretches); the
scale gives the typical interval between a rank's starts
:data:`~harness.timeline.axis.PITCH_PX` pixels.

A call with more than :data:`MAX_BOXES` collectives is windowed: each rank keeps a box for its
first and last collectives and for those around the marked one (:attr:`Timeline.mark`), a
budget of ``MAX_BOXES`` shared by the ranks, and each run of the rest becomes one band labelled
with its count, so the page's size stays bounded whatever the trace's. A rank's collectives
without a start (``never reached``, or not known) are placed after its last box on their group,
in order, aligned with their peers' boxes where those are later; a track keeps the first
:data:`PLACEHOLDERS` of them and counts the rest.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from harness.protocol.traces import IN_FLIGHT, ISSUED
from harness.timeline.axis import MIN_PLOT, PITCH_PX, X0, Axis, Gap
from harness.timeline.model import Span, Timeline

MAX_BOXES = 3000
"""Above this many collectives in a call, each rank's are windowed (see the module)."""
MIN_KEEP = 30
"""The fewest boxes a windowed rank keeps, however many ranks share :data:`MAX_BOXES`."""
PLACEHOLDERS = 6
"""The most boxes without a start drawn on one track; the rest are counted."""
# The rows and boxes, in pixels: the margin right of the plot, the axis's top and height, a
# track's and a box's height, the space above and below a lane's tracks, a placeholder's width,
# the narrowest box (a collective of a microsecond stays visible), the space between
# placeholders.
RIGHT_PAD = 56.0
AXIS_TOP, AXIS_H = 30.0, 30.0
TRACK_H, BOX_H, LANE_PAD = 24.0, 16.0, 6.0
PLACEHOLDER_W, MIN_BOX_W, BOX_GAP = 100.0, 3.0, 4.0


@dataclass(frozen=True)
class Track:
    """One group's row in a rank's lane: ``group`` is its id, ``y`` its top."""

    group: str
    y: float


@dataclass(frozen=True)
class Lane:
    """One rank's rows: its tracks (one per group it belongs to or ran on), top and height;
    ``note`` says why it has no box ('' when it has some)."""

    rank: int
    y: float
    height: float
    tracks: tuple[Track, ...]
    note: str


@dataclass(frozen=True)
class Box:
    """One drawn collective: ``placed`` when it has no start and was put after its track's
    boxes rather than at a time."""

    span: Span
    x: float
    y: float
    w: float
    placed: bool


@dataclass(frozen=True)
class Band:
    """A run of one rank's collectives summarised (a windowed trace): how many, from which
    time to which, and their states with counts."""

    rank: int
    count: int
    start: float
    end: float
    x: float
    w: float
    states: tuple[tuple[str, int], ...]


@dataclass(frozen=True)
class Layout:
    """Everything placed: the plot's size, its rows, boxes, bands, gaps and tick labels;
    ``more`` holds ``(x, y, count)`` of tracks whose placeholders were cut short, ``end``
    where the traces were taken (open boxes end there) and ``kept`` each windowed rank's
    budget (0: none was)."""

    width: float
    height: float
    lanes: tuple[Lane, ...]
    boxes: tuple[Box, ...]
    bands: tuple[Band, ...]
    gaps: tuple[Gap, ...]
    ticks: tuple[tuple[float, str], ...]
    more: tuple[tuple[float, float, int], ...]
    end: float
    kept: int


def _end(span: Span, t_end: float) -> float:
    """Where ``span`` (which has a start) ends in the picture: an open one at ``t_end``."""
    assert span.start is not None
    if span.end is not None:
        return max(span.end, span.start)
    return t_end if span.state in (IN_FLIGHT, ISSUED) else span.start


def _mark_index(spans: Sequence[Span], mark: tuple[str, int] | None) -> int | None:
    """The index in ``spans`` of the marked collective, else of the rank's last one before it
    on its group (None: neither)."""
    if mark is None:
        return None
    before = None
    for i, span in enumerate(spans):
        if span.key == mark:
            return i
        if span.group == mark[0] and span.seq < mark[1]:
            before = i
    return before


def _keep(spans: Sequence[Span], budget: int, mark: tuple[str, int] | None) -> list[bool]:
    """Which of a rank's timed spans get a box: all within ``budget``, else its first, its
    last and those around the mark."""
    n = len(spans)
    if n <= budget:
        return [True] * n
    keep = [False] * n
    centre = _mark_index(spans, mark)
    ends = budget // 3 if centre is not None else budget // 2
    for i in [*range(ends), *range(n - ends, n)]:
        keep[i] = True
    if centre is not None:
        half = (budget - 2 * ends) // 2
        for i in range(max(0, centre - half), min(n, centre + half + 1)):
            keep[i] = True
    return keep


def _window(
    timeline: Timeline, timed: dict[int, list[Span]], t_end: float
) -> tuple[list[Span], list[tuple[int, list[Span]]], int]:
    """The timed spans that get a box, the runs summarised (rank, spans) and the budget
    of each rank (0 when every span has a box)."""
    total = sum(len(spans) for spans in timed.values())
    budget = 0 if total <= MAX_BOXES else max(MIN_KEEP, MAX_BOXES // max(1, len(timed)))
    drawn: list[Span] = []
    runs: list[tuple[int, list[Span]]] = []
    for rank, spans in timed.items():
        keep = _keep(spans, budget, timeline.mark) if budget else [True] * len(spans)
        run: list[Span] = []
        for span, kept in zip(spans, keep, strict=True):
            if kept:
                drawn.append(span)
                if run:
                    runs.append((rank, run))
                    run = []
            else:
                run.append(span)
        if run:
            runs.append((rank, run))
    return drawn, runs, budget


def _scale(timed: list[Span], t_end: float) -> float:
    """Pixels per second that give the typical interval between a rank's starts
    :data:`PITCH_PX` (see the module)."""
    by_rank: dict[int, list[float]] = {}
    for span in timed:
        assert span.start is not None
        by_rank.setdefault(span.rank, []).append(span.start)
    pitches = [b - a for starts in by_rank.values() for a, b in itertools.pairwise(sorted(starts))]
    pitches = [p for p in pitches if p > 0]
    if pitches:
        return PITCH_PX / statistics.median(pitches)
    lengths = [_end(s, t_end) - s.start for s in timed if s.start is not None]
    lengths = [d for d in lengths if d > 0]
    if lengths:
        return 4 * PITCH_PX / statistics.median(lengths)
    return MIN_PLOT / max(t_end, 1e-9)


def _lanes(timeline: Timeline) -> list[tuple[int, list[str], str]]:
    """Each rank, its tracks' group ids, and why it has no box ('' when it has one)."""
    ranks = sorted(
        set(range(timeline.world_size))
        | {s.rank for s in timeline.spans}
        | set(timeline.ranks_unknown)
    )
    ids = [g.id for g in timeline.groups]
    members = {g.id: set(g.ranks) for g in timeline.groups}
    used = {(s.rank, s.group) for s in timeline.spans}
    lanes = []
    for rank in ranks:
        tracks = [i for i in ids if (rank, i) in used or rank in members.get(i, ())]
        note = ""
        if rank in timeline.ranks_unknown:
            note = "no trace from this rank: it died or did not answer"
        elif not any(r == rank for r, _ in used):
            note = "no collectives"
        lanes.append((rank, tracks, note))
    return lanes


def _rows(timeline: Timeline) -> tuple[list[Lane], dict[tuple[int, str], float], float]:
    """The lanes, each track's top by ``(rank, group)``, and where the last lane ends."""
    lanes: list[Lane] = []
    rows: dict[tuple[int, str], float] = {}
    y = AXIS_TOP + AXIS_H
    for rank, ids, note in _lanes(timeline):
        tracks = tuple(Track(gid, y + LANE_PAD + i * TRACK_H) for i, gid in enumerate(ids))
        height = 2 * LANE_PAD + TRACK_H * max(1, len(tracks))
        lanes.append(Lane(rank, y, height, tracks, note))
        rows.update({(rank, t.group): t.y for t in tracks})
        y += height
    return lanes, rows, y


def _placeholders(
    timeline: Timeline,
    axis: Axis,
    rows: dict[tuple[int, str], float],
    right: dict[tuple[int, str], float],
    boxes: list[Box],
) -> list[tuple[float, float, int]]:
    """Add a box for each collective without a start to ``boxes`` (see the module), after
    ``right``, its track's last box; returns the ``(x, y, count)`` of tracks that had more."""
    first_start: dict[tuple[str, int], float] = {}
    untimed: dict[tuple[int, str], list[Span]] = {}
    for span in timeline.spans:
        if span.start is not None:
            first_start[span.key] = min(first_start.get(span.key, math.inf), span.start)
        else:
            untimed.setdefault((span.rank, span.group), []).append(span)
    more = []
    for (rank, group), spans in untimed.items():
        x = right.get((rank, group), X0) + BOX_GAP
        for span in sorted(spans, key=lambda s: s.seq)[:PLACEHOLDERS]:
            anchor = first_start.get(span.key)
            x = max(x, axis.x(anchor)) if anchor is not None else x
            boxes.append(Box(span, x, rows[rank, group], PLACEHOLDER_W, True))
            x += PLACEHOLDER_W + BOX_GAP
        if len(spans) > PLACEHOLDERS:
            more.append((x, rows[rank, group], len(spans) - PLACEHOLDERS))
    return more


def layout(timeline: Timeline) -> Layout:
    """Place every part of ``timeline``'s picture.

    Args:
        timeline: The call's collectives.

    Returns:
        The positions, in pixels of the plot (the axis and the lanes, without their labels).
    """
    known = [t for s in timeline.spans for t in (s.start, s.end) if t is not None]
    t_end = max([timeline.duration, 0.0, *known])
    timed: dict[int, list[Span]] = {}
    for span in timeline.spans:
        if span.start is not None:
            timed.setdefault(span.rank, []).append(span)
    drawn, runs, budget = _window(timeline, timed, t_end)
    spans_of_runs = [(r, run, min(s.start or 0.0 for s in run)) for r, run in runs]
    elided = [(lo, max(_end(s, t_end) for s in run)) for _, run, lo in spans_of_runs]
    times = [0.0, t_end, *(t for pair in elided for t in pair)]
    for span in drawn:
        assert span.start is not None
        times += [max(0.0, span.start), _end(span, t_end)]
    axis = Axis(times, _scale(drawn, t_end), elided)

    lanes, rows, y = _rows(timeline)
    boxes: list[Box] = []
    bands: list[Band] = []
    right: dict[tuple[int, str], float] = {}
    for span in drawn:
        assert span.start is not None
        x0, x1 = axis.x(max(0.0, span.start)), axis.x(_end(span, t_end))
        box = Box(span, x0, rows[span.rank, span.group], max(MIN_BOX_W, x1 - x0), False)
        boxes.append(box)
        right[span.rank, span.group] = max(right.get((span.rank, span.group), X0), x0 + box.w)
    for (rank, run, lo), (_, hi) in zip(spans_of_runs, elided, strict=True):
        states: dict[str, int] = {}
        for span in run:
            states[span.state] = states.get(span.state, 0) + 1
        x0 = axis.x(lo)
        bands.append(Band(rank, len(run), lo, hi, x0, axis.x(hi) - x0, tuple(states.items())))
    more = _placeholders(timeline, axis, rows, right, boxes)
    order = {id(s): i for i, s in enumerate(timeline.spans)}
    boxes.sort(key=lambda b: order[id(b.span)])
    width = max([axis.end[1], *(b.x + b.w for b in boxes), *(x + 160 for x, _, _ in more)])
    return Layout(
        width=width + RIGHT_PAD,
        height=y + LANE_PAD,
        lanes=tuple(lanes),
        boxes=tuple(boxes),
        bands=tuple(bands),
        gaps=tuple(axis.gaps()),
        ticks=tuple(axis.ticks()),
        more=tuple(more),
        end=axis.x(t_end),
        kept=budget,
    )
