//! Two fuzzed traces merged: the input is `A SEP B` (or split in half when there is no SEP).
//! The merge must end in a clean `Err` or write a trace that `check` finds valid.
#![no_main]

use libfuzzer_sys::fuzz_target;
use memtrace_merge::merge::{merge, MergeOptions};
use memtrace_merge::{check, Error};
use std::path::PathBuf;
use std::sync::OnceLock;

/// Separates the two inputs in a fuzz case (the seed corpus uses it too).
const SEP: &[u8] = b"\n--memtrace-merge-fuzz-split--\n";

fn dir() -> &'static tempfile::TempDir {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| tempfile::tempdir().expect("temp dir"))
}

fn split(data: &[u8]) -> (&[u8], &[u8]) {
    match data.windows(SEP.len()).position(|w| w == SEP) {
        Some(i) => (&data[..i], &data[i + SEP.len()..]),
        None => data.split_at(data.len() / 2),
    }
}

fuzz_target!(|data: &[u8]| {
    let (a, b) = split(data);
    let d = dir().path();
    let pa = d.join("a.ctf");
    let pb = d.join("b.ctf");
    let out = d.join("out.ctf");
    std::fs::write(&pa, a).unwrap();
    std::fs::write(&pb, b).unwrap();
    let _ = std::fs::remove_file(&out);
    let inputs: Vec<PathBuf> = vec![pa, pb];
    for skip_bad_inputs in [false, true] {
        let opts = MergeOptions {
            skip_bad_inputs,
            format: if data.len().is_multiple_of(2) {
                None
            } else {
                Some(3)
            },
            // (backtraces encoded ahead, in shares, whenever two streams share a domain)
            encode_ahead: data.len().is_multiple_of(3).then_some(true),
            ..Default::default()
        };
        match merge(&inputs, &out, &opts) {
            Ok(_) => {
                let rep = check::check_file(&out, &check::CheckOptions::default())
                    .expect("merged output readable");
                assert!(rep.is_valid(), "merged output invalid: {:?}", rep.problems);
                std::fs::remove_file(&out).unwrap();
            }
            Err(e) => {
                assert!(!out.exists(), "failed merge left an output: {e}");
                if let Error::Malformed { at, .. } = &e {
                    assert!(at.file.ends_with(".ctf"), "{e}");
                }
            }
        }
        // no temporary file left behind
        let n = std::fs::read_dir(d).unwrap().count();
        assert_eq!(n, 2, "leftover files in the output directory");
    }
});
