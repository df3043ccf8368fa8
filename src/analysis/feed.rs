//! An analysis's streams decoded a batch ahead on other threads, their backtraces interned
//! and their allocations counted there, so that the pass (on the caller's thread) mostly
//! replays events; any thread decodes any stream, the pass too while it waits.

use super::sites::{
    cell_key, define, Backtraces, CellTable, Ids, NewCells, Path, StreamCells, Tree, Wait,
};
use crate::error::{Error, Result};
use crate::format::event::{AllocSource, LocationCode};
use crate::format::location::{LocationList, LocationTable};
use crate::pipeline::files::LazyFile;
use crate::pipeline::lock;
use crate::pipeline::placement::Placement;
use crate::reader::{EventSink, Reader};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::sync::atomic::AtomicU32;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

/// What the pass needs of an event: an allocation or a collect (promotes change no
/// liveness and are not kept, nor are allocations the filters leave out).
#[derive(Clone, Copy)]
pub(crate) struct Ev {
    pub(crate) time: u64,
    pub(crate) id: u64,
    /// An allocation's cell, or [`COLLECT`].
    pub(crate) cell: u32,
    /// An allocation's samples, cut at 2^32 - 2 (none in a real trace has so many), as the
    /// pass's ring of live objects keeps them.
    pub(crate) nsamples: u32,
}

/// The cell of a collect.
pub(crate) const COLLECT: u32 = u32::MAX;

impl Ev {
    /// The order of events: by time, a microsecond's allocations before its collections.
    pub(crate) fn key(&self) -> (u64, u8) {
        (self.time, u8::from(self.cell == COLLECT))
    }
}

/// One domain of one input, to be read.
pub(crate) struct StreamSpec {
    pub(crate) process: u32,
    pub(crate) domain: u16,
    pub(crate) reader: Reader<LazyFile>,
    pub(crate) counting: Counting,
    /// Its process's estimated bytes by samples.
    pub(crate) bytes_of: BytesOf,
}

/// How an input's allocations are counted and filtered (by the decoding threads, so that
/// the pass only replays lifetimes).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Counting {
    pub(crate) sample_rate: f64,
    pub(crate) word_bytes: u64,
    /// The window (µs since the epoch).
    pub(crate) from: Option<u64>,
    pub(crate) to: Option<u64>,
    /// The stream's allocations are in the domain `--domain` keeps (or it keeps all): the
    /// others are left out, but their collects, of objects that another domain of the
    /// process may have allocated, are read.
    pub(crate) in_domain: bool,
    pub(crate) source: Option<AllocSource>,
    pub(crate) min_size: Option<u64>,
    pub(crate) max_size: Option<u64>,
}

impl Counting {
    fn keeps(&self, source: AllocSource, size: u64) -> bool {
        self.in_domain
            && self.source.is_none_or(|s| s == source)
            && self.min_size.is_none_or(|m| size >= m)
            && self.max_size.is_none_or(|m| size <= m)
    }
}

/// The bytes `nsamples` samples stand for, rounded to the nearest (as `f64::round` for all
/// but values no trace gives, without its call: this is done for every event).
#[inline]
pub(crate) fn estimated_bytes(nsamples: u64, bytes_per_sample: f64) -> u64 {
    (nsamples as f64 * bytes_per_sample + 0.5) as u64
}

/// [`estimated_bytes`] at one rate, those of allocations of a few samples (most are of
/// one) looked up: the float's conversion at every event took a good part of the time.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct BytesOf {
    small: [u64; 16],
    per_sample: f64,
}

impl BytesOf {
    pub(crate) fn new(bytes_per_sample: f64) -> BytesOf {
        BytesOf {
            small: std::array::from_fn(|n| estimated_bytes(n as u64, bytes_per_sample)),
            per_sample: bytes_per_sample,
        }
    }

    /// The estimated bytes of `nsamples` samples.
    #[inline]
    pub(crate) fn of(&self, nsamples: u64) -> u64 {
        match self.small.get(nsamples as usize) {
            Some(&b) => b,
            None => estimated_bytes(nsamples, self.per_sample),
        }
    }
}

