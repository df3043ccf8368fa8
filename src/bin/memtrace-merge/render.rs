//! Reports as the command line prints them: text tables for a terminal (sizes in KiB, MiB,
//! times in seconds since the start) and JSON objects of a documented, stable schema.

use memtrace_merge::analysis::{Analysis, Frame, Mode, ProcessSummary, SiteRow, Timeline, Top};
use serde_json::{json, Value};
use std::fmt::Write;

/// Bytes for a person: `512 B`, `12.3 KiB`, `4.0 MiB`, `1.2 GiB`.
pub fn size(b: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if b < 1024 {
        return format!("{b} B");
    }
    let mut v = b as f64 / 1024.0;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    format!("{v:.1} {}", UNITS[u])
}

/// A time as seconds since `start_us`: `+1.234 s`.
pub fn since(t_us: u64, start_us: u64) -> String {
    since_to(t_us, start_us, 3)
}

/// [`since`] with `decimals` decimals of a second.
fn since_to(t_us: u64, start_us: u64, decimals: usize) -> String {
    format!(
        "+{:.*} s",
        decimals,
        t_us.saturating_sub(start_us) as f64 / 1e6
    )
}

/// Decimals of a second that tell steps of `step_us` apart: 3, or more for a step that is
/// not a whole millisecond (1.5 ms: 4).
fn step_decimals(step_us: u64) -> usize {
    let mut d = 6;
    let mut s = step_us.max(1);
    while d > 3 && s.is_multiple_of(10) {
        s /= 10;
        d -= 1;
    }
    d
}

/// What a mode measures, in words: "live at the peak of the run (45.3 MiB at +1.234 s)".
pub fn mode_phrase(a: &Analysis, mode: Mode) -> String {
    mode_words(mode, &a.total(), a.start_us(), a.at_us())
}

fn mode_words(mode: Mode, total: &ProcessSummary, start_us: u64, at_us: Option<u64>) -> String {
    match mode {
        Mode::Alloc => "allocated".into(),
        Mode::Peak => format!(
            "live at the peak of the run ({} at {})",
            size(total.peak_bytes),
            since(total.peak_time_us.unwrap_or(0), start_us)
        ),
        Mode::End => "live at the end (never collected)".into(),
        Mode::At => format!("live at {}", since(at_us.unwrap_or(0), start_us)),
    }
}

/// The inputs, in words: "5 processes: parent.ctf (pid 1), ...".
pub fn inputs_phrase(a: &Analysis) -> String {
    let ps = a.processes();
    let names: Vec<String> = (ps.iter().take(4))
        .map(|p| format!("pid {} ({})", p.pid, exe(p)))
        .collect();
    let more = if ps.len() > 4 {
        format!(", {} more", ps.len() - 4)
    } else {
        String::new()
    };
    let s = if ps.len() == 1 { "" } else { "es" };
    format!("{} process{s}: {}{more}", ps.len(), names.join(", "))
}

fn exe(p: &ProcessSummary) -> &str {
    p.executable.rsplit('/').next().unwrap_or("")
}

fn mode_name(m: Mode) -> &'static str {
    match m {
        Mode::Alloc => "alloc",
        Mode::Peak => "peak",
        Mode::End => "end",
        Mode::At => "at",
    }
}

fn by_name(b: memtrace_merge::analysis::By) -> &'static str {
    use memtrace_merge::analysis::By;
    match b {
        By::Function => "function",
        By::Location => "location",
        By::Backtrace => "backtrace",
    }
}

/// A site's frames as a table names them: the allocating frame first, then each caller
/// (`site <- caller <- its caller`); the frames are caller first.
fn site_words(frames: &[Frame]) -> String {
    let words: Vec<String> = frames.iter().rev().map(|f| f.to_string()).collect();
    words.join(" <- ")
}

