//! A reader that holds a window of each packet reads what one that holds packets whole
//! reads: the same events, warnings and errors, on every trace of `tests/data` and on
//! damaged copies of them.

use super::*;
use crate::format::event::{AllocSource, LocationCode};
use std::path::PathBuf;

/// Every event as text, then how reading ended and the warnings; with a [`Cramp`], a sink
/// with a room for frames.
#[derive(Default)]
struct Record(
    Vec<String>,
    Vec<(LocationCode, LocationList)>,
    Option<Cramp>,
);

/// Room for `room` frames a batch: a sink that ends a batch rather than take an
/// allocation whose frames would not fit (unless the batch is empty).
#[derive(Default)]
struct Cramp {
    room: usize,
    frames: usize,
    events: usize,
}

impl EventSink for Record {
    fn location(&mut self, code: LocationCode, locs: &LocationList) {
        self.0.push(format!("loc {:x} {}", code.0, locs.len()));
        self.1.push((code, locs.clone()));
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
        if let Some(c) = &mut self.2 {
            c.frames += backtrace.len();
            c.events += 1;
        }
        // (the backtrace by a hash of its frames: formatting each would take most of the time)
        let bt = backtrace.iter().fold(0xcbf29ce484222325u64, |h, c| {
            (h ^ c.0).wrapping_mul(0x100000001b3)
        });
        self.0.push(format!(
            "alloc {time} {id} {length} {nsamples} {source:?} {common_prefix} {} {bt:x}",
            backtrace.len()
        ));
    }
    fn promote(&mut self, time: u64, id: u64) {
        self.2.iter_mut().for_each(|c| c.events += 1);
        self.0.push(format!("promote {time} {id}"));
    }
    fn collect(&mut self, time: u64, id: u64) {
        self.2.iter_mut().for_each(|c| c.events += 1);
        self.0.push(format!("collect {time} {id}"));
    }
    fn cramped(&self) -> bool {
        self.2.is_some()
    }
    fn room_for(&self, _common_prefix: u64, len: usize) -> bool {
        self.2
            .as_ref()
            .is_none_or(|c| c.events == 0 || c.frames + len <= c.room)
    }
}

fn read(bytes: &[u8], window: Option<usize>, domain: Option<u16>) -> Vec<String> {
    read_cramped(bytes, window, domain, None, false).0
}

/// [`read`], into a sink with room for `room` frames a batch (when given; every third
/// batch without a room when `now_and_then`); and how many batches it ended early,
/// holding an allocation back.
fn read_cramped(
    bytes: &[u8],
    window: Option<usize>,
    domain: Option<u16>,
    room: Option<usize>,
    now_and_then: bool,
) -> (Vec<String>, usize) {
    let r = match window {
        Some(w) => Reader::windowed(bytes, "t", w, bytes.len() as u64, Default::default()),
        None => Reader::new(bytes, "t"),
    };
    let mut r = match r {
        Ok(r) => r,
        Err(e) => return (vec![format!("open: {e}")], 0),
    };
    r.set_domain_filter(domain);
    let mut rec = Record::default();
    let (mut held, mut calls) = (0, 0);
    let end = loop {
        calls += 1;
        rec.2 = room
            .filter(|_| !now_and_then || calls % 3 != 0)
            .map(|room| Cramp {
                room,
                ..Default::default()
            });
        let more = r.read_events(&mut rec, 7);
        // (a batch the sink ended before its 7 events held one back)
        held += matches!((&more, &rec.2), (Ok(true), Some(c)) if c.events < 7) as usize;
        match more {
            Ok(true) => {}
            Ok(false) => break "end".to_string(),
            Err(e) => break format!("error: {e}"),
        }
    };
    rec.0.push(end);
    rec.0
        .extend(r.take_warnings().iter().map(|w| w.to_string()));
    rec.0.push(format!("{:?}", r.stats()));
    (rec.0, held)
}

fn traces() -> Vec<PathBuf> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data");
    let mut out = Vec::new();
    let mut dirs = vec![root];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "ctf") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// The two records are equal; else, the first difference.
fn same(a: &[String], b: &[String], what: &str) {
    let cut = |s: &String| s.chars().take(300).collect::<String>();
    if let Some(i) = (0..a.len().max(b.len())).find(|&i| a.get(i) != b.get(i)) {
        panic!(
            "{what}: entry {i} of {} and {}: {:?} against {:?}",
            a.len(),
            b.len(),
            a.get(i).map(cut),
            b.get(i).map(cut)
        );
    }
}

/// Packets of more than `n` bytes, by their headers' sizes.
fn larger_packets(b: &[u8], n: usize) -> usize {
    let (mut at, mut count) = (0, 0);
    while let Some(h) = b.get(at + 4..at + 8) {
        let size = u32::from_le_bytes([h[0], h[1], h[2], h[3]]) as usize / 8;
        if size == 0 {
            break;
        }
        count += (size > n) as usize;
        at += size;
    }
    count
}

