//! Semantic comparison of traces: each allocation as (absolute time, kind, nsamples, length,
//! backtrace as resolved locations, promote time, collect time), compared as multisets.

use crate::error::Result;
use crate::format::event::{Event, LocationCode};
use crate::format::location::{IntMap, Location, LocationTable};
use crate::reader::Reader;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::io::Read;
use std::path::{Path, PathBuf};

/// How the merged trace was made, which the comparison allows for.
#[derive(Clone, Copy, Debug, Default)]
pub struct CompareOptions {
    /// Sources sampled faster than the slowest were thinned to its rate (the merge's
    /// default): each merged allocation of theirs has at least 1 and at most the source's
    /// samples, and those thinning took every sample of are missing (dropped). Sources at
    /// the slowest rate are matched exactly.
    pub thinned: bool,
    /// Every merged backtrace has its source's root frame (`--tag-processes`): each
    /// source's backtraces are compared with that frame first.
    pub tagged: bool,
    /// Sources are read as the merge reads them, and one that ends in an error counts as
    /// far as it reads rather than fail the comparison: a format-3 source a domain at a
    /// time, each domain to its end or its first error, the domains' events then taken in
    /// time order (holding them all in memory).
    pub readable_part: bool,
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

struct Partial {
    base: u128,
    nsamples: u64,
    promote: Option<u64>,
}

/// Every allocation of a trace as (digest of everything but nsamples, nsamples), the digest
/// covering time, kind, length, resolved backtrace (after `root`, a frame put before each
/// one), promote and collect times. Also returns the count of events no object's life
/// allows: a promote or collect of an object that is not live, a second promote, an
/// allocation of an id still live.
pub fn allocations<R: Read>(
    reader: &mut Reader<R>,
    root: Option<&Location>,
) -> Result<(Vec<(Digest, u64)>, u64)> {
    let (list, bad, error) = allocations_upto(reader, root);
    match error {
        Some(e) => Err(e),
        None => Ok((list, bad)),
    }
}

/// [`allocations`] as far as the trace reads: an error ends the list, and is returned
/// beside it.
fn allocations_upto<R: Read>(
    reader: &mut Reader<R>,
    root: Option<&Location>,
) -> (Vec<(Digest, u64)>, u64, Option<crate::error::Error>) {
    let mut frame_hash: IntMap<LocationCode, u128> = IntMap::default();
    let mut live: IntMap<u64, Partial> = IntMap::default();
    let mut out = Vec::new();
    let mut bad = 0;
    let root = root.map(|l| list_hash(std::slice::from_ref(l)));
    let mut error = None;
    loop {
        let (ev, table) = match reader.next_with_locations() {
            Ok(Some(e)) => e,
            Ok(None) => break,
            Err(e) => {
                error = Some(e);
                break;
            }
        };
        match ev {
            Event::Alloc(a) => {
                let base = alloc_digest(&a, table, root, &mut frame_hash);
                if let Some(old) = live.insert(
                    a.id.0,
                    Partial {
                        base,
                        nsamples: a.nsamples,
                        promote: None,
                    },
                ) {
                    bad += 1;
                    finish(&mut out, old, None);
                }
            }
            Event::Promote { time, id, .. } => match live.get_mut(&id.0) {
                Some(p) if p.promote.is_none() => p.promote = Some(time.0),
                _ => bad += 1,
            },
            Event::Collect { time, id, .. } => match live.remove(&id.0) {
                Some(p) => finish(&mut out, p, Some(time.0)),
                None => bad += 1,
            },
        }
    }
    finish_live(&mut out, live);
    (out, bad, error)
}

/// An allocation's entry: its digest with its promote and collect times, and its samples.
fn finish(out: &mut Vec<(Digest, u64)>, p: Partial, collect: Option<u64>) {
    out.push((h128(&(p.base, p.promote, collect)), p.nsamples));
}

/// The entries of the objects still live at the end (never collected), in id order.
fn finish_live(out: &mut Vec<(Digest, u64)>, live: IntMap<u64, Partial>) {
    let mut rest: Vec<_> = live.into_iter().collect();
    rest.sort_by_key(|(id, _)| *id);
    for (_, p) in rest {
        finish(out, p, None);
    }
}

/// What [`by_domain`] keeps of an event: an allocation's digest but for its promote and
/// collect times (and its samples), or the time of a promote or collect.
enum Kept {
    Alloc(u128, u64),
    Promote,
    Collect,
}

impl Kept {
    /// The order of an object's events within a microsecond.
    fn rank(&self) -> u8 {
        match self {
            Kept::Alloc(..) => 0,
            Kept::Promote => 1,
            Kept::Collect => 2,
        }
    }
}

/// [`allocations`] of a format-3 trace read as the merge reads it: each domain on its own
/// (its packets alone, to its end or to an error, which ends only that domain: true when
/// one did), the domains' events then taken in time order, a microsecond's allocations
/// before its promotes and those before its collects (other ties in the order of the
/// domains: an object allocated in one domain may be promoted there and collected by
/// another in the same microsecond), a promote or collect of an object not live dropped.
/// Holds every event of the trace in memory.
fn by_domain(path: &Path, root: Option<&Location>) -> Result<(Vec<(Digest, u64)>, bool)> {
    let root = root.map(|l| list_hash(std::slice::from_ref(l)));
    let mut events: Vec<(u64, usize, u64, Kept)> = Vec::new();
    let mut cut = false;
    for (k, d) in crate::reader::scan_domains(path)?.into_iter().enumerate() {
        let mut r = Reader::open(path)?;
        r.set_domain_filter(Some(d));
        let mut frame_hash: IntMap<LocationCode, u128> = IntMap::default();
        loop {
            let (ev, table) = match r.next_with_locations() {
                Ok(Some(e)) => e,
                Ok(None) => break,
                Err(_) => {
                    cut = true;
                    break;
                }
            };
            let (time, id, kept) = match ev {
                Event::Alloc(a) => {
                    let base = alloc_digest(&a, table, root, &mut frame_hash);
                    (a.time.0, a.id.0, Kept::Alloc(base, a.nsamples))
                }
                Event::Promote { time, id, .. } => (time.0, id.0, Kept::Promote),
                Event::Collect { time, id, .. } => (time.0, id.0, Kept::Collect),
            };
            events.push((time, k, id, kept));
        }
    }
    // (stable: each domain's own order kept)
    events.sort_by_key(|e| (e.0, e.3.rank(), e.1));
    let mut live: IntMap<u64, Partial> = IntMap::default();
    let mut out = Vec::new();
    for (time, _, id, kept) in events {
        // (a promote or collect of an object not live is dropped: no allocation can come
        // later in its microsecond)
        match kept {
            Kept::Alloc(base, nsamples) => {
                let p = Partial {
                    base,
                    nsamples,
                    promote: None,
                };
                if let Some(old) = live.insert(id, p) {
                    finish(&mut out, old, None);
                }
            }
            Kept::Promote => {
                if let Some(p) = live.get_mut(&id) {
                    p.promote.get_or_insert(time);
                }
            }
            Kept::Collect => {
                if let Some(p) = live.remove(&id) {
                    finish(&mut out, p, Some(time));
                }
            }
        }
    }
    finish_live(&mut out, live);
    Ok((out, cut))
}

/// An allocation's digest but for its samples, promote and collect: time, kind, length and
/// backtrace as resolved locations (`root`'s hash first, if any; each code's hash kept in
/// `frame_hash`).
fn alloc_digest(
    a: &crate::format::event::Alloc<'_>,
    table: &LocationTable,
    root: Option<u128>,
    frame_hash: &mut IntMap<LocationCode, u128>,
) -> u128 {
    let mut fh = Vec::with_capacity(a.backtrace.len() + 1);
    fh.extend(root);
    for c in a.backtrace {
        let h = *frame_hash
            .entry(*c)
            .or_insert_with(|| resolve_hash(table, *c));
        fh.push(h);
    }
    h128(&(a.time.0, a.source as u8, a.length, fh))
}

fn resolve_hash(table: &LocationTable, c: LocationCode) -> u128 {
    match table.get(&c) {
        Some(l) => list_hash(l),
        None => h128(&(0u8, c.0)),
    }
}

fn list_hash(l: &[Location]) -> u128 {
    h128(&(1u8, l))
}

/// The outcome of comparing sources with a merged trace.
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct CompareReport {
    /// Allocations in the sources.
    pub source_allocs: u64,
    /// Allocations in the merged trace.
    pub merged_allocs: u64,
    /// Samples of the sources' allocations.
    pub source_samples: u64,
    /// Samples of the merged trace's allocations.
    pub merged_samples: u64,
    /// Allocations of the sources missing from the merged trace (as a multiset), not
    /// counting those thinning dropped.
    pub missing: u64,
    /// Allocations of the merged trace with no source (or more samples than its source's).
    pub extra: u64,
    /// Allocations of thinned sources left out of the merged trace.
    pub dropped: u64,
    /// Events of the merged trace that no object's life allows ([`allocations`]).
    pub merged_bad_events: u64,
    /// Warnings reading the merged trace (skipped packets, ...), which a merge never causes.
    pub merged_warnings: u64,
    /// Sources that ended in an error, taken as far as they read
    /// ([`CompareOptions::readable_part`]).
    pub sources_cut: u64,
}

impl std::fmt::Display for CompareReport {
    /// One line: both sides' counts, the differences, and `equal` or `DIFFERENT`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let cut = if self.sources_cut > 0 {
            format!(" ({} taken as far as they read)", self.sources_cut)
        } else {
            String::new()
        };
        write!(
            f,
            "sources: {} allocs, {} samples{cut}; merged: {} allocs, {} samples; missing {}, \
             extra {}, dropped by thinning {}, impossible events {}, warnings {}: {}",
            self.source_allocs,
            self.source_samples,
            self.merged_allocs,
            self.merged_samples,
            self.missing,
            self.extra,
            self.dropped,
            self.merged_bad_events,
            self.merged_warnings,
            if self.equal() { "equal" } else { "DIFFERENT" }
        )
    }
}

