//! The merge's writing thread: the merging thread sends it batches of commands (allocations
//! with their new frames, promotes, collects) to encode; and the merged location codes.

use crate::error::{Error, Result};
use crate::event::{AllocSource, DomainId, LocationCode, ObjId, Timestamp};
use crate::location::{IntMap, LocationList};
use crate::writer::{WriteStats, Writer};
use std::collections::{HashMap, VecDeque};
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock};

/// Merged location codes: a code keeps its value while every input agrees on its
/// locations; each further meaning gets a fresh code from the top of the 63-bit range.
#[derive(Default)]
pub(crate) struct Codes {
    pub meanings: Arc<RwLock<IntMap<LocationCode, LocationList>>>,
    alternatives: HashMap<(LocationCode, LocationList), LocationCode>,
    next_fresh: u64,
}

impl Codes {
    const FRESH_TOP: u64 = (1 << 62) - 1;

    /// A code no input has used so far, with the given meaning.
    pub fn fresh(&mut self, locs: LocationList) -> LocationCode {
        let mut m = self.meanings.write().unwrap_or_else(|e| e.into_inner());
        loop {
            let c = LocationCode(Self::FRESH_TOP - self.next_fresh);
            self.next_fresh += 1;
            if let std::collections::hash_map::Entry::Vacant(v) = m.entry(c) {
                v.insert(locs);
                return c;
            }
        }
    }

    /// The merged code for `code` meaning `locs`; true when it had to be remapped.
    pub fn map(&mut self, code: LocationCode, locs: &LocationList) -> (LocationCode, bool) {
        let known = self
            .meanings
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&code)
            .cloned();
        match known {
            None => {
                self.meanings
                    .write()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(code, locs.clone());
                (code, false)
            }
            Some(l) if l == *locs => (code, false),
            Some(_) => {
                if let Some(&c) = self.alternatives.get(&(code, locs.clone())) {
                    return (c, true);
                }
                let c = self.fresh(locs.clone());
                self.alternatives.insert((code, locs.clone()), c);
                (c, true)
            }
        }
    }
}

/// One write. An allocation's backtrace is the previous allocation's (of the same output
/// domain) first `common` frames, then `new` frames from the batch's frame list.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Cmd {
    Alloc {
        time: u64,
        domain: u16,
        length: u64,
        nsamples: u64,
        source: AllocSource,
        common: u32,
        new: u32,
        id: u64,
        /// index of the input it comes from (for reporting cut backtraces)
        input: u32,
    },
    Promote {
        time: u64,
        domain: u16,
        id: u64,
    },
    Collect {
        time: u64,
        domain: u16,
        id: u64,
    },
}

#[derive(Default)]
pub(crate) struct CmdBatch {
    pub cmds: Vec<Cmd>,
    pub frames: Vec<LocationCode>,
}

struct Chan {
    q: Mutex<(VecDeque<CmdBatch>, bool)>,
    /// signalled when a batch is pushed or the sender closes
    ready: Condvar,
    /// signalled when a batch is taken
    room: Condvar,
    free: Mutex<Vec<CmdBatch>>,
    abort: AtomicBool,
}

/// Batches in flight between the two threads.
const DEPTH: usize = 4;
/// Commands per batch.
pub(crate) const BATCH: usize = 8192;

/// What the writer thread hands back: the output, its counts, and per input the number of
/// backtraces too deep for one packet that had to be cut.
pub(crate) type WriterDone<W> = (W, WriteStats, Vec<u64>);

/// The sending end, on the merging thread.
pub(crate) struct WriterThread<W: Write + Send + 'static> {
    chan: Arc<Chan>,
    handle: Option<std::thread::JoinHandle<Result<WriterDone<W>>>>,
}

