#![cfg(feature = "export")]
//! An independent reader of our pprof profiles: `go tool pprof` (Debian golang-go) must read
//! them, name every function (no hex addresses), and add up to the values we wrote: totals
//! per sample type (`-raw`), flat and cum per function (`-top`), a process's share
//! (`-tagfocus`), each sample's stack with its inlined frames (`-traces`), and the label
//! values (`-tags`).
//!
//! Skipped, with a note, when `go` is not on PATH.

use memtrace_merge::analysis::Frame;
use memtrace_merge::export::pprof::{LabelValue, ProfileBuilder};
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

const TYPES: [(&str, &str); 4] = [
    ("alloc_objects", "count"),
    ("alloc_space", "bytes"),
    ("inuse_objects", "count"),
    ("inuse_space", "bytes"),
];

fn at(function: &str, file: &str, line: u32) -> Frame {
    Frame {
        function: function.into(),
        file: file.into(),
        line,
        columns: (0, 0),
    }
}

/// One sample as the test knows it: stack caller first, values, pid and executable.
struct Input {
    stack: Vec<Vec<Frame>>,
    values: [i64; 4],
    pid: i64,
    exe: &'static str,
}

fn inputs() -> Vec<Input> {
    let main = vec![at("Main.main", "main.ml", 12)];
    let run = vec![at("Worker.run", "worker.ml", 30)];
    // Buf.grow's call to Bytes.create inlined into it: one location, two frames.
    let grow = vec![
        at("Buf.grow", "buf.ml", 8),
        at("Bytes.create", "bytes.ml", 0),
    ];
    let make = vec![at("Array.make", "array.ml", 77)];
    let sample = |stack: &[&Vec<Frame>], values, pid, exe| Input {
        stack: stack.iter().map(|l| l.to_vec()).collect(),
        values,
        pid,
        exe,
    };
    vec![
        sample(&[&main, &run, &grow], [3, 3000, 1, 1000], 101, "a.exe"),
        sample(&[&main, &run, &make], [2, 640, 2, 640], 101, "a.exe"),
        sample(&[&main, &make], [5, 4000, 0, 0], 202, "b.exe"),
        sample(&[&main, &grow], [1, 72, 1, 72], 202, "b.exe"),
        sample(&[&main], [4, 96, 4, 96], 101, "a.exe"),
    ]
}

fn write_profile(path: &Path, inputs: &[Input]) {
    let mut b = ProfileBuilder::new(&TYPES, "inuse_space");
    b.add_comment("pprof_go test");
    for i in inputs {
        let stack: Vec<&[Frame]> = i.stack.iter().map(Vec::as_slice).collect();
        let labels = [
            ("pid", LabelValue::Num(i.pid)),
            ("executable", LabelValue::Str(i.exe.into())),
            ("domain", LabelValue::Num(0)),
            ("source", LabelValue::Str(format!("{}.ctf", i.exe))),
        ];
        b.add_sample(&stack, &i.values, &labels);
    }
    b.write_gz(std::fs::File::create(path).unwrap()).unwrap();
}

/// `go tool pprof ARGS FILE`'s standard output, or None (with a note) when there is no `go`.
fn pprof(dir: &Path, args: &[&str], file: &Path) -> Option<String> {
    let out = Command::new("go")
        .args(["tool", "pprof"])
        .args(args)
        .arg(file)
        // (pprof keeps fetched profiles under $PPROF_TMPDIR or $HOME/pprof)
        .env("PPROF_TMPDIR", dir)
        .env("HOME", dir)
        .output();
    let out = match out {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            eprintln!("note: go is not on PATH; skipping (Debian package golang-go)");
            return None;
        }
        r => r.unwrap(),
    };
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "go tool pprof {args:?}: {stderr}");
    Some(String::from_utf8(out.stdout).unwrap())
}

/// The sums of each sample type's values in `-raw`'s sample lines (`v1 v2 v3 v4: ids`),
/// and its header naming the types.
fn raw_totals(raw: &str) -> (String, Vec<i64>) {
    let mut lines = raw.lines().skip_while(|l| *l != "Samples:").skip(1);
    let header = lines.next().unwrap().to_string();
    let mut totals = vec![0; 4];
    for l in lines.take_while(|l| *l != "Locations") {
        // (label lines, `key:[value]`, have no number before their colon)
        let Some((values, _ids)) = l.split_once(':') else {
            continue;
        };
        let values: Result<Vec<i64>, _> = values.split_whitespace().map(str::parse).collect();
        if let Ok(values) = values {
            totals.iter_mut().zip(values).for_each(|(t, v)| *t += v);
        }
    }
    (header, totals)
}

