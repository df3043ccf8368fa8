//! `memtrace-merge report`'s page: one file with all it needs (its data held against the
//! analysis), then opened in headless Chromium, whose self-test (`#selftest`) works the
//! page as a person would: the chart's series and peaks, toggling a process, hovering,
//! every flame graph zoomed and searched, every table filled, searched, sorted, expanded.
//! The browser tests skip with a note where `chromium` is absent; each leaves a screenshot
//! in the target directory (`tmp/report-*.png`).

use memtrace_merge::analysis::{analyze, AnalysisOptions, By, Mode};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

fn data(p: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(p)
}

fn out_dir() -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join("report");
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Run `report -o OUT ARGS...`, return the page.
fn report(out: &Path, args: &[&Path], extra: &[&str]) -> String {
    let o = Command::new(env!("CARGO_BIN_EXE_memtrace-merge"))
        .arg("report")
        .arg("-o")
        .arg(out)
        .args(extra)
        .args(args)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    std::fs::read_to_string(out).unwrap()
}

/// The page's embedded data.
fn page_data(html: &str) -> Value {
    let open = r#"<script id="data" type="application/json">"#;
    let i = html.find(open).expect("the data") + open.len();
    let j = i + html[i..].find("</script>").unwrap();
    serde_json::from_str(&html[i..j]).unwrap()
}

/// A run of one process, killed by its parent (OCaml 5, 4 domains).
#[test]
fn a_killed_process_page_works_in_a_browser() {
    let Some(exe) = chromium() else { return };
    let page = out_dir().join("report-killed.html");
    report(&page, &[&data("ocaml5/handover/child-killed.ctf")], &[]);
    check_selftest(&browse(exe, &page), 1);
}

/// The damaged set: fork/ with child-2's trace cut short (`truncated.ctf`).
fn damaged() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = ["parent", "child-1", "child-3", "child-4"]
        .iter()
        .map(|n| data(&format!("fork/{n}.ctf")))
        .collect();
    v.push(data("truncated.ctf"));
    v
}

/// One file, nothing fetched: no external script, style, image or link; the data is the
/// analysis's.
#[test]
fn the_page_is_self_contained_and_holds_the_analysis() {
    let html = report(&out_dir().join("fork.html"), &[&data("fork")], &[]);
    assert!(html.starts_with("<!DOCTYPE html>"));
    for bad in [
        "<link",
        "src=\"http",
        "src='http",
        "href=\"http",
        "url(http",
        "@import",
    ] {
        assert!(!html.contains(bad), "the page holds {bad}");
    }
    let a = analyze(&[data("fork")], &AnalysisOptions::default()).unwrap();
    let ps = a.processes();
    let d = page_data(&html);
    assert_eq!(d["processes"], 5);
    // the run's table: a row per process, the total first
    assert_eq!(html.matches("<tr class=\"process").count(), 5);
    for p in &ps {
        assert!(html.contains(&format!("<td>{}</td>", p.pid)));
    }
    let chart = &d["chart"];
    let series = chart["series"].as_array().unwrap();
    assert_eq!(series.len(), 5);
    assert_eq!(chart["peak"][1], a.total().peak_bytes);
    for s in series {
        let p = (ps.iter())
            .find(|p| {
                s["label"]
                    .as_str()
                    .unwrap()
                    .starts_with(&format!("pid {} ", p.pid))
            })
            .unwrap();
        assert_eq!(s["peak"][1], p.peak_bytes);
        let largest = s["values"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap());
        assert_eq!(largest.max(), Some(p.peak_bytes));
    }
    // 3 modes x (the run + 5 processes)
    let flames = d["flames"].as_array().unwrap();
    assert_eq!(flames.len(), 18);
    assert!(flames
        .iter()
        .all(|f| f["svg"].as_str().unwrap().starts_with("<svg")));
    let peak = &d["sites"]["peak"][0];
    let top = a.top(Mode::Peak, By::Function, false);
    assert_eq!(peak["whole"], a.total().peak_bytes);
    assert_eq!(peak["rows"].as_array().unwrap().len(), top.sites.len());
    assert_eq!(peak["rows"][0]["v"], top.sites[0].value);
    let callers: u64 = (peak["rows"][0]["c"].as_array().unwrap().iter())
        .map(|c| c[1].as_u64().unwrap())
        .sum();
    assert_eq!(callers, top.sites[0].value);
}

