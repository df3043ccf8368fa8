//! The analysis against tools we did not write: memtrace's own hotspots and flamegraph
//! (their outputs for `tests/data` traces recorded in `tests/data/reference/`).

use memtrace_merge::analysis::{analyze, AnalysisOptions, By, Mode, Weight};
use std::path::{Path, PathBuf};

const TRACES: [&str; 8] = [
    "fork/parent",
    "fork/child-1",
    "fork/child-2",
    "fork/child-3",
    "fork/child-4",
    "long",
    "external",
    "bytecode",
];

fn data(p: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(p)
}

/// hotspots' size, from samples as it computes it (samples / rate x 8).
fn hot_bytes(n: f64) -> String {
    if n < 100.0 {
        format!("{n:4.0} B")
    } else if n < 100.0 * 1024.0 {
        format!("{:4.1} kB", n / 1024.0)
    } else if n < 100.0 * 1024.0 * 1024.0 {
        format!("{:4.1} MB", n / 1024.0 / 1024.0)
    } else {
        format!("{:4.1} GB", n / 1024.0 / 1024.0 / 1024.0)
    }
}

#[test]
fn sites_agree_with_memtrace_hotspots() {
    for t in TRACES {
        let a = analyze(&[data(&format!("{t}.ctf"))], &AnalysisOptions::default()).unwrap();
        let rate = a.processes()[0].sample_rate;
        let top = a.top(Mode::Alloc, By::Function, false);
        let total: u64 = top.sites.iter().map(|s| s.samples).sum();
        let mut ours: Vec<String> = (top.sites.iter())
            .filter(|s| s.samples as f64 / total as f64 > 0.005)
            .map(|s| {
                let f = &s.frames[0];
                let pct = 100.0 * s.samples as f64 / total as f64;
                let b = hot_bytes(s.samples as f64 / rate * 8.0);
                format!("{b} ({pct:4.1}%) at {} ({}:", f.function, f.file)
            })
            .collect();
        let reference =
            std::fs::read_to_string(data(&format!("reference/{}.hotspots", t.replace('/', "-"))))
                .unwrap();
        let mut theirs: Vec<String> = (reference.lines())
            .filter(|l| l.contains(") at "))
            // (up to the file name: the lines after it are By::Location's business)
            .map(|l| {
                let cut = l.rfind(" (").unwrap();
                l[..=cut + l[cut..].find(':').unwrap()].to_string()
            })
            .collect();
        ours.sort();
        theirs.sort();
        assert_eq!(ours, theirs, "{t}");
    }
}

#[test]
fn folded_stacks_agree_with_memtrace_flamegraph() {
    for t in TRACES {
        let a = analyze(&[data(&format!("{t}.ctf"))], &AnalysisOptions::default()).unwrap();
        let mut ours: Vec<String> = (a.folded(Mode::Alloc, Weight::Samples, false).into_iter())
            .filter(|(s, _)| s.contains(';'))
            .map(|(s, w)| format!("{s} {w}"))
            .collect();
        let reference =
            std::fs::read_to_string(data(&format!("reference/{}.folded", t.replace('/', "-"))))
                .unwrap();
        let mut theirs: Vec<String> = reference.lines().map(String::from).collect();
        ours.sort();
        theirs.sort();
        assert_eq!(ours, theirs, "{t}");
    }
}

/// The stacks (what pprof exports) add up to the processes' figures, and an OCaml 5 trace's
/// allocations keep their domains: the per-domain counts of the reference dump.
#[test]
fn stacks_add_up_and_keep_domains() {
    let a = analyze(&[data("fork/")], &AnalysisOptions::default()).unwrap();
    let ps = a.processes();
    for mode in [Mode::Peak, Mode::End] {
        let stacks = a.stacks(mode);
        for (i, p) in ps.iter().enumerate() {
            let mine: Vec<_> = stacks.iter().filter(|s| s.process == i).collect();
            let sum = |f: fn(&&memtrace_merge::analysis::Stack) -> u64| -> u64 {
                mine.iter().map(f).sum()
            };
            assert_eq!(sum(|s| s.allocations), p.allocations);
            assert_eq!(sum(|s| s.allocated_bytes), p.allocated_bytes);
            if mode == Mode::End {
                assert_eq!(sum(|s| s.live_bytes), p.end_bytes, "{}", p.pid);
            }
        }
        let live: u64 = stacks.iter().map(|s| s.live_bytes).sum();
        if mode == Mode::Peak {
            assert_eq!(live, a.total().peak_bytes);
        }
    }
    let a = analyze(&[data("ocaml5/perdomain.ctf")], &AnalysisOptions::default()).unwrap();
    let mut per_domain = std::collections::BTreeMap::<u16, u64>::new();
    for s in a.stacks(Mode::Alloc) {
        *per_domain.entry(s.domain).or_default() += s.allocations;
    }
    // (the reference dump gives each allocation's domain as `dom=N`)
    let mut dump = String::new();
    let gz = std::fs::File::open(data("ocaml5/perdomain.dump.gz")).unwrap();
    std::io::Read::read_to_string(&mut flate2::read::GzDecoder::new(gz), &mut dump).unwrap();
    let mut theirs = std::collections::BTreeMap::<u16, u64>::new();
    for l in dump.lines().filter(|l| l.contains(" alloc")) {
        let d = l.split_once(" dom=").unwrap().1.split(' ').next().unwrap();
        *theirs.entry(d.parse().unwrap()).or_default() += 1;
    }
    assert!(per_domain.len() > 1, "{per_domain:?}");
    assert_eq!(per_domain, theirs);
}

