//! Decoding the merge's inputs ahead of it on worker threads: each stream (an input, or one
//! domain of a format-3 input) is read into batches of events and the locations they define.

use crate::format::backtrace::CacheWriter;
use crate::format::buf::WriteBuf;
use crate::format::event::{AllocSource, LocationCode};
use crate::format::location::LocationList;
use crate::merge::Warnings;
use crate::pipeline::files::FilePool;
use crate::pipeline::placement::Placement;
use crate::pipeline::share::{Share, ShareOf};
use crate::reader::{EventSink, Reader};
use crate::thin::Thinner;
use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// One event of a batch, at its time. (32 bytes, two to a cache line: the merging thread
/// reads every one decoded on another core, and the fewer cache lines they take, the
/// sooner.)
#[derive(Clone, Copy, Debug)]
pub(crate) struct Timed {
    pub time: u64,
    pub ev: Ev,
}

/// An event of a batch. An allocation's backtrace is the previous allocation's (of the
/// same stream) first `keep` frames followed by `new` frames from the batch's frame list;
/// in a stream encoded ahead ([`StreamSpec::share`]) it is `keep` codewords in the batch's
/// `enc`, for `new` frames (`new` is [`THINNED_OUT`], and nothing encoded, for one that
/// thinning leaves out). `length` is [`WIDE_LENGTH`] and `nsamples` [`WIDE_SAMPLES`] when
/// the value is that or more, and then the batch's next entry in `wide` (the length first).
#[derive(Clone, Copy, Debug)]
pub(crate) enum Ev {
    Alloc {
        id: u64,
        length: u32,
        keep: u32,
        new: u32,
        nsamples: u16,
        source: AllocSource,
    },
    Promote {
        id: u64,
    },
    Collect {
        id: u64,
    },
}

const _: () = assert!(std::mem::size_of::<Timed>() == 32);

/// An allocation's `length` that stands for the batch's next entry in `wide`.
pub(crate) const WIDE_LENGTH: u32 = u32::MAX;
/// An allocation's `nsamples` that stands for the batch's next entry in `wide`.
pub(crate) const WIDE_SAMPLES: u16 = u16::MAX;

impl Timed {
    /// Its place in the merged order, given its stream's bits of [`order_key`].
    #[inline(always)]
    pub fn key(&self, stream_bits: u128) -> u128 {
        let rank = match self.ev {
            Ev::Alloc { .. } => 0,
            Ev::Promote { .. } => 1,
            Ev::Collect { .. } => 2,
        };
        order_key(self.time, 0, rank, 0) | stream_bits
    }
}

/// Events of one stream, in its order, with the stream's own location codes.
#[derive(Default)]
pub(crate) struct Batch {
    pub evs: Vec<Timed>,
    /// The lengths and sample counts too wide for their fields in [`Ev::Alloc`], in order.
    pub wide: Vec<u64>,
    pub frames: Vec<LocationCode>,
    /// The input's cache entry of each frame: hints for the output's encoder, whose cache
    /// often places a code where the input's did.
    pub slots: Vec<u16>,
    /// Codes defined by location events, each with the index of the event it precedes.
    pub locs: Vec<(u32, LocationCode, LocationList)>,
    /// A stream encoded ahead: each allocation's codewords after their length (a u32, its
    /// top bit set when the backtrace had to be cut to fit a packet).
    pub enc: WriteBuf,
    /// Where in `enc` a code is sent whole (a miss), and the code.
    pub misses: Vec<(u32, LocationCode)>,
    /// The stream has no events after this batch.
    pub last: bool,
    /// Its allocations come encoded in `enc` (the stream is in a share: whichever thread
    /// filled the batch encoded it with the stream's [`Encoder`]); else as kept and new
    /// frames.
    pub encoded: bool,
    /// Frames the batch held before it was last cleared.
    frames_used: usize,
}

/// In an encoding's length word (see [`Batch::enc`]): the backtrace was cut.
const CUT: u32 = 1 << 31;

impl Batch {
    /// The encoding whose length word is at `head` in `enc`: where its codewords are, and
    /// whether its backtrace had to be cut.
    pub fn encoding(&self, head: usize) -> (std::ops::Range<usize>, bool) {
        let b = self.enc.bytes();
        let word = u32::from_le_bytes([b[head], b[head + 1], b[head + 2], b[head + 3]]);
        let start = head + 4;
        (start..start + (word & !CUT) as usize, word & CUT != 0)
    }

