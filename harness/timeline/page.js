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