/// `top`'s text: the run, each process, the sites table(s).
pub fn top_text(t: &Top, n: usize) -> String {
    let mut o = String::new();
    let tot = &t.total;
    let s = if t.processes.len() == 1 { "" } else { "es" };
    let _ = writeln!(
        o,
        "{} process{s}, {} allocations sampled: {} allocated, peak {} at {}, {} live at the end",
        t.processes.len(),
        tot.allocations,
        size(tot.allocated_bytes),
        size(tot.peak_bytes),
        since(tot.peak_time_us.unwrap_or(0), t.start_us),
        size(tot.end_bytes)
    );
    let _ = writeln!(o, "(sizes are estimates: samples / rate x word size)\n");
    let peaks_at: Vec<String> = (t.processes.iter())
        .map(|p| since(p.peak_time_us.unwrap_or(0), t.start_us))
        .collect();
    // (as wide as the latest time: runs of more than 1,000 s, or far apart)
    let w = peaks_at.iter().map(|s| s.len()).max().unwrap_or(0).max(10);
    let _ = writeln!(
        o,
        "{:>8} {:<20} {:>10} {:>10} {:>w$} {:>10}  file",
        "pid", "executable", "allocated", "peak", "peak at", "at end"
    );
    for (p, at) in t.processes.iter().zip(&peaks_at) {
        let _ = writeln!(
            o,
            "{:>8} {:<20} {:>10} {:>10} {:>w$} {:>10}  {}",
            p.pid,
            exe(p),
            size(p.allocated_bytes),
            size(p.peak_bytes),
            at,
            size(p.end_bytes),
            p.file.display()
        );
    }
    let what = mode_words(t.mode, tot, t.start_us, t.at_us);
    let whole = match t.mode {
        Mode::Alloc => tot.allocated_bytes,
        Mode::Peak => tot.peak_bytes,
        Mode::End => tot.end_bytes,
        Mode::At => t.sites.iter().map(|r| r.value).sum(),
    };
    let _ = writeln!(o, "\nTop sites by bytes {what}, by {}:", by_name(t.by));
    sites_table(&mut o, &t.sites, n, whole);
    // (one process's own table is the run's)
    let own = if t.processes.len() > 1 {
        &t.process_sites[..]
    } else {
        &[]
    };
    for (p, rows) in t.processes.iter().zip(own) {
        let (what, whole) = match t.mode {
            Mode::Peak => (
                format!(
                    "live at its own peak ({} at {})",
                    size(p.peak_bytes),
                    since(p.peak_time_us.unwrap_or(0), t.start_us)
                ),
                p.peak_bytes,
            ),
            Mode::Alloc => ("allocated".into(), p.allocated_bytes),
            Mode::End => ("live at the end".into(), p.end_bytes),
            Mode::At => (what.clone(), rows.iter().map(|r| r.value).sum()),
        };
        let _ = writeln!(o, "\npid {} ({}): bytes {what}:", p.pid, exe(p));
        sites_table(&mut o, rows, n, whole);
    }
    o
}

fn sites_table(o: &mut String, rows: &[SiteRow], n: usize, whole: u64) {
    let _ = writeln!(
        o,
        "{:>10} {:>6} {:>10} {:>9}  site",
        "bytes", "%", "allocated", "samples"
    );
    for r in rows.iter().take(n) {
        let pct = if whole > 0 {
            100.0 * r.value as f64 / whole as f64
        } else {
            0.0
        };
        let site = site_words(&r.frames);
        let _ = writeln!(
            o,
            "{:>10} {:>5.1}% {:>10} {:>9}  {}",
            size(r.value),
            pct,
            size(r.allocated_bytes),
            r.samples,
            site
        );
    }
    if rows.len() > n {
        let rest: u64 = rows[n..].iter().map(|r| r.value).sum();
        let _ = writeln!(o, "{:>10} in {} more sites", size(rest), rows.len() - n);
    }
    if rows.is_empty() {
        let _ = writeln!(o, "{:>10}  (no site)", "-");
    }
}

fn frames_json(frames: &[memtrace_merge::analysis::Frame]) -> Value {
    (frames.iter())
        .map(|f| {
            json!({
                "function": f.function,
                "file": f.file,
                "line": f.line,
                "columns": [f.columns.0, f.columns.1],
            })
        })
        .collect()
}

fn site_json(r: &SiteRow) -> Value {
    json!({
        "frames": frames_json(&r.frames),
        "value": r.value,
        "allocated_bytes": r.allocated_bytes,
        "allocated_objects": r.allocated_objects.round() as u64,
        "samples": r.samples,
        "peak_bytes": r.peak_bytes,
        "end_bytes": r.end_bytes,
    })
}