/// `--from/--to` are said, and cut the chart; `--sites`, `--processes` and `--series` bound
/// the rest.
#[test]
fn the_window_and_the_bounds_are_kept() {
    let out = out_dir().join("window.html");
    let window = ["--from", "1", "--to", "2.5"];
    let bounds = ["--sites", "3", "--processes", "2", "--series", "2"];
    let html = report(&out, &[&data("fork")], &[&window[..], &bounds[..]].concat());
    assert!(html.contains("id=\"window\""));
    assert!(html.contains("Time window: <strong>from +1.000 s to +2.500 s</strong>"));
    assert!(
        !html.contains("id=\"filters\""),
        "no other filter was given"
    );
    // the other filters are said too
    let others = ["--pid", "14497", "--source", "major", "--min-size", "1000"];
    let filtered = report(&out, &[&data("fork")], &others);
    assert!(filtered.contains(
        "Only <strong>pid 14497; major allocations; blocks of at least 1000 bytes</strong>"
    ));
    let d = page_data(&html);
    let c = &d["chart"];
    let (t0, step) = (c["t0"].as_f64().unwrap(), c["step"].as_f64().unwrap());
    let n = c["total"].as_array().unwrap().len() as f64;
    assert!(t0 <= 1.0 && t0 + step > 1.0, "{t0} {step}");
    assert!(
        t0 + n * step >= 2.5 && t0 + (n - 1.0) * step <= 2.5,
        "{t0} {step} {n}"
    );
    assert_eq!(d["subjects"].as_array().unwrap().len(), 3);
    for t in d["sites"]["alloc"].as_array().unwrap() {
        assert!(t["rows"].as_array().unwrap().len() <= 3);
    }
    assert!(d["sites"]["alloc"][0]["more"].as_u64().unwrap() > 0);
    // the 2 largest processes apart, the 3 others summed
    let all = page_data(&report(&out, &[&data("fork")], &window));
    let (series, apart) = (&all["chart"]["series"], c["series"].as_array().unwrap());
    assert_eq!(apart.len(), 3);
    assert_eq!(apart[2]["label"], "3 other processes");
    let shown: Vec<&Value> = apart[..2].iter().map(|s| &s["label"]).collect();
    for k in 0..n as usize {
        let others: u64 = (series.as_array().unwrap().iter())
            .filter(|s| !shown.contains(&&s["label"]))
            .map(|s| s["values"][k].as_u64().unwrap())
            .sum();
        assert_eq!(apart[2]["values"][k], others, "step {k}");
    }
    let whole = report(&out, &[&data("fork")], &[]);
    assert!(!whole.contains("id=\"window\""));
}

/// Headless Chromium, when there is one.
fn chromium() -> Option<&'static str> {
    let found = Command::new("chromium").arg("--version").output();
    if found.is_ok_and(|o| o.status.success()) {
        Some("chromium")
    } else {
        eprintln!("note: chromium is absent; skipping the browser test");
        None
    }
}

/// Load `page` in headless Chromium: its self-test's findings, and a screenshot saved
/// beside it.
fn browse(exe: &str, page: &Path) -> Value {
    let url = format!("file://{}", page.display());
    let profile = tempfile::tempdir().unwrap();
    let run = |args: &[String]| {
        let o = Command::new("timeout")
            .arg("120")
            .arg(exe)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--hide-scrollbars",
            ])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg("--virtual-time-budget=5000")
            .args(args)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8(o.stdout).unwrap()
    };
    let png = page.with_extension("png");
    run(&[
        format!("--screenshot={}", png.display()),
        "--window-size=1400,2400".into(),
        url.clone(),
    ]);
    assert!(std::fs::metadata(&png).unwrap().len() > 10_000);
    let dom = run(&["--dump-dom".into(), format!("{url}#selftest")]);
    let open = "<pre id=\"selftest\">";
    let i = dom.find(open).expect("the self-test wrote nothing") + open.len();
    let j = i + dom[i..].find("</pre>").unwrap();
    let text = dom[i..j]
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&amp;", "&");
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

