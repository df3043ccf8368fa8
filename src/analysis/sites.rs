//! Call sites: each input's backtraces interned as nodes of a tree of frames (a node is a
//! backtrace, known by its last frame and its parent), and the names a report gives them.

use crate::format::event::{AllocSource, LocationCode};
use crate::format::location::{IntMap, Location, LocationList, LocationTable};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

/// A node of the tree of backtraces: `code` called from `parent` (None: the program's
/// entry). Node ids are global over the inputs of one analysis.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Node {
    pub(crate) parent: Option<u32>,
    pub(crate) code: LocationCode,
    pub(crate) process: u32,
    /// The child met last, tried before the table of children.
    last_child: u32,
}

/// What the analysis counts apart: one backtrace (node) of one domain and one kind of
/// allocation, so that reports can filter and label by domain and source.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Cell {
    pub(crate) node: u32,
    pub(crate) domain: u16,
    pub(crate) source: AllocSource,
}

/// The tree of every input's backtraces, the cells under them, and each input's location
/// table.
#[derive(Default)]
pub(crate) struct Tree {
    pub(crate) nodes: Vec<Node>,
    children: IntMap<(u32, u32, u64), u32>,
    pub(crate) cells: Vec<Cell>,
    cell_ids: IntMap<(u32, u16, u8), u32>,
    /// The id of each of `cells`.
    cell_numbers: Vec<u32>,
    /// Where ids come from, when several trees share them.
    ids: Option<Arc<AtomicU32>>,
    pub(crate) locations: Vec<LocationTable>,
}

/// Where a stream's previous backtrace went in the tree: its nodes, caller first.
#[derive(Default)]
pub(crate) struct Path {
    nodes: Vec<u32>,
    /// Their codes, to compare with the next backtrace's.
    codes: Vec<LocationCode>,
}

/// The frame of an allocation without a backtrace.
const NO_BACKTRACE: LocationCode = LocationCode(u64::MAX);

/// No node.
const NONE: u32 = u32::MAX;

/// No parent: the key's parent field for a frame called from the program's entry.
const ROOT: u32 = u32::MAX;

impl Tree {
    /// The node of `backtrace` (caller first), whose first `common` frames are those of
    /// `path` (the stream's previous backtrace); `path` becomes this one's.
    #[inline]
    pub(crate) fn intern(
        &mut self,
        process: u32,
        path: &mut Path,
        common: usize,
        backtrace: &[LocationCode],
    ) -> u32 {
        // (the prefix the format gives can be shorter than the one the two share)
        let mut common = common.min(path.nodes.len()).min(backtrace.len());
        common += (path.codes[common..].iter())
            .zip(&backtrace[common..])
            .take_while(|(a, b)| a == b)
            .count();
        path.nodes.truncate(common);
        path.codes.truncate(common);
        for &code in &backtrace[common..] {
            let parent = path.nodes.last().copied();
            // (a frame's callee is most often the one it called last: no hashing then)
            let last = parent.map_or(NONE, |p| self.nodes[p as usize].last_child);
            if last != NONE && self.nodes[last as usize].code == code {
                path.nodes.push(last);
                path.codes.push(code);
                continue;
            }
            let key = (process, parent.unwrap_or(ROOT), code.0);
            let next = self.nodes.len() as u32;
            let n = *self.children.entry(key).or_insert(next);
            if n == next {
                self.nodes.push(Node {
                    parent,
                    code,
                    process,
                    last_child: NONE,
                });
            }
            if let Some(p) = parent {
                self.nodes[p as usize].last_child = n;
            }
            path.nodes.push(n);
            path.codes.push(code);
        }
        match path.nodes.last() {
            Some(&n) => n,
            // (no backtrace: one node of its own, under no frame any trace defines)
            None => self.intern(process, path, 0, &[NO_BACKTRACE]),
        }
    }

    /// The cell of an allocation at `node` in `domain` of kind `source`.
    #[inline]
    /// Ids are numbered by `ids` when given (shared by the trees of several decoding
    /// threads, see [`Tree::combine`]), else in this tree's order.
    /// Returns the cell's id and its index in this tree.
    pub(crate) fn cell(&mut self, node: u32, domain: u16, source: AllocSource) -> (u32, u32) {
        if let Some(&local) = self.cell_ids.get(&(node, domain, source as u8)) {
            return (self.cell_numbers[local as usize], local);
        }
        let local = self.cells.len() as u32;
        let id = match &self.ids {
            Some(ids) => ids.fetch_add(1, Ordering::Relaxed),
            None => self.cells.len() as u32,
        };
        self.cell_ids.insert((node, domain, source as u8), local);
        self.cells.push(Cell {
            node,
            domain,
            source,
        });
        self.cell_numbers.push(id);
        (id, local)
    }

    /// The id of this tree's cell `local`.
    pub(crate) fn cell_number(&self, local: usize) -> usize {
        self.cell_numbers[local] as usize
    }

    /// A tree whose cells take their ids from `ids`, with a location table for each of
    /// `processes` processes.
    pub(crate) fn numbered_by(ids: Arc<AtomicU32>, processes: usize) -> Tree {
        Tree {
            ids: Some(ids),
            locations: vec![LocationTable::default(); processes],
            ..Tree::default()
        }
    }

    /// One tree of the trees of several threads (each with the processes it read), its
    /// cells in the order of their ids (`cells` of them).
    pub(crate) fn combine(trees: Vec<Tree>, cells: u32) -> Tree {
        let mut out = Tree {
            cells: vec![
                Cell {
                    node: 0,
                    domain: 0,
                    source: AllocSource::Minor,
                };
                cells as usize
            ],
            locations: Vec::new(),
            ..Tree::default()
        };
        for t in trees {
            let off = out.nodes.len() as u32;
            (out.nodes).extend(t.nodes.iter().map(|n| Node {
                parent: n.parent.map(|p| p + off),
                ..*n
            }));
            for (c, &id) in t.cells.iter().zip(&t.cell_numbers) {
                out.cells[id as usize] = Cell {
                    node: c.node + off,
                    ..*c
                };
            }
            out.locations
                .resize(t.locations.len(), LocationTable::default());
            for (p, table) in t.locations.into_iter().enumerate() {
                if !table.is_empty() {
                    out.locations[p] = table;
                }
            }
        }
        out
    }

    /// The locations of a node's frame (inlined calls: outermost first); empty when the
    /// trace never defined its code.
    pub(crate) fn frame(&self, node: u32) -> &[Location] {
        let n = &self.nodes[node as usize];
        (self.locations.get(n.process as usize))
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

    /// The allocation point of a backtrace as memtrace's hotspots tool takes it: the
    /// innermost location of its last frame, or of up to two frames above when a frame's
    /// code names no location.
    pub(crate) fn allocation_point(&self, node: u32) -> Option<&Location> {
        let mut at = Some(node);
        for _ in 0..3 {
            let n = at?;
            if let Some(l) = self.frame(n).last() {
                return Some(l);
            }
            at = self.nodes[n as usize].parent;
        }
        None
    }

    /// The function names of a backtrace, caller first, as memtrace's flamegraph tool
    /// gives them: every location of every frame, a name repeated next to itself once,
    /// then each name only where it first appears (recursion folded).
    pub(crate) fn folded_names(&self, node: u32) -> Vec<String> {
        let mut names: Vec<String> = Vec::new();
        for n in self.stack(node) {
            for l in self.frame(n) {
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
