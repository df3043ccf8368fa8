//! The one pass of an analysis: every input's streams read in time order at once (a heap
//! of their next events), the live heap of each process and of the whole run kept up to
//! date, and the live bytes of each backtrace at the peaks taken as they are passed.

use super::feed::{
    Allocated, BatchLimit, BytesOf, Counted, Counting, Ev, Feed, Seen, StreamSpec, COLLECT,
};
use super::sites::Tree;
use super::{AnalysisOptions, Filter, Mode};
use crate::cancel::Cancel;
use crate::error::{Error, Result};
use crate::format::location::LocationPool;
use crate::merge::live::LiveObjects;
use crate::merge::merged_pids;
use crate::pipeline::decoder::{BUFFERED_STREAMS, READ_WINDOW};
use crate::pipeline::files::{FilePool, LazyFile};
use crate::reader::{scan_domains, Reader, READ_BUFFER};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::path::PathBuf;
use std::sync::Arc;

/// Events decoded from a stream at a time, at most (fewer when there are many streams, so
/// that the batches in flight, two a stream then, stay within a few MiB).
const BATCH: usize = 8192;

/// Frames past the common prefixes a batch takes in, at most (and one allocation's more):
/// a batch's cost follows its frames more than its events.
const BATCH_FRAMES: usize = 1 << 15;

/// What the pass learns of one process (input).
#[derive(Clone, Debug, Default)]
pub(crate) struct ProcessState {
    pub(crate) file: PathBuf,
    pub(crate) pid: u64,
    pub(crate) executable: String,
    pub(crate) host: String,
    pub(crate) context: Option<String>,
    pub(crate) sample_rate: f64,
    pub(crate) start_us: u64,
    pub(crate) live: u64,
    pub(crate) peak: u64,
    pub(crate) peak_time: Option<u64>,
    pub(crate) last_time: Option<u64>,
    pub(crate) warnings: Vec<String>,
    /// Collects of objects never allocated (or left out by a filter).
    pub(crate) unmatched: u64,
    /// What its cells allocated, summed once the pass is over.
    pub(crate) allocated: Allocated,
    /// Cells whose live bytes changed since this process's last peak.
    touched: Vec<u32>,
    dirty: bool,
    /// Live objects: their cell and samples, packed ([`pack`]).
    objects: LiveObjects,
    /// Estimated bytes by samples.
    bytes_of: BytesOf,
}

/// A live object's cell and samples (at most 2^32 - 2: never the ring's empty value) in
/// one word, as the ring of live objects keeps them.
fn pack(cell: u32, nsamples: u32) -> u64 {
    u64::from(cell) << 32 | u64::from(nsamples)
}

fn unpack(v: u64) -> (u32, u32) {
    ((v >> 32) as u32, v as u32)
}

/// Every cell's figures, as the pass left them: what the decoding threads counted, stream
/// by stream in the tree's order of cells, and what the pass kept by the id each cell had
/// while it ran. Each cell's [`NodeStats`] are put together as they are read: the pass
/// ends sooner than when they were copied into one table (megabytes of fresh pages).
#[derive(Debug, Default)]
pub(crate) struct CellFigures {
    counted: Counted,
    /// By the tree's order of cells.
    ids: Vec<u32>,
    /// By id.
    live: Vec<LiveCell>,
    at_peak: Vec<u64>,
    at_own_peak: Vec<u64>,
    at_time: Option<Vec<u64>>,
}

impl CellFigures {
    /// What each cell allocated, in the tree's order of cells.
    fn allocated(&self) -> impl Iterator<Item = &Allocated> + '_ {
        self.counted.allocated.iter().flatten()
    }

    /// Each cell's figures, in the tree's order of cells.
    pub(crate) fn iter(&self) -> impl Iterator<Item = NodeStats> + '_ {
        let get = |v: &[u64], id: usize| v.get(id).copied().unwrap_or(0);
        let mut seen = self.counted.seen.iter().flatten();
        (self.allocated().zip(&self.ids)).map(move |(&allocated, &id)| {
            let id = id as usize;
            NodeStats {
                allocated,
                seen: seen.next().copied().unwrap_or(Seen {
                    bytes: allocated.bytes,
                    objects: allocated.objects,
                    samples: allocated.samples,
                }),
                live: self.live.get(id).map_or(0, |c| c.live),
                at_peak: get(&self.at_peak, id),
                at_own_peak: get(&self.at_own_peak, id),
                at_time: self.at_time.as_deref().map_or(0, |v| get(v, id)),
            }
        })
    }
}

