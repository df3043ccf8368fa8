//! Call sites: every input's backtraces known by fingerprints and interned as nodes of one
//! tree of frames (a node: its last frame and its parent), the cells counted under them,
//! and the names a report gives them.

use crate::format::event::{AllocSource, LocationCode};
use crate::format::location::{IntMap, Location, LocationList, LocationTable};
use crate::pipeline::{lock, try_lock};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

/// A node of the tree of backtraces: `code` called from `parent` (None: the program's
/// entry). One tree holds every input's backtraces: a node is a path of codes, which each
/// process's location table names ([`Cell::process`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Node {
    pub(crate) parent: Option<u32>,
    pub(crate) code: LocationCode,
}

/// What the analysis counts apart: one backtrace (node) of one process, domain and kind of
/// allocation, so that reports can filter and label by them.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Cell {
    pub(crate) node: u32,
    pub(crate) process: u32,
    pub(crate) domain: u16,
    pub(crate) source: AllocSource,
}

/// The backtraces met while the streams are read, shared by the threads that read them
/// (under a lock, taken only when a stream meets a backtrace it had not met): workers of
/// one executable share their paths, and thousands of inputs hold one tree, not thousands.
#[derive(Default)]
pub(crate) struct Backtraces {
    nodes: Vec<Node>,
    /// The node of each backtrace met, by fingerprint (those of all their prefixes too).
    by_fingerprint: IntMap<u64, u32>,
}

/// A stream's cells, while it is read.
#[derive(Default)]
pub(crate) struct StreamCells {
    /// The stream's process and domain, every cell's.
    process: u32,
    domain: u16,
    cells: Vec<Cell>,
    /// The id of each.
    numbers: Vec<u32>,
    /// Cells whose backtraces wait for the tree: the thread that made them found it locked
    /// at the end of its batch, and went on rather than waited.
    held: NewCells,
}

/// When [`StreamCells::intern_new`] waits for the tree's lock.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Wait {
    /// If another thread holds it, the cells wait (for the next call) unless there are
    /// many of them.
    IfMany,
    /// Always: the stream is over, or the caller cannot keep them.
    Always,
}

/// The cells a thread made in the stream it decodes since it last interned their
/// backtraces ([`StreamCells::intern_new`]): under one lock of the tree that every
/// thread shares, rather than one a cell. A thread's, not a stream's: thousands of
/// streams do not each keep its room (a stream holds some only while the tree is locked
/// by another thread, and with few streams: [`StreamCells::hold`]).
#[derive(Default)]
pub(crate) struct NewCells {
    /// (the cell's index among its stream's, where its frames start in `frames`)
    cells: Vec<(u32, u32)>,
    /// Their backtraces' frames, one after another.
    frames: Vec<LocationCode>,
    /// Their prefixes' fingerprints, one more each than its frames.
    fps: Vec<u64>,
}

/// Every stream's backtraces and cells, joined ([`Tree::join`]), with each input's location
/// table: what the reports name sites with.
#[derive(Default)]
pub(crate) struct Tree {
    pub(crate) nodes: Vec<Node>,
    pub(crate) cells: Vec<Cell>,
    pub(crate) locations: Vec<LocationTable>,
}

/// Cell ids as one thread hands them out, for the pass to count by while streams are read
/// on several threads: taken a block at a time from a counter shared by the threads (one
/// counter written at every new cell would be a cache line passed between the cores).
/// The ids left over are no cell's.
pub(crate) struct Ids {
    counter: Arc<AtomicU32>,
    spare: std::ops::Range<u32>,
}

impl Ids {
    pub(crate) fn new(counter: Arc<AtomicU32>) -> Ids {
        Ids {
            counter,
            spare: 0..0,
        }
    }

    fn next(&mut self) -> u32 {
        if self.spare.is_empty() {
            let first = self.counter.fetch_add(ID_BLOCK, Ordering::Relaxed);
            self.spare = first..first.saturating_add(ID_BLOCK);
        }
        self.spare.next().unwrap_or(u32::MAX)
    }
}

