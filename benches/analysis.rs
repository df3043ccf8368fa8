//! Analysis speed and memory: `memtrace-merge top --mode peak` on the five `fork/` traces,
//! on the merge bench's set whose call paths change twice as often (~94 MB, 11 M events) and
//! on that set twice as long, against `memtrace-merge merge` of the same inputs and against
//! memtrace's `hotspots` tool on the merged trace. The aim: the analysis no slower than the
//! merge, at least 10x faster than `hotspots`, and its peak RSS flat when the inputs double.
//!
//! Every program runs as a child (its peak RSS from `wait4`), its output to /dev/null (the
//! merge's to a file that does not exist yet, as a first merge does). They are timed in
//! turns, so that a drift of this machine's speed meets them all: an untimed run of each,
//! then rounds of one run each, the order turning from round to round. Ratios are the
//! median of each round's ratio; times the median and the best over rounds.
//!
//! Environment:
//! - `ANALYSIS_CMD`: the analysis, as words after `memtrace-merge` (default `top --mode
//!   peak`), the inputs after them; a first word holding a `/` is a program of its own, run
//!   with the other words and the inputs.
//! - `MEMTRACE_HOTSPOTS`: a build of memtrace's `hotspots` (`bin/hotspots.ml`, built against
//!   the memtrace library, which this repository does not hold); without it, the analysis
//!   is timed against the merge only.
//! - `MERGE_BENCH_SCALE`: as for the merge bench (`0.1` for a quick run); the sets are the
//!   merge bench's, kept under `target/bench-data/`.
//!
//! `cargo bench --bench analysis`.
#[path = "common/runs.rs"]
mod runs;
#[path = "common/sets.rs"]
mod sets;
#[path = "common/turns.rs"]
mod turns;

use runs::{cli, run_child, Run};
use sets::{events_of, fork, make_set, scale, Shape};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;
use turns::{in_turns, paired, peak_rss, summary};

/// The analysis timed: a program and its words before the inputs.
struct Analysis {
    program: PathBuf,
    args: Vec<String>,
}

impl Analysis {
    fn from_env() -> Analysis {
        let words = std::env::var("ANALYSIS_CMD").unwrap_or_else(|_| "top --mode peak".into());
        let mut args: Vec<String> = words.split_whitespace().map(String::from).collect();
        match args.first() {
            Some(w) if w.contains('/') => {
                let program = PathBuf::from(args.remove(0));
                Analysis { program, args }
            }
            _ => Analysis {
                program: cli(),
                args,
            },
        }
    }

    fn command(&self, inputs: &[PathBuf]) -> Command {
        let mut cmd = Command::new(&self.program);
        cmd.args(&self.args).args(inputs);
        cmd
    }

    /// What the report calls it.
    fn name(&self) -> String {
        let words = self.args.join(" ");
        if self.program == cli() {
            words
        } else {
            format!("{} {words}", self.program.display())
                .trim_end()
                .to_string()
        }
    }

    /// Stop the bench with a clear word if the analysis fails on `inputs` (a build without
    /// the subcommand), rather than with a panic in the middle of the turns.
    fn check(&self, inputs: &[PathBuf]) {
        let out = self.command(inputs).output().unwrap();
        if !out.status.success() {
            eprintln!(
                "the analysis `{}` failed on fork/: {}\n(set ANALYSIS_CMD to an analysis this build has)",
                self.name(),
                String::from_utf8_lossy(&out.stderr).trim_end()
            );
            std::process::exit(1);
        }
    }
}

/// A merge through the CLI into a fresh `out`.
fn run_merge(inputs: &[PathBuf], out: &Path) -> Run {
    let _ = std::fs::remove_file(out);
    let mut cmd = Command::new(cli());
    cmd.args(["merge", "-q", "-o"]).arg(out).args(inputs);
    run_child(&mut cmd)
}

/// `hotspots TRACE`.
fn run_hotspots(exe: &Path, trace: &Path) -> Run {
    run_child(Command::new(exe).arg(trace))
}

/// memtrace's `hotspots`, when a build of it is named by `MEMTRACE_HOTSPOTS`.
fn hotspots() -> Option<PathBuf> {
    std::env::var_os("MEMTRACE_HOTSPOTS")
        .map(PathBuf::from)
        .filter(|p| p.exists())
}