impl<W: Write + Send + 'static> WriterThread<W> {
    /// Run `w` on its own thread, resolving codes through `meanings`.
    pub fn start(
        mut w: Writer<W>,
        meanings: Arc<RwLock<IntMap<LocationCode, LocationList>>>,
    ) -> Result<Self> {
        let chan = Arc::new(Chan {
            q: Mutex::new((VecDeque::new(), false)),
            ready: Condvar::new(),
            room: Condvar::new(),
            free: Mutex::new(Vec::new()),
            abort: AtomicBool::new(false),
        });
        let ch = chan.clone();
        let handle = std::thread::Builder::new()
            .name("memtrace-merge-write".into())
            .spawn(move || {
                let mut cuts = Vec::new();
                if let Err(e) = write_all(&ch, &mut w, &meanings, &mut cuts) {
                    ch.abort.store(true, Ordering::Relaxed);
                    ch.room.notify_all();
                    return Err(e);
                }
                let (out, stats) = w.finish_with_stats()?;
                Ok((out, stats, cuts))
            })
            .map_err(|e| Error::Usage(format!("cannot start the writing thread: {e}")))?;
        Ok(WriterThread {
            chan,
            handle: Some(handle),
        })
    }

    /// An empty batch to fill.
    pub fn batch(&self) -> CmdBatch {
        self.chan
            .free
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop()
            .unwrap_or_else(|| CmdBatch {
                cmds: Vec::with_capacity(BATCH),
                frames: Vec::with_capacity(BATCH * 8),
            })
    }

    /// Hand a batch to the writer (waiting while it is behind). False: the writer failed;
    /// [`WriterThread::finish`] gives its error.
    pub fn send(&self, b: CmdBatch) -> bool {
        let mut g = self.chan.q.lock().unwrap_or_else(|e| e.into_inner());
        while g.0.len() >= DEPTH {
            if self.chan.abort.load(Ordering::Relaxed)
                || self.handle.as_ref().is_none_or(|h| h.is_finished())
            {
                return false;
            }
            g = self
                .chan
                .room
                .wait_timeout(g, std::time::Duration::from_millis(50))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        g.0.push_back(b);
        self.chan.ready.notify_one();
        !self.chan.abort.load(Ordering::Relaxed)
    }

    /// Close the stream and wait for the writer: its output and counts, or its error.
    pub fn finish(mut self) -> Result<WriterDone<W>> {
        self.close();
        let h = self.handle.take().expect("finish once");
        match h.join() {
            Ok(r) => r,
            Err(p) => Err(Error::Write(format!(
                "internal error: the writing thread panicked: {}",
                p.downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| p.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "unknown panic".into())
            ))),
        }
    }

    fn close(&self) {
        let mut g = self.chan.q.lock().unwrap_or_else(|e| e.into_inner());
        g.1 = true;
        self.chan.ready.notify_one();
    }
}

impl<W: Write + Send + 'static> Drop for WriterThread<W> {
    fn drop(&mut self) {
        if let Some(h) = self.handle.take() {
            self.chan.abort.store(true, Ordering::Relaxed);
            self.close();
            let _ = h.join();
        }
    }
}

fn write_all<W: Write>(
    ch: &Chan,
    w: &mut Writer<W>,
    meanings: &RwLock<IntMap<LocationCode, LocationList>>,
    cuts: &mut Vec<u64>,
) -> Result<()> {
    loop {
        let b = {
            let mut g = ch.q.lock().unwrap_or_else(|e| e.into_inner());
            loop {
                if ch.abort.load(Ordering::Relaxed) {
                    return Err(Error::Usage("merge stopped".into()));
                }
                if let Some(b) = g.0.pop_front() {
                    break b;
                }
                if g.1 {
                    return Ok(());
                }
                g = ch.ready.wait(g).unwrap_or_else(|e| e.into_inner());
            }
        };
        ch.room.notify_one();
        let mut fp = 0usize;
        for c in &b.cmds {
            match *c {
                Cmd::Alloc {
                    time,
                    domain,
                    length,
                    nsamples,
                    source,
                    common,
                    new,
                    id,
                    input,
                } => {
                    let cut_before = w.stats().cut_backtraces;
                    let frames = &b.frames[fp..fp + new as usize];
                    fp += new as usize;
                    let got = w.put_alloc_delta(
                        Timestamp(time),
                        DomainId(domain),
                        length,
                        nsamples,
                        source,
                        common as usize,
                        frames,
                        |code| {
                            meanings
                                .read()
                                .unwrap_or_else(|e| e.into_inner())
                                .get(&code)
                                .cloned()
                        },
                    )?;
                    if w.stats().cut_backtraces != cut_before {
                        let k = input as usize;
                        if cuts.len() <= k {
                            cuts.resize(k + 1, 0);
                        }
                        cuts[k] += 1;
                    }
                    if got != ObjId(id) {
                        return Err(Error::Write(format!(
                            "internal error: allocation planned as id {id} written as {}",
                            got.0
                        )));
                    }
                }
                Cmd::Promote { time, domain, id } => {
                    w.put_promote(Timestamp(time), DomainId(domain), ObjId(id))?
                }
                Cmd::Collect { time, domain, id } => {
                    w.put_collect(Timestamp(time), DomainId(domain), ObjId(id))?
                }
            }
        }
        let mut b = b;
        b.cmds.clear();
        b.frames.clear();
        let mut f = ch.free.lock().unwrap_or_else(|e| e.into_inner());
        if f.len() < DEPTH + 2 {
            f.push(b);
        }
    }
}
