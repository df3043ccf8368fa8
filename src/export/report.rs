//! A run's report as one self-contained HTML page: the processes, the live heap over time,
//! flame graphs and sites tables, drawn offline by a small script from data embedded in it.

use crate::analysis::{Analysis, By, Mode, ProcessSummary, SiteRow};
use crate::export::flamegraph::{write_svg, FlameOptions};
use crate::tools::summary::human_bytes;
use maud::{html, Markup, PreEscaped, DOCTYPE};
use serde_json::{json, Value};
use std::io::Write;

/// What a report shows, and how much of it (what is too small to see is aggregated, so
/// that the page of a thousand processes stays small and quick).
#[derive(Clone, Debug)]
pub struct ReportOptions {
    /// The rows of each sites table.
    pub sites: usize,
    /// The processes (the largest at their peak) with flame graphs and tables of their own.
    pub processes: usize,
    /// The processes drawn apart in the chart; the others are one series.
    pub series: usize,
    /// The callers listed under a site.
    pub callers: usize,
    /// Frames narrower than this (pixels of a 1,200-pixel-wide graph) are left out of the
    /// flame graphs.
    pub min_width: f64,
    /// A flame graph larger than this (bytes of SVG) is drawn again with twice the
    /// `min_width`, until it fits.
    pub flame_bytes: usize,
}

impl Default for ReportOptions {
    fn default() -> ReportOptions {
        ReportOptions {
            sites: 200,
            processes: 10,
            series: 12,
            callers: 10,
            min_width: 0.5,
            flame_bytes: 160_000,
        }
    }
}

/// The three views of each flame graph and table: key, words, words for one process.
const MODES: [(Mode, &str, &str, &str); 3] = [
    (Mode::Alloc, "alloc", "allocated", "allocated"),
    (
        Mode::Peak,
        "peak",
        "live at the peak of the run",
        "live at its own peak",
    ),
    (
        Mode::End,
        "end",
        "leaked (live at the end)",
        "leaked (live at the end)",
    ),
];

/// Write the report of `a` as one HTML page to `out`.
pub fn write_html(a: &Analysis, opts: &ReportOptions, mut out: impl Write) -> std::io::Result<()> {
    let data = page_data(a, opts)?;
    // (in a script element only `</script` or `<!--` could end it early: no `<` at all)
    let json = serde_json::to_string(&data)
        .map_err(std::io::Error::other)?
        .replace('<', "\\u003c");
    out.write_all(page(a, &json).into_string().as_bytes())
}

/// The page's data: the chart's series, the flame graphs, the sites tables.
fn page_data(a: &Analysis, opts: &ReportOptions) -> std::io::Result<Value> {
    let ps = a.processes();
    let subjects = subjects(&ps, opts.processes);
    let views: Vec<(usize, Option<usize>)> = (0..MODES.len())
        .flat_map(|m| subjects.iter().map(move |s| (m, *s)))
        .collect();
    // (the flame graphs take as long as the rest: on a thread of their own)
    let (flames, tables) = std::thread::scope(|scope| {
        let flames = scope.spawn(|| flames(a, &ps, &subjects, opts));
        let tables: Vec<Value> = (views.iter())
            .map(|&(m, s)| sites_table(a, MODES[m].0, s, opts))
            .collect();
        let flames = flames
            .join()
            .unwrap_or_else(|e| std::panic::resume_unwind(e));
        (flames, tables)
    });
    let mut sites = serde_json::Map::new();
    for (m, chunk) in tables.chunks(subjects.len()).enumerate() {
        sites.insert(MODES[m].1.into(), chunk.to_vec().into());
    }
    Ok(json!({
        "processes": ps.len(),
        "subjects": subjects.iter().map(|s| subject_label(&ps, *s)).collect::<Vec<_>>(),
        "modes": MODES.iter().map(|m| json!([m.1, m.2, m.3])).collect::<Vec<_>>(),
        "chart": chart_data(a, opts.series),
        "flames": flames?,
        "sites": sites,
    }))
}

