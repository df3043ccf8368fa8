//! What the report page reads beside the tables, held against the analysis's own reports:
//! callers against the backtrace table, one process's sites and folded stacks against the
//! per-process table and its figures, the time window against the options.

use memtrace_merge::analysis::{
    analyze, AnalysisOptions, By, Filter, Frame, Mode, TimeSpec, Weight,
};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

fn fork() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/fork")
}

const MODES: [Mode; 3] = [Mode::Alloc, Mode::Peak, Mode::End];

/// A function site as `top --by function` names it: the frame without line or columns.
fn function_of(f: &Frame) -> Frame {
    let mut f = f.clone();
    f.line = 0;
    f.columns = (0, 0);
    f
}

/// A frame whose code no location defined.
fn unknown(f: &Frame) -> bool {
    f.function == "??" && f.file.starts_with('#')
}

/// The function site of a backtrace (caller first) as `top --by function` takes it (the
/// innermost location, of up to two frames above when a frame's code names none), and the
/// location before it.
fn site_and_caller(frames: &[Frame]) -> (Vec<Frame>, Option<Frame>) {
    let k = frames.len();
    let trailing = frames.iter().rev().take_while(|f| unknown(f)).count();
    if trailing >= 3 || trailing == k {
        return (vec![frames[k - 1].clone()], None);
    }
    let point = k - 1 - trailing;
    let caller = frames[..point].iter().rev().find(|f| !unknown(f)).cloned();
    (vec![function_of(&frames[point])], caller)
}

/// Each function site's callers, summed from the backtrace table: the frame before the
/// allocation point, caller first.
#[test]
fn callers_sum_the_backtraces_through_each_site() {
    let a = analyze(&[fork()], &AnalysisOptions::default()).unwrap();
    let n = a.processes().len();
    for mode in MODES {
        for process in [None, Some(0), Some(n - 1)] {
            let traces = match process {
                None => a.top(mode, By::Backtrace, false).sites,
                Some(p) => a.process_top(mode, By::Backtrace, p),
            };
            let mut want: HashMap<Vec<Frame>, HashMap<Option<Frame>, u64>> = HashMap::new();
            for t in &traces {
                let (site, caller) = site_and_caller(&t.frames);
                *want.entry(site).or_default().entry(caller).or_default() += t.value;
            }
            let got = a.callers(mode, process);
            assert_eq!(got.len(), want.len(), "{mode:?} {process:?}");
            for (site, callers) in &got {
                let values: Vec<u64> = callers.iter().map(|c| c.value).collect();
                assert!(
                    values.windows(2).all(|w| w[0] >= w[1]),
                    "{site:?}: {values:?}"
                );
                let as_map: HashMap<Option<Frame>, u64> = (callers.iter())
                    .map(|c| (c.frame.clone(), c.value))
                    .collect();
                assert_eq!(
                    Some(&as_map),
                    want.get(site),
                    "{mode:?} {process:?} {site:?}"
                );
            }
            // every function site of the table has callers worth its value
            let sites = match process {
                None => a.top(mode, By::Function, false).sites,
                Some(p) => a.process_top(mode, By::Function, p),
            };
            assert!(!sites.is_empty());
            for s in &sites {
                let sum: u64 = got[&s.frames].iter().map(|c| c.value).sum();
                assert_eq!(sum, s.value, "{mode:?} {process:?} {:?}", s.frames);
            }
        }
    }
    // a real program's allocating function is called from somewhere
    let got = a.callers(Mode::Alloc, None);
    assert!(got.values().flatten().any(|c| c.frame.is_some()));
}

/// One process's sites are its table of `top --per-process`.
#[test]
fn one_process_sites_are_its_per_process_table() {
    let a = analyze(&[fork()], &AnalysisOptions::default()).unwrap();
    for mode in MODES {
        let t = a.top(mode, By::Function, true);
        for (p, rows) in t.process_sites.iter().enumerate() {
            assert_eq!(&a.process_top(mode, By::Function, p), rows, "{mode:?} {p}");
        }
    }
}

/// The folded stacks of the run are `folded`'s; a process's add up to its figure (at the
/// peak: its own), and are stacks of the run's.
#[test]
fn folded_bytes_are_the_run_and_each_process() {
    let a = analyze(&[fork()], &AnalysisOptions::default()).unwrap();
    let ps = a.processes();
    let chosen = [3, 0];
    let all = a.folded_bytes(&MODES, &chosen);
    assert_eq!(all.len(), 3);
    for (m, mode) in MODES.into_iter().enumerate() {
        assert_eq!(all[m].len(), 3);
        assert_eq!(all[m][0], a.folded(mode, Weight::Bytes, false), "{mode:?}");
        let run: HashMap<&str, u64> = all[m][0].iter().map(|(s, w)| (s.as_str(), *w)).collect();
        for (k, &p) in chosen.iter().enumerate() {
            let stacks = &all[m][1 + k];
            let sum: u64 = stacks.iter().map(|(_, w)| w).sum();
            let want = match mode {
                Mode::Alloc => ps[p].allocated_bytes,
                Mode::Peak => ps[p].peak_bytes,
                _ => ps[p].end_bytes,
            };
            assert_eq!(sum, want, "{mode:?} process {p}");
            assert!(!stacks.is_empty());
            if mode != Mode::Peak {
                assert!(stacks.iter().all(|(s, w)| run[s.as_str()] >= *w));
            }
        }
    }
}