/// What one cell (backtrace, domain, source) allocated and holds. Bytes are estimates, `nsamples` exact.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct NodeStats {
    /// Counted by the decoding threads.
    pub(crate) allocated: Allocated,
    /// What it allocated up to the window's end, in it or not.
    pub(crate) seen: Seen,
    /// Live at the end of the pass.
    pub(crate) live: u64,
    /// Live at the combined peak, its process's own peak, `--at`.
    pub(crate) at_peak: u64,
    pub(crate) at_own_peak: u64,
    pub(crate) at_time: u64,
}

/// A cell as the pass keeps it while it replays, the part every event of the cell changes
/// (kept small: the pass meets cells in no order, and misses the cache on each).
///
/// Its live bytes at a peak are taken lazily: at a new peak only the cells changed since
/// the last one take theirs (the others' are what they were then), so that the heap is
/// never copied.
#[derive(Clone, Copy, Debug, Default)]
struct LiveCell {
    live: u64,
    /// On the lists of cells changed since the combined peak and since its process's
    /// own: [`COMBINED`], [`OWN`].
    touched: u8,
}

const COMBINED: u8 = 1;
const OWN: u8 = 2;

impl NodeStats {
    /// Live bytes at `mode`.
    pub(crate) fn live_at(&self, mode: Mode) -> u64 {
        match mode {
            Mode::Alloc => self.allocated.bytes,
            Mode::Peak => self.at_peak,
            Mode::End => self.live,
            Mode::At => self.at_time,
        }
    }

    /// The objects `bytes` of this cell's allocations stand for (an estimate).
    pub(crate) fn objects_in(&self, bytes: u64) -> f64 {
        self.share_of(self.seen.objects, bytes)
    }

    /// The samples `bytes` of this cell's allocations stand for.
    pub(crate) fn samples_in(&self, bytes: u64) -> f64 {
        self.share_of(self.seen.samples as f64, bytes)
    }

    /// The part of `whole` (objects or samples of all it allocated up to the window's
    /// end) that `bytes` of it stand for, at the ratio of those allocations.
    fn share_of(&self, whole: f64, bytes: u64) -> f64 {
        if self.seen.bytes == 0 {
            0.0
        } else {
            whole * bytes as f64 / self.seen.bytes as f64
        }
    }
}

/// The heap over time: the largest live heap in each step, per process and in all.
#[derive(Clone, Debug, Default)]
pub(crate) struct Timeline {
    pub(crate) step_us: u64,
    pub(crate) fixed: bool,
    pub(crate) start_us: u64,
    /// The step of the first row (steps count from `start_us`): with a window that has a
    /// start, the steps before it are left out.
    pub(crate) first: usize,
    /// Per step from `first`: the largest total, then the largest of each process.
    pub(crate) rows: Vec<(u64, Vec<u64>)>,
    /// The heap as the last event recorded left it.
    end: (u64, Vec<u64>),
    /// Where the last step ends (µs since the start).
    row_end: u64,
    /// A fixed step would have made more steps than [`max_fixed_steps`]: none were kept
    /// past them.
    pub(crate) overflow: bool,
}

/// The largest number of steps kept before they are made twice as long.
const MAX_STEPS: usize = 1024;
/// Values (a step's, per process) kept at most past [`MAX_STEPS`] processes, as fewer
/// steps: a row per step holds every process's value, and a run of thousands of processes
/// would otherwise hold more in its timeline than in the rest of the analysis.
const MAX_VALUES: usize = 1 << 20;
/// The fewest steps kept, however many processes.
const MIN_STEPS: usize = 64;

/// The steps a timeline of `processes` keeps before making them twice as long.
fn max_steps(processes: usize) -> usize {
    (MAX_VALUES / processes.max(1)).clamp(MIN_STEPS, MAX_STEPS)
}