/// The flame graphs: of each mode, the run's then each process's.
fn flames(
    a: &Analysis,
    ps: &[ProcessSummary],
    subjects: &[Option<usize>],
    opts: &ReportOptions,
) -> std::io::Result<Vec<Value>> {
    let modes: Vec<Mode> = MODES.iter().map(|m| m.0).collect();
    let own: Vec<usize> = subjects.iter().flatten().copied().collect();
    let stacks = a.folded_bytes(&modes, &own);
    let mut out = Vec::new();
    for ((_, key, words, own_words), per_mode) in MODES.iter().zip(stacks) {
        for (s, stacks) in subjects.iter().zip(per_mode) {
            let what = if s.is_some() { own_words } else { words };
            let title = format!("{}: bytes {what}", subject_label(ps, *s));
            out.push(json!({
                "mode": key,
                "subject": subject_label(ps, *s),
                "svg": flame_svg(&stacks, &title, opts)?,
            }));
        }
    }
    Ok(out)
}

/// Whom the per-process views are of: the run (None), then the largest processes at their
/// peak.
fn subjects(ps: &[ProcessSummary], n: usize) -> Vec<Option<usize>> {
    // (one process's own views would be the run's)
    let own = if ps.len() > 1 { n } else { 0 };
    std::iter::once(None)
        .chain(largest(ps, own).into_iter().map(Some))
        .collect()
}

/// The `n` largest processes at their peak, largest first.
fn largest(ps: &[ProcessSummary], n: usize) -> Vec<usize> {
    let mut by_peak: Vec<usize> = (0..ps.len()).collect();
    by_peak.sort_by_key(|&i| (std::cmp::Reverse(ps[i].peak_bytes), i));
    by_peak.truncate(n);
    by_peak
}

fn subject_label(ps: &[ProcessSummary], s: Option<usize>) -> String {
    match s {
        None => "whole run".into(),
        Some(p) => process_label(&ps[p]),
    }
}

/// `pid 123 (worker)`.
fn process_label(p: &ProcessSummary) -> String {
    format!("pid {} ({})", p.pid, exe(p))
}

fn exe(p: &ProcessSummary) -> &str {
    p.executable.rsplit('/').next().unwrap_or("")
}

fn file_name(p: &ProcessSummary) -> String {
    let name = p.file.file_name().unwrap_or(p.file.as_os_str());
    name.to_string_lossy().into_owned()
}

/// A process's warnings without its file's name, which its row shows; past the first
/// three, behind a click (a damaged trace can have hundreds).
fn warnings(p: &ProcessSummary) -> Markup {
    let name = format!("{}: ", p.file.display());
    let own = |w: &'_ String| -> String { w.strip_prefix(&name).unwrap_or(w).to_string() };
    let (first, rest) = p.warnings.split_at(p.warnings.len().min(3));
    html! {
        @for w in first { div { (own(w)) } }
        @if !rest.is_empty() {
            details {
                summary { (rest.len()) " more" }
                @for w in rest { div { (own(w)) } }
            }
        }
    }
}

/// The flame graph's `<svg>` element (its XML prologue left out: the page embeds it in an
/// HTML document), or null when nothing is worth a pixel.
fn flame_svg(
    stacks: &[(String, u64)],
    title: &str,
    opts: &ReportOptions,
) -> std::io::Result<Value> {
    if stacks.iter().all(|(_, w)| *w == 0) {
        return Ok(Value::Null);
    }
    let mut flame = FlameOptions {
        title: title.into(),
        subtitle: None,
        count_name: "bytes".into(),
        min_width: Some(opts.min_width),
    };
    loop {
        let mut svg = Vec::new();
        write_svg(stacks, &flame, &mut svg)?;
        let w = flame.min_width.unwrap_or(1.0);
        // (past 64 pixels only the widest frames are left: a graph that large is kept)
        if svg.len() <= opts.flame_bytes || w >= 64.0 {
            let svg = String::from_utf8_lossy(&svg);
            return Ok(svg.find("<svg").map_or(Value::Null, |i| svg[i..].into()));
        }
        flame.min_width = Some(w * 2.0);
    }
}

