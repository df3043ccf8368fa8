//! The analysis against tools we did not write: memtrace's own hotspots and flamegraph
//! (their outputs for `tests/data` traces recorded in `tests/data/reference/`).

use memtrace_merge::analysis::{analyze, AnalysisOptions, By, Mode, Weight};
use std::path::{Path, PathBuf};

const TRACES: [&str; 8] = [
    "fork/parent",
    "fork/child-1",
    "fork/child-2",
    "fork/child-3",
    "fork/child-4",
    "long",
    "external",
    "bytecode",
];

fn data(p: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(p)
}

/// hotspots' size, from samples as it computes it (samples / rate x 8).
fn hot_bytes(n: f64) -> String {
    if n < 100.0 {
        format!("{n:4.0} B")
    } else if n < 100.0 * 1024.0 {
        format!("{:4.1} kB", n / 1024.0)
    } else if n < 100.0 * 1024.0 * 1024.0 {
        format!("{:4.1} MB", n / 1024.0 / 1024.0)
    } else {
        format!("{:4.1} GB", n / 1024.0 / 1024.0 / 1024.0)
    }
}

#[test]
fn sites_agree_with_memtrace_hotspots() {
    for t in TRACES {
        let a = analyze(&[data(&format!("{t}.ctf"))], &AnalysisOptions::default()).unwrap();
        let rate = a.processes()[0].sample_rate;
        let top = a.top(Mode::Alloc, By::Function, false);
        let total: u64 = top.sites.iter().map(|s| s.samples).sum();
        let mut ours: Vec<String> = (top.sites.iter())
            .filter(|s| s.samples as f64 / total as f64 > 0.005)
            .map(|s| {
                let f = &s.frames[0];
                let pct = 100.0 * s.samples as f64 / total as f64;
                let b = hot_bytes(s.samples as f64 / rate * 8.0);
                format!("{b} ({pct:4.1}%) at {} ({}:", f.function, f.file)
            })
            .collect();
        let reference =
            std::fs::read_to_string(data(&format!("reference/{}.hotspots", t.replace('/', "-"))))
                .unwrap();
        let mut theirs: Vec<String> = (reference.lines())
            .filter(|l| l.contains(") at "))
            // (up to the file name: the lines after it are By::Location's business)
            .map(|l| {
                let cut = l.rfind(" (").unwrap();
                l[..=cut + l[cut..].find(':').unwrap()].to_string()
            })
            .collect();
        ours.sort();
        theirs.sort();
        assert_eq!(ours, theirs, "{t}");
    }
}

#[test]
fn folded_stacks_agree_with_memtrace_flamegraph() {
    for t in TRACES {
        let a = analyze(&[data(&format!("{t}.ctf"))], &AnalysisOptions::default()).unwrap();
        let mut ours: Vec<String> = (a.folded(Mode::Alloc, Weight::Samples, false).into_iter())
            .filter(|(s, _)| s.contains(';'))
            .map(|(s, w)| format!("{s} {w}"))
            .collect();
        let reference =
            std::fs::read_to_string(data(&format!("reference/{}.folded", t.replace('/', "-"))))
                .unwrap();
        let mut theirs: Vec<String> = reference.lines().map(String::from).collect();
        ours.sort();
        theirs.sort();
        assert_eq!(ours, theirs, "{t}");
    }
}
