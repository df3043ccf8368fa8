//! The analysis commands as a user runs them: `top`, `timeline` and `flamegraph` print what
//! the library computes (JSON read back and held against it), and refuse as documented.

use memtrace_merge::analysis::{analyze, AnalysisOptions, By, Mode};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn data(p: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(p)
}

fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_memtrace-merge"))
        .args(args)
        .output()
        .unwrap()
}

fn stdout(args: &[&str]) -> String {
    let o = run(args);
    assert!(
        o.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap()
}

/// Run `args`, which must be refused with exit `code`: one line on stderr (returned),
/// nothing on stdout.
fn refused(args: &[&str], code: i32) -> String {
    let o = run(args);
    assert_eq!(o.status.code(), Some(code), "{args:?}");
    let err = String::from_utf8(o.stderr).unwrap();
    assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
    assert!(o.stdout.is_empty(), "{args:?}");
    err
}

fn fork() -> String {
    data("fork").display().to_string()
}

/// `top --json` holds the library's figures: the total, each process, the sites.
#[test]
fn top_json_is_the_analysis() {
    let j: Value = serde_json::from_str(&stdout(&[
        "top",
        "--json",
        "--mode",
        "peak",
        "-n",
        "5",
        &fork(),
    ]))
    .unwrap();
    let a = analyze(&[data("fork")], &AnalysisOptions::default()).unwrap();
    let t = a.top(Mode::Peak, By::Function, true);
    assert_eq!(j["schema"], "memtrace-merge.top/1");
    assert_eq!(j["total"]["peak_bytes"], t.total.peak_bytes);
    assert_eq!(j["total"]["peak_time_us"], t.total.peak_time_us.unwrap());
    assert_eq!(j["total"]["allocated_bytes"], t.total.allocated_bytes);
    assert_eq!(j["total"]["end_bytes"], t.total.end_bytes);
    let ps = j["processes"].as_array().unwrap();
    assert_eq!(ps.len(), 5);
    for ((p, q), rows) in ps.iter().zip(&t.processes).zip(&t.process_sites) {
        assert_eq!(p["pid"], q.pid);
        assert_eq!(p["peak_bytes"], q.peak_bytes);
        assert_eq!(p["end_bytes"], q.end_bytes);
        assert_eq!(p["allocated_bytes"], q.allocated_bytes);
        let shown = p["sites"].as_array().unwrap().len();
        assert!(shown <= 5);
        assert_eq!(
            shown as u64 + p["sites_left_out"].as_u64().unwrap(),
            rows.len() as u64
        );
    }
    let sites = j["sites"].as_array().unwrap();
    assert_eq!(sites.len(), 5);
    for (s, r) in sites.iter().zip(&t.sites) {
        assert_eq!(s["value"], r.value);
        assert_eq!(s["frames"][0]["function"], r.frames[0].function.as_str());
    }
    // the values are ranked, and the site values at the peak add up to the peak
    let values: Vec<u64> = sites.iter().map(|s| s["value"].as_u64().unwrap()).collect();
    assert!(values.windows(2).all(|w| w[0] >= w[1]));
    let all: u64 = t.sites.iter().map(|s| s.value).sum();
    assert_eq!(all, t.total.peak_bytes);
}

/// The text table names the top site and the peak; `-n` bounds the rows.
#[test]
fn top_text_ranks_sites() {
    let out = stdout(&["top", "--mode", "alloc", "-n", "3", &fork()]);
    let a = analyze(&[data("fork")], &AnalysisOptions::default()).unwrap();
    let t = a.top(Mode::Alloc, By::Function, false);
    let first = out.lines().position(|l| l.contains("  site")).unwrap() + 1;
    let rows: Vec<&str> = out.lines().skip(first).take(4).collect();
    assert!(
        rows[0].ends_with(&t.sites[0].frames[0].to_string()),
        "{out}"
    );
    assert!(rows[3].contains(&format!("in {} more sites", t.sites.len() - 3)));
    assert!(out.contains("5 processes, "));
}

/// The timeline's CSV: a column per process; each step's total is at least each process's
/// and at most their sum, and the run's peak is the largest total, marked once.
#[test]
fn timeline_csv_has_the_peaks() {
    let csv = stdout(&["timeline", "--csv", "--step", "50", &fork()]);
    let a = analyze(&[data("fork")], &AnalysisOptions::default()).unwrap();
    let mut lines = csv.lines();
    let head: Vec<&str> = lines.next().unwrap().split(',').collect();
    assert_eq!(head.len(), 2 + 5 + 1);
    let mut max = 0;
    let mut marked = 0;
    for l in lines {
        let f: Vec<&str> = l.split(',').collect();
        let total: u64 = f[1].parse().unwrap();
        let ps: Vec<u64> = f[2..7].iter().map(|v| v.parse().unwrap()).collect();
        assert!(ps.iter().all(|&p| p <= total) && total <= ps.iter().sum::<u64>());
        max = max.max(total);
        marked += f[7].split(' ').filter(|m| *m == "peak").count();
    }
    assert_eq!(max, a.total().peak_bytes);
    assert_eq!(marked, 1);
}

/// A flame graph is an SVG naming the top function; the folded stacks add up to the mode's
/// total; an output that is an input is refused and left alone.
#[test]
fn flamegraph_writes_svg_and_folded() {
    let dir = tempfile::tempdir().unwrap();
    let svg = dir.path().join("f.svg");
    let svg_s = svg.display().to_string();
    stdout(&["flamegraph", "-o", &svg_s, "--by-process", &fork()]);
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(text.starts_with("<?xml") && text.contains("pid 14495 (forkwork)"));
    assert!(text.contains("Forkwork.parent_step"));
    let folded = stdout(&[
        "flamegraph",
        "--folded",
        "--mode",
        "end",
        "-o",
        "-",
        &fork(),
    ]);
    let sum: u64 = (folded.lines())
        .map(|l| l.rsplit_once(' ').unwrap().1.parse::<u64>().unwrap())
        .sum();
    let a = analyze(&[data("fork")], &AnalysisOptions::default()).unwrap();
    assert_eq!(sum, a.total().end_bytes);
    let input = dir.path().join("in.ctf");
    std::fs::copy(data("fork/child-1.ctf"), &input).unwrap();
    let before = std::fs::read(&input).unwrap();
    let i = input.display().to_string();
    let o = run(&["flamegraph", "-o", &i, &i]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("refused"));
    assert_eq!(std::fs::read(&input).unwrap(), before);
}

/// Nothing to answer is exit 1 with one line; a malformed input is exit 2 naming it; a
/// damaged one is analysed up to the damage, with a warning.
#[test]
fn refusals_and_damage() {
    for (args, says) in [
        (vec!["top", "--mode", "at=99"], "--mode at=99"),
        (
            vec!["top", "--mode", "at=2", "--from", "3"],
            "outside the window from --from (+3.000000 to",
        ),
        (vec!["top", "--pid", "1"], "--pid"),
        (vec!["top", "--source", "external"], "filters"),
        // (the inputs hold events, but none the filter leaves)
        (vec!["top", "--domain", "5"], "(in domain 5)"),
        (vec!["top", "--to", "0"], "(up to --to)"),
        (
            vec!["top", "--mode", "at=2", "--to", "1"],
            "outside the trace up to --to",
        ),
    ] {
        let mut args = args.clone();
        let f = fork();
        args.push(&f);
        let err = refused(&args, 1);
        assert!(err.contains(says), "{args:?}: {err}");
    }
    // (a step so short that the timeline would hold millions of rows: refused at once, as
    // a usage error, before the pass ends)
    let err = refused(&["timeline", "--json", "--step", "0.001", &fork()], 2);
    assert!(
        err.contains("--step 0.001 ms") && err.contains("longer step"),
        "{err}"
    );
    // (usage errors are one line, as other refusals; a profile's in-use values are at a
    // time, and `alloc` is no such time)
    let f = fork();
    for (args, says) in [
        (
            vec!["export", "--mode", "alloc", "-o", "-", &f],
            "peak, end or at=T",
        ),
        (vec!["export", &f], "--output"),
        (vec!["top", "--min-size", "1K", &f], "'1K'"),
        (vec!["top", "--mode", "at=abc", &f], "at=T"),
        (
            vec!["top", "--from", "3", "--to", "2", &f],
            "the window is empty",
        ),
        (
            vec!["timeline", "--step", "0.0001", &f],
            "--step 0.0001: shorter",
        ),
    ] {
        let err = refused(&args, 2);
        assert!(err.contains(says), "{args:?}: {err}");
    }
    // (nothing readable: the damage is said in the one line)
    let overflow = data("bytecode-location-overflow.ctf");
    let err = refused(&["top", overflow.to_str().unwrap()], 1);
    assert!(
        err.contains("nothing to analyse") && err.contains("byte 280"),
        "{err}"
    );
    let t = data("truncated.ctf").display().to_string();
    let o = run(&["top", &t]);
    assert!(o.status.success());
    let err = String::from_utf8(o.stderr).unwrap();
    assert!(
        err.contains("warning: ") && err.contains("truncated.ctf"),
        "{err}"
    );
    assert_eq!(err.matches("truncated.ctf").count(), 1, "{err}");
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.ctf");
    std::fs::write(&bad, b"not a trace at all").unwrap();
    let err = refused(&["top", &fork(), bad.to_str().unwrap()], 2);
    assert!(err.contains("bad.ctf") && err.contains("byte 0"), "{err}");
}

/// `diff`: a run against itself changes nothing; two runs' site changes add up to the
/// change of their totals (allocated, at the peak, at the end), in text and JSON alike.
#[test]
fn diff_adds_up() {
    let c2 = data("fork/child-2.ctf").display().to_string();
    let c4 = data("fork/child-4.ctf").display().to_string();
    let same = stdout(&["diff", &c2, &c2]);
    assert!(same.contains("(no site changed)"), "{same}");
    for mode in ["alloc", "peak", "end"] {
        let j: Value = serde_json::from_str(&stdout(&[
            "diff", "--json", "-n", "100000", "--mode", mode, &c2, &c4,
        ]))
        .unwrap();
        assert_eq!(j["schema"], "memtrace-merge.diff/1");
        let key = format!("{mode}_bytes").replace("alloc_", "allocated_");
        let total = j["new"][&key].as_i64().unwrap() - j["base"][&key].as_i64().unwrap();
        let sites = j["sites"].as_array().unwrap();
        // (every changed site is listed, or counted as left out)
        assert_eq!(j["sites_left_out"], 0);
        let few: Value = serde_json::from_str(&stdout(&[
            "diff", "--json", "-n", "3", "--mode", mode, &c2, &c4,
        ]))
        .unwrap();
        assert_eq!(few["sites"].as_array().unwrap().len(), 3);
        assert_eq!(
            3 + few["sites_left_out"].as_u64().unwrap(),
            sites.len() as u64,
            "{mode}"
        );
        let sum: i64 = sites
            .iter()
            .map(|s| s[&key]["change"].as_i64().unwrap())
            .sum();
        assert_eq!(sum, total, "{mode}");
        let changes: Vec<u64> = (sites.iter())
            .map(|s| s[&key]["change"].as_i64().unwrap().unsigned_abs())
            .collect();
        assert!(changes.windows(2).all(|w| w[0] >= w[1]), "{mode}: ranked");
    }
    // (every figure's site changes add up to its total change, whichever ranks them:
    // a site whose ranked figure is unchanged is listed for the others)
    for mode in ["alloc", "peak", "end"] {
        let j: Value = serde_json::from_str(&stdout(&[
            "diff", "--json", "-n", "100000", "--mode", mode, &c2, &c4,
        ]))
        .unwrap();
        for key in ["allocated_bytes", "peak_bytes", "end_bytes"] {
            let total = j["new"][key].as_i64().unwrap() - j["base"][key].as_i64().unwrap();
            let sum: i64 = (j["sites"].as_array().unwrap().iter())
                .map(|s| s[key]["change"].as_i64().unwrap())
                .sum();
            assert_eq!(sum, total, "--mode {mode}: {key}");
        }
    }
    // (a run the filters leave nothing of is a run of nothing: child-2 alone under its
    // own pid, against child-4 of another)
    let o = run(&["diff", "--json", "--pid", "14497", &c2, &c4]);
    assert!(o.status.success());
    let err = String::from_utf8(o.stderr).unwrap();
    assert!(
        err.contains("warning: new") && err.contains("taken as nothing"),
        "{err}"
    );
    let j: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["new"]["allocated_bytes"], 0);
    let alone: Value = serde_json::from_str(&stdout(&["top", "--json", &c2])).unwrap();
    assert_eq!(
        j["base"]["allocated_bytes"],
        alone["total"]["allocated_bytes"]
    );
    let o = run(&["diff", "--pid", "1", &c2, &c4]);
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8(o.stderr).unwrap();
    assert!(err.contains("nothing to compare"), "{err}");
}

