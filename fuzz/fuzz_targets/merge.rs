//! Two fuzzed traces merged: the input is `A SEP B` (or split in half when there is no SEP).
//! The merge must end in a clean `Err` or write a trace that `check` finds valid and that
//! holds exactly the allocations of the inputs it took (`compare`, allowing for thinning),
//! each as far as it reads. The body is `tests/fuzz_harness/merge.rs`, which
//! `tests/fuzz_regressions.rs` replays the findings through.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;

#[path = "../../tests/fuzz_harness/merge.rs"]
mod harness;

fn dir() -> &'static tempfile::TempDir {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| tempfile::tempdir().expect("temp dir"))
}

fuzz_target!(|data: &[u8]| {
    harness::merge_pair(data, dir().path());
});
