//! Issue 34 ("Scale"): merges of many small inputs (1,000, 4,000 and 10,000 under `ulimit -n
//! 256`) and of many large ones (100 of 35 MB), timed and measured against the targets.
//!
//! `cargo bench --bench scale [-- many|large|10000 ...]` (the parts named, all when none);
//! `MERGE_BENCH_SCALE=0.1` for a quick run: large inputs (and the 94 MB set they are held
//! against) at that scale, two rounds rather than five and three, 10,000 only when named.
//! Each program runs as a child of this bench (its peak RSS from `wait4`), the merges into
//! an output that does not exist yet, in turns after an untimed run of each; the inputs are
//! kept under `target/bench-data/` between runs.
#[path = "common/runs.rs"]
mod runs;
// (`fork` and `events_of` serve the other benches)
#[allow(dead_code)]
#[path = "common/sets.rs"]
mod sets;
#[path = "common/turns.rs"]
mod turns;

use memtrace_merge::{
    AllocHeader, LocationCode, LocationList, ObjId, OwnedEvent, Reader, TraceInfo, Writer,
    WriterOptions,
};
use runs::{cli, median, run_child, try_run_child, Run};
use sets::{make_processes, make_set, scale, Process, Shape};
use std::collections::HashMap;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;
use turns::{in_turns, mib, paired, peak_rss, summary};

/// The open files the many-inputs runs are allowed (`ulimit -n 256`).
const NOFILE: libc::rlim_t = 256;
/// Large inputs: how many, and their events each (~35 MB at scale 1, the 94 MB set's
/// shape and rate of events).
const LARGE: usize = 100;
const LARGE_EVENTS: f64 = 4_120_000.0;
const LARGE_SPAN_US: f64 = 90_000_000.0;
/// The shape of the 94 MB set, whose throughput the large inputs are held to.
const SWITCH4: Shape = Shape {
    switch: 4,
    deepest: 40,
};
/// What this machine's noise is allowed in the targets that compare two measurements: the
/// large set's throughput at least 0.9 times the 94 MB set's, its RSS at most 1.1 times
/// that of a tenth of it.
const NOISE: f64 = 0.1;

/// The parts of the bench to run, from the words after `--` (all when none).
struct Parts {
    many: bool,
    large: bool,
    ten_thousand: bool,
}

impl Parts {
    fn from_args(quick: bool) -> Parts {
        // (cargo passes `--bench` to a bench of its own harness)
        let words: Vec<String> = std::env::args()
            .skip(1)
            .filter(|a| !a.starts_with('-'))
            .collect();
        for w in &words {
            if !["many", "large", "10000"].contains(&w.as_str()) {
                eprintln!("unknown part {w:?}: the parts are many, large and 10000");
                std::process::exit(2);
            }
        }
        let named = |w: &str| words.iter().any(|x| x == w);
        let all = words.is_empty();
        Parts {
            many: all || named("many"),
            large: all || named("large"),
            ten_thousand: (all && !quick) || named("10000"),
        }
    }
}