/// An output that cannot be written is refused before the inputs are read, as a merge's is:
/// here the input is a FIFO no one writes to, which a reading command would wait on.
#[test]
fn an_unwritable_output_is_refused_before_any_work() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("in.ctf");
    let st = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(st.success());
    for cmd in ["flamegraph", "export", "report"] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_memtrace-merge"))
            .args([cmd, "-o", "/nonexistent-dir/out"])
            .arg(&fifo)
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let t0 = std::time::Instant::now();
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break s;
            }
            if t0.elapsed() > std::time::Duration::from_secs(10) {
                let _ = child.kill();
                panic!("{cmd}: still waiting on its input after 10 s");
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        };
        assert_eq!(status.code(), Some(2), "{cmd}");
        let mut err = String::new();
        std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
        assert!(err.contains("/nonexistent-dir/out"), "{cmd}: {err}");
    }
}

/// An output that is a trace of an input directory (by its name, or through a link) is
/// refused before any work and left as it was; a new file there is written.
#[test]
fn a_trace_of_an_input_directory_is_no_output() {
    let dir = tempfile::tempdir().unwrap();
    let traces = dir.path().join("traces");
    std::fs::create_dir(&traces).unwrap();
    for f in ["child-1.ctf", "child-2.ctf"] {
        std::fs::copy(data("fork").join(f), traces.join(f)).unwrap();
    }
    let kept = traces.join("child-1.ctf");
    let before = std::fs::read(&kept).unwrap();
    let link = dir.path().join("link.svg");
    std::os::unix::fs::symlink(&kept, &link).unwrap();
    let t = traces.display().to_string();
    for out in [kept.clone(), link] {
        let o = out.display().to_string();
        for args in [
            vec!["report", "-o", &o, &t],
            vec!["flamegraph", "-o", &o, &t],
            vec!["flamegraph", "--folded", "-o", &o, &t],
            vec!["export", "-o", &o, &t],
        ] {
            let err = refused(&args, 2);
            assert!(
                err.contains("is the input") && err.contains("child-1.ctf"),
                "{args:?}: {err}"
            );
            assert_eq!(std::fs::read(&kept).unwrap(), before, "{args:?}");
        }
    }
    // (nor a new file named as a trace there, which later reads would stop at)
    let named = traces.join("report.ctf");
    let err = refused(&["report", "-o", named.to_str().unwrap(), &t], 2);
    assert!(err.contains("a .ctf name"), "{err}");
    assert!(!named.exists());
    let new = traces.join("new.svg");
    stdout(&["flamegraph", "-o", new.to_str().unwrap(), &t]);
    assert!(std::fs::read_to_string(&new).unwrap().contains("<svg"));
}

