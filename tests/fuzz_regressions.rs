//! Every input the fuzz targets (`fuzz/`) found a crash with, run through the same harnesses:
//! `tests/data/fuzz/*.trace` as one trace through the reader, `check`, `dump` and `summary`;
//! `*.pair` as two traces (split at the fuzz target's separator, else in half) merged, the
//! output checked and compared with the inputs taken, each as far as it reads
//! (`fuzz_harness/merge.rs`, the merge target's own body). Each must end in a clean `Err`
//! or a valid result, never a panic or a hang.

use memtrace_merge::tools::check::{check, check_file, CheckOptions};
use memtrace_merge::tools::{dump, summary};
use memtrace_merge::Reader;
use memtrace_merge::{merge, MergeOptions};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

#[path = "fuzz_harness/merge.rs"]
mod harness;
use harness::SEP;

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/fuzz")
}

/// The check fuzz target's body.
fn check_harness(data: &[u8]) {
    if let Ok(mut r) = Reader::new(data, "fuzz.ctf") {
        let rep = check(&mut r, &CheckOptions::default()).expect("no I/O errors");
        if rep.reader_error {
            assert!(!rep.problems.is_empty());
        }
    }
    if let Ok(mut r) = Reader::new(data, "fuzz.ctf") {
        let _ = dump::dump(&mut r, &mut std::io::sink(), |_| {});
    }
    if let Ok(mut r) = Reader::new(data, "fuzz.ctf") {
        let _ = summary::summarize(&mut r);
    }
    if let Ok(mut r) = Reader::new(data, "fuzz.ctf") {
        r.set_parse_backtraces(false);
        while let Ok(Some(_)) = r.next_event() {}
    }
}

/// The merge fuzz target's body, in a fresh directory.
fn merge_harness(data: &[u8]) -> Vec<memtrace_merge::MergeReport> {
    let tmp = tempfile::tempdir().unwrap();
    harness::merge_pair(data, tmp.path())
}

fn inputs(ext: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == ext))
        .collect();
    v.sort();
    v
}

fn run_bounded(name: &Path, f: impl FnOnce()) {
    let t = Instant::now();
    if let Err(p) = catch_unwind(AssertUnwindSafe(f)) {
        let msg = p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        panic!("{}: {msg}", name.display());
    }
    let took = t.elapsed();
    assert!(
        took < Duration::from_secs(5),
        "{}: took {took:?}",
        name.display()
    );
}

#[test]
fn every_regression_input_ends_cleanly() {
    let singles = inputs("trace");
    let pairs = inputs("pair");
    for p in &singles {
        let data = std::fs::read(p).unwrap();
        run_bounded(p, || check_harness(&data));
        // and each single trace merged with itself, through the merge harness
        let mut pair = data.clone();
        pair.extend_from_slice(SEP);
        pair.extend_from_slice(&data);
        run_bounded(p, || {
            merge_harness(&pair);
        });
    }
    for p in &pairs {
        let data = std::fs::read(p).unwrap();
        run_bounded(p, || check_harness(&data));
        run_bounded(p, || {
            merge_harness(&data);
        });
    }
    println!(
        "fuzz regressions: {} traces, {} merge pairs",
        singles.len(),
        pairs.len()
    );
    assert!(!singles.is_empty() && !pairs.is_empty());
}

/// Found by the merge target: a format-3 input whose domains are read as separate streams
/// got past the point where a whole-file read stops, and a promote repeated there was
/// written twice, making the merged trace invalid. Now a second promote is left out with a
/// warning. `merge-double-promote.trace` is the same thing made small: alloc, promote,
/// promote, collect.
#[test]
fn a_second_promote_is_left_out() {
    let p = dir().join("merge-double-promote.trace");
    let rep = check_file(&p, &CheckOptions::default()).unwrap();
    assert!(!rep.is_valid(), "the source is invalid: {:?}", rep.problems);
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out.ctf");
    let r = merge(std::slice::from_ref(&p), &out, &MergeOptions::default()).unwrap();
    assert_eq!((r.allocs, r.promotes, r.collects), (1, 1, 1));
    assert!(
        r.inputs[0].warnings.iter().any(|w| w.contains("promote")),
        "{:?}",
        r.inputs[0].warnings
    );
    let rep = check_file(&out, &CheckOptions::default()).unwrap();
    assert!(rep.is_valid(), "{:?}", rep.problems);
    let reports =
        merge_harness(&std::fs::read(dir().join("merge-double-promote-fuzz.pair")).unwrap());
    assert!(!reports.is_empty());
}

/// Found by the merge target (a timeout): an allocation with a fuzzed nsamples near 2^62 in
/// an input thinned to a slower partner's rate was thinned one Bernoulli trial per sample,
/// practically forever. Thinning now takes constant time for any count (fixed in thin.rs).
/// `merge-huge-nsamples.pair` is the same made small: nsamples 2^62 - 1 at rate 1e-4, and a
/// partner at 1e-5.
#[test]
fn a_huge_sample_count_is_thinned_at_once() {
    for name in ["merge-huge-nsamples.pair", "merge-huge-nsamples-fuzz.pair"] {
        let data = std::fs::read(dir().join(name)).unwrap();
        let t = Instant::now();
        let reports = merge_harness(&data);
        assert!(
            t.elapsed() < Duration::from_secs(2),
            "{name}: {:?}",
            t.elapsed()
        );
        if name == "merge-huge-nsamples.pair" {
            let r = &reports[0];
            assert_eq!(r.allocs, 2);
            let a = &r.inputs[0];
            assert_eq!(a.samples_read, (1 << 62) - 1);
            // kept about a tenth of them
            let f = a.samples_written as f64 / a.samples_read as f64;
            assert!((f - 0.1).abs() < 1e-3, "{f}");
        }
    }
}
