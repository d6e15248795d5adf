"""The style and the script of the timeline picture (``timeline.html``): inline text that
:mod:`harness.timeline.page` writes into the page, so the file needs nothing else.

The script reads the drawn collectives' details from the page's JSON block; on hover it
lights every box of the same collective (its group and number) across the ranks, joins them
with a line and shows them in the details panel (a click keeps them there, Escape lets go);
on load it scrolls the marked collective into view and shows its details.
"""

from __future__ import annotations

COLOURS = {
    "completed": ("#a9d8b8", "#3f8f5a"),
    "in flight": ("#f7b955", "#b87510"),
    "issued": ("#a8c8ee", "#3d74b0"),
    "raised": ("#ef8a7e", "#b2392b"),
    "never reached": ("#ffffff", "#8a8a8a"),
}
"""Each state's fill and outline."""
MARK_COLOUR = "#8e24aa"

STYLE = """
:root { --mark: %(mark)s; }
* { box-sizing: border-box; }
body { margin: 0; font: 13px/1.4 system-ui, -apple-system, "Segoe UI", "DejaVu Sans",
  "Liberation Sans", Arial, sans-serif; color: #1f2328; background: #fff; }
header { padding: 12px 18px 8px; border-bottom: 1px solid #d8dee4; background: #f6f8fa; }
h1 { font-size: 16px; margin: 0 0 6px; font-weight: 600; word-break: break-all; }
h1 .what { color: #656d76; font-weight: 400; margin-right: 6px; }
.failure { margin: 0 0 6px; padding: 6px 10px; border-left: 4px solid #cf222e;
  background: #ffebe9; font-family: ui-monospace, "DejaVu Sans Mono", monospace;
  font-size: 12.5px; white-space: pre-wrap; word-break: break-word; }
.failure.passed { border-color: #1a7f37; background: #dafbe1; }
.meta { margin: 0 0 6px; color: #424a53; }
.mark-note { margin: 0 0 6px; padding: 5px 10px; border-left: 4px solid var(--mark);
  background: #f6e9f8; font-size: 12.5px; }
.mark-note b { color: var(--mark); letter-spacing: .04em; }
.mark-note button { margin-left: 8px; font: inherit; font-size: 12px; cursor: pointer;
  border: 1px solid var(--mark); color: var(--mark); background: #fff; border-radius: 4px; }
.legend { display: flex; flex-wrap: wrap; gap: 4px 16px; margin: 4px 0; color: #424a53; }
.legend span { display: inline-flex; align-items: center; gap: 6px; }
.legend i { display: inline-block; width: 26px; height: 12px; border: 1.5px solid;
  border-radius: 2px; }
.legend i.sw-gap { border-style: dotted; border-color: #aab1b9;
  background: repeating-linear-gradient(135deg, #eef0f3 0 3px, #d5d9de 3px 5px); }
.legend i.sw-band { background: #e4e6ea; border-color: #a5abb3; }
.legend i.sw-marked { background: #fff; border: 3px solid var(--mark); }
.note { margin: 2px 0 0; color: #656d76; font-size: 12px; }
.chart { display: flex; border-bottom: 1px solid #d8dee4; }
.labels { flex: none; background: #fff; border-right: 1px solid #d8dee4; }
.scroll { overflow-x: auto; overflow-y: hidden; flex: 1 1 auto; }
svg text { font-family: system-ui, "DejaVu Sans", "Liberation Sans", Arial, sans-serif; }
.lane-bg.odd { fill: #f6f8fa; }
.lane-bg.even { fill: #ffffff; }
.lane-line { stroke: #d0d7de; }
.track-line { stroke: #eaeef2; }
.rank-label { font-size: 13px; font-weight: 600; fill: #1f2328; }
.group-label { font-size: 11.5px; fill: #57606a; }
.grid { stroke: #e6e9ed; }
.axis-line { stroke: #8c959f; }
.tick { font-size: 11px; fill: #424a53; }
.gap { fill: url(#p-gap); }
.gap-label { font-size: 10px; fill: #57606a; text-anchor: middle; }
.box { stroke-width: 1.2; cursor: pointer; }
.bl { font-size: 10.5px; fill: #1f2328; pointer-events: none; }
.bl.placed { fill: #6e7781; font-style: italic; }
.box.marked { stroke: var(--mark); stroke-width: 3; }
.bl.odd { fill: #b42318; font-weight: 700; }
.end-line { stroke: #57606a; stroke-width: 1; stroke-dasharray: 2 3; }
.hovering .box { opacity: .35; }
.hovering .box.hl { opacity: 1; stroke: #111; stroke-width: 2.2; }
.hovering .box.hl.marked { stroke: var(--mark); stroke-width: 3; }
.join { fill: none; stroke: #111; stroke-width: 1.5; stroke-dasharray: 4 3; pointer-events: none; }
.mark-join { fill: none; stroke: var(--mark); stroke-width: 2; stroke-dasharray: 6 3;
  pointer-events: none; }
.flag { fill: var(--mark); }
.flag-text { font-size: 12px; font-weight: 600; fill: #fff; }
.elided rect { fill: #e4e6ea; stroke: #a5abb3; stroke-dasharray: 3 2; }
.elided text, .more, .lane-note { font-size: 11px; fill: #57606a; font-style: italic; }
%(states)s
.details { position: sticky; bottom: 0; background: #fff; border-top: 2px solid #d0d7de;
  padding: 8px 18px 10px; box-shadow: 0 -2px 6px rgba(0,0,0,.06); min-height: 40px;
  max-height: 32vh; overflow-y: auto; }
.details h2 { font-size: 13.5px; margin: 0 0 4px; }
.details .cols { display: flex; gap: 28px; flex-wrap: wrap; align-items: flex-start; }
.details table { border-collapse: collapse; font-size: 12px; }
.details td, .details th { padding: 1px 10px 1px 0; text-align: left; vertical-align: top; }
.details th { color: #57606a; font-weight: 500; }
.details td.code { font-family: ui-monospace, "DejaVu Sans Mono", monospace; }
.details .hint { margin: 0; color: #656d76; }
.details .differs { color: #cf222e; font-weight: 600; }
.tools { display: flex; gap: 6px; align-items: center; padding: 4px 18px; color: #57606a;
  font-size: 12px; border-bottom: 1px solid #d8dee4; }
.tools button { font: inherit; cursor: pointer; border: 1px solid #afb8c1; background: #fff;
  border-radius: 4px; padding: 0 8px; min-width: 28px; }
"""


