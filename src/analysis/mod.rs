//! Where the memory of a run goes: one pass over one trace or many (merged in time order on
//! the fly, no merged file needed) giving each process's and the whole run's heap, its
//! peak, what each call site allocated and holds at the peaks, at a time and at the end.
//!
//! Sizes are estimates, as memtrace's tools and viewer make them: an allocation of `n`
//! samples stands for `n / rate` words (headers included) of `word size` bytes, with the
//! rate of its own trace (so inputs of different rates need no thinning); objects are
//! estimated as `n / (rate x (length + 1))`. Sample counts are exact.

mod feed;
mod replay;
mod sites;
mod views;

pub use sites::Frame;
pub use views::Caller;

use crate::cancel::Cancel;
use crate::error::{Error, Result};
use crate::format::event::AllocSource;
use crate::format::location::{IntMap, Location};
use crate::merge::gather_inputs;
use replay::Pass;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// A time given by the user.
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub enum TimeSpec {
    /// Seconds after the earliest start of the inputs.
    SinceStart(f64),
    /// Microseconds since the epoch.
    Absolute(u64),
}

impl TimeSpec {
    /// `2.5` (seconds since the start) or `@1700000000.25` (seconds since the epoch).
    pub fn parse(s: &str) -> Option<TimeSpec> {
        let s = s.trim().trim_end_matches('s');
        if let Some(abs) = s.strip_prefix('@') {
            let v: f64 = abs.parse().ok()?;
            (v.is_finite() && v >= 0.0).then(|| TimeSpec::Absolute((v * 1e6).round() as u64))
        } else {
            let v: f64 = s.parse().ok()?;
            (v.is_finite() && v >= 0.0).then_some(TimeSpec::SinceStart(v))
        }
    }
    fn absolute(self, start_us: u64) -> u64 {
        match self {
            TimeSpec::SinceStart(s) => start_us + (s * 1e6).round() as u64,
            TimeSpec::Absolute(t) => t,
        }
    }
}

/// Which allocations an analysis counts.
#[derive(Clone, Debug, Default)]
pub struct Filter {
    /// Only these processes (all if empty).
    pub pids: Vec<u64>,
    /// Allocations from this time on count as allocated; peaks are sought from it on, the
    /// heap as the window opens (all that lives then, allocated before or not) the first
    /// candidate.
    pub from: Option<TimeSpec>,
    /// The end of the window: nothing after it is read, so "at the end" means at `to`.
    pub to: Option<TimeSpec>,
    /// Only the allocations of this domain (OCaml 5). Their collects are taken from
    /// every domain of the process: OCaml 5 collects the blocks of a domain that ended in
    /// another.
    pub domain: Option<u16>,
    /// Only allocations of this kind.
    pub source: Option<AllocSource>,
    /// Only blocks of at least this many bytes (length x word size).
    pub min_size: Option<u64>,
    /// Only blocks of at most this many bytes.
    pub max_size: Option<u64>,
}

/// Options of [`analyze`].
#[derive(Clone, Debug, Default)]
pub struct AnalysisOptions {
    /// Which allocations count.
    pub filter: Filter,
    /// Also take each site's live bytes at this time ([`Mode::At`]).
    pub at: Option<TimeSpec>,
    /// The timeline's step in µs (None: 1 ms, doubled until it has at most 1,024 steps;
    /// past 1,024 processes, until it has at most 2^20 values, 64 steps at least).
    pub step_us: Option<u64>,
    /// Stops the analysis (it then returns [`Error::Cancelled`]).
    pub cancel: Cancel,
}

/// The value a report ranks sites by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Bytes allocated.
    Alloc,
    /// Bytes live at the peak of the whole run (in a per-process table: of that process).
    Peak,
    /// Bytes live at the end (never collected: leaks, or what lived to the end).
    End,
    /// Bytes live at [`AnalysisOptions::at`].
    At,
}

/// What a site is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum By {
    /// The function of the allocation point (its innermost location).
    Function,
    /// The allocation point's source location.
    Location,
    /// The whole backtrace.
    Backtrace,
}

