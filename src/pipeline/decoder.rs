//! Decoding the merge's inputs ahead of it on worker threads: each stream (an input, or one
//! domain of a format-3 input) is read into batches of events and the locations they define.

pub(crate) use super::batch::{
    order_key, Batch, Ev, Timed, BATCH_EVENTS, BATCH_EVENTS_AHEAD, BATCH_FRAMES,
    FIRST_BATCH_EVENTS, WIDE_LENGTH, WIDE_SAMPLES,
};
use super::fill::{fill, DecState, DecodeReport};
pub(crate) use super::fill::{Encoder, TAG_FRAME, THINNED_OUT};
use crate::format::location::LocationPool;
use crate::pipeline::files::FilePool;
use crate::pipeline::placement::Placement;
use crate::pipeline::share::ShareOf;
use crate::pipeline::try_lock;
use crate::reader::Reader;
use crate::thin::Thinner;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// What to read: an input's file, and the domain (format 3) of this stream.
pub(crate) struct StreamSpec {
    pub input: usize,
    /// What to open (the input, or its spool).
    pub path: PathBuf,
    /// What messages call it.
    pub name: PathBuf,
    pub domain: Option<u16>,
    /// The file's size: streams are shared out among the threads by it.
    pub size: u64,
    /// Encode each backtrace whole, in this share of the output domain's cache.
    pub share: Option<ShareOf>,
    /// Alone in its output domain (format 3): encode each backtrace after the frames it
    /// keeps of the previous one, in the domain's whole cache, as the merging thread would
    /// (the domain's cache sees no other stream's backtraces); each encoding in a batch
    /// starts with that count (u32).
    pub solo: bool,
    /// Its process is tagged: encoded ahead, each backtrace gets [`TAG_FRAME`] as its root.
    pub tagged: bool,
    /// Its input's thinning, as the merging thread starts it (encoded ahead, the stream
    /// must be the input's only one: the draws are made again here in the same order).
    pub thinner: Option<Thinner>,
}

impl StreamSpec {
    /// Its backtraces are encoded ahead, by whichever thread fills its batches (in a
    /// share, or alone in its domain).
    fn encoded_ahead(&self) -> bool {
        self.share.is_some() || self.solo
    }
}

/// A stream's decoded batches, and whether the consumer sleeps waiting for one (only then
/// is it signalled: a condvar signal is a system call even when nobody waits).
#[derive(Default)]
struct Batches {
    ready: VecDeque<Batch>,
    waiting: bool,
}

struct Queue {
    q: Mutex<Batches>,
    cv: Condvar,
    /// `q.ready.len()`, readable without the lock (the worker's choice of what to fill).
    queued: AtomicUsize,
}

impl Queue {
    /// Queue a batch its filler made (who calls this before letting go of the stream's
    /// lock keeps the batches in order), waking the consumer if it waits for one.
    fn push(&self, b: Batch) {
        let mut g = self.q.lock().unwrap_or_else(|e| e.into_inner());
        g.ready.push_back(b);
        self.queued.store(g.ready.len(), Ordering::Relaxed);
        if g.waiting {
            self.cv.notify_one();
        }
    }
}

/// A worker's doorbell: rung when one of its queues has room again (signalled only while
/// the worker sleeps).
#[derive(Default)]
struct Wake {
    flag: Mutex<Doorbell>,
    cv: Condvar,
}

#[derive(Default)]
struct Doorbell {
    rung: bool,
    sleeping: bool,
}

impl Wake {
    fn ring(&self) {
        let mut f = self.flag.lock().unwrap_or_else(|e| e.into_inner());
        f.rung = true;
        if f.sleeping {
            self.cv.notify_one();
        }
    }

    /// Sleep until rung (or `timeout`), unless rung since the last wait.
    fn wait(&self, timeout: Duration) {
        let mut f = self.flag.lock().unwrap_or_else(|e| e.into_inner());
        if !f.rung {
            f.sleeping = true;
            f = self
                .cv
                .wait_timeout(f, timeout)
                .unwrap_or_else(|e| e.into_inner())
                .0;
            f.sleeping = false;
        }
        f.rung = false;
    }
}

