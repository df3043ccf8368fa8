//! The k-way merge of several traces into one: a heap over per-input cursors by absolute
//! time, object ids renumbered, location codes kept or remapped, rates thinned to one.

use crate::error::{Error, Result};
use std::path::{Path, PathBuf};

/// What to do when inputs were sampled at different rates.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RateMismatch {
    /// Thin every faster input to the slowest rate (binomial thinning, seeded).
    #[default]
    Thin,
    /// Refuse to merge.
    Fail,
}

/// Options of a merge; `Default` gives the documented defaults.
#[derive(Clone, Debug, Default)]
pub struct MergeOptions {
    /// Output format version (2 or 3); None: 2 when every input is ≤ 2, else 3.
    pub format: Option<u16>,
    pub rate_mismatch: RateMismatch,
    /// Seed of the thinning's random numbers.
    pub seed: u64,
    /// Give every backtrace a synthetic root frame naming its input.
    pub tag_processes: bool,
    /// Leave out inputs that cannot be read at all (with a warning) instead of failing.
    pub skip_bad_inputs: bool,
    /// The merged trace's pid (default: the first input's).
    pub pid: Option<u64>,
    /// The merged trace's context (default: the first input's, or a merge description).
    pub context: Option<Vec<u8>>,
    /// Print a progress line on stderr (when it is a terminal) for long merges.
    pub progress: bool,
}

/// What happened to one input.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct InputReport {
    pub path: PathBuf,
    pub pid: u64,
    pub format: u16,
    pub sample_rate: f64,
    /// Events read (allocs + promotes + collects).
    pub events: u64,
    pub allocs: u64,
    pub promotes: u64,
    pub collects: u64,
    /// Allocations written to the output (fewer than `allocs` when thinned).
    pub allocs_written: u64,
    pub samples_read: u64,
    pub samples_written: u64,
    /// Fraction of samples kept by thinning (1.0 when not thinned).
    pub keep_fraction: f64,
    pub skipped_packets: u64,
    /// Location codes given a fresh code because another input used them differently.
    pub remapped_codes: u64,
    /// Left out entirely (unreadable, with `skip_bad_inputs`).
    pub skipped: bool,
    /// Reader warnings and merge notes about this input.
    pub warnings: Vec<String>,
}

/// What a merge did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MergeReport {
    pub inputs: Vec<InputReport>,
    pub output: PathBuf,
    pub format: u16,
    pub allocs: u64,
    pub promotes: u64,
    pub collects: u64,
    pub remapped_codes: u64,
    pub warnings: u64,
}

/// Merge `inputs` (files, or directories whose `*.ctf` files are taken in name order) into
/// `output`, written to a temporary file beside it and renamed at the end.
pub fn merge(inputs: &[PathBuf], output: &Path, opts: &MergeOptions) -> Result<MergeReport> {
    let _ = (inputs, output, opts);
    Err(Error::Usage("merge: not implemented yet".into()))
}
