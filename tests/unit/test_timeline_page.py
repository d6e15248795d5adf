"""The timeline picture (``timeline.html``) read as a parser reads it: its lanes, tracks and
boxes, the mark, escaping, nothing fetched from outside, and a bounded size however big the
trace."""

from __future__ import annotations

import dataclasses
import itertools
import json
import re
from html.parser import HTMLParser

import pytest
from timeline_samples import DEFAULT, EVENS, big, hang, mismatch, span

from harness.controller.verdicts import HANG, MISMATCH
from harness.protocol.traces import COMPLETED, IN_FLIGHT, RAISED
from harness.timeline.layout import MAX_BOXES, PLACEHOLDERS
from harness.timeline.model import NEVER_REACHED, STATES, Group, Timeline
from harness.timeline.page import render

VOID = {"meta", "br", "img", "input", "link", "hr"}


@dataclasses.dataclass
class Node:
    """One element of the page: its tag, attributes, children and own text."""

    tag: str
    attrs: dict[str, str]
    children: list[Node] = dataclasses.field(default_factory=list)
    text: str = ""

    def walk(self) -> list[Node]:
        """This element and every one inside it, in document order."""
        found = [self]
        for child in self.children:
            found += child.walk()
        return found

    def all_text(self) -> str:
        """Its text and its descendants', joined."""
        return self.text + "".join(child.all_text() for child in self.children)

    def classes(self) -> set[str]:
        return set(self.attrs.get("class", "").split())

    def find(self, cls: str) -> list[Node]:
        """The elements inside (or this one) with class ``cls``."""
        return [n for n in self.walk() if cls in n.classes()]

    def by_id(self, ident: str) -> list[Node]:
        return [n for n in self.walk() if n.attrs.get("id") == ident]