/// A stream's previous backtrace, so that the next one, which shares a prefix with it, is
/// known by the work of its new frames only.
///
/// A backtrace is known by a fingerprint of its frames (64 bits: the sum of a multiply-fold
/// of each code with its depth), so that finding its cell is one table lookup, not one step
/// a frame through the tree: deep recursions give thousands of new frames an allocation.
/// (Each frame's part is made apart from the others', so that a deep backtrace is not
/// fingerprinted at one multiply's latency a frame.) Two different backtraces get one
/// fingerprint (and share a cell) with a chance of about 2^-64 a pair: for a million
/// backtraces, about 3 in 10^8.
pub(crate) struct Path {
    /// `fps[k]`: the fingerprint of the first `k` frames (`fps[0]`: of no frame).
    fps: Vec<u64>,
}

/// Frames of new cells a thread holds before it interns them (a stream's first batch
/// meets thousands of backtraces: not all of them held).
const NEW_FRAMES: usize = 4096;

/// Frames of new cells a thread or a stream holds at most while another thread holds the
/// tree: past them it waits for the lock.
const HELD_FRAMES: usize = 4 * NEW_FRAMES;

/// Frames of a backtrace from which its new cell is interned at once, under the tree's
/// lock, rather than copied with its fingerprints to be interned with the batch's others:
/// copying the thousands of frames of deep recursions cost more than the lock.
const DIRECT_FRAMES: usize = 512;

/// Cell ids a thread takes at a time.
const ID_BLOCK: u32 = 256;

/// The fingerprint of no frame.
const SEED: u64 = 0x243f_6a88_85a3_08d3;

/// A fingerprint `h` marked with `code` (a kind of allocation, or no backtrace): a
/// multiply folded (the high half of the product into the low), which mixes every bit of
/// both.
#[inline(always)]
fn step(h: u64, code: u64) -> u64 {
    let m = u128::from(h ^ code) * u128::from(0x9e37_79b9_7f4a_7c15u64);
    (m as u64) ^ ((m >> 64) as u64)
}

