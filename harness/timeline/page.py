"""The picture of a call's collectives (``timeline.html``): :func:`render` writes one
self-contained HTML page (inline style, SVG and script; nothing fetched) from a
:class:`~harness.timeline.model.Timeline`.

The page shows the failure line, the test, world size and backend; then each rank as a lane on
one time axis, each process group it used as a track, each collective as a box coloured by its
state (see the legend), a collective its rank never reached as a dashed placeholder, and the
marked collective (the first mismatch, or where a rank hangs) outlined, flagged with what is
wrong there and scrolled into view. Hovering over a box lights the same collective on every rank
and lists it in the details panel. Long idle stretches are drawn shortened and a huge trace is
windowed (see :mod:`harness.timeline.layout`; the page says so where it happened).

The page's elements a test can find: ``.lane[data-rank]``, ``.track[data-rank][data-group]``,
``.box[data-rank][data-group][data-seq][data-state]`` (``.marked`` on the marked collective's
boxes), ``.elided[data-rank][data-count]`` and ``#mark[data-kind][data-group][data-seq]``.
"""

from __future__ import annotations

import json
from collections import Counter
from html import escape

from harness.timeline.axis import X0
from harness.timeline.layout import (
    AXIS_H,
    AXIS_TOP,
    BOX_H,
    LANE_PAD,
    TRACK_H,
    Box,
    Layout,
    layout,
)
from harness.timeline.look import COLOURS, DEFS, SCRIPT, style
from harness.timeline.model import NEVER_REACHED, STATES, Timeline

TOOLS = (
    '<div class="tools" id="tools">time axis: <button type="button" data-zoom="fit">fit'
    ' the window</button><button type="button" data-zoom="out">&minus;</button>'
    '<button type="button" data-zoom="in">+</button><button type="button" data-zoom="1">'
    "as drawn</button></div>"
)
"""The zoom buttons over the plot (they stretch the time axis; the text keeps its size)."""
FLAG_CHARS = 110
"""The most characters of the flag over the marked collective."""
CHAR_W = 6.2
"""Roughly how wide one character of a box's label is, in pixels (to leave out what would
not fit)."""


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


def _labels(lay: Layout, names: dict[str, str], width: float) -> str:
    """The column that names each lane's rank and each track's group."""
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
    odd = _odd(lay, mark)
    """Each rank's lane: its tracks, boxes, summarised bands and notes."""
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


def _what_is_marked(timeline: Timeline, names: dict[str, str]) -> str:
    """Which collective is marked and what is wrong there (its text names it, or is
    preceded by its name)."""
    assert timeline.mark is not None
    group, seq = timeline.mark
    where = f"#{seq} on {names.get(group, f'group {group!r}')}"
    return timeline.mark_text if where in timeline.mark_text else f"{where}: {timeline.mark_text}"


def _mark(timeline: Timeline, lay: Layout, names: dict[str, str]) -> str:
    """The flag over the marked collective and the line down through its boxes."""
    if timeline.mark is None:
        return ""
    group, seq = timeline.mark
    boxes = sorted((b for b in lay.boxes if b.span.key == timeline.mark), key=lambda b: b.y)
    text = f"{timeline.mark_kind.upper() or 'MARK'}  {_what_is_marked(timeline, names)}"
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