/// What a cell allocated (in the window). Bytes and objects are estimates.
///
/// Half a cache line, and at the start of one or in its middle: a decoding thread adds to
/// a cell's at nearly every allocation, in no order, and misses the cache at each.
#[derive(Clone, Copy, Debug, Default)]
#[repr(C, align(32))]
pub(crate) struct Allocated {
    pub(crate) allocations: u64,
    pub(crate) samples: u64,
    pub(crate) bytes: u64,
    pub(crate) objects: f64,
}

/// What a cell allocated up to the window's end, in the window or not: its live objects
/// and samples are estimated from its live bytes at these ratios. Kept apart only when
/// the window has a start (else it is what [`Allocated`] says).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Seen {
    pub(crate) bytes: u64,
    pub(crate) objects: f64,
    pub(crate) samples: u64,
}

/// What the decoding threads counted of the cells, stream by stream, each stream's in the
/// order it met them.
#[derive(Debug, Default)]
pub(crate) struct Counted {
    pub(crate) allocated: Vec<Vec<Allocated>>,
    /// Each stream's empty, unless the window has a start.
    pub(crate) seen: Vec<Vec<Seen>>,
}

/// A stream as it is read: everything a thread needs to decode its next batch, handed to
/// whichever thread does it.
struct Decoding {
    /// Its index among the analysis's streams.
    stream: u32,
    process: u32,
    domain: u16,
    reader: Option<Reader<LazyFile>>,
    counting: Counting,
    /// Its allocations' estimated bytes by samples.
    bytes_of: BytesOf,
    path: Path,
    /// Every stream's backtraces.
    backtraces: Arc<Mutex<Backtraces>>,
    /// Its cells, and them by key.
    cells: StreamCells,
    by_key: CellTable,
    /// The codes its location events defined.
    table: LocationTable,
    /// What each of its cells allocated, by their index in `cells`.
    allocated: Vec<Allocated>,
    /// Likewise, what each allocated before the window too (only if it has a start).
    seen: Vec<Seen>,
    /// The last allocation's (cell key, cell id, its index in `cells`): an allocation of
    /// the same site as the one before skips the table.
    last: Option<(u64, u32, u32)>,
    /// Its new cells may wait for the tree's lock in the stream ([`StreamCells::hold`]):
    /// not with many streams, which would each keep their room.
    may_hold: bool,
}

impl Decoding {
    /// Stream `stream` of an analysis, to be read from its start.
    fn new(stream: u32, s: StreamSpec, backtraces: Arc<Mutex<Backtraces>>) -> Decoding {
        Decoding {
            stream,
            process: s.process,
            domain: s.domain,
            reader: Some(s.reader),
            counting: s.counting,
            bytes_of: s.bytes_of,
            path: Path::default(),
            backtraces,
            cells: StreamCells::new(s.process, s.domain),
            by_key: CellTable::default(),
            table: LocationTable::default(),
            allocated: Vec::new(),
            seen: Vec::new(),
            last: None,
            may_hold: false,
        }
    }
}

/// Hands a stream's events to a batch, its backtraces interned in the tree.
struct Sink<'a> {
    s: &'a mut Decoding,
    ids: &'a mut Ids,
    new: &'a mut NewCells,
    out: &'a mut Vec<Ev>,
    /// Frames past the common prefixes taken in so far, and at most (then the batch ends).
    frames: usize,
    max_frames: usize,
}