    /// A batch with room for `events` events and their frames, so that filling it does
    /// not grow (copy and fault in) its vectors step by step.
    fn with_capacity(events: usize) -> Batch {
        Batch {
            evs: Vec::with_capacity(events),
            wide: Vec::new(),
            // (16 new frames an event is plenty but for deep stacks; past `BATCH_FRAMES`,
            // room for the last backtrace's new frames, pages touched only when used: with
            // 256, fork/'s batches grew 21 times, each a copy into new pages, and its merge
            // took 1.7% more time (2,115 page faults rather than 1,876))
            frames: Vec::with_capacity((events * 16).min(BATCH_FRAMES) + 4096),
            slots: Vec::with_capacity((events * 16).min(BATCH_FRAMES) + 4096),
            locs: Vec::new(),
            enc: WriteBuf::with_capacity(0),
            misses: Vec::new(),
            last: false,
            encoded: false,
            frames_used: 0,
        }
    }

    /// Write over the room for events (and codewords) of a batch the merging thread let go
    /// of, in one pass before filling it. Its cache lines are in the merging thread's core;
    /// taken back one by one as events are added, each is a wait that the decoding thread
    /// cannot hide when the host places the two vCPUs apart (a round trip between them of
    /// ~330 ns rather than ~60): its work then took 2.5 times as long. Taken back in one
    /// pass, merges in such phases took 15-25% less (fork/ 45 -> 38 ms, a 0.1-scale
    /// synthetic set encoded ahead 101 -> 72 ms), and the same when the vCPUs are close;
    /// taking back the frames' room as well, fork/ 4% less again (36.3 -> 34.8 ms).
    fn take_back(&mut self) {
        const BLANK: Timed = Timed {
            time: 0,
            ev: Ev::Collect { id: 0 },
        };
        // (the batch is empty: `Decoder::recycle` cleared it)
        self.evs.resize(self.evs.capacity(), BLANK);
        self.evs.clear();
        // (a share's codewords: a few bytes' room in a batch of frames)
        self.enc.clear_and_zero();
        // (and the frames' as far as the last fill went: deep stacks fill them all)
        let n = self.frames_used;
        self.frames.resize(n, LocationCode(0));
        self.frames.clear();
        self.slots.resize(n, 0);
        self.slots.clear();
    }

    fn clear(&mut self) {
        self.frames_used = self.frames.len();
        self.evs.clear();
        self.wide.clear();
        self.frames.clear();
        self.slots.clear();
        self.locs.clear();
        self.enc.clear();
        self.misses.clear();
        self.last = false;
        self.encoded = false;
    }
}

/// The encoder of a stream in its share of an output domain's cache ([`crate::pipeline::share`]),
/// kept with the stream's decoding state: whichever thread fills a batch of the stream
/// encodes it, and the bytes do not depend on which: an encoding depends on the stream's
/// own earlier backtraces only.
pub(crate) struct Encoder {
    /// Its share of the domain's cache; None for a stream alone in its output domain
    /// (format 3), encoded in the whole cache as the merging thread would, after the
    /// frames it keeps of its previous backtrace (see [`StreamSpec::solo`]).
    pub share: Option<Share>,
    /// Its share's entries (the rest of these tables is unused); alone, the domain's.
    pub tables: CacheWriter,
    /// Alone: the hints of the new frames (the encoder sets them).
    solo_hints: Vec<u16>,
    /// Allocations encoded so far (each encoding's date in the cache).
    pub allocs: i64,
    /// For a tagged process: the backtrace as encoded, [`TAG_FRAME`] first, and the
    /// input's cache entry of each frame (0 for the tag, which has none).
    tagged: Option<(Vec<LocationCode>, Vec<u16>)>,
    /// For a thinned input: the merging thread's draws, made again in the same order (the
    /// input's allocations, one stream), to leave out of the share the allocations that
    /// thinning leaves out of the merge.
    thinner: Option<Thinner>,
    /// The positions of the share's path (its last encoded backtrace) that every
    /// backtrace left out since has kept (`usize::MAX` when none was left out).
    kept: usize,
}

/// An allocation's `new` in a batch encoded ahead when thinning left it out: nothing of it
/// was encoded (see [`Encoder::thinner`]).
pub(crate) const THINNED_OUT: u32 = u32::MAX;

