"use strict";
// The page's self-test, run when the URL ends in #selftest (a headless browser's test loads
// it so): works the page as a person would and writes what it found, as JSON, into
// <pre id="selftest">.
(function () {
  if (location.hash !== "#selftest") return;
  var out = document.getElementById("selftest"), r = {};
  function $(id) { return document.getElementById(id); }
  function count(sel) { return document.querySelectorAll(sel).length; }
  function finish() {
    r.errors = (window.reportErrors || []).slice();
    out.textContent = JSON.stringify(r);
    out.hidden = false;
  }
  function pick(id, value) {
    $(id).value = value;
    $(id).dispatchEvent(new Event("change"));
  }
  function input(id, value) {
    $(id).value = value;
    $(id).dispatchEvent(new Event("input"));
  }
  if (!window.report) { r.exception = "the page's script did not run"; finish(); return; }
  var D = window.report.data;
  try {
    r.processes = D.processes;
    r.process_rows = count("#processes tr.process");
    r.series = count("#chart .series");
    r.series_expected = D.chart.series.length;
    r.process_peaks = count("#chart .peak");
    r.combined_peak = count("#chart .peak-total");
    r.legend = count("#legend button");
    var b = document.querySelector("#legend button");
    b.click();
    r.series_hidden = count("#chart .series");
    r.legend_off = count("#legend button.off");
    b.click();
    r.series_shown_again = count("#chart .series");
    var svg = document.querySelector("#chart svg"), box = svg.getBoundingClientRect();
    svg.dispatchEvent(new MouseEvent("mousemove", {
      clientX: box.left + box.width / 2, clientY: box.top + box.height / 2, bubbles: true
    }));
    r.hover = $("tip").hidden ? "" : $("tip").textContent;
    r.tables = {};
    D.modes.forEach(function (m) {
      pick("sites-mode", m[0]);
      r.tables[m[0]] = D.subjects.map(function (s, i) {
        pick("sites-subject", i);
        return count("#sites-table tr.site");
      });
    });
    pick("sites-mode", "alloc");
    pick("sites-subject", 0);
    var all = count("#sites-table tr.site");
    var first = document.querySelector("#sites-table tr.site td.site").textContent;
    var term = first.split(" (")[0];
    input("sites-search", term);
    var found = count("#sites-table tr.site");
    input("sites-search", "no such function, surely");
    r.search = { term: term, all: all, found: found, none: count("#sites-table tr.site") };
    input("sites-search", "");
    r.search.cleared = count("#sites-table tr.site");
    document.querySelector("#sites-table tr.site").click();
    r.callers = count("#sites-table tr.callers div");
    var th = document.querySelectorAll("#sites-table th")[5];
    th.click();
    var samples = Array.prototype.map.call(document.querySelectorAll("#sites-table tr.site"),
      function (tr) { return +tr.children[5].textContent; });
    r.sorted_by_samples = samples.every(function (v, i) { return !i || samples[i - 1] >= v; });
  } catch (e) {
    r.exception = String(e && e.stack || e);
  }
  r.flames = [];
  flame(0);

  // Each flame graph in turn: loaded in its frame, zoomed by a click, searched.
  function flame(i) {
    if (i >= D.flames.length) { finish(); return; }
    var ns = D.subjects.length, m = D.modes[Math.floor(i / ns)][0], s = i % ns;
    var e = { mode: m, subject: D.subjects[s] };
    r.flames.push(e);
    $("flame-mode").value = m;
    $("flame-subject").value = s;
    var fr = window.report.showFlame();
    if (!fr) { e.empty = true; flame(i + 1); return; }
    fr.addEventListener("load", function () {
      // (inferno lays its frames out on a timer of its own: after it)
      setTimeout(function () {
        try {
          var d = fr.contentDocument, w = fr.contentWindow, g = d.querySelectorAll("#frames g");
          e.frames = g.length;
          e.errors = w.fgErrors;
          var last = g[g.length - 1];
          last.querySelector("rect").dispatchEvent(new MouseEvent("click", { bubbles: true }));
          e.zoomed = !d.getElementById("unzoom").classList.contains("hide");
          // (its own innermost function, as a regular expression of itself)
          var name = last.querySelector("title").textContent.replace(/ \([^(]*\)$/, "");
          w.search(name.replace(/[.*+?^${}()|[\]\\]/g, "\\$&"));
          e.searched = name;
          e.matched = d.getElementById("matched").textContent;
        } catch (x) {
          e.exception = String(x);
        }
        flame(i + 1);
      }, 20);
    });
  }
}());