/// The steps of a step the caller fixed, at most: a step of a microsecond over an hour
/// would be 3.6 G rows, held until the pass ends.
pub(crate) const MAX_FIXED_STEPS: usize = 1 << 20;
const MAX_FIXED_VALUES: usize = 1 << 24;

/// The steps a timeline of `processes` with a fixed step keeps at most.
pub(crate) fn max_fixed_steps(processes: usize) -> usize {
    (MAX_FIXED_VALUES / processes.max(1)).clamp(MIN_STEPS, MAX_FIXED_STEPS)
}

impl Timeline {
    /// The heap after the events of microsecond `time` (never before the last one's);
    /// `dirty`: the processes they changed.
    #[inline]
    fn record(&mut self, time: u64, total: u64, processes: &[ProcessState], dirty: &[u32]) {
        if !self.step_to(time, processes.len()) {
            return;
        }
        for &p in dirty {
            self.end.1[p as usize] = processes[p as usize].live;
        }
        self.end.0 = total;
        if let Some(row) = self.rows.last_mut() {
            row.0 = row.0.max(total);
            for &p in dirty {
                let v = &mut row.1[p as usize];
                *v = (*v).max(processes[p as usize].live);
            }
        }
    }

    /// Keep the steps from the one of `from` (µs since the epoch) on, recording nothing
    /// before it.
    fn keep_from(&mut self, from: u64) {
        self.first = (from.saturating_sub(self.start_us) / self.step_us) as usize;
    }

    /// The first step of the window of [`Timeline::keep_from`] at `from`, which starts
    /// with the heap as the window opens: `total` and each process's live bytes.
    fn open_at(&mut self, from: u64, total: u64, processes: &[ProcessState]) {
        self.end = (total, processes.iter().map(|p| p.live).collect());
        // (its first step: never past what a fixed step may keep)
        self.step_to(from, processes.len());
    }

    /// The rows up to the step of `time` (µs since the epoch), made if new; false past
    /// what a fixed step may keep.
    #[inline]
    fn step_to(&mut self, time: u64, processes: usize) -> bool {
        let t = time.saturating_sub(self.start_us);
        if self.rows.is_empty() || t >= self.row_end {
            return self.new_row(t, processes);
        }
        true
    }

    /// The steps up to the one of `t` (µs since the start), which becomes the last; false
    /// (and none made) past what a fixed step may keep.
    fn new_row(&mut self, t: u64, processes: usize) -> bool {
        let mut i = (t / self.step_us) as usize;
        let most = max_steps(processes);
        while !self.fixed && i.saturating_sub(self.first) >= most {
            self.coarsen();
            i = (t / self.step_us) as usize;
        }
        if self.fixed && i.saturating_sub(self.first) >= max_fixed_steps(processes) {
            self.overflow = true;
            return false;
        }
        self.end.1.resize(processes, 0);
        while self.first + self.rows.len() <= i {
            // a step starts with the heap as the last event before it left it
            self.rows.push(self.end.clone());
        }
        self.row_end = (i as u64 + 1) * self.step_us;
        true
    }

    fn coarsen(&mut self) {
        let mut rows = std::mem::take(&mut self.rows);
        // (steps twice as long pair the steps from the start: a first step of odd number
        // is the second half of its pair, whose first half was left out)
        if self.first % 2 == 1 && !rows.is_empty() {
            self.rows.push(rows.remove(0));
        }
        self.first /= 2;
        for pair in rows.chunks(2) {
            let mut r = pair[0].clone();
            if let Some(b) = pair.get(1) {
                r.0 = r.0.max(b.0);
                for (x, y) in r.1.iter_mut().zip(&b.1) {
                    *x = (*x).max(*y);
                }
            }
            self.rows.push(r);
        }
        self.step_us *= 2;
    }
}

/// Everything the pass found, for the reports to read.
pub(crate) struct Pass {
    pub(crate) tree: Tree,
    pub(crate) processes: Vec<ProcessState>,
    /// Indexed by the tree's cells.
    pub(crate) cells: CellFigures,
    pub(crate) peak: u64,
    pub(crate) peak_time: Option<u64>,
    pub(crate) first_time: Option<u64>,
    pub(crate) last_time: Option<u64>,
    pub(crate) timeline: Timeline,
}