/// A process's (or the run's) figures.
fn figures_json(p: &ProcessSummary, start_us: u64) -> serde_json::Map<String, Value> {
    let v = json!({
        "allocations": p.allocations,
        "samples": p.samples,
        "allocated_bytes": p.allocated_bytes,
        "allocated_objects": p.allocated_objects.round() as u64,
        "peak_bytes": p.peak_bytes,
        "peak_time_us": p.peak_time_us,
        "peak_offset_s": p.peak_time_us.map(|t| t.saturating_sub(start_us) as f64 / 1e6),
        "end_bytes": p.end_bytes,
        "last_time_us": p.last_time_us,
    });
    match v {
        Value::Object(m) => m,
        _ => unreachable!("json! of an object"),
    }
}

fn process_json(p: &ProcessSummary, start_us: u64) -> Value {
    let mut m = match json!({
        "file": p.file,
        "pid": p.pid,
        "executable": p.executable,
        "host": p.host,
        "context": p.context,
        "start_time_us": p.start_us,
        "sample_rate": p.sample_rate,
    }) {
        Value::Object(m) => m,
        _ => unreachable!("json! of an object"),
    };
    m.extend(figures_json(p, start_us));
    m.insert("warnings".into(), json!(p.warnings));
    Value::Object(m)
}

/// `top --json`: schema `memtrace-merge.top/1` (README, "JSON").
pub fn top_json(t: &Top, n: usize) -> String {
    let total = Value::Object(figures_json(&t.total, t.start_us));
    let processes: Vec<Value> = (t.processes.iter().zip(&t.process_sites))
        .map(|(p, rows)| {
            let mut v = process_json(p, t.start_us);
            v["sites"] = rows.iter().take(n).map(site_json).collect();
            v["sites_left_out"] = json!(rows.len().saturating_sub(n));
            v
        })
        .collect();
    let v = json!({
        "schema": "memtrace-merge.top/1",
        "mode": mode_name(t.mode),
        "by": by_name(t.by),
        "start_time_us": t.start_us,
        "at_time_us": t.at_us,
        "total": total,
        "processes": processes,
        "sites": t.sites.iter().take(n).map(site_json).collect::<Vec<_>>(),
        "sites_left_out": t.sites.len().saturating_sub(n),
    });
    let mut s = serde_json::to_string_pretty(&v).unwrap_or_default();
    s.push('\n');
    s
}

/// At most `max` rows: consecutive steps joined, each keeping its largest values.
fn coarse(rows: &[(u64, Vec<u64>)], max: usize) -> (usize, Vec<(u64, Vec<u64>)>) {
    let k = rows.len().div_ceil(max.max(1)).max(1);
    let out = (rows.chunks(k))
        .map(|c| {
            let mut r = c[0].clone();
            for x in &c[1..] {
                r.0 = r.0.max(x.0);
                r.1.resize(r.1.len().max(x.1.len()), 0);
                for (a, b) in r.1.iter_mut().zip(&x.1) {
                    *a = (*a).max(*b);
                }
            }
            r
        })
        .collect();
    (k, out)
}

/// The marks of a step (of `step_us` from `t0`): `*` the run's peak, `pid` a process's own.
fn marks(tl: &Timeline, t0: u64, step_us: u64) -> Vec<String> {
    let inside = |t: Option<u64>| t.is_some_and(|t| t >= t0 && t < t0 + step_us);
    let mut m = Vec::new();
    if inside(tl.total.peak_time_us) {
        m.push("peak".to_string());
    }
    for p in &tl.processes {
        if inside(p.peak_time_us) {
            m.push(format!("peak:{}", p.pid));
        }
    }
    m
}