impl EventSink for Sink<'_> {
    fn location(&mut self, code: LocationCode, locs: &LocationList) {
        define(&mut self.s.table, code, locs);
    }
    fn alloc(
        &mut self,
        time: u64,
        id: u64,
        length: u64,
        nsamples: u64,
        source: AllocSource,
        common_prefix: u64,
        backtrace: &[LocationCode],
        _slots: &[u16],
    ) {
        let s = &mut *self.s;
        self.frames += backtrace.len().saturating_sub(common_prefix as usize);
        // (every backtrace is taken in: the next one's common prefix is with this one)
        let fp = s.path.fingerprint(common_prefix as usize, backtrace);
        let c = s.counting;
        if !c.keeps(source, length * c.word_bytes) {
            return;
        }
        let key = cell_key(fp, source);
        let (cell, local) = match s.last {
            Some((k, id, local)) if k == key => (id, local),
            _ => {
                let (id, local) = match s.by_key.get(&key) {
                    Some(&v) => v,
                    None => {
                        let v = s.cells.new_cell(
                            source,
                            &s.path,
                            backtrace,
                            self.ids,
                            self.new,
                            &s.backtraces,
                        );
                        s.by_key.insert(key, v);
                        s.allocated.push(Allocated::default());
                        if c.from.is_some() {
                            s.seen.push(Seen::default());
                        }
                        v
                    }
                };
                s.last = Some((key, id, local));
                (id, local)
            }
        };
        let bytes = s.bytes_of.of(nsamples);
        if c.to.is_none_or(|t| time <= t) {
            let objects = if c.sample_rate > 0.0 {
                nsamples as f64 / (c.sample_rate * (length + 1) as f64)
            } else {
                0.0
            };
            if let Some(seen) = s.seen.get_mut(local as usize) {
                seen.bytes += bytes;
                seen.objects += objects;
                seen.samples += nsamples;
            }
            if c.from.is_none_or(|f| time >= f) {
                let a = &mut s.allocated[local as usize];
                a.allocations += 1;
                a.samples += nsamples;
                a.bytes += bytes;
                a.objects += objects;
            }
        }
        self.out.push(Ev {
            time,
            id,
            cell,
            nsamples: nsamples.min(u64::from(u32::MAX) - 1) as u32,
        });
    }
    fn full(&self) -> bool {
        self.frames >= self.max_frames
    }
    fn promote(&mut self, _time: u64, _id: u64) {}
    fn collect(&mut self, time: u64, id: u64) {
        self.out.push(Ev {
            time,
            id,
            cell: COLLECT,
            nsamples: 0,
        });
    }
}

/// A stream's next events, and what was met reading them.
struct Batch {
    events: Vec<Ev>,
    /// Damage met: (process, warning).
    warnings: Vec<(u32, String)>,
    /// The stream has no more.
    end: bool,
}

/// Read up to `limit.events` events of `s` into `out`, ending after the allocation that
/// brings the frames taken in to `limit.frames` (a damaged stream ends with a warning).
fn decode(
    s: &mut Decoding,
    ids: &mut Ids,
    new: &mut NewCells,
    mut out: Vec<Ev>,
    limit: BatchLimit,
) -> Batch {
    out.clear();
    let Some(mut r) = s.reader.take() else {
        return Batch {
            events: out,
            warnings: Vec::new(),
            end: true,
        };
    };
    let more = r.read_events(
        &mut Sink {
            s,
            ids,
            new,
            out: &mut out,
            frames: 0,
            max_frames: limit.frames,
        },
        limit.events,
    );
    let mut warnings: Vec<(u32, String)> = (r.take_warnings().into_iter())
        .map(|w| (s.process, w.to_string()))
        .collect();
    let end = match more {
        Ok(true) => {
            s.reader = Some(r);
            false
        }
        Ok(false) => true,
        Err(e) => {
            let d = s.domain;
            warnings.push((
                s.process,
                format!("domain {d}: analysed up to an error, the rest left out: {e}"),
            ));
            true
        }
    };
    // (with the tree locked by another thread, the batch's new cells wait in the stream
    // for its next batch, and this thread goes on to another stream)
    let wait = if end || !s.may_hold {
        Wait::Always
    } else {
        Wait::IfMany
    };
    s.cells.intern_new(new, &s.backtraces, wait);
    if !new.is_empty() {
        s.cells.hold(new);
    }
    if end {
        // (what only reading needs goes now, on this thread, rather than when the pass
        // is done and waits for it; the reader went with its last event)
        s.path = Path::default();
        s.by_key = CellTable::default();
    }
    Batch {
        events: out,
        warnings,
        end,
    }
}

/// How much of a stream one batch takes at most.
#[derive(Clone, Copy, Debug)]
pub(crate) struct BatchLimit {
    pub(crate) events: usize,
    /// Frames past the common prefixes: what fingerprinting and interning a batch cost
    /// grows with them. A stream of deep backtraces (recursions thousands of frames deep
    /// between shallow allocations) made batches of milliseconds, which the pass waited
    /// for while the other thread, its streams decoded ahead, had nothing to do.
    pub(crate) frames: usize,
}