/// Outputs do not depend on the decoding threads' timing: the same inputs give the same
/// bytes run after run (a pprof profile lists its samples in the order of the cells, which
/// the threads number as they meet them).
#[test]
fn outputs_are_the_same_run_after_run() {
    let dir = tempfile::tempdir().unwrap();
    let mut profiles = Vec::new();
    let mut folded = Vec::new();
    for k in 0..4 {
        let out = dir.path().join(format!("p{k}.pb.gz"));
        let o = out.display().to_string();
        stdout(&["export", "-o", &o, &fork()]);
        profiles.push(std::fs::read(&out).unwrap());
        folded.push(stdout(&[
            "flamegraph",
            "--folded",
            "--mode",
            "alloc",
            "-o",
            "-",
            &fork(),
        ]));
    }
    assert!(profiles.iter().all(|p| p == &profiles[0]));
    assert!(folded.iter().all(|f| f == &folded[0]));
}

/// `--pid` keeps the origin of times (the earliest start of all the inputs): a process's
/// peak is at the same time with and without it, and a time taken from the whole run
/// names the same moment. A merge, which does not tell its processes apart, is refused
/// for any pid it holds, rather than have one pid stand for all of them.
#[test]
fn pid_keeps_the_times_and_refuses_a_merge() {
    let peak_of = |args: &[&str], pid: u64| -> (u64, u64) {
        let j: Value = serde_json::from_str(&stdout(args)).unwrap();
        let start = j["start_time_us"].as_u64().unwrap();
        let p = (j["processes"].as_array().unwrap().iter())
            .find(|p| p["pid"] == pid)
            .unwrap()
            .clone();
        (start, p["peak_time_us"].as_u64().unwrap())
    };
    let f = fork();
    let whole = peak_of(&["top", "--json", &f], 14497);
    assert_eq!(
        peak_of(&["top", "--json", "--pid", "14497", &f], 14497),
        whole
    );
    // (the process's peak, in seconds since the start)
    let at = format!("at={}", (whole.1 - whole.0) as f64 / 1e6);
    let t = stdout(&["top", "--mode", &at, "--pid", "14497", &f]);
    assert!(t.contains("pid") && t.contains("14497"), "{t}");

    let dir = tempfile::tempdir().unwrap();
    let merged = dir.path().join("merged.ctf");
    stdout(&["merge", "-q", "-o", merged.to_str().unwrap(), &f]);
    for pid in ["14495", "14496"] {
        let err = refused(&["top", "--pid", pid, merged.to_str().unwrap()], 1);
        assert!(
            err.contains(&format!("--pid {pid}")) && err.contains("a merge of 5 processes"),
            "{err}"
        );
    }
}

