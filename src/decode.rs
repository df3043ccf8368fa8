//! Decoding the merge's inputs ahead of it on a worker thread: each stream (an input, or one
//! domain of a format-3 input) is read into batches of events whose frames are merged codes.

use crate::event::{AllocSource, Event, LocationCode};
use crate::input::FilePool;
use crate::location::{IntMap, LocationTable};
use crate::merge::Warnings;
use crate::pipeline::Codes;
use crate::reader::Reader;
use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// One event of a batch. An allocation's backtrace is the previous allocation's (of the
/// same stream) first `keep` frames followed by `new` frames from the batch's frame list.
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

/// Events of one stream, in its order.
#[derive(Default)]
pub(crate) struct Batch {
    pub times: Vec<u64>,
    pub evs: Vec<Ev>,
    pub frames: Vec<LocationCode>,
    /// The stream has no events after this batch.
    pub last: bool,
}

impl Batch {
    fn clear(&mut self) {
        self.times.clear();
        self.evs.clear();
        self.frames.clear();
        self.last = false;
    }
}

/// What to read: an input's file, and the domain (format 3) of this stream.
pub(crate) struct StreamSpec {
    pub input: usize,
    pub path: PathBuf,
    pub domain: Option<u16>,
}

/// What the decoder learned about each input.
#[derive(Default, Clone)]
pub(crate) struct DecodeReport {
    pub warnings: Warnings,
    pub remapped_codes: u64,
    pub skipped_packets: u64,
}

struct Queue {
    q: Mutex<VecDeque<Batch>>,
    cv: Condvar,
}

struct Shared {
    queues: Vec<Queue>,
    wake: Mutex<bool>,
    wake_cv: Condvar,
    abort: AtomicBool,
    free: Mutex<Vec<Batch>>,
    bytes_read: AtomicU64,
}

/// Batches queued per stream ahead of the consumer.
const DEPTH: usize = 2;

/// The consumer's end: batches per stream, in order.
pub(crate) struct Decoder {
    shared: Arc<Shared>,
    handle: Option<std::thread::JoinHandle<Vec<DecodeReport>>>,
}

impl Decoder {
    /// Start decoding `streams` (of `ninputs` inputs) on a worker thread.
    pub fn start(
        streams: Vec<StreamSpec>,
        ninputs: usize,
        mut codes: Codes,
    ) -> std::io::Result<Decoder> {
        let shared = Arc::new(Shared {
            queues: (0..streams.len())
                .map(|_| Queue {
                    q: Mutex::new(VecDeque::new()),
                    cv: Condvar::new(),
                })
                .collect(),
            wake: Mutex::new(false),
            wake_cv: Condvar::new(),
            abort: AtomicBool::new(false),
            free: Mutex::new(Vec::new()),
            bytes_read: AtomicU64::new(0),
        });
        let sh = shared.clone();
        let handle = std::thread::Builder::new()
            .name("memtrace-merge-decode".into())
            .spawn(move || decode_all(&sh, streams, ninputs, &mut codes))?;
        Ok(Decoder {
            shared,
            handle: Some(handle),
        })
    }

    /// The next batch of stream `i` (waiting for the decoder if need be).
    pub fn next_batch(&self, i: usize) -> Batch {
        let q = &self.shared.queues[i];
        let mut g = q.q.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(b) = g.pop_front() {
                drop(g);
                self.poke();
                return b;
            }
            if self.decoder_gone() {
                // The decoder died (it panicked): end the stream; `finish` reports it.
                return Batch {
                    last: true,
                    ..Default::default()
                };
            }
            self.poke();
            g =
                q.cv.wait_timeout(g, Duration::from_millis(50))
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
        }
    }

    fn decoder_gone(&self) -> bool {
        self.handle.as_ref().is_none_or(|h| h.is_finished())
    }

    fn poke(&self) {
        let mut w = self.shared.wake.lock().unwrap_or_else(|e| e.into_inner());
        *w = true;
        self.shared.wake_cv.notify_one();
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

    /// Wait for the decoder and take its reports (Err: it panicked, with the message).
    pub fn finish(mut self) -> Result<Vec<DecodeReport>, String> {
        self.stop();
        let h = self.handle.take().expect("finish once");
        h.join().map_err(|p| {
            p.downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into())
        })
    }

    fn stop(&self) {
        self.shared.abort.store(true, Ordering::Relaxed);
        self.poke();
    }
}

impl Drop for Decoder {
    fn drop(&mut self) {
        if let Some(h) = self.handle.take() {
            self.stop();
            let _ = h.join();
        }
    }
}

struct DecState {
    reader: Option<Reader<crate::input::LazyFile>>,
    input: usize,
    bt_valid: bool,
    done: bool,
    /// bytes of this reader already added to the shared count
    counted: u64,
}