/// Open each input's streams (one a domain), skipping what the filter leaves out.
pub(super) fn open(names: &[PathBuf], sources: &[PathBuf], filter: &Filter) -> Result<Opened> {
    let mut processes = Vec::new();
    let mut streams = Vec::new();
    let mut start: Option<u64> = None;
    let pool = FilePool::from_rlimit_share(1);
    // (as a merge reads them: several inputs share their location lists, and many read
    // a window of their packet at a time)
    let locations = (names.len() > 1).then(Arc::<LocationPool>::default);
    let windows = names.len() > BUFFERED_STREAMS;
    for (name, path) in names.iter().zip(sources) {
        let window = windows.then(|| std::fs::metadata(path).map_or(0, |m| m.len()));
        let read = Read {
            locations: locations.as_ref(),
            window,
        };
        let r = open_as(&pool, path, name, read)?;
        let info = r.info().clone();
        // (times are since the earliest start of all the inputs, whichever `--pid` keeps)
        start = Some(start.map_or(info.start_time.0, |s| s.min(info.start_time.0)));
        let merged = if filter.pids.is_empty() {
            Vec::new()
        } else {
            merged_pids(&info)
        };
        if let Some(p) = filter.pids.iter().find(|p| merged.contains(p)) {
            // (a merge is one process to the analysis: its pid would stand for them all)
            return Err(Error::NothingToAnalyse(format!(
                "--pid {p}: {} is a merge of {} processes, which it does not tell apart; \
                 give their own traces",
                name.display(),
                merged.len()
            )));
        }
        if !filter.pids.is_empty() && !filter.pids.contains(&info.pid) {
            continue;
        }
        let process = processes.len() as u32;
        let word = if info.word_size == 0 {
            64
        } else {
            info.word_size
        } as f64
            / 8.0;
        // (estimated bytes of one sample: word size / rate)
        let bytes_of = BytesOf::new(if info.sample_rate > 0.0 {
            word / info.sample_rate
        } else {
            0.0
        });
        processes.push(ProcessState {
            file: name.clone(),
            pid: info.pid,
            executable: String::from_utf8_lossy(&info.executable_name).into_owned(),
            host: String::from_utf8_lossy(&info.host_name).into_owned(),
            context: (info.context.as_deref()).map(|c| String::from_utf8_lossy(c).into_owned()),
            sample_rate: info.sample_rate,
            start_us: info.start_time.0,
            bytes_of,
            ..ProcessState::default()
        });
        let domains = if info.version >= 3 {
            scan_domains(path)?
        } else {
            vec![0]
        };
        // (a process without the domain `--domain` keeps has none of its allocations;
        // one with it is read whole: OCaml 5 collects a block in another domain than the
        // one that allocated it when that one has terminated)
        if filter.domain.is_some_and(|want| !domains.contains(&want)) {
            continue;
        }
        let mut first = Some(r);
        for d in domains {
            let mut r = match first.take() {
                Some(r) => r,
                None => open_as(&pool, path, name, read)?,
            };
            if info.version >= 3 {
                r.set_domain_filter(Some(d));
            }
            streams.push(StreamSpec {
                process,
                domain: d,
                reader: r,
                // (the window is set once every input's start is known)
                counting: Counting {
                    sample_rate: info.sample_rate,
                    word_bytes: u64::from(info.word_size.max(8) / 8),
                    from: None,
                    to: None,
                    in_domain: filter.domain.is_none_or(|want| want == d),
                    source: filter.source,
                    min_size: filter.min_size,
                    max_size: filter.max_size,
                },
                bytes_of,
            });
        }
    }
    Ok(Opened {
        processes,
        streams,
        start_us: start.unwrap_or(0),
    })
}

/// The inputs opened for a pass: the processes the filter keeps, their streams, and the
/// earliest start of all inputs (the origin of times given since the start).
pub(super) struct Opened {
    pub(super) processes: Vec<ProcessState>,
    pub(super) streams: Vec<StreamSpec>,
    pub(super) start_us: u64,
}

/// How an input is read: its location lists kept in a pool the readers share, and a
/// window of its packet at a time (the file's length given).
#[derive(Clone, Copy)]
struct Read<'a> {
    locations: Option<&'a Arc<LocationPool>>,
    window: Option<u64>,
}