/// One sites table: its rows (`s` site, `v` value, `a` allocated, `p` at the peak, `e` at
/// the end, `n` samples, `c` callers), the whole they are parts of, the sites left out.
fn sites_table(a: &Analysis, mode: Mode, s: Option<usize>, opts: &ReportOptions) -> Value {
    let rows = match s {
        None => a.top(mode, By::Function, false).sites,
        Some(p) => a.process_top(mode, By::Function, p),
    };
    let of = match s {
        None => a.total(),
        Some(p) => a.processes().swap_remove(p),
    };
    let whole = match mode {
        Mode::Alloc => of.allocated_bytes,
        Mode::Peak => of.peak_bytes,
        _ => of.end_bytes,
    };
    let callers = a.callers(mode, s);
    let shown: Vec<Value> = (rows.iter().take(opts.sites))
        .map(|r| {
            let cs = callers.get(&r.frames).map_or(&[][..], |v| &v[..]);
            let mut c: Vec<Value> = (cs.iter().take(opts.callers))
                .map(|c| {
                    let name = c
                        .frame
                        .as_ref()
                        .map_or("(no caller)".into(), |f| f.to_string());
                    json!([name, c.value])
                })
                .collect();
            if cs.len() > opts.callers {
                let rest: u64 = cs[opts.callers..].iter().map(|c| c.value).sum();
                c.push(json!([
                    format!("{} more callers", cs.len() - opts.callers),
                    rest
                ]));
            }
            site_json(r, c)
        })
        .collect();
    let rest: u64 = rows.iter().skip(opts.sites).map(|r| r.value).sum();
    json!({
        "whole": whole,
        "rows": shown,
        "more": rows.len().saturating_sub(opts.sites),
        "more_value": rest,
    })
}

fn site_json(r: &SiteRow, callers: Vec<Value>) -> Value {
    let site: Vec<String> = r.frames.iter().map(|f| f.to_string()).collect();
    json!({
        "s": site.join(" <- "),
        "v": r.value,
        "a": r.allocated_bytes,
        "p": r.peak_bytes,
        "e": r.end_bytes,
        "n": r.samples,
        "c": callers,
    })
}

/// The chart: per step (seconds since the start), the largest heap of each series; the
/// largest processes at their peak apart, the rest summed as one series; the window only.
fn chart_data(a: &Analysis, series: usize) -> Value {
    let t = a.timeline();
    let step = t.step_us.max(1);
    // (the timeline holds the window only: from the step of its start, and no event past
    // its end)
    let first = t.first_step;
    let rows = &t.rows[..];
    let ps = &t.processes;
    let apart = if ps.len() > series + 1 {
        series
    } else {
        ps.len()
    };
    let mut order = largest(ps, apart);
    // (stacked in the order the processes started, the first at the bottom)
    order.sort_by_key(|&p| (ps[p].start_us, p));
    let at = |r: &(u64, Vec<u64>), p: usize| r.1.get(p).copied().unwrap_or(0);
    let secs = |us: u64| us.saturating_sub(t.start_us) as f64 / 1e6;
    let mut out: Vec<Value> = (order.iter())
        .map(|&p| {
            let q = &ps[p];
            json!({
                "label": process_label(q),
                "values": rows.iter().map(|r| at(r, p)).collect::<Vec<_>>(),
                "peak": q.peak_time_us.map(|w| json!([secs(w), q.peak_bytes])),
            })
        })
        .collect();
    if apart < ps.len() {
        let values: Vec<u64> = (rows.iter())
            .map(|r| {
                (r.1.iter().sum::<u64>()).saturating_sub(order.iter().map(|&p| at(r, p)).sum())
            })
            .collect();
        out.push(json!({
            "label": format!("{} other processes", ps.len() - apart),
            "values": values,
            "peak": null,
            "others": true,
        }));
    }
    json!({
        "t0": (first as u64 * step) as f64 / 1e6,
        "step": step as f64 / 1e6,
        "total": rows.iter().map(|r| r.0).collect::<Vec<_>>(),
        "series": out,
        "peak": t.total.peak_time_us.map(|w| json!([secs(w), t.total.peak_bytes])),
    })
}