/// What every page's self-test must have found, for `processes` processes.
fn check_selftest(r: &Value, processes: u64) {
    // (the run, then each process; one process's own views would be the run's)
    let subjects = if processes == 1 { 1 } else { processes + 1 };
    assert_eq!(r["errors"], serde_json::json!([]), "{r}");
    assert!(r.get("exception").is_none(), "{r}");
    assert_eq!(r["processes"], processes);
    assert_eq!(r["process_rows"], processes);
    // one area and one peak marker per process, the combined peak marked
    assert_eq!(r["series"], processes, "{r}");
    assert_eq!(r["series_expected"], processes);
    assert_eq!(r["process_peaks"], processes);
    assert_eq!(r["combined_peak"], 1);
    // a click in the legend hides a process, another shows it again
    assert_eq!(r["legend"], processes);
    assert_eq!(r["series_hidden"], processes - 1);
    assert_eq!(r["legend_off"], 1);
    assert_eq!(r["series_shown_again"], processes);
    let hover = r["hover"].as_str().unwrap();
    assert!(
        hover.contains("all: ") && hover.contains(" s to +"),
        "{hover}"
    );
    // every table of the run and of each process has rows at allocated and at the peak
    for m in ["alloc", "peak"] {
        let counts = r["tables"][m].as_array().unwrap();
        assert_eq!(counts.len() as u64, subjects);
        assert!(
            counts.iter().all(|c| c.as_u64().unwrap() > 0),
            "{m}: {counts:?}"
        );
    }
    let s = &r["search"];
    let (all, found) = (s["all"].as_u64().unwrap(), s["found"].as_u64().unwrap());
    assert!(found >= 1 && found < all, "{s}");
    assert_eq!(s["none"], 0);
    assert_eq!(s["cleared"], all);
    assert!(r["callers"].as_u64().unwrap() >= 1);
    assert_eq!(r["sorted_by_samples"], true);
    // every flame graph that has bytes: drawn, zoomed by a click, searched
    let flames = r["flames"].as_array().unwrap();
    assert_eq!(flames.len() as u64, 3 * subjects);
    let drawn: Vec<&Value> = flames.iter().filter(|f| f.get("empty").is_none()).collect();
    assert!(drawn.len() as u64 >= 2 * subjects, "{flames:?}");
    for f in drawn {
        assert!(f["frames"].as_u64().unwrap() > 1, "{f}");
        assert_eq!(f["errors"], serde_json::json!([]), "{f}");
        assert_eq!(f["zoomed"], true, "{f}");
        assert!(
            f["matched"].as_str().unwrap().starts_with("Matched: "),
            "{f}"
        );
    }
}

#[test]
fn the_fork_page_works_in_a_browser() {
    let Some(exe) = chromium() else { return };
    let page = out_dir().join("report-fork.html");
    report(&page, &[&data("fork")], &[]);
    let r = browse(exe, &page);
    check_selftest(&r, 5);
    assert_eq!(r["search"]["all"], 47);
}

#[test]
fn a_damaged_run_page_works_in_a_browser() {
    let Some(exe) = chromium() else { return };
    let page = out_dir().join("report-damaged.html");
    let inputs = damaged();
    let refs: Vec<&Path> = inputs.iter().map(PathBuf::as_path).collect();
    let html = report(&page, &refs, &["--no-warnings"]);
    // the cut trace's warning is in its row
    assert!(html.contains("<tr class=\"process warned\">"));
    assert!(html.contains("<div>byte 87099 (packet 8): skipping truncated packet"));
    let r = browse(exe, &page);
    check_selftest(&r, 5);
}