/// `timeline`'s text: the peaks, then a row per step (at most 40 unless a step was given).
pub fn timeline_text(tl: &Timeline, coarsen: bool) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "peak of the run: {} at {}",
        size(tl.total.peak_bytes),
        since(tl.total.peak_time_us.unwrap_or(0), tl.start_us)
    );
    for p in &tl.processes {
        let _ = writeln!(
            o,
            "pid {:>7} ({}): peak {} at {}, {} at the end",
            p.pid,
            exe(p),
            size(p.peak_bytes),
            since(p.peak_time_us.unwrap_or(0), tl.start_us),
            size(p.end_bytes)
        );
    }
    let (k, rows) = if coarsen {
        coarse(&tl.rows, 40)
    } else {
        (1, tl.rows.clone())
    };
    let step = tl.step_us * k as u64;
    let decimals = step_decimals(step);
    let _ = writeln!(
        o,
        "\nlargest live heap in each step of {:.*} s:",
        decimals,
        step as f64 / 1e6
    );
    // (a step of `step` starts where the first kept step does: coarse steps join the kept
    // ones from there)
    let from = tl.start_us + tl.first_step as u64 * tl.step_us;
    // (as wide as the last step's start: runs of more than 1,000 s, or far apart)
    let last = from + rows.len().saturating_sub(1) as u64 * step;
    let w = since_to(last, tl.start_us, decimals).len().max(10);
    let _ = write!(o, "{:>w$} {:>10}", "from", "all");
    for p in &tl.processes {
        let _ = write!(o, " {:>10}", format!("pid {}", p.pid));
    }
    let _ = writeln!(o);
    for (i, (total, ps)) in rows.iter().enumerate() {
        let t0 = from + i as u64 * step;
        let _ = write!(
            o,
            "{:>w$} {:>10}",
            since_to(t0, tl.start_us, decimals),
            size(*total)
        );
        for j in 0..tl.processes.len() {
            let _ = write!(o, " {:>10}", size(ps.get(j).copied().unwrap_or(0)));
        }
        let m = marks(tl, t0, step);
        if !m.is_empty() {
            let _ = write!(o, "  <- {}", m.join(", "));
        }
        let _ = writeln!(o);
    }
    o
}

/// `timeline --csv`: `time_s,total,pid_N...,marks`, a row per step.
pub fn timeline_csv(tl: &Timeline) -> String {
    let mut o = String::from("time_s,total");
    for p in &tl.processes {
        let _ = write!(o, ",pid_{}", p.pid);
    }
    o.push_str(",marks\n");
    for (i, (total, ps)) in tl.rows.iter().enumerate() {
        let offset = (tl.first_step + i) as u64 * tl.step_us;
        let t0 = tl.start_us + offset;
        let _ = write!(o, "{:.6},{total}", offset as f64 / 1e6);
        for j in 0..tl.processes.len() {
            let _ = write!(o, ",{}", ps.get(j).copied().unwrap_or(0));
        }
        let _ = writeln!(o, ",{}", marks(tl, t0, tl.step_us).join(" "));
    }
    o
}

/// `timeline --json`: schema `memtrace-merge.timeline/1`.
pub fn timeline_json(tl: &Timeline) -> String {
    let v = json!({
        "schema": "memtrace-merge.timeline/1",
        "start_time_us": tl.start_us,
        "step_us": tl.step_us,
        "total": {
            "peak_bytes": tl.total.peak_bytes,
            "peak_time_us": tl.total.peak_time_us,
            "end_bytes": tl.total.end_bytes,
        },
        "processes": tl.processes.iter().map(|p| process_json(p, tl.start_us)).collect::<Vec<_>>(),
        "steps": [],
    });
    let mut s = serde_json::to_string_pretty(&v).unwrap_or_default();
    // (the steps, up to millions, written a line each rather than made values first: a
    // value a step takes many times the memory of its text)
    if let Some(at) = s.rfind("[]") {
        s.truncate(at);
        s.push('[');
        for (i, (total, ps)) in tl.rows.iter().enumerate() {
            let offset = ((tl.first_step + i) as u64 * tl.step_us) as f64 / 1e6;
            let offset = serde_json::to_string(&offset).unwrap_or_default();
            let _ = write!(
                s,
                "{}\n    {{\"offset_s\": {offset}, \"total_bytes\": {total}, \"process_bytes\": [",
                if i == 0 { "" } else { "," }
            );
            for j in 0..tl.processes.len() {
                let sep = if j == 0 { "" } else { ", " };
                let _ = write!(s, "{sep}{}", ps.get(j).copied().unwrap_or(0));
            }
            s.push_str("]}");
        }
        s.push_str(if tl.rows.is_empty() {
            "]\n}"
        } else {
            "\n  ]\n}"
        });
    }
    s.push('\n');
    s
}