/// Streams by the time they run dry (the time of the last event of their last batch),
/// the soonest on top.
type DryFirst = BinaryHeap<Reverse<(u64, usize)>>;

/// A decoding thread's streams with room for a batch, the one that runs dry first on top
/// (finding it does not look at every stream), and their number, readable without the
/// lock (which the merging thread takes at each batch it takes).
struct Todo {
    list: Mutex<DryFirst>,
    len: AtomicUsize,
}

impl Todo {
    fn new(list: DryFirst) -> Todo {
        Todo {
            len: AtomicUsize::new(list.len()),
            list: Mutex::new(list),
        }
    }

    /// `f` on the list, under its lock; its length kept beside it.
    fn update<R>(&self, f: impl FnOnce(&mut DryFirst) -> R) -> R {
        let mut t = self.list.lock().unwrap_or_else(|e| e.into_inner());
        let r = f(&mut t);
        self.len.store(t.len(), Ordering::Relaxed);
        r
    }

    fn is_empty(&self) -> bool {
        self.len.load(Ordering::Relaxed) == 0
    }
}

struct Shared {
    queues: Vec<Queue>,
    /// The worker decoding each stream.
    owner: Vec<usize>,
    wakes: Vec<Wake>,
    abort: AtomicBool,
    /// Batches the merge is done with, the oldest first: the one it let go of last is
    /// still in its core's caches, and writing it from another core would take every line
    /// away from there (benches/PERFORMANCE.md, "Shared::free").
    free: Mutex<VecDeque<Batch>>,
    bytes_read: AtomicU64,
    /// Per stream: its decoding state, once its decoding thread has opened it. Whoever
    /// holds the lock fills the stream's next batch (and queues it before letting go);
    /// the merging thread fills one itself rather than wait for it, when the decoding
    /// thread is not filling that stream (and another stream's, when it is).
    states: Vec<Mutex<Option<DecState>>>,
    /// Events a batch holds (fewer with many streams).
    batch_events: usize,
    /// Frames past which a batch is full (fewer with many streams).
    batch_frames: usize,
    /// Batches carry hints (but for streams encoded ahead, which always use them).
    hints: bool,
    /// The location lists the readers share (with several streams).
    locations: Option<Arc<LocationPool>>,
    /// Readers read their packets a window at a time rather than whole (past
    /// [`BUFFERED_STREAMS`]).
    windows: bool,
    /// Batches queued per stream ahead of the consumer: [`DEPTH`], fewer with many
    /// streams, whose batches would otherwise hold most of the merge's memory.
    depth: usize,
    /// Per worker: its streams with room for a batch.
    todo: Vec<Todo>,
    /// Per stream: the time of the last event of its last batch filled, when the merge
    /// needs its next.
    dry_at: Vec<AtomicU64>,
    /// Batches queued in all, at most `room`: with thousands of streams only those that
    /// run dry soonest have one queued (the others hold one, the merge's).
    queued: AtomicUsize,
    /// Batches that may be queued in all: [`QUEUED`], or one a stream past that many
    /// streams, up to [`MANY_QUEUED`].
    room: usize,
    /// Per stream: listed in its worker's `todo`.
    listed: Vec<AtomicBool>,
    /// Per worker: its streams not ended yet.
    unfinished: Vec<AtomicUsize>,
    /// A reader's buffer, unless windowed (smaller with more streams).
    read_bytes: usize,
    hooks: Hooks,
    /// Keeps the decoding threads off the merging thread's CPU.
    placement: Arc<Placement>,
}

