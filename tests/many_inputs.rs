//! 1,000 inputs in one merge, the process limited to 256 open files: the merge opens its
//! inputs lazily under a budget of half the limit, so it works; its time, peak resident set
//! and peak of open descriptors are measured (sampled from /proc while it runs) and bounded.
//! The analysis (`top`) of the same inputs under the same limit, likewise.
use memtrace_merge::AllocHeader;

use memtrace_merge::tools::compare::{compare, CompareOptions};
use memtrace_merge::{
    AllocSource, DomainId, Location, LocationCode, LocationList, Timestamp, TraceInfo, Writer,
    WriterOptions,
};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

const INPUTS: usize = 1000;
const ALLOCS_PER_INPUT: u64 = 300;
/// Peak resident set allowed for the merge. Past 256 inputs each reader holds a 1 KiB window
/// of its packet, the cache entries it used in a small hash table, location lists shared
/// with the other readers and a batch or two of a few dozen events: about 37 MiB for these
/// 1,000 inputs (50 MiB with 4 KiB windows and paged tables; 220 MiB while every input had
/// a 64 KiB buffer and 160 KiB of cache tables). The bound catches 27 KiB more per input.
const MAX_RSS_KIB: u64 = 64 * 1024;
/// The same for the analysis, which also keeps a tree of backtraces per process (about
/// 105 MiB here, 260 MiB while each input had a 64 KiB buffer and dense cache tables).
const MAX_TOP_RSS_KIB: u64 = 256 * 1024;

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_memtrace-merge")
}

/// The same executable in every process: codes 0x1000.. mean `work.ml:fN`.
fn table() -> HashMap<LocationCode, LocationList> {
    (0..40u64)
        .map(|i| {
            let l = Location {
                filename: Arc::from(&b"work.ml"[..]),
                line: i as u32 + 1,
                start_char: 2,
                end_char: 30,
                defname: Arc::from(format!("Work.f{i}").as_bytes()),
            };
            (LocationCode(0x1000 + i), Arc::from(vec![l]))
        })
        .collect()
}

/// A small trace of process `k`: its own pid, starting 1 ms after the previous process and
/// overlapping all the others in time.
fn write_input(path: &Path, k: u64, table: &HashMap<LocationCode, LocationList>) {
    let start = 1_796_000_000_000_000 + k * 1000;
    let info = TraceInfo {
        sample_rate: 1e-4,
        word_size: 64,
        executable_name: b"/usr/bin/worker".to_vec(),
        host_name: b"vm".to_vec(),
        ocaml_runtime_params: b"".to_vec(),
        pid: 10_000 + k,
        start_time: Timestamp(start),
        context: Some(format!("worker {k}").into_bytes()),
        initial_domain: DomainId(0),
        version: 2,
    };
    let f = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    let mut w = Writer::new(
        f,
        &info,
        WriterOptions {
            version: 2,
            lossless: true,
        },
    )
    .unwrap();
    let mut t = start;
    let mut live = Vec::new();
    for i in 0..ALLOCS_PER_INPUT {
        t += 1 + (i * 7 + k) % 3000;
        let depth = 1 + (i + k) % 12;
        let bt: Vec<LocationCode> = (0..depth)
            .map(|j| LocationCode(0x1000 + (j * 3 + (i + k) % 5) % 40))
            .collect();
        let id = w
            .put_alloc(
                &AllocHeader {
                    time: Timestamp(t),
                    domain: DomainId(0),
                    length: 1 + (i % 40),
                    nsamples: 1 + (i % 3 == 0) as u64,
                    source: if i % 17 == 0 {
                        AllocSource::Major
                    } else {
                        AllocSource::Minor
                    },
                },
                &bt,
                |c| table.get(&c).cloned(),
            )
            .unwrap();
        if i % 5 == 0 {
            w.put_promote(Timestamp(t), DomainId(0), id).unwrap();
        }
        live.push(id);
        if i % 2 == 1 {
            let victim = live.swap_remove((i as usize * 31) % live.len());
            t += 3;
            w.put_collect(Timestamp(t), DomainId(0), victim).unwrap();
        }
    }
    w.finish().unwrap();
}

struct Measured {
    code: Option<i32>,
    stdout: String,
    stderr: String,
    took: Duration,
    peak_rss_kib: u64,
    peak_fds: usize,
    samples: u64,
}

