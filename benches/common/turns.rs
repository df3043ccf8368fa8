//! Programs timed in turns, so that a drift of this machine's speed meets them all, and the
//! figures of their runs; shared by the analysis and scale benches (included with `#[path]`).
use super::runs::{median, Run};

/// The runs of each program, in turns: an untimed run of each, then `rounds` rounds of one
/// run each, round `k` starting with program `k mod n`.
pub fn in_turns(rounds: usize, progs: &mut [&mut dyn FnMut() -> Run]) -> Vec<Vec<Run>> {
    for p in progs.iter_mut() {
        p();
    }
    let n = progs.len();
    let mut runs: Vec<Vec<Run>> = vec![Vec::new(); n];
    for k in 0..rounds {
        for j in 0..n {
            let i = (k + j) % n;
            runs[i].push(progs[i]());
        }
    }
    runs
}

/// The largest peak RSS (KiB) of some runs.
pub fn peak_rss(runs: &[Run]) -> Option<u64> {
    runs.iter().filter_map(|r| r.rss).max()
}

/// KiB as MiB with one decimal ("?" when unknown), which the benches print as "MB".
pub fn mib(kib: Option<u64>) -> String {
    kib.map(|k| format!("{:.1}", k as f64 / 1024.0))
        .unwrap_or("?".into())
}

/// The median of the rounds' ratios `a / b`.
pub fn paired(a: &[Run], b: &[Run]) -> f64 {
    let mut r: Vec<f64> = a.iter().zip(b).map(|(x, y)| x.secs / y.secs).collect();
    median(&mut r)
}

/// "median M ms (best B), CPU C ms, peak RSS R MB" of one program's runs, times in `unit`
/// ("ms" or "s").
pub fn summary(unit: &str, runs: &[Run]) -> String {
    let (k, digits) = if unit == "ms" { (1e3, 1) } else { (1.0, 3) };
    let mut t: Vec<f64> = runs.iter().map(|r| r.secs * k).collect();
    let mut c: Vec<f64> = runs.iter().map(|r| r.cpu * k).collect();
    let m = median(&mut t);
    format!(
        "median {m:.digits$} {unit} (best {:.digits$}), CPU {:.digits$} {unit}, peak RSS {} MB",
        t[0],
        median(&mut c),
        mib(peak_rss(runs))
    )
}
