"""The plot of the timeline picture: a :class:`~harness.timeline.layout.Layout` drawn as SVG.

Each rank is a lane, each process group it used a track in it, each collective a box classed
by its state (``s-completed``, ... : the page's style colours them), a collective its rank
never reached a placeholder after its track's boxes, and the marked collective's boxes
outlined and joined under a flag that says what is wrong there. A windowed trace's runs of
collectives not drawn are grey bands with their count; the axis's shortened stretches are
hatched and labelled with their length. Beside the plot, a column names the lanes and tracks.

The plot's elements a test can find: ``.lane[data-rank]``, ``.track[data-rank][data-group]``,
``.box[data-rank][data-group][data-seq][data-state]`` (``.marked`` on the marked collective's
boxes), ``.elided[data-rank][data-count]`` and ``#mark[data-kind][data-group][data-seq]``.
"""

from __future__ import annotations

from collections import Counter
from html import escape

from harness.timeline.axis import X0
from harness.timeline.layout import AXIS_H, AXIS_TOP, BOX_H, LANE_PAD, TRACK_H, Box, Layout
from harness.timeline.model import NEVER_REACHED, STATES, Timeline

FLAG_CHARS = 110
"""The most characters of the flag over the marked collective."""
CHAR_W = 6.2
"""Roughly how wide one character of a box's label is, in pixels (to leave out what would
not fit)."""
DEFS = (
    '<defs><pattern id="p-flight" width="7" height="7" patternUnits="userSpaceOnUse"'
    ' patternTransform="rotate(45)"><rect width="7" height="7" fill="#f7b955"/>'
    '<rect width="3" height="7" fill="#e99a2a"/></pattern>'
    '<pattern id="p-gap" width="6" height="6" patternUnits="userSpaceOnUse"'
    ' patternTransform="rotate(45)"><rect width="6" height="6" fill="#f0f2f4"/>'
    '<rect width="2" height="6" fill="#d5d9de"/></pattern></defs>'
)
"""The plot's fill patterns: in-flight stripes and the hatching of shortened stretches."""


def plot(timeline: Timeline, lay: Layout, names: dict[str, str]) -> str:
    """The plot of ``timeline``: its lanes, boxes and axis, and the mark's flag.

    Args:
        timeline: A call's collectives across its ranks.
        lay: Where each part of its picture goes (:func:`~harness.timeline.layout.layout`).
        names: Each group's name, by its id.

    Returns:
        Its SVG element (``#plot``, with ``#join``: the line the script draws through the
        boxes it lights).
    """
    keys: dict[tuple[str, int], int] = {}
    for box in lay.boxes:
        keys.setdefault(box.span.key, len(keys))
    return (
        f'<svg id="plot" class="plot" width="{lay.width:.0f}" height="{lay.height:.0f}"'
        f' viewBox="0 0 {lay.width:.0f} {lay.height:.0f}" role="img"'
        f' aria-label="collectives of each rank over time">{DEFS}'
        f"{_axis(lay)}{_lanes(lay, keys, timeline.mark)}{_mark(timeline, lay, names)}"
        '<polyline id="join" class="join" points=""/></svg>'
    )


def labels(lay: Layout, names: dict[str, str]) -> str:
    """The column left of the plot that names each lane's rank and each track's group.

    Args:
        lay: Where each part of the picture goes.
        names: Each group's name, by its id.

    Returns:
        Its SVG element.
    """
    longest = max((len(names[t.group]) for lane in lay.lanes for t in lane.tracks), default=0)
    width = min(360.0, max(190.0, 86 + longest * CHAR_W))
    room = int((width - 82) / CHAR_W)
    out = [f'<svg class="labels" width="{width:.0f}" height="{lay.height:.0f}">']
    for n, lane in enumerate(lay.lanes):
        parity = "odd" if n % 2 else "even"
        out.append(
            f'<rect class="lane-bg {parity}" x="0" y="{lane.y:.1f}" width="{width:.0f}"'
            f' height="{lane.height:.1f}"/>'
            f'<line class="lane-line" x1="0" x2="{width:.0f}" y1="{lane.y:.1f}"'
            f' y2="{lane.y:.1f}"/>'
            f'<text class="rank-label lane-label" data-rank="{lane.rank}" x="10"'
            f' y="{lane.y + LANE_PAD + 16:.1f}">rank {lane.rank}</text>'
        )
        for track in lane.tracks:
            name = names[track.group]
            short = name if len(name) <= room else name[: room - 1] + "…"
            out.append(
                f'<text class="group-label" x="74" y="{track.y + 16:.1f}">{escape(short)}'
                f"<title>{escape(name)}</title></text>"
            )
    out.append("</svg>")
    return "".join(out)