/// Run `memtrace-merge ARGS` through bash after `limits`, sampling the exec'd process's
/// VmHWM and number of open descriptors from /proc every millisecond.
fn run_measured(limits: &str, args: &[&std::ffi::OsStr]) -> Measured {
    use std::io::Read;
    let exe = Path::new(bin()).canonicalize().unwrap();
    let started = Instant::now();
    let mut child = Command::new("bash")
        .arg("-c")
        .arg(format!("{limits}\nexec \"$@\""))
        .arg("bash")
        .arg(bin())
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let read_all = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut v = Vec::new();
            r.read_to_end(&mut v).unwrap();
            v
        })
    };
    let t_out = read_all(Box::new(child.stdout.take().unwrap()));
    let t_err = read_all(Box::new(child.stderr.take().unwrap()));
    let pid = child.id();
    let (mut peak_rss, mut peak_fds, mut samples) = (0u64, 0usize, 0u64);
    let status = loop {
        // only once bash has exec'd the merge (before, it is bash or a copy of this process)
        if std::fs::read_link(format!("/proc/{pid}/exe"))
            .ok()
            .as_deref()
            == Some(&exe)
        {
            if let Ok(st) = std::fs::read_to_string(format!("/proc/{pid}/status")) {
                if let Some(v) = st
                    .lines()
                    .find(|l| l.starts_with("VmHWM:"))
                    .and_then(|l| l.split_whitespace().nth(1))
                    .and_then(|v| v.parse().ok())
                {
                    peak_rss = peak_rss.max(v);
                    samples += 1;
                }
            }
            if let Ok(d) = std::fs::read_dir(format!("/proc/{pid}/fd")) {
                peak_fds = peak_fds.max(d.count());
            }
        }
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if started.elapsed() > Duration::from_secs(300) {
            let _ = child.kill();
            panic!("merge of {INPUTS} inputs ran for more than 300 s");
        }
        std::thread::sleep(Duration::from_millis(1));
    };
    Measured {
        code: status.code(),
        stdout: String::from_utf8_lossy(&t_out.join().unwrap()).into_owned(),
        stderr: String::from_utf8_lossy(&t_err.join().unwrap()).into_owned(),
        took: started.elapsed(),
        peak_rss_kib: peak_rss,
        peak_fds,
        samples,
    }
}

#[test]
fn a_thousand_inputs_under_256_open_files() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("inputs");
    std::fs::create_dir(&dir).unwrap();
    let t = table();
    let t0 = Instant::now();
    let inputs: Vec<PathBuf> = (0..INPUTS)
        .map(|k| {
            let p = dir.join(format!("worker-{k:04}.ctf"));
            write_input(&p, k as u64, &t);
            p
        })
        .collect();
    let bytes: u64 = inputs
        .iter()
        .map(|p| std::fs::metadata(p).unwrap().len())
        .sum();
    println!(
        "{INPUTS} inputs, {bytes} bytes, written in {:?}",
        t0.elapsed()
    );
    let out = tmp.path().join("merged.ctf");
    // In format 3 every input's packets are copied, each input opened and closed again
    // under the same budget (they were all opened at once, and the 250th failed).
    for format in ["2", "3"] {
        let m = run_measured(
            "ulimit -n 256",
            &[
                "merge".as_ref(),
                "--format".as_ref(),
                format.as_ref(),
                "-o".as_ref(),
                out.as_os_str(),
                dir.as_os_str(),
            ],
        );
        println!(
            "format-{format} merge of {INPUTS} inputs under ulimit -n 256: {:?}, peak RSS {} KiB, peak open files {} ({} samples)",
            m.took, m.peak_rss_kib, m.peak_fds, m.samples
        );
        assert_eq!(m.code, Some(0), "{}", m.stderr);
        let copied = m.stderr.matches("its packets copied").count();
        assert_eq!(copied, if format == "3" { INPUTS } else { 0 });
        assert!(!m.stderr.contains("warning"), "{}", m.stderr);
        assert!(m.samples > 0, "the merge was never sampled");
        // the input pool keeps at most half the limit (128) open; then stdio, the output
        // and whatever else the process holds (a few)
        assert!(m.peak_fds <= 128 + 16, "peak open files {}", m.peak_fds);
        assert!(
            m.peak_rss_kib < MAX_RSS_KIB,
            "peak RSS {} KiB",
            m.peak_rss_kib
        );
        // every allocation of every input, exactly
        let t1 = Instant::now();
        let c = compare(&inputs, &out, CompareOptions::default()).unwrap();
        assert!(c.equal(), "{c:?}");
        assert_eq!(c.merged_allocs, INPUTS as u64 * ALLOCS_PER_INPUT);
        println!("compared in {:?}", t1.elapsed());
        let rep = memtrace_merge::tools::check::check_file(&out, &Default::default()).unwrap();
        assert!(rep.is_valid(), "{:?}", rep.problems);
    }
    // the analysis takes what the merge takes: the same inputs under the same limit, its
    // allocations those of the merge
    let a = run_measured(
        "ulimit -n 256",
        &[
            "top".as_ref(),
            "--json".as_ref(),
            "-n".as_ref(),
            "1".as_ref(),
            dir.as_os_str(),
        ],
    );
    println!(
        "top of {INPUTS} inputs under ulimit -n 256: {:?}, peak RSS {} KiB, peak open files {}",
        a.took, a.peak_rss_kib, a.peak_fds
    );
    assert_eq!(a.code, Some(0), "{}", a.stderr);
    assert!(a.peak_fds <= 128 + 16, "peak open files {}", a.peak_fds);
    assert!(
        a.peak_rss_kib < MAX_TOP_RSS_KIB,
        "peak RSS {} KiB",
        a.peak_rss_kib
    );
    let j: serde_json::Value = serde_json::from_str(&a.stdout).unwrap();
    assert_eq!(j["processes"].as_array().unwrap().len(), INPUTS);
    assert_eq!(j["total"]["allocations"], INPUTS as u64 * ALLOCS_PER_INPUT);
}
