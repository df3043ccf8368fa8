//! The benches' synthetic sets: overlapping "processes" written with the library's writer,
//! kept under `target/bench-data/` between runs; shared by the benches, which time the same inputs.
use memtrace_merge::{
    AllocHeader, AllocSource, DomainId, Location, LocationCode, LocationList, ObjId, Timestamp,
    TraceInfo, Writer, WriterOptions,
};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// The sets' scale: `MERGE_BENCH_SCALE` (1 when unset), for a quick run.
pub fn scale() -> f64 {
    std::env::var("MERGE_BENCH_SCALE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1.0)
}

/// The five traces of `tests/data/fork/` (a parent and four children).
pub fn fork(root: &Path) -> Vec<PathBuf> {
    ["parent", "child-1", "child-2", "child-3", "child-4"]
        .iter()
        .map(|n| root.join(format!("tests/data/fork/{n}.ctf")))
        .collect()
}

/// How a process's call paths look: 8 to `deepest` frames deep, one allocation in `switch`
/// on another path than the one before.
#[derive(Clone, Copy, PartialEq)]
pub struct Shape {
    pub switch: u64,
    pub deepest: usize,
}

/// One synthetic process: `events` events over `span_us` from `start` (µs since the epoch),
/// its call paths of the given [`Shape`] drawn from `seed`.
#[derive(Clone, Copy)]
pub struct Process {
    pub pid: u64,
    pub start: u64,
    pub span_us: u64,
    pub events: u64,
    pub seed: u64,
    pub shape: Shape,
    /// Location codes the same in every process so made (workers of one executable, whose
    /// merge keeps their codes), rather than each process's own (programs of their own,
    /// whose codes the merge renumbers apart).
    pub one_executable: bool,
}

/// Write one synthetic process: a pool of call paths sharing prefixes (as real OCaml stacks
/// do), mostly short minor allocations, collects soon after, some promotions and
/// long-lived objects.
fn write_process(path: &Path, spec: &Process) {
    let Process {
        pid,
        start,
        span_us,
        events,
        seed,
        shape: Shape { switch, deepest },
        one_executable,
    } = *spec;
    let mut rng = Lcg(seed);
    let ncodes = 3000u64;
    let base = 0x5500_0000_0000u64 + if one_executable { 0 } else { pid * 0x10_0000 };
    let table: Vec<LocationList> = (0..ncodes)
        .map(|i| {
            Arc::from(vec![Location {
                filename: Arc::from(format!("src/module_{}.ml", i % 97).as_bytes()),
                line: (i * 7 % 4000) as u32 + 1,
                start_char: (i % 60) as u32,
                end_char: (i % 60 + 20) as u32,
                defname: Arc::from(format!("Module_{}.fn_{}", i % 97, i).as_bytes()),
            }])
        })
        .collect();
    // call paths: a tree of stacks, depth 8..=deepest
    let paths: Vec<Vec<LocationCode>> = (0..400)
        .map(|p| {
            let depth = 8 + (p * 13 % (deepest - 7));
            let mut r = Lcg(p as u64 * 31 + seed);
            (0..depth)
                .map(|d| LocationCode(base + if d < 6 { d as u64 } else { r.below(ncodes) }))
                .collect()
        })
        .collect();
    let info = TraceInfo {
        sample_rate: 1e-4,
        word_size: 64,
        executable_name: b"/usr/bin/synthetic-worker".to_vec(),
        host_name: b"bench".to_vec(),
        ocaml_runtime_params: b"s=262144".to_vec(),
        pid,
        start_time: Timestamp(start),
        context: Some(format!("synthetic process {pid}").into_bytes()),
        initial_domain: DomainId(0),
        version: 2,
    };
    let f = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    let mut w = Writer::new(
        f,
        &info,
        WriterOptions {
            version: 2,
            lossless: false,
        },
    )
    .unwrap();
    let resolve = |c: LocationCode| table.get((c.0 - base) as usize).cloned();
    // objects in order of death: most die young, 1 in 200 lives 5 s (the live set stays
    // bounded however long the run, as in a program in its steady state)
    let mut live: BinaryHeap<Reverse<(u64, u64)>> = BinaryHeap::new();
    let mut t = start;
    let step = (span_us / events).max(1);
    let mut n = 0;
    let mut path = 0usize;
    while n < events {
        t += rng.below(2 * step + 1);
        while let Some(&Reverse((due, id))) = live.peek() {
            if due > t || n >= events {
                break;
            }
            live.pop();
            w.put_collect(Timestamp(t), DomainId(0), ObjId(id)).unwrap();
            n += 1;
        }
        if rng.below(switch) == 0 {
            path = rng.below(paths.len() as u64) as usize;
        }
        let len = if rng.below(50) == 0 {
            200 + rng.below(5000)
        } else {
            1 + rng.below(16)
        };
        let src = if len > 256 {
            AllocSource::Major
        } else {
            AllocSource::Minor
        };
        let id = w
            .put_alloc(
                &AllocHeader {
                    time: Timestamp(t),
                    domain: DomainId(0),
                    length: len,
                    nsamples: 1 + (len > 1000) as u64,
                    source: src,
                },
                &paths[path],
                resolve,
            )
            .unwrap();
        n += 1;
        if rng.below(20) == 0 && n < events {
            w.put_promote(Timestamp(t), DomainId(0), id).unwrap();
            n += 1;
        }
        let due = if rng.below(200) == 0 {
            t + 5_000_000
        } else {
            t + 1 + rng.below(2000)
        };
        live.push(Reverse((due, id.0)));
    }
    w.finish().unwrap();
}

/// The merge bench's set: four processes of programs of their own, 2.75 M events over 60 s
/// each (times `scale` and `length`), starting 1.5 s apart.
pub fn make_set(dir: &Path, scale: f64, length: u64, shape: Shape) -> (Vec<PathBuf>, u64) {
    let events = (2_750_000.0 * scale) as u64 * length;
    let span_us = (60_000_000.0 * scale) as u64 * length;
    let procs: Vec<Process> = (0..4u64)
        .map(|k| Process {
            pid: 1000 + k,
            start: 1_796_000_000_000_000 + k * 1_500_000,
            span_us,
            events,
            seed: 17 + k,
            shape,
            one_executable: false,
        })
        .collect();
    make_processes(dir, "proc-", &procs)
}

/// The processes `procs` in `dir` (`{prefix}{k}.ctf`, `k` their index, written on a thread
/// a core where missing): their paths and their bytes in all.
pub fn make_processes(dir: &Path, prefix: &str, procs: &[Process]) -> (Vec<PathBuf>, u64) {
    std::fs::create_dir_all(dir).unwrap();
    let paths: Vec<PathBuf> = (0..procs.len())
        .map(|k| dir.join(format!("{prefix}{k}.ctf")))
        .collect();
    let next = std::sync::atomic::AtomicUsize::new(0);
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| loop {
                let k = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(p) = paths.get(k) else { break };
                if !p.exists() {
                    // (written under another name and renamed once whole, so that a run
                    // stopped while writing leaves no cut trace for the next to take)
                    let part = p.with_extension("ctf.part");
                    write_process(&part, &procs[k]);
                    std::fs::rename(&part, p).unwrap();
                }
            });
        }
    });
    let bytes = paths
        .iter()
        .map(|p| std::fs::metadata(p).unwrap().len())
        .sum();
    (paths, bytes)
}

/// The events of a set (allocations, promotes, collects).
pub fn events_of(paths: &[PathBuf]) -> u64 {
    let mut n = 0;
    for p in paths {
        let mut r = memtrace_merge::Reader::open(p).unwrap();
        r.set_parse_backtraces(false);
        while r.next_event().unwrap().is_some() {
            n += 1;
        }
    }
    n
}