impl Shared {
    /// List stream `i` in its worker's `todo`, unless it is already (with few streams,
    /// whose workers look at each, nothing is listed).
    fn want(&self, i: usize) {
        if self.queues.len() > SCANNED_STREAMS && !self.listed[i].swap(true, Ordering::SeqCst) {
            let at = self.dry_at[i].load(Ordering::Relaxed);
            self.todo[self.owner[i]].update(|t| t.push(Reverse((at, i))));
        }
    }

    /// Queue stream `i`'s next batch (its filler holds its state: batches stay in order).
    fn queue(&self, i: usize, b: Batch) {
        self.queued.fetch_add(1, Ordering::SeqCst);
        self.queues[i].push(b);
    }

    /// A queued batch was taken: a worker waiting for room may fill one again.
    fn taken(&self) {
        if self.queued.fetch_sub(1, Ordering::SeqCst) == self.room {
            for w in &self.wakes {
                w.ring();
            }
        }
    }
}

/// (Tests) what the decoding threads do besides decoding.
#[derive(Clone, Copy, Default)]
pub(crate) struct Hooks {
    /// Pause this long after each batch: the merging thread then fills most batches
    /// itself.
    pub pause: Duration,
    /// Panic instead of filling a stream's batch of this place in its stream or a later one
    /// (the merging thread may have filled that one itself).
    pub panic_at: Option<u64>,
    /// Hold a stream this long before filling each batch of it: the merging thread,
    /// finding the stream it needs being filled, fills other streams' batches ahead.
    pub hold: Duration,
}

/// Streams up to which the threads look at each stream for the next one to fill (the
/// decoding threads at their own, the merging thread, waiting for one, at every other);
/// past them, each decoding thread lists its streams that run dry first.
const SCANNED_STREAMS: usize = 64;
/// Past [`SCANNED_STREAMS`], the times a decoding thread with nothing to fill looks at the
/// length of its list (and the room) before it sleeps: with thousands of streams the
/// merging thread lists one a few microseconds later, and a sleep each time made a futex
/// wake-up of most batches (benches/PERFORMANCE.md, "Many inputs: the decoding thread
/// spins").
const SPINS: usize = 1000;
/// Batches queued per stream ahead of the consumer (with few streams).
const DEPTH: usize = 4;
/// Batches queued ahead of the consumer in all, past which each stream gets fewer.
const QUEUED: usize = 256;
/// Past [`QUEUED`] streams, batches queued in all, at most: streams that run in step run
/// dry together, and with room for too few of them the merging thread fills most of their
/// batches itself while the decoding thread waits for room (benches/PERFORMANCE.md, "Many
/// inputs: room for more batches" and "batches that do not grow").
const MANY_QUEUED: usize = 4096;
/// Frames in the batches of all streams, past which each stream's are fewer.
const FRAMES_QUEUED: usize = 1 << 19;
/// A batch's frame limit with thousands of streams, at least: with fewer frames a batch,
/// the threads hand over batches more often than the memory saved is worth
/// (benches/PERFORMANCE.md, "batches that do not grow").
const MIN_BATCH_FRAMES: usize = 512;
/// Streams up to which the decoders give the merging thread each frame's cache entry in
/// its input (a hint, two bytes a frame), past which they are left out to save memory.
const HINTED_STREAMS: usize = 256;
/// Streams up to which each reader holds the packet it is in whole; past them, a window
/// of it ([`READ_WINDOW`]).
pub(crate) const BUFFERED_STREAMS: usize = 256;
/// Bytes of a packet a reader holds at once past [`BUFFERED_STREAMS`] streams.
pub(crate) const READ_WINDOW: usize = 1024;
/// Bytes read ahead of the readers in all, past which each reader's buffer is smaller.
const READ_AHEAD: usize = 8 << 20;

/// A decoding thread; it hands back its streams' reports, each with its input's index.
type Worker = std::thread::JoinHandle<Vec<(usize, DecodeReport)>>;