/// `--from`/`--to` as times since the epoch.
#[test]
fn the_window_is_the_filter() {
    let opts = AnalysisOptions {
        filter: Filter {
            from: Some(TimeSpec::SinceStart(1.0)),
            to: Some(TimeSpec::SinceStart(2.5)),
            ..Filter::default()
        },
        ..AnalysisOptions::default()
    };
    let a = analyze(&[fork()], &opts).unwrap();
    let s = a.start_us();
    assert_eq!(a.window_us(), (Some(s + 1_000_000), Some(s + 2_500_000)));
    let a = analyze(&[fork()], &AnalysisOptions::default()).unwrap();
    assert_eq!(a.window_us(), (None, None));
}

/// With a window that has a start, a backtrace's live objects (and samples) are estimated
/// at the ratio of objects to bytes of all it allocated up to the window's end, before the
/// window too: as the analysis without a window gives them, also where nothing was
/// allocated in it.
#[test]
fn live_objects_before_the_window_are_estimated_from_all_allocations() {
    let windowed = AnalysisOptions {
        filter: Filter {
            from: Some(TimeSpec::SinceStart(1.0)),
            ..Filter::default()
        },
        ..AnalysisOptions::default()
    };
    let w = analyze(&[fork()], &windowed).unwrap();
    let all = analyze(&[fork()], &AnalysisOptions::default()).unwrap();
    let key = |s: &memtrace_merge::analysis::Stack| {
        (s.process, s.domain, s.source as u8, s.frames.clone())
    };
    let ratio: HashMap<_, f64> = (all.stacks(Mode::End).iter())
        .filter(|s| s.allocated_bytes > 0)
        .map(|s| (key(s), s.allocated_objects / s.allocated_bytes as f64))
        .collect();
    let mut before_only = 0;
    for s in w.stacks(Mode::End).iter().filter(|s| s.live_bytes > 0) {
        let want = ratio[&key(s)] * s.live_bytes as f64;
        assert!(
            (s.live_objects - want).abs() <= 1e-9 * want,
            "{:?}: {} live objects, {want} expected",
            s.frames.last(),
            s.live_objects
        );
        before_only += usize::from(s.allocations == 0);
    }
    assert!(
        before_only > 0,
        "no backtrace live only from before the window"
    );
    // (the heap at the end is the same with the window or without: so are its weights)
    for weight in [Weight::Bytes, Weight::Samples, Weight::Objects] {
        assert_eq!(
            w.folded(Mode::End, weight, true),
            all.folded(Mode::End, weight, true),
            "{weight:?}"
        );
    }
}

/// With `--from`, the timeline holds the window only: it starts at the step of the window's
/// start, and its largest values are the peaks the analysis gives (the run's and each
/// process's, taken in the window), though the heap before the window was larger.
#[test]
fn the_timeline_is_the_window() {
    for from in [0.5, 1.5, 2.355, 3.0] {
        let opts = AnalysisOptions {
            filter: Filter {
                from: Some(TimeSpec::SinceStart(from)),
                ..Filter::default()
            },
            ..AnalysisOptions::default()
        };
        let a = analyze(&[fork()], &opts).unwrap();
        let tl = a.timeline();
        let at = a.start_us() + (from * 1e6).round() as u64;
        let first = tl.start_us + tl.first_step as u64 * tl.step_us;
        assert!(first <= at && at < first + tl.step_us, "--from {from}");
        let total = a.total();
        let most = tl.rows.iter().map(|r| r.0).max();
        assert_eq!(most, Some(total.peak_bytes), "--from {from}: the run");
        for (p, s) in a.processes().iter().enumerate() {
            let most = tl
                .rows
                .iter()
                .map(|r| r.1.get(p).copied().unwrap_or(0))
                .max();
            assert_eq!(most, Some(s.peak_bytes), "--from {from}: pid {}", s.pid);
        }
    }
}

/// `--domain`: each domain's figures add up to the process's. A domain's objects collected
/// by another (OCaml 5 hands a terminated domain's blocks over) are collected in its
/// figures too, so that its heap at the end is not overstated.
#[test]
fn the_domains_add_up_to_their_process() {
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data");
    for name in ["ocaml5/perdomain.ctf", "ocaml5/handover/many.ctf"] {
        let input = [data.join(name)];
        let all = analyze(&input, &AnalysisOptions::default())
            .unwrap()
            .total();
        let (mut allocations, mut allocated, mut end, mut domains) = (0, 0, 0, 0);
        for d in 0..=u16::MAX {
            let mut opts = AnalysisOptions::default();
            opts.filter.domain = Some(d);
            let Ok(a) = analyze(&input, &opts) else {
                // (domains are numbered from 0 up: past the last, none)
                break;
            };
            let t = a.total();
            allocations += t.allocations;
            allocated += t.allocated_bytes;
            end += t.end_bytes;
            domains += 1;
        }
        assert!(domains >= 5, "{name}: {domains} domains");
        assert_eq!(allocations, all.allocations, "{name}");
        assert_eq!(allocated, all.allocated_bytes, "{name}");
        assert_eq!(end, all.end_bytes, "{name}: the heap at the end");
    }
}