/// `-top`'s "accounting for X, .. of Y total" and its rows: function -> (flat, cum), in
/// bytes (`-unit=B`) or counts.
fn top(text: &str) -> (i64, i64, BTreeMap<String, (i64, i64)>) {
    let num = |s: &str| s.trim_end_matches('B').parse::<i64>().unwrap();
    let head = text
        .lines()
        .find(|l| l.starts_with("Showing nodes"))
        .unwrap();
    let words: Vec<&str> = head.split([' ', ',']).collect();
    let after = |w: &str| num(words[words.iter().position(|x| *x == w).unwrap() + 1]);
    let rows = (text
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("flat"))
        .skip(1))
    .map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        let name = f[5..].join(" ").trim_end_matches(" (inline)").to_string();
        (name, (num(f[0]), num(f[3])))
    })
    .collect();
    (after("for"), after("of"), rows)
}
/// `-tags`' blocks (` key: Total N` then `N (P%): value` lines) as key -> [(N, value)].
fn tag_counts(text: &str) -> BTreeMap<String, Vec<(i64, String)>> {
    let mut tags: BTreeMap<String, Vec<(i64, String)>> = BTreeMap::new();
    let mut key = String::new();
    for l in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        if let Some((k, _total)) = l.split_once(": Total ") {
            key = k.to_string();
        } else {
            let (n, value) = l.split_once(" (").unwrap();
            let value = value.split_once("): ").unwrap().1;
            // (counts are shown as `15.0`)
            let n = n.strip_suffix(".0").unwrap_or(n).parse();
            let n = n.unwrap_or_else(|e| panic!("{l}: {e}"));
            tags.entry(key.clone())
                .or_default()
                .push((n, value.to_string()));
        }
    }
    tags
}

/// `-traces`' stacks, function names leaf first, in the samples' order: blocks between
/// `---+---` lines, a left column of `key:` labels or the value, the frames to its right.
fn traces(text: &str) -> Vec<Vec<String>> {
    let mut stacks: Vec<Vec<String>> = Vec::new();
    for l in text.lines().skip_while(|l| !l.starts_with("---")) {
        if l.starts_with("---") {
            stacks.push(Vec::new());
        } else if let Some((left, name)) = l.split_at_checked(11) {
            if !left.contains(':') {
                let name = name.trim().trim_end_matches(" (inline)");
                stacks.last_mut().unwrap().push(name.to_string());
            }
        }
    }
    // (the last `---` line closes the last block)
    stacks.pop();
    stacks
}

/// What `-top` should show for one sample type: per function, flat (its samples as the
/// innermost frame of their leaf) and cum (its samples anywhere in the stack, once each).
fn expected_top<'a>(
    inputs: impl Iterator<Item = &'a Input>,
    ty: usize,
) -> BTreeMap<String, (i64, i64)> {
    let mut rows: BTreeMap<String, (i64, i64)> = BTreeMap::new();
    for i in inputs {
        let v = i.values[ty];
        let leaf = i.stack.last().unwrap().last().unwrap();
        rows.entry(leaf.function.clone()).or_default().0 += v;
        let mut seen: Vec<&str> = i
            .stack
            .iter()
            .flatten()
            .map(|f| f.function.as_str())
            .collect();
        seen.sort();
        seen.dedup();
        for f in seen {
            rows.entry(f.to_string()).or_default().1 += v;
        }
    }
    rows
}

fn sum<'a>(inputs: impl Iterator<Item = &'a Input>, ty: usize) -> i64 {
    inputs.map(|i| i.values[ty]).sum()
}

/// `-raw`: the sample types (the default marked), each type's total, labels (numbers with
/// their key as unit), an inlined location's frames innermost first with files and lines.
fn check_raw(raw: &str, inputs: &[Input]) {
    let (header, totals) = raw_totals(raw);
    let types = "alloc_objects/count alloc_space/bytes inuse_objects/count inuse_space/bytes";
    assert_eq!(header, format!("{types}[dflt]"));
    let want: Vec<i64> = (0..4).map(|t| sum(inputs.iter(), t)).collect();
    assert_eq!(totals, want, "{raw}");
    for label in [
        "pid:[101 pid]",
        "domain:[0 domain]",
        "executable:[b.exe] source:[b.exe.ctf]",
    ] {
        assert!(raw.contains(label), "{label} in {raw}");
    }
    assert!(raw.contains("Bytes.create bytes.ml:0 s=0\n             Buf.grow buf.ml:8"));
}

/// `-top` of alloc_space in bytes over all samples, and of alloc_objects over one process's
/// (`-tagfocus=pid=101`): shown and total values, and each function's flat and cum.
fn check_top(dir: &Path, file: &Path, inputs: &[Input]) {
    let args = [
        "-sample_index=alloc_space",
        "-unit=B",
        "-top",
        "-nodecount=100",
    ];
    let text = pprof(dir, &args, file).unwrap();
    let (shown, total, rows) = top(&text);
    let all = sum(inputs.iter(), 1);
    assert_eq!((shown, total), (all, all), "{text}");
    assert_eq!(rows, expected_top(inputs.iter(), 1), "{text}");

    let args = ["-sample_index=alloc_objects", "-tagfocus=pid=101", "-top"];
    let text = pprof(dir, &args, file).unwrap();
    let a = || inputs.iter().filter(|i| i.pid == 101);
    let (shown, total, rows) = top(&text);
    assert_eq!(
        (shown, total),
        (sum(a(), 0), sum(inputs.iter(), 0)),
        "{text}"
    );
    assert_eq!(rows, expected_top(a(), 0), "{text}");
}