fn claim(
    codes: &mut Codes,
    map: &mut IntMap<LocationCode, LocationCode>,
    rep: &mut DecodeReport,
    new: &[LocationCode],
    table: &LocationTable,
) {
    for c in new {
        if let Some(locs) = table.get(c) {
            let (m, remapped) = codes.map(*c, locs);
            if remapped {
                rep.remapped_codes += 1;
                map.insert(*c, m);
            }
        }
    }
}

fn decode_all(
    sh: &Shared,
    specs: Vec<StreamSpec>,
    ninputs: usize,
    codes: &mut Codes,
) -> Vec<DecodeReport> {
    let mut reports = vec![DecodeReport::default(); ninputs];
    let mut maps: Vec<IntMap<LocationCode, LocationCode>> = vec![IntMap::default(); ninputs];
    let pool = FilePool::from_rlimit();
    let batch_events = (131_072 / specs.len().max(1)).clamp(64, 4096);
    let mut st: Vec<DecState> = specs
        .iter()
        .map(|s| {
            let reader = pool
                .open(&s.path)
                .map_err(|e| crate::error::Error::io(&s.path, "open", e))
                .and_then(|f| Reader::new(f, &s.path.display().to_string()));
            let reader = match reader {
                Ok(mut r) => {
                    r.set_domain_filter(s.domain);
                    Some(r)
                }
                Err(e) => {
                    let msg = format!("could not be read again: {e}");
                    reports[s.input].warnings.push(msg);
                    None
                }
            };
            DecState {
                reader,
                input: s.input,
                bt_valid: false,
                done: false,
                counted: 0,
            }
        })
        .collect();
    loop {
        if sh.abort.load(Ordering::Relaxed) {
            break;
        }
        let mut worked = false;
        let mut all_done = true;
        for (i, s) in st.iter_mut().enumerate() {
            if s.done {
                continue;
            }
            all_done = false;
            let queued = sh.queues[i]
                .q
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .len();
            if queued >= DEPTH {
                continue;
            }
            worked = true;
            let mut b = sh
                .free
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .pop()
                .unwrap_or_default();
            let k = s.input;
            fill(
                s,
                &mut b,
                batch_events,
                codes,
                &mut maps[k],
                &mut reports[k],
            );
            if let Some(r) = &s.reader {
                let now = r.stats().bytes;
                sh.bytes_read.fetch_add(now - s.counted, Ordering::Relaxed);
                s.counted = now;
            }
            if b.last {
                s.done = true;
                if let Some(r) = s.reader.take() {
                    reports[k].skipped_packets += r.stats().skipped_packets;
                }
            }
            let q = &sh.queues[i];
            q.q.lock().unwrap_or_else(|e| e.into_inner()).push_back(b);
            q.cv.notify_one();
        }
        if all_done {
            break;
        }
        if !worked {
            let mut w = sh.wake.lock().unwrap_or_else(|e| e.into_inner());
            if !*w {
                w = sh
                    .wake_cv
                    .wait_timeout(w, Duration::from_millis(50))
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
            *w = false;
        }
    }
    reports
}

/// Decode up to `n` events of a stream into `b`.
fn fill(
    s: &mut DecState,
    b: &mut Batch,
    n: usize,
    codes: &mut Codes,
    map: &mut IntMap<LocationCode, LocationCode>,
    rep: &mut DecodeReport,
) {
    let Some(r) = s.reader.as_mut() else {
        b.last = true;
        return;
    };
    while b.evs.len() < n {
        match r.next_full() {
            Ok(Some((ev, table, new))) => {
                if !new.is_empty() {
                    claim(codes, map, rep, new, table);
                }
                b.times.push(ev.time().0);
                match ev {
                    Event::Alloc(a) => {
                        let keep = if s.bt_valid {
                            (a.common_prefix as usize).min(a.backtrace.len())
                        } else {
                            0
                        };
                        let fresh = &a.backtrace[keep..];
                        if map.is_empty() {
                            b.frames.extend_from_slice(fresh);
                        } else {
                            b.frames
                                .extend(fresh.iter().map(|c| map.get(c).copied().unwrap_or(*c)));
                        }
                        s.bt_valid = true;
                        b.evs.push(Ev::Alloc {
                            id: a.id.0,
                            length: a.length,
                            nsamples: a.nsamples,
                            source: a.source,
                            keep: keep as u32,
                            new: fresh.len() as u32,
                        });
                    }
                    Event::Promote { id, .. } => b.evs.push(Ev::Promote { id: id.0 }),
                    Event::Collect { id, .. } => b.evs.push(Ev::Collect { id: id.0 }),
                }
            }
            Ok(None) => {
                b.last = true;
                break;
            }
            Err(e) => {
                rep.warnings
                    .push(format!("stopped reading after an error: {e}"));
                b.last = true;
                break;
            }
        }
        if !r.warnings().is_empty() {
            for w in r.take_warnings() {
                rep.warnings.push(w.to_string());
            }
        }
    }
    for w in r.take_warnings() {
        rep.warnings.push(w.to_string());
    }
    if b.last {
        r.get_ref().close();
    }
}