/// A reader of `source`, which messages name `name` (a spooled pipe by its own name), read
/// as `read` says.
/// (Files are opened lazily under a budget of descriptors, as a merge's are, so that as
/// many inputs as a merge takes can be analysed under a small `ulimit -n`.)
fn open_as(
    pool: &FilePool,
    source: &std::path::Path,
    name: &std::path::Path,
    read: Read,
) -> Result<Reader<LazyFile>> {
    let f = pool
        .open(source)
        .map_err(|e| Error::input(name, "open", e))?;
    let name = name.display().to_string();
    match (read.locations, read.window) {
        (Some(locations), Some(file_len)) => {
            Reader::windowed(f, &name, READ_WINDOW, file_len, locations.clone())
        }
        (Some(locations), None) => Reader::pooled(f, &name, READ_BUFFER, locations.clone()),
        (None, _) => Reader::new(f, &name),
    }
}

/// The pass over `inputs`.
pub(crate) fn run(
    names: &[PathBuf],
    sources: &[PathBuf],
    opts: &AnalysisOptions,
    cancel: &Cancel,
) -> Result<Pass> {
    let filter = &opts.filter;
    let Opened {
        mut processes,
        mut streams,
        start_us: start,
    } = open(names, sources, filter)?;
    // (each process's ring of live objects sized as a merge sizes its inputs': their
    // rings share a few MiB)
    let ring = (1 << 19) / processes.len().max(1);
    for p in processes.iter_mut() {
        p.objects = LiveObjects::with_ring(ring);
    }
    if processes.is_empty() {
        return Err(Error::NothingToAnalyse(
            "no input left: --pid names no process of the inputs".into(),
        ));
    }
    let mut r = Replay {
        pass: Pass {
            tree: Tree::default(),
            processes,
            cells: CellFigures::default(),
            peak: 0,
            peak_time: None,
            first_time: None,
            last_time: None,
            timeline: Timeline {
                step_us: opts.step_us.unwrap_or(1000).max(1),
                fixed: opts.step_us.is_some(),
                start_us: start,
                ..Timeline::default()
            },
        },
        from: filter.from.map(|t| t.absolute(start)),
        to: filter.to.map(|t| t.absolute(start)),
        at: opts.at.map(|t| t.absolute(start)),
        total: 0,
        dirty: Vec::new(),
        touched: Vec::new(),
        now: None,
        cells: Vec::new(),
        at_peak: Vec::new(),
        at_own_peak: Vec::new(),
        at_time: None,
    };
    for s in streams.iter_mut() {
        (s.counting.from, s.counting.to) = (r.from, r.to);
    }
    if let (Some(f), Some(t)) = (r.from, r.to) {
        if f > t {
            return Err(Error::Usage(format!(
                "--from +{:.6} s is after --to +{:.6} s: the window is empty",
                f.saturating_sub(start) as f64 / 1e6,
                t.saturating_sub(start) as f64 / 1e6
            )));
        }
    }
    if let Some(f) = r.from {
        r.pass.timeline.keep_from(f);
    }
    let nstreams = streams.len();
    let batch = BatchLimit {
        events: ((1 << 18) / nstreams.max(1)).clamp(64, BATCH),
        frames: BATCH_FRAMES,
    };
    let mut feed = Feed::start(r.pass.processes.len(), streams, batch)?;
    r.replay(&mut feed, cancel)?;
    for (p, w) in std::mem::take(&mut feed.warnings) {
        r.pass.processes[p as usize].warnings.push(w);
    }
    let (tree, counted, ids) = feed.finish()?;
    r.pass.tree = tree;
    r.end_of_time()?;
    if r.at.is_some() && r.at <= r.pass.last_time {
        r.take_at();
    }
    r.pass.cells = CellFigures {
        counted,
        ids,
        live: r.cells,
        at_peak: r.at_peak,
        at_own_peak: r.at_own_peak,
        at_time: r.at_time,
    };
    // (each process's sums taken once, in the tree's order of cells)
    let pass = &mut r.pass;
    for (c, n) in pass.tree.cells.iter().zip(pass.cells.allocated()) {
        let a = &mut pass.processes[c.process as usize].allocated;
        a.allocations += n.allocations;
        a.samples += n.samples;
        a.bytes += n.bytes;
        a.objects += n.objects;
    }
    Ok(r.pass)
}

