//! An analysis's streams decoded a batch ahead on a thread of their own, their backtraces
//! interned there, so that the pass (on the caller's thread) only replays events.

use super::sites::{cell_key, define, CellTable, Path, Tree};
use crate::error::{Error, Result};
use crate::format::event::{AllocSource, LocationCode};
use crate::format::location::{LocationList, LocationTable};
use crate::pipeline::files::LazyFile;
use crate::reader::{EventSink, Reader};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;

/// What the pass needs of an event: promotes change no liveness and are not kept, nor
/// are allocations the filters leave out.
#[derive(Clone, Copy)]
pub(crate) enum Ev {
    Alloc {
        time: u64,
        id: u64,
        cell: u32,
        nsamples: u64,
        /// Estimated bytes.
        bytes: u64,
    },
    Collect {
        time: u64,
        id: u64,
    },
}

impl Ev {
    /// The order of events: by time, a microsecond's allocations before its collections.
    pub(crate) fn key(&self) -> (u64, u8) {
        match *self {
            Ev::Alloc { time, .. } => (time, 0),
            Ev::Collect { time, .. } => (time, 1),
        }
    }
}

/// One domain of one input, to be read.
pub(crate) struct StreamSpec {
    pub(crate) process: u32,
    pub(crate) domain: u16,
    pub(crate) reader: Reader<LazyFile>,
    pub(crate) counting: Counting,
}

/// How an input's allocations are counted and filtered (by the decoding threads, so that
/// the pass only replays lifetimes).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Counting {
    /// Estimated bytes of one sample.
    pub(crate) bytes_per_sample: f64,
    pub(crate) sample_rate: f64,
    pub(crate) word_bytes: u64,
    /// The window (µs since the epoch).
    pub(crate) from: Option<u64>,
    pub(crate) to: Option<u64>,
    pub(crate) source: Option<AllocSource>,
    pub(crate) min_size: Option<u64>,
    pub(crate) max_size: Option<u64>,
}

impl Counting {
    fn keeps(&self, source: AllocSource, size: u64) -> bool {
        self.source.is_none_or(|s| s == source)
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

/// What a cell allocated. Bytes and objects are estimates; `seen_*` count every
/// allocation up to the window's end, in the window or not (live objects are estimated
/// from live bytes at their ratio).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Allocated {
    pub(crate) allocations: u64,
    pub(crate) samples: u64,
    pub(crate) bytes: u64,
    pub(crate) objects: f64,
    pub(crate) seen_bytes: u64,
    pub(crate) seen_objects: f64,
}

/// A stream as the decoding thread reads it.
struct Decoding {
    /// Its index among the analysis's streams.
    stream: u32,
    process: u32,
    domain: u16,
    reader: Option<Reader<LazyFile>>,
    counting: Counting,
    path: Path,
    /// Its cells by key.
    cells: CellTable,
    /// The last allocation's (cell key, cell id, its index in the tree): most follow one
    /// of the same site.
    last: Option<(u128, u32, u32)>,
}

/// Hands a stream's events to a batch, its backtraces interned in the tree.
struct Sink<'a> {
    tree: &'a mut Tree,
    table: &'a mut LocationTable,
    s: &'a mut Decoding,
    /// By the tree's cells.
    allocated: &'a mut Vec<Allocated>,
    out: &'a mut Vec<Ev>,
}

impl EventSink for Sink<'_> {
    fn location(&mut self, code: LocationCode, locs: &LocationList) {
        define(self.table, code, locs);
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
                let (id, local) = match s.cells.get(&key) {
                    Some(&v) => v,
                    None => {
                        let node = self.tree.intern(s.process, &s.path, backtrace);
                        let v = self.tree.new_cell(node, s.domain, source, s.stream);
                        s.cells.insert(key, v);
                        v
                    }
                };
                s.last = Some((key, id, local));
                (id, local)
            }
        };
        let bytes = estimated_bytes(nsamples, c.bytes_per_sample);
        if c.to.is_none_or(|t| time <= t) {
            if self.allocated.len() <= local as usize {
                self.allocated
                    .resize(local as usize + 1, Allocated::default());
            }
            let a = &mut self.allocated[local as usize];
            let objects = if c.sample_rate > 0.0 {
                nsamples as f64 / (c.sample_rate * (length + 1) as f64)
            } else {
                0.0
            };
            a.seen_bytes += bytes;
            a.seen_objects += objects;
            if c.from.is_none_or(|f| time >= f) {
                a.allocations += 1;
                a.samples += nsamples;
                a.bytes += bytes;
                a.objects += objects;
            }
        }
        self.out.push(Ev::Alloc {
            time,
            id,
            cell,
            nsamples,
            bytes,
        });
    }
    fn promote(&mut self, _time: u64, _id: u64) {}
    fn collect(&mut self, time: u64, id: u64) {
        self.out.push(Ev::Collect { time, id });
    }
}