/// One set timed: the analysis and the merge in turns (and `hotspots` on the merged trace,
/// if given); returns the analysis's and the merge's peak RSS.
fn bench_set(
    what: &str,
    set: &[PathBuf],
    rounds: usize,
    analysis: &Analysis,
    hot: Option<&Path>,
    tmp: &Path,
) -> (Option<u64>, Option<u64>) {
    let out = tmp.join("merged.ctf");
    // (the merged trace `hotspots` reads: one merge, untimed, kept apart from the timed ones)
    let merged = tmp.join("merged-for-hotspots.ctf");
    let mut ours = || run_child(&mut analysis.command(set));
    let mut merge = || run_merge(set, &out);
    let runs = match hot {
        Some(exe) => {
            run_merge(set, &merged);
            let mut theirs = || run_hotspots(exe, &merged);
            in_turns(rounds, &mut [&mut ours, &mut merge, &mut theirs])
        }
        None => in_turns(rounds, &mut [&mut ours, &mut merge]),
    };
    println!("{what}, {rounds} rounds in turns:");
    println!(
        "  analysis ({}): {}",
        analysis.name(),
        summary("ms", &runs[0])
    );
    println!("  merge: {}", summary("ms", &runs[1]));
    if let Some(h) = runs.get(2) {
        println!("  hotspots on the merged trace: {}", summary("ms", h));
    }
    println!(
        "  analysis / merge: {:.2} (median of the rounds' ratios; target at most 1)",
        paired(&runs[0], &runs[1])
    );
    if let Some(h) = runs.get(2) {
        println!(
            "  hotspots / analysis: {:.1}x (median of the rounds' ratios; target at least 10x)",
            paired(h, &runs[0])
        );
    }
    let _ = std::fs::remove_file(&merged);
    (peak_rss(&runs[0]), peak_rss(&runs[1]))
}

fn main() {
    let scale = scale();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let tmp = tempfile::tempdir().unwrap();
    let analysis = Analysis::from_env();
    let hot = hotspots();
    if hot.is_none() {
        println!("(MEMTRACE_HOTSPOTS names no build of memtrace's hotspots: timed against the merge only)");
    }

    let fork = fork(root);
    analysis.check(&fork);
    let bytes: u64 = fork
        .iter()
        .map(|p| std::fs::metadata(p).unwrap().len())
        .sum();
    let what = format!(
        "fork/ (5 files, {:.1} MB, {} events)",
        bytes as f64 / 1e6,
        events_of(&fork)
    );
    bench_set(&what, &fork, 20, &analysis, hot.as_deref(), tmp.path());

    // The merge bench's set whose paths change twice as often (its name there, so that one
    // generation serves both benches), then the same twice as long.
    let data = root.join("target/bench-data");
    let mut first = (None, None);
    for length in [1u64, 2] {
        let t0 = Instant::now();
        let name = format!("v2-switch4-scale{scale}-x{length}");
        let shape = Shape {
            switch: 4,
            deepest: 40,
        };
        let (set, bytes) = make_set(&data.join(name), scale, length, shape);
        let what = format!(
            "synthetic x{length}, paths changing twice as often (4 processes, {:.1} MB, {:.2} M events; generated in {:.1} s)",
            bytes as f64 / 1e6,
            events_of(&set) as f64 / 1e6,
            t0.elapsed().as_secs_f64()
        );
        // (`hotspots` on the set of the first length only: the doubled one is for memory)
        let hot = hot.as_deref().filter(|_| length == 1);
        let rss = bench_set(&what, &set, 7, &analysis, hot, tmp.path());
        if length == 1 {
            first = rss;
            continue;
        }
        for (who, a, b) in [("analysis", first.0, rss.0), ("merge", first.1, rss.1)] {
            if let (Some(a), Some(b)) = (a, b) {
                println!(
                    "{who}'s peak RSS when the inputs double in length: {:.1} MB -> {:.1} MB ({:+.1}%)",
                    a as f64 / 1024.0,
                    b as f64 / 1024.0,
                    100.0 * (b as f64 - a as f64) / a as f64
                );
            }
        }
    }
}
