//! Bad input, handled: a structure-aware mutation test over real traces (bit flips,
//! truncations, duplicated/swapped/deleted packets, size, version, pid, time and id fields),
//! each case run through `check`, `dump`, `summary`, the analysis and `merge` (library, and a
//! sample through the command line under a memory cap); damaged traces as killed workers leave them; and a
//! merge that fails, runs out of disk or is interrupted leaves nothing behind.

#[path = "support/splitmix.rs"]
mod splitmix;
use memtrace_merge::analysis::{analyze, AnalysisOptions};
use memtrace_merge::tools::check::{check_file, CheckOptions};
use memtrace_merge::tools::compare::{compare, CompareOptions};
use memtrace_merge::tools::{dump, summary};
use memtrace_merge::{merge, MergeOptions, MergeReport};
use memtrace_merge::{Error, Reader};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{mpsc, RwLock};
use std::time::{Duration, Instant};

/// Merges take it shared; a test that counts the process's open files takes it alone.
static MERGE_LOCK: RwLock<()> = RwLock::new(());

fn merge_lock() -> std::sync::RwLockReadGuard<'static, ()> {
    MERGE_LOCK.read().unwrap_or_else(|e| e.into_inner())
}

fn data(p: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(p)
}

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_memtrace-merge")
}

/// A scratch directory, in memory when /dev/shm is there (merges sync their output).
fn scratch() -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        if let Ok(d) = tempfile::Builder::new()
            .prefix("mtm-robust")
            .tempdir_in(shm)
        {
            return d;
        }
    }
    tempfile::tempdir().unwrap()
}

// ---------------------------------------------------------------------------------------------
// Packets of a trace (see src/packet.rs): magic u32, size in bits u32, time_begin u64,
// time_end u64, flush_duration u32, version u16, pid u64, [v3: domain u16], verifier
// (index u16, prediction u16, value u64), alloc_id_begin u64, alloc_id_end u64.

const SIZE: usize = 4;
const TIME_BEGIN: usize = 8;
const TIME_END: usize = 16;
const VERSION: usize = 28;
const PID: usize = 30;
const DOMAIN: usize = 38;

#[derive(Clone, Copy, Debug)]
struct Pkt {
    off: usize,
    size: usize,
    /// header size (66 or 68)
    hs: usize,
}

impl Pkt {
    fn end(&self) -> usize {
        self.off + self.size
    }
    /// offset of alloc_id_begin (alloc_id_end follows)
    fn ids(&self) -> usize {
        self.off + self.hs - 16
    }
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes(b[at..at + 2].try_into().unwrap())
}
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}
fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}
fn set_u16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_le_bytes())
}
fn set_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes())
}
fn set_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes())
}

/// The packets of a well-formed trace, in file order.
fn packets(b: &[u8]) -> Vec<Pkt> {
    let mut out = Vec::new();
    let mut off = 0;
    while off + 68 <= b.len() {
        assert_eq!(u32_at(b, off), 0xc1fc_1fc1, "magic at {off}");
        let size = u32_at(b, off + SIZE) as usize / 8;
        let hs = if u16_at(b, off + VERSION) >= 3 {
            68
        } else {
            66
        };
        assert!(size >= hs && off + size <= b.len(), "packet at {off}");
        out.push(Pkt { off, size, hs });
        off += size;
    }
    assert_eq!(off, b.len(), "trailing bytes");
    out
}

/// The first packets of a trace, as many as fit in `max` bytes (at least two).
fn prefix(b: &[u8], max: usize) -> Vec<u8> {
    let p = packets(b);
    let end = p
        .iter()
        .map(|p| p.end())
        .take_while(|&e| e <= max)
        .last()
        .unwrap_or(0)
        .max(p[1.min(p.len() - 1)].end());
    b[..end].to_vec()
}

// ---------------------------------------------------------------------------------------------
// Deterministic random numbers (splitmix64).

struct Rng(splitmix::SplitMix);

impl Rng {
    fn next(&mut self) -> u64 {
        // SplitMix64: the library's own generator
        self.0.next_u64()
    }
    /// Uniform in 0..n (n > 0).
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
    /// Uniform in lo..hi (empty range: lo).
    fn range(&mut self, lo: usize, hi: usize) -> usize {
        if hi <= lo {
            lo
        } else {
            lo + self.below(hi - lo)
        }
    }
    fn pick<'a, T>(&mut self, v: &'a [T]) -> &'a T {
        &v[self.below(v.len())]
    }
}

// ---------------------------------------------------------------------------------------------
// Mutations.

const KINDS: usize = 23;