def style() -> str:
    """The page's style sheet, with the states' colours.

    Returns:
        CSS text.
    """
    states = "\n".join(
        f".s-{name.replace(' ', '-')} {{ fill: {fill}; stroke: {line}; }}\n"
        f".legend i.sw-{name.replace(' ', '-')} {{ background: {fill}; border-color: {line}; }}"
        for name, (fill, line) in COLOURS.items()
    )
    extra = (
        ".s-in-flight { fill: url(#p-flight); }\n"
        ".legend i.sw-in-flight { background: repeating-linear-gradient(135deg, #f7b955 0 4px,"
        " #e99a2a 4px 7px); }\n"
        ".s-never-reached { stroke-dasharray: 5 3; }\n"
        ".legend i.sw-never-reached { border-style: dashed; }"
    )
    return STYLE % {"mark": MARK_COLOUR, "states": states + "\n" + extra}


DEFS = (
    '<defs><pattern id="p-flight" width="7" height="7" patternUnits="userSpaceOnUse"'
    ' patternTransform="rotate(45)"><rect width="7" height="7" fill="#f7b955"/>'
    '<rect width="3" height="7" fill="#e99a2a"/></pattern>'
    '<pattern id="p-gap" width="6" height="6" patternUnits="userSpaceOnUse"'
    ' patternTransform="rotate(45)"><rect width="6" height="6" fill="#f0f2f4"/>'
    '<rect width="2" height="6" fill="#d5d9de"/></pattern></defs>'
)
"""The plot's fill patterns: in-flight stripes and the hatching of shortened stretches."""