/// A frame's part of a fingerprint: `code` at depth `k`, mixed by a folded multiply.
#[inline(always)]
fn term(code: u64, k: usize) -> u64 {
    let m = u128::from(code ^ 0xa076_1d64_78bd_642f)
        * u128::from((k as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0xe703_7ed1_a0b4_28db);
    (m as u64) ^ ((m >> 64) as u64)
}

impl Default for Path {
    /// The path of a stream before its first backtrace.
    fn default() -> Path {
        Path { fps: vec![SEED] }
    }
}

impl Path {
    /// The fingerprint of `backtrace` (caller first), whose first `common` frames are
    /// those of the previous one; it becomes the previous one.
    #[inline]
    pub(crate) fn fingerprint(&mut self, common: usize, backtrace: &[LocationCode]) -> u64 {
        // (a prefix longer than the previous backtrace: the reader kept frames of an
        // earlier one, which these fingerprints do not cover)
        let common = common.min(self.fps.len() - 1).min(backtrace.len());
        self.fps.truncate(common + 1);
        let mut h = self.fps[common];
        (self.fps).extend((backtrace[common..].iter().enumerate()).map(|(k, code)| {
            h = h.wrapping_add(term(code.0, common + k));
            h
        }));
        h
    }
}

/// The key of a cell in its stream: the fingerprint of its backtrace with its kind of
/// allocation as one more frame (a backtrace's keys end with exactly one such mark).
#[inline]
pub(crate) fn cell_key(fingerprint: u64, source: AllocSource) -> u64 {
    step(fingerprint, 0x5eed_0000 ^ source as u64)
}

/// A stream's cells by their keys ([`cell_key`]): their ids and indices in the tree.
pub(crate) type CellTable = IntMap<u64, (u32, u32)>;

/// The frame of an allocation without a backtrace.
const NO_BACKTRACE: LocationCode = LocationCode(u64::MAX);

/// No node.
const NONE: u32 = u32::MAX;

impl Backtraces {
    /// The node of `backtrace` (caller first), `fps[k]` the fingerprint of its first `k`
    /// frames ([`Path::fingerprint`]): the nodes of its frames past its longest prefix
    /// already met are made.
    fn intern(&mut self, fps: &[u64], backtrace: &[LocationCode]) -> u32 {
        if backtrace.is_empty() {
            // (no backtrace: one node of its own, under no frame any trace defines)
            let key = step(fps[0], NO_BACKTRACE.0);
            return self.node(key, None, NO_BACKTRACE);
        }
        // (the prefixes met are closed under taking a prefix: the longest is found by
        // halving, and every node past it is new)
        let n = backtrace.len();
        // (down from the whole backtrace by doubling steps first: a new backtrace most
        // often adds a frame or a few to one met before)
        let (mut known, mut unknown) = (0, n + 1);
        let mut step = 1;
        let mut at = n;
        loop {
            if self.by_fingerprint.contains_key(&fps[at]) {
                known = at;
                break;
            }
            unknown = at;
            if at == 0 {
                break;
            }
            at = at.saturating_sub(step);
            step *= 2;
        }
        while unknown - known > 1 {
            let mid = (known + unknown) / 2;
            if self.by_fingerprint.contains_key(&fps[mid]) {
                known = mid;
            } else {
                unknown = mid;
            }
        }
        let mut parent = (known > 0).then(|| self.by_fingerprint[&fps[known]]);
        for k in known..n {
            parent = Some(self.node(fps[k + 1], parent, backtrace[k]));
        }
        parent.unwrap_or(NONE)
    }

    /// The node of fingerprint `key`, made if new.
    fn node(&mut self, key: u64, parent: Option<u32>, code: LocationCode) -> u32 {
        let next = self.nodes.len() as u32;
        let n = *self.by_fingerprint.entry(key).or_insert(next);
        if n == next {
            self.nodes.push(Node { parent, code });
        }
        n
    }
}

impl StreamCells {
    /// The cells of a stream of `process` in `domain`, none yet.
    pub(crate) fn new(process: u32, domain: u16) -> StreamCells {
        StreamCells {
            process,
            domain,
            ..StreamCells::default()
        }
    }

    /// A new cell: an allocation of the stream's of kind `source` at `backtrace`, which
    /// [`Path::fingerprint`] has just made `path`'s (its node is made when `new` is next
    /// interned, in `backtraces`); its id from `ids`. Returns the id and its index among
    /// the stream's cells.
    pub(crate) fn new_cell(
        &mut self,
        source: AllocSource,
        path: &Path,
        backtrace: &[LocationCode],
        ids: &mut Ids,
        new: &mut NewCells,
        backtraces: &std::sync::Mutex<Backtraces>,
    ) -> (u32, u32) {
        let local = self.cells.len() as u32;
        let id = ids.next();
        self.cells.push(Cell {
            node: NONE,
            process: self.process,
            domain: self.domain,
            source,
        });
        self.numbers.push(id);
        if backtrace.len() >= DIRECT_FRAMES {
            if let Some(mut t) = try_lock(backtraces) {
                self.cells[local as usize].node =
                    t.intern(&path.fps[..=backtrace.len()], backtrace);
                return (id, local);
            }
        }
        new.push(local, backtrace, &path.fps[..=backtrace.len()]);
        if new.frames.len() >= NEW_FRAMES {
            self.intern_new(new, backtraces, Wait::IfMany);
        }
        (id, local)
    }

    /// Intern the backtraces of `new`, this stream's cells made since the last call, and
    /// those it held. If another thread holds the tree and `wait` allows, they are left
    /// where they are: the caller tries again later in the batch, or at its end gives
    /// `new`'s to the stream to hold ([`StreamCells::hold`]).
    pub(crate) fn intern_new(
        &mut self,
        new: &mut NewCells,
        backtraces: &std::sync::Mutex<Backtraces>,
        wait: Wait,
    ) {
        if new.cells.is_empty() && self.held.cells.is_empty() {
            return;
        }
        let many = new.frames.len() + self.held.frames.len() >= HELD_FRAMES;
        let mut t = match try_lock(backtraces) {
            Some(t) => t,
            None if wait == Wait::Always || many => lock(backtraces),
            None => return,
        };
        for n in [&mut self.held, new] {
            for (local, bt, fps) in n.iter() {
                self.cells[local as usize].node = t.intern(fps, bt);
            }
            n.clear();
        }
        drop(t);
        // (what a stream held goes: thousands of streams do not each keep its room)
        self.held = NewCells::default();
    }

    /// Keep `new`'s cells (this stream's) until the stream's next batch.
    pub(crate) fn hold(&mut self, new: &mut NewCells) {
        for (local, bt, fps) in new.iter() {
            self.held.push(local, bt, fps);
        }
        new.clear();
    }
}

impl NewCells {
    fn push(&mut self, local: u32, backtrace: &[LocationCode], fps: &[u64]) {
        self.cells.push((local, self.frames.len() as u32));
        self.frames.extend_from_slice(backtrace);
        self.fps.extend_from_slice(fps);
    }

    /// Each cell's index, backtrace and fingerprints.
    fn iter(&self) -> impl Iterator<Item = (u32, &[LocationCode], &[u64])> + '_ {
        (self.cells.iter().enumerate()).map(|(k, &(local, start))| {
            let end = (self.cells.get(k + 1)).map_or(self.frames.len(), |n| n.1 as usize);
            // (each cell has one fingerprint more than frames: `k` more before it)
            let (start, fp_start) = (start as usize, start as usize + k);
            let bt = &self.frames[start..end];
            (local, bt, &self.fps[fp_start..fp_start + bt.len() + 1])
        })
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.cells.is_empty()
    }

    fn clear(&mut self) {
        self.cells.clear();
        self.frames.clear();
        self.fps.clear();
    }
}

