//! Throughput of the library on the largest corpus traces and on a ~100 MB synthetic trace:
//! (a) reading with backtraces decoded, (b) reading without backtraces, (c) re-encoding
//! (read + write to a Vec, same format), (d) dumping to a sink; plus (e) writing the
//! synthetic trace. Plain `std::time` measurement: each (trace, operation) runs until about
//! 0.6 s have been spent (at least 3 times) and the best run is reported, on in-memory input.
//! Everything runs on one thread but for re-encoding (`copy`) a trace with deep backtraces,
//! which reads ahead on a second thread.
//!
//! `cargo bench --bench throughput` (release profile). The OCaml reference figures printed
//! as baselines were given to the project (measured on this machine by a colleague): the
//! reference reader at ~10 MB/s with backtraces and the reference copy (re-encode) at
//! ~23 MB/s. No baseline was given for (b), (d) and (e). When `MEMTRACE_OCAML_READ` and
//! `MEMTRACE_OCAML_COPY` name builds of `benches/_ocaml/read.ml` and `copy.ml` (programs on
//! the memtrace library, which this repository does not hold), those are also timed in
//! this run on the same files (best of 3; their time includes starting the process and
//! reading the file, ours does not).
//!
//! Environment: `THROUGHPUT_SYNTHETIC_MB` (default 100) sizes the synthetic trace (0 skips it);
//! `THROUGHPUT_KEEP_SYNTHETIC=PATH` keeps a copy of it.

#[path = "../tests/support/splitmix.rs"]
mod splitmix;
use memtrace_merge::AllocHeader;
use memtrace_merge::{
    tools::copy::copy, tools::dump, AllocSource, DomainId, Event, Location, LocationCode,
    LocationList, ObjId, Reader, Timestamp, TraceInfo, Writer, WriterOptions,
};
use std::collections::HashMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

const REF_READ_MBPS: f64 = 10.0;
const REF_REENCODE_MBPS: f64 = 23.0;
const BUDGET: Duration = Duration::from_millis(600);
/// Runs of each (trace, operation) however long they take.
const MIN_RUNS: u32 = 3;

#[derive(Clone, Copy, PartialEq)]
enum Op {
    ReadBacktraces,
    ReadNoBacktraces,
    Reencode,
    Dump,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::ReadBacktraces => "(a) read, backtraces",
            Op::ReadNoBacktraces => "(b) read, no backtraces",
            Op::Reencode => "(c) re-encode",
            Op::Dump => "(d) dump to sink",
        }
    }
    fn reference(self) -> Option<f64> {
        match self {
            Op::ReadBacktraces => Some(REF_READ_MBPS),
            Op::Reencode => Some(REF_REENCODE_MBPS),
            _ => None,
        }
    }
}

/// Run `op` once over `bytes`; returns the number of events (allocs + promotes + collects).
fn run_once(op: Op, bytes: &[u8]) -> u64 {
    let mut r = Reader::new(bytes, "bench").expect("open");
    match op {
        Op::ReadBacktraces | Op::ReadNoBacktraces => {
            r.set_parse_backtraces(op == Op::ReadBacktraces);
            let mut n = 0u64;
            let mut frames = 0u64;
            while let Some(e) = r.next_event().expect("read") {
                if let Event::Alloc(a) = e {
                    frames += a.backtrace.len() as u64;
                }
                n += 1;
            }
            std::hint::black_box(frames);
            n
        }
        Op::Reencode => {
            let version = r.info().version.max(2);
            let (out, stats, _) = copy(
                &mut r,
                Vec::with_capacity(bytes.len() + (1 << 16)),
                WriterOptions {
                    version,
                    lossless: false,
                },
            )
            .expect("copy");
            std::hint::black_box(out.len());
            stats.allocs + stats.promotes + stats.collects
        }
        Op::Dump => {
            let mut sink = CountingSink(0);
            dump::dump(&mut r, &mut sink, |_| {}).expect("dump");
            std::hint::black_box(sink.0);
            let s = r.stats();
            s.allocs + s.promotes + s.collects
        }
    }
}