def what_is_marked(timeline: Timeline, names: dict[str, str]) -> str:
    """Which collective is marked and what is wrong there: the flag's text and the page's.

    Args:
        timeline: A call's collectives, with a mark.
        names: Each group's name, by its id.

    Returns:
        The mark's text, preceded by the collective's name where it does not name it.
    """
    assert timeline.mark is not None
    group, seq = timeline.mark
    where = f"#{seq} on {names.get(group, f'group {group!r}')}"
    return timeline.mark_text if where in timeline.mark_text else f"{where}: {timeline.mark_text}"


def _seconds(t: float) -> str:
    """``t`` seconds, read easily: ``"2.95 s"``, ``"12.3 ms"``, ``"45 µs"``."""
    if t >= 1:
        return f"{t:.3g} s"
    if t >= 1e-3:
        return f"{t * 1e3:.3g} ms"
    return f"{t * 1e6:.3g} µs"


def _label(box: Box) -> str:
    """What fits inside ``box``: its number and op, its op, its number, or nothing."""
    span = box.span
    if box.placed:
        choices = [f"#{span.seq} not reached", "not reached", f"#{span.seq}"]
        if span.state != NEVER_REACHED:
            choices = [f"#{span.seq} {span.op}", f"#{span.seq}"]
    else:
        choices = [f"#{span.seq} {span.op}", span.op, f"#{span.seq}"]
    return next((c for c in choices if len(c) * CHAR_W + 8 <= box.w), "")


def _axis(lay: Layout) -> str:
    """The lanes' backgrounds and the time axis: gaps, grid lines and tick labels."""
    bottom = AXIS_TOP + AXIS_H
    out = [
        f'<rect class="lane-bg {"odd" if n % 2 else "even"}" x="0" y="{lane.y:.1f}"'
        f' width="{lay.width:.1f}" height="{lane.height:.1f}"/><line class="lane-line" x1="0"'
        f' x2="{lay.width:.1f}" y1="{lane.y:.1f}" y2="{lane.y:.1f}"/>'
        for n, lane in enumerate(lay.lanes)
    ]
    out += [
        f'<line class="axis-line" x1="{X0:.1f}" x2="{lay.end:.1f}" y1="{bottom - 0.5:.1f}"'
        f' y2="{bottom - 0.5:.1f}"/><line class="end-line" x1="{lay.end:.1f}"'
        f' x2="{lay.end:.1f}" y1="{AXIS_TOP + 4:.1f}" y2="{lay.height:.1f}">'
        "<title>the traces were taken here: a collective still open ends here</title></line>"
    ]
    for gap in lay.gaps:
        out.append(
            f'<rect class="gap" data-seconds="{gap.seconds:.6f}" x="{gap.x:.1f}" y="{AXIS_TOP:.1f}"'
            f' width="{gap.w:.1f}" height="{lay.height - AXIS_TOP:.1f}"/>'
            f'<text class="gap-label" x="{gap.x + gap.w / 2:.1f}" y="{AXIS_TOP + 18:.1f}">'
            f"+{escape(_seconds(gap.seconds))}</text>"
        )
    for x, text in lay.ticks:
        out.append(
            f'<line class="grid" x1="{x:.1f}" x2="{x:.1f}" y1="{bottom - 6:.1f}"'
            f' y2="{lay.height:.1f}"/>'
            f'<text class="tick" x="{x + 3:.1f}" y="{AXIS_TOP + 18:.1f}">{escape(text)}</text>'
        )
    return "".join(out)