/// The CLI, to be run under `ulimit -n 256` (soft and hard limits, as `ulimit` sets both).
fn limited() -> Command {
    let mut cmd = Command::new(cli());
    // SAFETY: between fork and exec the closure calls only setrlimit (async-signal-safe)
    // and reads errno.
    unsafe {
        cmd.pre_exec(|| {
            let lim = libc::rlimit {
                rlim_cur: NOFILE,
                rlim_max: NOFILE,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd
}

/// A merge of `inputs` into a fresh `out`, removed afterwards (the large set's is 3.5 GB).
fn merge_once(inputs: &[PathBuf], out: &Path, format: &str) -> Run {
    let _ = std::fs::remove_file(out);
    let mut cmd = Command::new(cli());
    cmd.args(["merge", "-q", "--format", format, "-o"])
        .arg(out)
        .args(inputs);
    let r = run_child(&mut cmd);
    let _ = std::fs::remove_file(out);
    r
}

/// `merge --keep-duplicates` of the directory `dir` under `ulimit -n 256`.
fn merge_limited(dir: &Path, out: &Path) -> Result<Run, String> {
    let _ = std::fs::remove_file(out);
    let mut cmd = limited();
    cmd.args(["merge", "-q", "--keep-duplicates", "-o"])
        .arg(out)
        .arg(dir);
    let r = try_run_child(&mut cmd);
    let _ = std::fs::remove_file(out);
    r
}

/// `top --mode peak` of the directory `dir` under `ulimit -n 256`, its output dropped.
fn top_limited(dir: &Path) -> Result<Run, String> {
    try_run_child(limited().args(["top", "--mode", "peak"]).arg(dir))
}

/// `n` copies of `slow` in `data/scale-copies-N/` (made once, in a directory renamed when
/// whole): copies rather than links, each a file of its own as each process's trace is.
fn copies(data: &Path, slow: &Path, n: usize) -> PathBuf {
    made_once(&data.join(format!("scale-copies-{n}")), |dir| {
        for k in 0..n {
            std::fs::copy(slow, dir.join(format!("in-{k:05}.ctf"))).unwrap();
        }
    })
}

/// `dir`, made by `fill` in a directory of another name first where it is missing, so that
/// a run stopped while making it leaves nothing the next would take for whole.
fn made_once(dir: &Path, fill: impl FnOnce(&Path)) -> PathBuf {
    if !dir.exists() {
        let part = dir.with_extension("part");
        let _ = std::fs::remove_dir_all(&part);
        std::fs::create_dir_all(&part).unwrap();
        fill(&part);
        std::fs::rename(&part, dir).unwrap();
    }
    dir.to_path_buf()
}

/// A trace's events, held to be written again under other pids.
struct Held {
    info: TraceInfo,
    events: Vec<OwnedEvent>,
    locations: HashMap<LocationCode, LocationList>,
}

/// `path`'s events, and the locations of the codes their backtraces name.
fn hold(path: &Path) -> Held {
    let mut r = Reader::open(path).unwrap();
    let mut events = Vec::new();
    while let Some(e) = r.next_event().unwrap() {
        events.push(e.to_owned_event());
    }
    let mut locations = HashMap::new();
    for e in &events {
        if let OwnedEvent::Alloc(a) = e {
            for &c in &a.backtrace {
                if let Some(l) = r.lookup(c) {
                    locations.entry(c).or_insert_with(|| l.clone());
                }
            }
        }
    }
    let info = r.info().clone();
    Held {
        info,
        events,
        locations,
    }
}

/// `held`'s events written to `path` as process `pid`'s.
fn write_as(held: &Held, pid: u64, path: &Path) {
    let info = TraceInfo {
        pid,
        ..held.info.clone()
    };
    let f = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    let opts = WriterOptions {
        version: 2,
        lossless: true,
    };
    let mut w = Writer::new(f, &info, opts).unwrap();
    // (the writer numbers the objects itself: the trace's ids mapped to its)
    let mut ids: HashMap<ObjId, ObjId> = HashMap::new();
    for e in &held.events {
        match e {
            OwnedEvent::Alloc(a) => {
                let h = AllocHeader {
                    time: a.time,
                    domain: a.domain,
                    length: a.length,
                    nsamples: a.nsamples,
                    source: a.source,
                };
                let id = w
                    .put_alloc(&h, &a.backtrace, |c| held.locations.get(&c).cloned())
                    .unwrap();
                ids.insert(a.id, id);
            }
            OwnedEvent::Promote { time, domain, id } => {
                w.put_promote(*time, *domain, ids[id]).unwrap()
            }
            OwnedEvent::Collect { time, domain, id } => {
                w.put_collect(*time, *domain, ids[id]).unwrap()
            }
        }
    }
    w.finish().unwrap();
}

/// `n` traces of `slow`'s events, each under a pid of its own, in `data/scale-pids-N/`:
/// for the analysis, which takes copies of one process's trace once (it has no
/// `--keep-duplicates`), where the merge is told to keep them.
fn own_pids(data: &Path, held: &Held, n: usize) -> PathBuf {
    made_once(&data.join(format!("scale-pids-{n}")), |dir| {
        for k in 0..n {
            write_as(
                held,
                100_000 + k as u64,
                &dir.join(format!("in-{k:05}.ctf")),
            );
        }
    })
}

/// The bytes of the files of `dir`.
fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum()
}

/// The bytes free for an unprivileged writer on the file system of `path`.
fn free_bytes(path: &Path) -> u64 {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: `c` is a NUL-terminated path, `st` plain data that statvfs fills.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    let r = unsafe { libc::statvfs(c.as_ptr(), &mut st) };
    assert_eq!(r, 0, "statvfs {}", path.display());
    st.f_bavail as u64 * st.f_frsize as u64
}

/// The memory the kernel reports available (GiB), if it says.
fn mem_available_gib() -> Option<f64> {
    let m = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = m.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / (1024.0 * 1024.0))
}

/// The load average over the last minute: other engineers' builds and benches share this
/// machine's two cores, and a figure taken under load is slower for it.
fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().map(String::from))
        .unwrap_or("?".into())
}