/// The pass under way: the heap now, and what changed since the last microsecond ended.
struct Replay {
    pass: Pass,
    from: Option<u64>,
    to: Option<u64>,
    at: Option<u64>,
    total: u64,
    /// Processes whose heap changed in the current microsecond.
    dirty: Vec<u32>,
    /// Cells whose live bytes changed since the combined peak.
    touched: Vec<u32>,
    /// The current microsecond.
    now: Option<u64>,
    /// By cell id.
    cells: Vec<LiveCell>,
    /// Each cell's live bytes at the combined peak and at its process's.
    at_peak: Vec<u64>,
    at_own_peak: Vec<u64>,
    /// At `--at`, once taken.
    at_time: Option<Vec<u64>>,
}

impl Replay {
    /// Every stream's events in time order (ties: allocations first, then the streams'
    /// order), up to the window's end.
    fn replay(&mut self, feed: &mut Feed, cancel: &Cancel) -> Result<()> {
        let nstreams = feed.streams();
        let process: Vec<u32> = (0..nstreams).map(|i| feed.process(i)).collect();
        let mut heap = BinaryHeap::new();
        for i in 0..nstreams {
            if let Some(e) = feed.peek(i)? {
                heap.push(Reverse((e.key(), i)));
            }
        }
        let mut events = 0u64;
        while let Some(Reverse((_, i))) = heap.pop() {
            // (a stream's events are taken while they come before every other stream's next
            // one: the heap is touched once a run, not once an event)
            let bound = heap.peek().map(|Reverse(k)| *k);
            while let Some(&ev) = feed.peek(i)? {
                let key = ev.key();
                if bound.is_some_and(|b| (key, i) > b) {
                    heap.push(Reverse((key, i)));
                    break;
                }
                feed.advance(i);
                events += 1;
                if events.is_multiple_of(65536) && cancel.is_cancelled() {
                    return Err(Error::Cancelled);
                }
                let time = key.0;
                if self.to.is_some_and(|to| time > to) {
                    // (nothing after the window counts: its end is the end)
                    heap.clear();
                    break;
                }
                if self.now != Some(time) {
                    self.end_of_time()?;
                    if let Some(f) = self.from {
                        if self.now.is_some_and(|n| n < f) && time >= f {
                            self.enter_window(f);
                        }
                    }
                    self.now = Some(time);
                }
                self.apply(process[i], time, ev);
            }
        }
        Ok(())
    }

    /// The heap as all events of the current microsecond left it: a candidate peak and a
    /// point of the timeline; then `--at`'s figures if the next event is past it. An error
    /// once a fixed step has made more steps than a timeline keeps.
    fn end_of_time(&mut self) -> Result<()> {
        let Some(t) = self.now else { return Ok(()) };
        self.checkpoint(t);
        let p = &mut self.pass;
        if self.from.is_none_or(|f| t >= f) {
            p.timeline.record(t, self.total, &p.processes, &self.dirty);
        }
        for &d in &self.dirty {
            p.processes[d as usize].dirty = false;
        }
        self.dirty.clear();
        p.first_time.get_or_insert(t);
        p.last_time = Some(t);
        if p.timeline.overflow {
            return Err(too_many_steps(p));
        }
        Ok(())
    }

    /// The heap as the window opens at `from` (what the events before it left) is a
    /// candidate peak of the run and of every process, and the timeline's first value.
    fn enter_window(&mut self, from: u64) {
        self.dirty = (0..self.pass.processes.len() as u32).collect();
        self.checkpoint(from);
        self.dirty.clear();
        let p = &mut self.pass;
        p.timeline.open_at(from, self.total, &p.processes);
    }

    /// Each cell's live bytes now are its figure at `--at`.
    fn take_at(&mut self) {
        if self.at_time.is_none() {
            self.at_time = Some(self.cells.iter().map(|c| c.live).collect());
        }
    }