def _lanes(lay: Layout, keys: dict[tuple[str, int], int], mark: tuple[str, int] | None) -> str:
    """Each rank's lane: its tracks, boxes, summarised bands and notes."""
    odd = _odd(lay, mark)
    by_track: dict[tuple[int, str], list[tuple[int, Box]]] = {}
    for i, box in enumerate(lay.boxes):
        by_track.setdefault((box.span.rank, box.span.group), []).append((i, box))
    out = []
    for lane in lay.lanes:
        out.append(f'<g class="lane" data-rank="{lane.rank}" id="lane-{lane.rank}">')
        if lane.note:
            out.append(
                f'<text class="lane-note" x="{X0 + 8:.1f}" y="{lane.y + LANE_PAD + 16:.1f}">'
                f"{escape(lane.note)}</text>"
            )
        for band in lay.bands:
            if band.rank == lane.rank:
                states = ", ".join(f"{count:,} {state}" for state, count in band.states)
                out.append(
                    f'<g class="elided" data-rank="{band.rank}" data-count="{band.count}">'
                    f'<rect x="{band.x:.1f}" y="{lane.y + 3:.1f}" width="{band.w:.1f}"'
                    f' height="{lane.height - 6:.1f}" rx="3"/>'
                    f'<text x="{band.x + 6:.1f}" y="{lane.y + lane.height / 2 + 4:.1f}">'
                    f"{band.count:,} not drawn</text>"
                    f"<title>{band.count:,} collectives of rank {band.rank} not drawn"
                    f" ({escape(states)}), from {band.start:.6f} s to {band.end:.6f} s</title></g>"
                )
        for track in lane.tracks:
            mid = track.y + TRACK_H / 2
            out.append(
                f'<g class="track" data-rank="{lane.rank}" data-group="{escape(track.group)}">'
                f'<line class="track-line" x1="0" x2="{lay.width:.1f}" y1="{mid:.1f}"'
                f' y2="{mid:.1f}"/>'
            )
            for i, box in by_track.get((lane.rank, track.group), []):
                out.append(_box(i, box, keys, mark, odd))
            out.append("</g>")
        out.append("</g>")
    for x, y, count in lay.more:
        out.append(
            f'<text class="more" x="{x:.1f}" y="{y + 16:.1f}">+{count:,} more not reached</text>'
        )
    return "".join(out)


def _odd(lay: Layout, mark: tuple[str, int] | None) -> set[tuple[int, str, int]]:
    """The marked collective's boxes whose call differs from most of its ranks' calls."""
    calls = [b.span for b in lay.boxes if b.span.key == mark and b.span.state != NEVER_REACHED]
    counts = Counter(s.text for s in calls)
    if len(counts) < 2:
        return set()
    usual = counts.most_common(1)[0][0]
    return {(s.rank, s.group, s.seq) for s in calls if s.text != usual}


def _box(
    i: int,
    box: Box,
    keys: dict[tuple[str, int], int],
    mark: tuple[str, int] | None,
    odd: set[tuple[int, str, int]],
) -> str:
    """One collective's box and label (``odd``: the marked boxes whose call differs)."""
    span = box.span
    state = span.state if span.state in STATES else "other"
    classes = f"box s-{state.replace(' ', '-')}" + (" marked" if span.key == mark else "")
    differs = " odd" if (span.rank, span.group, span.seq) in odd else ""
    classes += " placed" if box.placed else ""
    y = box.y + (TRACK_H - BOX_H) / 2
    text = _label(box)
    label = (
        f'<text class="bl{" placed" if box.placed else ""}{differs}" x="{box.x + 4:.1f}"'
        f' y="{y + 12:.1f}">{escape(text)}</text>'
        if text
        else ""
    )
    return (
        f'<rect class="{classes}" data-i="{i}" data-k="{keys[span.key]}" data-rank="{span.rank}"'
        f' data-group="{escape(span.group)}" data-seq="{span.seq}"'
        f' data-state="{escape(span.state)}" x="{box.x:.1f}" y="{y:.1f}" width="{box.w:.1f}"'
        f' height="{BOX_H:.0f}" rx="2.5"/>{label}'
    )


def _mark(timeline: Timeline, lay: Layout, names: dict[str, str]) -> str:
    """The flag over the marked collective and the line down through its boxes."""
    if timeline.mark is None:
        return ""
    group, seq = timeline.mark
    boxes = sorted((b for b in lay.boxes if b.span.key == timeline.mark), key=lambda b: b.y)
    text = f"{timeline.mark_kind.upper() or 'MARK'}  {what_is_marked(timeline, names)}"
    full = text
    if len(text) > FLAG_CHARS:  # the whole text is in the header and the flag's tooltip
        text = text[: FLAG_CHARS - 1] + "…"
    flag_w = len(text) * 7.0 + 16
    x = min((b.x for b in boxes), default=X0)
    flag_x = max(4.0, min(x - 2, lay.width - flag_w - 8))
    points = [f"{x:.1f},{AXIS_TOP - 4:.1f}"] + [
        f"{b.x + 1:.1f},{b.y + TRACK_H / 2:.1f}" for b in boxes
    ]
    return (
        f'<g id="mark" class="mark" data-kind="{escape(timeline.mark_kind)}"'
        f' data-group="{escape(group)}" data-seq="{seq}" data-x="{x:.1f}">'
        f'<polyline class="mark-join" points="{" ".join(points)}"/>'
        f'<rect class="flag" x="{flag_x:.1f}" y="4" width="{flag_w:.1f}" height="22" rx="4"/>'
        f'<text class="flag-text" x="{flag_x + 8:.1f}" y="19.5">{escape(text)}'
        f"<title>{escape(full)}</title></text></g>"
    )