impl Tree {
    /// The tree of `backtraces` and every stream's cells (with its process and location
    /// table, in stream order), with a location table for each of `processes`. Its cells
    /// are in stream order, each stream's in the order it met them, so that outputs do not
    /// depend on the threads' timing; also the id each had while the streams were read.
    pub(crate) fn join(
        backtraces: Backtraces,
        streams: Vec<(StreamCells, u32, LocationTable)>,
        processes: usize,
    ) -> (Tree, Vec<u32>) {
        let n = streams.iter().map(|(s, ..)| s.cells.len()).sum();
        let mut out = Tree {
            nodes: backtraces.nodes,
            cells: Vec::with_capacity(n),
            locations: vec![LocationTable::default(); processes],
        };
        let mut ids = Vec::with_capacity(n);
        for (s, process, table) in streams {
            out.cells.extend_from_slice(&s.cells);
            ids.extend_from_slice(&s.numbers);
            // (a process's domains define its codes alike; where they do not, which the
            // reference reader refuses, the first stream's definition is kept)
            let all = &mut out.locations[process as usize];
            if all.is_empty() {
                *all = table;
            } else {
                for (code, locs) in table {
                    all.entry(code).or_insert(locs);
                }
            }
        }
        (out, ids)
    }

    /// The locations of a node's frame (inlined calls: outermost first) in `process`;
    /// empty when its trace never defined the code.
    pub(crate) fn frame(&self, process: u32, node: u32) -> &[Location] {
        let n = &self.nodes[node as usize];
        (self.locations.get(process as usize))
            .and_then(|t| t.get(&n.code))
            .map_or(&[], |l: &LocationList| &l[..])
    }

    /// A node's frames, caller first.
    pub(crate) fn stack(&self, node: u32) -> Vec<u32> {
        let mut v = Vec::new();
        let mut at = Some(node);
        while let Some(n) = at {
            v.push(n);
            at = self.nodes[n as usize].parent;
        }
        v.reverse();
        v
    }