/// The consumer's end: batches per stream, in order.
pub(crate) struct Decoder {
    shared: Arc<Shared>,
    handles: Vec<Option<Worker>>,
    ninputs: usize,
    /// The stream the merging thread (this decoder's owner) last filled a batch of
    /// ahead, which it fills again while it can (see [`Decoder::fill_ahead`]).
    helped: std::cell::Cell<usize>,
}

/// Share `specs` out among `n` workers, biggest files first to the least loaded.
fn share_out(specs: &[StreamSpec], n: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..specs.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(specs[i].size));
    let mut load = vec![0u64; n];
    let mut owner = vec![0; specs.len()];
    for i in order {
        let w = (0..n).min_by_key(|&w| (load[w], w)).unwrap_or(0);
        load[w] += specs[i].size.max(1);
        owner[i] = w;
    }
    owner
}

impl Decoder {
    /// Start decoding `streams` (of `ninputs` inputs) on `threads` worker threads, those
    /// in a share encoded ahead as they are decoded, kept off the CPU of the merging thread
    /// (the caller) by `placement`.
    pub fn start(
        streams: Vec<StreamSpec>,
        ninputs: usize,
        threads: usize,
        hooks: Hooks,
        placement: Arc<Placement>,
    ) -> std::io::Result<Decoder> {
        let n = threads.clamp(1, streams.len().max(1));
        let owner = share_out(&streams, n);
        let most_events = if streams.iter().any(StreamSpec::encoded_ahead) {
            BATCH_EVENTS_AHEAD
        } else {
            BATCH_EVENTS
        };
        let nstreams = streams.len().max(1);
        // (every stream wants its first batch; with few, none is ever listed)
        let listing = streams.len() > SCANNED_STREAMS;
        let todo: Vec<DryFirst> = (0..n)
            .map(|w| {
                let mine = (0..streams.len()).filter(|&i| listing && owner[i] == w);
                mine.map(|i| Reverse((0, i))).collect()
            })
            .collect();
        let shared = Arc::new(Shared {
            queues: (0..streams.len())
                .map(|_| Queue {
                    q: Mutex::new(Batches::default()),
                    cv: Condvar::new(),
                    queued: AtomicUsize::new(0),
                })
                .collect(),
            owner: owner.clone(),
            wakes: (0..n).map(|_| Wake::default()).collect(),
            abort: AtomicBool::new(false),
            free: Mutex::new(VecDeque::new()),
            bytes_read: AtomicU64::new(0),
            states: (0..streams.len()).map(|_| Mutex::new(None)).collect(),
            batch_events: (131_072 / nstreams).clamp(32, most_events),
            batch_frames: (FRAMES_QUEUED / nstreams).clamp(MIN_BATCH_FRAMES, BATCH_FRAMES),
            hints: nstreams <= HINTED_STREAMS,
            locations: (nstreams > 1).then(Default::default),
            windows: nstreams > BUFFERED_STREAMS,
            depth: (QUEUED / nstreams).clamp(1, DEPTH),
            room: nstreams.clamp(QUEUED, MANY_QUEUED),
            todo: todo.into_iter().map(Todo::new).collect(),
            dry_at: (0..streams.len()).map(|_| AtomicU64::new(0)).collect(),
            queued: AtomicUsize::new(0),
            listed: (0..streams.len()).map(|_| AtomicBool::new(true)).collect(),
            unfinished: (0..n).map(|_| AtomicUsize::new(0)).collect(),
            read_bytes: (READ_AHEAD / nstreams).clamp(8 << 10, 64 << 10),
            hooks,
            placement,
        });
        let mut mine: Vec<Vec<(usize, StreamSpec)>> = (0..n).map(|_| Vec::new()).collect();
        for (i, s) in streams.into_iter().enumerate() {
            mine[owner[i]].push((i, s));
        }
        for (w, m) in mine.iter().enumerate() {
            shared.unfinished[w].store(m.len(), Ordering::Relaxed);
        }
        let mut d = Decoder {
            shared,
            handles: Vec::new(),
            ninputs,
            helped: std::cell::Cell::new(usize::MAX),
        };
        for (w, streams) in mine.into_iter().enumerate() {
            let sh = d.shared.clone();
            let h = std::thread::Builder::new()
                .name(format!("memtrace-merge-decode-{w}"))
                .spawn(move || decode_all(&sh, w, n, streams))?;
            d.handles.push(Some(h));
        }
        Ok(d)
    }

