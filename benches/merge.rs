//! Merge speed and memory: the five `fork/` traces, and a synthetic set of four overlapping
//! "processes" (~78 MB, 11 M events) written with the library's writer, then the same set
//! twice as long to show memory stays flat, then a set whose call paths change twice as
//! often (~94 MB, 11 M events), and one whose paths are 8-100 frames deep rather than 8-40
//! (~100 MB, 11 M events): the OCaml merge takes 31 s and 5.9 GB on it, which is what the
//! issue gives for its 94 MB set (33 s, 6.2 GB). Each merge runs the release CLI as a child (its
//! peak RSS from `wait4`), into an output that does not exist yet (as a first merge does;
//! replacing a file costs the file system a flush). Times are the median and
//! the best of several runs after an untimed one: this machine's timings vary by ±15% from
//! run to run, more from hour to hour.
//!
//! Ratios are against the OCaml merge: the times given to the project (0.9 s on fork/,
//! 33 s on its 100 MB set), and, when `MEMTRACE_OCAML_MERGE` names a build of the
//! corrected OCaml merge (`benches/_ocaml/`, built against the memtrace library, which this
//! repository does not hold), against that program timed in the same run on the same files,
//! in turns with ours (on fork/, 5 rounds of 3 runs of ours and one of it; on a big set, once
//! between 4 runs of ours and 3 more), so that a drift of this machine's speed meets both.
//! That program holds every event in memory (~5 GB for the synthetic set), so its time
//! depends on the memory free, which is printed beside it.
//!
//! The first set is also merged with `--tag-processes` and to format 3 (each process in a
//! domain of its own), each in turns with the plain merge, to show what those cost; the
//! ~94 MB set to format 3 (its packets copied), to format 2 and copied by `cp`, in turns.
//!
//! `cargo bench --bench merge` (env `MERGE_BENCH_SCALE=0.1` for a quick run).
#[path = "common/runs.rs"]
mod runs;
#[path = "common/sets.rs"]
mod sets;

use runs::{cli, median, run_child, Run};
use sets::{events_of, fork, make_set, scale, Shape};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

const OCAML_FORK_S: f64 = 0.9;
const OCAML_BIG_S: f64 = 33.0;

/// Run one merge through the CLI into a fresh `out`.
fn run_merge(inputs: &[PathBuf], out: &Path) -> Run {
    run_merge_with(inputs, out, &[])
}

/// [`run_merge`] with more options (e.g. `--tag-processes`).
fn run_merge_with(inputs: &[PathBuf], out: &Path, opts: &[&str]) -> Run {
    let _ = std::fs::remove_file(out);
    let mut cmd = Command::new(cli());
    cmd.args(["merge", "-q"])
        .args(opts)
        .arg("-o")
        .arg(out)
        .args(inputs);
    run_child(&mut cmd)
}

/// Times of runs after one untimed run (which brings the inputs into the page cache, as
/// they are for the runs after it): (median, best) seconds, the median CPU seconds (all
/// threads), and the largest peak RSS.
struct Timed {
    median: f64,
    best: f64,
    cpu: f64,
    rss: Option<u64>,
}

impl Timed {
    /// "CPU N ms (M cores busy)": on this 2-vCPU machine a merge on two threads is bound
    /// below by half its CPU time.
    fn cpu_ms(&self) -> String {
        format!(
            "CPU {:.1} ms ({:.2} cores busy)",
            self.cpu * 1e3,
            self.cpu / self.median
        )
    }
}

/// The runs of one program, gathered for [`Timed`].
#[derive(Default)]
struct Samples {
    times: Vec<f64>,
    cpus: Vec<f64>,
    rss: Option<u64>,
}

impl Samples {
    fn add(&mut self, r: Run) {
        self.times.push(r.secs);
        self.cpus.push(r.cpu);
        self.rss = self.rss.max(r.rss);
    }

    fn timed(mut self) -> Timed {
        self.times.sort_by(f64::total_cmp);
        self.cpus.sort_by(f64::total_cmp);
        Timed {
            median: self.times[self.times.len() / 2],
            best: self.times[0],
            cpu: self.cpus[self.cpus.len() / 2],
            rss: self.rss,
        }
    }
}