/// One process (input) of an analysis, and the heap it held.
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct ProcessSummary {
    /// The trace.
    pub file: PathBuf,
    /// The process id.
    pub pid: u64,
    /// The program.
    pub executable: String,
    /// The machine it ran on.
    pub host: String,
    /// The trace's context string, if any (`MEMTRACE_CONTEXT`, or a merge's).
    pub context: Option<String>,
    /// When the trace started (µs since the epoch).
    pub start_us: u64,
    /// The trace's sampling rate.
    pub sample_rate: f64,
    /// Allocations sampled (counted by the filter).
    pub allocations: u64,
    /// Their samples.
    pub samples: u64,
    /// Estimated bytes allocated.
    pub allocated_bytes: u64,
    /// Estimated objects allocated.
    pub allocated_objects: f64,
    /// The largest live heap (estimated bytes).
    pub peak_bytes: u64,
    /// When, in µs since the epoch (None without events).
    pub peak_time_us: Option<u64>,
    /// Live at the end: never collected.
    pub end_bytes: u64,
    /// The last event's time (µs since the epoch).
    pub last_time_us: Option<u64>,
    /// Damage and oddities met, each with where.
    pub warnings: Vec<String>,
}

/// A site in a report, with its values in estimated bytes.
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct SiteRow {
    /// The site: one frame (function, location), or the backtrace (caller first).
    pub frames: Vec<Frame>,
    /// The value the report ranks by.
    pub value: u64,
    /// Allocated.
    pub allocated_bytes: u64,
    /// Objects allocated (estimate).
    pub allocated_objects: f64,
    /// Samples (exact).
    pub samples: u64,
    /// Live at the peak: the run's, or in a per-process table the process's own.
    pub peak_bytes: u64,
    /// Live at the end.
    pub end_bytes: u64,
}

/// One backtrace of one process, domain and kind of allocation (see [`Analysis::stacks`]).
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Stack {
    /// The process: an index into [`Analysis::processes`].
    pub process: usize,
    /// The domain that allocated (0 in OCaml 4 traces).
    pub domain: u16,
    /// The kind of allocation.
    pub source: AllocSource,
    /// The frames, caller first; each one program location, its inlined calls outermost
    /// first.
    pub frames: Vec<Vec<Frame>>,
    /// Allocations sampled.
    pub allocations: u64,
    /// Their samples.
    pub samples: u64,
    /// Estimated bytes allocated.
    pub allocated_bytes: u64,
    /// Estimated objects allocated.
    pub allocated_objects: f64,
    /// Estimated bytes live at the mode asked for.
    pub live_bytes: u64,
    /// Estimated objects live then.
    pub live_objects: f64,
}

/// A hotspots table: the whole run's sites, and each process's.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Top {
    /// The ranking value.
    pub mode: Mode,
    /// What a site is.
    pub by: By,
    /// The whole run (its `file` empty, its `pid` 0).
    pub total: ProcessSummary,
    /// Each process, in the inputs' order.
    pub processes: Vec<ProcessSummary>,
    /// The run's sites, largest first.
    pub sites: Vec<SiteRow>,
    /// Each process's sites, largest first (empty unless asked for).
    pub process_sites: Vec<Vec<SiteRow>>,
    /// The earliest start of the inputs (µs since the epoch).
    pub start_us: u64,
    /// The time of [`Mode::At`], if one was given.
    pub at_us: Option<u64>,
}

/// The live heap over time.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Timeline {
    /// The earliest start of the inputs (µs since the epoch): steps count from it.
    pub start_us: u64,
    /// The length of a step (µs).
    pub step_us: u64,
    /// The number of the first step in `rows`: with a window that has a start (`--from`),
    /// the steps before it are left out (0 otherwise).
    pub first_step: usize,
    /// Per step from `first_step`: the largest live heap of the whole run, and of each
    /// process, in it (in the window: from the heap as it opens).
    pub rows: Vec<(u64, Vec<u64>)>,
    /// The processes, in the columns' order.
    pub processes: Vec<ProcessSummary>,
    /// The whole run's peak.
    pub total: ProcessSummary,
}

/// What one pass over the inputs found; reports are read from it.
pub struct Analysis {
    pass: Pass,
    opts: AnalysisOptions,
    start_us: u64,
    warnings: Vec<String>,
}