    /// The allocation point of a backtrace of `process` as memtrace's hotspots tool takes
    /// it: the innermost location of its last frame, or of up to two frames above when a
    /// frame's code names no location.
    pub(crate) fn allocation_point(&self, process: u32, node: u32) -> Option<&Location> {
        let mut at = Some(node);
        for _ in 0..3 {
            let n = at?;
            if let Some(l) = self.frame(process, n).last() {
                return Some(l);
            }
            at = self.nodes[n as usize].parent;
        }
        None
    }

    /// The function names of a backtrace of `process`, caller first, as memtrace's
    /// flamegraph tool gives them: every location of every frame, a name repeated next to
    /// itself once, then each name only where it first appears (recursion folded).
    pub(crate) fn folded_names(&self, process: u32, node: u32) -> Vec<String> {
        let mut names: Vec<String> = Vec::new();
        for n in self.stack(node) {
            for l in self.frame(process, n) {
                let name = String::from_utf8_lossy(&l.defname).into_owned();
                if names.last() != Some(&name) {
                    names.push(name);
                }
            }
        }
        let mut seen = std::collections::HashSet::new();
        names.retain(|n| seen.insert(n.clone()));
        names
    }
}

/// One place in the program, as a report names it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Frame {
    /// The function (OCaml's definition name).
    pub function: String,
    /// The source file.
    pub file: String,
    /// The line, from 1 (0 for a function as a whole).
    pub line: u32,
    /// The columns of the expression (0, 0 for a function as a whole).
    pub columns: (u32, u32),
}

impl Frame {
    pub(crate) fn of(l: &Location, with_line: bool) -> Frame {
        Frame {
            function: String::from_utf8_lossy(&l.defname).into_owned(),
            file: String::from_utf8_lossy(&l.filename).into_owned(),
            line: if with_line { l.line } else { 0 },
            columns: if with_line {
                (l.start_char, l.end_char)
            } else {
                (0, 0)
            },
        }
    }

    /// A frame for a code no location event defined.
    pub(crate) fn unknown(code: LocationCode) -> Frame {
        Frame {
            function: "??".into(),
            file: format!("#{:x}", code.0),
            line: 0,
            columns: (0, 0),
        }
    }
}

impl std::fmt::Display for Frame {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.line == 0 {
            write!(f, "{} ({})", self.function, self.file)
        } else {
            let (a, b) = self.columns;
            write!(
                f,
                "{} ({}:{}:{}-{})",
                self.function, self.file, self.line, a, b
            )
        }
    }
}