class _Tree(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.root = Node("#document", {})
        self.stack = [self.root]

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        node = Node(tag, {k: v or "" for k, v in attrs})
        self.stack[-1].children.append(node)
        if tag not in VOID:
            self.stack.append(node)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.stack[-1].children.append(Node(tag, {k: v or "" for k, v in attrs}))

    def handle_endtag(self, tag: str) -> None:
        if tag in VOID:
            return
        assert self.stack[-1].tag == tag, f"</{tag}> closes <{self.stack[-1].tag}>"
        self.stack.pop()

    def handle_data(self, data: str) -> None:
        self.stack[-1].text += data


def parse(page: str) -> Node:
    """The page's element tree; every element it opens it closes."""
    tree = _Tree()
    tree.feed(page)
    tree.close()
    assert tree.stack == [tree.root], [n.tag for n in tree.stack]
    return tree.root


def _boxes(page: Node) -> list[Node]:
    return page.find("box")


def _right(box: Node) -> float:
    return float(box.attrs["x"]) + float(box.attrs["width"])


@pytest.mark.parametrize("sample", [mismatch, hang], ids=["mismatch", "hang"])
def test_each_rank_is_a_lane_each_group_a_track_each_span_a_box(sample) -> None:
    timeline = sample()
    page = parse(render(timeline))
    lanes = page.find("lane")
    assert [lane.attrs["data-rank"] for lane in lanes] == ["0", "1", "2", "3"]
    for lane in lanes:
        rank = int(lane.attrs["data-rank"])
        tracks = lane.find("track")
        expected = [g.id for g in (DEFAULT, EVENS) if rank in g.ranks]
        assert [t.attrs["data-group"] for t in tracks] == expected
        for track in tracks:
            for box in track.find("box"):
                assert box.attrs["data-rank"] == str(rank)
                assert box.attrs["data-group"] == track.attrs["data-group"]
    drawn = sorted(
        (
            int(b.attrs["data-rank"]),
            b.attrs["data-group"],
            int(b.attrs["data-seq"]),
            b.attrs["data-state"],
        )
        for b in _boxes(page)
    )
    assert drawn == sorted((s.rank, s.group, s.seq, s.state) for s in timeline.spans)
    labels = [n.text for n in page.find("group-label")]
    lanes_groups = ["the default group", "the group of ranks 0, 2", "the default group"]
    assert labels == lanes_groups * 2


@pytest.mark.parametrize("sample", [mismatch, hang], ids=["mismatch", "hang"])
def test_the_failure_line_test_world_and_backend_are_at_the_top(sample) -> None:
    timeline = sample()
    page = parse(render(timeline))
    header = next(n for n in page.walk() if n.tag == "header")
    assert header.by_id("failure")[0].all_text() == timeline.failure
    assert timeline.test in header.all_text()
    meta = header.by_id("meta")[0].all_text()
    assert "4 ranks" in meta
    assert "gloo" in meta
    assert "2 process groups" in meta
    legend = header.find("legend")[0].all_text()
    for state in STATES:
        assert state in legend


@pytest.mark.parametrize(
    ("sample", "kind"), [(mismatch, MISMATCH), (hang, HANG)], ids=["mismatch", "hang"]
)
def test_the_marked_collective_is_outlined_and_flagged(sample, kind) -> None:
    timeline = sample()
    page = parse(render(timeline))
    (mark,) = page.by_id("mark")
    assert mark.attrs["data-kind"] == kind
    assert (mark.attrs["data-group"], int(mark.attrs["data-seq"])) == timeline.mark
    assert timeline.mark_text in mark.all_text()
    assert kind.upper() in mark.all_text()
    marked = {int(b.attrs["data-rank"]) for b in page.find("marked")}
    assert marked == {s.rank for s in timeline.spans if s.key == timeline.mark}
    assert marked == {0, 1, 2, 3}
    assert timeline.mark_text in page.by_id("mark-note")[0].all_text()


def test_the_call_that_differs_is_picked_out_in_a_mismatch() -> None:
    page = parse(render(mismatch()))
    labels = [n for n in page.walk() if n.tag == "text" and "odd" in n.classes()]
    assert [n.all_text() for n in labels] == ["#3 all_gather"]


def test_no_mark_no_flag() -> None:
    page = parse(render(big(2, 5)))
    assert page.by_id("mark") == []
    assert page.find("marked") == []
    assert "passed" in page.by_id("failure")[0].classes()


def test_in_flight_boxes_reach_the_end_of_the_trace() -> None:
    page = parse(render(hang()))
    boxes = _boxes(page)
    in_flight = [b for b in boxes if b.attrs["data-state"] == IN_FLIGHT]
    assert len(in_flight) == 3
    ends = {round(_right(b), 1) for b in in_flight}
    assert len(ends) == 1, ends
    completed = [b for b in boxes if b.attrs["data-state"] == COMPLETED]
    assert max(_right(b) for b in completed) < ends.pop()


def test_never_reached_ones_follow_the_ranks_last_box_on_their_group_in_order() -> None:
    spans = [span(0, DEFAULT, 1), span(1, DEFAULT, 1)]
    spans += [span(1, DEFAULT, seq, state=NEVER_REACHED) for seq in (2, 3, 4)]
    spans += [span(0, DEFAULT, seq) for seq in (2, 3, 4)]
    timeline = Timeline("t", "hang", 2, "gloo", (Group("", "the default group", (0, 1)),), ())
    timeline = dataclasses.replace(timeline, spans=tuple(spans), duration=0.1)
    boxes = [b for b in _boxes(parse(render(timeline))) if b.attrs["data-rank"] == "1"]
    first, *placed = boxes
    assert [b.attrs["data-seq"] for b in placed] == ["2", "3", "4"]
    assert all(b.attrs["data-state"] == NEVER_REACHED for b in placed)
    lefts = [float(b.attrs["x"]) for b in placed]
    assert lefts[0] >= _right(first)
    assert all(_right(a) <= float(b.attrs["x"]) for a, b in itertools.pairwise(placed))
    assert lefts == sorted(lefts)


def test_a_track_draws_its_first_placeholders_and_counts_the_rest() -> None:
    group = Group("", "the default group", (0, 1))
    spans = [span(0, group, seq) for seq in range(1, 31)]
    spans += [span(1, group, 1)] + [span(1, group, s, state=NEVER_REACHED) for s in range(2, 31)]
    timeline = Timeline("t", "hang", 2, "gloo", (group,), tuple(spans), duration=0.4)
    page = parse(render(timeline))
    placed = [b for b in _boxes(page) if b.attrs["data-state"] == NEVER_REACHED]
    assert [int(b.attrs["data-seq"]) for b in placed] == list(range(2, 2 + PLACEHOLDERS))
    (more,) = page.find("more")
    assert more.all_text() == f"+{29 - PLACEHOLDERS} more not reached"


def test_a_rank_without_a_trace_and_one_without_collectives_say_so() -> None:
    timeline = dataclasses.replace(
        mismatch(), world_size=6, ranks_unknown=(5,), spans=mismatch().spans
    )
    page = parse(render(timeline))
    lanes = {lane.attrs["data-rank"]: lane for lane in page.find("lane")}
    assert sorted(lanes) == ["0", "1", "2", "3", "4", "5"]
    assert "no collectives" in lanes["4"].all_text()
    assert "no trace from this rank" in lanes["5"].all_text()


def test_an_empty_call_still_draws() -> None:
    empty = Timeline("t", "", 2, "gloo", (), ())
    page = parse(render(empty))
    assert len(page.find("lane")) == 2
    assert _boxes(page) == []


def test_a_timeline_lists_every_group_its_spans_are_on() -> None:
    odd = dataclasses.replace(span(0, DEFAULT, 1), group="7/x")
    with pytest.raises(
        ValueError, match=r"spans on groups \['7/x'\] that the timeline's groups \[''\] lack"
    ):
        Timeline("t", "x", 1, "gloo", (DEFAULT,), (odd,))


def test_a_long_wait_is_drawn_as_a_short_labelled_gap() -> None:
    timeline = dataclasses.replace(hang(), duration=600.0)
    page = parse(render(timeline))
    (gap,) = page.find("gap")
    assert float(gap.attrs["data-seconds"]) == pytest.approx(600 - 0.032, abs=1e-3)
    assert "+600 s" in [n.all_text() for n in page.find("gap-label")]
    assert float(gap.attrs["width"]) < 100
    (plot,) = page.by_id("plot")
    assert float(plot.attrs["width"]) < 3000


def test_every_state_has_its_own_class_and_colour() -> None:
    spans = [
        span(0, DEFAULT, 1),
        span(0, DEFAULT, 2, state=RAISED),
        dataclasses.replace(span(0, DEFAULT, 3, state=IN_FLIGHT), state="issued"),
        span(0, DEFAULT, 4, state=IN_FLIGHT),
        span(0, DEFAULT, 5, state=NEVER_REACHED),
    ]
    page = render(Timeline("t", "x", 1, "gloo", (DEFAULT,), tuple(spans), duration=0.1))
    states = {b.attrs["data-state"]: b.classes() for b in _boxes(parse(page))}
    assert set(states) == set(STATES)
    for state, classes in states.items():
        slug = "s-" + state.replace(" ", "-")
        assert slug in classes
        assert re.search(rf"\.{slug} \{{ fill: #[0-9a-f]{{6}}; stroke: #[0-9a-f]{{6}}; \}}", page)


def test_text_from_the_test_is_escaped_everywhere() -> None:
    nasty = '<script>alert("x")</script> & ü \' "'
    group = Group('0,1/"g"<&>', f"the group {nasty}", (0, 1))
    spans = tuple(
        dataclasses.replace(span(rank, group, 1), text=f"all_reduce({nasty})", site=f"{nasty}.py:3")
        for rank in (0, 1)
    )
    timeline = Timeline(
        test=f"tests/test_x.py::test[{nasty}]",
        failure=f"rank 1 raised ValueError: {nasty}",
        world_size=2,
        backend="gloo",
        groups=(group,),
        spans=spans,
        mark=(group.id, 1),
        mark_kind=MISMATCH,
        mark_text=f"rank 1 called {nasty}",
        duration=0.1,
    )
    text = render(timeline)
    assert "<script>alert" not in text
    assert text.count("<script") == 2  # the data block and the page's own script
    page = parse(text)
    assert page.by_id("failure")[0].all_text() == timeline.failure
    assert timeline.test in next(n for n in page.walk() if n.tag == "h1").all_text()
    assert timeline.mark_text in page.by_id("mark")[0].all_text()
    assert {b.attrs["data-group"] for b in _boxes(page)} == {group.id}
    assert page.by_id("mark")[0].attrs["data-group"] == group.id
    data = json.loads(page.by_id("timeline-data")[0].all_text())
    assert data["groups"] == [[group.id, group.name]]
    assert {s[4] for s in data["spans"]} == {f"all_reduce({nasty})"}


@pytest.mark.parametrize("sample", [mismatch, hang, big], ids=["mismatch", "hang", "big"])
def test_nothing_is_fetched_from_outside(sample) -> None:
    text = render(sample())
    assert "http://" not in text
    assert "https://" not in text
    assert "@import" not in text
    assert re.findall(r"url\((?!#)", text) == []
    for node in parse(text).walk():
        assert node.tag not in ("link", "img", "iframe", "object", "embed"), node
        for name in ("src", "href", "xlink:href", "action", "srcset"):
            value = node.attrs.get(name)
            assert value is None or value.startswith("#"), (node.tag, name, value)


def test_the_details_of_each_drawn_box_are_in_the_data_block() -> None:
    timeline = mismatch()
    page = parse(render(timeline))
    data = json.loads(page.by_id("timeline-data")[0].all_text())
    boxes = _boxes(page)
    assert len(data["spans"]) == len(boxes)
    by_key = {(s.rank, s.group, s.seq): s for s in timeline.spans}
    for box in boxes:
        rank, group, seq, op, text, shapes, dtype, reduce_op, site, start, end, state = data[
            "spans"
        ][int(box.attrs["data-i"])]
        expected = by_key[rank, data["groups"][group][0], seq]
        assert (box.attrs["data-rank"], box.attrs["data-seq"]) == (str(rank), str(seq))
        assert (op, text, dtype, reduce_op, site, state) == (
            expected.op,
            expected.text,
            expected.dtype,
            expected.reduce_op,
            expected.site,
            expected.state,
        )
        assert shapes == "[4]"
        assert (start, end) == pytest.approx((expected.start, expected.end))
    # One collective, one key, across the ranks that took part.
    keys = {(b.attrs["data-group"], b.attrs["data-seq"]): set() for b in boxes}
    for b in boxes:
        keys[b.attrs["data-group"], b.attrs["data-seq"]].add(b.attrs["data-k"])
    assert all(len(k) == 1 for k in keys.values())
    assert len({k.pop() for k in keys.values()}) == len(keys)


def test_eight_ranks_of_two_hundred_collectives_draw_every_box() -> None:
    timeline = big()
    text = render(timeline)
    page = parse(text)
    assert len(page.find("lane")) == 8
    assert len(_boxes(page)) == 1600
    assert page.find("elided") == []
    assert page.by_id("windowed") == []
    assert len(text) < 1_500_000
    labels = [n.all_text() for n in page.find("bl")]
    assert labels.count("#200") >= 1


@pytest.mark.parametrize("ranks", [1, 8, 64])
def test_a_hundred_thousand_collectives_are_windowed_and_stay_small(ranks: int) -> None:
    per_rank = 100_000 // ranks
    timeline = big(ranks, per_rank)
    middle = per_rank // 2
    timeline = dataclasses.replace(timeline, mark=("", middle), mark_kind=HANG, mark_text="x")
    text = render(timeline)
    assert len(text) < 3_000_000
    page = parse(text)
    boxes = _boxes(page)
    assert len(boxes) <= MAX_BOXES + ranks
    for lane in page.find("lane"):
        counted = sum(int(band.attrs["data-count"]) for band in lane.find("elided"))
        assert counted + len(lane.find("box")) == per_rank
        seqs = [int(b.attrs["data-seq"]) for b in lane.find("box")]
        assert 1 in seqs
        assert per_rank in seqs
        assert middle in seqs
    assert len(page.find("marked")) == ranks
    note = page.by_id("windowed")[0].all_text()
    assert f"{ranks * per_rank:,} collectives" in note
    assert "first and last" in note
    (plot,) = page.by_id("plot")
    assert float(plot.attrs["width"]) < 30_000


def test_gaps_side_by_side_become_one_and_ticks_read_seconds() -> None:
    group = Group("", "the default group", (0, 1))
    spans = [span(0, group, seq) for seq in (1, 2, 3)]  # 10 ms apart: the scale
    spans += [span(1, group, 1, start=2.0, end=2.0002), span(1, group, 2, start=4.0, end=4.004)]
    timeline = Timeline("t", "", 2, "gloo", (group,), tuple(spans), duration=4.01)
    page = parse(render(timeline))
    (gap,) = page.find("gap")  # 0.035 s to 4.0 s, the instant at 2.0 s inside it
    assert float(gap.attrs["data-seconds"]) == pytest.approx(4.0 - 0.035, abs=1e-3)
    ticks = [n.all_text() for n in page.find("tick")]
    assert ticks[0] == "0.000 s"
    assert all(t.endswith(" s") for t in ticks)
    values = [float(t.removesuffix(" s")) for t in ticks]
    assert values == sorted(values)
    assert values[-1] > 4.0