/// `-tags` of alloc_objects: each label value's count of objects.
fn check_tags(text: &str, inputs: &[Input]) {
    let of = |exe: &str| sum(inputs.iter().filter(|i| i.exe == exe), 0);
    let (a, b) = (of("a.exe"), of("b.exe"));
    assert!(a > b, "pprof lists the larger first");
    let want = [
        ("domain", [(a + b, "0")].to_vec()),
        ("executable", [(a, "a.exe"), (b, "b.exe")].to_vec()),
        ("pid", [(a, "101"), (b, "202")].to_vec()),
        ("source", [(a, "a.exe.ctf"), (b, "b.exe.ctf")].to_vec()),
    ];
    let want: BTreeMap<String, Vec<(i64, String)>> = (want.into_iter())
        .map(|(k, v)| {
            (
                k.into(),
                v.into_iter().map(|(n, s)| (n, s.into())).collect(),
            )
        })
        .collect();
    assert_eq!(tag_counts(text), want, "{text}");
}

#[test]
fn go_tool_pprof_reads_totals_stacks_functions_and_labels() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("profile.pb.gz");
    let inputs = inputs();
    write_profile(&file, &inputs);
    let Some(raw) = pprof(dir.path(), &["-raw"], &file) else {
        return;
    };
    check_raw(&raw, &inputs);
    check_top(dir.path(), &file, &inputs);

    let text = pprof(dir.path(), &["-traces"], &file).unwrap();
    let want: Vec<Vec<&str>> = (inputs.iter())
        .map(|i| i.stack.iter().rev().flat_map(|l| l.iter().rev()))
        .map(|frames| frames.map(|f| f.function.as_str()).collect())
        .collect();
    assert_eq!(traces(&text), want, "{text}");

    let args = ["-tags", "-sample_index=alloc_objects"];
    check_tags(&pprof(dir.path(), &args, &file).unwrap(), &inputs);
}

/// The command line's export of `fork/` (five processes) as go's pprof reads it: each sample
/// type's total is the analysis's (allocated, and in use at the run's peak), and each pid's
/// share of the bytes in use (`-tagfocus`) is what that process held at the run's peak.
#[test]
fn go_pprof_reads_an_exported_run() {
    use memtrace_merge::analysis::{analyze, AnalysisOptions, Mode};
    let fork = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/fork");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("fork.pb.gz");
    let st = Command::new(env!("CARGO_BIN_EXE_memtrace-merge"))
        .args(["export", "--mode", "peak", "-o"])
        .arg(&file)
        .arg(&fork)
        .status()
        .unwrap();
    assert!(st.success());
    let Some(raw) = pprof(dir.path(), &["-raw"], &file) else {
        return;
    };
    let a = analyze(&[fork], &AnalysisOptions::default()).unwrap();
    let stacks = a.stacks(Mode::Peak);
    let (_, totals) = raw_totals(&raw);
    let objects = |f: fn(&memtrace_merge::analysis::Stack) -> f64| -> i64 {
        stacks.iter().map(|s| f(s).round() as i64).sum()
    };
    let t = a.total();
    assert_eq!(
        totals,
        vec![
            objects(|s| s.allocated_objects),
            t.allocated_bytes as i64,
            objects(|s| s.live_objects),
            t.peak_bytes as i64,
        ]
    );
    for (i, p) in a.processes().iter().enumerate() {
        let focus = format!("-tagfocus=pid={}", p.pid);
        let args = [
            "-unit=B",
            "-nodefraction=0",
            "-nodecount=100000",
            &focus,
            "-top",
        ];
        let text = pprof(dir.path(), &args, &file).unwrap();
        let (shown, total, _) = top(&text);
        let held: u64 = (stacks.iter().filter(|s| s.process == i))
            .map(|s| s.live_bytes)
            .sum();
        assert_eq!(
            (shown, total),
            (held as i64, t.peak_bytes as i64),
            "{}",
            p.pid
        );
    }
    // (the profile's time is the window read: from --from, 1 s after the earliest start,
    // for the 2 s to --to)
    let windowed = dir.path().join("window.pb.gz");
    let st = Command::new(env!("CARGO_BIN_EXE_memtrace-merge"))
        .args(["export", "--from", "1", "--to", "3", "-o"])
        .arg(&windowed)
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/fork"))
        .status()
        .unwrap();
    assert!(st.success());
    let raw = pprof(dir.path(), &["-raw"], &windowed).unwrap();
    let field = |k: &str| {
        (raw.lines())
            .find_map(|l| l.strip_prefix(k))
            .unwrap()
            .trim()
            .to_string()
    };
    let duration: f64 = field("Duration:").parse().unwrap();
    assert!((1.9..=2.0).contains(&duration), "{duration}");
    // (seconds of the minute: the same in every time zone)
    assert!(field("Time:").contains(":14.136014"), "{raw}");
}
