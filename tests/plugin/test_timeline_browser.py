"""``timeline.html`` as a person sees it: the pages ``--dist-trace-dir`` writes for a real
4-rank, 2-group mismatch and hang, opened in headless Chromium. The screenshot holds a picture
(many colours, the states' and the mark's among them) and the page's DOM after its script ran
holds the 4 lanes, a box for each collective, the marked one and its details; the page of a
100,000-collective call opens too. Skipped, naming what is missing, where no Chromium or Chrome
is installed."""

from __future__ import annotations

import shutil
import struct
import subprocess
import zlib
from html.parser import HTMLParser
from pathlib import Path

import pytest

from harness.controller.verdicts import HANG
from harness.protocol.traces import COMPLETED
from harness.timeline.folder import folder_name
from harness.timeline.model import Group, Span, Timeline
from harness.timeline.page import COLOURS, MARK_COLOUR, render

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
WINDOW = (1400, 900)

BODY = """
import pytest
import torch
import torch.distributed as dist


def step(rank, evens):
    x = torch.ones(4)
    dist.all_reduce(x)
    if rank in (0, 2):
        dist.all_reduce(x, group=evens)
    dist.broadcast(x, src=0)
    return x


@pytest.mark.distributed(world_size=4, backend="gloo")
def test_mismatch(rank):
    x = step(rank, dist.new_group([0, 2]))
    dist.all_reduce(x, op=dist.ReduceOp.MAX if rank == 3 else dist.ReduceOp.SUM)


@pytest.mark.distributed(world_size=4, backend="gloo", timeout=60)
def test_hang(rank):
    x = step(rank, dist.new_group([0, 2]))
    if rank == 3:
        return
    dist.all_reduce(x)
"""


@pytest.fixture(scope="module")
def browser() -> str:
    """A Chromium or Chrome to run headless."""
    for name in BROWSERS:
        path = shutil.which(name)
        if path is not None:
            return path
    pytest.skip(
        f"no headless browser: none of {', '.join(BROWSERS)} is on PATH"
        " (Debian and Ubuntu: apt-get install chromium)"
    )