/// The targets met or not, printed beside their figures and again at the end.
#[derive(Default)]
struct Verdicts(Vec<(bool, String)>);

impl Verdicts {
    /// "target TARGET: PASS" (or FAIL), `what` kept for the summary.
    fn judge(&mut self, pass: bool, target: &str, what: String) -> String {
        let verdict = if pass { "PASS" } else { "FAIL" };
        self.0.push((pass, what));
        format!("target {target}: {verdict}")
    }

    /// A peak RSS under `limit_mib`: its verdict.
    fn rss_under(&mut self, what: &str, runs: &[Run], limit_mib: u64) -> String {
        let rss = peak_rss(runs);
        let pass = rss.is_some_and(|k| k < limit_mib * 1024);
        let target = format!("under {limit_mib} MB");
        let what = format!("{what}: peak RSS {} MB, {target}", mib(rss));
        self.judge(pass, &target, what)
    }
}

/// 1,000 and 4,000 inputs: the merge of copies and the analysis of the same events under
/// pids of their own, all in turns.
fn many(data: &Path, slow: &Path, held: &Held, rounds: usize, tmp: &Path, v: &mut Verdicts) {
    let t0 = Instant::now();
    let (c1, c4) = (copies(data, slow, 1000), copies(data, slow, 4000));
    let (p1, p4) = (own_pids(data, held, 1000), own_pids(data, held, 4000));
    let (b1, b4) = (dir_bytes(&c1), dir_bytes(&c4));
    println!(
        "many inputs: copies of tests/data/rates/slow.ctf ({} bytes, {} events over 1.5 s, the copies at the same times) merged with --keep-duplicates, and the same events under a pid each analysed (`top --mode peak`), all under ulimit -n {NOFILE}; {rounds} rounds in turns (sets made or found in {:.1} s; load {})",
        std::fs::metadata(slow).unwrap().len(),
        held.events.len(),
        t0.elapsed().as_secs_f64(),
        load()
    );
    let out = tmp.join("many.ctf");
    let ok = |r: Result<Run, String>| r.unwrap_or_else(|e| panic!("{e}"));
    let mut m1 = || ok(merge_limited(&c1, &out));
    let mut m4 = || ok(merge_limited(&c4, &out));
    let mut a1 = || ok(top_limited(&p1));
    let mut a4 = || ok(top_limited(&p4));
    let runs = in_turns(rounds, &mut [&mut m1, &mut m4, &mut a1, &mut a4]);
    let mb = |b: u64| b as f64 / 1e6;
    println!(
        "  merge of 1,000 ({:.1} MB): {}; {}",
        mb(b1),
        summary("s", &runs[0]),
        v.rss_under("merge of 1,000 inputs", &runs[0], 64)
    );
    println!(
        "  merge of 4,000 ({:.1} MB): {}; {}",
        mb(b4),
        summary("s", &runs[1]),
        v.rss_under("merge of 4,000 inputs", &runs[1], 128)
    );
    let r = paired(&runs[1], &runs[0]);
    println!(
        "  merge time 4,000 / 1,000: {r:.2} (median of the rounds' ratios); {}",
        v.judge(
            r <= 5.0,
            "at most 5",
            format!("merge time of 4,000 inputs / 1,000: {r:.2}, at most 5")
        )
    );
    println!("  analysis of 1,000: {}", summary("s", &runs[2]));
    println!("  analysis of 4,000: {}", summary("s", &runs[3]));
    println!(
        "  analysis time 4,000 / 1,000: {:.2} (median of the rounds' ratios; no target of its own: the merge's are at most 5x, 64 and 128 MB)",
        paired(&runs[3], &runs[2])
    );
}