/// Streams whose new cells may wait for the tree's lock, at most ([`Decoding::may_hold`]).
const HOLDING_STREAMS: usize = 64;

/// Batches decoded ahead of the one being replayed, a stream, at least: enough that the
/// decoding threads have work while the pass replays (else a core idles).
const AHEAD: usize = 2;

/// ... and at most, while all streams' batches of events in flight stay within
/// [`AHEAD_EVENTS`]: with few streams, those that are read fast are decoded further ahead
/// while the pass waits on a slower one, rather than the threads idling.
const MOST_AHEAD: usize = 4;

/// Events that may be decoded ahead, in all streams, for more than [`AHEAD`] batches a
/// stream.
const AHEAD_EVENTS: usize = 1 << 19;

/// Batches a stream may have decoded ahead, of `events` each, when there are `streams`.
fn batches_ahead(events: usize, streams: usize) -> usize {
    (AHEAD_EVENTS / (events.max(1) * streams.max(1))).clamp(AHEAD, MOST_AHEAD)
}

/// A stream's next batch to decode, with the buffer to decode it into.
struct Job {
    state: Box<Decoding>,
    buf: Vec<Ev>,
}

/// A decoded batch, and the stream back.
struct Done {
    state: Box<Decoding>,
    batch: Batch,
}

/// The jobs waiting for a thread, the most urgent first: that of the stream whose decoded
/// events the pass will have replayed first (a stream's batches are decoded one after
/// another, and the one the pass waits on most sets the pace). A stream has one job at
/// most.
struct Jobs {
    queue: Mutex<Waiting>,
    /// Signalled when a job is queued or the queue closed.
    queued: Condvar,
}

struct Waiting {
    /// By stream.
    jobs: Vec<Option<(u64, Job)>>,
    /// (when its decoded events run out, stream), for each job; an entry whose job has
    /// gone is skipped.
    order: BinaryHeap<Reverse<(u64, u32)>>,
    closed: bool,
}

impl Waiting {
    /// The most urgent job.
    fn first(&mut self) -> Option<Job> {
        while let Some(Reverse((due, i))) = self.order.pop() {
            match self.jobs[i as usize].take() {
                Some((d, job)) if d == due => return Some(job),
                // (a job taken out of turn, and its stream's next queued)
                other => self.jobs[i as usize] = other,
            }
        }
        None
    }
}

impl Jobs {
    fn new(streams: usize) -> Jobs {
        Jobs {
            queue: Mutex::new(Waiting {
                jobs: (0..streams).map(|_| None).collect(),
                order: BinaryHeap::new(),
                closed: false,
            }),
            queued: Condvar::new(),
        }
    }

    /// Queue `job`, whose stream's decoded events run out at `due`.
    fn push(&self, due: u64, job: Job) {
        let mut q = lock(&self.queue);
        let i = job.state.stream;
        q.jobs[i as usize] = Some((due, job));
        q.order.push(Reverse((due, i)));
        drop(q);
        self.queued.notify_one();
    }