SCRIPT = r"""
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("timeline-data").textContent);
  var plot = document.getElementById("plot");
  var panel = document.getElementById("details");
  var join = document.getElementById("join");
  var mark = document.getElementById("mark");
  var byKey = {};
  Array.prototype.forEach.call(plot.querySelectorAll(".box"), function (b) {
    var k = b.getAttribute("data-k");
    (byKey[k] = byKey[k] || []).push(b);
  });
  var lit = [], pinned = null, resting = plot.querySelector(".box.marked:not(.s-never-reached)")
    || plot.querySelector(".box.marked");
  function num(b, name) { return parseFloat(b.getAttribute(name)); }
  function span(b) { return data.spans[parseInt(b.getAttribute("data-i"), 10)]; }
  function secs(t) { return t === null ? "\u2013" : t.toFixed(6) + " s"; }
  function light(box) {
    lit.forEach(function (b) { b.classList.remove("hl"); });
    lit = box ? byKey[box.getAttribute("data-k")].slice() : [];
    plot.classList.toggle("hovering", !!box);
    lit.forEach(function (b) { b.classList.add("hl"); });
    var pts = lit.map(function (b) {
      return [num(b, "x") + Math.min(num(b, "width"), 24) / 2, num(b, "y") + num(b, "height") / 2];
    }).sort(function (p, q) { return p[1] - q[1]; });
    join.setAttribute("points", pts.length > 1 ? pts.map(function (p) {
      return p[0].toFixed(1) + "," + p[1].toFixed(1);
    }).join(" ") : "");
  }
  function add(parent, tag, text, cls) {
    var el = document.createElement(tag);
    if (text !== undefined) { el.textContent = text; }
    if (cls) { el.className = cls; }
    parent.appendChild(el);
    return el;
  }
  function row(table, head, value, cls) {
    var tr = add(table, "tr");
    add(tr, "th", head);
    add(tr, "td", value === null || value === "" ? "\u2013" : String(value), cls);
  }
  function describe(box) {
    panel.textContent = "";
    if (!box) {
      add(panel, "p", "Hover over a box to see its collective on every rank; click to keep it.",
        "hint");
      return;
    }
    var s = span(box), g = data.groups[s[1]];
    add(panel, "h2", "#" + s[2] + " on " + g[1] + " \u00b7 rank " + s[0] + " \u00b7 " + s[11]);
    var cols = add(panel, "div", undefined, "cols");
    var t = add(cols, "table");
    row(t, "call", s[4], "code");
    row(t, "shapes", s[5], "code");
    row(t, "dtype", s[6], "code");
    row(t, "reduce op", s[7], "code");
    row(t, "call site", s[8], "code");
    row(t, "start", secs(s[9]));
    row(t, "end", s[10] === null ? (s[9] === null ? null : "not returned") : secs(s[10]));
    var peers = byKey[box.getAttribute("data-k")].map(span)
      .sort(function (p, q) { return p[0] - q[0]; });
    var counts = {}, usual = null;
    peers.forEach(function (p) {
      if (p[11] !== "never reached") { counts[p[4]] = (counts[p[4]] || 0) + 1; }
    });
    Object.keys(counts).forEach(function (c) {
      if (usual === null || counts[c] > counts[usual]) { usual = c; }
    });
    var across = add(cols, "table");
    var head = add(across, "tr");
    ["rank", "call", "state", "call site"].forEach(function (h) { add(head, "th", h); });
    peers.forEach(function (p) {
      var tr = add(across, "tr");
      add(tr, "td", "rank " + p[0]);
      var odd = p[11] !== "never reached" && Object.keys(counts).length > 1 && p[4] !== usual;
      add(tr, "td", p[4] || "\u2013", odd ? "code differs" : "code");
      add(tr, "td", p[11]);
      add(tr, "td", p[8] || "\u2013", "code");
    });
  }
  function rest() { light(null); describe(resting); }
  plot.addEventListener("mouseover", function (e) {
    var b = e.target.closest(".box");
    if (b && !pinned) { light(b); describe(b); }
  });
  plot.addEventListener("mouseleave", function () { if (!pinned) { rest(); } });
  plot.addEventListener("click", function (e) {
    pinned = e.target.closest(".box");
    if (pinned) { light(pinned); describe(pinned); } else { rest(); }
  });
  document.addEventListener("keydown", function (e) {
    if (e.key === "Escape") { pinned = null; rest(); }
  });
  var scroll = document.getElementById("scroll");
  var width0 = num(plot, "width"), height = num(plot, "height"), factor = 1, saved = null;
  function zoom(f) {
    // Only the time axis stretches: x positions and widths scale, text keeps its size.
    if (!saved) {
      saved = [];
      Array.prototype.forEach.call(plot.querySelectorAll("rect, text, line, polyline"),
        function (el) {
          if (!el.closest("defs")) {
            saved.push([el, ["x", "width", "x1", "x2"].map(function (a) {
              return el.getAttribute(a);
            }), el.getAttribute("points")]);
          }
        });
    }
    var middle = (scroll.scrollLeft + scroll.clientWidth / 2) / factor;
    factor = f;
    saved.forEach(function (s) {
      var el = s[0];
      ["x", "width", "x1", "x2"].forEach(function (a, i) {
        if (s[1][i] !== null) {
          var v = parseFloat(s[1][i]), box = el.classList.contains("box");
          // A placeholder has no length in time: it keeps its width, after its track's last.
          v = a === "width" && box ? (el.classList.contains("placed") ? v : Math.max(3, v * f))
            : v * f;
          el.setAttribute(a, v.toFixed(1));
        }
      });
      if (s[2]) {
        el.setAttribute("points", s[2].split(" ").map(function (p) {
          var xy = p.split(",");
          return (parseFloat(xy[0]) * f).toFixed(1) + "," + xy[1];
        }).join(" "));
      }
    });
    var right = {};
    Array.prototype.slice.call(plot.querySelectorAll(".box.placed")).sort(function (a, b) {
      return num(a, "x") - num(b, "x");
    }).forEach(function (b) {
      var track = b.getAttribute("data-rank") + "/" + b.getAttribute("data-group");
      var x = Math.max(num(b, "x"), right[track] || 0);
      b.setAttribute("x", x.toFixed(1));
      right[track] = x + num(b, "width") + 4;
    });
    var w = Math.ceil(width0 * f);
    plot.setAttribute("width", w);
    plot.setAttribute("viewBox", "0 0 " + w + " " + height);
    Array.prototype.forEach.call(plot.querySelectorAll(".bl"), function (t) {
      var box = t.previousElementSibling;
      t.setAttribute("x", (num(box, "x") + 4).toFixed(1));
      t.style.display = t.getComputedTextLength() + 6 > num(box, "width") ? "none" : "";
    });
    var last = -1e9;
    Array.prototype.forEach.call(plot.querySelectorAll(".tick"), function (t) {
      var x = num(t, "x"), show = x - last >= 64 && x + 48 <= w;
      t.style.display = show ? "" : "none";
      if (show) { last = x; }
    });
    scroll.scrollLeft = middle * f - scroll.clientWidth / 2;
    if (mark) { placeFlag(); }
  }
  function fit() { return Math.min(1, (scroll.clientWidth - 2) / width0); }
  Array.prototype.forEach.call(document.querySelectorAll("[data-zoom]"), function (b) {
    b.addEventListener("click", function () {
      var how = b.getAttribute("data-zoom");
      zoom(how === "fit" ? fit() : how === "in" ? Math.min(8, factor * 1.5)
        : how === "out" ? Math.max(fit(), factor / 1.5) : 1);
    });
  });
  function toMark() {
    var x = num(mark, "data-x") * factor;
    // As little as shows the mark with room after it: what led to it stays in view.
    if (x < scroll.scrollLeft || x + 240 > scroll.scrollLeft + scroll.clientWidth) {
      scroll.scrollLeft = Math.max(0, Math.min(x - 40, x + 240 - scroll.clientWidth));
    }
    var r = (resting || mark).getBoundingClientRect();
    if (r.top < 0 || r.bottom > window.innerHeight - panel.offsetHeight) {
      window.scrollBy(0, r.top - window.innerHeight / 3);
    }
  }
  function placeFlag() {
    // The flag's width as drawn, and its place within the visible part of the plot.
    var text = mark.querySelector(".flag-text"), flag = mark.querySelector(".flag");
    var w = text.getComputedTextLength() + 16, x = num(mark, "data-x") * factor - 2;
    var left = scroll.scrollLeft, right = Math.min(left + scroll.clientWidth, num(plot, "width"));
    if (x >= left && x <= right) { x = Math.max(left + 4, Math.min(x, right - 8 - w)); }
    flag.setAttribute("width", w.toFixed(1));
    flag.setAttribute("x", x.toFixed(1));
    text.setAttribute("x", (x + 8).toFixed(1));
  }
  // A plot a little wider than the window is fitted to it; a wider one scrolls.
  if (width0 > scroll.clientWidth && width0 <= 1.6 * scroll.clientWidth) { zoom(fit()); }
  if (mark) {
    var button = document.getElementById("to-mark");
    if (button) { button.addEventListener("click", toMark); }
    toMark();
    placeFlag();
    scroll.addEventListener("scroll", placeFlag);
  }
  rest();
})();
"""
"""The page's script (see the module)."""
