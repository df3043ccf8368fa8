//! Decoding the merge's inputs ahead of it on worker threads: each stream (an input, or one
//! domain of a format-3 input) is read into batches of events and the locations they define.

use crate::backtrace::CacheWriter;
use crate::buf::WriteBuf;
use crate::event::{AllocSource, LocationCode};
use crate::input::FilePool;
use crate::location::LocationList;
use crate::merge::Warnings;
use crate::reader::{EventSink, Reader};
use crate::share::{Share, ShareOf};
use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// One event of a batch. An allocation's backtrace is the previous allocation's (of the
/// same stream) first `keep` frames followed by `new` frames from the batch's frame list;
/// in a stream encoded ahead ([`StreamSpec::share`]) it is `keep` codewords in the batch's
/// `enc`, for `new` frames.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Ev {
    Alloc {
        id: u64,
        length: u64,
        nsamples: u64,
        source: AllocSource,
        keep: u32,
        new: u32,
    },
    Promote {
        id: u64,
    },
    Collect {
        id: u64,
    },
}

/// Events of one stream, in its order, with the stream's own location codes.
#[derive(Default)]
pub(crate) struct Batch {
    /// Each event's place in the merged order, [`order_key`].
    pub keys: Vec<u128>,
    pub evs: Vec<Ev>,
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
            keys: Vec::with_capacity(events),
            evs: Vec::with_capacity(events),
            // (16 new frames an event is plenty but for deep stacks, which grow it)
            frames: Vec::with_capacity((events * 16).min(BATCH_FRAMES) + 256),
            slots: Vec::with_capacity((events * 16).min(BATCH_FRAMES) + 256),
            locs: Vec::new(),
            enc: WriteBuf::with_capacity(0),
            misses: Vec::new(),
            last: false,
        }
    }

    fn clear(&mut self) {
        self.keys.clear();
        self.evs.clear();
        self.frames.clear();
        self.slots.clear();
        self.locs.clear();
        self.enc.clear();
        self.misses.clear();
        self.last = false;
    }
}

/// What to read: an input's file, and the domain (format 3) of this stream.
pub(crate) struct StreamSpec {
    pub input: usize,
    pub path: PathBuf,
    pub domain: Option<u16>,
    /// The file's size: streams are shared out among the threads by it.
    pub size: u64,
    /// Encode each backtrace whole, in this share of the output domain's cache.
    pub share: Option<ShareOf>,
}

/// What the decoder learned about each input.
#[derive(Default, Clone)]
pub(crate) struct DecodeReport {
    pub warnings: Warnings,
    pub skipped_packets: u64,
}

/// The room one encoding made ahead may take: a packet's, but for its header and the
/// allocation's fields.
pub(crate) const ENCODING_ROOM: usize = crate::packet::MAX_PACKET_SIZE - 512;

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
    free: Mutex<Vec<Batch>>,
    bytes_read: AtomicU64,
}

/// Events per batch (fewer with many streams). Small batches keep the memory touched, and
/// so the page faults, down: 1,024 measured fastest on the fork traces (4,096 took 20%
/// longer, mostly in the kernel).
const BATCH_EVENTS: usize = 1024;
/// Events in a stream's first batch: the merge can start once every stream has one.
const FIRST_BATCH_EVENTS: usize = 64;
/// A batch ends early once it holds this many frames (deep backtraces). 8,192 rather than
/// 16,384: the merge of fork/ touches 25% fewer pages and takes ~5% less CPU.
const BATCH_FRAMES: usize = 8_192;

/// Batches queued per stream ahead of the consumer.
const DEPTH: usize = 4;

/// A decoding thread; it hands back its reports, per input index.
type Worker = std::thread::JoinHandle<Vec<(usize, DecodeReport)>>;