    /// The next batch of stream `i` (waiting for the decoder if need be).
    pub fn next_batch(&self, i: usize) -> Batch {
        self.shared.placement.follow();
        let q = &self.shared.queues[i];
        let w = self.shared.owner[i];
        let mut g = q.q.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(b) = g.ready.pop_front() {
                let left = g.ready.len();
                q.queued.store(left, Ordering::Relaxed);
                drop(g);
                self.shared.taken();
                self.shared.want(i);
                // The worker sleeps when none of its streams has room; wake it once this
                // one is half empty, so that it fills several batches a time it wakes
                // (waiting on an empty queue wakes it too, below).
                if left == self.shared.depth / 2 {
                    self.poke(w);
                }
                return b;
            }
            if self.handles[w].as_ref().is_none_or(|h| h.is_finished()) {
                // The worker died (it panicked): end the stream; `finish` reports it.
                return Batch {
                    last: true,
                    ..Default::default()
                };
            }
            drop(g);
            if let Some(b) = self.fill_here(i) {
                // (the decoding thread may be waiting for this stream to end)
                self.poke(w);
                return b;
            }
            if self.fill_ahead(i) {
                g = q.q.lock().unwrap_or_else(|e| e.into_inner());
                continue;
            }
            g = q.q.lock().unwrap_or_else(|e| e.into_inner());
            if !g.ready.is_empty() {
                continue;
            }
            self.poke(w);
            g.waiting = true;
            g =
                q.cv.wait_timeout(g, Duration::from_millis(50))
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            g.waiting = false;
        }
    }

    /// Stream `i`'s next batch, filled by this thread, if its decoding thread is not
    /// filling it right now (and has opened it): from its queue if one came in meanwhile.
    /// A stream in a share is encoded as its decoding thread would, with the encoder kept
    /// in its decoding state.
    fn fill_here(&self, i: usize) -> Option<Batch> {
        let sh = &*self.shared;
        // (not from a stream whose decoding thread panicked while filling it)
        let mut st = sh.states[i].try_lock().ok()?;
        let s = st.as_mut()?;
        let q = &sh.queues[i];
        let mut g = q.q.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(b) = g.ready.pop_front() {
            q.queued.store(g.ready.len(), Ordering::Relaxed);
            drop(g);
            sh.taken();
            sh.want(i);
            return Some(b);
        }
        drop(g);
        if s.done {
            return None;
        }
        let b = fill_next(sh, i, s);
        #[cfg(test)]
        FILLED_HERE.with(|n| {
            n.set(Filled {
                needed: n.get().needed + 1,
                encoded: n.get().encoded + b.encoded as u64,
                ..n.get()
            })
        });
        Some(b)
    }

    /// While stream `i` is being filled by its decoding thread: fill the next batch of
    /// another stream, and queue it, as its decoding thread would, so that the merging
    /// thread works rather than wait (false: none could be filled). The stream it filled
    /// ahead last while that one has room, else the one with the fewest queued: a stream's
    /// decoding tables are then in this core's caches, rather than fetched from the
    /// decoding thread's core for one batch and back for its next (benches/PERFORMANCE.md, "fill_ahead").
    fn fill_ahead(&self, i: usize) -> bool {
        let sh = &*self.shared;
        let h = self.helped.get();
        let mut best = None;
        if h != i && h < sh.queues.len() && sh.queues[h].queued.load(Ordering::Relaxed) < sh.depth {
            best = self.fillable(h).map(|st| (h, st));
        }
        if best.is_none() && sh.queues.len() <= SCANNED_STREAMS {
            // the stream with the fewest batches queued
            let mut fewest = sh.depth;
            for (j, q) in sh.queues.iter().enumerate() {
                let n = q.queued.load(Ordering::Relaxed);
                if j == i || n >= fewest {
                    continue;
                }
                if let Some(st) = self.fillable(j) {
                    fewest = n;
                    best = Some((j, st));
                    if n == 0 {
                        break;
                    }
                }
            }
        } else if best.is_none() {
            // the stream of a decoding thread's that runs dry first
            for todo in &sh.todo {
                best = todo.update(|t| {
                    let &Reverse((_, j)) = t.peek()?;
                    if j == i {
                        return None;
                    }
                    let st = self.fillable(j)?;
                    t.pop();
                    sh.listed[j].store(false, Ordering::SeqCst);
                    Some((j, st))
                });
                if best.is_some() {
                    break;
                }
            }
        }
        let Some((j, mut st)) = best else {
            return false;
        };
        let Some(s) = st.as_mut() else {
            return false;
        };
        self.helped.set(j);
        let b = fill_next(sh, j, s);
        #[cfg(test)]
        FILLED_HERE.with(|n| {
            n.set(Filled {
                ahead: n.get().ahead + 1,
                encoded: n.get().encoded + b.encoded as u64,
                ahead_other: n.get().ahead_other + (j != h) as u64,
                ..n.get()
            })
        });
        // queued before the lock is let go: batches stay in order
        sh.queue(j, b);
        if !s.done && sh.queues[j].queued.load(Ordering::Relaxed) < sh.depth {
            sh.want(j);
        }
        true
    }

    /// Stream `j`'s decoding state, when no other thread holds it and it has batches left
    /// (not a stream whose decoding thread panicked while filling it).
    fn fillable(&self, j: usize) -> Option<std::sync::MutexGuard<'_, Option<DecState>>> {
        let st = self.shared.states[j].try_lock().ok()?;
        st.as_ref().is_some_and(|s| !s.done).then_some(st)
    }

    fn poke(&self, w: usize) {
        self.shared.wakes[w].ring();
    }

    /// Give an exhausted batch back for reuse.
    pub fn recycle(&self, mut b: Batch) {
        b.clear();
        let mut f = self.shared.free.lock().unwrap_or_else(|e| e.into_inner());
        // (with many streams one is wanted again soon: kept rather than freed and made
        // anew, as many as may be queued in all)
        if f.len() < self.shared.queues.len().clamp(64, self.shared.room) {
            f.push_back(b);
        }
    }

    pub fn bytes_read(&self) -> u64 {
        self.shared.bytes_read.load(Ordering::Relaxed)
    }

    /// Wait for the workers and take their reports, per input (Err: one panicked, with
    /// the message).
    pub fn finish(mut self) -> Result<Vec<DecodeReport>, String> {
        self.stop();
        let mut reports: Vec<DecodeReport> =
            (0..self.ninputs).map(|_| DecodeReport::default()).collect();
        let mut failed = None;
        for h in self.handles.iter_mut() {
            let Some(h) = h.take() else { continue };
            match h.join() {
                Ok(parts) => {
                    for (k, r) in parts {
                        let into = &mut reports[k];
                        into.skipped_packets += r.skipped_packets;
                        into.packets += r.packets;
                        into.stopped_at_error |= r.stopped_at_error;
                        if into.reopen_failed.is_none() {
                            into.reopen_failed = r.reopen_failed;
                        }
                        for w in r.warnings.list {
                            into.warnings.push(w);
                        }
                    }
                }
                Err(p) => {
                    failed.get_or_insert(
                        p.downcast_ref::<&str>()
                            .map(|s| s.to_string())
                            .or_else(|| p.downcast_ref::<String>().cloned())
                            .unwrap_or_else(|| "unknown panic".into()),
                    );
                }
            }
        }
        match failed {
            Some(m) => Err(m),
            None => Ok(reports),
        }
    }

    fn stop(&self) {
        self.shared.abort.store(true, Ordering::Relaxed);
        for w in 0..self.shared.wakes.len() {
            self.poke(w);
        }
    }
}