    /// The next job, waiting for one; None once closed.
    fn take(&self) -> Option<Job> {
        let mut q = lock(&self.queue);
        loop {
            if q.closed {
                return None;
            }
            if let Some(j) = q.first() {
                return Some(j);
            }
            q = self.queued.wait(q).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Stream `want`'s job if it is waiting, else the most urgent, without waiting.
    fn take_now(&self, want: u32) -> Option<Job> {
        let mut q = lock(&self.queue);
        match q.jobs[want as usize].take() {
            Some((_, job)) => Some(job),
            None => q.first(),
        }
    }

    /// No more jobs taken; those waiting.
    fn close(&self) -> Vec<Job> {
        let mut q = lock(&self.queue);
        q.closed = true;
        self.queued.notify_all();
        q.order.clear();
        (q.jobs.iter_mut())
            .filter_map(|j| j.take().map(|(_, job)| job))
            .collect()
    }
}

/// The error when a decoding thread panicked.
fn panicked() -> Error {
    Error::Internal("a decoding thread panicked".into())
}

impl Drop for Feed {
    /// The threads end with the feed (after an error, or a cancel, before its end).
    fn drop(&mut self) {
        self.stop();
    }
}

/// The pass's side of a stream: the batch being replayed, those decoded after it, and the
/// stream itself when no thread is decoding it.
struct Queue {
    process: u32,
    ready: Vec<Ev>,
    pos: usize,
    next: VecDeque<Batch>,
    /// The stream, when it is not being decoded.
    home: Option<Box<Decoding>>,
    /// The last batch has been decoded.
    decoded: bool,
    /// Buffers to decode into.
    spare: Vec<Vec<Ev>>,
}

/// The streams' events, decoded ahead on other threads.
pub(crate) struct Feed {
    jobs: Arc<Jobs>,
    /// Batches decoded by the threads (None: a thread panicked).
    done: Receiver<Option<Done>>,
    workers: Vec<JoinHandle<()>>,
    backtraces: Arc<Mutex<Backtraces>>,
    /// The ids of the cells the pass makes when it decodes.
    ids: Ids,
    new: NewCells,
    /// Where the decoding threads run: off the pass's CPU.
    placement: Arc<Placement>,
    queues: Vec<Queue>,
    batch: BatchLimit,
    /// Batches a stream may have decoded ahead ([`AHEAD`], [`MOST_AHEAD`]).
    ahead: usize,
    processes: usize,
    /// Damage met so far: (process, warning).
    pub(crate) warnings: Vec<(u32, String)>,
}

/// A decoding thread: jobs in, batches out, until the queue is closed. (A panic, which no
/// input should cause, is said to the pass rather than leaving it waiting for a batch.)
fn decoder(
    jobs: Arc<Jobs>,
    out: Sender<Option<Done>>,
    mut ids: Ids,
    batch: BatchLimit,
    placement: Arc<Placement>,
) {
    // (kept off the pass's CPU, as a merge keeps its decoding threads off its merging
    // thread's: else the kernel often has the two take turns on one CPU)
    let _placed = placement.helper();
    let mut new = NewCells::default();
    while let Some(Job { mut state, buf }) = jobs.take() {
        let decoded = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            decode(&mut state, &mut ids, &mut new, buf, batch)
        }));
        let done = decoded.ok().map(|batch| Done { state, batch });
        let panicked = done.is_none();
        if out.send(done).is_err() || panicked {
            break;
        }
    }
}

impl Feed {
    /// Start decoding `streams` (of `processes` inputs), a stream at a time up to `batch`'s
    /// events and frames, on as many threads as there are processors but one (the pass's), at least
    /// one and four at most.
    pub(crate) fn start(
        processes: usize,
        streams: Vec<StreamSpec>,
        batch: BatchLimit,
    ) -> Result<Feed> {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let k = (cores - 1).clamp(1, 4).min(streams.len().max(1));
        let cell_ids = Arc::new(AtomicU32::new(0));
        let backtraces = Arc::new(Mutex::new(Backtraces::default()));
        let jobs = Arc::new(Jobs::new(streams.len()));
        let (done_tx, done) = channel::<Option<Done>>();
        let mut workers = Vec::new();
        let placement = Placement::new();
        for _ in 0..k {
            let (jobs, out, ids) = (jobs.clone(), done_tx.clone(), Ids::new(cell_ids.clone()));
            let placed = placement.clone();
            let w = std::thread::Builder::new()
                .name("memtrace-analysis-decode".into())
                .spawn(move || decoder(jobs, out, ids, batch, placed))
                .map_err(|e| Error::Internal(format!("cannot start a decoding thread: {e}")))?;
            workers.push(w);
        }
        let mut f = Feed {
            jobs,
            done,
            workers,
            ids: Ids::new(cell_ids),
            new: NewCells::default(),
            placement,
            backtraces: backtraces.clone(),
            queues: Vec::new(),
            batch,
            ahead: batches_ahead(batch.events, streams.len()),
            processes,
            warnings: Vec::new(),
        };
        let may_hold = streams.len() <= HOLDING_STREAMS;
        for (i, s) in streams.into_iter().enumerate() {
            let process = s.process;
            let mut state = Box::new(Decoding::new(i as u32, s, backtraces.clone()));
            state.may_hold = may_hold;
            f.queues.push(Queue {
                process,
                ready: Vec::new(),
                pos: 0,
                next: VecDeque::new(),
                home: Some(state),
                decoded: false,
                spare: Vec::new(),
            });
            f.submit(i);
        }
        Ok(f)
    }