fn signed(d: i64) -> String {
    let s = size(d.unsigned_abs());
    if d < 0 {
        format!("-{s}")
    } else if d > 0 {
        format!("+{s}")
    } else {
        s
    }
}

/// `diff`'s text: the runs' totals, then the sites that changed most.
pub fn diff_text(d: &memtrace_merge::analysis::Diff, n: usize) -> String {
    let mut o = String::new();
    let (a, b) = &d.totals;
    let _ = writeln!(
        o,
        "{:>22} {:>12} {:>12} {:>12}",
        "", "base", "new", "change"
    );
    for (what, x, y) in [
        ("allocated", a.allocated_bytes, b.allocated_bytes),
        ("peak", a.peak_bytes, b.peak_bytes),
        ("live at the end", a.end_bytes, b.end_bytes),
    ] {
        let _ = writeln!(
            o,
            "{what:>22} {:>12} {:>12} {:>12}",
            size(x),
            size(y),
            signed(y as i64 - x as i64)
        );
    }
    let _ = writeln!(
        o,
        "\nSites by change of bytes {}, by {}:",
        match d.mode {
            Mode::Alloc => "allocated",
            Mode::End => "live at the end",
            _ => "live at the peak",
        },
        by_name(d.by)
    );
    let _ = writeln!(
        o,
        "{:>11} {:>11} {:>11} {:>12}  site",
        "base", "new", "change", "alloc change"
    );
    let changed: Vec<_> = d.sites.iter().filter(|r| r.changed()).collect();
    for r in changed.iter().take(n) {
        let (x, y) = match d.mode {
            Mode::Alloc => r.allocated_bytes,
            Mode::End => r.end_bytes,
            _ => r.peak_bytes,
        };
        let site = site_words(&r.frames);
        let _ = writeln!(
            o,
            "{:>11} {:>11} {:>11} {:>12}  {}",
            size(x),
            size(y),
            signed(r.delta(d.mode)),
            signed(r.delta(Mode::Alloc)),
            site
        );
    }
    if changed.len() > n {
        let _ = writeln!(o, "{:>11} more sites changed", changed.len() - n);
    }
    if changed.is_empty() {
        let _ = writeln!(o, "{:>11}  (no site changed)", "-");
    }
    o
}

/// `diff --json`: schema `memtrace-merge.diff/1`.
pub fn diff_json(d: &memtrace_merge::analysis::Diff, n: usize) -> String {
    let pair = |(a, b): (u64, u64)| json!({"base": a, "new": b, "change": b as i64 - a as i64});
    let total = |p: &ProcessSummary| {
        json!({
            "allocated_bytes": p.allocated_bytes,
            "peak_bytes": p.peak_bytes,
            "end_bytes": p.end_bytes,
        })
    };
    let changed = d.sites.iter().filter(|r| r.changed()).count();
    let sites: Vec<Value> = (d.sites.iter())
        .filter(|r| r.changed())
        .take(n)
        .map(|r| {
            json!({
                "frames": frames_json(&r.frames),
                "allocated_bytes": pair(r.allocated_bytes),
                "peak_bytes": pair(r.peak_bytes),
                "end_bytes": pair(r.end_bytes),
            })
        })
        .collect();
    let v = json!({
        "schema": "memtrace-merge.diff/1",
        "mode": mode_name(d.mode),
        "by": by_name(d.by),
        "base": total(&d.totals.0),
        "new": total(&d.totals.1),
        "sites": sites,
        "sites_left_out": changed.saturating_sub(n),
    });
    let mut s = serde_json::to_string_pretty(&v).unwrap_or_default();
    s.push('\n');
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Steps that are not whole milliseconds get the decimals that tell them apart.
    #[test]
    fn a_step_is_written_to_its_last_digit() {
        for (step, d) in [
            (1000, 3),
            (2_000_000, 3),
            (1500, 4),
            (500, 4),
            (1, 6),
            (250, 5),
        ] {
            assert_eq!(step_decimals(step), d, "{step} µs");
        }
        assert_eq!(since_to(1_001_500, 1_000_000, 4), "+0.0015 s");
    }
}