/// The root frame of a tagged process's backtraces, as its share encodes them: no input
/// code (an OCaml int, whose top two bits are equal) has this value, so the tag never
/// shares an entry with one of the input's frames. The merging thread writes the input's
/// tag code over it where it is sent whole (the stream's remap).
pub(crate) const TAG_FRAME: LocationCode = LocationCode(0xa000_0000_0000_7a90);

impl Encoder {
    fn new(of: Option<ShareOf>, tagged: bool, thinner: Option<Thinner>) -> Encoder {
        Encoder {
            share: of.map(Share::new),
            tables: CacheWriter::default(),
            solo_hints: Vec::new(),
            allocs: 0,
            tagged: tagged.then(|| (vec![TAG_FRAME], vec![0])),
            thinner,
            kept: usize::MAX,
        }
    }
}

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

/// What the decoder learned about each input.
#[derive(Default)]
pub(crate) struct DecodeReport {
    /// The input could not be opened again for a stream (removed since): the merge fails.
    pub reopen_failed: Option<crate::error::Error>,
    pub warnings: Warnings,
    pub skipped_packets: u64,
    /// Packets after the info packet (read or skipped).
    pub packets: u64,
    /// A stream of the input stopped at an error before its end.
    pub stopped_at_error: bool,
}

/// The room one encoding made ahead may take: a packet's, but for its header and the
/// allocation's fields.
pub(crate) const ENCODING_ROOM: usize = crate::format::packet::MAX_PACKET_SIZE - 512;

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