/// Our merge and, when given, the OCaml one, timed in turns so that both meet the same
/// phases of this machine (its speed drifts by up to 50% over minutes): an untimed run of
/// ours (and of the OCaml merge if `warm_theirs`), then `rounds` times `ours_per_round`
/// runs of ours and one of the OCaml merge, then `ours_after` more of ours.
fn timed_in_turns(
    warm_theirs: bool,
    rounds: usize,
    ours_per_round: usize,
    ours_after: usize,
    mut ours: impl FnMut() -> Run,
    mut theirs: Option<impl FnMut() -> Run>,
) -> (Timed, Option<Timed>) {
    let (mut a, mut b) = (Samples::default(), Samples::default());
    ours();
    if let Some(t) = theirs.as_mut().filter(|_| warm_theirs) {
        t();
    }
    for _ in 0..rounds {
        for _ in 0..ours_per_round {
            a.add(ours());
        }
        if let Some(t) = theirs.as_mut() {
            b.add(t());
        }
    }
    for _ in 0..ours_after {
        a.add(ours());
    }
    (a.timed(), theirs.map(|_| b.timed()))
}

/// The corrected OCaml merge, when a build of it is named by `MEMTRACE_OCAML_MERGE`.
fn ocaml_merge() -> Option<PathBuf> {
    std::env::var_os("MEMTRACE_OCAML_MERGE")
        .map(PathBuf::from)
        .filter(|p| p.exists())
}

/// Run the OCaml merge (`merge.exe OUT IN...`) into a fresh `out`.
fn run_ocaml(exe: &Path, inputs: &[PathBuf], out: &Path) -> Run {
    let _ = std::fs::remove_file(out);
    let mut cmd = Command::new(exe);
    cmd.arg(out).args(inputs);
    run_child(&mut cmd)
}

/// The memory the kernel reports available (MiB), if it says: the OCaml merge holds every
/// event (~5 GB for the synthetic set) and its time depends on it (18 s with 20 GiB
/// available, 29 s with 9.3 GB of it held in tmpfs, on the same files).
fn mem_available_mib() -> Option<u64> {
    let m = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = m.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024)
}

/// "N x faster" against the given time, and against the one measured now if any.
fn ratios(ours: f64, given: f64, measured: Option<f64>) -> String {
    let mut s = format!("{:.0}x the given OCaml time ({given:.1} s)", given / ours);
    if let Some(m) = measured {
        s.push_str(&format!(
            ", {:.0}x the OCaml merge timed in this run ({m:.2} s{})",
            m / ours,
            mem_available_mib()
                .map(|a| format!(", {:.1} GiB available", a as f64 / 1024.0))
                .unwrap_or_default()
        ));
    }
    s
}

/// The time (ns) a value takes to go from one thread to another and back, each spinning on
/// one atomic: this VM's two vCPUs are sometimes placed close by the host (~60 ns) and
/// sometimes apart (~330 ns), and a merge on two threads, passing its batches from one core
/// to the other, takes 50% longer then, when the one-thread OCaml merge does not.
fn round_trip_ns() -> f64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    const N: u64 = 20_000;
    /// Run the calling thread on `cpu` only (unpinned, both threads may share a vCPU for a
    /// while, and the figure says nothing of where the vCPUs are).
    fn pin(cpu: usize) {
        // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET writes within it, and
        // sched_setaffinity reads size_of::<cpu_set_t>() bytes of it, for this thread (0).
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu, &mut set);
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
        }
    }
    let flag = std::sync::Arc::new(AtomicU64::new(0));
    let other = flag.clone();
    let t = std::thread::spawn(move || {
        pin(1);
        for i in 0..=N {
            while other.load(Ordering::Acquire) != 2 * i + 1 {}
            other.store(2 * i + 2, Ordering::Release);
        }
    });
    // (on a thread of its own: the bench's thread, whose children inherit its affinity,
    // stays free to run anywhere)
    std::thread::spawn(move || {
        pin(0);
        let mut start = Instant::now();
        for i in 0..=N {
            flag.store(2 * i + 1, Ordering::Release);
            while flag.load(Ordering::Acquire) != 2 * i + 2 {}
            if i == 0 {
                // (the first exchange waits for the other thread to start)
                start = Instant::now();
            }
        }
        let ns = start.elapsed().as_nanos() as f64 / N as f64;
        t.join().unwrap();
        ns
    })
    .join()
    .unwrap()
}

/// Round trips of at least this many ns: the vCPUs were apart (this machine's threshold).
const APART_NS: f64 = 150.0;

