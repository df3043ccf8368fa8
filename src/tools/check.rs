//! Trace validation for the `check` command: everything the reference reader checks, plus
//! location codes resolving and object lifecycles, streaming (only the live-object set grows).

use crate::error::{Error, Position, Result};
use crate::format::event::{Event, LocationCode, ObjId};
use crate::format::location::IntMap;
use crate::reader::{Reader, Warning};
use crate::tools::summary::NewFrames;
use std::collections::BTreeMap;
use std::fmt;
use std::io::Read;
use std::path::Path;

/// How to check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckOptions {
    /// Problems kept in the report; further ones are only counted.
    pub max_problems: usize,
}

impl Default for CheckOptions {
    fn default() -> Self {
        CheckOptions { max_problems: 100 }
    }
}

/// One reason a trace is invalid.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Problem {
    /// File, byte offset and packet. For a reader error: where the reader stopped. For a
    /// location or lifecycle problem: the reader's position just after the offending event.
    pub at: Position,
    /// What is wrong, in words.
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.at, self.message)
    }
}

/// The outcome of checking one trace.
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct CheckReport {
    /// The trace checked (the name given to the reader).
    pub file: String,
    /// Events read (up to a reader error, if any).
    pub allocs: u64,
    /// Promote events read.
    pub promotes: u64,
    /// Collect events read.
    pub collects: u64,
    /// Sum of the allocations' nsamples.
    pub samples: u64,
    /// Objects allocated and not collected at the end (or when reading stopped).
    pub live_at_end: u64,
    /// Problems found, in the order found (at most `max_problems`).
    pub problems: Vec<Problem>,
    /// Problems beyond `max_problems`, counted only.
    pub problems_dropped: u64,
    /// The reader stopped on an error (always the last problem).
    pub reader_error: bool,
    /// The reader's warnings (skipped packets, tolerated oddities).
    pub warnings: Vec<Warning>,
    /// Warnings the reader counted but did not keep.
    pub warnings_dropped: u64,
}

impl CheckReport {
    /// No problems (warnings allowed).
    pub fn is_valid(&self) -> bool {
        self.problems.is_empty() && self.problems_dropped == 0
    }
    /// `allocs=N promotes=N collects=N samples=N`, as the reference validator prints them.
    pub fn counts(&self) -> String {
        format!(
            "allocs={} promotes={} collects={} samples={}",
            self.allocs, self.promotes, self.collects, self.samples
        )
    }
    fn problem(&mut self, max: usize, at: Position, message: String) {
        if self.problems.len() < max {
            self.problems.push(Problem { at, message });
        } else {
            self.problems_dropped += 1;
        }
    }
}

/// The set of ids ever allocated, as disjoint half-open ranges (start → end). Ids come in
/// runs (one run in formats 1-2, one per id chunk in format 3), so this stays tiny.
#[derive(Default)]
struct IdRanges {
    ranges: BTreeMap<u64, u64>,
}

impl IdRanges {
    fn contains(&self, id: u64) -> bool {
        self.ranges
            .range(..=id)
            .next_back()
            .is_some_and(|(_, &end)| id < end)
    }
    /// Add `id` (not already present).
    fn insert(&mut self, id: u64) {
        let before = self.ranges.range(..=id).next_back().map(|(&s, &e)| (s, e));
        let after_end = self.ranges.get(&(id + 1)).copied();
        match (before, after_end) {
            (Some((s, e)), Some(e2)) if e == id => {
                self.ranges.remove(&(id + 1));
                self.ranges.insert(s, e2);
            }
            (Some((s, e)), None) if e == id => {
                self.ranges.insert(s, id + 1);
            }
            (_, Some(e2)) => {
                self.ranges.remove(&(id + 1));
                self.ranges.insert(id, e2);
            }
            _ => {
                self.ranges.insert(id, id + 1);
            }
        }
    }
}

/// Object lifecycle state: ids ever allocated, and the live ones (with a promoted flag).
#[derive(Default)]
struct Lifecycle {
    allocated: IdRanges,
    live: IntMap<u64, bool>,
}

impl Lifecycle {
    fn alloc(&mut self, id: ObjId) -> Option<String> {
        if self.allocated.contains(id.0) {
            return Some(format!(
                "allocation of object {} whose id was already allocated",
                id.0
            ));
        }
        self.allocated.insert(id.0);
        self.live.insert(id.0, false);
        None
    }
    fn dead_why(&self, id: ObjId) -> &'static str {
        if self.allocated.contains(id.0) {
            "already collected"
        } else {
            "never allocated before"
        }
    }
    fn promote(&mut self, id: ObjId) -> Option<String> {
        match self.live.get_mut(&id.0) {
            Some(promoted) if *promoted => {
                Some(format!("promote of object {}: already promoted", id.0))
            }
            Some(promoted) => {
                *promoted = true;
                None
            }
            None => Some(format!("promote of object {}: {}", id.0, self.dead_why(id))),
        }
    }
    fn collect(&mut self, id: ObjId) -> Option<String> {
        match self.live.remove(&id.0) {
            Some(_) => None,
            None => Some(format!("collect of object {}: {}", id.0, self.dead_why(id))),
        }
    }
}

