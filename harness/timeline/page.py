"""The picture of a call's collectives (``timeline.html``): :func:`render` writes one
self-contained HTML page (inline style, SVG and script; nothing fetched) from a
:class:`~harness.timeline.model.Timeline`.

The page shows the failure line, the test, world size and backend, the marked collective and
the legend; then the plot (:mod:`harness.timeline.plot`): each rank as a lane on one time axis,
a track per process group, a box per collective. Long idle stretches are drawn shortened and a
huge trace is windowed (see :mod:`harness.timeline.layout`; the page says so where it
happened).

Its style and script are this package's ``page.css`` and ``page.js``, written into the page.
The script reads the drawn collectives' details from the page's JSON block; on hover it
lights every box of the same collective (its group and number) across the ranks, joins them
with a line and shows them in the details panel (a click keeps them there, Escape lets go);
its buttons stretch or shrink the time axis; on load it scrolls the marked collective into
view and shows its details.
"""

from __future__ import annotations

import functools
import json
from html import escape
from importlib import resources

from harness.timeline.layout import Layout, layout
from harness.timeline.model import Timeline
from harness.timeline.plot import labels, plot, what_is_marked

COLOURS = {
    "completed": ("#a9d8b8", "#3f8f5a"),
    "in flight": ("#f7b955", "#b87510"),
    "issued": ("#a8c8ee", "#3d74b0"),
    "raised": ("#ef8a7e", "#b2392b"),
    "never reached": ("#ffffff", "#8a8a8a"),
}
"""Each state's fill and outline."""
MARK_COLOUR = "#8e24aa"
"""The mark's colour: its outline, flag and line."""
TOOLS = (
    '<div class="tools" id="tools">time axis: <button type="button" data-zoom="fit">fit'
    ' the window</button><button type="button" data-zoom="out">&minus;</button>'
    '<button type="button" data-zoom="in">+</button><button type="button" data-zoom="1">'
    "as drawn</button></div>"
)
"""The zoom buttons over the plot (they stretch the time axis; the text keeps its size)."""
_STATES_HERE = "/* the states' rules (.s-<state>, .legend i.sw-<state>), from page.py's COLOURS */"
"""The comment of ``page.css`` that each state's rules, made from :data:`COLOURS`, replace."""


def _asset(name: str) -> str:
    """The text of one of this package's data files (``page.css``, ``page.js``)."""
    return resources.files("harness.timeline").joinpath(name).read_text(encoding="utf-8")


@functools.cache
def _style() -> str:
    """The page's style sheet: the mark's colour, then ``page.css`` with the states' rules
    (from a line of its own in the page's source)."""
    states = "\n".join(
        f".s-{name.replace(' ', '-')} {{ fill: {fill}; stroke: {line}; }}\n"
        f".legend i.sw-{name.replace(' ', '-')} {{ background: {fill}; border-color: {line}; }}"
        for name, (fill, line) in COLOURS.items()
    )
    css = _asset("page.css").replace(_STATES_HERE, states)
    return f"\n:root {{ --mark: {MARK_COLOUR}; }}\n{css}"


@functools.cache
def _script() -> str:
    """The page's script: ``page.js`` (from a line of its own in the page's source)."""
    return "\n" + _asset("page.js")


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
            f" {escape(what_is_marked(timeline, names))}"
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
    title = f"timeline: {timeline.test}"
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{escape(title)}</title><style>{_style()}</style></head><body>"
        f'{_header(timeline, lay, names)}{TOOLS}<div class="chart">{labels(lay, names)}'
        f'<div class="scroll" id="scroll">{plot(timeline, lay, names)}</div></div>'
        '<section class="details" id="details" aria-live="polite"></section>'
        f'<script type="application/json" id="timeline-data">{_data(timeline, lay, names)}'
        f"</script><script>{_script()}</script></body></html>\n"
    )