/// The consumer's end: batches per stream, in order.
pub(crate) struct Decoder {
    shared: Arc<Shared>,
    handles: Vec<Option<Worker>>,
    ninputs: usize,
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
    /// Start decoding `streams` (of `ninputs` inputs) on `threads` worker threads.
    pub fn start(
        streams: Vec<StreamSpec>,
        ninputs: usize,
        threads: usize,
    ) -> std::io::Result<Decoder> {
        let n = threads.clamp(1, streams.len().max(1));
        let owner = share_out(&streams, n);
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
            free: Mutex::new(Vec::new()),
            bytes_read: AtomicU64::new(0),
        });
        let mut mine: Vec<Vec<(usize, StreamSpec)>> = (0..n).map(|_| Vec::new()).collect();
        for (i, s) in streams.into_iter().enumerate() {
            mine[owner[i]].push((i, s));
        }
        let mut d = Decoder {
            shared,
            handles: Vec::new(),
            ninputs,
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
            self.poke(w);
            g.waiting = true;
            g =
                q.cv.wait_timeout(g, Duration::from_millis(50))
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            g.waiting = false;
        }
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
            f.push(b);
        }
    }

    pub fn bytes_read(&self) -> u64 {
        self.shared.bytes_read.load(Ordering::Relaxed)
    }

    /// Wait for the workers and take their reports, per input (Err: one panicked, with
    /// the message).
    pub fn finish(mut self) -> Result<Vec<DecodeReport>, String> {
        self.stop();
        let mut reports = vec![DecodeReport::default(); self.ninputs];
        let mut failed = None;
        for h in self.handles.iter_mut() {
            let Some(h) = h.take() else { continue };
            match h.join() {
                Ok(parts) => {
                    for (k, r) in parts {
                        let into = &mut reports[k];
                        into.skipped_packets += r.skipped_packets;
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
    /// the stream's index among all streams
    index: usize,
    /// the key bits of this stream's events below the time and rank, see [`order_key`]
    key_bits: u128,
    reader: Option<Reader<crate::input::LazyFile>>,
    input: usize,
    bt_valid: bool,
    /// The stream's share of the output cache, and its allocations so far, when encoded
    /// ahead.
    share: Option<(Share, i64)>,
    done: bool,
    /// no batch filled yet (the first is small, so that the merge starts sooner)
    first: bool,
    /// bytes of this reader already added to the shared count
    counted: u64,
}

/// Worker `me` (of `nworkers`): decode `specs` ahead of the consumer, each stream at most
/// [`DEPTH`] batches ahead, until all end or the consumer stops. Reports per input.
fn decode_all(
    sh: &Shared,
    me: usize,
    nworkers: usize,
    specs: Vec<(usize, StreamSpec)>,
) -> Vec<(usize, DecodeReport)> {
    let mut reports: Vec<(usize, DecodeReport)> = Vec::new();
    let pool = FilePool::from_rlimit_share(nworkers);
    let batch_events = (131_072 / sh.queues.len().max(1)).clamp(64, BATCH_EVENTS);
    let mut st: Vec<DecState> = Vec::with_capacity(specs.len());
    // the output cache as this thread's streams encoded ahead leave it (each in its share)
    let mut tables: Option<CacheWriter> = None;
    for (index, s) in specs {
        let slot = match reports.iter().position(|(k, _)| *k == s.input) {
            Some(p) => p,
            None => {
                reports.push((s.input, DecodeReport::default()));
                reports.len() - 1
            }
        };
        let reader = pool
            .open(&s.path)
            .map_err(|e| crate::error::Error::io(&s.path, "open", e))
            .and_then(|f| Reader::new(f, &s.path.display().to_string()));
        let reader = match reader {
            Ok(mut r) => {
                r.set_domain_filter(s.domain);
                r.set_keep_slots(true);
                Some(r)
            }
            Err(e) => {
                let msg = format!("could not be read again: {e}");
                reports[slot].1.warnings.push(msg);
                None
            }
        };
        st.push(DecState {
            index,
            key_bits: order_key(0, s.input, 0, index),
            reader,
            input: slot,
            bt_valid: false,
            share: s.share.map(|of| (Share::new(of), 0)),
            done: false,
            first: true,
            counted: 0,
        });
    }
    let wake = &sh.wakes[me];
    loop {
        if sh.abort.load(Ordering::Relaxed) {
            break;
        }
        // Fill the stream with the fewest batches ready (the one the merge may be waiting
        // for), one batch at a time.
        let mut pick = None;
        let mut fewest = DEPTH;
        let mut all_done = true;
        for (k, s) in st.iter().enumerate() {
            if s.done {
                continue;
            }
            all_done = false;
            let n = sh.queues[s.index].queued.load(Ordering::Relaxed);
            if n < fewest {
                fewest = n;
                pick = Some(k);
                if n == 0 {
                    break;
                }
            }
        }
        if all_done {
            break;
        }
        let worked = pick.is_some();
        if let Some(k) = pick {
            let s = &mut st[k];
            let q = &sh.queues[s.index];
            let mut b = sh
                .free
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .pop()
                .unwrap_or_else(|| Batch::with_capacity(batch_events));
            let rep = &mut reports[s.input].1;
            let n = if s.first {
                FIRST_BATCH_EVENTS
            } else {
                batch_events
            };
            s.first = false;
            fill(s, &mut b, n, rep, &mut tables);
            if let Some(r) = &s.reader {
                let now = r.stats().bytes;
                sh.bytes_read.fetch_add(now - s.counted, Ordering::Relaxed);
                s.counted = now;
            }
            if b.last {
                s.done = true;
                if let Some(r) = s.reader.take() {
                    rep.skipped_packets += r.stats().skipped_packets;
                }
            }
            let mut g = q.q.lock().unwrap_or_else(|e| e.into_inner());
            g.ready.push_back(b);
            q.queued.store(g.ready.len(), Ordering::Relaxed);
            if g.waiting {
                q.cv.notify_one();
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
    reports
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
    key_bits: u128,
    bt_valid: &'a mut bool,
    share: Option<(&'a mut (Share, i64), &'a mut CacheWriter)>,
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
        let keep = if *self.bt_valid {
            (common_prefix as usize).min(backtrace.len())
        } else {
            0
        };
        *self.bt_valid = true;
        // (in a stream encoded ahead: codewords and frames encoded, else kept and new frames)
        let (first, second) = if let Some(((share, ids), tables)) = &mut self.share {
            let enc = &mut self.b.enc;
            let head = enc.len();
            enc.u32(0);
            let misses = &mut self.b.misses;
            *ids += 1;
            let (ncodes, done) = share.encode(
                tables,
                enc,
                *ids,
                backtrace,
                slots,
                keep,
                head + 4 + ENCODING_ROOM,
                |i, at| misses.push((at as u32, backtrace[i])),
            );
            let len = enc.len() - head - 4;
            let cut = if done < backtrace.len() { CUT } else { 0 };
            enc.set_u32(head, len as u32 | cut);
            (ncodes, done)
        } else {
            self.b.frames.extend_from_slice(&backtrace[keep..]);
            crate::backtrace::push_slots(&mut self.b.slots, slots, keep, backtrace.len());
            (keep, backtrace.len() - keep)
        };
        self.b.keys.push(order_key(time, 0, 0, 0) | self.key_bits);
        self.b.evs.push(Ev::Alloc {
            id,
            length,
            nsamples,
            source,
            keep: first as u32,
            new: second as u32,
        });
    }

    #[inline]
    fn promote(&mut self, time: u64, id: u64) {
        self.b.keys.push(order_key(time, 0, 1, 0) | self.key_bits);
        self.b.evs.push(Ev::Promote { id });
    }

    #[inline]
    fn collect(&mut self, time: u64, id: u64) {
        self.b.keys.push(order_key(time, 0, 2, 0) | self.key_bits);
        self.b.evs.push(Ev::Collect { id });
    }

    #[inline]
    fn full(&self) -> bool {
        self.b.frames.len() >= BATCH_FRAMES || self.b.enc.len() >= 8 * BATCH_FRAMES
    }
}

/// Decode up to `n` events of a stream into `b` (encoding its backtraces in `tables`, made
/// on first use, when the stream is encoded ahead).
fn fill(
    s: &mut DecState,
    b: &mut Batch,
    n: usize,
    rep: &mut DecodeReport,
    tables: &mut Option<CacheWriter>,
) {
    let Some(r) = s.reader.as_mut() else {
        b.last = true;
        return;
    };
    let mut sink = Filler {
        b,
        key_bits: s.key_bits,
        bt_valid: &mut s.bt_valid,
        share: s
            .share
            .as_mut()
            .map(|sh| (sh, tables.get_or_insert_with(CacheWriter::default))),
    };
    match r.read_events(&mut sink, n) {
        Ok(true) => {}
        Ok(false) => b.last = true,
        Err(e) => {
            rep.warnings
                .push(format!("stopped reading after an error: {e}"));
            b.last = true;
        }
    }
    for w in r.take_warnings() {
        rep.warnings.push(w.to_string());
    }
    if b.last {
        r.get_ref().close();
    }
}