    /// One event of process `p` at `time`.
    #[inline]
    fn apply(&mut self, p: u32, time: u64, ev: Ev) {
        if self.at.is_some_and(|a| time > a) {
            self.take_at();
        }
        let st = &mut self.pass.processes[p as usize];
        st.last_time = Some(time);
        let (cell, delta) = if ev.cell != COLLECT {
            let cell = ev.cell;
            if self.cells.len() <= cell as usize {
                // (cells are the decoding threads' until the end)
                let n = cell as usize + 1;
                self.cells.resize(n, LiveCell::default());
                self.at_peak.resize(n, 0);
                self.at_own_peak.resize(n, 0);
            }
            st.objects.insert(ev.id, pack(cell, ev.nsamples));
            let bytes = st.bytes_of.of(u64::from(ev.nsamples));
            (cell, bytes as i64)
        } else {
            match st.objects.remove(ev.id) {
                Some(v) => {
                    let (cell, nsamples) = unpack(v);
                    let bytes = st.bytes_of.of(u64::from(nsamples));
                    (cell, -(bytes as i64))
                }
                None => {
                    st.unmatched += 1;
                    return;
                }
            }
        };
        let c = &mut self.cells[cell as usize];
        c.live = (c.live as i64 + delta) as u64;
        if c.touched != COMBINED | OWN {
            if c.touched & COMBINED == 0 {
                self.touched.push(cell);
            }
            if c.touched & OWN == 0 {
                st.touched.push(cell);
            }
            c.touched = COMBINED | OWN;
        }
        st.live = (st.live as i64 + delta) as u64;
        self.total = (self.total as i64 + delta) as u64;
        if !st.dirty {
            st.dirty = true;
            self.dirty.push(p);
        }
    }

    /// At the end of microsecond `t`: a new combined peak, or a new peak of a process that
    /// changed in it, takes the live bytes of the cells changed since the last one.
    fn checkpoint(&mut self, t: u64) {
        if self.from.is_some_and(|f| t < f) || self.to.is_some_and(|e| t > e) {
            return;
        }
        let pass = &mut self.pass;
        if new_peak(self.total, &mut pass.peak, &mut pass.peak_time, t) {
            settle(
                &mut self.cells,
                &mut self.at_peak,
                &mut self.touched,
                COMBINED,
            );
        }
        for &p in &self.dirty {
            let st = &mut pass.processes[p as usize];
            if new_peak(st.live, &mut st.peak, &mut st.peak_time, t) {
                settle(&mut self.cells, &mut self.at_own_peak, &mut st.touched, OWN);
            }
        }
    }
}

/// At a new peak (the combined one or a process's, `which`): the cells changed since the
/// last one take their live bytes now (`at`); the others' have not changed since.
fn settle(cells: &mut [LiveCell], at: &mut [u64], touched: &mut Vec<u32>, which: u8) {
    for &n in touched.iter() {
        let c = &mut cells[n as usize];
        at[n as usize] = c.live;
        c.touched &= !which;
    }
    touched.clear();
}

/// The error of a fixed step that makes more steps than a timeline keeps.
fn too_many_steps(pass: &Pass) -> Error {
    let tl = &pass.timeline;
    Error::Usage(format!(
        "--step {} ms: more than {} steps of {} processes; give a longer step",
        tl.step_us as f64 / 1000.0,
        max_fixed_steps(pass.processes.len()),
        pass.processes.len()
    ))
}