/// Medians of runs (secs, round trip ns) whose vCPUs were close and apart: (count, median
/// secs, median round trip) each.
fn by_placement(runs: &[(f64, f64)]) -> [(usize, f64, f64); 2] {
    let part = |apart: bool| {
        let mut t: Vec<f64> = Vec::new();
        let mut rt: Vec<f64> = Vec::new();
        for &(secs, ns) in runs.iter().filter(|r| (r.1 >= APART_NS) == apart) {
            t.push(secs);
            rt.push(ns);
        }
        (t.len(), median(&mut t), median(&mut rt))
    };
    [part(false), part(true)]
}

/// The set merged with more options (`--tag-processes`, `--format 3`) and without, in
/// turns: the median with them, without, and their paired ratio.
fn options_in_turns(set: &[PathBuf], out: &Path, opts: &[&str]) {
    let (mut plain, mut with) = (Vec::new(), Vec::new());
    run_merge_with(set, out, opts);
    for k in 0..12 {
        let mut turn = [None, None];
        for t in [k % 2, 1 - k % 2] {
            let o: &[&str] = if t == 1 { opts } else { &[] };
            turn[t] = Some(run_merge_with(set, out, o).secs);
        }
        plain.push(turn[0].unwrap());
        with.push(turn[1].unwrap());
    }
    let mut ratios: Vec<f64> = with.iter().zip(&plain).map(|(t, p)| t / p).collect();
    let what = opts.join(" ");
    println!(
        "  the same set with {what}: median {:.3} s against {:.3} s without in turns (paired with/without {:.2})",
        median(&mut with),
        median(&mut plain),
        median(&mut ratios)
    );
}

/// The set merged to format 3 (its inputs' packets copied, headers rewritten), to format 2
/// (every event re-encoded), and copied with `cp` into a new directory, in turns (12 rounds,
/// each in another order, after one untimed round): the medians and the paired ratios.
fn copy_against_cp(set: &[PathBuf], out: &Path) {
    let dir = tempfile::tempdir().unwrap();
    let cp_dir = dir.path().join("cp");
    let run = |t: usize| -> f64 {
        if t < 2 {
            run_merge_with(set, out, &["--format", ["3", "2"][t]]).secs
        } else {
            let _ = std::fs::remove_dir_all(&cp_dir);
            std::fs::create_dir(&cp_dir).unwrap();
            run_child(Command::new("cp").args(set).arg(&cp_dir)).secs
        }
    };
    let mut times: [Vec<f64>; 3] = Default::default();
    for k in 0..13 {
        for j in 0..3 {
            let t = (j + k) % 3;
            let secs = run(t);
            if k > 0 {
                times[t].push(secs);
            }
        }
    }
    let ratio = |a: usize, b: usize| {
        let mut r: Vec<f64> = times[a].iter().zip(&times[b]).map(|(x, y)| x / y).collect();
        median(&mut r)
    };
    let (f3_cp, f2_cp, f2_f3) = (ratio(0, 2), ratio(1, 2), ratio(1, 0));
    let [mut f3, mut f2, mut cp] = times;
    println!(
        "  the same set to format 3 (packets copied): median {:.3} s; to format 2: {:.3} s; \
         cp of its files: {:.3} s, in turns (paired: format 3 / cp {f3_cp:.1}, format 2 / cp \
         {f2_cp:.1}, format 2 / format 3 {f2_f3:.2})",
        median(&mut f3),
        median(&mut f2),
        median(&mut cp),
    );
}

