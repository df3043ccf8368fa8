"use strict";
// The report page's script: draws the chart, flame graphs and sites tables from the data
// embedded in the page; with #selftest in the URL, checks them and writes what it found.
(function () {
  var D = JSON.parse(document.getElementById("data").textContent);
  var C = D.chart;
  var NS = "http://www.w3.org/2000/svg";
  var COLORS = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1",
    "#ff9da7", "#9c755f", "#86bcb6", "#d37295", "#a0cbe8", "#8cd17d", "#f1ce63"];
  var hidden = {};

  function $(id) { return document.getElementById(id); }
  function make(ns, tag, attrs, text) {
    var e = ns ? document.createElementNS(ns, tag) : document.createElement(tag);
    for (var k in attrs || {}) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    return e;
  }
  function el(tag, attrs, text) { return make(null, tag, attrs, text); }
  function sv(tag, attrs, text) { return make(NS, tag, attrs, text); }
  function size(b) {
    if (b < 1024) return b + " B";
    var u = ["KiB", "MiB", "GiB", "TiB"], i = -1;
    do { b /= 1024; i++; } while (b >= 1024 && i < u.length - 1);
    return b.toFixed(1) + " " + u[i];
  }
  function secs(t) { return "+" + t.toFixed(3) + " s"; }
  function color(i) { return C.series[i].others ? "#bab0ac" : COLORS[i % COLORS.length]; }
  // A round step near span / n: 1, 2 or 5 times a power of ten (of `unit`).
  function niceStep(span, n, unit) {
    var raw = span / n / unit, p = Math.pow(10, Math.floor(Math.log10(raw || 1)));
    var m = raw / p;
    return (m < 1.5 ? 1 : m < 3.5 ? 2 : m < 7.5 ? 5 : 10) * p * unit;
  }

  // ---- the live heap over time: a stacked area per series, drawn as steps
  function stack() {
    var n = C.total.length, base = new Array(n).fill(0), bands = [];
    C.series.forEach(function (s, i) {
      var top = base.slice();
      if (!hidden[i]) for (var k = 0; k < n; k++) top[k] += s.values[k];
      bands.push({ lo: base, hi: top });
      base = top;
    });
    return bands;
  }

  function drawChart() {
    var box = $("chart");
    box.textContent = "";
    var n = C.total.length;
    if (!n) { box.appendChild(el("p", { class: "hint" }, "No event in the window.")); return; }
    var W = Math.max(box.clientWidth || 1200, 400), H = 360, L = 72, R = 20, T = 30, B = 30;
    var bands = stack(), top = bands.length ? bands[bands.length - 1].hi : [];
    var ymax = Math.max(1, C.peak ? C.peak[1] : 0, Math.max.apply(null, top)) * 1.08;
    var span = n * C.step;
    function x(t) { return L + (t - C.t0) / span * (W - L - R); }
    function y(v) { return T + (H - T - B) * (1 - v / ymax); }
    var svg = sv("svg", { viewBox: "0 0 " + W + " " + H, height: H });
    axes(svg, ymax, span, x, y, W, H, L, T, B);
    bands.forEach(function (b, i) {
      if (hidden[i]) return;
      var up = [], down = [];
      for (var k = 0; k < n; k++) {
        var x0 = x(C.t0 + k * C.step).toFixed(1), x1 = x(C.t0 + (k + 1) * C.step).toFixed(1);
        up.push(x0 + "," + y(b.hi[k]).toFixed(1), x1 + "," + y(b.hi[k]).toFixed(1));
        down.push(x1 + "," + y(b.lo[k]).toFixed(1), x0 + "," + y(b.lo[k]).toFixed(1));
      }
      var p = sv("path", { class: "series", fill: color(i), d: "M" + up.concat(down.reverse()).join("L") + "Z" });
      p.appendChild(sv("title", {}, C.series[i].label));
      svg.appendChild(p);
    });
    bands.forEach(function (b, i) {
      var s = C.series[i];
      if (hidden[i] || !s.peak) return;
      var k = Math.min(n - 1, Math.max(0, Math.floor((s.peak[0] - C.t0) / C.step)));
      var c = sv("circle", { class: "peak", r: 4, fill: color(i), cx: x(s.peak[0]), cy: y(b.lo[k] + s.peak[1]) });
      c.appendChild(sv("title", {}, s.label + ": its peak, " + size(s.peak[1]) + " at " + secs(s.peak[0])));
      svg.appendChild(c);
    });
    if (C.peak) peakMark(svg, x(C.peak[0]), y(C.peak[1]), W, H, T, B);
    box.appendChild(svg);
    hover(box, svg, bands, x, W, H, L, R, T, B);
  }

  function axes(svg, ymax, span, x, y, W, H, L, T, B) {
    var g = sv("g", { class: "axis" });
    var unit = ymax >= 1 << 30 ? 1 << 30 : ymax >= 1 << 20 ? 1 << 20 : 1024;
    var dy = niceStep(ymax, 5, unit);
    for (var v = 0; v <= ymax; v += dy) {
      g.appendChild(sv("line", { x1: L, x2: W - 20, y1: y(v), y2: y(v) }));
      g.appendChild(sv("text", { x: L - 6, y: y(v) + 4, "text-anchor": "end" }, size(v)));
    }
    var dx = niceStep(span, 8, 1);
    for (var t = Math.ceil(C.t0 / dx) * dx; t <= C.t0 + span; t += dx) {
      g.appendChild(sv("line", { x1: x(t), x2: x(t), y1: H - B, y2: H - B + 4 }));
      g.appendChild(sv("text", { x: x(t), y: H - B + 16, "text-anchor": "middle" }, "+" + +t.toFixed(6) + " s"));
    }
    svg.appendChild(g);
  }

  function peakMark(svg, px, py, W, H, T, B) {
    var g = sv("g", { class: "peak-total" });
    g.appendChild(sv("line", { x1: px, x2: px, y1: T - 8, y2: H - B }));
    g.appendChild(sv("circle", { cx: px, cy: py, r: 5, fill: "none", stroke: "#1d2330", "stroke-width": 2 }));
    var words = "combined peak " + size(C.peak[1]) + " at " + secs(C.peak[0]);
    var right = px > W * 0.6;
    g.appendChild(sv("text", { x: px + (right ? -6 : 6), y: T - 12 + 10, "text-anchor": right ? "end" : "start" }, words));
    svg.appendChild(g);
  }

  function hover(box, svg, bands, x, W, H, L, R, T, B) {
    var cursor = sv("line", { class: "cursor", y1: T, y2: H - B, visibility: "hidden" });
    svg.appendChild(cursor);
    var tip = el("div", { id: "tip", hidden: "" });
    box.appendChild(tip);
    svg.addEventListener("mousemove", function (ev) {
      var r = svg.getBoundingClientRect(), px = (ev.clientX - r.left) * W / r.width;
      var k = Math.floor((px - L) / (W - L - R) * C.total.length);
      if (k < 0 || k >= C.total.length) { tip.hidden = true; cursor.setAttribute("visibility", "hidden"); return; }
      var cx = x(C.t0 + (k + 0.5) * C.step);
      cursor.setAttribute("x1", cx); cursor.setAttribute("x2", cx);
      cursor.setAttribute("visibility", "visible");
      var rows = C.series.map(function (s, i) { return [i, s.values[k]]; })
        .filter(function (r) { return !hidden[r[0]] && r[1] > 0; })
        .sort(function (a, b) { return b[1] - a[1]; });
      tip.textContent = "";
      tip.appendChild(el("div", {}, secs(C.t0 + k * C.step) + " to " + secs(C.t0 + (k + 1) * C.step)));
      tip.appendChild(el("b", {}, "all: " + size(C.total[k])));
      rows.slice(0, 10).forEach(function (r) {
        var d = el("div");
        d.appendChild(el("span", { class: "swatch", style: "background:" + color(r[0]) }));
        d.appendChild(document.createTextNode(C.series[r[0]].label + ": " + size(r[1])));
        tip.appendChild(d);
      });
      if (rows.length > 10) tip.appendChild(el("div", {}, (rows.length - 10) + " more"));
      tip.hidden = false;
      var left = ev.clientX - box.getBoundingClientRect().left;
      tip.style.left = (left > r.width / 2 ? left - tip.offsetWidth - 12 : left + 12) + "px";
      tip.style.top = (ev.clientY - box.getBoundingClientRect().top + 12) + "px";
    });
    svg.addEventListener("mouseleave", function () { tip.hidden = true; cursor.setAttribute("visibility", "hidden"); });
  }

  function drawLegend() {
    var box = $("legend");
    box.textContent = "";
    C.series.forEach(function (s, i) {
      var b = el("button", { type: "button", class: hidden[i] ? "off" : "" });
      b.appendChild(el("span", { class: "swatch", style: "background:" + color(i) }));
      b.appendChild(document.createTextNode(s.label + (s.peak ? " (peak " + size(s.peak[1]) + ")" : "")));
      b.addEventListener("click", function () {
        hidden[i] = !hidden[i];
        b.classList.toggle("off", !!hidden[i]);
        drawChart();
      });
      box.appendChild(b);
    });
  }

  // ---- flame graphs: inferno's SVG, each in a frame of its own (its script and ids apart)
  var HEAD = "<!DOCTYPE html><html><head><meta charset=\"utf-8\"><style>body{margin:0}" +
    "svg{display:block;width:100%}</style><script>window.fgErrors=[];" +
    "window.onerror=function(m){fgErrors.push(String(m))};" +
    // (its zoom keeps its state in the URL, which a frame of this page cannot change)
    "history.replaceState=function(){};<\/script></head><body>";

  function fillSelect(sel, options) {
    options.forEach(function (o) { sel.appendChild(el("option", { value: o[0] }, o[1])); });
  }
  function modeIndex(key) { return D.modes.map(function (m) { return m[0]; }).indexOf(key); }
  function modeWords(mi, si) { return D.modes[mi][si ? 2 : 1]; }

  function showFlame() {
    var mi = modeIndex($("flame-mode").value), si = +$("flame-subject").value;
    var f = D.flames[mi * D.subjects.length + si], box = $("flame");
    box.textContent = "";
    if (!f.svg) {
      box.appendChild(el("p", { class: "empty" }, D.subjects[si] + ": no bytes " + modeWords(mi, si) + "."));
      return null;
    }
    var fr = el("iframe", { title: "flame graph: " + D.subjects[si] + ", " + modeWords(mi, si) });
    fr.addEventListener("load", function () {
      var s = fr.contentDocument && fr.contentDocument.querySelector("svg");
      if (s) fr.style.height = (s.getBoundingClientRect().height + 4) + "px";
    });
    fr.srcdoc = HEAD + f.svg + "</body></html>";
    box.appendChild(fr);
    return fr;
  }

  // ---- sites tables
  var COLS = [["s", "site"], ["pct", "%"], ["a", "allocated"], ["p", "at the peak"],
    ["e", "at the end"], ["n", "samples"]];
  var sort = null, open = {};

  function showSites() {
    var mi = modeIndex($("sites-mode").value), si = +$("sites-subject").value;
    var t = D.sites[D.modes[mi][0]][si], q = $("sites-search").value.trim().toLowerCase();
    var key = sort || ["a", "p", "e"][mi];
    var rows = t.rows.filter(function (r) { return !q || r.s.toLowerCase().indexOf(q) >= 0; });
    rows.sort(function (a, b) {
      var u = key === "pct" ? a.v : a[key], w = key === "pct" ? b.v : b[key];
      return key === "s" ? (u < w ? -1 : u > w ? 1 : 0) : w - u;
    });
    var table = $("sites-table");
    table.textContent = "";
    var head = el("tr");
    COLS.forEach(function (c) {
      var th = el("th", { class: (c[0] === "s" ? "" : "num ") + (c[0] === key ? "sorted" : "") }, c[1]);
      th.addEventListener("click", function () { sort = c[0]; showSites(); });
      head.appendChild(th);
    });
    table.appendChild(el("thead")).appendChild(head);
    var body = table.appendChild(el("tbody"));
    rows.forEach(function (r) { siteRow(body, r, t.whole); });
    if (!t.rows.length) body.appendChild(el("tr")).appendChild(el("td", { class: "empty", colspan: 6 }, "No site."));
    $("sites-count").textContent = rows.length + " of " + t.rows.length + " sites shown" +
      (t.more ? "; " + t.more + " smaller ones (" + size(t.more_value) + ") not listed" : "");
  }

  function siteRow(body, r, whole) {
    var tr = body.appendChild(el("tr", { class: "site" }));
    var pct = whole ? 100 * r.v / whole : 0, td = el("td", { class: "site" });
    td.appendChild(el("span", { class: "bar", style: "width:" + Math.max(1, pct * 0.8).toFixed(1) + "px" }));
    td.appendChild(document.createTextNode(r.s));
    tr.appendChild(td);
    [pct.toFixed(1) + "%", size(r.a), size(r.p), size(r.e), r.n].forEach(function (v) {
      tr.appendChild(el("td", { class: "num" }, v));
    });
    tr.addEventListener("click", function () { open[r.s] = !open[r.s]; showSites(); });
    if (!open[r.s]) return;
    var c = body.appendChild(el("tr", { class: "callers" })).appendChild(el("td", { colspan: 6 }));
    if (!r.c.length) c.textContent = "No caller.";
    r.c.forEach(function (k) {
      c.appendChild(el("div", {}, "called from " + k[0] + ": " + size(k[1]) +
        (r.v ? " (" + (100 * k[1] / r.v).toFixed(1) + "%)" : "")));
    });
  }

  // ---- the page
  var modes = D.modes.map(function (m) { return [m[0], m[1]]; });
  var subjects = D.subjects.map(function (s, i) { return [i, s]; });
  fillSelect($("flame-mode"), modes);
  fillSelect($("flame-subject"), subjects);
  fillSelect($("sites-mode"), modes);
  fillSelect($("sites-subject"), subjects);
  $("flame-mode").value = $("sites-mode").value = "peak";
  $("flame-mode").addEventListener("change", showFlame);
  $("flame-subject").addEventListener("change", showFlame);
  $("sites-mode").addEventListener("change", function () { sort = null; showSites(); });
  $("sites-subject").addEventListener("change", showSites);
  $("sites-search").addEventListener("input", showSites);
  window.addEventListener("resize", drawChart);
  drawLegend();
  drawChart();
  showFlame();
  showSites();

  window.report = { data: D, showFlame: showFlame, showSites: showSites };
}());