/// Check a whole trace. Errors of the trace (the reader's errors included) end up in the
/// report's problems; `Err` only for an I/O error of the input.
///
/// A trace is **valid** when it reads to the end without a reader error, every backtrace code
/// was defined by an earlier location event, and every promote/collect names a live object
/// (allocated earlier in the file, not collected yet; promoted at most once). Reader
/// *warnings* (skipped packets: wrong pid, out of sequence, truncated body or header) do not
/// make a trace invalid: like the reference reader, whose validator says `ok` for
/// `truncated.ctf` and the spliced `synthetic/` traces, we read on and report them.
///
/// Deliberate difference: a file cut inside a packet header (`truncated-header.ctf`) makes
/// the reference reader crash (`Buffer underflow`); our reader ends the trace there with a
/// warning, so such a trace is valid with a warning here, with the counts of what was read.
///
/// In format 3 object ids are handed out in per-domain chunks and a collect may name another
/// domain's object: live objects are tracked globally by id, in file order.
/// Allocations with nsamples = 0 are accepted, as the reference reader accepts them.
pub fn check<R: Read>(reader: &mut Reader<R>, opts: &CheckOptions) -> Result<CheckReport> {
    let mut rep = CheckReport {
        file: reader.name().to_string(),
        ..Default::default()
    };
    let max = opts.max_problems;
    let mut life = Lifecycle::default();
    let mut frames = NewFrames::default();
    let mut undefined: IntMap<LocationCode, ()> = IntMap::default();
    loop {
        let (ev, table) = match reader.next_with_locations() {
            Ok(Some(x)) => x,
            Ok(None) => break,
            Err(Error::Malformed { at, what }) => {
                rep.reader_error = true;
                rep.problem(usize::MAX, at, what.to_string());
                break;
            }
            Err(e) => return Err(e),
        };
        let mut bad = None;
        match ev {
            Event::Alloc(a) => {
                rep.allocs += 1;
                rep.samples += a.nsamples;
                // Frames shared with the domain's previous backtrace were resolved then.
                let mut missing: Vec<String> = vec![];
                for &c in frames.new_frames(a.domain.0, a.backtrace) {
                    if !table.contains_key(&c) && undefined.insert(c, ()).is_none() {
                        missing.push(format!("{:#x}", c.0));
                    }
                }
                if !missing.is_empty() {
                    let s = if missing.len() == 1 { "" } else { "s" };
                    bad = Some(format!(
                        "invalid location code{s} {} in the backtrace of allocation {}: never defined by a location event",
                        missing.join(", "),
                        a.id.0
                    ));
                }
                if let Some(m) = life.alloc(a.id) {
                    bad = Some(bad.map_or(m.clone(), |b| format!("{b}; {m}")));
                }
            }
            Event::Promote { id, .. } => {
                rep.promotes += 1;
                bad = life.promote(id);
            }
            Event::Collect { id, .. } => {
                rep.collects += 1;
                bad = life.collect(id);
            }
        }
        if let Some(m) = bad {
            let at = reader.position();
            rep.problem(max, at, m);
        }
    }
    rep.live_at_end = life.live.len() as u64;
    rep.warnings = reader.take_warnings();
    rep.warnings_dropped = reader.warnings_dropped();
    // A reader error is always kept, even past max_problems.
    if rep.reader_error && rep.problems.len() > max {
        let last = rep.problems.pop().unwrap();
        rep.problems.truncate(max.saturating_sub(1));
        rep.problems.push(last);
        rep.problems_dropped += 1;
    }
    Ok(rep)
}

/// Open and check a file. Errors before any event (a bad info packet) become problems;
/// `Err` only when the file cannot be opened or read.
pub fn check_file(path: impl AsRef<Path>, opts: &CheckOptions) -> Result<CheckReport> {
    let path = path.as_ref();
    match Reader::open(path) {
        Ok(mut r) => check(&mut r, opts),
        Err(Error::Malformed { at, what }) => Ok(CheckReport {
            file: path.display().to_string(),
            problems: vec![Problem {
                at,
                message: what.to_string(),
            }],
            reader_error: true,
            ..Default::default()
        }),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn id_ranges_merge() {
        let mut r = IdRanges::default();
        for id in [0, 1, 2, 10_000, 10_001, 4, 3, 9_999] {
            assert!(!r.contains(id));
            r.insert(id);
            assert!(r.contains(id));
        }
        assert_eq!(r.ranges.len(), 2);
        assert_eq!(r.ranges.get(&0), Some(&5));
        assert_eq!(r.ranges.get(&9_999), Some(&10_002));
        assert!(!r.contains(5) && !r.contains(9_998) && !r.contains(10_002));
    }

    #[test]
    fn lifecycle_messages() {
        let mut l = Lifecycle::default();
        assert_eq!(l.alloc(ObjId(0)), None);
        assert_eq!(l.promote(ObjId(0)), None);
        assert!(l.promote(ObjId(0)).unwrap().contains("already promoted"));
        assert_eq!(l.collect(ObjId(0)), None);
        assert!(l.collect(ObjId(0)).unwrap().contains("already collected"));
        assert!(l.promote(ObjId(0)).unwrap().contains("already collected"));
        assert!(l.collect(ObjId(7)).unwrap().contains("never allocated"));
        assert!(l.alloc(ObjId(0)).unwrap().contains("already allocated"));
    }
}