    /// How many streams there are.
    pub(crate) fn streams(&self) -> usize {
        self.queues.len()
    }

    /// The process (input) of stream `i`.
    pub(crate) fn process(&self, i: usize) -> u32 {
        self.queues[i].process
    }

    /// Queue stream `i`'s next batch for decoding, if it is not being decoded and fewer than
    /// [`Feed::ahead`] wait.
    fn submit(&mut self, i: usize) {
        let q = &mut self.queues[i];
        if q.decoded || q.next.len() >= self.ahead {
            return;
        }
        if let Some(state) = q.home.take() {
            let buf = q
                .spare
                .pop()
                .unwrap_or_else(|| Vec::with_capacity(self.batch.events));
            // (when the pass will have replayed what is decoded of it)
            let decoded = q.next.back().map_or(&q.ready, |b| &b.events);
            let due = decoded.last().map_or(0, |e| e.time);
            self.jobs.push(due, Job { state, buf });
        }
    }

    /// A batch decoded: to its stream's queue, and the stream asked for its next.
    fn arrived(&mut self, d: Done) {
        let i = d.state.stream as usize;
        let q = &mut self.queues[i];
        q.decoded |= d.batch.end;
        q.home = Some(d.state);
        q.next.push_back(d.batch);
        self.submit(i);
    }

    /// Stream `i`'s next event, without taking it; None at its end.
    #[inline]
    pub(crate) fn peek(&mut self, i: usize) -> Result<Option<&Ev>> {
        if self.queues[i].pos == self.queues[i].ready.len() && !self.refill(i)? {
            return Ok(None);
        }
        let q = &self.queues[i];
        Ok(q.ready.get(q.pos))
    }

    /// Take stream `i`'s next event (after a [`Feed::peek`] that found one).
    #[inline]
    pub(crate) fn advance(&mut self, i: usize) {
        self.queues[i].pos += 1;
    }

    /// Move stream `i`'s next batch in, waiting for it (and decoding, meanwhile, what
    /// waits for a thread: its batch first); false at the stream's end.
    #[cold]
    fn refill(&mut self, i: usize) -> Result<bool> {
        self.placement.follow();
        loop {
            let q = &mut self.queues[i];
            if let Some(b) = q.next.pop_front() {
                self.warnings.extend(b.warnings);
                let done = std::mem::replace(&mut q.ready, b.events);
                q.spare.push(done);
                q.pos = 0;
                self.submit(i);
                if self.queues[i].ready.is_empty() {
                    continue;
                }
                return Ok(true);
            }
            if q.decoded {
                return Ok(false);
            }
            if let Ok(d) = self.done.try_recv() {
                self.arrived(d.ok_or_else(panicked)?);
            } else if let Some(Job { mut state, buf }) = self.jobs.take_now(i as u32) {
                let batch = decode(&mut state, &mut self.ids, &mut self.new, buf, self.batch);
                self.arrived(Done { state, batch });
            } else {
                // (every thread gone, their batches taken: none will come)
                let d = self.done.recv().map_err(|_| panicked())?;
                self.arrived(d.ok_or_else(panicked)?);
            }
        }
    }

    /// Close the queue of jobs and wait for the threads; true if one panicked.
    fn stop(&mut self) -> bool {
        self.jobs.close();
        // (every thread joined, not only up to the first that panicked)
        let mut panicked = false;
        for w in self.workers.drain(..) {
            panicked |= w.join().is_err();
        }
        panicked
    }