/// Apply mutation `kind` to `b` (whose packets, before any mutation, are `p`).
fn mutate(kind: usize, rng: &mut Rng, b: &mut Vec<u8>, p: &[Pkt]) -> String {
    let n = p.len();
    let any = |rng: &mut Rng| *rng.pick(p);
    // an event packet when there is one
    let event_pkt = |rng: &mut Rng| if n > 1 { p[rng.range(1, n)] } else { p[0] };
    match kind {
        0 => {
            let k = rng.range(1, 5);
            for _ in 0..k {
                let at = rng.below(b.len());
                b[at] ^= 1 << rng.below(8);
            }
            format!("{k} random bit flips")
        }
        1 => {
            let q = any(rng);
            let at = q.off + rng.below(q.hs);
            b[at] ^= 1 << rng.below(8);
            format!(
                "bit flip in the header of the packet at {} (byte {at})",
                q.off
            )
        }
        2 => {
            let at = rng.below(b.len());
            b.truncate(at);
            format!("cut at byte {at}")
        }
        3 => {
            let q = any(rng);
            let at = q.off + rng.range(1, q.hs);
            b.truncate(at);
            format!(
                "cut inside the header of the packet at {} (byte {at})",
                q.off
            )
        }
        4 => {
            let q = any(rng);
            let at = q.off + rng.range(q.hs + 1, q.size);
            b.truncate(at);
            format!("cut inside the body of the packet at {} (byte {at})", q.off)
        }
        5 => {
            let at = if rng.below(8) == 0 { 0 } else { any(rng).end() };
            b.truncate(at);
            format!("cut at the packet boundary {at}")
        }
        6 => {
            let q = any(rng);
            let pkt = b[q.off..q.end()].to_vec();
            let at = if rng.below(2) == 0 {
                q.end()
            } else {
                any(rng).off
            };
            b.splice(at..at, pkt);
            format!("packet at {} duplicated at {at}", q.off)
        }
        7 => {
            let (x, y) = (event_pkt(rng), event_pkt(rng));
            let (x, y) = if x.off <= y.off { (x, y) } else { (y, x) };
            if x.off == y.off {
                return "swap of a packet with itself".into();
            }
            let mut v = b[..x.off].to_vec();
            v.extend_from_slice(&b[y.off..y.end()]);
            v.extend_from_slice(&b[x.end()..y.off]);
            v.extend_from_slice(&b[x.off..x.end()]);
            v.extend_from_slice(&b[y.end()..]);
            *b = v;
            format!("packets at {} and {} swapped", x.off, y.off)
        }
        8 => {
            let q = any(rng);
            b.drain(q.off..q.end());
            format!("packet at {} deleted", q.off)
        }
        9 => {
            let q = any(rng);
            let v = rng.next() as u32;
            set_u32(b, q.off + SIZE, v);
            format!("size of the packet at {} set to {v} bits", q.off)
        }
        10 => {
            let q = any(rng);
            let v = *rng.pick(&[0u32, 8, (q.hs as u32) * 8, (q.hs as u32 - 1) * 8, 7, 1]);
            set_u32(b, q.off + SIZE, v);
            format!("size of the packet at {} set to {v} bits", q.off)
        }
        11 => {
            let q = any(rng);
            let past = (b.len() - q.off + rng.range(1, 1 << 16)) as u32 * 8;
            let v = *rng.pick(&[past, 0xffff_fff8, 0x7fff_fff8, 0x1000_0000, u32::MAX]);
            set_u32(b, q.off + SIZE, v);
            format!("size of the packet at {} set past the end: {v} bits", q.off)
        }
        12 => {
            let q = any(rng);
            let d = rng.range(1, 65) as i64 * if rng.below(2) == 0 { 1 } else { -1 };
            let v = (q.size as i64 + d).max(0) as u32 * 8;
            set_u32(b, q.off + SIZE, v);
            format!("size of the packet at {} moved by {d} bytes", q.off)
        }
        13 => {
            let q = any(rng);
            let v = *rng.pick(&[0u16, 1, 2, 3, 4, 5, 0xff, 0xffff]);
            set_u16(b, q.off + VERSION, v);
            format!("version of the packet at {} set to {v}", q.off)
        }
        14 => {
            let q = any(rng);
            let old = u64_at(b, q.off + PID);
            let r = rng.next();
            let v = *rng.pick(&[old + 1, 0, u64::MAX, r]);
            set_u64(b, q.off + PID, v);
            format!("pid of the packet at {} set to {v}", q.off)
        }
        15 => {
            let q = any(rng);
            let (tb, te) = (u64_at(b, q.off + TIME_BEGIN), u64_at(b, q.off + TIME_END));
            let (nb, ne) = match rng.below(5) {
                0 => (te, tb),
                1 => (tb, u64::MAX),
                2 => (0, te),
                3 => (tb.wrapping_add(1 << 25), te.wrapping_add(1 << 25)),
                _ => (rng.next(), rng.next()),
            };
            set_u64(b, q.off + TIME_BEGIN, nb);
            set_u64(b, q.off + TIME_END, ne);
            format!("times of the packet at {} set to {nb}..{ne}", q.off)
        }
        16 => {
            let q = any(rng);
            let at = q.ids() + 8 * rng.below(2);
            let old = u64_at(b, at);
            let r = rng.next();
            let v = *rng.pick(&[0, old + 1, old.saturating_sub(1), u64::MAX, r]);
            set_u64(b, at, v);
            format!("an alloc id of the packet at {} set to {v}", q.off)
        }
        17 => {
            let q = event_pkt(rng);
            let at = q.off + rng.range(q.hs, q.size);
            let len = rng.range(1, 64).min(b.len() - at);
            let zero = rng.below(2) == 0;
            for x in &mut b[at..at + len] {
                *x = if zero { 0 } else { rng.next() as u8 };
            }
            format!(
                "{len} bytes at {at} {}",
                if zero { "zeroed" } else { "randomized" }
            )
        }
        18 => {
            let at = rng.below(b.len());
            let v = *rng.pick(&[0u8, 1, 0x7f, 0x80, 0xfd, 0xfe, 0xff]);
            b[at] = v;
            format!("byte {at} set to {v}")
        }
        19 => {
            // a packet with no events, its fields continuing the previous packet's
            let q = event_pkt(rng);
            let mut h = b[q.off..q.off + q.hs].to_vec();
            set_u32(&mut h, SIZE, q.hs as u32 * 8);
            let tb = u64_at(&h, TIME_BEGIN);
            set_u64(&mut h, TIME_END, tb);
            let ib = u64_at(&h, q.hs - 16);
            set_u64(&mut h, q.hs - 8, ib);
            b.splice(q.off..q.off, h);
            format!("an empty packet inserted at {}", q.off)
        }
        20 => {
            let len = rng.range(1, 3000);
            let zero = rng.below(2) == 0;
            for _ in 0..len {
                let x = if zero { 0 } else { rng.next() as u8 };
                b.push(x);
            }
            format!(
                "{len} {} bytes appended",
                if zero { "zero" } else { "random" }
            )
        }
        21 => {
            let q = any(rng);
            if q.hs == 68 {
                let r = rng.next() as u16;
                let v = *rng.pick(&[1u16, 2, 7, 0xffff, r]);
                set_u16(b, q.off + DOMAIN, v);
                format!("domain of the packet at {} set to {v}", q.off)
            } else {
                let at = q.off + 38 + rng.below(12);
                b[at] = rng.next() as u8;
                format!("verifier byte {at} randomized")
            }
        }
        _ => {
            let k = rng.range(2, 4);
            let mut what = Vec::new();
            for _ in 0..k {
                if b.is_empty() {
                    break;
                }
                // structure-aware kinds need the packets of the current bytes: use the
                // ones that work on raw bytes after the first change
                let kind = if what.is_empty() {
                    rng.below(KINDS - 1)
                } else {
                    *rng.pick(&[0, 2, 18, 20])
                };
                what.push(mutate(kind, rng, b, p));
            }
            what.join(", then ")
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Running one case.

/// A Malformed error must name the file and an offset within it.
fn check_error(e: &Error, name: &str, len: u64, what: &str) -> Result<(), String> {
    match e {
        Error::Malformed { at, .. } => {
            let msg = e.to_string();
            if at.file != name || at.offset > len || !msg.contains(name) || !msg.contains("byte") {
                return Err(format!(
                    "{what}: error does not name the file and an offset in it: {msg}"
                ));
            }
            Ok(())
        }
        Error::Io { .. } => Err(format!("{what}: I/O error on a readable file: {e}")),
        _ => Err(format!("{what}: unexpected error kind: {e:?}")),
    }
}

/// check, dump, summary and merge of `file` (whose bytes are `bytes`), with `clean` as the
/// second input of the merge. Returns the number of operations that ended in an error.
fn run_case(dir: &Path, file: &Path, clean: &Path, skip_bad: bool) -> Result<u32, String> {
    let name = file.display().to_string();
    let len = std::fs::metadata(file).unwrap().len();
    let mut errors = 0;
    // check
    let rep = check_file(file, &CheckOptions::default()).map_err(|e| format!("check: {e}"))?;
    for p in &rep.problems {
        if p.at.file != name || p.at.offset > len {
            return Err(format!("check: problem without file and offset: {p}"));
        }
    }
    if rep.reader_error && rep.problems.is_empty() {
        return Err("check: reader error without a problem".into());
    }
    errors += !rep.is_valid() as u32;
    // dump
    match Reader::open(file) {
        Ok(mut r) => {
            if let Err(e) = dump::dump(&mut r, &mut std::io::sink(), |_| {}) {
                check_error(&e, &name, len, "dump")?;
                errors += 1;
            }
        }
        Err(e) => {
            check_error(&e, &name, len, "open")?;
            errors += 1;
        }
    }
    // summary (`info`)
    if let Err(e) = summary::summarize_file(file) {
        check_error(&e, &name, len, "summary")?;
        errors += 1;
    }
    // the analysis of it and a clean input, as `top` takes them: figures that hold
    // together, or an error naming the input (never a panic on a decoding thread)
    let inputs = [file.to_path_buf(), clean.to_path_buf()];
    match analyze(&inputs, &AnalysisOptions::default()) {
        Ok(a) => {
            let own = a.processes().iter().map(|p| p.peak_bytes).max();
            if own > Some(a.total().peak_bytes) {
                return Err(format!(
                    "analysis: a process's peak {own:?} above the run's {}",
                    a.total().peak_bytes
                ));
            }
        }
        Err(Error::NothingToAnalyse(_)) => {}
        Err(e @ Error::Internal(_)) => return Err(format!("analysis: {e}")),
        Err(e) => {
            let msg = e.to_string();
            let fname = file.file_name().unwrap().to_string_lossy();
            if !msg.contains(&*fname) {
                return Err(format!("analysis: error does not name the input: {msg}"));
            }
            if let Error::Malformed { .. } = e {
                check_error(&e, &name, len, "analysis")?;
            }
            errors += 1;
        }
    }
    // merge with a clean input
    let out = dir.join("merged.ctf");
    let opts = MergeOptions {
        skip_bad_inputs: skip_bad,
        ..Default::default()
    };
    let res = {
        let _g = merge_lock();
        merge(&[file.to_path_buf(), clean.to_path_buf()], &out, &opts)
    };
    match res {
        Ok(report) => {
            let rep = check_file(&out, &CheckOptions::default())
                .map_err(|e| format!("merged output unreadable: {e}"))?;
            if !rep.is_valid() {
                return Err(format!("merged output invalid: {:?}", rep.problems));
            }
            if rep.allocs != report.allocs {
                return Err(format!(
                    "merge reports {} allocations, the output holds {}",
                    report.allocs, rep.allocs
                ));
            }
            std::fs::remove_file(&out).unwrap();
        }
        Err(e) => {
            errors += 1;
            let msg = e.to_string();
            let fname = file.file_name().unwrap().to_string_lossy();
            if !msg.contains(&*fname) {
                return Err(format!("merge: error does not name the input: {msg}"));
            }
            if let Error::Malformed { .. } = e {
                check_error(&e, &name, len, "merge")?;
            }
            if out.exists() {
                return Err(format!("merge failed ({msg}) but left an output"));
            }
        }
    }
    let left: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".tmp-"))
        .collect();
    if !left.is_empty() {
        return Err(format!("temporary files left behind: {left:?}"));
    }
    Ok(errors)
}

/// Sources of the mutation test: small real traces of formats 1-3, cut at a packet
/// boundary to keep each case fast.
fn sources() -> Vec<(String, Vec<u8>)> {
    [
        ("rates/slow.ctf", 1 << 20),
        ("v3/bytecode-location-overflow.ctf", 1 << 20),
        ("bytecode-location-overflow.ctf", 1 << 20),
        ("fork/child-2.ctf", 60_000),
        ("v3/multidomain.ctf", 30_000),
        ("external.ctf", 70_000),
        ("v3/single.ctf", 50_000),
        ("long.ctf", 60_000),
        ("fork/child-4.ctf", 50_000),
    ]
    .iter()
    .map(|(p, max)| {
        let b = std::fs::read(data(p)).unwrap();
        (p.to_string(), prefix(&b, *max))
    })
    .collect()
}

/// The clean second input of the merges: `rates/slow.ctf` with its sampling rate raised to
/// 1, so that the merge thins it rather than the mutated input (whose every allocation
/// then goes through the writer).
fn write_clean(path: &Path) {
    let mut b = std::fs::read(data("rates/slow.ctf")).unwrap();
    // the info packet: 66-byte header, 4-byte event header, then the rate (f64)
    assert_eq!(f64::from_bits(u64_at(&b, 70)), 1e-5);
    set_u64(&mut b, 70, 1f64.to_bits());
    std::fs::write(path, b).unwrap();
}

struct Case {
    source: usize,
    kind: usize,
    what: String,
    bytes: Vec<u8>,
}

/// `per_source` deterministic cases per source, kinds taken in turn.
fn cases(per_source: usize) -> (Vec<(String, Vec<u8>)>, Vec<Case>) {
    let srcs = sources();
    let mut rng = Rng(splitmix::SplitMix::from_state(0x6d65_6d74_7261_6365));
    let mut out = Vec::new();
    for (si, (_, b)) in srcs.iter().enumerate() {
        let p = packets(b);
        for i in 0..per_source {
            let kind = (i + si) % KINDS;
            let mut m = b.clone();
            let what = mutate(kind, &mut rng, &mut m, &p);
            out.push(Case {
                source: si,
                kind,
                what,
                bytes: m,
            });
        }
    }
    (srcs, out)
}

#[test]
fn mutated_traces_end_in_a_clean_result_or_a_clean_error() {
    let started = Instant::now();
    let (srcs, cases) = cases(330);
    let dir = scratch();
    let clean = dir.path().join("clean.ctf");
    write_clean(&clean);
    let workers = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(2)
        .clamp(1, 4);
    let cases = std::sync::Arc::new(cases);
    let (tx, rx) = mpsc::channel::<(usize, Result<u32, String>, Duration)>();
    let mut handles = Vec::new();
    for w in 0..workers {
        let cases = cases.clone();
        let tx = tx.clone();
        let wdir = dir.path().join(format!("w{w}"));
        let clean = clean.clone();
        std::fs::create_dir(&wdir).unwrap();
        handles.push(std::thread::spawn(move || {
            let file = wdir.join("mutated.ctf");
            for i in (w..cases.len()).step_by(workers) {
                std::fs::write(&file, &cases[i].bytes).unwrap();
                let t = Instant::now();
                let r = catch_unwind(AssertUnwindSafe(|| {
                    run_case(&wdir, &file, &clean, i % 3 == 2)
                }))
                .unwrap_or_else(|p| {
                    Err(format!(
                        "PANIC: {}",
                        p.downcast_ref::<String>()
                            .cloned()
                            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                            .unwrap_or_default()
                    ))
                });
                if tx.send((i, r, t.elapsed())).is_err() {
                    return;
                }
            }
        }));
    }
    drop(tx);
    let mut failures = Vec::new();
    let mut done = 0usize;
    let mut errors = 0u64;
    let mut per_kind = [0usize; KINDS];
    let mut slowest = Duration::ZERO;
    loop {
        match rx.recv_timeout(Duration::from_secs(20)) {
            Ok((i, r, took)) => {
                done += 1;
                slowest = slowest.max(took);
                let c = &cases[i];
                per_kind[c.kind] += 1;
                let r = r.and_then(|n| {
                    if took > Duration::from_secs(2) {
                        Err(format!("took {took:?}"))
                    } else {
                        Ok(n)
                    }
                });
                match r {
                    Ok(n) => errors += n as u64,
                    Err(e) => {
                        failures.push(format!("case {i} ({}: {}): {e}", srcs[c.source].0, c.what))
                    }
                }
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                panic!(
                    "a case has run for 20 s (hang): {done} of {} done",
                    cases.len()
                )
            }
        }
    }
    for h in handles {
        h.join().unwrap();
    }
    // every case's bytes, to reproduce a failure: MTM_SAVE_FAILED=DIR
    if let Ok(save) = std::env::var("MTM_SAVE_FAILED") {
        for f in &failures {
            let i: usize = f[5..].split(' ').next().unwrap().parse().unwrap();
            std::fs::write(
                Path::new(&save).join(format!("case-{i}.ctf")),
                &cases[i].bytes,
            )
            .unwrap();
        }
    }
    println!(
        "mutation cases run: {done} ({} sources, {KINDS} kinds: {per_kind:?}); {errors} operations ended in a clean error; slowest case {slowest:?}; {:?} in all",
        srcs.len(),
        started.elapsed()
    );
    assert_eq!(done, cases.len());
    assert!(
        failures.is_empty(),
        "{} of {done} cases failed:\n{}",
        failures.len(),
        failures[..failures.len().min(30)].join("\n")
    );
}

// ---------------------------------------------------------------------------------------------
// The command line, run with limits and measured.

struct Run {
    code: Option<i32>,
    signal: Option<i32>,
    stdout: String,
    stderr: String,
    /// Peak resident set of the command in KiB (VmHWM, sampled every millisecond while it
    /// runs; wait4's ru_maxrss would include the test process's own size, inherited at fork).
    peak_rss_kib: u64,
}

/// VmHWM of a running `memtrace-merge` (None before bash has exec'd it, or after it exited).
fn vm_hwm(pid: u32, exe: &Path) -> Option<u64> {
    if std::fs::read_link(format!("/proc/{pid}/exe")).ok()? != exe {
        return None;
    }
    let st = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    st.lines()
        .find(|l| l.starts_with("VmHWM:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// Run `memtrace-merge ARGS` through bash, after `limits` (e.g. `ulimit -v 262144`), with
/// `dir` as working directory; killed after `timeout`.
fn run_cli(limits: &str, args: &[&std::ffi::OsStr], dir: &Path, timeout: Duration) -> Run {
    use std::io::Read;
    let exe = Path::new(bin()).canonicalize().unwrap();
    let mut child = Command::new("bash")
        .arg("-c")
        .arg(format!("{limits}\nexec \"$@\""))
        .arg("bash")
        .arg(bin())
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut so = child.stdout.take().unwrap();
    let mut se = child.stderr.take().unwrap();
    let t_out = std::thread::spawn(move || {
        let mut v = Vec::new();
        so.read_to_end(&mut v).unwrap();
        v
    });
    let t_err = std::thread::spawn(move || {
        let mut v = Vec::new();
        se.read_to_end(&mut v).unwrap();
        v
    });
    let started = Instant::now();
    let mut peak = 0;
    let status = loop {
        if let Some(hwm) = vm_hwm(child.id(), &exe) {
            peak = peak.max(hwm);
        }
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if started.elapsed() > timeout {
            let _ = child.kill();
            panic!("memtrace-merge {args:?} ran for more than {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(1));
    };
    use std::os::unix::process::ExitStatusExt;
    let stdout = String::from_utf8_lossy(&t_out.join().unwrap()).into_owned();
    let stderr = String::from_utf8_lossy(&t_err.join().unwrap()).into_owned();
    Run {
        code: status.code(),
        signal: status.signal(),
        stdout,
        stderr,
        peak_rss_kib: peak,
    }
}

fn os(s: &str) -> &std::ffi::OsStr {
    std::ffi::OsStr::new(s)
}

/// An error exit of the CLI: status non-zero, stderr ends in one `memtrace-merge:` line
/// naming `file` (before it only `warning:` lines), never a panic.
fn assert_clean_cli_error(r: &Run, file: &str, what: &str) {
    assert!(
        !r.stderr.contains("panicked") && r.signal.is_none(),
        "{what}: {:?} {}",
        r.signal,
        r.stderr
    );
    assert!(r.code.unwrap() != 0, "{what}: exit 0");
    let lines: Vec<&str> = r.stderr.lines().collect();
    let last = lines.last().copied().unwrap_or("");
    assert!(
        last.starts_with("memtrace-merge: ") && last.contains(file),
        "{what}: last stderr line {last:?}"
    );
    for l in &lines[..lines.len() - 1] {
        assert!(l.starts_with("warning: "), "{what}: stderr line {l:?}");
    }
}

/// A sample of the mutation cases through the command line, under a 256 MiB address-space
/// cap: `check`, `info`, `dump` and `merge` exit 0 or with a one-line error, never a panic.
#[test]
fn mutated_traces_through_the_command_line() {
    let (_, cases) = cases(330);
    let dir = scratch();
    let clean = dir.path().join("clean.ctf");
    write_clean(&clean);
    let limits = "ulimit -v 262144";
    let step = cases.len() / 50;
    let mut n = 0;
    let mut worst_rss = 0;
    for (i, c) in cases.iter().enumerate().step_by(step) {
        let file = dir.path().join(format!("case-{i}.ctf"));
        std::fs::write(&file, &c.bytes).unwrap();
        let name = file.to_str().unwrap();
        let what = |cmd: &str| format!("case {i} ({}), {cmd}", c.what);
        let t = Duration::from_secs(20);
        let r = run_cli(limits, &[os("check"), os(name)], dir.path(), t);
        assert!(
            matches!(r.code, Some(0..=1)) && !r.stderr.contains("panicked"),
            "{}: {:?} {}{}",
            what("check"),
            r.code,
            r.stdout,
            r.stderr
        );
        assert!(
            r.stdout.starts_with(name),
            "{}: {}",
            what("check"),
            r.stdout
        );
        worst_rss = worst_rss.max(r.peak_rss_kib);
        for cmd in ["info", "dump"] {
            let r = run_cli(limits, &[os(cmd), os(name)], dir.path(), t);
            if r.code != Some(0) {
                assert_clean_cli_error(&r, name, &what(cmd));
            }
            assert!(!r.stderr.contains("panicked"), "{}", what(cmd));
            worst_rss = worst_rss.max(r.peak_rss_kib);
        }
        let out = dir.path().join("out.ctf");
        let r = run_cli(
            limits,
            &[
                os("merge"),
                os("-q"),
                os("-o"),
                out.as_os_str(),
                os(name),
                clean.as_os_str(),
            ],
            dir.path(),
            t,
        );
        if r.code == Some(0) {
            std::fs::remove_file(&out).unwrap();
        } else {
            assert_clean_cli_error(&r, name, &what("merge"));
            assert!(!out.exists());
        }
        worst_rss = worst_rss.max(r.peak_rss_kib);
        std::fs::remove_file(&file).unwrap();
        n += 1;
    }
    println!("command-line cases: {n} (x4 commands), peak RSS {worst_rss} KiB");
    assert!(n >= 50);
}

/// Declared packet sizes up to 512 MiB are checked against the file before anything is
/// allocated: each command stays small under an address-space cap.
#[test]
fn huge_declared_sizes_are_not_allocated() {
    let src = prefix(&std::fs::read(data("fork/child-2.ctf")).unwrap(), 120_000);
    let p = packets(&src);
    let dir = scratch();
    let clean = dir.path().join("clean.ctf");
    write_clean(&clean);
    let mut files = Vec::new();
    for (k, bits) in [
        (0usize, 0xffff_fff8u32),
        (0, 0x7fff_fff8),
        (3, 0xffff_fff8),
        (3, 0x4000_0000),
    ] {
        for cut in [None, Some(p[k].off + p[k].hs + 10)] {
            let mut b = src.clone();
            set_u32(&mut b, p[k].off + SIZE, bits);
            if let Some(c) = cut {
                b.truncate(c);
            }
            let f = dir
                .path()
                .join(format!("huge-{}-{bits:x}-{}.ctf", k, cut.is_some()));
            std::fs::write(&f, &b).unwrap();
            files.push((f, k, bits));
        }
    }
    let limits = "ulimit -v 262144";
    let mut worst = 0;
    for (f, k, bits) in &files {
        let name = f.to_str().unwrap();
        // in-process too: the library reads each without error kinds other than Malformed;
        // a size of the info packet, or negative as the reference reads it (a signed 32-bit
        // count), is an error, any other ends the trace as a truncated packet
        let bad = *k == 0 || (*bits as i32) < 0;
        let rep = check_file(f, &CheckOptions::default()).unwrap();
        if bad {
            assert!(rep.reader_error, "{name}");
        } else {
            assert!(rep.is_valid() && rep.warnings.len() == 1, "{name}: {rep:?}");
        }
        for cmd in ["check", "info", "dump"] {
            let r = run_cli(
                limits,
                &[os(cmd), os(name)],
                dir.path(),
                Duration::from_secs(20),
            );
            assert!(
                r.signal.is_none()
                    && !r.stderr.contains("panicked")
                    && !r.stderr.contains("memory"),
                "{cmd} {name}: {:?} {}",
                r.signal,
                r.stderr
            );
            if bad && cmd != "check" {
                assert_clean_cli_error(&r, name, cmd);
            }
            if !bad {
                assert_eq!(r.code, Some(0), "{cmd} {name}: {}", r.stderr);
            }
            worst = worst.max(r.peak_rss_kib);
        }
        let out = dir.path().join("out.ctf");
        let r = run_cli(
            limits,
            &[
                os("merge"),
                os("-q"),
                os("-o"),
                out.as_os_str(),
                os(name),
                clean.as_os_str(),
            ],
            dir.path(),
            Duration::from_secs(20),
        );
        if *k == 0 {
            assert_clean_cli_error(&r, name, "merge");
        } else {
            assert_eq!(r.code, Some(0), "merge {name}: {}", r.stderr);
            std::fs::remove_file(&out).unwrap();
        }
        worst = worst.max(r.peak_rss_kib);
    }
    println!("huge declared sizes: peak RSS {worst} KiB");
    assert!(worst < 100 * 1024, "peak RSS {worst} KiB");
}

// ---------------------------------------------------------------------------------------------
// Damaged traces from real data: what a killed worker leaves behind.

/// Merge `damaged` with a clean trace; the merge must equal the merge of `readable` (the
/// damaged trace's complete part) with the same clean trace. Returns the damaged input's
/// report and the text report.
fn merge_damaged(
    dir: &Path,
    damaged: &[u8],
    readable: &[u8],
    opts: &MergeOptions,
) -> (memtrace_merge::InputReport, String) {
    let clean = data("fork/child-4.ctf");
    let d = dir.join("damaged.ctf");
    let r = dir.join("readable.ctf");
    let out = dir.join("merged.ctf");
    std::fs::write(&d, damaged).unwrap();
    std::fs::write(&r, readable).unwrap();
    let report: MergeReport = {
        let _g = merge_lock();
        merge(&[d.clone(), clean.clone()], &out, opts).unwrap()
    };
    let cmp = compare(&[r, clean], &out, CompareOptions::default()).unwrap();
    assert!(
        cmp.equal(),
        "merged differs from the readable part: {cmp:?}"
    );
    let rep = check_file(&out, &CheckOptions::default()).unwrap();
    assert!(rep.is_valid(), "{:?}", rep.problems);
    assert_eq!(report.inputs.len(), 2);
    assert!(report.inputs[1].warnings.is_empty() && report.inputs[1].skipped_packets == 0);
    let text = memtrace_merge::format_report(&report) + &memtrace_merge::format_warnings(&report);
    std::fs::remove_file(&out).unwrap();
    (report.inputs[0].clone(), text)
}

/// A source that ends in an error (here a packet header whose size says 0) is merged as far
/// as it reads, and the input's report says that reading stopped; `compare` fails on such a
/// source unless told to take it as far as it reads, and then finds the merge equal to it
/// (and a merge with another trace equal to both, not to it alone).
#[test]
fn a_source_ending_in_an_error_compares_as_far_as_it_reads() {
    let (b, p) = child2();
    let dir = scratch();
    let d = dir.path();
    let at = p[8].off;
    let mut damaged = b.clone();
    set_u32(&mut damaged, at + SIZE, 0);
    let src = d.join("damaged.ctf");
    std::fs::write(&src, &damaged).unwrap();
    let out = d.join("merged.ctf");
    let report = {
        let _g = merge_lock();
        merge(std::slice::from_ref(&src), &out, &MergeOptions::default()).unwrap()
    };
    assert!(report.inputs[0].stopped_at_error, "{:?}", report.inputs[0]);
    let sources = [src, data("fork/child-4.ctf")];
    let strict = compare(&sources[..1], &out, CompareOptions::default());
    assert!(strict.is_err(), "{strict:?}");
    let lenient = CompareOptions {
        readable_part: true,
        ..Default::default()
    };
    let c = compare(&sources[..1], &out, lenient).unwrap();
    assert!(c.equal() && c.sources_cut == 1, "{c:?}");
    assert_eq!(c.merged_allocs, 6407);
    let both = d.join("both.ctf");
    {
        let _g = merge_lock();
        merge(&sources, &both, &MergeOptions::default()).unwrap();
    }
    assert!(!compare(&sources[..1], &both, lenient).unwrap().equal());
    assert!(compare(&sources, &both, lenient).unwrap().equal());
}

fn child2() -> (Vec<u8>, Vec<Pkt>) {
    let b = std::fs::read(data("fork/child-2.ctf")).unwrap();
    let p = packets(&b);
    assert_eq!(p.len(), 15);
    (b, p)
}

#[test]
fn killed_workers_keep_every_complete_event() {
    let (b, p) = child2();
    let dir = scratch();
    let dir = dir.path();
    let o = MergeOptions::default();
    let k = 8;
    let at = p[k].off;

    // stops at a packet boundary: everything kept, nothing skipped
    let (r, _) = merge_damaged(dir, &b[..at], &b[..at], &o);
    assert_eq!((r.skipped_packets, r.warnings.len()), (0, 0), "{r:?}");
    assert_eq!(r.allocs, 6407);
    assert!(!r.stopped_at_error);

    // only its info packet: no events, nothing skipped
    let (r, _) = merge_damaged(dir, &b[..p[0].end()], &b[..p[0].end()], &o);
    assert_eq!((r.events, r.skipped_packets, r.warnings.len()), (0, 0, 0));

    // cut inside a packet body: that packet is skipped, and said so
    let (r, text) = merge_damaged(dir, &b[..at + 5000], &b[..at], &o);
    assert_eq!(r.skipped_packets, 1, "{r:?}");
    assert!(!r.stopped_at_error, "a skipped packet is not an error");
    assert!(
        r.warnings
            .iter()
            .any(|w| w.contains("truncated packet") && w.contains(&format!("byte {at}"))),
        "{:?}",
        r.warnings
    );
    assert!(text.contains("1 packets skipped"), "{text}");
    assert!(text.contains("damaged.ctf"), "{text}");

    // cut inside a packet header
    let (r, text) = merge_damaged(dir, &b[..at + 20], &b[..at], &o);
    assert_eq!(r.skipped_packets, 1, "{r:?}");
    assert!(
        r.warnings
            .iter()
            .any(|w| w.contains("inside a packet header") && w.contains(&format!("byte {at}"))),
        "{:?}",
        r.warnings
    );
    assert!(text.contains("1 packets skipped"), "{text}");

    // a packet whose size runs past the end of the file (the last one, and one in the middle
    // of a file cut just after it)
    let last = p[14];
    let mut d = b.clone();
    set_u32(&mut d, last.off + SIZE, (last.size as u32 + 1000) * 8);
    let (r, _) = merge_damaged(dir, &d, &b[..last.off], &o);
    assert_eq!(r.skipped_packets, 1, "{r:?}");
    assert!(
        r.warnings[0].contains("truncated packet"),
        "{:?}",
        r.warnings
    );
    let mut d = b[..p[k + 1].end()].to_vec();
    let past = ((d.len() - at) as u32 + 64) * 8;
    set_u32(&mut d, at + SIZE, past);
    let (r, _) = merge_damaged(dir, &d, &b[..at], &o);
    assert_eq!(r.skipped_packets, 1, "{r:?}");

    // a zero-length packet (a header whose size says 0): reading stops there, with a warning
    let mut d = b.clone();
    set_u32(&mut d, at + SIZE, 0);
    let (r, _) = merge_damaged(dir, &d, &b[..at], &o);
    assert!(
        r.warnings
            .iter()
            .any(|w| w.contains("bad packet size 0") && w.contains(&format!("byte {at}"))),
        "{:?}",
        r.warnings
    );
    assert!(r.stopped_at_error, "{r:?}");
    // a packet with no events (size = its header), consistent with its neighbours: harmless
    let mut d = b[..at].to_vec();
    let mut h = b[at..at + p[k].hs].to_vec();
    set_u32(&mut h, SIZE, p[k].hs as u32 * 8);
    let tb = u64_at(&h, TIME_BEGIN);
    set_u64(&mut h, TIME_END, tb);
    let ib = u64_at(&h, p[k].hs - 16);
    set_u64(&mut h, p[k].hs - 8, ib);
    d.extend_from_slice(&h);
    d.extend_from_slice(&b[at..]);
    let (r, _) = merge_damaged(dir, &d, &b, &o);
    assert_eq!((r.skipped_packets, r.warnings.len()), (0, 0), "{r:?}");
    assert_eq!(r.allocs, 17_914);
    // a killed writer's preallocated tail of zeros
    let mut d = b[..at].to_vec();
    d.extend(std::iter::repeat_n(0u8, 4096));
    let (r, _) = merge_damaged(dir, &d, &b[..at], &o);
    assert!(
        r.warnings.iter().any(|w| w.contains("not a CTF packet")),
        "{:?}",
        r.warnings
    );

    // an empty file: an error naming it, or skipped with a warning when asked
    let e = std::fs::File::create(dir.join("empty.ctf")).unwrap();
    drop(e);
    let err = {
        let _g = merge_lock();
        merge(
            &[dir.join("empty.ctf"), data("fork/child-4.ctf")],
            &dir.join("x.ctf"),
            &o,
        )
        .unwrap_err()
    };
    assert!(
        err.to_string().contains("empty.ctf") && err.to_string().contains("empty file"),
        "{err}"
    );
    assert!(!dir.join("x.ctf").exists());
    let skip = MergeOptions {
        skip_bad_inputs: true,
        ..Default::default()
    };
    let clean = data("fork/child-4.ctf");
    let report = {
        let _g = merge_lock();
        merge(
            &[dir.join("empty.ctf"), clean.clone()],
            &dir.join("x.ctf"),
            &skip,
        )
        .unwrap()
    };
    assert!(report.inputs[0].skipped);
    assert!(report.inputs[0].warnings[0].contains("empty file"));
    let cmp = compare(&[clean], &dir.join("x.ctf"), CompareOptions::default()).unwrap();
    assert!(cmp.equal());
    let text = memtrace_merge::format_report(&report);
    assert!(text.contains("empty.ctf: skipped"), "{text}");
}

#[test]
fn foreign_duplicated_and_reordered_packets_are_skipped_with_a_warning() {
    let dir = scratch();
    let dir = dir.path();
    let o = MergeOptions::default();
    let parent = std::fs::read(data("fork/parent.ctf")).unwrap();
    for (f, warning) in [
        (
            "synthetic/wrong-pid.ctf",
            "wrong pid: 14496, but tracing 14495",
        ),
        (
            "synthetic/duplicate-packet.ctf",
            "skipping bad packet at id 42212",
        ),
    ] {
        let d = std::fs::read(data(f)).unwrap();
        let (r, text) = merge_damaged(dir, &d, &parent, &o);
        assert_eq!(r.skipped_packets, 1, "{f}: {r:?}");
        assert!(
            r.warnings.iter().any(|w| w.contains(warning)),
            "{f}: {:?}",
            r.warnings
        );
        assert!(text.contains(warning), "{text}");
    }
    // two packets swapped: the later one does not continue the sequence and is skipped,
    // then the earlier one is read, and every packet after it is out of sequence too (as
    // the reference reader does): the events up to the earlier packet are kept
    let (b, p) = child2();
    let mut d = b[..p[8].off].to_vec();
    d.extend_from_slice(&b[p[9].off..p[9].end()]);
    d.extend_from_slice(&b[p[8].off..p[8].end()]);
    d.extend_from_slice(&b[p[10].off..]);
    let (r, _) = merge_damaged(dir, &d, &b[..p[9].off], &o);
    assert_eq!(r.skipped_packets, 14 - 8, "{r:?}");
    assert!(
        r.warnings.iter().all(|w| w.contains("skipping bad packet")),
        "{:?}",
        r.warnings
    );
}

#[test]
fn not_a_trace_or_a_future_version_is_a_clear_error_naming_the_file() {
    let dir = scratch();
    let dir = dir.path();
    let (b, p) = child2();
    let readme = dir.join("README.ctf");
    std::fs::copy(data("README.md"), &readme).unwrap();
    let mut v4 = b.clone();
    set_u16(&mut v4, VERSION, 4);
    let future = dir.join("future.ctf");
    std::fs::write(&future, &v4).unwrap();
    for (f, msg) in [
        (&readme, "not a memtrace trace (no CTF packet header)"),
        (
            &future,
            "trace format v004, but this reader knows v001 to v003",
        ),
    ] {
        let name = f.to_str().unwrap();
        let e = Reader::open(f).err().unwrap();
        assert!(matches!(e, Error::Malformed { .. }));
        let want = format!("{name}: byte 0 (packet 0): {msg}");
        assert!(e.to_string().starts_with(&want), "{e}");
        let want = e.to_string();
        let e = {
            let _g = merge_lock();
            merge(
                &[data("fork/child-4.ctf"), f.clone()],
                &dir.join("x.ctf"),
                &MergeOptions::default(),
            )
            .unwrap_err()
        };
        assert_eq!(e.to_string(), want);
        for cmd in ["info", "dump"] {
            let r = run_cli("", &[os(cmd), f.as_os_str()], dir, Duration::from_secs(20));
            assert_eq!(r.stderr, format!("memtrace-merge: {want}\n"), "{cmd}");
            assert_eq!(r.code, Some(2));
        }
        let r = run_cli(
            "",
            &[os("check"), f.as_os_str()],
            dir,
            Duration::from_secs(20),
        );
        assert_eq!(r.code, Some(1));
        assert!(r
            .stdout
            .contains(&format!("{name}: byte 0 (packet 0): error: {msg}")));
        let out = dir.join("x.ctf");
        let r = run_cli(
            "",
            &[
                os("merge"),
                os("-o"),
                out.as_os_str(),
                f.as_os_str(),
                data("fork/child-4.ctf").as_os_str(),
            ],
            dir,
            Duration::from_secs(20),
        );
        assert_eq!(r.stderr, format!("memtrace-merge: {want}\n"));
        assert_eq!(r.code, Some(2));
        assert!(!out.exists());
    }
    // a future version later in the file: reading stops there, with a warning
    let mut d = b.clone();
    set_u16(&mut d, p[8].off + VERSION, 4);
    let (r, _) = merge_damaged(dir, &d, &b[..p[8].off], &MergeOptions::default());
    assert!(
        r.warnings
            .iter()
            .any(|w| w.contains("trace format v004") && w.contains(&format!("byte {}", p[8].off))),
        "{:?}",
        r.warnings
    );
}

// ---------------------------------------------------------------------------------------------
// Nothing lost, nothing overwritten.

/// Whether process `pid` ("self" for this one) has a merge's temporary output open in
/// `dir`: a file of no name there (`O_TMPFILE`, which `/proc` shows as `dir/#N (deleted)`)
/// or one named `.merged.ctf.tmp-*`.
fn writing_in(pid: &str, dir: &Path) -> bool {
    let dir = dir.canonicalize().unwrap();
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    fds.filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .any(|l| {
            let name = l.file_name().unwrap_or_default().to_string_lossy();
            l.parent() == Some(&dir)
                && (name.starts_with(".merged.ctf.tmp-")
                    || (name.starts_with('#') && name.ends_with(" (deleted)")))
        })
}

/// Names in `dir`, sorted.
fn listing(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// Bytes and modification time of each file.
fn snapshot(files: &[&Path]) -> Vec<(Vec<u8>, std::time::SystemTime)> {
    files
        .iter()
        .map(|f| {
            (
                std::fs::read(f).unwrap(),
                std::fs::metadata(f).unwrap().modified().unwrap(),
            )
        })
        .collect()
}

#[test]
fn a_failed_merge_leaves_no_output_and_the_inputs_untouched() {
    let dir = scratch();
    let d = dir.path();
    let good = d.join("good.ctf");
    std::fs::copy(data("fork/child-2.ctf"), &good).unwrap();
    let (b, _) = child2();
    let mut v4 = b.clone();
    set_u16(&mut v4, VERSION, 4);
    let bad = d.join("bad.ctf");
    std::fs::write(&bad, &v4).unwrap();
    let out = d.join("out.ctf");
    let before = snapshot(&[&good, &bad]);
    let names = listing(d);
    for opts in [
        MergeOptions::default(),
        MergeOptions {
            rate_mismatch: memtrace_merge::RateMismatch::Fail,
            ..Default::default()
        },
    ] {
        // no output yet: none afterwards
        let e = {
            let _g = merge_lock();
            merge(&[good.clone(), bad.clone()], &out, &opts).unwrap_err()
        };
        assert!(e.to_string().contains("bad.ctf"), "{e}");
        assert_eq!(listing(d), names);
        // an existing output: left as it was
        std::fs::write(&out, b"previous result").unwrap();
        let e = {
            let _g = merge_lock();
            merge(&[good.clone(), bad.clone()], &out, &opts).unwrap_err()
        };
        assert!(e.to_string().contains("bad.ctf"), "{e}");
        assert_eq!(std::fs::read(&out).unwrap(), b"previous result");
        std::fs::remove_file(&out).unwrap();
        assert_eq!(listing(d), names);
    }
    // incompatible inputs (rates differ and the caller refuses thinning)
    let slow = d.join("slow.ctf");
    std::fs::copy(data("rates/slow.ctf"), &slow).unwrap();
    let e = {
        let _g = merge_lock();
        merge(
            &[good.clone(), slow.clone()],
            &out,
            &MergeOptions {
                rate_mismatch: memtrace_merge::RateMismatch::Fail,
                ..Default::default()
            },
        )
        .unwrap_err()
    };
    assert!(e.to_string().contains("rates differ"), "{e}");
    assert!(!out.exists());
    std::fs::remove_file(&slow).unwrap();
    assert_eq!(listing(d), names);
    assert_eq!(snapshot(&[&good, &bad]), before);
    // the command line: exit 2, one line, nothing left
    let r = run_cli(
        "",
        &[
            os("merge"),
            os("-o"),
            out.as_os_str(),
            good.as_os_str(),
            bad.as_os_str(),
        ],
        d,
        Duration::from_secs(60),
    );
    assert_clean_cli_error(&r, bad.to_str().unwrap(), "merge");
    assert_eq!(r.code, Some(2));
    assert_eq!(listing(d), names);
    assert_eq!(snapshot(&[&good, &bad]), before);
}

/// A full disk, made with a file-size limit: the write fails with EFBIG; the merge says so
/// in one line, exits non-zero and leaves neither the output nor its temporary file.
#[test]
fn disk_full_leaves_no_output_and_no_temporary() {
    let dir = scratch();
    let d = dir.path();
    let out = d.join("merged.ctf");
    let inputs: Vec<PathBuf> = ["parent", "child-1", "child-2", "child-3", "child-4"]
        .iter()
        .map(|n| data(&format!("fork/{n}.ctf")))
        .collect();
    let srcs: Vec<&Path> = inputs.iter().map(|p| p.as_path()).collect();
    let before = snapshot(&srcs);
    let mut args = vec![os("merge"), os("-q"), os("-o"), out.as_os_str()];
    args.extend(inputs.iter().map(|p| p.as_os_str()));
    for limit in [64, 1024] {
        let limits = format!("trap '' XFSZ; ulimit -f {limit}");
        let r = run_cli(&limits, &args, d, Duration::from_secs(120));
        assert_eq!(r.code, Some(2), "{}", r.stderr);
        assert!(!r.stderr.contains("panicked"), "{}", r.stderr);
        assert_eq!(r.stderr.lines().count(), 1, "{}", r.stderr);
        assert!(
            r.stderr
                .starts_with(&format!("memtrace-merge: {}: ", out.display()))
                && r.stderr.contains("File too large"),
            "{}",
            r.stderr
        );
        assert_eq!(listing(d), Vec::<String>::new(), "left behind");
        // an earlier result survives
        std::fs::write(&out, b"earlier").unwrap();
        let r = run_cli(&limits, &args, d, Duration::from_secs(120));
        assert_eq!(r.code, Some(2), "{}", r.stderr);
        assert_eq!(std::fs::read(&out).unwrap(), b"earlier");
        assert_eq!(listing(d), vec!["merged.ctf".to_string()]);
        std::fs::remove_file(&out).unwrap();
    }
    assert_eq!(snapshot(&srcs), before);
    // and with room enough, the same command works
    let r = run_cli("", &args, d, Duration::from_secs(120));
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert_eq!(listing(d), vec!["merged.ctf".to_string()]);
}

#[test]
fn an_output_that_is_one_of_the_inputs_is_refused_however_spelled() {
    let dir = scratch();
    let d = dir.path();
    let dname = d.file_name().unwrap().to_str().unwrap().to_string();
    std::fs::create_dir(d.join("sub")).unwrap();
    std::fs::create_dir(d.join("traces")).unwrap();
    let input = d.join("in.ctf");
    std::fs::copy(data("fork/child-2.ctf"), &input).unwrap();
    std::fs::copy(data("rates/slow.ctf"), d.join("traces/t.ctf")).unwrap();
    std::os::unix::fs::symlink(&input, d.join("link.ctf")).unwrap();
    std::os::unix::fs::symlink(d.join("sub"), d.join("sublink")).unwrap();
    std::fs::hard_link(&input, d.join("hard.ctf")).unwrap();
    let other = data("fork/child-4.ctf");
    let files = [input.clone(), d.join("traces/t.ctf")];
    let fs: Vec<&Path> = files.iter().map(|p| p.as_path()).collect();
    let before = snapshot(&fs);
    let names = listing(d);
    // (inputs, output), the inputs and output as the library gets them
    let cases: Vec<(Vec<PathBuf>, PathBuf)> = vec![
        (vec![input.clone(), other.clone()], input.clone()),
        (
            vec![input.clone(), other.clone()],
            d.join(".").join("in.ctf"),
        ),
        (vec![input.clone(), other.clone()], d.join("sub/../in.ctf")),
        (
            vec![input.clone(), other.clone()],
            d.join("sublink/../in.ctf"),
        ),
        (vec![input.clone(), other.clone()], d.join("link.ctf")),
        (vec![input.clone(), other.clone()], d.join("hard.ctf")),
        (vec![d.join("link.ctf"), other.clone()], input.clone()),
        (vec![d.join("./sub/../in.ctf")], d.join("hard.ctf")),
        (
            vec![d.join("traces"), other.clone()],
            d.join("traces/t.ctf"),
        ),
        (
            vec![d.join("traces"), other.clone()],
            d.join("traces/./t.ctf"),
        ),
    ];
    for (inputs, out) in &cases {
        let e = {
            let _g = merge_lock();
            merge(inputs, out, &MergeOptions::default()).unwrap_err()
        };
        assert!(
            e.to_string().contains("one of the inputs"),
            "{inputs:?} -> {}: {e}",
            out.display()
        );
    }
    // relative spellings through the command line, from the directory and from below it
    let rel: Vec<(&str, Vec<&str>)> = vec![
        (
            ".",
            vec![
                "in.ctf",
                "./in.ctf",
                "../{d}/in.ctf",
                "sub/../in.ctf",
                "link.ctf",
                "hard.ctf",
            ],
        ),
        (
            "sub",
            vec![
                "../in.ctf",
                "./../in.ctf",
                "../../{d}/in.ctf",
                "../link.ctf",
            ],
        ),
    ];
    for (cwd, outs) in rel {
        for o in outs {
            let o = o.replace("{d}", &dname);
            let r = run_cli(
                "",
                &[
                    os("merge"),
                    os("-q"),
                    os("-o"),
                    os(&o),
                    input.as_os_str(),
                    other.as_os_str(),
                ],
                &d.join(cwd),
                Duration::from_secs(60),
            );
            assert_eq!(r.code, Some(2), "{cwd} {o}: {}", r.stderr);
            assert!(
                r.stderr.starts_with("memtrace-merge: ") && r.stderr.contains("one of the inputs"),
                "{cwd} {o}: {}",
                r.stderr
            );
        }
    }
    assert_eq!(listing(d), names);
    assert_eq!(snapshot(&fs), before);
}

/// A merge given a cancel handle stops with [`Error::Cancelled`] once it is set: the
/// temporary output is removed and nothing appears at the output path. Two merges in one
/// process cancel apart: the other, running at the same time, completes.
#[test]
fn a_cancelled_merge_leaves_nothing_and_another_goes_on() {
    let _alone = MERGE_LOCK.write().unwrap_or_else(|e| e.into_inner());
    let (dir, other) = (scratch(), scratch());
    let d = dir.path().to_path_buf();
    let out = d.join("merged.ctf");
    // the fork set twice: about a million events, long enough to be caught running
    let mut inputs = vec![data("fork"), data("fork")];
    inputs.extend(
        ["parent", "child-3"]
            .iter()
            .map(|n| data(&format!("fork/{n}.ctf"))),
    );
    let opts = |c: &memtrace_merge::Cancel| MergeOptions {
        cancel: c.clone(),
        keep_duplicates: true,
        ..Default::default()
    };
    // 1. cancelled once its temporary output exists, while another merge runs
    let cancel = memtrace_merge::Cancel::new();
    let watcher = {
        let (d, cancel) = (d.clone(), cancel.clone());
        std::thread::spawn(move || {
            let t = Instant::now();
            while t.elapsed() < Duration::from_secs(60) {
                if writing_in("self", &d) {
                    cancel.cancel();
                    return true;
                }
                std::thread::sleep(Duration::from_micros(200));
            }
            false
        })
    };
    let running = {
        let (inputs, out2) = (inputs.clone(), other.path().join("merged.ctf"));
        std::thread::spawn(move || {
            merge(&inputs, &out2, &opts(&memtrace_merge::Cancel::new())).map(|r| r.allocs)
        })
    };
    let t = Instant::now();
    let r = merge(&inputs, &out, &opts(&cancel));
    let took = t.elapsed();
    let seen = watcher.join().unwrap();
    assert!(seen, "no temporary output seen");
    let e = r.expect_err("the merge was cancelled");
    assert!(matches!(e, Error::Cancelled), "{e}");
    assert_eq!(listing(&d), Vec::<String>::new(), "left behind");
    println!("cancelled after {took:?}");
    let allocs = running.join().unwrap().unwrap();
    // (each file once, however often named)
    assert_eq!(allocs, 231_910, "the other merge");
    // 2. cancelled before it starts
    let r = merge(&inputs, &out, &opts(&cancel));
    assert!(matches!(r, Err(Error::Cancelled)), "{:?}", r.err());
    assert_eq!(listing(&d), Vec::<String>::new());
    // 3. with a handle of its own, the same merge completes
    let r = merge(&inputs[..1], &out, &MergeOptions::default()).unwrap();
    assert_eq!(r.allocs, 231_910);
    assert_eq!(listing(&d), vec!["merged.ctf".to_string()]);
}

/// A format-3 trace whose packets name thousands of domains: each domain's decoder tables
/// are allocated only when it decodes a backtrace (they were 160 KiB each up front: a 4 MiB
/// file of empty packets made `check` take 10 GiB), domains without events get no merge
/// stream, and a merge refuses more than `MAX_MERGE_DOMAINS` domains with events in one
/// trace (each is a stream re-reading the file) instead of running for minutes.
#[test]
fn thousands_of_domains_stay_cheap() {
    let single = std::fs::read(data("v3/single.ctf")).unwrap();
    let p = packets(&single);
    let info = &single[..p[0].end()];
    let (tb, pid) = (u64_at(info, TIME_BEGIN), u64_at(info, PID));
    // a packet of `domain` holding `body`
    let packet = |domain: u16, body: &[u8]| {
        let mut h = info[..68].to_vec();
        set_u32(&mut h, SIZE, (68 + body.len()) as u32 * 8);
        set_u64(&mut h, TIME_BEGIN, tb);
        set_u64(&mut h, TIME_END, tb);
        set_u64(&mut h, PID, pid);
        set_u16(&mut h, DOMAIN, domain);
        set_u16(&mut h, 40, 0xffff); // no cache verifier
        set_u64(&mut h, 52, 5); // alloc ids 5..5
        set_u64(&mut h, 60, 5);
        h.extend_from_slice(body);
        h
    };
    // a collect of object 4 at the packet's time
    let mut collect = ((4u32 << 25) | (tb as u32 & 0x1ff_ffff))
        .to_le_bytes()
        .to_vec();
    collect.push(0);
    let dir = scratch();
    let d = dir.path();
    let mut empty = info.to_vec();
    for dom in 0..=u16::MAX {
        empty.extend(packet(dom, &[]));
    }
    let empty_f = d.join("empty-domains.ctf");
    std::fs::write(&empty_f, &empty).unwrap();
    let with_events = |n: u16| {
        let mut b = info.to_vec();
        for dom in 0..n {
            b.extend(packet(dom, &collect));
        }
        let f = d.join(format!("domains-{n}.ctf"));
        std::fs::write(&f, &b).unwrap();
        f
    };
    let (ok_f, many_f) = (with_events(1000), with_events(3000));
    let limits = "ulimit -v 1048576";
    let t = Duration::from_secs(20);
    let clean = data("rates/slow.ctf");
    let mut worst = 0;
    for f in [&empty_f, &ok_f, &many_f] {
        for cmd in ["check", "info", "dump"] {
            let started = Instant::now();
            let r = run_cli(limits, &[os(cmd), f.as_os_str()], d, t);
            let took = started.elapsed();
            assert!(
                r.signal.is_none() && !r.stderr.contains("panicked"),
                "{cmd}: {}",
                r.stderr
            );
            let want = if cmd == "check" && f != &empty_f {
                1
            } else {
                0
            };
            assert_eq!(r.code, Some(want), "{cmd} {}: {}", f.display(), r.stderr);
            assert!(took < Duration::from_secs(5), "{cmd}: {took:?}");
            worst = worst.max(r.peak_rss_kib);
        }
        let out = d.join("out.ctf");
        let started = Instant::now();
        let r = run_cli(
            limits,
            &[
                os("merge"),
                os("-q"),
                os("-o"),
                out.as_os_str(),
                f.as_os_str(),
                clean.as_os_str(),
            ],
            d,
            t,
        );
        let took = started.elapsed();
        assert!(took < Duration::from_secs(5), "merge: {took:?}");
        worst = worst.max(r.peak_rss_kib);
        if f == &many_f {
            assert_clean_cli_error(&r, f.to_str().unwrap(), "merge");
            assert!(r.stderr.contains("more than 1024 domains"), "{}", r.stderr);
            assert!(!out.exists());
        } else {
            assert_eq!(r.code, Some(0), "{}", r.stderr);
            std::fs::remove_file(&out).unwrap();
        }
    }
    println!("thousands of domains: peak RSS {worst} KiB");
    assert!(worst < 256 * 1024, "peak RSS {worst} KiB");
    let rep = check_file(&empty_f, &CheckOptions::default()).unwrap();
    assert!(rep.is_valid(), "{:?}", rep.problems);
    assert_eq!(memtrace_merge::MAX_MERGE_DOMAINS, 1024);
}

/// A source allocation whose backtrace has more new frames than one output packet can hold
/// (here 20,000 distinct frames, each a cache miss, in an oversized source packet, which the
/// reader accepts) made the whole merge fail with an error that did not name the input. The
/// writer now cuts such a backtrace to what fits: the merge keeps everything, counts the cut
/// and warns about the input.
#[test]
fn an_unencodable_backtrace_does_not_fail_the_whole_merge() {
    let start = 1_000_000_000u64;
    let pid = 4242u64;
    let header = |size: usize, tb: u64, te: u64, ids: (u64, u64)| {
        let mut h = Vec::new();
        h.extend_from_slice(&0xc1fc_1fc1u32.to_le_bytes());
        h.extend_from_slice(&(size as u32 * 8).to_le_bytes());
        h.extend_from_slice(&tb.to_le_bytes());
        h.extend_from_slice(&te.to_le_bytes());
        h.extend_from_slice(&0u32.to_le_bytes());
        h.extend_from_slice(&2u16.to_le_bytes());
        h.extend_from_slice(&pid.to_le_bytes());
        h.extend_from_slice(&0xffffu16.to_le_bytes());
        h.extend_from_slice(&0u16.to_le_bytes());
        h.extend_from_slice(&0u64.to_le_bytes());
        h.extend_from_slice(&ids.0.to_le_bytes());
        h.extend_from_slice(&ids.1.to_le_bytes());
        h
    };
    let ev = |code: u32, t: u64| ((code << 25) | (t as u32 & 0x1ff_ffff)).to_le_bytes();
    let mut info = ev(0, start).to_vec();
    info.extend_from_slice(&3e-4f64.to_le_bytes()); // child-4's rate: no thinning
    info.push(64);
    info.extend_from_slice(b"wide\0host\0\0");
    info.extend_from_slice(&pid.to_le_bytes());
    info.extend_from_slice(b"wide backtrace\0");
    let t = start + 1;
    let n = 20_000u64;
    let mut body = Vec::new();
    for i in 0..n {
        // a location event: code, one location (new file, new defname), the two strings
        body.extend_from_slice(&ev(1, t));
        body.extend_from_slice(&(0x10000 + i).to_le_bytes());
        body.push(1);
        let enc: u64 = 1 | (31 << 38) | (31 << 43);
        body.extend_from_slice(&(enc as u32).to_le_bytes());
        body.extend_from_slice(&((enc >> 32) as u16).to_le_bytes());
        body.extend_from_slice(format!("f.ml\0f{i}\0").as_bytes());
    }
    // one allocation (length 1, 1 sample, minor, no common prefix) of all n frames, literals
    body.extend_from_slice(&ev(2, t));
    body.extend_from_slice(&[1, 1, 0, 0]);
    body.extend_from_slice(&(n as u16).to_le_bytes());
    for i in 0..n {
        let c = 0x10000 + i;
        let bucket = (c.wrapping_mul(0x4983723) >> 11) & 0x3fff;
        body.extend_from_slice(&(((bucket << 2) | 3) as u16).to_le_bytes());
        body.extend_from_slice(&c.to_le_bytes());
    }
    let mut trace = header(66 + info.len(), start, start, (0, 0));
    trace.extend_from_slice(&info);
    trace.extend_from_slice(&header(66 + body.len(), start, start + 10, (0, 1)));
    trace.extend_from_slice(&body);
    let dir = scratch();
    let wide = dir.path().join("wide.ctf");
    std::fs::write(&wide, &trace).unwrap();
    let rep = check_file(&wide, &CheckOptions::default()).unwrap();
    assert!(rep.is_valid() && rep.allocs == 1, "{rep:?}");
    let out = dir.path().join("out.ctf");
    let r = {
        let _g = merge_lock();
        merge(
            &[wide.clone(), data("fork/child-4.ctf")],
            &out,
            &MergeOptions::default(),
        )
    };
    let r = r.unwrap_or_else(|e| panic!("the merge failed: {e}"));
    assert_eq!(r.allocs, 1 + 16_499);
    assert_eq!(r.inputs[0].cut_backtraces, 1, "{:?}", r.inputs[0]);
    assert!(
        r.inputs[0].warnings.iter().any(|w| w.contains("too deep")),
        "{:?}",
        r.inputs[0].warnings
    );
    assert!(r.inputs[1].warnings.is_empty());
    let rep = check_file(&out, &CheckOptions::default()).unwrap();
    assert!(rep.is_valid(), "{:?}", rep.problems);
}

/// A `memtrace-merge merge` of `fork/` three times into `out`, once it has its temporary
/// output open (stderr to `stderr`).
fn merge_started(out: &Path, stderr: Stdio) -> std::process::Child {
    let mut child = Command::new(bin())
        .args(["merge", "-q", "-o"])
        .arg(out)
        .args([data("fork"), data("fork"), data("fork")])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .unwrap();
    let dir = out.parent().unwrap();
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(60) {
        if writing_in(&child.id().to_string(), dir) {
            return child;
        }
        if child.try_wait().unwrap().is_some() {
            break;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!("no temporary output seen");
}

/// SIGKILL (or a crash, or the machine's out-of-memory killer) to a running merge, which
/// has no chance to clean up: its output was written unnamed, so nothing is left beside
/// the output path, and what was there is untouched.
#[test]
fn a_killed_cli_merge_leaves_nothing() {
    use std::os::unix::fs::OpenOptionsExt;
    use std::os::unix::process::ExitStatusExt;
    for earlier in [Some(&b"earlier"[..]), None] {
        let dir = scratch();
        let d = dir.path();
        let unnamed = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_TMPFILE)
            .open(d);
        if unnamed.is_err() {
            // (a merge there names its temporary, which a SIGKILL leaves behind)
            println!("note: no unnamed files in {}; skipped", d.display());
            return;
        }
        let out = d.join("merged.ctf");
        if let Some(text) = earlier {
            std::fs::write(&out, text).unwrap();
        }
        let mut child = merge_started(&out, Stdio::null());
        child.kill().unwrap();
        let status = child.wait().unwrap();
        assert_eq!(status.signal(), Some(libc::SIGKILL), "{status:?}");
        match earlier {
            Some(text) => {
                assert_eq!(listing(d), vec!["merged.ctf".to_string()], "left behind");
                assert_eq!(std::fs::read(&out).unwrap(), text);
            }
            None => assert_eq!(listing(d), Vec::<String>::new(), "left behind"),
        }
    }
}

/// A `memtrace-merge merge` whose output would pass the file size limit (`ulimit -f`) fails
/// with an error naming its output, rather than being killed by SIGXFSZ, and leaves the
/// earlier file at the output path as it was.
#[test]
fn a_merge_past_the_file_size_limit_fails_cleanly() {
    // (a merge, and a copy: one input)
    for input in [data("fork"), data("fork/parent.ctf")] {
        let dir = scratch();
        let d = dir.path();
        let out = d.join("merged.ctf");
        std::fs::write(&out, b"earlier").unwrap();
        // (a limit of 128 KiB: sh counts 512-byte blocks; the merge of fork/ is ~4 MB,
        // parent.ctf 1.7 MB)
        let o = Command::new("sh")
            .args(["-c", "ulimit -f 256 && exec \"$0\" \"$@\""])
            .arg(bin())
            .args(["merge", "-q", "-o"])
            .arg(&out)
            .arg(&input)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert_eq!(
            o.status.code(),
            Some(2),
            "{input:?}, {:?}: {stderr}",
            o.status
        );
        assert!(
            stderr.contains(&format!("{}: write: File too large", out.display())),
            "{stderr}"
        );
        assert_eq!(listing(d), vec!["merged.ctf".to_string()], "left behind");
        assert_eq!(std::fs::read(&out).unwrap(), b"earlier");
    }
}

/// SIGINT or SIGTERM to a running `memtrace-merge merge`: it stops, removes its temporary
/// output, writes nothing at the output path and exits 130 with one line.
#[test]
fn a_signalled_cli_merge_leaves_nothing() {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        let dir = scratch();
        let d = dir.path();
        let out = d.join("merged.ctf");
        std::fs::write(&out, b"earlier").unwrap();
        let child = merge_started(&out, Stdio::piped());
        unsafe { libc::kill(child.id() as libc::pid_t, sig) };
        let o = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(130), "signal {sig}: {stderr}");
        assert_eq!(stderr, "memtrace-merge: interrupted; no output written\n");
        assert_eq!(listing(d), vec!["merged.ctf".to_string()], "left behind");
        assert_eq!(std::fs::read(&out).unwrap(), b"earlier");
    }
}