struct CountingSink(u64);
impl Write for CountingSink {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0 += b.len() as u64;
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Best time of repeated runs within the budget.
fn measure(op: Op, bytes: &[u8]) -> (Duration, u64, u32) {
    let start = Instant::now();
    let mut best = Duration::MAX;
    let mut events = 0;
    let mut runs = 0;
    while runs < MIN_RUNS || (start.elapsed() < BUDGET && runs < 50) {
        let t = Instant::now();
        events = run_once(op, bytes);
        best = best.min(t.elapsed());
        runs += 1;
    }
    (best, events, runs)
}

fn header() {
    println!(
        "{:<26} {:<24} {:>8} {:>9} {:>4} {:>9} {:>8} {:>7}   {:>22} {:>7}   {:>20} {:>7}",
        "trace",
        "operation",
        "MB",
        "events",
        "runs",
        "best ms",
        "MB/s",
        "Mev/s",
        "reference (given) MB/s",
        "ratio",
        "reference (run) MB/s",
        "ratio"
    );
}

/// The OCaml program timed in this run for `op`, if one is configured.
fn ocaml_program(op: Op) -> Option<PathBuf> {
    let var = match op {
        Op::ReadBacktraces => "MEMTRACE_OCAML_READ",
        Op::Reencode => "MEMTRACE_OCAML_COPY",
        _ => return None,
    };
    std::env::var_os(var)
        .map(PathBuf::from)
        .filter(|p| p.exists())
}

/// Best wall time of 3 runs of the OCaml program on `trace`.
fn time_ocaml(exe: &Path, op: Op, trace: &Path) -> Duration {
    let out = tempfile::NamedTempFile::new().unwrap();
    (0..3)
        .map(|_| {
            let mut c = std::process::Command::new(exe);
            c.arg(trace);
            if op == Op::Reencode {
                c.arg(out.path());
            }
            c.stdout(std::process::Stdio::null());
            let t = Instant::now();
            let st = c.status().unwrap();
            assert!(st.success(), "{} failed", exe.display());
            t.elapsed()
        })
        .min()
        .unwrap()
}

/// One line of the table; `reference` is the given figure, `measured` the one timed now.
#[allow(clippy::too_many_arguments)]
fn report(
    trace: &str,
    op: &str,
    mb: f64,
    events: u64,
    runs: u32,
    t: Duration,
    reference: Option<f64>,
    measured: Option<f64>,
) {
    let s = t.as_secs_f64();
    let mbps = mb / s;
    let column = |r: Option<f64>| match r {
        Some(r) => (format!("{r:.0}"), format!("{:.1}x", mbps / r)),
        None => ("-".to_string(), "-".to_string()),
    };
    let (rf, ratio) = column(reference);
    let (mf, mratio) = column(measured);
    println!(
        "{:<26} {:<24} {:>8.2} {:>9} {:>4} {:>9.1} {:>8.1} {:>7.2}   {:>22} {:>7}   {:>20} {:>7}",
        trace,
        op,
        mb,
        events,
        runs,
        s * 1e3,
        mbps,
        events as f64 / s / 1e6,
        rf,
        ratio,
        mf,
        mratio
    );
}

fn bench_trace(label: &str, file: &Path, bytes: &[u8]) {
    let mb = bytes.len() as f64 / 1e6;
    for op in [
        Op::ReadBacktraces,
        Op::ReadNoBacktraces,
        Op::Reencode,
        Op::Dump,
    ] {
        let (t, events, runs) = measure(op, bytes);
        let measured = ocaml_program(op).map(|exe| mb / time_ocaml(&exe, op, file).as_secs_f64());
        report(
            label,
            op.name(),
            mb,
            events,
            runs,
            t,
            op.reference(),
            measured,
        );
    }
}

// ---- the synthetic trace ------------------------------------------------------------------

struct Rng(splitmix::SplitMix);
impl Rng {
    fn next(&mut self) -> u64 {
        // SplitMix64: the library's own generator
        self.0.next_u64()
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Write a synthetic trace of about `target` bytes to `path`, like a merge of several
/// processes: 4 executables' worth of code pools (3,000 codes each, their own location
/// lists), each with 60 call paths 20-160 frames deep (recursive segments included);
/// allocations follow a path to a random depth plus a few random leaf frames, mostly
/// sharing a prefix with the previous backtrace; promotes and collects of live objects.
/// Returns (bytes, events, seconds spent writing including generation).
fn write_synthetic(path: &Path, target: u64) -> (u64, u64, f64) {
    let start = 1_796_026_339_843_713u64;
    let info = TraceInfo {
        sample_rate: 1e-4,
        word_size: 64,
        executable_name: b"/tmp/synthetic-bench".to_vec(),
        host_name: b"vm".to_vec(),
        ocaml_runtime_params: b"s=262144".to_vec(),
        pid: 1000,
        start_time: Timestamp(start),
        context: Some(b"throughput bench".to_vec()),
        initial_domain: DomainId(0),
        version: 2,
    };
    let mut rng = Rng(splitmix::SplitMix::from_state(2026));
    const POOLS: usize = 4;
    let mut locs: HashMap<LocationCode, LocationList> = HashMap::new();
    let mut pools: Vec<Vec<LocationCode>> = Vec::new();
    for p in 0..POOLS {
        let base = 0x5555_0000_0000u64 + (p as u64) * 0x1_0000_0000;
        let codes: Vec<LocationCode> = (0..3000u64)
            .map(|i| LocationCode(base + i * 24 + 8))
            .collect();
        for (i, &c) in codes.iter().enumerate() {
            let n = if i == 0 {
                0
            } else if i % 9 == 0 {
                2
            } else {
                1
            };
            let l: Vec<Location> = (0..n)
                .map(|j| Location {
                    filename: Arc::from(
                        format!("src/proc{p}/module_{}.ml", (i + j) % 120).as_bytes(),
                    ),
                    line: (i * 13 % 4000) as u32 + 1,
                    start_char: (i % 80) as u32,
                    end_char: (i % 80 + 10 + j) as u32,
                    defname: Arc::from(
                        format!("Proc{p}.Module_{}.fn_{}", (i + j) % 120, i % 37).as_bytes(),
                    ),
                })
                .collect();
            locs.insert(c, l.into());
        }
        pools.push(codes);
    }
    let paths: Vec<Vec<Vec<LocationCode>>> = pools
        .iter()
        .map(|codes| {
            (0..60)
                .map(|_| {
                    let depth = 20 + rng.below(141);
                    let mut v = vec![codes[0], codes[1], codes[2]];
                    while v.len() < depth {
                        if rng.below(10) == 0 {
                            let (a, b) = (codes[rng.below(3000)], codes[rng.below(3000)]);
                            for _ in 0..rng.below(12) + 2 {
                                v.push(a);
                                v.push(b);
                            }
                        } else {
                            v.push(codes[rng.below(3000)]);
                        }
                    }
                    v.truncate(depth);
                    v
                })
                .collect()
        })
        .collect();
    let t0 = Instant::now();
    let f = std::fs::File::create(path).unwrap();
    let out = std::io::BufWriter::with_capacity(1 << 20, f);
    let mut w = Writer::new(
        out,
        &info,
        WriterOptions {
            version: 2,
            lossless: false,
        },
    )
    .unwrap();
    let mut time = start;
    // live objects, and whether each was promoted (an object is promoted at most once)
    let mut live: Vec<(ObjId, bool)> = Vec::new();
    let mut pool = 0usize;
    let mut bt: Vec<LocationCode> = Vec::new();
    let mut events = 0u64;
    while w.stats().bytes < target {
        for _ in 0..1000 {
            time += [0, 0, 1, 3][rng.below(4)];
            let r = rng.below(100);
            if r < 55 || live.is_empty() {
                if rng.below(50) == 0 {
                    pool = rng.below(POOLS);
                }
                let path = &paths[pool][rng.below(60)];
                let depth = path.len() / 2 + rng.below(path.len() / 2 + 1);
                bt.clear();
                bt.extend_from_slice(&path[..depth]);
                for _ in 0..rng.below(4) {
                    bt.push(pools[pool][rng.below(3000)]);
                }
                let (length, source, nsamples) = match rng.below(20) {
                    0 => (
                        1000 + rng.below(100_000) as u64,
                        AllocSource::Major,
                        1 + rng.below(10) as u64,
                    ),
                    1 => (64 + rng.below(8000) as u64, AllocSource::External, 1),
                    _ => (1 + rng.below(16) as u64, AllocSource::Minor, 1),
                };
                let id = w
                    .put_alloc(
                        &AllocHeader {
                            time: Timestamp(time),
                            domain: DomainId(0),
                            length,
                            nsamples,
                            source,
                        },
                        &bt,
                        |c| locs.get(&c).cloned(),
                    )
                    .unwrap();
                live.push((id, false));
            } else if r < 62 {
                let i = live.len() - 1 - rng.below(live.len().min(64));
                if live[i].1 {
                    continue;
                }
                live[i].1 = true;
                w.put_promote(Timestamp(time), DomainId(0), live[i].0)
                    .unwrap();
            } else {
                let i = live.len() - 1 - rng.below(live.len().min(2000));
                let (id, _) = live.swap_remove(i);
                w.put_collect(Timestamp(time), DomainId(0), id).unwrap();
            }
            events += 1;
        }
    }
    let mut out = w.finish().unwrap();
    out.flush().unwrap();
    drop(out);
    let bytes = std::fs::metadata(path).unwrap().len();
    (bytes, events, t0.elapsed().as_secs_f64())
}

fn main() {
    // `cargo bench` passes `--bench`; a filter argument is ignored.
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join("data");
    let total = Instant::now();
    println!(
        "memtrace_merge throughput (in-memory input, best of runs within {} ms, at least {}; one thread, but for re-encoding deep backtraces, which reads ahead on a second; {} CPUs)",
        BUDGET.as_millis(),
        MIN_RUNS,
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    println!(
        "reference (given): OCaml memtrace reader with backtraces ~{REF_READ_MBPS} MB/s, re-encode ~{REF_REENCODE_MBPS} MB/s on this machine; ratio = ours / reference"
    );
    header();
    for rel in [
        "fork/parent.ctf",
        "fork/child-3.ctf",
        "rates/fast.ctf",
        "long.ctf",
    ] {
        let p = root.join(rel);
        let mut bytes = Vec::new();
        match std::fs::File::open(&p).and_then(|mut f| f.read_to_end(&mut bytes)) {
            Ok(_) => bench_trace(rel, &p, &bytes),
            Err(e) => println!("{rel}: skipped ({e})"),
        }
    }
    let mb: u64 = std::env::var("THROUGHPUT_SYNTHETIC_MB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    if mb > 0 {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("synthetic.ctf");
        let (size, events, secs) = write_synthetic(&path, mb * 1_000_000);
        let label = format!("synthetic ({} MB)", size / 1_000_000);
        report(
            &label,
            "(e) generate + write",
            size as f64 / 1e6,
            events,
            1,
            Duration::from_secs_f64(secs),
            None,
            None,
        );
        let bytes = std::fs::read(&path).unwrap();
        if let Ok(keep) = std::env::var("THROUGHPUT_KEEP_SYNTHETIC") {
            std::fs::write(&keep, &bytes).unwrap();
        }
        bench_trace(&label, &path, &bytes);
    }
    println!("total bench time {:.1} s", total.elapsed().as_secs_f64());
}