#[test]
fn a_window_reads_what_whole_packets_read() {
    let traces = traces();
    assert!(traces.len() >= 10, "the traces of tests/data");
    let mut windowed_packets = 0;
    for p in &traces {
        let bytes = std::fs::read(p).unwrap();
        let whole = read(&bytes, None, None);
        // (a window smaller than most events, on the smaller traces)
        let windows: &[usize] = if bytes.len() < 600_000 {
            &[256, 4096]
        } else {
            &[4096]
        };
        for &w in windows {
            let what = format!("{} window {w}", p.display());
            same(&read(&bytes, Some(w), None), &whole, &what);
        }
        // (a format-3 trace read one domain at a time skips the other domains' packets)
        if bytes.get(28..30) == Some(&[3, 0]) {
            for d in 0..3 {
                let whole = read(&bytes, None, Some(d));
                let what = format!("{} domain {d}", p.display());
                same(&read(&bytes, Some(1000), Some(d)), &whole, &what);
            }
        }
        windowed_packets += larger_packets(&bytes, 4096);
    }
    assert!(
        windowed_packets > 10,
        "packets larger than a window were read"
    );
}

/// An allocation a sink has no room for is handed over first by the next call: a reader
/// whose batches end before deep backtraces reads the same events, in the same order,
/// with the same counts, as one that never holds one back.
#[test]
fn an_allocation_held_back_comes_first_next_time() {
    let mut held = 0;
    for p in traces() {
        let bytes = std::fs::read(&p).unwrap();
        let whole = read(&bytes, None, None);
        // (and through a window, as the readers of many streams read; and into a sink
        // that is not always cramped: one without a room takes what was held back too)
        for (window, now_and_then) in [(None, false), (Some(4096), false), (None, true)] {
            let (got, n) = read_cramped(&bytes, window, None, Some(64), now_and_then);
            let what = format!("{} held back, window {window:?}", p.display());
            same(&got, &whole, &what);
            held += n;
        }
    }
    assert!(held > 100, "allocations held back: {held}");
}

/// Damaged copies: cut short anywhere, or a byte changed (the window then meets events
/// whose fields lie, and files shorter than their packets say), also into a sink that
/// holds allocations back.
#[test]
fn a_window_reads_damaged_traces_alike() {
    let bytes = std::fs::read(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/fork/child-1.ctf"),
    )
    .unwrap();
    let mut x = 0x2545f4914f6cdd1du64;
    for k in 0..200 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let mut b = bytes.clone();
        if k % 3 == 0 {
            b.truncate((x as usize) % bytes.len());
        } else {
            let at = (x as usize >> 8) % b.len();
            b[at] ^= (x as u8) | 1;
        }
        let whole = read(&b, None, None);
        same(&read(&b, Some(512), None), &whole, &format!("copy {k}"));
        // (a sink that holds allocations back meets the damage alike)
        let (held, _) = read_cramped(&b, Some(512), None, Some(64), false);
        same(&held, &whole, &format!("copy {k}, held back"));
    }
}

/// Readers sharing a pool hold one copy of each location list: of one trace read twice,
/// every list is the other reader's, and reading is otherwise unchanged.
#[test]
fn readers_sharing_a_pool_share_their_location_lists() {
    let path = traces()
        .into_iter()
        .find(|p| p.ends_with("fork/child-1.ctf"));
    let bytes = std::fs::read(path.expect("tests/data/fork/child-1.ctf")).unwrap();
    let pool = Arc::new(LocationPool::default());
    let read_in = |pool: &Arc<LocationPool>| {
        let mut r =
            Reader::windowed(&bytes[..], "t", 1024, bytes.len() as u64, pool.clone()).unwrap();
        let mut rec = Record::default();
        while r.read_events(&mut rec, 64).unwrap() {}
        (r.locations().clone(), rec.0)
    };
    let (a, ra) = read_in(&pool);
    let (b, rb) = read_in(&pool);
    let (c, rc) = read_in(&Default::default());
    assert!(a.len() >= 20, "{} codes", a.len());
    same(&ra, &rc, "pooled against not");
    same(&rb, &rc, "pooled again against not");
    for (code, l) in &a {
        assert!(Arc::ptr_eq(l, &b[code]), "code {:x}: one list", code.0);
        assert!(
            !Arc::ptr_eq(l, &c[code]),
            "code {:x}: a reader of its own",
            code.0
        );
        assert_eq!(**l, *c[code]);
    }
}

/// Plain (not windowed) readers share a pool too, and so does a clean read (a survey):
/// the lists it hands out and keeps are the pool's.
#[test]
fn pooled_and_clean_reads_share_their_location_lists() {
    let path = traces()
        .into_iter()
        .find(|p| p.ends_with("fork/child-1.ctf"));
    let bytes = std::fs::read(path.expect("tests/data/fork/child-1.ctf")).unwrap();
    let pool = Arc::new(LocationPool::default());
    let mut plain = Reader::pooled(&bytes[..], "t", 4096, pool.clone()).unwrap();
    let mut rec = Record::default();
    while plain.read_events(&mut rec, 64).unwrap() {}
    let mut clean = Reader::pooled(&bytes[..], "t", 4096, pool.clone()).unwrap();
    let mut lists = Record::default();
    assert_eq!(clean.read_clean(&mut lists).unwrap(), None);
    let mut alone = Reader::new(&bytes[..], "t").unwrap();
    let mut rc = Record::default();
    while alone.read_events(&mut rc, 64).unwrap() {}
    same(&rec.0, &rc.0, "pooled against not");
    same(&lists.0, &rc.0, "clean against not");
    let table = plain.locations();
    assert!(lists.1.len() >= 20, "{} codes", lists.1.len());
    for (code, l) in &lists.1 {
        assert!(Arc::ptr_eq(l, &table[code]), "code {:x}: one list", code.0);
        assert!(Arc::ptr_eq(&clean.locations()[code], &table[code]));
        assert!(!Arc::ptr_eq(l, &alone.locations()[code]));
    }
}