/// A trace of `exe` (pid `pid`) whose codes 100..106 mean `file:f<i>`, with allocations at
/// backtraces of those codes, some collected.
fn write_executable(path: &Path, pid: u64, exe: &str, file: &str) {
    use memtrace_merge::{
        AllocHeader, AllocSource, DomainId, Location, LocationCode, LocationList, Timestamp,
        TraceInfo, Writer, WriterOptions,
    };
    use std::sync::Arc;
    let info = TraceInfo {
        sample_rate: 1e-4,
        word_size: 64,
        executable_name: exe.as_bytes().to_vec(),
        host_name: b"test".to_vec(),
        ocaml_runtime_params: b"".to_vec(),
        pid,
        start_time: Timestamp(1_000_000),
        context: None,
        initial_domain: DomainId(0),
        version: 2,
    };
    let opts = WriterOptions {
        version: 2,
        lossless: true,
    };
    let mut w = Writer::new(std::fs::File::create(path).unwrap(), &info, opts).unwrap();
    let locs = |c: LocationCode| -> Option<LocationList> {
        let i = c.0 - 100;
        Some(Arc::from(vec![Location {
            filename: Arc::from(file.as_bytes()),
            line: i as u32 + 1,
            start_char: 1,
            end_char: 9,
            defname: Arc::from(format!("f{i}").as_bytes()),
        }]))
    };
    let mut t = 1_000_000;
    for k in 0..300u64 {
        t += 10;
        let bt: Vec<LocationCode> = (0..1 + k % 5)
            .map(|i| LocationCode(100 + (k + i) % 6))
            .collect();
        let header = AllocHeader {
            time: Timestamp(t),
            domain: DomainId(0),
            length: 3,
            nsamples: 1 + k % 4,
            source: AllocSource::Minor,
        };
        let id = w.put_alloc(&header, &bt, locs).unwrap();
        if k % 2 == 0 {
            w.put_collect(Timestamp(t + 1), DomainId(0), id).unwrap();
        }
    }
    w.finish().unwrap();
}

/// Processes share the tree of backtraces, but each names its frames with its own location
/// table: two executables whose codes mean other things never lend each other names.
#[test]
fn each_process_names_its_own_frames() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a.ctf"), dir.path().join("b.ctf"));
    write_executable(&a, 1, "a.exe", "a.ml");
    write_executable(&b, 2, "b.exe", "b.ml");
    let an = analyze(&[a, b], &AnalysisOptions::default()).unwrap();
    let file_of = |p: usize| ["a.ml", "b.ml"][p];
    for by in [By::Function, By::Location, By::Backtrace] {
        for mode in [Mode::Alloc, Mode::Peak, Mode::End] {
            let top = an.top(mode, by, true);
            for (p, sites) in top.process_sites.iter().enumerate() {
                assert!(!sites.is_empty() || mode != Mode::Alloc);
                for s in sites {
                    assert!(
                        s.frames.iter().all(|f| f.file == file_of(p)),
                        "{by:?} {mode:?} {s:?}"
                    );
                }
            }
            // (the run's table names each process's sites apart)
            let files: std::collections::HashSet<&str> = (top.sites.iter())
                .flat_map(|s| s.frames.iter().map(|f| f.file.as_str()))
                .collect();
            if mode == Mode::Alloc {
                assert_eq!(files.len(), 2, "{by:?}");
            }
        }
    }
    for s in an.stacks(Mode::Alloc) {
        assert!(s
            .frames
            .iter()
            .flatten()
            .all(|f| f.file == file_of(s.process)));
    }
    for (stack, _) in an.folded(Mode::Alloc, Weight::Bytes, true) {
        let pid_a = stack.starts_with("pid 1 ");
        assert!(
            stack.split(';').skip(1).all(|f| f.starts_with('f')),
            "{stack}"
        );
        assert!(pid_a || stack.starts_with("pid 2 "), "{stack}");
    }
    let callers = an.callers(Mode::Alloc, Some(1));
    assert!(!callers.is_empty());
    for (site, cs) in callers {
        assert_eq!(site[0].file, "b.ml");
        assert!(cs
            .iter()
            .filter_map(|c| c.frame.as_ref())
            .all(|f| f.file == "b.ml"));
    }
}