struct Shared {
    queues: Vec<Queue>,
    /// The worker decoding each stream.
    owner: Vec<usize>,
    wakes: Vec<Wake>,
    abort: AtomicBool,
    /// Batches the merge is done with, the oldest first: the one it let go of last is
    /// still in its core's caches, and writing it from another core would take every line
    /// away from there (reusing it first took 9% more CPU).
    free: Mutex<VecDeque<Batch>>,
    bytes_read: AtomicU64,
    /// Per stream: its decoding state, once its decoding thread has opened it. Whoever
    /// holds the lock fills the stream's next batch (and queues it before letting go);
    /// the merging thread fills one itself rather than wait for it, when the decoding
    /// thread is not filling that stream (and another stream's, when it is).
    states: Vec<Mutex<Option<DecState>>>,
    /// Events a batch holds (fewer with many streams).
    batch_events: usize,
    hooks: Hooks,
    /// Keeps the decoding threads off the merging thread's CPU.
    placement: Arc<Placement>,
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

/// Events per batch (fewer with many streams). Small batches keep the memory touched, and
/// so the page faults, down: 1,024 measured fastest on the fork traces (4,096 took 20%
/// longer, mostly in the kernel), until the merging thread kept to one stream when it
/// fills ahead and wrote the output itself on two CPUs; then 2,048, paired with 1,024 in
/// turns: fork/ 0.90 and 0.955 (40 pairs each), the 94 MB synthetic set 0.956-0.979
/// (24-30 pairs, three runs), the 78 MB set 1.04 then 0.99, the deep set 1.00; peak RSS
/// 1 MB more (11.5 MB).
const BATCH_EVENTS: usize = 2048;
/// Events per batch where backtraces are encoded ahead, the decoding threads' work per
/// event the most: half the handoffs between the threads. Paired with 2,048 in turns on
/// a faster machine (2026-12-02): the 94 MB set 0.940, 0.975, 0.979 (24-30 pairs), the
/// 78 MB set 0.987, the deep set 0.995 (20 each); peak RSS 11.2 -> 12.8 MB. (fork/, not
/// encoded ahead, 1.011: it keeps 2,048.)
const BATCH_EVENTS_AHEAD: usize = 4096;
/// Events in a stream's first batch: the merge can start once every stream has one.
const FIRST_BATCH_EVENTS: usize = 64;
/// A batch ends early once it holds this many frames (deep backtraces). 8,192 rather than
/// 16,384: the merge of fork/ touches 25% fewer pages and takes ~5% less CPU.
const BATCH_FRAMES: usize = 8_192;

/// Batches queued per stream ahead of the consumer.
const DEPTH: usize = 4;

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
            batch_events: (131_072 / streams.len().max(1)).clamp(64, most_events),
            hooks,
            placement,
        });
        let mut mine: Vec<Vec<(usize, StreamSpec)>> = (0..n).map(|_| Vec::new()).collect();
        for (i, s) in streams.into_iter().enumerate() {
            mine[owner[i]].push((i, s));
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
                // The worker sleeps when every queue of its is full; wake it once this one
                // is half empty, so that it fills several batches a time it wakes (waiting
                // on an empty queue wakes it too, below).
                if left == DEPTH / 2 {
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
            return Some(b);
        }
        drop(g);
        if s.done {
            return None;
        }
        let b = fill_next(sh, s);
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
    /// decoding tables (~300 KiB in all) are then in this core's caches, rather than
    /// fetched from the decoding thread's core for one batch and back for its next. On
    /// the 94 MB synthetic set that took 0.92-0.94 of the time (20 and 30 pairs in turns),
    /// on the others 0.97-0.98.
    fn fill_ahead(&self, i: usize) -> bool {
        let sh = &*self.shared;
        let h = self.helped.get();
        let mut best = None;
        if h != i && h < sh.queues.len() && sh.queues[h].queued.load(Ordering::Relaxed) < DEPTH {
            best = self.fillable(h).map(|st| (h, st));
        }
        if best.is_none() {
            let mut fewest = DEPTH;
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
        }
        let Some((j, mut st)) = best else {
            return false;
        };
        let Some(s) = st.as_mut() else {
            return false;
        };
        self.helped.set(j);
        let b = fill_next(sh, s);
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
        sh.queues[j].push(b);
        true
    }

    /// Stream `j`'s decoding state, when no other thread holds it and it has batches left
    /// (not a stream whose decoding thread panicked while filling it).
    fn fillable(&self, j: usize) -> Option<std::sync::MutexGuard<'_, Option<DecState>>> {
        let st = self.shared.states[j].try_lock().ok()?;
        st.as_ref().is_some_and(|s| !s.done).then_some(st)
    }

    fn poke(&self, w: usize) {
        let wake = &self.shared.wakes[w];
        let mut f = wake.flag.lock().unwrap_or_else(|e| e.into_inner());
        f.rung = true;
        if f.sleeping {
            wake.cv.notify_one();
        }
    }

    /// Give an exhausted batch back for reuse.
    pub fn recycle(&self, mut b: Batch) {
        b.clear();
        let mut f = self.shared.free.lock().unwrap_or_else(|e| e.into_inner());
        if f.len() < 64 {
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

struct DecState {
    reader: Option<Reader<crate::pipeline::files::LazyFile>>,
    /// the stream's input, and what was learned about it reading this stream
    input: usize,
    rep: DecodeReport,
    bt_valid: bool,
    /// Its encoder (a stream in a share).
    enc: Option<Box<Encoder>>,
    /// Batches filled so far.
    seq: u64,
    done: bool,
    /// no batch filled yet (the first is small, so that the merge starts sooner)
    first: bool,
    /// bytes of this reader already added to the shared count
    counted: u64,
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

/// `m` locked, unless another thread holds it (a poisoned lock is taken as it is).
fn try_lock<T>(m: &Mutex<T>) -> Option<std::sync::MutexGuard<'_, T>> {
    match m.try_lock() {
        Ok(g) => Some(g),
        Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
        Err(std::sync::TryLockError::WouldBlock) => None,
    }
}

/// Fill the next batch of stream `s`, whose lock the caller holds.
fn fill_next(sh: &Shared, s: &mut DecState) -> Batch {
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
        None => Batch::with_capacity(sh.batch_events),
    };
    let n = if s.first {
        FIRST_BATCH_EVENTS
    } else {
        sh.batch_events
    };
    s.first = false;
    s.seq += 1;
    fill(s, &mut b, n);
    if let Some(r) = &s.reader {
        let now = r.stats().bytes;
        sh.bytes_read.fetch_add(now - s.counted, Ordering::Relaxed);
        s.counted = now;
    }
    if b.last {
        s.done = true;
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
    let mut mine: Vec<usize> = Vec::with_capacity(specs.len());
    for (index, s) in specs {
        let mut rep = DecodeReport::default();
        let reader = pool
            .open(&s.path)
            .map_err(|e| crate::error::Error::input(&s.name, "open", e))
            .and_then(|f| Reader::new(f, &s.name.display().to_string()));
        let reader = match reader {
            Ok(mut r) => {
                r.set_domain_filter(s.domain);
                r.set_keep_slots(true);
                Some(r)
            }
            Err(e) => {
                rep.reopen_failed = Some(e);
                None
            }
        };
        *sh.states[index].lock().unwrap_or_else(|e| e.into_inner()) = Some(DecState {
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
        });
        mine.push(index);
    }
    let wake = &sh.wakes[me];
    loop {
        if sh.abort.load(Ordering::Relaxed) {
            break;
        }
        // Fill the stream with the fewest batches ready (the one the merge may be waiting
        // for), one batch at a time. (A stream the merging thread is filling is skipped.)
        let mut pick = None;
        let mut fewest = DEPTH;
        let mut all_done = true;
        for &i in &mine {
            let Some(st) = try_lock(&sh.states[i]) else {
                all_done = false;
                continue;
            };
            let Some(s) = st.as_ref() else { continue };
            if s.done {
                continue;
            }
            all_done = false;
            let n = sh.queues[i].queued.load(Ordering::Relaxed);
            if n < fewest {
                fewest = n;
                pick = Some(i);
                if n == 0 {
                    break;
                }
            }
        }
        if all_done {
            break;
        }
        let mut worked = false;
        if let Some(i) = pick {
            let mut st = sh.states[i].lock().unwrap_or_else(|e| e.into_inner());
            // (the merging thread may have filled it meanwhile, to its end)
            if let Some(s) = st.as_mut().filter(|s| !s.done) {
                if sh.hooks.panic_at.is_some_and(|at| s.seq >= at) {
                    panic!("injected panic before batch {} (test)", s.seq);
                }
                if !sh.hooks.hold.is_zero() {
                    std::thread::sleep(sh.hooks.hold);
                }
                let b = fill_next(sh, s);
                // queued before the lock is let go: batches stay in order
                sh.queues[i].push(b);
                worked = true;
            }
            drop(st);
            if !sh.hooks.pause.is_zero() {
                std::thread::sleep(sh.hooks.pause);
            }
        }
        if !worked {
            let mut f = wake.flag.lock().unwrap_or_else(|e| e.into_inner());
            if !f.rung {
                f.sleeping = true;
                f = wake
                    .cv
                    .wait_timeout(f, Duration::from_millis(50))
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
                f.sleeping = false;
            }
            f.rung = false;
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

/// Where an event goes in the merged order, as one number: by time, then by input (in the
/// order given), then allocations before promotions before collections (so that an object
/// collected by another domain of its input in the same microsecond still comes after its
/// allocation), then by stream. The low 32 bits are the stream's index.
/// A stream's own events are never reordered: only its next one competes.
pub(crate) fn order_key(time: u64, input: usize, rank: u8, stream: usize) -> u128 {
    ((time as u128) << 64) | ((input as u128) << 34) | ((rank as u128) << 32) | stream as u128
}

/// A batch being filled by the reader, with the stream's state.
struct Filler<'a> {
    b: &'a mut Batch,
    bt_valid: &'a mut bool,
    enc: Option<&'a mut Encoder>,
}

impl Filler<'_> {
    /// Add an allocation to the batch (`keep` and `new` as [`Ev::Alloc`] says).
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn push_alloc(
        &mut self,
        time: u64,
        id: u64,
        length: u64,
        nsamples: u64,
        source: AllocSource,
        keep: u32,
        new: u32,
    ) {
        let length = narrow(length, WIDE_LENGTH, &mut self.b.wide);
        let nsamples = narrow(nsamples, WIDE_SAMPLES, &mut self.b.wide);
        self.b.evs.push(Timed {
            time,
            ev: Ev::Alloc {
                id,
                length,
                nsamples,
                source,
                keep,
                new,
            },
        });
    }
}

/// `v` in a narrower field, or `wide` (and `v` pushed on `wides`) when it is that or does
/// not fit.
#[inline(always)]
fn narrow<T: TryFrom<u64> + PartialEq + Copy>(v: u64, wide: T, wides: &mut Vec<u64>) -> T {
    match T::try_from(v) {
        Ok(n) if n != wide => n,
        _ => {
            wides.push(v);
            wide
        }
    }
}

impl EventSink for Filler<'_> {
    #[inline]
    fn location(&mut self, code: LocationCode, locs: &LocationList) {
        self.b
            .locs
            .push((self.b.evs.len() as u32, code, locs.clone()));
    }

    #[inline]
    fn alloc(
        &mut self,
        time: u64,
        id: u64,
        length: u64,
        nsamples: u64,
        source: AllocSource,
        common_prefix: u64,
        backtrace: &[LocationCode],
        slots: &[u16],
    ) {
        let valid = *self.bt_valid;
        let keep = if valid {
            (common_prefix as usize).min(backtrace.len())
        } else {
            0
        };
        *self.bt_valid = true;
        // (in a stream encoded ahead: codewords and frames encoded, else kept and new frames)
        let (first, second) = if let Some(e) = &mut self.enc {
            let Encoder {
                share,
                tables,
                solo_hints,
                allocs,
                tagged,
                thinner,
                kept,
            } = &mut **e;
            // (a tagged process's: the tag, then the reader's backtrace, whose first `keep`
            // frames are the last one's)
            let (frames, hints, keep) = match tagged {
                Some((f, h)) => {
                    f.truncate(1 + keep);
                    f.extend_from_slice(&backtrace[keep..]);
                    h.truncate(1 + keep);
                    h.extend_from_slice(slots.get(keep..).unwrap_or_default());
                    h.resize(f.len(), 0);
                    (&f[..], &h[..], if valid { 1 + keep } else { 0 })
                }
                None => (backtrace, slots, keep),
            };
            if thinner
                .as_mut()
                .is_some_and(|t| t.keep(nsamples) == 0 && nsamples > 0)
            {
                // left out: the next encoding keeps of the path only what this one kept
                *kept = keep.min(*kept);
                return self.push_alloc(time, id, length, nsamples, source, 0, THINNED_OUT);
            }
            let keep = keep.min(std::mem::replace(kept, usize::MAX));
            let enc = &mut self.b.enc;
            let head = enc.len();
            enc.u32(0);
            let misses = &mut self.b.misses;
            *allocs += 1;
            // (the frames the output keeps of the previous backtrace, then the encoding)
            let (common, (ncodes, done)) = match share {
                Some(share) => (
                    0,
                    share.encode(
                        tables,
                        enc,
                        *allocs,
                        frames,
                        hints,
                        keep,
                        head + 4 + ENCODING_ROOM,
                        |i, at| misses.push((at as u32, frames[i])),
                    ),
                ),
                None => {
                    // alone in the domain: the new frames, after the `keep` of the last one
                    enc.u32(keep as u32);
                    solo_hints.clear();
                    solo_hints.extend_from_slice(hints.get(keep..).unwrap_or_default());
                    let limit = enc.len() + ENCODING_ROOM;
                    let new = &frames[keep..];
                    let on_miss = |i, at: usize| misses.push((at as u32, new[i]));
                    let encoded =
                        tables.encode_hinted(enc, *allocs, new, solo_hints, limit, on_miss);
                    (keep, encoded)
                }
            };
            let len = enc.len() - head - 4;
            let cut = if common + done < frames.len() { CUT } else { 0 };
            enc.set_u32(head, len as u32 | cut);
            (ncodes, done)
        } else {
            self.b.frames.extend_from_slice(&backtrace[keep..]);
            crate::format::backtrace::push_slots(&mut self.b.slots, slots, keep, backtrace.len());
            (keep, backtrace.len() - keep)
        };
        self.push_alloc(
            time,
            id,
            length,
            nsamples,
            source,
            first as u32,
            second as u32,
        );
    }

    #[inline]
    fn promote(&mut self, time: u64, id: u64) {
        self.b.evs.push(Timed {
            time,
            ev: Ev::Promote { id },
        });
    }

    #[inline]
    fn collect(&mut self, time: u64, id: u64) {
        self.b.evs.push(Timed {
            time,
            ev: Ev::Collect { id },
        });
    }

    #[inline]
    fn full(&self) -> bool {
        self.b.frames.len() >= BATCH_FRAMES || self.b.enc.len() >= 8 * BATCH_FRAMES
    }
}

/// Decode up to `n` events of a stream into `b` (encoding its backtraces with the stream's
/// encoder, if it is in a share).
fn fill(s: &mut DecState, b: &mut Batch, n: usize) {
    b.encoded = s.enc.is_some();
    let Some(r) = s.reader.as_mut() else {
        b.last = true;
        return;
    };
    let mut sink = Filler {
        b,
        bt_valid: &mut s.bt_valid,
        enc: s.enc.as_deref_mut(),
    };
    match r.read_events(&mut sink, n) {
        Ok(true) => {}
        Ok(false) => b.last = true,
        Err(e) => {
            s.rep
                .warnings
                .push(format!("stopped reading after an error: {e}"));
            s.rep.stopped_at_error = true;
            b.last = true;
        }
    }
    for w in r.take_warnings() {
        s.rep.warnings.push(w.to_string());
    }
    if b.last {
        r.get_ref().close();
    }
}