def open_page(browser: str, page: Path, profile: Path, *args: str) -> str:
    """Run ``browser`` headless on ``page`` with ``args``; its standard output."""
    result = subprocess.run(
        [
            browser,
            "--headless",
            "--no-sandbox",  # as root (a CI container) Chromium runs only without it
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
            f"--user-data-dir={profile}",
            f"--window-size={WINDOW[0]},{WINDOW[1]}",
            *args,
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,  # a guard against a browser that never returns, not a time limit
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def png_pixels(data: bytes) -> tuple[int, int, set[tuple[int, ...]]]:
    """A PNG's width, height and every colour (RGB) in it; an 8-bit RGB(A) image only."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", data[:8]
    pos, idat, header = 8, b"", b""
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos : pos + 8])
        if kind == b"IHDR":
            header = data[pos + 8 : pos + 8 + length]
        elif kind == b"IDAT":
            idat += data[pos + 8 : pos + 8 + length]
        pos += 12 + length
    width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", header)
    assert (depth, interlace) == (8, 0), (depth, interlace)
    assert colour in (2, 6), colour  # RGB or RGBA
    bpp = 3 if colour == 2 else 4
    raw = zlib.decompress(idat)
    stride = width * bpp
    previous = bytearray(stride)
    colours: set[tuple[int, ...]] = set()
    for y in range(height):
        start = y * (stride + 1)
        kind, line = raw[start], bytearray(raw[start + 1 : start + 1 + stride])
        if kind == 1:
            for i in range(bpp, stride):
                line[i] = (line[i] + line[i - bpp]) & 0xFF
        elif kind == 2:
            line = bytearray((a + b) & 0xFF for a, b in zip(line, previous, strict=True))
        elif kind == 3:
            for i in range(stride):
                left = line[i - bpp] if i >= bpp else 0
                line[i] = (line[i] + (left + previous[i]) // 2) & 0xFF
        elif kind == 4:
            for i in range(stride):
                a = line[i - bpp] if i >= bpp else 0
                b, c = previous[i], previous[i - bpp] if i >= bpp else 0
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 0xFF
        else:
            assert kind == 0, kind
        colours.update(tuple(line[i : i + 3]) for i in range(0, stride, bpp))
        previous = line
    return width, height, colours


def rgb(hex_colour: str) -> tuple[int, ...]:
    return tuple(int(hex_colour[i : i + 2], 16) for i in (1, 3, 5))


class Elements(HTMLParser):
    """Every element's tag and attributes, in document order."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[tuple[str, dict[str, str]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.found.append((tag, {k: v or "" for k, v in attrs}))

    def with_class(self, name: str) -> list[dict[str, str]]:
        return [a for _, a in self.found if name in a.get("class", "").split()]


def test_the_timelines_of_a_mismatch_and_a_hang_open_in_a_browser(
    browser: str, pytester: pytest.Pytester, tmp_path: Path
) -> None:
    pytester.makepyfile(test_model=BODY)
    out = tmp_path / "traces"
    result = pytester.runpytest("-p", "no:randomly", f"--dist-trace-dir={out}")
    result.assert_outcomes(failed=2)
    for test, kind, in_mark in [
        ("test_mismatch", "mismatch", {"completed"}),
        ("test_hang", "hang", {"in flight", "never reached"}),
    ]:
        page = out / folder_name(f"test_model.py::{test}") / "timeline.html"
        shot = tmp_path / f"{test}.png"
        open_page(browser, page, tmp_path / f"profile-{test}-1", f"--screenshot={shot}")
        width, height, colours = png_pixels(shot.read_bytes())
        assert (width, height) == WINDOW
        assert len(colours) > 20, f"{test}: a blank page? {len(colours)} colours"
        expected = {rgb(MARK_COLOUR), rgb(COLOURS["completed"][0]), rgb("#ffebe9")}
        if kind == "hang":
            expected.add(rgb("#f7b955"))  # the in-flight stripes
        assert expected <= colours, f"{test}: missing {expected - colours}"

        dom = open_page(browser, page, tmp_path / f"profile-{test}-2", "--dump-dom")
        elements = Elements()
        elements.feed(dom)
        assert [lane["data-rank"] for lane in elements.with_class("lane")] == ["0", "1", "2", "3"]
        boxes = elements.with_class("box")
        per_rank = [sum(b["data-rank"] == str(r) for b in boxes) for r in range(4)]
        assert per_rank == [4, 3, 4, 3], per_rank  # 3 on the default group, 1 on ranks 0, 2
        assert len({b["data-group"] for b in boxes}) == 2
        marked = elements.with_class("marked")
        assert sorted(b["data-rank"] for b in marked) == ["0", "1", "2", "3"]
        assert {(b["data-group"], b["data-seq"]) for b in marked} == {("", "3")}
        assert {b["data-state"] for b in marked} == in_mark
        (mark,) = [a for _, a in elements.found if a.get("id") == "mark"]
        assert (mark["data-kind"], mark["data-seq"]) == (kind, "3")
        # The script ran: the details panel shows the marked collective on every rank.
        details = dom.split('id="details"', 1)[1].split("</section>", 1)[0]
        assert "#3 on the default group" in details
        assert details.count("all_reduce(") >= 4
        if kind == "mismatch":
            assert "all_reduce(MAX, float32[4])" in details


def test_a_hundred_thousand_collectives_open_in_a_browser(browser: str, tmp_path: Path) -> None:
    ranks, per_rank = 8, 12_500
    group = Group("", "the default group", tuple(range(ranks)))
    spans = tuple(
        Span(
            *(rank, "", seq, "all_reduce", "all_reduce(SUM, float32[4])", ((4,),), "float32"),
            *("SUM", f"test_x.py:{seq}", seq * 1e-3, seq * 1e-3 + 5e-4, COMPLETED),
        )
        for rank in range(ranks)
        for seq in range(1, per_rank + 1)
    )
    timeline = Timeline(
        test="test_x.py::test_many",
        failure="hang",
        world_size=ranks,
        backend="gloo",
        groups=(group,),
        spans=spans,
        mark=("", per_rank // 2),
        mark_kind=HANG,
        mark_text="ranks wait",
        duration=per_rank * 1e-3 + 1,
    )
    page = tmp_path / "timeline.html"
    page.write_text(render(timeline), encoding="utf-8")
    dom = open_page(browser, page, tmp_path / "profile", "--dump-dom")
    elements = Elements()
    elements.feed(dom)
    assert len(elements.with_class("lane")) == ranks
    bands = elements.with_class("elided")
    drawn = len(elements.with_class("box"))
    assert drawn + sum(int(b["data-count"]) for b in bands) == ranks * per_rank
    assert len(elements.with_class("marked")) == ranks
    assert f"#{per_rank // 2} on the default group" in dom.split('id="details"', 1)[1]