/// 10,000 copies merged under `ulimit -n 256` once (and the analysis of 10,000 pids): does
/// it work, in what time and memory.
fn ten_thousand(data: &Path, slow: &Path, held: &Held, tmp: &Path, v: &mut Verdicts) {
    let t0 = Instant::now();
    let (c, p) = (copies(data, slow, 10_000), own_pids(data, held, 10_000));
    println!(
        "10,000 inputs ({:.1} MB; made or found in {:.1} s; load {}), once each under ulimit -n {NOFILE}:",
        dir_bytes(&c) as f64 / 1e6,
        t0.elapsed().as_secs_f64(),
        load()
    );
    let out = tmp.join("many.ctf");
    let say = |r: &Result<Run, String>| match r {
        Ok(r) => format!(
            "done in {:.3} s, CPU {:.2} s, peak RSS {} MB",
            r.secs,
            r.cpu,
            mib(r.rss)
        ),
        // (the stderr's first lines: one failing input can bring a warning per input)
        Err(e) => format!(
            "FAILED: {}",
            e.lines().take(6).collect::<Vec<_>>().join("\n    ")
        ),
    };
    let m = merge_limited(&c, &out);
    println!(
        "  merge --keep-duplicates of 10,000 copies: {}; {}",
        say(&m),
        v.judge(
            m.is_ok(),
            "it works",
            format!(
                "merge of 10,000 inputs under ulimit -n {NOFILE}: {}",
                if m.is_ok() { "works" } else { "fails" }
            )
        )
    );
    // (today the analysis holds ~0.45 MB an input: 4.5 GB here, on a machine others share)
    match mem_available_gib() {
        Some(g) if g < 8.0 => println!(
            "  analysis of 10,000 (under a pid each): left out, {g:.1} GiB of memory available"
        ),
        _ => println!(
            "  analysis of 10,000 (under a pid each): {} (no target of its own)",
            say(&top_limited(&p))
        ),
    }
}

/// A run's wall time, and its CPU time.
fn wall(r: &Run) -> f64 {
    r.secs
}
fn cpu(r: &Run) -> f64 {
    r.cpu
}

/// 100 large inputs, a tenth of them, and the 94 MB set, merged in turns.
fn large(data: &Path, scale: f64, rounds: usize, tmp: &Path, v: &mut Verdicts) {
    let span_us = (LARGE_SPAN_US * scale) as u64;
    // Workers of one executable (their codes kept by the merge), each with call paths of
    // its own, all overlapping: each starts a thousandth of the span after the previous.
    let procs: Vec<Process> = (0..LARGE as u64)
        .map(|k| Process {
            pid: 20_000 + k,
            start: 1_796_000_000_000_000 + k * (span_us / 1000),
            span_us,
            events: (LARGE_EVENTS * scale) as u64,
            seed: 1000 + k,
            shape: SWITCH4,
            one_executable: true,
        })
        .collect();
    // (named by the events of each, so that inputs of another size are made anew; a change
    // to the processes' other parameters wants a new name too)
    let dir = data.join(format!("scale-large{LARGE}-{}ev", procs[0].events));
    let missing = (0..LARGE)
        .filter(|k| !dir.join(format!("proc-{k}.ctf")).exists())
        .count();
    // (each input ~35 MB at scale 1; the output as large as them all, and 2 GB to spare)
    let need = (missing as f64 * 35e6 * scale + LARGE as f64 * 35e6 * scale + 2e9) as u64;
    let free = free_bytes(data);
    if free < need {
        println!(
            "large inputs: left out: {:.1} GB free under {}, {:.1} GB needed ({missing} inputs to write, and the output)",
            free as f64 / 1e9,
            data.display(),
            need as f64 / 1e9
        );
        return;
    }
    let t0 = Instant::now();
    let (all, bytes) = make_processes(&dir, "proc-", &procs);
    let gen = t0.elapsed().as_secs_f64();
    let tenth = &all[..LARGE / 10];
    let tenth_bytes: u64 = tenth
        .iter()
        .map(|p| std::fs::metadata(p).unwrap().len())
        .sum();
    let t0 = Instant::now();
    let base_dir = data.join(format!("v2-switch4-scale{scale}-x1"));
    let (base, base_bytes) = make_set(&base_dir, scale, 1, SWITCH4);
    println!(
        "large inputs: {LARGE} synthetic workers of one executable ({:.1} GB, {:.1} MB each; made or found in {:.1} s), a tenth of them, and the merge bench's set whose paths change twice as often ({:.1} MB; {:.1} s), merged in turns, {rounds} rounds (load {})",
        bytes as f64 / 1e9,
        bytes as f64 / 1e6 / LARGE as f64,
        gen,
        base_bytes as f64 / 1e6,
        t0.elapsed().as_secs_f64(),
        load()
    );
    let out = tmp.join("large.ctf");
    // Format 2 (one stream: every event re-encoded) and format 3 (each input's packets
    // copied in domains of its own, after a survey of each).
    for format in ["2", "3"] {
        let mut b = || merge_once(&base, &out, format);
        let mut t = || merge_once(tenth, &out, format);
        let mut h = || merge_once(&all, &out, format);
        let runs = in_turns(rounds, &mut [&mut b, &mut t, &mut h]);
        large_verdicts(
            format,
            &runs,
            [base_bytes, tenth_bytes, bytes],
            tenth.len(),
            v,
        );
    }
}