def _header(timeline: Timeline, lay: Layout, names: dict[str, str]) -> str:
    """The failure line, what ran, the mark, the legend and how to read the axis."""
    n_groups = len({track.group for lane in lay.lanes for track in lane.tracks})
    failure = timeline.failure or "passed: no failure"
    out = [
        f'<header><h1><span class="what">timeline</span>{escape(timeline.test)}</h1>'
        f'<p class="failure{"" if timeline.failure else " passed"}" id="failure">'
        f"{escape(failure)}</p>"
        f'<p class="meta" id="meta">{timeline.world_size} ranks · backend'
        f" {escape(timeline.backend)} · {n_groups} process group{'s' * (n_groups != 1)} ·"
        f" {len(timeline.spans):,} collectives · {timeline.duration:.3f} s traced</p>"
    ]
    if timeline.mark is not None:
        out.append(
            f'<p class="mark-note" id="mark-note"><b>{escape(timeline.mark_kind.upper())}</b>'
            f" {escape(_what_is_marked(timeline, names))}"
            '<button type="button" id="to-mark">show it</button></p>'
        )
    legend = "".join(
        f'<span><i class="sw-{state.replace(" ", "-")}"></i>{state}</span>' for state in COLOURS
    )
    out.append(
        f'<div class="legend">{legend}<span><i class="sw-marked"></i>marked</span>'
        '<span><i class="sw-gap"></i>idle stretch, shortened</span>'
    )
    if lay.bands:
        out.append('<span><i class="sw-band"></i>collectives not drawn</span>')
    out.append(
        '</div><p class="note">Time runs left to right in seconds since the call\'s start,'
        " one axis for every rank; a hatched stretch with no collective starting or ending"
        " in it is drawn shortened, labelled with its length; the dotted line at the right"
        " is when the traces were taken. Hover over a box to light the"
        " same collective on every rank; click to keep it.</p>"
    )
    if lay.bands:
        drawn = sum(not b.placed for b in lay.boxes)
        out.append(
            f'<p class="note" id="windowed">This call has {len(timeline.spans):,} collectives,'
            f" too many to draw each: {drawn:,} are (each rank's first and last, and those"
            f" around the marked one, at most {lay.kept:,} a rank); each run of the others is"
            " one grey band labelled with its count (trace.json, where written next to this"
            " file, holds every one).</p>"
        )
    out.append("</header>")
    return "".join(out)


def _data(timeline: Timeline, lay: Layout, names: dict[str, str]) -> str:
    """The drawn collectives' details for the script, as JSON safe inside ``<script>``."""
    index = {gid: i for i, gid in enumerate(names)}
    spans = [
        [
            s.rank,
            index[s.group],
            s.seq,
            s.op,
            s.text,
            ", ".join("[" + ", ".join(map(str, shape)) + "]" for shape in s.shapes),
            s.dtype,
            s.reduce_op,
            s.site,
            None if s.start is None else round(s.start, 6),
            None if s.end is None else round(s.end, 6),
            s.state,
        ]
        for s in (box.span for box in lay.boxes)
    ]
    text = json.dumps({"groups": [[g, n] for g, n in names.items()], "spans": spans})
    # No "</script>" (or other markup) can end the block early: JSON may spell any of them so.
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def render(timeline: Timeline) -> str:
    """The timeline picture of ``timeline``, a whole HTML page.

    Args:
        timeline: A call's collectives across its ranks.

    Returns:
        The page's text: it needs no other file and fetches nothing.
    """
    lay = layout(timeline)
    names = {group.id: group.name for group in timeline.groups}
    keys: dict[tuple[str, int], int] = {}
    for box in lay.boxes:
        keys.setdefault(box.span.key, len(keys))
    longest = max((len(names[t.group]) for lane in lay.lanes for t in lane.tracks), default=0)
    label_w = min(360.0, max(190.0, 86 + longest * CHAR_W))
    plot = (
        f'<svg id="plot" class="plot" width="{lay.width:.0f}" height="{lay.height:.0f}"'
        f' viewBox="0 0 {lay.width:.0f} {lay.height:.0f}" role="img"'
        f' aria-label="collectives of each rank over time">{DEFS}'
        f"{_axis(lay)}{_lanes(lay, keys, timeline.mark)}{_mark(timeline, lay, names)}"
        '<polyline id="join" class="join" points=""/></svg>'
    )
    title = f"timeline: {timeline.test}"
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{escape(title)}</title><style>{style()}</style></head><body>"
        f'{_header(timeline, lay, names)}{TOOLS}<div class="chart">{_labels(lay, names, label_w)}'
        f'<div class="scroll" id="scroll">{plot}</div></div>'
        '<section class="details" id="details" aria-live="polite"></section>'
        f'<script type="application/json" id="timeline-data">{_data(timeline, lay, names)}'
        f"</script><script>{SCRIPT}</script></body></html>\n"
    )