/// Analyse `inputs` (trace files and directories of them, as [`crate::merge()`] takes them).
pub fn analyze(inputs: &[PathBuf], opts: &AnalysisOptions) -> Result<Analysis> {
    if inputs.is_empty() {
        return Err(Error::Usage("no input traces".into()));
    }
    // (the inputs as a merge takes them: each file once, pipes read once into a spool)
    let g = gather_inputs(
        inputs,
        Path::new(""),
        None,
        false,
        &opts.cancel,
        &|_| Ok(()),
    )?;
    let mut pass = replay::run(&g.paths, &g.sources, opts, &opts.cancel)?;
    for (k, w) in &g.repeats {
        let kept = &g.paths[*k];
        if let Some(p) = pass.processes.iter_mut().find(|p| &p.file == kept) {
            p.warnings.push(w.clone());
        }
    }
    if pass.first_time.is_none() {
        // (the inputs may hold events that a filter left out: it is named)
        let mut scope = Vec::new();
        if let Some(d) = opts.filter.domain {
            scope.push(format!("in domain {d}"));
        }
        if opts.filter.to.is_some() {
            scope.push("up to --to".to_string());
        }
        let scope = if scope.is_empty() {
            String::new()
        } else {
            format!(" ({})", scope.join(", "))
        };
        return Err(Error::NothingToAnalyse(format!(
            "no allocation, promote or collect in the inputs{scope}: nothing to analyse{}",
            what_was_met(&g.arg_warnings, &pass)
        )));
    }
    let start_us = pass.timeline.start_us;
    let a = Analysis {
        pass,
        opts: opts.clone(),
        start_us,
        warnings: g.arg_warnings,
    };
    if let Some(at) = opts.at {
        let t = at.absolute(start_us);
        let (first, last) = (
            a.pass.first_time.unwrap_or(0),
            a.pass.last_time.unwrap_or(0),
        );
        // (a window's figures are from its start on: a time before it is outside it)
        let lower = match opts.filter.from {
            Some(f) => f.absolute(start_us),
            None => start_us.min(first),
        };
        if t < lower || t > last {
            // (nothing after --to is read: its last event ends what at=T may name)
            let what = match (opts.filter.from.is_some(), opts.filter.to.is_some()) {
                (false, false) => "the trace",
                (false, true) => "the trace up to --to",
                (true, false) => "the window from --from",
                (true, true) => "the window from --from to --to",
            };
            let since = |t: u64| (t as f64 - start_us as f64) / 1e6;
            return Err(Error::NothingToAnalyse(format!(
                "--mode at={:.6} s is outside {what} (+{:.6} to +{:.6} s)",
                since(t),
                since(lower),
                since(last)
            )));
        }
    }
    if a.processes().iter().all(|p| p.allocations == 0) {
        return Err(Error::NothingToAnalyse(format!(
            "no allocation is left by the filters (--from/--to, --domain, --source, sizes){}",
            what_was_met(&a.warnings, &a.pass)
        )));
    }
    Ok(a)
}

/// A warning of the input `file` as one line names it: with the file's name first (most
/// warnings of the reader already start with it).
pub fn named_warning(file: &Path, warning: &str) -> String {
    let name = file.display().to_string();
    if warning.starts_with(&name) {
        warning.to_string()
    } else {
        format!("{name}: {warning}")
    }
}

/// The warnings of a pass that found nothing to analyse, for its one-line error: the damage
/// or the inputs left out that may be why (`; warnings: ...`), or nothing.
fn what_was_met(args: &[String], pass: &replay::Pass) -> String {
    let mut all: Vec<String> = args.to_vec();
    for p in &pass.processes {
        all.extend(p.warnings.iter().map(|w| named_warning(&p.file, w)));
    }
    const SHOWN: usize = 3;
    let more = all.len().saturating_sub(SHOWN);
    all.truncate(SHOWN);
    match (all.len(), more) {
        (0, _) => String::new(),
        (_, 0) => format!("; warnings: {}", all.join("; ")),
        _ => format!("; warnings: {}; and {more} more", all.join("; ")),
    }
}

