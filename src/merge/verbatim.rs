//! Which inputs of a merge have their packets copied rather than re-encoded: in format 3,
//! an input read cleanly, neither thinned nor tagged, whose codes mean what others' do.
//!
//! Each copied input keeps its domains (renumbered), backtrace caches, location tables and
//! event bytes; its ids move by an offset of their own, in id chunks no other stream uses.
//! What the reference reader makes of such packets, and why these are the conditions:
//! benches/PERFORMANCE.md, "Copying packet bodies".

use super::inputs::Opened;
use super::MergeOptions;
use crate::cancel::Cancel;
use crate::error::{Error, Result};
use crate::format::event::LocationCode;
use crate::format::location::{IntMap, LocationList, LocationPool};
use crate::pipeline::verbatim::{survey, Survey};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// The inputs of a merge whose packets are copied, and their codes.
#[derive(Default)]
pub(super) struct Copied {
    /// For each input, its survey when its packets are to be copied.
    pub(super) surveys: Vec<Option<Survey>>,
    /// The codes the copied inputs define, with their locations, each once, in the order
    /// the inputs (in their order) first define them.
    pub(super) codes: Vec<(LocationCode, LocationList)>,
}

/// The inputs of `opened` whose packets are to be copied. A merge in format 3 of several
/// inputs, untagged, copies (unless told not to) each input at the merged rate that reads
/// with no warning, whose objects are promoted and collected in turn, and whose every
/// code means what it means in the inputs copied before it.
pub(super) fn copied_inputs(
    opened: &[Opened],
    opts: &MergeOptions,
    format: u16,
    min_rate: f64,
) -> Result<Copied> {
    let mut out = Copied {
        surveys: (0..opened.len()).map(|_| None).collect(),
        codes: Vec::new(),
    };
    if format < 3 || opened.len() < 2 || opts.tag_processes || opts.copy_packets == Some(false) {
        return Ok(out);
    }
    // (an input sampled faster is thinned, each sample drawn again: re-encoded)
    let candidates: Vec<usize> = (0..opened.len())
        .filter(|&k| opened[k].info.sample_rate <= min_rate)
        .collect();
    let mut meanings: IntMap<LocationCode, (usize, LocationList)> = IntMap::default();
    // (each survey taken in as soon as those before it are, its list of codes then
    // dropped: a merge of a hundred inputs held a hundred lists)
    survey_all(opened, &candidates, &opts.cancel, |k, mut s| {
        if s.refused.is_some() || !s.domains.iter().all(|d| opened[k].domains.contains(d)) {
            return;
        }
        // A code another copied input defines otherwise would need a fresh code here: the
        // reference reader refuses a code given two meanings in one trace.
        let clash = s
            .locations
            .iter()
            .any(|(c, l)| (meanings.get(c)).is_some_and(|(j, m)| *j != k && **m != **l));
        if clash {
            return;
        }
        for (c, l) in std::mem::take(&mut s.locations) {
            if let std::collections::hash_map::Entry::Vacant(e) = meanings.entry(c) {
                e.insert((k, l.clone()));
                out.codes.push((c, l));
            }
        }
        out.surveys[k] = Some(s);
    })?;
    if opts.cancel.is_cancelled() {
        return Err(Error::Cancelled);
    }
    Ok(out)
}

/// Survey `opened[k]` for each `k` of `which`, on as many threads as there are cores (at
/// most one per input), each survey handed to `take` in the order of `which` (an input
/// that could not be surveyed is refused).
fn survey_all(
    opened: &[Opened],
    which: &[usize],
    cancel: &Cancel,
    mut take: impl FnMut(usize, Survey) + Send,
) -> Result<()> {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads = cpus.min(which.len()).max(1);
    let next = AtomicUsize::new(0);
    // (inputs of one executable define their codes alike: one copy of each list for all)
    let locations = Arc::new(LocationPool::default());
    struct Done<F> {
        /// Surveys made but not yet taken, by their place in `which`.
        waiting: Vec<Option<Result<Survey>>>,
        /// The place of the next to take.
        taken: usize,
        error: Option<Error>,
        take: F,
    }
    let done = Mutex::new(Done {
        waiting: (0..which.len()).map(|_| None).collect(),
        taken: 0,
        error: None,
        take: &mut take,
    });
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(&k) = which.get(i) else { break };
                let r = survey(&opened[k].source, &opened[k].path, &locations, cancel);
                let Ok(mut guard) = done.lock() else { break };
                let d = &mut *guard;
                d.waiting[i] = Some(r);
                while let Some(r) = d.waiting.get_mut(d.taken).and_then(Option::take) {
                    let at = which[d.taken];
                    d.taken += 1;
                    match r {
                        Ok(s) if d.error.is_none() => (d.take)(at, s),
                        Ok(_) => {}
                        Err(e) => {
                            d.error.get_or_insert(e);
                        }
                    }
                }
            });
        }
    });
    let d = done.into_inner().unwrap_or_else(|e| e.into_inner());
    match d.error {
        Some(e) => Err(e),
        None => Ok(()),
    }
}