/// `1 process`, `5 processes`.
fn count(n: usize) -> String {
    format!("{n} process{}", if n == 1 { "" } else { "es" })
}

/// `+1.234 s` after the run's start.
fn since(a: &Analysis, t_us: u64) -> String {
    format!("+{:.3} s", t_us.saturating_sub(a.start_us()) as f64 / 1e6)
}

/// The page: what the run was, in HTML; the chart, flame graphs and tables are drawn by
/// the script from `json`.
fn page(a: &Analysis, json: &str) -> Markup {
    let t = a.total();
    let ps = a.processes();
    let title = format!("Memory of {}", count(ps.len()));
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " - memtrace-merge report" }
                style { (PreEscaped(include_str!("report.css"))) }
                // (collects the errors of the scripts below, for the page's self-test)
                script { "window.reportErrors=[];window.addEventListener('error',function(e){reportErrors.push(String(e.message))});" }
            }
            body {
                header {
                    h1 { (title) }
                    p.totals {
                        (human_bytes(t.allocated_bytes)) " allocated, peak "
                        strong { (human_bytes(t.peak_bytes)) }
                        " at " (since(a, t.peak_time_us.unwrap_or(0)))
                        ", " (human_bytes(t.end_bytes)) " live at the end, over "
                        (since(a, t.last_time_us.unwrap_or(0)))
                        " (sizes are estimates: samples / rate x word size)"
                    }
                    (window_note(a))
                    @for w in a.warnings() { p.warning { "warning: " (w) } }
                }
                (run_section(a, &ps))
                section #heap {
                    h2 { "Live heap over time" }
                    p.hint {
                        "Each process's largest live heap in each step, stacked (after its trace ends, \
                         what it left live). Click a process in the legend to hide or show it; hover \
                         for the values."
                    }
                    div #chart {}
                    div #legend {}
                }
                (flames_section())
                (sites_section())
                footer { "memtrace-merge " (env!("CARGO_PKG_VERSION")) " report" }
                script #data type="application/json" { (PreEscaped(json)) }
                pre #selftest hidden {}
                script { (PreEscaped(include_str!("report.js"))) }
                script { (PreEscaped(include_str!("report-selftest.js"))) }
            }
        }
    }
}

/// What `--from`/`--to` kept, if they were given, and the other filters.
fn window_note(a: &Analysis) -> Markup {
    html! {
        (time_window(a))
        (other_filters(a))
    }
}

/// The filters but the time window, in words, if any was given.
fn other_filters(a: &Analysis) -> Markup {
    let f = a.filter();
    let mut kept: Vec<String> = Vec::new();
    if !f.pids.is_empty() {
        let pids: Vec<String> = f.pids.iter().map(u64::to_string).collect();
        kept.push(format!("pid {}", pids.join(", ")));
    }
    if let Some(d) = f.domain {
        kept.push(format!("domain {d}"));
    }
    if let Some(s) = f.source {
        kept.push(format!("{s:?} allocations").to_lowercase());
    }
    if let Some(m) = f.min_size {
        kept.push(format!("blocks of at least {m} bytes"));
    }
    if let Some(m) = f.max_size {
        kept.push(format!("blocks of at most {m} bytes"));
    }
    if kept.is_empty() {
        return html! {};
    }
    html! {
        p.window #filters {
            "Only " strong { (kept.join("; ")) } ": every view counts these allocations alone."
        }
    }
}

/// What `--from`/`--to` kept, if they were given.
fn time_window(a: &Analysis) -> Markup {
    let (from, to) = a.window_us();
    let when = match (from, to) {
        (None, None) => return html! {},
        (Some(f), None) => format!("from {} on", since(a, f)),
        (None, Some(e)) => format!("up to {}", since(a, e)),
        (Some(f), Some(e)) => format!("from {} to {}", since(a, f), since(a, e)),
    };
    html! {
        p.window #window {
            "Time window: " strong { (when) } ". Every view is of it: allocations in it, peaks sought in it, \
             its end the end, the chart cut to it."
        }
    }
}