/// The text tables keep their columns for times past +999.999 s (two traces started
/// 296,000 s apart): the processes' files under their heading, the timeline's steps
/// aligned.
#[test]
fn long_times_keep_the_columns() {
    let (a, b) = (data("fork/child-1.ctf"), data("ocaml5/domains.ctf"));
    let (a, b) = (a.to_str().unwrap(), b.to_str().unwrap());
    let top = stdout(&["top", "-n", "0", a, b]);
    let head = top
        .lines()
        .find(|l| l.trim_start().starts_with("pid"))
        .unwrap();
    let at = head.find("file").unwrap();
    let mut rows = 0;
    for l in top.lines() {
        for f in [a, b] {
            if l.ends_with(f) {
                assert_eq!(l.len() - f.len(), at, "{top}");
                rows += 1;
            }
        }
    }
    assert_eq!(rows, 2, "{top}");
    assert!(top.contains("+296574.566 s"), "{top}");
    let tl = stdout(&["timeline", a, b]);
    let ends: Vec<usize> = (tl.lines())
        .filter(|l| l.trim_start().starts_with('+'))
        .map(|l| l.find(" s ").unwrap())
        .collect();
    assert!(ends.len() > 2 && ends.iter().all(|&e| e == ends[0]), "{tl}");
}