/// A stream's next events, and what was met reading them.
struct Batch {
    stream: u32,
    events: Vec<Ev>,
    /// Damage met: (process, warning).
    warnings: Vec<(u32, String)>,
    /// The stream has no more.
    end: bool,
}

/// Read up to `max` events of `s` into `out` (a damaged stream ends with a warning).
fn decode(
    s: &mut Decoding,
    tree: &mut Tree,
    allocated: &mut Vec<Allocated>,
    out: &mut Vec<Ev>,
    max: usize,
) -> Batch {
    let stream_end = |events, warnings| Batch {
        stream: 0,
        events,
        warnings,
        end: true,
    };
    let Some(mut r) = s.reader.take() else {
        return stream_end(std::mem::take(out), Vec::new());
    };
    let p = s.process as usize;
    let mut table = std::mem::take(&mut tree.locations[p]);
    let more = r.read_events(
        &mut Sink {
            tree,
            table: &mut table,
            s,
            allocated,
            out,
        },
        max,
    );
    tree.locations[p] = table;
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
    Batch {
        stream: 0,
        events: std::mem::take(out),
        warnings,
        end,
    }
}

/// Batches asked for ahead of the one being replayed, a stream: enough that the decoding
/// threads have work while the pass replays (else a core idles).
const AHEAD: usize = 2;

/// The pass's side of a stream: the batch being replayed and the next, when it came.
struct Queue {
    process: u32,
    ready: Vec<Ev>,
    pos: usize,
    next: VecDeque<Batch>,
    ended: bool,
}

/// The streams' events, decoded ahead on other threads: each input's streams on one of
/// them, which interns their backtraces in a tree of its own.
pub(crate) struct Feed {
    /// The decoding thread of each input.
    thread_of: Vec<usize>,
    /// One a decoding thread.
    requests: Vec<Sender<(u32, Vec<Ev>)>>,
    batches: Receiver<Batch>,
    workers: Vec<JoinHandle<(Tree, Vec<Allocated>)>>,
    cell_ids: Arc<AtomicU32>,
    queues: Vec<Queue>,
    /// Damage met so far: (process, warning).
    pub(crate) warnings: Vec<(u32, String)>,
}

/// A decoding thread: stream requests in, batches out; its tree at the end.
fn decoder(
    mut tree: Tree,
    mut streams: Vec<Option<Decoding>>,
    requests: Receiver<(u32, Vec<Ev>)>,
    out: Sender<Batch>,
    batch: usize,
) -> (Tree, Vec<Allocated>) {
    let mut allocated = Vec::new();
    // (ends when the pass drops its sender: done, failed or cancelled)
    while let Ok((i, mut buf)) = requests.recv() {
        buf.clear();
        let Some(s) = streams[i as usize].as_mut() else {
            continue;
        };
        let mut b = decode(s, &mut tree, &mut allocated, &mut buf, batch);
        b.stream = i;
        if out.send(b).is_err() {
            break;
        }
    }
    (tree, allocated)
}

