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

/// For each input of `opened`, its survey when its packets are to be copied. A merge in
/// format 3 of several inputs, untagged, copies (unless told not to) each input at the
/// merged rate that reads with no warning, whose objects are promoted and collected in
/// turn, and whose every code means what it means in the inputs copied before it.
pub(super) fn copied_inputs(
    opened: &[Opened],
    opts: &MergeOptions,
    format: u16,
    min_rate: f64,
) -> Result<Vec<Option<Survey>>> {
    let mut out: Vec<Option<Survey>> = (0..opened.len()).map(|_| None).collect();
    if format < 3 || opened.len() < 2 || opts.tag_processes || opts.copy_packets == Some(false) {
        return Ok(out);
    }
    // (an input sampled faster is thinned, each sample drawn again: re-encoded)
    let candidates: Vec<usize> = (0..opened.len())
        .filter(|&k| opened[k].info.sample_rate <= min_rate)
        .collect();
    let surveys = survey_all(opened, &candidates, &opts.cancel)?;
    if opts.cancel.is_cancelled() {
        return Err(Error::Cancelled);
    }
    let mut meanings: IntMap<LocationCode, (usize, LocationList)> = IntMap::default();
    for (k, s) in candidates.into_iter().zip(surveys) {
        if s.refused.is_some() || !s.domains.iter().all(|d| opened[k].domains.contains(d)) {
            continue;
        }
        // A code another copied input defines otherwise would need a fresh code here: the
        // reference reader refuses a code given two meanings in one trace.
        let clash = s
            .locations
            .iter()
            .any(|(c, l)| (meanings.get(c)).is_some_and(|(j, m)| *j != k && **m != **l));
        if clash {
            continue;
        }
        for (c, l) in &s.locations {
            meanings.entry(*c).or_insert_with(|| (k, l.clone()));
        }
        out[k] = Some(s);
    }
    Ok(out)
}

/// The surveys of `opened[k]` for each `k` of `which`, made on as many threads as there
/// are cores (at most one per input).
fn survey_all(opened: &[Opened], which: &[usize], cancel: &Cancel) -> Result<Vec<Survey>> {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads = cpus.min(which.len()).max(1);
    let next = AtomicUsize::new(0);
    // (inputs of one executable define their codes alike: one copy of each list for all)
    let locations = Arc::new(LocationPool::default());
    let done: Mutex<Vec<Option<Result<Survey>>>> =
        Mutex::new((0..which.len()).map(|_| None).collect());
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(&k) = which.get(i) else { break };
                let r = survey(&opened[k].source, &opened[k].path, &locations, cancel);
                if let Ok(mut d) = done.lock() {
                    d[i] = Some(r);
                }
            });
        }
    });
    let done = done.into_inner().unwrap_or_default();
    (done.into_iter())
        .map(|r| {
            r.unwrap_or_else(|| {
                Ok(Survey {
                    refused: Some("not surveyed".into()),
                    ..Survey::default()
                })
            })
        })
        .collect()
}