impl Drop for Decoder {
    fn drop(&mut self) {
        self.stop();
        for h in self.handles.iter_mut() {
            if let Some(h) = h.take() {
                let _ = h.join();
            }
        }
    }
}

/// (Tests) batches a thread filled as the merging thread.
#[cfg(test)]
#[derive(Clone, Copy, Default)]
pub(crate) struct Filled {
    /// of the stream it needed
    pub needed: u64,
    /// of other streams (ahead)
    pub ahead: u64,
    /// of either, encoded in a share
    pub encoded: u64,
    /// ahead, of another stream than the one it filled ahead before
    pub ahead_other: u64,
}

#[cfg(test)]
thread_local! {
    pub(crate) static FILLED_HERE: std::cell::Cell<Filled> = std::cell::Cell::new(Filled::default());
}

/// Fill the next batch of stream `i`, whose state `s` the caller holds locked.
fn fill_next(sh: &Shared, i: usize, s: &mut DecState) -> Batch {
    let free = sh
        .free
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .pop_front();
    let mut b = match free {
        Some(mut b) => {
            b.take_back();
            b
        }
        None => Batch::with_capacity(sh.batch_events, sh.batch_frames),
    };
    let n = if s.first {
        FIRST_BATCH_EVENTS.min(sh.batch_events)
    } else {
        sh.batch_events
    };
    s.first = false;
    s.seq += 1;
    fill(s, &mut b, n, sh.batch_frames);
    if let Some(t) = b.evs.last() {
        sh.dry_at[i].store(t.time, Ordering::Relaxed);
    }
    if let Some(r) = &s.reader {
        let now = r.stats().bytes;
        sh.bytes_read.fetch_add(now - s.counted, Ordering::Relaxed);
        s.counted = now;
    }
    if b.last {
        s.done = true;
        sh.unfinished[sh.owner[i]].fetch_sub(1, Ordering::SeqCst);
        if let Some(r) = s.reader.take() {
            s.rep.skipped_packets += r.stats().skipped_packets;
            s.rep.packets += r.stats().packets;
        }
    }
    b
}

