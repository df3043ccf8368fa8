//! The merge fuzz target's body, shared by the target (`fuzz/fuzz_targets/merge.rs`) and the
//! replay of its findings (`tests/fuzz_regressions.rs`): two traces merged, the output
//! checked and compared with the inputs taken.

use memtrace_merge::tools::check::{check_file, CheckOptions};
use memtrace_merge::tools::compare::{compare, CompareOptions};
use memtrace_merge::Error;
use memtrace_merge::{merge, MergeOptions, MergeReport};
use std::path::{Path, PathBuf};

/// Separates the two inputs in a fuzz case (the seed corpus uses it too).
pub const SEP: &[u8] = b"\n--memtrace-merge-fuzz-split--\n";

/// `A SEP B`, or split in half when there is no SEP.
pub fn split(data: &[u8]) -> (&[u8], &[u8]) {
    match data.windows(SEP.len()).position(|w| w == SEP) {
        Some(i) => (&data[..i], &data[i + SEP.len()..]),
        None => data.split_at(data.len() / 2),
    }
}

/// Write the two traces of `data` into the empty directory `d` and merge them, with and
/// without `skip_bad_inputs` (format 3 when `data`'s length is odd, backtraces encoded
/// ahead when it is a multiple of 3, processes tagged when a multiple of 5). Each merge
/// must end in a clean `Err`, leaving no output, or write a trace that `check` finds
/// valid and that holds exactly the allocations of the inputs it took (thinning allowed),
/// each as far as it reads; either way, no temporary file is left. Returns the reports of
/// the merges that succeeded.
pub fn merge_pair(data: &[u8], d: &Path) -> Vec<MergeReport> {
    let (a, b) = split(data);
    let pa = d.join("a.ctf");
    let pb = d.join("b.ctf");
    let out = d.join("out.ctf");
    std::fs::write(&pa, a).unwrap();
    std::fs::write(&pb, b).unwrap();
    let _ = std::fs::remove_file(&out);
    let inputs: Vec<PathBuf> = vec![pa, pb];
    let mut reports = Vec::new();
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
            tag_processes: data.len().is_multiple_of(5),
            ..Default::default()
        };
        match merge(&inputs, &out, &opts) {
            Ok(report) => {
                let rep =
                    check_file(&out, &CheckOptions::default()).expect("merged output readable");
                assert!(rep.is_valid(), "merged output invalid: {:?}", rep.problems);
                same_allocations(&report, &out, opts.tag_processes);
                std::fs::remove_file(&out).unwrap();
                reports.push(report);
            }
            Err(e) => {
                assert!(!out.exists(), "failed merge left an output: {e}");
                if let Error::Malformed { at, .. } = &e {
                    assert!(at.file.ends_with(".ctf"), "{e}");
                }
            }
        }
        let n = std::fs::read_dir(d).unwrap().count();
        assert_eq!(n, 2, "leftover files in the output directory");
    }
    reports
}

/// The merged trace `out` holds exactly the allocations of the inputs `report` took, each
/// read as the merge reads it (a format-3 input a domain at a time) and as far as it reads.
fn same_allocations(report: &MergeReport, out: &Path, tagged: bool) {
    let taken: Vec<PathBuf> = report
        .inputs
        .iter()
        .filter(|i| !i.skipped)
        .map(|i| i.path.clone())
        .collect();
    let opts = CompareOptions {
        thinned: true,
        tagged,
        readable_part: true,
    };
    let c = compare(&taken, out, opts).expect("inputs the merge took readable");
    assert!(c.equal(), "merged allocations differ: {c:?}");
    assert_eq!(c.merged_allocs, report.allocs, "{c:?}");
}