/// A backtrace site in a table reads from the allocating frame to its callers (`site <-
/// caller`); JSON lists its frames caller first.
#[test]
fn a_backtrace_reads_from_the_allocation() {
    let f = fork();
    let j: Value = serde_json::from_str(&stdout(&[
        "top",
        "--json",
        "--by",
        "backtrace",
        "-n",
        "1",
        &f,
    ]))
    .unwrap();
    let frames = j["sites"][0]["frames"].as_array().unwrap();
    assert!(frames.len() > 2);
    let name = |v: &Value| v["function"].as_str().unwrap().to_string();
    let words: Vec<String> = frames.iter().rev().map(name).collect();
    let text = stdout(&["top", "--by", "backtrace", "-n", "1", &f]);
    let row = (text.lines())
        .find(|l| l.contains(" <- "))
        .unwrap_or_else(|| panic!("{text}"));
    let at: Vec<usize> = (words.iter())
        .map(|w| {
            row.find(&format!("{w} ("))
                .unwrap_or_else(|| panic!("{w}: {row}"))
        })
        .collect();
    assert!(at.windows(2).all(|w| w[0] < w[1]), "{row}");
}

/// The report's "all" row is the processes shown: with `--pid`, it starts and lasts as its
/// one process does.
#[test]
fn the_report_run_is_the_processes_shown() {
    let dir = tempfile::tempdir().unwrap();
    let page = dir.path().join("r.html");
    let f = fork();
    stdout(&["report", "-o", page.to_str().unwrap(), "--pid", "14497", &f]);
    let html = std::fs::read_to_string(&page).unwrap();
    let cells = |row: &str| -> Vec<String> {
        let at = html.find(row).unwrap_or_else(|| panic!("no {row}"));
        let tr = &html[at..at + html[at..].find("</tr>").unwrap()];
        (tr.split("<td").skip(1))
            .map(|c| {
                let c = &c[c.find('>').unwrap() + 1..];
                c[..c.find("</td>").unwrap()].to_string()
            })
            .collect()
    };
    let all = cells("<tr class=\"total\">");
    let one = cells("<tr class=\"process");
    // (all: name, count, rate, start, duration; a process: pid, trace, executable, context,
    // host, rate, start, duration)
    assert_eq!((&all[3], &all[4]), (&one[6], &one[7]), "{all:?} {one:?}");
    assert_ne!(all[3], "+0.000 s");
}