impl CompareReport {
    /// Whether the merged trace holds exactly the sources' allocations (thinning aside)
    /// and nothing impossible.
    pub fn equal(&self) -> bool {
        self.missing == 0
            && self.extra == 0
            && self.merged_bad_events == 0
            && self.merged_warnings == 0
    }
}

/// Compare the union of `sources`' allocations with `merged`'s.
pub fn compare(sources: &[PathBuf], merged: &Path, opts: CompareOptions) -> Result<CompareReport> {
    let paths = crate::merge::expand_inputs(sources, merged)?;
    // (the rates first, from each info packet: one source open at a time)
    let mut rates = Vec::with_capacity(paths.len());
    for p in &paths {
        rates.push(Reader::open(p)?.info().sample_rate);
    }
    let slowest = rates.iter().copied().fold(f64::INFINITY, f64::min);
    let mut rep = CompareReport::default();
    // exact: (digest, nsamples) -> count; thinned: digest -> the sources' nsamples
    let mut exact: HashMap<(Digest, u64), i64> = HashMap::new();
    let mut thinned: HashMap<Digest, Vec<u64>> = HashMap::new();
    for (p, rate) in paths.iter().zip(rates) {
        let mut r = Reader::open(p)?;
        let thin = opts.thinned && rate > slowest;
        let tag = opts.tagged.then(|| crate::merge::process_tag(p, r.info()));
        let (list, cut) = if opts.readable_part && r.info().version >= 3 {
            drop(r);
            by_domain(p, tag.as_ref())?
        } else {
            let (list, _, error) = allocations_upto(&mut r, tag.as_ref());
            match error {
                Some(e) if !opts.readable_part => return Err(e),
                e => (list, e.is_some()),
            }
        };
        rep.sources_cut += cut as u64;
        for (d, ns) in list {
            rep.source_allocs += 1;
            rep.source_samples += ns;
            if thin {
                thinned.entry(d).or_default().push(ns);
            } else {
                *exact.entry((d, ns)).or_insert(0) += 1;
            }
        }
    }
    let mut r = Reader::open(merged)?;
    let (list, bad) = allocations(&mut r, None)?;
    rep.merged_bad_events = bad;
    rep.merged_warnings = r.warnings().len() as u64 + r.warnings_dropped();
    let mut from_thinned: HashMap<Digest, Vec<u64>> = HashMap::new();
    for (d, ns) in list {
        rep.merged_allocs += 1;
        rep.merged_samples += ns;
        match exact.get_mut(&(d, ns)) {
            Some(c) if *c > 0 => *c -= 1,
            _ => from_thinned.entry(d).or_default().push(ns),
        }
    }
    rep.missing = exact.values().map(|&c| c as u64).sum();
    // Each merged allocation of a thinned source needs its own source allocation of as
    // many samples or more, at least 1 (matched largest to largest, which finds one where
    // any does); one of no samples stays as it was, the others may be dropped.
    for (d, got) in from_thinned {
        let had = thinned.remove(&d).unwrap_or_default();
        let (mut got, got_none): (Vec<u64>, Vec<u64>) = got.into_iter().partition(|&n| n > 0);
        let (mut had, had_none): (Vec<u64>, Vec<u64>) = had.into_iter().partition(|&n| n > 0);
        rep.extra += got_none.len().saturating_sub(had_none.len()) as u64;
        rep.missing += had_none.len().saturating_sub(got_none.len()) as u64;
        had.sort_unstable_by(|a, b| b.cmp(a));
        got.sort_unstable_by(|a, b| b.cmp(a));
        for (k, &n) in got.iter().enumerate() {
            if had.get(k).is_none_or(|&h| n > h) {
                rep.extra += 1;
            }
        }
        rep.dropped += had.len().saturating_sub(got.len()) as u64;
    }
    for had in thinned.values() {
        let none = had.iter().filter(|&&n| n == 0).count() as u64;
        rep.missing += none;
        rep.dropped += had.len() as u64 - none;
    }
    Ok(rep)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::event::AllocHeader;
    use crate::format::event::{AllocSource, DomainId, ObjId, Timestamp};
    use crate::writer::{tests::info, tests::locs, Writer, WriterOptions};

    /// A trace of three allocations, the first promoted and all collected, with `extra`
    /// called after the first allocation to add events.
    fn trace(path: &Path, extra: impl Fn(&mut Writer<std::fs::File>, ObjId)) {
        let file = std::fs::File::create(path).unwrap();
        let mut w = Writer::new(file, &info(2), WriterOptions::default()).unwrap();
        let bt = [LocationCode(5), LocationCode(6)];
        let t = |k: u64| Timestamp(1_000_000 + k);
        let d = DomainId(0);
        let a = w
            .put_alloc(
                &AllocHeader {
                    time: t(1),
                    domain: d,
                    length: 3,
                    nsamples: 1,
                    source: AllocSource::Minor,
                },
                &bt,
                locs,
            )
            .unwrap();
        extra(&mut w, a);
        w.put_promote(t(4), d, a).unwrap();
        let b = w
            .put_alloc(
                &AllocHeader {
                    time: t(5),
                    domain: d,
                    length: 4,
                    nsamples: 2,
                    source: AllocSource::Major,
                },
                &bt[..1],
                locs,
            )
            .unwrap();
        let c = w
            .put_alloc(
                &AllocHeader {
                    time: t(6),
                    domain: d,
                    length: 5,
                    nsamples: 1,
                    source: AllocSource::Minor,
                },
                &bt,
                locs,
            )
            .unwrap();
        for (k, id) in [a, b, c].into_iter().enumerate() {
            w.put_collect(t(10 + k as u64), d, id).unwrap();
        }
        w.finish().unwrap();
    }

    /// Events no object's life allows make traces differ, even when every allocation has
    /// its twin: a second promote, a collect of an object not live.
    #[test]
    fn impossible_events_make_traces_differ() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("src.ctf");
        trace(&src, |_, _| {});
        let same = compare(std::slice::from_ref(&src), &src, CompareOptions::default()).unwrap();
        assert!(same.equal() && same.merged_allocs == 3, "{same:?}");
        let twice = dir.path().join("twice.ctf");
        trace(&twice, |w, a| {
            w.put_promote(Timestamp(1_000_002), DomainId(0), a).unwrap()
        });
        let collect_dead = dir.path().join("dead.ctf");
        trace(&collect_dead, |w, a| {
            w.put_collect(Timestamp(1_000_002), DomainId(0), a).unwrap();
        });
        for bad in [twice, collect_dead] {
            let c = compare(std::slice::from_ref(&src), &bad, CompareOptions::default()).unwrap();
            assert!(
                !c.equal() && c.merged_bad_events > 0,
                "{}: {c:?}",
                bad.display()
            );
        }
    }

    /// A merged trace the reader warns about (here a packet of another process, skipped)
    /// differs from its sources, whose readable parts it may otherwise hold.
    #[test]
    fn a_merged_trace_with_reader_warnings_differs() {
        let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/synthetic/wrong-pid.ctf");
        let c = compare(std::slice::from_ref(&p), &p, CompareOptions::default()).unwrap();
        assert!(c.missing == 0 && c.extra == 0 && c.merged_warnings > 0 && !c.equal());
    }
}