/// Whether `live` at `t` is a new peak (the first value is one); records it.
fn new_peak(live: u64, peak: &mut u64, peak_time: &mut Option<u64>, t: u64) -> bool {
    let new = live > *peak || peak_time.is_none();
    if new {
        *peak = live;
        *peak_time = Some(t);
    }
    new
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (time, total, process, its heap): one change of the heap, as recorded.
    type Change = (u64, u64, usize, u64);

    /// Record on `tl` the heaps of `ps` changed by 2,000 ms of events from the step `from`
    /// of 1 ms on, at most `most` bytes a process; the changes.
    fn record(tl: &mut Timeline, ps: &mut [ProcessState], from: u64, most: u64) -> Vec<Change> {
        let n = ps.len() as u64;
        let mut total: u64 = ps.iter().map(|s| s.live).sum();
        let mut seen = Vec::new();
        for k in from..2000u64 {
            let p = (k * 7 % n) as usize;
            let live = (k * 7919) % most;
            total = total - ps[p].live + live;
            ps[p].live = live;
            tl.record(k * 1000 + 500, total, ps, &[p as u32]);
            seen.push((k * 1000 + 500, total, p, live));
        }
        seen
    }

    /// A brute-force replay of `seen` against `tl`'s rows: each step's largest total, and
    /// each process's largest heap, starting from what the steps before it left (`now`,
    /// `now_total` before the first).
    fn assert_rows(tl: &Timeline, seen: &[Change], mut now: Vec<u64>, mut now_total: u64) {
        let step_us = tl.step_us;
        for (i, (row_total, row)) in tl.rows.iter().enumerate() {
            let k = (tl.first + i) as u64;
            let span = k * step_us..(k + 1) * step_us;
            let (mut want, mut want_total) = (now.clone(), now_total);
            for &(_, tot, p, live) in seen.iter().filter(|e| span.contains(&e.0)) {
                (now[p], now_total) = (live, tot);
                want[p] = want[p].max(live);
                want_total = want_total.max(tot);
            }
            assert_eq!(*row_total, want_total, "{} processes, step {i}", now.len());
            assert_eq!(row, &want, "{} processes, step {i}", now.len());
        }
    }

    /// The same 2,000 ms of heaps recorded for 4 processes and for 4,096: the steps are
    /// fewer (longer) with more processes, and each row still holds the largest total and
    /// each process's largest heap of its step, as a replay of every event says.
    #[test]
    fn more_processes_make_fewer_longer_steps_with_the_same_maxima() {
        for (n, steps, step_us) in [(4, 1000, 2000), (4096, 250, 8000)] {
            assert_eq!(max_steps(n), if n == 4 { MAX_STEPS } else { 256 });
            let mut tl = Timeline {
                step_us: 1000,
                ..Timeline::default()
            };
            let mut ps = vec![ProcessState::default(); n];
            let seen = record(&mut tl, &mut ps, 0, 1000);
            assert_eq!(
                (tl.rows.len(), tl.step_us),
                (steps, step_us),
                "{n} processes"
            );
            assert_rows(&tl, &seen, vec![0u64; n], 0);
        }
    }

    /// A fixed step keeps its steps up to [`max_fixed_steps`], and past them says so and
    /// makes no row (a step of 1 µs over seconds would be millions).
    #[test]
    fn a_fixed_step_keeps_no_row_past_its_limit() {
        let n = 4;
        let most = max_fixed_steps(n);
        assert_eq!(most, MAX_FIXED_STEPS);
        let mut tl = Timeline {
            step_us: 1,
            fixed: true,
            ..Timeline::default()
        };
        let ps = vec![ProcessState::default(); n];
        tl.record(most as u64 - 1, 7, &ps, &[0]);
        assert_eq!((tl.rows.len(), tl.overflow), (most, false));
        tl.record(most as u64, 8, &ps, &[0]);
        assert_eq!((tl.rows.len(), tl.overflow), (most, true));
        assert_eq!(tl.rows.last().map(|r| r.0), Some(7));
    }

    /// A window opening in an odd step (the fourth of 1 ms): the rows start at its step,
    /// with the heap as it opens; once the steps are made longer (three times, for 4,096
    /// processes), each row still holds its step's largest values from the window's start,
    /// and the first row is the step that holds it.
    #[test]
    fn a_window_keeps_its_steps_from_its_start() {
        let n = 4096;
        let mut tl = Timeline {
            step_us: 1000,
            ..Timeline::default()
        };
        let mut ps = vec![ProcessState::default(); n];
        for (p, s) in ps.iter_mut().enumerate() {
            s.live = 1000 + p as u64 % 7;
        }
        let entering: Vec<u64> = ps.iter().map(|s| s.live).collect();
        let entering_total = entering.iter().sum();
        tl.keep_from(3_500);
        tl.open_at(3_500, entering_total, &ps);
        let seen = record(&mut tl, &mut ps, 4, 3000);
        assert_eq!((tl.step_us, tl.first, tl.rows.len()), (8000, 0, 250));
        assert_rows(&tl, &seen, entering, entering_total);
    }
}