/// What the merges to `format` of the 94 MB set, a tenth of the large inputs and all of
/// them (`runs`, of `sets`' bytes) say of issue 34's targets for large inputs.
fn large_verdicts(format: &str, runs: &[Vec<Run>], sets: [u64; 3], tenth: usize, v: &mut Verdicts) {
    let [base_bytes, tenth_bytes, bytes] = sets;
    let rate = |bytes: u64, runs: &[Run]| {
        let mut t: Vec<f64> = runs.iter().map(|r| r.secs).collect();
        bytes as f64 / median(&mut t) / 1e6
    };
    println!(
        "  to format {format}: the {:.1} MB set: {}, {:.0} MB/s",
        base_bytes as f64 / 1e6,
        summary("s", &runs[0]),
        rate(base_bytes, &runs[0])
    );
    println!(
        "  to format {format}: {tenth} large inputs ({:.2} GB): {}, {:.0} MB/s",
        tenth_bytes as f64 / 1e9,
        summary("s", &runs[1]),
        rate(tenth_bytes, &runs[1])
    );
    println!(
        "  to format {format}: {LARGE} large inputs ({:.2} GB): {}, {:.0} MB/s",
        bytes as f64 / 1e9,
        summary("s", &runs[2]),
        rate(bytes, &runs[2])
    );
    // Throughput against the 94 MB set's, paired round by round (the machine's speed
    // drifts between rounds, less within one); per CPU second too, which the other
    // programs on this machine disturb less than they do the wall time.
    let per_round = |k: usize, bytes: u64, secs: fn(&Run) -> f64| {
        let mut r: Vec<f64> = runs[k]
            .iter()
            .zip(&runs[0])
            .map(|(x, b)| (bytes as f64 / secs(x)) / (base_bytes as f64 / secs(b)))
            .collect();
        median(&mut r)
    };
    println!(
        "  to format {format}: throughput of {tenth} large inputs / the {:.1} MB set's: {:.2} (median of the rounds' ratios; per CPU second {:.2})",
        base_bytes as f64 / 1e6,
        per_round(1, tenth_bytes, wall),
        per_round(1, tenth_bytes, cpu)
    );
    let r = per_round(2, bytes, wall);
    println!(
        "  to format {format}: throughput of {LARGE} large inputs / the {:.1} MB set's: {r:.2} (median of the rounds' ratios; per CPU second {:.2}); {}",
        base_bytes as f64 / 1e6,
        per_round(2, bytes, cpu),
        v.judge(
            r >= 1.0 - NOISE,
            &format!("at least {:.1}", 1.0 - NOISE),
            format!(
                "to format {format}: throughput of {LARGE} large inputs / the {:.1} MB set's: {r:.2}, at least {:.1} (the same, but for noise)",
                base_bytes as f64 / 1e6,
                1.0 - NOISE
            )
        )
    );
    let (r10, r100) = (peak_rss(&runs[1]), peak_rss(&runs[2]));
    let ratio = match (r10, r100) {
        (Some(a), Some(b)) => b as f64 / a as f64,
        _ => f64::NAN,
    };
    println!(
        "  to format {format}: peak RSS of {LARGE} large inputs / {tenth}: {} MB / {} MB = {ratio:.2}; {}",
        mib(r100),
        mib(r10),
        v.judge(
            ratio <= 1.0 + NOISE,
            &format!("at most {:.1}", 1.0 + NOISE),
            format!(
                "to format {format}: peak RSS of {LARGE} large inputs / {tenth}: {ratio:.2}, at most {:.1} (flat, but for noise)",
                1.0 + NOISE
            )
        )
    );
}

fn main() {
    let scale = scale();
    let quick = scale < 1.0;
    let parts = Parts::from_args(quick);
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let data = root.join("target/bench-data");
    std::fs::create_dir_all(&data).unwrap();
    let tmp = tempfile::tempdir_in(&data).unwrap();
    let slow = root.join("tests/data/rates/slow.ctf");
    let held = hold(&slow);
    let mut v = Verdicts::default();
    println!(
        "(this machine's {} cores are shared with other builds and benches: times vary by 15% and more from run to run; load at start {})",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        load()
    );
    if parts.many {
        many(
            &data,
            &slow,
            &held,
            if quick { 2 } else { 5 },
            tmp.path(),
            &mut v,
        );
    }
    if parts.ten_thousand {
        ten_thousand(&data, &slow, &held, tmp.path(), &mut v);
    }
    if parts.large {
        large(&data, scale, if quick { 2 } else { 3 }, tmp.path(), &mut v);
    }
    println!("targets of issue 34:");
    for (pass, what) in &v.0 {
        println!("  {} {what}", if *pass { "PASS" } else { "FAIL" });
    }
}