fn main() {
    let scale = scale();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("merged.ctf");

    let fork = fork(root);
    let bytes: u64 = fork
        .iter()
        .map(|p| std::fs::metadata(p).unwrap().len())
        .sum();
    let ocaml = ocaml_merge();
    // (24 runs of ours, 8 of the OCaml merge, in turns; before each, where the vCPUs are)
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    let (t, base) = timed_in_turns(
        true,
        8,
        3,
        0,
        || {
            let ns = round_trip_ns();
            let r = run_merge(&fork, &out);
            ours.push((r.secs, ns));
            r
        },
        ocaml.as_deref().map(|exe| {
            || {
                let ns = round_trip_ns();
                let r = run_ocaml(exe, &fork, &out);
                theirs.push((r.secs, ns));
                r
            }
        }),
    );
    let ev = events_of(&fork);
    println!(
        "fork/ (5 files, {:.1} MB, {} events): median {:.1} ms (best {:.1}), {}, {:.1} M events/s, peak RSS {} MB; {} (target 20x, under 50 MB)",
        bytes as f64 / 1e6,
        ev,
        t.median * 1e3,
        t.best * 1e3,
        t.cpu_ms(),
        ev as f64 / t.median / 1e6,
        t.rss.map(|k| format!("{:.1}", k as f64 / 1024.0)).unwrap_or("?".into()),
        ratios(t.median, OCAML_FORK_S, base.as_ref().map(|b| b.median))
    );
    if let Some(b) = &base {
        println!(
            "  the OCaml merge: median {:.2} s, {}",
            b.median,
            b.cpu_ms()
        );
    }
    // (the untimed first run of each is left out)
    let (ours, theirs) = (&ours[1..], theirs.get(1..).unwrap_or(&[]));
    let (o, c) = (by_placement(ours), by_placement(theirs));
    for (k, what) in ["close", "apart"].iter().enumerate() {
        let (n, secs, ns) = o[k];
        if n == 0 {
            continue;
        }
        let (m, theirs_secs, _) = c[k];
        let vs = if m > 0 {
            format!(
                ", {:.0}x the OCaml merge in its {m} run(s) so placed ({theirs_secs:.2} s)",
                theirs_secs / secs
            )
        } else {
            String::new()
        };
        println!(
            "  fork/ with the two vCPUs {what} (round trip {ns:.0} ns): {n} runs, median {:.1} ms, {:.0}x the given OCaml time{vs}",
            secs * 1e3,
            OCAML_FORK_S / secs
        );
    }

    let data = root.join("target/bench-data");
    let mut first_rss = None;
    // The set (paths 8-40 deep, changing at one allocation in 8), the same twice as long, a
    // set whose paths change twice as often (~94 MB), and one whose paths are 8-100 deep
    // (~100 MB, on which the OCaml merge takes the 31 s and 5.9 GB the issue names).
    for (length, switch, deepest) in [(1u64, 8u64, 40usize), (2, 8, 40), (1, 4, 40), (1, 11, 100)] {
        let t0 = Instant::now();
        let (name, what) = match (switch, deepest) {
            (8, 40) => (format!("v2-scale{scale}-x{length}"), ""),
            (_, 40) => (
                format!("v2-switch{switch}-scale{scale}-x{length}"),
                ", paths changing twice as often",
            ),
            _ => (
                format!("v2-switch{switch}-deep{deepest}-scale{scale}-x{length}"),
                ", paths 8-100 deep",
            ),
        };
        let shape = Shape { switch, deepest };
        let (set, bytes) = make_set(&data.join(name), scale, length, shape);
        let gen = t0.elapsed().as_secs_f64();
        let ev = events_of(&set);
        // (the OCaml merge holds every event in memory: timed once, between 4 runs of ours
        // and 3 more, on the sets of the first length only)
        let (t, base) = timed_in_turns(
            false,
            1,
            4,
            3,
            || run_merge(&set, &out),
            ocaml
                .as_deref()
                .filter(|_| length == 1)
                .map(|exe| || run_ocaml(exe, &set, &out)),
        );
        let base = base.map(|b| b.median);
        let s = t.median;
        let rss = t.rss;
        println!(
            "synthetic x{length}{what} (4 processes, {:.1} MB, {:.2} M events; generated in {:.1} s): median {:.3} s (best {:.3}), {}, {:.1} M events/s, {:.0} MB/s, peak RSS {} MB; {} (target 50x, under 128 MB)",
            bytes as f64 / 1e6,
            ev as f64 / 1e6,
            gen,
            s,
            t.best,
            t.cpu_ms(),
            ev as f64 / s / 1e6,
            bytes as f64 / s / 1e6,
            rss.map(|k| format!("{:.1}", k as f64 / 1024.0)).unwrap_or("?".into()),
            ratios(s, OCAML_BIG_S * scale * length as f64, base)
        );
        if (length, switch, deepest) == (1, 4, 40) {
            copy_against_cp(&set, &out);
        }
        if (switch, deepest) != (8, 40) {
            // (not a doubling of the first set)
        } else if length == 1 {
            first_rss = rss;
            options_in_turns(&set, &out, &["--tag-processes"]);
            options_in_turns(&set, &out, &["--format", "3"]);
        } else if let (Some(a), Some(b)) = (first_rss, rss) {
            println!(
                "peak RSS when the inputs double in length: {:.1} MB -> {:.1} MB ({:+.1}%)",
                a as f64 / 1024.0,
                b as f64 / 1024.0,
                100.0 * (b as f64 - a as f64) / a as f64
            );
        }
    }
}