    /// Stop decoding; the tree, with every backtrace met and every cell ([`Tree::join`]),
    /// what each cell allocated (stream by stream) and the id it had, in the tree's order
    /// of cells.
    pub(crate) fn finish(mut self) -> Result<(Tree, Counted, Vec<u32>)> {
        let mut states: Vec<Box<Decoding>> =
            (self.jobs.close().into_iter()).map(|j| j.state).collect();
        if self.stop() {
            return Err(panicked());
        }
        for d in self.done.try_iter() {
            states.push(d.ok_or_else(panicked)?.state);
        }
        states.extend(self.queues.iter_mut().filter_map(|q| q.home.take()));
        if states.len() != self.queues.len() {
            return Err(Error::Internal(
                "a stream was lost by its decoding thread".into(),
            ));
        }
        states.sort_by_key(|s| s.stream);
        // (each stream's figures as they are: joined into one vector, they were copied
        // at the end of the pass, into memory first touched then)
        let mut allocated = Vec::with_capacity(states.len());
        let mut seen = Vec::with_capacity(states.len());
        let mut streams = Vec::with_capacity(states.len());
        for s in states {
            let mut s = *s;
            // (cells held by a stream the pass stopped reading before its end)
            s.cells
                .intern_new(&mut NewCells::default(), &s.backtraces, Wait::Always);
            allocated.push(s.allocated);
            seen.push(s.seen);
            streams.push((s.cells, s.process, s.table));
        }
        let backtraces = std::mem::take(&mut *lock(&self.backtraces));
        let (tree, ids) = Tree::join(backtraces, streams, self.processes);
        Ok((tree, Counted { allocated, seen }, ids))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::Filter;
    use std::path::PathBuf;

    /// An event as the pass gets it: time, object id, cell, samples.
    type Got = (u64, u64, u32, u32);

    /// A stream's events, and the length of each batch.
    fn batches(path: &std::path::Path, limit: BatchLimit) -> (Vec<Got>, Vec<usize>) {
        let names = [path.to_path_buf()];
        let mut streams = (super::super::replay::open(&names, &names, &Filter::default()))
            .expect("opens")
            .streams;
        let mut s = Decoding::new(0, streams.remove(0), Arc::default());
        let mut ids = Ids::new(Arc::default());
        let mut new = NewCells::default();
        let (mut events, mut sizes) = (Vec::new(), Vec::new());
        loop {
            let b = decode(&mut s, &mut ids, &mut new, Vec::new(), limit);
            assert!(b.warnings.is_empty(), "{:?}", b.warnings);
            events.extend(b.events.iter().map(|e| (e.time, e.id, e.cell, e.nsamples)));
            sizes.push(b.events.len());
            if b.end {
                return (events, sizes);
            }
        }
    }

    /// Streams past [`AHEAD`] batches ahead only while all of them hold no more than
    /// [`AHEAD_EVENTS`] decoded ahead; a few streams get [`MOST_AHEAD`].
    #[test]
    fn few_streams_are_decoded_further_ahead_within_a_bound() {
        assert_eq!(batches_ahead(8192, 5), MOST_AHEAD);
        assert_eq!(batches_ahead(64, 4000), AHEAD);
        for streams in 1..300 {
            let events = ((1 << 18) / streams).clamp(64, 8192);
            let ahead = batches_ahead(events, streams);
            assert!((AHEAD..=MOST_AHEAD).contains(&ahead));
            if ahead > AHEAD {
                assert!(
                    ahead * events * streams <= AHEAD_EVENTS,
                    "{streams} streams"
                );
            }
        }
    }

    /// `child-1.ctf` interleaves shallow allocations with ones thousands of frames deep:
    /// bounded by frames, its batches end early, and hand over the same events (cells
    /// numbered alike) as batches bounded by events alone.
    #[test]
    fn a_batch_ends_at_its_frames_with_nothing_lost() {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/fork/child-1.ctf");
        let events = 8192;
        let (whole, sizes) = batches(
            &path,
            BatchLimit {
                events,
                frames: usize::MAX,
            },
        );
        let (cut, cut_sizes) = batches(
            &path,
            BatchLimit {
                events,
                frames: 1 << 15,
            },
        );
        assert!(
            cut_sizes.len() > 4 * sizes.len(),
            "{} batches by frames, {} by events",
            cut_sizes.len(),
            sizes.len()
        );
        assert_eq!(cut.len(), whole.len());
        assert!(cut == whole, "the events differ");
    }
}