/// An input's location table, as the reader defines codes.
pub(crate) fn define(table: &mut LocationTable, code: LocationCode, locs: &LocationList) {
    table.entry(code).or_insert_with(|| locs.clone());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn codes(v: &[u64]) -> Vec<LocationCode> {
        v.iter().map(|&c| LocationCode(c)).collect()
    }

    /// A backtrace's fingerprint is its frames', whatever came before it and whatever
    /// prefix the format said it shares (at most the real one).
    #[test]
    fn a_fingerprint_is_the_frames() {
        let a = codes(&[1, 2, 3, 4, 5]);
        let b = codes(&[1, 2, 3, 9]);
        let mut alone = Path::default();
        let fb = alone.fingerprint(0, &b);
        for common in 0..=3 {
            let mut p = Path::default();
            p.fingerprint(0, &a);
            assert_eq!(p.fingerprint(common, &b), fb, "common {common}");
        }
        // (one frame more or less is another backtrace, and so are the same frames in
        // another order: each frame's part depends on its depth)
        assert_ne!(alone.fingerprint(4, &codes(&[1, 2, 3, 9, 9])), fb);
        assert_ne!(alone.fingerprint(0, &codes(&[2, 1, 3, 9])), fb);
        assert_ne!(alone.fingerprint(0, &codes(&[9, 3, 2, 1])), fb);
        assert_ne!(alone.fingerprint(0, &codes(&[1, 2, 3])), fb);
        // (a prefix longer than the previous backtrace: the frames decide)
        let mut p = Path::default();
        p.fingerprint(0, &codes(&[1]));
        assert_eq!(p.fingerprint(3, &b), fb);
        assert_ne!(
            cell_key(fb, AllocSource::Minor),
            cell_key(fb, AllocSource::Major)
        );
    }

    /// A node is its backtrace: its stack gives the frames back, and backtraces sharing
    /// a prefix share its nodes, whichever stream met them (one stream's cells interned
    /// all at once, the other's one at a time).
    #[test]
    fn a_node_is_its_stack() {
        let t = std::sync::Mutex::new(Backtraces::default());
        let bts = [
            codes(&[1, 2, 3]),
            codes(&[1, 2, 3, 3, 3, 3]),
            codes(&[1, 2]),
            codes(&[1, 7, 3, 3]),
            codes(&[1, 2, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 4]),
            codes(&[]),
            // (deep enough to be interned at once, past a prefix met before)
            [codes(&[1, 2]), codes(&[5; DIRECT_FRAMES])].concat(),
            [codes(&[1, 2]), codes(&[5; DIRECT_FRAMES + 3]), codes(&[6])].concat(),
        ];
        let mut ids = Ids::new(Arc::new(AtomicU32::new(0)));
        let mut cells = StreamCells::default();
        let mut new = NewCells::default();
        let mut p = Path::default();
        let mut prefixes = std::collections::HashSet::new();
        let mut previous: &[LocationCode] = &[];
        for bt in &bts {
            // (as a reader gives them: the frames shared with the previous one)
            let common = previous.iter().zip(bt).take_while(|(a, b)| a == b).count();
            p.fingerprint(common, bt);
            cells.new_cell(AllocSource::Minor, &p, bt, &mut ids, &mut new, &t);
            previous = bt;
            for k in 1..=bt.len() {
                prefixes.insert(bt[..k].to_vec());
            }
        }
        cells.intern_new(&mut new, &t, Wait::Always);
        let nodes: Vec<u32> = cells.cells.iter().map(|c| c.node).collect();
        let nnodes = t.lock().unwrap().nodes.len();
        assert_eq!(nnodes, prefixes.len() + 1);
        // (another stream, its backtraces in another order)
        let mut other = StreamCells::default();
        let mut q = Path::default();
        for (bt, &n) in bts.iter().zip(&nodes).rev() {
            q.fingerprint(0, bt);
            let (_, local) = other.new_cell(AllocSource::Major, &q, bt, &mut ids, &mut new, &t);
            other.intern_new(&mut new, &t, Wait::Always);
            assert_eq!(other.cells[local as usize].node, n);
        }
        assert_eq!(t.lock().unwrap().nodes.len(), nnodes);
        // (a third stream's, made while another thread holds the tree: held by the stream,
        // the deep one too, and interned at its next call, to the same nodes)
        let mut third = StreamCells::default();
        let mut r = Path::default();
        let guard = t.lock().unwrap();
        for bt in &bts {
            r.fingerprint(0, bt);
            third.new_cell(AllocSource::Minor, &r, bt, &mut ids, &mut new, &t);
        }
        third.intern_new(&mut new, &t, Wait::IfMany);
        third.hold(&mut new);
        assert!(new.is_empty());
        assert_eq!(third.held.cells.len(), bts.len());
        assert!(third.cells.iter().all(|c| c.node == NONE));
        drop(guard);
        third.intern_new(&mut new, &t, Wait::IfMany);
        let got: Vec<u32> = third.cells.iter().map(|c| c.node).collect();
        assert_eq!(got, nodes);
        assert!(third.held.is_empty());
        assert_eq!(t.lock().unwrap().nodes.len(), nnodes);
        let tree = Tree {
            nodes: t.into_inner().unwrap().nodes,
            ..Tree::default()
        };
        for (bt, &n) in bts.iter().zip(&nodes) {
            let got: Vec<LocationCode> = (tree.stack(n).iter())
                .map(|&n| tree.nodes[n as usize].code)
                .collect();
            if bt.is_empty() {
                assert_eq!(got, vec![NO_BACKTRACE]);
            } else {
                assert_eq!(&got, bt);
            }
        }
    }
}