impl Analysis {
    /// Each process, in the inputs' order.
    pub fn processes(&self) -> Vec<ProcessSummary> {
        (self.pass.processes.iter())
            .map(|p| ProcessSummary {
                file: p.file.clone(),
                pid: p.pid,
                executable: p.executable.clone(),
                host: p.host.clone(),
                context: p.context.clone(),
                start_us: p.start_us,
                sample_rate: p.sample_rate,
                peak_bytes: p.peak,
                peak_time_us: p.peak_time,
                end_bytes: p.live,
                last_time_us: p.last_time,
                warnings: p.warnings.clone(),
                allocations: p.allocated.allocations,
                samples: p.allocated.samples,
                allocated_bytes: p.allocated.bytes,
                allocated_objects: p.allocated.objects,
                ..ProcessSummary::default()
            })
            .collect()
    }

    /// The whole run, as one process.
    pub fn total(&self) -> ProcessSummary {
        self.total_of(&self.processes())
    }

    /// The whole run, from its processes' figures.
    fn total_of(&self, ps: &[ProcessSummary]) -> ProcessSummary {
        ProcessSummary {
            allocations: ps.iter().map(|p| p.allocations).sum(),
            samples: ps.iter().map(|p| p.samples).sum(),
            allocated_bytes: ps.iter().map(|p| p.allocated_bytes).sum(),
            allocated_objects: ps.iter().map(|p| p.allocated_objects).sum(),
            end_bytes: ps.iter().map(|p| p.end_bytes).sum(),
            peak_bytes: self.pass.peak,
            peak_time_us: self.pass.peak_time,
            last_time_us: self.pass.last_time,
            // (the run shown starts with its first process: with --pid, a later one than
            // the earliest input, the origin of times)
            start_us: (ps.iter().map(|p| p.start_us).min()).unwrap_or(self.start_us),
            ..ProcessSummary::default()
        }
    }

    /// Warnings about the arguments rather than one input (directory entries left out).
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// The earliest start of the inputs, µs since the epoch.
    pub fn start_us(&self) -> u64 {
        self.start_us
    }

    /// The time of [`Mode::At`] (µs since the epoch), if one was given.
    pub fn at_us(&self) -> Option<u64> {
        self.opts.at.map(|t| t.absolute(self.start_us))
    }

    /// The sites ranked by `mode`, the run's and (with `per_process`) each process's.
    pub fn top(&self, mode: Mode, by: By, per_process: bool) -> Top {
        let all = self.rows(mode, by, None);
        let processes = self.processes();
        let process_sites = if per_process {
            (0..self.pass.processes.len() as u32)
                .map(|p| self.rows(mode, by, Some(p)))
                .collect()
        } else {
            Vec::new()
        };
        Top {
            mode,
            by,
            total: self.total_of(&processes),
            processes,
            sites: all,
            process_sites,
            start_us: self.start_us,
            at_us: self.at_us(),
        }
    }

    /// The process (input) of a cell.
    fn process_of(&self, cell: usize) -> u32 {
        self.pass.tree.cells[cell].process
    }

    /// The site of a node of `process`, as `by` names it.
    fn site(&self, process: u32, node: u32, by: By) -> Vec<Frame> {
        let tree = &self.pass.tree;
        match by {
            By::Function | By::Location => {
                let f = match tree.allocation_point(process, node) {
                    Some(l) => Frame::of(l, by == By::Location),
                    None => Frame::unknown(tree.nodes[node as usize].code),
                };
                vec![f]
            }
            By::Backtrace => (tree.stack(node).into_iter())
                .flat_map(|n| {
                    let locs = tree.frame(process, n);
                    if locs.is_empty() {
                        vec![Frame::unknown(tree.nodes[n as usize].code)]
                    } else {
                        locs.iter().map(|l| Frame::of(l, true)).collect()
                    }
                })
                .collect(),
        }
    }

    /// The sites ranked by `mode`, of one process or all; those worth nothing at `mode`
    /// left out.
    fn rows(&self, mode: Mode, by: By, process: Option<u32>) -> Vec<SiteRow> {
        let rows = self.site_rows(mode, by, process);
        let mut v: Vec<SiteRow> = rows.into_values().filter(|r| r.value > 0).collect();
        v.sort_by(|a, b| b.value.cmp(&a.value).then_with(|| a.frames.cmp(&b.frames)));
        v
    }

