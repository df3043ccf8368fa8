//! The k-way merge of several traces into one: a heap over per-input cursors by absolute
//! time, object ids renumbered, location codes kept or remapped, rates thinned to one.
//!
//! The file-order invariant: a reader meets every promote and collect after the allocation
//! it names. Events are written in time order, an object's allocation before its promote
//! and collect (one in the same microsecond that comes first waits for it), and each
//! promote and collect goes to the output stream that allocated its object
//! ([`Writer::put_id_event_where_allocated`]), not to the one of the domain it came from: OCaml 5 hands
//! a terminated domain's blocks to another domain, whose stream then names them. One
//! stream's packets are written in order, so the invariant holds whatever other domains'
//! packets are still open, and each id delta is non-negative (the reference reader refuses
//! a negative one for promotes).

mod attempt;
pub(crate) mod codes;
mod core;
mod inputs;
pub(crate) mod live;
mod objects;
mod plan;
mod report;
mod streams;
mod verbatim;

use attempt::merge_attempt;
use inputs::prepare_inputs;

pub use inputs::expand_inputs;
pub(crate) use inputs::{gather_inputs, merged_pids, process_tag};
pub use report::{format_report, format_warnings};

use crate::error::Result;
use crate::fs::Target;
use crate::pipeline::decoder::Hooks;
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
    /// What to do when the inputs' sampling rates differ.
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
    /// Replace an existing output that is read-only (refused otherwise).
    pub force: bool,
    /// Merge every input, even one that holds what another holds (a copy of a trace, or
    /// an earlier merge of the same traces), which is otherwise merged once.
    pub keep_duplicates: bool,
    /// Cancels the merge when set (from another thread): it then returns
    /// [`crate::Error::Cancelled`], leaving no output.
    pub cancel: crate::cancel::Cancel,
    /// Flush the output to disk before renaming it into place, so that it survives a power
    /// loss (a few milliseconds). Without it the output is still never seen half-written.
    pub fsync: bool,
    /// Threads decoding the inputs ahead of the merge (None: the cores but one, at least
    /// one, at most four). The output does not depend on it.
    pub decode_threads: Option<usize>,
    /// Encode backtraces on the decoding threads, each input stream in its own share of
    /// its output domain's backtrace cache, rather than on the merging thread. None: when
    /// that pays (backtraces repeating much of the previous one; at most 16 streams a
    /// domain; not for a lone input, nor a thinned input of several streams). Either way
    /// the output is valid, but the bytes differ; a backtrace too deep for its share has
    /// the merge made again without encoding ahead, rather than cut.
    pub encode_ahead: Option<bool>,
    /// Copy the packets of inputs that a format-3 merge of several inputs keeps as they
    /// are (read without a warning, not thinned, not tagged, no code meaning otherwise
    /// than in another such input), only their headers rewritten, rather than re-encode
    /// their events. None: yes. The output is valid either way; the bytes differ.
    pub copy_packets: Option<bool>,
}

/// What happened to one input.
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct InputReport {
    /// The input file.
    pub path: PathBuf,
    /// The argument it came from: its index among the inputs given (a file, or the
    /// directory holding it).
    pub arg: usize,
    /// The process id its trace-info names.
    pub pid: u64,
    /// Its format version.
    pub format: u16,
    /// Its sampling rate.
    pub sample_rate: f64,
    /// Events read (allocs + promotes + collects).
    pub events: u64,
    /// Allocations read.
    pub allocs: u64,
    /// Promotes read.
    pub promotes: u64,
    /// Collects read.
    pub collects: u64,
    /// Allocations written to the output (fewer than `allocs` when thinned).
    pub allocs_written: u64,
    /// Samples of the allocations read.
    pub samples_read: u64,
    /// Samples of the allocations written.
    pub samples_written: u64,
    /// Fraction of samples kept by thinning (1.0 when not thinned).
    pub keep_fraction: f64,
    /// Packets the reader skipped (wrong pid, out of sequence, truncated).
    pub skipped_packets: u64,
    /// Location codes given a fresh code because another input used them differently.
    pub remapped_codes: u64,
    /// Allocations whose backtrace was too deep for one whole packet, written cut.
    pub cut_backtraces: u64,
    /// Left out entirely (unreadable, with `skip_bad_inputs`).
    pub skipped: bool,
    /// Its packets were copied as they were, only their headers rewritten
    /// ([`MergeOptions::copy_packets`]).
    pub copied: bool,
    /// Reading stopped at an error before the input's end (a warning says where): what
    /// came before it was merged, the rest left out.
    pub stopped_at_error: bool,
    /// Reader warnings and merge notes about this input.
    pub warnings: Vec<String>,
}

/// What a merge did.
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct MergeReport {
    /// One report per input, in the order given.
    pub inputs: Vec<InputReport>,
    /// The merged trace's path.
    pub output: PathBuf,
    /// The merged trace's format version.
    pub format: u16,
    /// Allocations written.
    pub allocs: u64,
    /// Promotes written.
    pub promotes: u64,
    /// Collects written.
    pub collects: u64,
    /// Location codes given a fresh code, over all inputs.
    pub remapped_codes: u64,
    /// Warnings over all inputs.
    pub warnings: u64,
    /// Whether backtraces were encoded ahead ([`MergeOptions::encode_ahead`]).
    pub encoded_ahead: bool,
    /// Warnings about the arguments rather than one input: entries of a directory left out
    /// (a symbolic link to nothing, a directory or a FIFO named `*.ctf`).
    pub argument_warnings: Vec<String>,
}

/// Merge `inputs` (files, or directories whose `*.ctf` files are taken in name order, but
/// `output` when it is an earlier merge; a file named twice, however spelled, is merged
/// once, with a warning) into `output`, written to a temporary file beside it and renamed at
/// the end.
pub fn merge(inputs: &[PathBuf], output: &Path, opts: &MergeOptions) -> Result<MergeReport> {
    merge_with(inputs, output, opts, Hooks::default())
}

/// [`merge`], with (tests) the decoding threads doing what `hooks` say.
fn merge_with(
    inputs: &[PathBuf],
    output: &Path,
    opts: &MergeOptions,
    hooks: Hooks,
) -> Result<MergeReport> {
    let prepared = prepare_inputs(inputs, output, opts)?;
    let mut opts = opts.clone();
    // (written through, an output cannot be made again: no attempt may need another)
    if !matches!(prepared.target, Target::File(_)) {
        opts.encode_ahead = Some(false);
    }
    loop {
        match merge_attempt(&prepared, output, &opts, hooks)? {
            Some(report) => return Ok(report),
            // A backtrace too deep for its share: again without encoding ahead (everything
            // of the first attempt gone, its temporary file too), which cannot need this.
            None => opts.encode_ahead = Some(false),
        }
    }
}

#[cfg(test)]
mod tests;