/// The processes, sorted by start, the run's total first.
fn run_section(a: &Analysis, ps: &[ProcessSummary]) -> Markup {
    let mut order: Vec<&ProcessSummary> = ps.iter().collect();
    order.sort_by_key(|p| (p.start_us, p.pid));
    let t = a.total();
    let duration = |p: &ProcessSummary| {
        let end = p.last_time_us.unwrap_or(p.start_us);
        format!("{:.3} s", end.saturating_sub(p.start_us) as f64 / 1e6)
    };
    html! {
        section #run {
            h2 { "The run" }
            div.scroll {
                table #processes {
                    thead { tr {
                        th { "pid" } th { "trace" } th { "executable" } th { "context" } th { "host" }
                        th.num { "rate" } th.num { "start" } th.num { "duration" }
                        th.num { "allocated" } th.num { "peak" } th.num { "peak at" }
                        th.num { "at end" } th { "warnings" }
                    } }
                    tbody {
                        tr.total {
                            td { "all" } td colspan="4" { (count(ps.len())) }
                            td {} td.num { (since(a, t.start_us)) } td.num { (duration(&t)) }
                            td.num { (human_bytes(t.allocated_bytes)) }
                            td.num { (human_bytes(t.peak_bytes)) }
                            td.num { (since(a, t.peak_time_us.unwrap_or(0))) }
                            td.num { (human_bytes(t.end_bytes)) }
                            td { (order.iter().map(|p| p.warnings.len()).sum::<usize>()) }
                        }
                        @for p in order {
                            tr.process.warned[!p.warnings.is_empty()] {
                                td { (p.pid) }
                                td title=(p.file.display()) { (file_name(p)) }
                                td title=(p.executable) { (exe(p)) }
                                td { (p.context.as_deref().unwrap_or("")) } td { (p.host) }
                                td.num { (format!("{:e}", p.sample_rate)) }
                                td.num { (since(a, p.start_us)) } td.num { (duration(p)) }
                                td.num { (human_bytes(p.allocated_bytes)) }
                                td.num { (human_bytes(p.peak_bytes)) }
                                td.num { (p.peak_time_us.map_or("-".into(), |w| since(a, w))) }
                                td.num { (human_bytes(p.end_bytes)) }
                                td.warnings { (warnings(p)) }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// A view's two selectors: which mode (`{what}-mode`), of whom (`{what}-subject`).
fn selectors(what: &str, words: &str) -> Markup {
    html! {
        label { (words) " " select id=(format!("{what}-mode")) {} }
        label { " of " select id=(format!("{what}-subject")) {} }
    }
}

fn flames_section() -> Markup {
    html! {
        section #flames {
            h2 { "Flame graphs" }
            p.hint {
                "Click a frame to zoom, Ctrl-F (or the Search button) to search. Processes: the \
                 run's largest at their peak."
            }
            div.controls { (selectors("flame", "Show")) }
            div #flame {}
        }
    }
}

fn sites_section() -> Markup {
    html! {
        section #sites {
            h2 { "Top sites" }
            p.hint { "The allocating functions. Click a column to sort, a row to see its callers." }
            div.controls {
                (selectors("sites", "Bytes"))
                label { " search " input #sites-search type="search" placeholder="function or file"; }
                span #sites-count {}
            }
            div.scroll.tall { table #sites-table {} }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A row shows three warnings, the rest behind a click, each without the file's name.
    #[test]
    fn a_row_shows_three_warnings_and_folds_the_rest() {
        let p = ProcessSummary {
            file: "dir/w.ctf".into(),
            warnings: (1..=5)
                .map(|i| format!("dir/w.ctf: byte {i}: odd"))
                .collect(),
            ..ProcessSummary::default()
        };
        let html = warnings(&p).into_string();
        let (shown, folded) = html.split_once("<details>").unwrap();
        assert_eq!(
            shown,
            "<div>byte 1: odd</div><div>byte 2: odd</div><div>byte 3: odd</div>"
        );
        assert!(folded.starts_with("<summary>2 more</summary><div>byte 4: odd</div>"));
        let few = ProcessSummary {
            warnings: vec!["elsewhere: x".into()],
            ..p
        };
        assert_eq!(warnings(&few).into_string(), "<div>elsewhere: x</div>");
    }
}