    /// Every site with a figure other than zero, of one process or all.
    fn site_rows(&self, mode: Mode, by: By, process: Option<u32>) -> HashMap<Vec<Frame>, SiteRow> {
        let mut rows: Vec<SiteRow> = Vec::new();
        let mut by_frames: HashMap<Vec<Frame>, usize> = HashMap::new();
        // (a site is named once: the cells of one site key, most of them, find their row by
        // the key rather than by the frames' strings)
        let mut row_of: IntMap<(u64, u32), usize> = IntMap::default();
        let tree = &self.pass.tree;
        for (i, n) in self.pass.cells.iter().enumerate() {
            let owner = self.process_of(i);
            let nothing = n.allocated.allocations == 0
                && n.live == 0
                && n.at_peak == 0
                && n.at_own_peak == 0
                && n.at_time == 0;
            if nothing || process.is_some_and(|p| p != owner) {
                continue;
            }
            let node = tree.cells[i].node;
            let key = match by {
                // (an allocation point is one location of one table: its address)
                By::Function | By::Location => match tree.allocation_point(owner, node) {
                    Some(l) => (l as *const Location as u64, 0),
                    None => (1 << 63 | u64::from(node), owner),
                },
                // (processes share nodes, which their own tables name)
                By::Backtrace => (u64::from(node), owner),
            };
            let k = *row_of.entry(key).or_insert_with(|| {
                let frames = self.site(owner, node, by);
                *by_frames.entry(frames.clone()).or_insert_with(|| {
                    rows.push(SiteRow {
                        frames,
                        ..SiteRow::default()
                    });
                    rows.len() - 1
                })
            });
            let r = &mut rows[k];
            let peak = if process.is_some() {
                n.at_own_peak
            } else {
                n.at_peak
            };
            r.allocated_bytes += n.allocated.bytes;
            r.allocated_objects += n.allocated.objects;
            r.samples += n.allocated.samples;
            r.peak_bytes += peak;
            r.end_bytes += n.live;
            r.value += match mode {
                Mode::Peak => peak,
                m => n.live_at(m),
            };
        }
        (rows.into_iter()).map(|r| (r.frames.clone(), r)).collect()
    }

    /// Every backtrace of every process, domain and kind of allocation, with what it
    /// allocated and what it holds at `mode` (at [`Mode::Alloc`]: at the end), for exports.
    pub fn stacks(&self, mode: Mode) -> Vec<Stack> {
        let mode = if mode == Mode::Alloc { Mode::End } else { mode };
        let tree = &self.pass.tree;
        let mut out = Vec::new();
        for (i, n) in self.pass.cells.iter().enumerate() {
            let live = n.live_at(mode);
            if n.allocated.allocations == 0 && live == 0 {
                continue;
            }
            let c = &tree.cells[i];
            let frames = (tree.stack(c.node).into_iter())
                .map(|f| match tree.frame(c.process, f) {
                    [] => vec![Frame::unknown(tree.nodes[f as usize].code)],
                    locs => locs.iter().map(|l| Frame::of(l, true)).collect(),
                })
                .collect();
            out.push(Stack {
                process: self.process_of(i) as usize,
                domain: c.domain,
                source: c.source,
                frames,
                allocations: n.allocated.allocations,
                samples: n.allocated.samples,
                allocated_bytes: n.allocated.bytes,
                allocated_objects: n.allocated.objects,
                live_bytes: live,
                live_objects: n.objects_in(live),
            });
        }
        out
    }

    /// The live heap over time, per process and in all.
    pub fn timeline(&self) -> Timeline {
        let processes = self.processes();
        Timeline {
            start_us: self.start_us,
            step_us: self.pass.timeline.step_us,
            first_step: self.pass.timeline.first,
            rows: self.pass.timeline.rows.clone(),
            total: self.total_of(&processes),
            processes,
        }
    }

