//! What a report page reads beside the tables: the callers of each allocating function,
//! one process's folded stacks, the time window the filter kept.

use super::replay::NodeStats;
use super::sites::Tree;
use super::{Analysis, By, Frame, Mode, SiteRow};
use crate::format::event::LocationCode;
use crate::format::location::Location;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};

/// A caller of a function site: where the allocating function was called from, and what
/// the allocations through that call are worth at the mode asked for.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Caller {
    /// The calling place (a source location); None when the backtrace starts at the site.
    pub frame: Option<Frame>,
    /// Estimated bytes at the mode.
    pub value: u64,
}

/// A source location known by its address in the location tables (two equal ones at two
/// addresses meet again once named).
#[derive(Clone, Copy)]
struct Place<'a>(&'a Location);

impl PartialEq for Place<'_> {
    fn eq(&self, other: &Self) -> bool {
        std::ptr::eq(self.0, other.0)
    }
}

impl Eq for Place<'_> {}

impl Hash for Place<'_> {
    fn hash<H: Hasher>(&self, h: &mut H) {
        std::ptr::hash(self.0, h)
    }
}

/// The location that called the allocation point `point` of `node`'s backtrace: the one
/// before it, caller first, over the frames and their inlined calls.
fn caller_of<'t>(
    tree: &'t Tree,
    process: u32,
    node: u32,
    point: &Location,
) -> Option<&'t Location> {
    let mut found = false;
    let mut at = Some(node);
    while let Some(n) = at {
        for l in tree.frame(process, n).iter().rev() {
            if found {
                return Some(l);
            }
            found = std::ptr::eq(l, point);
        }
        at = tree.nodes[n as usize].parent;
    }
    None
}

/// A backtrace's folded stack as [`Analysis::folded`] names it (the function names, caller
/// first, each where it first appears, `;` in a name made `_`), made without a string for
/// each name: a report names every backtrace of the run.
fn folded_name(tree: &Tree, process: u32, node: u32) -> String {
    let mut seen: Vec<&[u8]> = Vec::new();
    let mut out = String::new();
    for n in tree.stack(node) {
        for l in tree.frame(process, n) {
            let name: &[u8] = &l.defname;
            if seen.contains(&name) {
                continue;
            }
            seen.push(name);
            if !out.is_empty() {
                out.push(';');
            }
            let name = String::from_utf8_lossy(name);
            if name.contains(';') {
                out.push_str(&name.replace(';', "_"));
            } else {
                out.push_str(&name);
            }
        }
    }
    out
}

/// A cell's figure at `mode`; with `own` (a process's own table), [`Mode::Peak`] is its
/// process's own peak rather than the run's.
fn value_at(n: &NodeStats, mode: Mode, own: bool) -> u64 {
    match mode {
        Mode::Peak if own => n.at_own_peak,
        m => n.live_at(m),
    }
}

impl Analysis {
    /// The filters the analysis was made with.
    pub fn filter(&self) -> &super::Filter {
        &self.opts.filter
    }

    /// The time window of the filter (`--from`, `--to`), in µs since the epoch.
    pub fn window_us(&self) -> (Option<u64>, Option<u64>) {
        let f = &self.opts.filter;
        let abs = |t: Option<super::TimeSpec>| t.map(|t| t.absolute(self.start_us));
        (abs(f.from), abs(f.to))
    }

    /// Folded stacks weighed in bytes, as [`Analysis::folded`] gives them, at each of
    /// `modes`, of the run and of each of `processes` (indices into
    /// [`Analysis::processes`]; at [`Mode::Peak`] a process's own peak, as in its sites
    /// table): `[m][0]` the run's at `modes[m]`, `[m][1 + k]` that of `processes[k]`.
    /// Each backtrace is named once for them all.
    pub fn folded_bytes(
        &self,
        modes: &[Mode],
        processes: &[usize],
    ) -> Vec<Vec<Vec<(String, u64)>>> {
        let slot: HashMap<u32, usize> = (processes.iter().enumerate())
            .map(|(k, &p)| (p as u32, k + 1))
            .collect();
        let mut maps = vec![vec![HashMap::<String, u64>::new(); processes.len() + 1]; modes.len()];
        for (i, n) in self.pass.cells.iter().enumerate() {
            let own = slot.get(&self.process_of(i)).copied();
            let values: Vec<(u64, u64)> = (modes.iter())
                .map(|&m| {
                    (
                        value_at(&n, m, false),
                        own.map_or(0, |_| value_at(&n, m, true)),
                    )
                })
                .collect();
            if values.iter().all(|v| *v == (0, 0)) {
                continue;
            }
            let c = &self.pass.tree.cells[i];
            let name = folded_name(&self.pass.tree, c.process, c.node);
            for (m, (run, mine)) in values.into_iter().enumerate() {
                for (k, v) in [(Some(0), run), (own, mine)] {
                    if let (Some(k), true) = (k, v > 0) {
                        *maps[m][k].entry(name.clone()).or_default() += v;
                    }
                }
            }
        }
        (maps.into_iter())
            .map(|per_mode| {
                (per_mode.into_iter())
                    .map(|m| {
                        let mut v: Vec<(String, u64)> = m.into_iter().collect();
                        v.sort();
                        v
                    })
                    .collect()
            })
            .collect()
    }

    /// The sites of one process (an index into [`Analysis::processes`]) ranked by `mode`,
    /// as [`Analysis::top`] gives each process's with `per_process`, without the others'.
    pub fn process_top(&self, mode: Mode, by: By, process: usize) -> Vec<SiteRow> {
        self.rows(mode, by, Some(process as u32))
    }

    /// The callers of each function site (keyed as [`Analysis::top`] by [`By::Function`]
    /// names its sites) of the run or of one process, largest first, the sites and callers
    /// worth nothing at `mode` left out.
    pub fn callers(&self, mode: Mode, process: Option<usize>) -> HashMap<Vec<Frame>, Vec<Caller>> {
        let tree = &self.pass.tree;
        // (summed by place first: names are made once a place, not once a backtrace)
        let mut sums: HashMap<(Result<Place, LocationCode>, Option<Place>), u64> = HashMap::new();
        for (i, n) in self.pass.cells.iter().enumerate() {
            let owner = self.process_of(i) as usize;
            let value = value_at(&n, mode, process.is_some());
            if value == 0 || process.is_some_and(|p| p != owner) {
                continue;
            }
            let node = tree.cells[i].node;
            let key = match tree.allocation_point(owner as u32, node) {
                Some(l) => (
                    Ok(Place(l)),
                    caller_of(tree, owner as u32, node, l).map(Place),
                ),
                None => (Err(tree.nodes[node as usize].code), None),
            };
            *sums.entry(key).or_default() += value;
        }
        let mut by_site: HashMap<Vec<Frame>, HashMap<Option<Frame>, u64>> = HashMap::new();
        for ((site, caller), v) in sums {
            let site = site.map_or_else(Frame::unknown, |p| Frame::of(p.0, false));
            let callers = by_site.entry(vec![site]).or_default();
            *callers
                .entry(caller.map(|c| Frame::of(c.0, true)))
                .or_default() += v;
        }
        (by_site.into_iter())
            .map(|(site, callers)| {
                let mut v: Vec<Caller> = (callers.into_iter())
                    .map(|(frame, value)| Caller { frame, value })
                    .collect();
                v.sort_by(|a, b| b.value.cmp(&a.value).then_with(|| a.frame.cmp(&b.frame)));
                (site, v)
            })
            .collect()
    }
}