/// Worker `me` (of `nworkers`): decode `specs` ahead of the consumer, each stream at most
/// [`DEPTH`] batches ahead, until all end or the consumer stops. Reports per input.
fn decode_all(
    sh: &Shared,
    me: usize,
    nworkers: usize,
    specs: Vec<(usize, StreamSpec)>,
) -> Vec<(usize, DecodeReport)> {
    // (registered while it runs: dropped when it returns)
    let _placed = sh.placement.helper();
    let pool = FilePool::from_rlimit_share(nworkers);
    let mine: Vec<usize> = specs
        .into_iter()
        .map(|(index, s)| {
            *sh.states[index].lock().unwrap_or_else(|e| e.into_inner()) =
                Some(open_stream(sh, &pool, s));
            index
        })
        .collect();
    let wake = &sh.wakes[me];
    // (few streams: each looked at for the one with the fewest batches queued)
    let few = sh.queues.len() <= SCANNED_STREAMS;
    let mut spins = 0;
    loop {
        if sh.abort.load(Ordering::Relaxed) || sh.unfinished[me].load(Ordering::SeqCst) == 0 {
            break;
        }
        // (no more queued than allowed in all: those that run dry first have theirs)
        let next = if few {
            pick_stream(sh, &mine)
        } else {
            (sh.queued.load(Ordering::SeqCst) < sh.room)
                .then(|| sh.todo[me].update(|t| t.pop().map(|Reverse((_, i))| i)))
                .flatten()
        };
        let Some(i) = next else {
            // (looked at again once a stream is listed and there is room, without the
            // list's lock meanwhile)
            let ready = || !sh.todo[me].is_empty() && sh.queued.load(Ordering::Relaxed) < sh.room;
            while !few && spins < SPINS && !ready() {
                spins += 1;
                std::hint::spin_loop();
            }
            if few || spins >= SPINS {
                spins = 0;
                wake.wait(Duration::from_millis(50));
            }
            continue;
        };
        spins = 0;
        // (unlisted before its queue is looked at: a batch taken from it from now on
        // lists it again)
        sh.listed[i].store(false, Ordering::SeqCst);
        // (a stream the merging thread is filling is left to it: another one is filled
        // meanwhile, and this one listed again)
        let Some(mut st) = try_lock(&sh.states[i]) else {
            sh.want(i);
            std::thread::yield_now();
            continue;
        };
        // (the merging thread may have filled it meanwhile, to its end)
        if let Some(s) = st.as_mut().filter(|s| !s.done) {
            if sh.queues[i].queued.load(Ordering::SeqCst) < sh.depth {
                if sh.hooks.panic_at.is_some_and(|at| s.seq >= at) {
                    panic!("injected panic before batch {} (test)", s.seq);
                }
                if !sh.hooks.hold.is_zero() {
                    std::thread::sleep(sh.hooks.hold);
                }
                let b = fill_next(sh, i, s);
                // queued before the lock is let go: batches stay in order
                sh.queue(i, b);
            }
            if !s.done && sh.queues[i].queued.load(Ordering::SeqCst) < sh.depth {
                sh.want(i);
            }
        }
        drop(st);
        if !sh.hooks.pause.is_zero() {
            std::thread::sleep(sh.hooks.pause);
        }
    }
    // Each stream's report, under its input ([`Decoder::finish`] adds them up).
    mine.iter()
        .filter_map(|&i| {
            let mut st = sh.states[i].lock().unwrap_or_else(|e| e.into_inner());
            st.as_mut().map(|s| (s.input, std::mem::take(&mut s.rep)))
        })
        .collect()
}