    /// Folded stacks (`a;b;c weight`, sorted), for flame graphs: names as memtrace's
    /// flamegraph tool gives them, weighted by `weight` at `mode`; with
    /// `by_process`, a root frame naming each process.
    pub fn folded(&self, mode: Mode, weight: Weight, by_process: bool) -> Vec<(String, u64)> {
        let mut out: HashMap<String, u64> = HashMap::new();
        for (i, n) in self.pass.cells.iter().enumerate() {
            let bytes = n.live_at(mode);
            let w = match weight {
                Weight::Bytes => bytes,
                Weight::Samples if mode == Mode::Alloc => n.allocated.samples,
                Weight::Samples => n.samples_in(bytes).round() as u64,
                Weight::Objects => n.objects_in(bytes).round() as u64,
            };
            if w == 0 {
                continue;
            }
            let c = &self.pass.tree.cells[i];
            let mut names = self.pass.tree.folded_names(c.process, c.node);
            if by_process {
                let p = &self.pass.processes[self.process_of(i) as usize];
                let exe = p.executable.rsplit('/').next().unwrap_or("");
                names.insert(0, format!("pid {} ({exe})", p.pid));
            }
            let names: Vec<String> = names.into_iter().map(|n| n.replace(';', "_")).collect();
            *out.entry(names.join(";")).or_default() += w;
        }
        let mut v: Vec<(String, u64)> = out.into_iter().collect();
        v.sort();
        v
    }
}

/// A site in a [`Diff`]: its figures in the two runs (estimated bytes).
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct DiffRow {
    /// The site.
    pub frames: Vec<Frame>,
    /// Allocated: before, after.
    pub allocated_bytes: (u64, u64),
    /// Live at each run's peak.
    pub peak_bytes: (u64, u64),
    /// Live at each run's end.
    pub end_bytes: (u64, u64),
}

impl DiffRow {
    /// The change at `mode` (after - before).
    pub fn delta(&self, mode: Mode) -> i64 {
        let (a, b) = match mode {
            Mode::Alloc => self.allocated_bytes,
            Mode::End => self.end_bytes,
            Mode::Peak | Mode::At => self.peak_bytes,
        };
        b as i64 - a as i64
    }

    /// Whether anything of the site changed: what it allocated, held at the peak or at
    /// the end.
    pub fn changed(&self) -> bool {
        [Mode::Alloc, Mode::Peak, Mode::End]
            .iter()
            .any(|&m| self.delta(m) != 0)
    }
}

/// What changed between two runs, site by site.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Diff {
    /// The ranking: the change of this figure, largest first (in absolute value).
    pub mode: Mode,
    /// What a site is.
    pub by: By,
    /// The two runs as a whole.
    pub totals: (ProcessSummary, ProcessSummary),
    /// Every site of either run.
    pub sites: Vec<DiffRow>,
}

/// Site by site, what changed from `base` to `new` (each one trace or many; None: a run
/// that holds nothing the filters keep, all its figures 0), ranked by the change at `mode`
/// ([`Mode::At`] counts as [`Mode::Peak`]), then by the change of what was allocated.
pub fn diff(base: Option<&Analysis>, new: Option<&Analysis>, mode: Mode, by: By) -> Diff {
    let mode = if mode == Mode::At { Mode::Peak } else { mode };
    let mut rows: HashMap<Vec<Frame>, DiffRow> = HashMap::new();
    for (side, a) in [base, new].into_iter().enumerate() {
        let Some(a) = a else { continue };
        for r in a.site_rows(Mode::Alloc, by, None).into_values() {
            let d = rows.entry(r.frames.clone()).or_insert_with(|| DiffRow {
                frames: r.frames.clone(),
                ..DiffRow::default()
            });
            let set = |p: &mut (u64, u64), v| {
                if side == 0 {
                    p.0 = v
                } else {
                    p.1 = v
                }
            };
            set(&mut d.allocated_bytes, r.allocated_bytes);
            set(&mut d.peak_bytes, r.peak_bytes);
            set(&mut d.end_bytes, r.end_bytes);
        }
    }
    let mut sites: Vec<DiffRow> = rows.into_values().collect();
    let change = |r: &DiffRow, m| std::cmp::Reverse(r.delta(m).unsigned_abs());
    sites.sort_by(|a, b| {
        (change(a, mode).cmp(&change(b, mode)))
            .then_with(|| change(a, Mode::Alloc).cmp(&change(b, Mode::Alloc)))
            .then_with(|| a.frames.cmp(&b.frames))
    });
    let total = |a: Option<&Analysis>| a.map(Analysis::total).unwrap_or_default();
    Diff {
        mode,
        by,
        totals: (total(base), total(new)),
        sites,
    }
}

/// What a flame graph's widths count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Weight {
    /// Estimated bytes.
    Bytes,
    /// Samples.
    Samples,
    /// Estimated objects.
    Objects,
}
