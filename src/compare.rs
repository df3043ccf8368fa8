//! Semantic comparison of traces: each allocation as (absolute time, kind, nsamples, length,
//! backtrace as resolved locations, promote time, collect time), compared as multisets.

use crate::error::Result;
use crate::event::{Event, LocationCode};
use crate::location::{IntMap, LocationTable};
use crate::reader::Reader;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::io::Read;
use std::path::{Path, PathBuf};

/// What the comparison leaves out.
#[derive(Clone, Copy, Debug, Default)]
pub struct CompareOptions {
    /// Ignore nsamples (after thinning, merged counts are ≤ the source's).
    pub ignore_nsamples: bool,
    /// Drop this many root (caller-most) frames of each merged backtrace (`--tag-processes`).
    pub strip_root_frames: usize,
}

/// One allocation's identity, hashed to 128 bits.
pub type Digest = u128;

fn h128<T: Hash>(x: &T) -> u128 {
    let mut a = std::collections::hash_map::DefaultHasher::new();
    1u8.hash(&mut a);
    x.hash(&mut a);
    let mut b = std::collections::hash_map::DefaultHasher::new();
    2u8.hash(&mut b);
    x.hash(&mut b);
    ((a.finish() as u128) << 64) | b.finish() as u128
}

/// Summary of one trace's allocations.
#[derive(Clone, Debug, Default)]
pub struct AllocationSet {
    /// Multiset of allocation digests.
    pub counts: HashMap<Digest, i64>,
    pub allocs: u64,
    pub samples: u64,
    /// promote/collect events naming objects that are not live
    pub orphan_events: u64,
}

struct Partial {
    base: u128,
    nsamples: u64,
    promote: Option<u64>,
}

/// Every allocation of a trace as (digest of everything but nsamples, nsamples), the digest
/// covering time, kind, length, resolved backtrace (less `strip_root_frames` root frames),
/// promote and collect times. Also returns the count of promote/collect events naming
/// objects that are not live.
pub fn allocations<R: Read>(
    reader: &mut Reader<R>,
    strip_root_frames: usize,
) -> Result<(Vec<(Digest, u64)>, u64)> {
    let mut frame_hash: IntMap<LocationCode, u128> = IntMap::default();
    let mut live: IntMap<u64, Partial> = IntMap::default();
    let mut out = Vec::new();
    let mut orphans = 0;
    let finish = |out: &mut Vec<(Digest, u64)>, p: Partial, collect: Option<u64>| {
        out.push((h128(&(p.base, p.promote, collect)), p.nsamples));
    };
    while let Some((ev, table)) = reader.next_with_locations()? {
        match ev {
            Event::Alloc(a) => {
                let bt = &a.backtrace[strip_root_frames.min(a.backtrace.len())..];
                let mut fh = Vec::with_capacity(bt.len());
                for c in bt {
                    let h = *frame_hash
                        .entry(*c)
                        .or_insert_with(|| resolve_hash(table, *c));
                    fh.push(h);
                }
                let base = h128(&(a.time.0, a.source as u8, a.length, fh));
                if let Some(old) = live.insert(
                    a.id.0,
                    Partial {
                        base,
                        nsamples: a.nsamples,
                        promote: None,
                    },
                ) {
                    finish(&mut out, old, None);
                }
            }
            Event::Promote { time, id, .. } => match live.get_mut(&id.0) {
                Some(p) => p.promote = Some(time.0),
                None => orphans += 1,
            },
            Event::Collect { time, id, .. } => match live.remove(&id.0) {
                Some(p) => finish(&mut out, p, Some(time.0)),
                None => orphans += 1,
            },
        }
    }
    let mut rest: Vec<_> = live.into_iter().collect();
    rest.sort_by_key(|(id, _)| *id);
    for (_, p) in rest {
        finish(&mut out, p, None);
    }
    Ok((out, orphans))
}

/// Add (sign 1) or remove (sign -1) a trace's allocations to/from a multiset.
pub fn allocation_set<R: Read>(
    reader: &mut Reader<R>,
    opts: CompareOptions,
    into: &mut AllocationSet,
    sign: i64,
) -> Result<()> {
    let (list, orphans) = allocations(reader, opts.strip_root_frames)?;
    into.orphan_events += orphans;
    for (d, ns) in list {
        into.allocs += 1;
        into.samples += ns;
        let key = if opts.ignore_nsamples {
            d
        } else {
            h128(&(d, ns))
        };
        *into.counts.entry(key).or_insert(0) += sign;
    }
    into.counts.retain(|_, v| *v != 0);
    Ok(())
}

fn resolve_hash(table: &LocationTable, c: LocationCode) -> u128 {
    match table.get(&c) {
        Some(l) => h128(&(1u8, &l[..])),
        None => h128(&(0u8, c.0)),
    }
}

/// The outcome of comparing sources with a merged trace.
#[derive(Clone, Debug, Default)]
pub struct CompareReport {
    pub source_allocs: u64,
    pub merged_allocs: u64,
    pub source_samples: u64,
    pub merged_samples: u64,
    /// Allocations of the sources missing from the merged trace (as a multiset).
    pub missing: u64,
    /// Allocations of the merged trace with no source.
    pub extra: u64,
    /// Promote/collect events of the merged trace naming no live object.
    pub merged_orphans: u64,
}

impl CompareReport {
    pub fn equal(&self) -> bool {
        self.missing == 0 && self.extra == 0 && self.merged_orphans == 0
    }
}

/// Compare the union of `sources`' allocations with `merged`'s.
pub fn compare(sources: &[PathBuf], merged: &Path, opts: CompareOptions) -> Result<CompareReport> {
    let mut set = AllocationSet::default();
    let src_opts = CompareOptions {
        strip_root_frames: 0,
        ..opts
    };
    for p in &crate::merge::expand_inputs(sources)? {
        let mut r = Reader::open(p)?;
        allocation_set(&mut r, src_opts, &mut set, 1)?;
    }
    let (sa, ss) = (set.allocs, set.samples);
    set.allocs = 0;
    set.samples = 0;
    set.orphan_events = 0;
    let mut r = Reader::open(merged)?;
    allocation_set(&mut r, opts, &mut set, -1)?;
    let missing = set
        .counts
        .values()
        .filter(|&&v| v > 0)
        .map(|&v| v as u64)
        .sum();
    let extra = set
        .counts
        .values()
        .filter(|&&v| v < 0)
        .map(|&v| (-v) as u64)
        .sum();
    Ok(CompareReport {
        source_allocs: sa,
        merged_allocs: set.allocs,
        source_samples: ss,
        merged_samples: set.samples,
        missing,
        extra,
        merged_orphans: set.orphan_events,
    })
}