/// A stream's decoding state, its reader opened (or why it could not be) in `pool`.
fn open_stream(sh: &Shared, pool: &FilePool, s: StreamSpec) -> DecState {
    let mut rep = DecodeReport::default();
    let reader = pool
        .open(&s.path)
        .map_err(|e| crate::error::Error::input(&s.name, "open", e))
        .and_then(|f| {
            let name = s.name.display().to_string();
            match &sh.locations {
                Some(lp) if sh.windows => {
                    Reader::windowed(f, &name, READ_WINDOW, s.size, lp.clone())
                }
                Some(lp) => Reader::pooled(f, &name, sh.read_bytes, lp.clone()),
                None => Reader::with_buffer(f, &name, sh.read_bytes),
            }
        });
    let reader = match reader {
        Ok(mut r) => {
            r.set_domain_filter(s.domain);
            r.set_keep_slots(sh.hints || s.encoded_ahead());
            Some(r)
        }
        Err(e) => {
            rep.reopen_failed = Some(e);
            None
        }
    };
    DecState {
        reader,
        input: s.input,
        rep,
        bt_valid: false,
        enc: s
            .encoded_ahead()
            .then(|| Box::new(Encoder::new(s.share, s.tagged, s.thinner))),
        seq: 0,
        done: false,
        first: true,
        counted: 0,
    }
}

/// Which of `mine` to fill next: the stream with the fewest batches ready (the one the
/// merge may be waiting for); a stream the merging thread is filling is skipped.
fn pick_stream(sh: &Shared, mine: &[usize]) -> Option<usize> {
    let mut pick = None;
    let mut fewest = sh.depth;
    for &i in mine {
        let Some(st) = try_lock(&sh.states[i]) else {
            continue;
        };
        if st.as_ref().is_none_or(|s| s.done) {
            continue;
        }
        let n = sh.queues[i].queued.load(Ordering::Relaxed);
        if n < fewest {
            fewest = n;
            pick = Some(i);
            if n == 0 {
                break;
            }
        }
    }
    pick
}