impl Feed {
    /// Start decoding `streams` (of inputs of sizes `sizes`), up to `batch` events a
    /// stream at a time, on as many threads as there are processors and inputs (four at
    /// most), each input on one of them, the largest first to the least loaded.
    pub(crate) fn start(sizes: &[u64], streams: Vec<StreamSpec>, batch: usize) -> Result<Feed> {
        let processes = sizes.len();
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let k = cores.min(processes).clamp(1, 4);
        let mut order: Vec<usize> = (0..processes).collect();
        order.sort_by_key(|&p| std::cmp::Reverse(sizes[p]));
        let mut load = vec![0u64; k];
        let mut thread_of = vec![0usize; processes];
        for p in order {
            let d = (0..k).min_by_key(|&d| load[d]).unwrap_or(0);
            load[d] += sizes[p];
            thread_of[p] = d;
        }
        let cell_ids = Arc::new(AtomicU32::new(0));
        let (out_tx, out_rx) = channel::<Batch>();
        let n = streams.len();
        let process: Vec<u32> = streams.iter().map(|s| s.process).collect();
        // (each thread is given the streams of its inputs, at their indices)
        let mut mine: Vec<Vec<Option<Decoding>>> =
            (0..k).map(|_| (0..n).map(|_| None).collect()).collect();
        for (i, s) in streams.into_iter().enumerate() {
            mine[thread_of[s.process as usize]][i] = Some(Decoding {
                stream: i as u32,
                process: s.process,
                domain: s.domain,
                reader: Some(s.reader),
                counting: s.counting,
                path: Path::of_process(s.process),
                cells: CellTable::default(),
                last: None,
            });
        }
        let mut requests = Vec::new();
        let mut workers = Vec::new();
        for streams in mine {
            let (tx, rx) = channel::<(u32, Vec<Ev>)>();
            let tree = Tree::numbered_by(cell_ids.clone(), processes);
            let out = out_tx.clone();
            let w = std::thread::Builder::new()
                .name("memtrace-analysis-decode".into())
                .spawn(move || decoder(tree, streams, rx, out, batch))
                .map_err(|e| Error::Internal(format!("cannot start a decoding thread: {e}")))?;
            requests.push(tx);
            workers.push(w);
        }
        let mut f = Feed {
            thread_of,
            requests,
            batches: out_rx,
            workers,
            cell_ids,
            queues: (process.into_iter())
                .map(|process| Queue {
                    process,
                    ready: Vec::new(),
                    pos: 0,
                    next: VecDeque::new(),
                    ended: false,
                })
                .collect(),
            warnings: Vec::new(),
        };
        for _ in 0..AHEAD {
            for i in 0..n {
                f.ask(i, Vec::with_capacity(batch));
            }
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

    fn ask(&mut self, i: usize, buf: Vec<Ev>) {
        let d = self.thread_of[self.queues[i].process as usize];
        if let Some(tx) = self.requests.get(d) {
            // (a thread that ended early is found when its batches do not come)
            let _ = tx.send((i as u32, buf));
        }
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

    /// Move stream `i`'s next batch in, waiting for it; false at the stream's end.
    #[cold]
    fn refill(&mut self, i: usize) -> Result<bool> {
        loop {
            if self.queues[i].ended && self.queues[i].next.is_empty() {
                return Ok(false);
            }
            if let Some(b) = self.queues[i].next.pop_front() {
                self.warnings.extend(b.warnings);
                let q = &mut self.queues[i];
                let done = std::mem::replace(&mut q.ready, b.events);
                q.pos = 0;
                q.ended |= b.end;
                if !q.ended {
                    self.ask(i, done);
                }
                if self.queues[i].ready.is_empty() {
                    continue;
                }
                return Ok(true);
            }
            match self.batches.recv() {
                Ok(b) => {
                    let q = &mut self.queues[b.stream as usize];
                    q.next.push_back(b);
                }
                Err(_) => return Err(self.failed()),
            }
        }
    }

    /// The decoding threads' end, when one ended before its time.
    fn failed(&mut self) -> Error {
        self.requests.clear();
        let panicked = self.workers.drain(..).any(|w| w.join().is_err());
        Error::Internal(if panicked {
            "a decoding thread panicked".into()
        } else {
            "a decoding thread ended early".into()
        })
    }

    /// Stop decoding; the tree, with every backtrace met, what each of its cells
    /// allocated, and the order to number them in ([`Tree::combine`]).
    pub(crate) fn finish(mut self) -> Result<(Tree, Vec<Allocated>, Vec<u32>)> {
        self.requests.clear();
        let mut done = Vec::new();
        for w in self.workers.drain(..) {
            match w.join() {
                Ok(d) => done.push(d),
                Err(_) => return Err(Error::Internal("a decoding thread panicked".into())),
            }
        }
        // (counted once every thread has ended: a thread may have made cells after the
        // pass stopped, at the end of a --to window)
        let cells = self.cell_ids.load(Ordering::Relaxed) as usize;
        let mut all = vec![Allocated::default(); cells];
        let mut trees = Vec::new();
        for (t, allocated) in done {
            for (local, a) in allocated.into_iter().enumerate() {
                all[t.cell_number(local)] = a;
            }
            trees.push(t);
        }
        let (tree, order) = Tree::combine(trees, cells as u32);
        Ok((tree, all, order))
    }
}
