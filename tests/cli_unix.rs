//! The command line as a Unix user uses it: closed and full stdout and stderr, file size
//! limits, pipes and FIFOs as inputs, stdout and devices as outputs, signals, and the
//! messages it prints (`-q`, `--no-warnings`, rates, not-a-trace files, `--pid 0`). Each
//! case runs the real binary through `sh`, and checks its exit status and every line it
//! printed: never a panic, never an empty output with exit 0.

use memtrace_merge::tools::compare::{compare, CompareOptions};
use memtrace_merge::{Reader, TraceInfo, Writer, WriterOptions};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

fn data(p: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(p)
}

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_memtrace-merge")
}

/// Run `script` in `sh` in `dir`, with `$M` the binary and `$D` the test data directory.
fn sh(dir: &Path, script: &str) -> Output {
    Command::new("sh")
        .arg("-c")
        .arg(script)
        .env("M", bin())
        .env("D", data(""))
        .env("RUST_BACKTRACE", "1")
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// No panic, however the command ended.
fn no_panic(o: &Output) {
    let e = text(&o.stderr);
    assert!(
        !e.contains("panicked") && !e.contains("RUST_BACKTRACE") && o.status.code() != Some(101),
        "{:?}: {e}",
        o.status
    );
}

#[test]
fn a_closed_stdout_ends_every_command_quietly() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::copy(data("fork/child-3.ctf"), d.join("c.ctf")).unwrap();
    for cmd in [
        "info \"$D/fork/parent.ctf\"",
        "info --json \"$D/fork/parent.ctf\"",
        "dump \"$D/fork/child-3.ctf\"",
        "check \"$D/fork\"/*.ctf",
        "compare c.ctf \"$D/fork/child-3.ctf\"",
    ] {
        // (the reading side gone before the command writes: `sleep` lets it go first)
        let o = sh(
            d,
            &format!("(sleep 0.2; exec $M {cmd}) | true; echo $? >&2"),
        );
        no_panic(&o);
        let e = text(&o.stderr);
        // killed by SIGPIPE as `cat` is (128 + 13), or done before: nothing printed
        assert!(e == "141\n" || e == "0\n", "{cmd}: {e:?}");
        let o = sh(
            d,
            &format!("$M {cmd} | head -c 10 >/dev/null; echo ${{PIPESTATUS:-}}"),
        );
        no_panic(&o);
        assert!(text(&o.stderr).is_empty(), "{cmd}: {}", text(&o.stderr));
    }
}

#[test]
fn a_full_stdout_is_one_line_and_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::copy(data("fork/child-3.ctf"), d.join("c.ctf")).unwrap();
    for cmd in [
        "info \"$D/fork/parent.ctf\"",
        "dump \"$D/fork/child-4.ctf\"",
        "check \"$D/fork/parent.ctf\"",
        "compare c.ctf \"$D/fork/child-3.ctf\"",
    ] {
        let o = sh(d, &format!("exec $M {cmd} >/dev/full"));
        no_panic(&o);
        let e = text(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{cmd}: {e}");
        assert_eq!(e.lines().count(), 1, "{cmd}: {e}");
        assert!(
            e.starts_with("memtrace-merge: <stdout>: write: No space left on device"),
            "{cmd}: {e}"
        );
    }
}

#[test]
fn a_full_stderr_does_not_stop_a_merge() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let o = sh(
        d,
        "exec $M merge -o m.ctf \"$D/fork/child-4.ctf\" \"$D/truncated.ctf\" 2>/dev/full",
    );
    no_panic(&o);
    assert_eq!(o.status.code(), Some(0));
    let c = compare(
        &[data("fork/child-4.ctf"), data("truncated.ctf")],
        &d.join("m.ctf"),
        CompareOptions::default(),
    )
    .unwrap();
    assert!(c.equal(), "{c:?}");
}

#[test]
fn a_copy_past_the_file_size_limit_fails_with_a_message() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let o = sh(
        d,
        "ulimit -f 256 && exec $M copy \"$D/fork/parent.ctf\" out.ctf",
    );
    no_panic(&o);
    let e = text(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{:?}: {e}", o.status);
    assert!(e.contains("out.ctf: write: File too large"), "{e}");
    assert!(!d.join("out.ctf").exists());
}

#[test]
fn quiet_keeps_the_warnings_and_no_warnings_drops_them() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let run = |flags: &str| {
        let o = sh(
            d,
            &format!("exec $M merge {flags} -o m.ctf \"$D/fork/child-4.ctf\" \"$D/truncated.ctf\""),
        );
        no_panic(&o);
        assert_eq!(o.status.code(), Some(0), "{flags}: {}", text(&o.stderr));
        text(&o.stderr)
    };
    let all = run("");
    let warning = "warning: ";
    assert!(
        all.contains(warning) && all.contains("truncated packet"),
        "{all}"
    );
    assert!(all.contains("m.ctf: format 2,"), "{all}");
    let quiet = run("-q");
    assert!(quiet.lines().all(|l| l.starts_with(warning)), "{quiet}");
    assert!(quiet.contains("truncated packet"), "{quiet}");
    let none = run("--no-warnings");
    assert!(
        !none.contains(warning) && none.contains("m.ctf: format 2,"),
        "{none}"
    );
    assert_eq!(run("-q --no-warnings"), "");
    // the summary in plain words
    assert!(!all.contains("encoded ahead"), "{all}");
}

/// A trace of its info packet only (a worker killed before its first event packet).
fn empty_trace(path: &Path, rate: f64) {
    let info = TraceInfo {
        sample_rate: rate,
        ..Reader::open(data("fork/child-1.ctf"))
            .unwrap()
            .info()
            .clone()
    };
    let f = std::fs::File::create(path).unwrap();
    let mut w = Writer::new(f, &info, WriterOptions::default()).unwrap();
    w.set_end_without_empty_packet();
    w.finish().unwrap();
}

#[test]
fn an_input_without_allocations_does_not_set_the_rate() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    empty_trace(&d.join("killed.ctf"), 1e-5);
    let o = sh(d, "exec $M merge -o m.ctf \"$D/fork\" killed.ctf");
    no_panic(&o);
    let e = text(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{e}");
    let c = compare(&[data("fork")], &d.join("m.ctf"), CompareOptions::default()).unwrap();
    assert!(c.equal() && c.merged_allocs == 231_910, "{c:?}");
    assert_eq!(
        Reader::open(d.join("m.ctf")).unwrap().info().sample_rate,
        3e-4
    );
    assert!(
        e.contains("killed.ctf: sampled at rate 0.00001, but it holds no allocations"),
        "{e}"
    );
    // (and --rate-mismatch fail does not refuse for it)
    let o = sh(
        d,
        "exec $M merge --rate-mismatch fail -o m.ctf \"$D/fork\" killed.ctf",
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
}

#[test]
fn a_slow_input_of_few_allocations_is_said_to_cost_most_samples() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let o = sh(
        d,
        "exec $M merge -q -o m.ctf \"$D/fork\" \"$D/rates/slow.ctf\"",
    );
    no_panic(&o);
    let e = text(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{e}");
    let line = e
        .lines()
        .find(|l| l.contains("slow.ctf: sampled at 0.00001, the slowest rate"))
        .unwrap_or_else(|| panic!("{e}"));
    assert!(line.contains("hold 0.4% of all allocations"), "{line}");
    assert!(line.contains("keeps about 3.3% of their samples"), "{line}");
    let o = sh(
        d,
        "exec $M merge --rate-mismatch fail -o m.ctf \"$D/fork\" \"$D/rates/slow.ctf\"",
    );
    let e = text(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{e}");
    assert!(e.contains("--rate-mismatch thin"), "{e}");
}

#[test]
fn a_file_that_is_not_a_trace_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("notes.ctf"), b"hello\n").unwrap();
    std::fs::write(d.join("empty.ctf"), b"").unwrap();
    let head = std::fs::read(data("fork/parent.ctf")).unwrap();
    std::fs::write(d.join("cut.ctf"), &head[..30]).unwrap();
    for (f, want) in [
        (
            "notes.ctf",
            "notes.ctf: byte 0 (packet 0): not a memtrace trace (no CTF packet header)",
        ),
        (
            "empty.ctf",
            "empty.ctf: byte 0 (packet 0): not a memtrace trace (empty file)",
        ),
        ("cut.ctf", "cut.ctf: byte 0 (packet 0): truncated"),
    ] {
        for cmd in ["info", "merge -o m.ctf"] {
            let o = sh(d, &format!("exec $M {cmd} {f}"));
            no_panic(&o);
            let e = text(&o.stderr);
            assert_eq!(o.status.code(), Some(2), "{cmd} {f}: {e}");
            assert_eq!(e.lines().count(), 1, "{e}");
            assert!(
                e.starts_with(&format!("memtrace-merge: {want}")),
                "{cmd} {f}: {e}"
            );
        }
    }
}

#[test]
fn pid_0_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let o = sh(dir.path(), "exec $M merge --pid 0 -o m.ctf \"$D/fork\"");
    let e = text(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{e}");
    assert!(e.contains("pid 0 is not a process id"), "{e}");
    assert!(!dir.path().join("m.ctf").exists());
}

/// Every file left in `d`, sorted.
fn listing(d: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(d)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    v.sort();
    v
}

fn equal_to(out: &Path, sources: &[PathBuf]) {
    let c = compare(sources, out, CompareOptions::default()).unwrap();
    assert!(c.equal() && c.merged_allocs > 0, "{c:?}");
}

#[test]
fn pipes_are_read_once_and_merged_whole() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // (bash for <(...); a format-3 input of several domains is read a domain at a time)
    let o = Command::new("bash")
        .arg("-c")
        .arg("exec $M merge -q -o m.ctf <(cat \"$D/fork/parent.ctf\") \"$D/fork/child-1.ctf\" <(cat \"$D/v3/multidomain.ctf\")")
        .env("M", bin())
        .env("D", data(""))
        .current_dir(d)
        .output()
        .unwrap();
    no_panic(&o);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let sources = [
        data("fork/parent.ctf"),
        data("fork/child-1.ctf"),
        data("v3/multidomain.ctf"),
    ];
    equal_to(&d.join("m.ctf"), &sources);
    // /dev/stdin, and copy and info of a pipe
    let o = sh(
        d,
        "cat \"$D/v3/multidomain.ctf\" | $M merge -q -o s.ctf /dev/stdin",
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    equal_to(&d.join("s.ctf"), &[data("v3/multidomain.ctf")]);
    let o = sh(
        d,
        "cat \"$D/v3/multidomain.ctf\" | $M copy --format 2 /dev/stdin c.ctf",
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    equal_to(&d.join("c.ctf"), &[data("v3/multidomain.ctf")]);
    let o = sh(d, "cat \"$D/fork/child-2.ctf\" | $M info /dev/stdin");
    assert!(text(&o.stdout).contains("17,914"), "{}", text(&o.stdout));
    // an empty pipe is an error naming it, not an empty trace
    let o = sh(d, "true | $M merge -q -o e.ctf /dev/stdin");
    assert_eq!(o.status.code(), Some(2), "{}", text(&o.stderr));
    assert!(
        text(&o.stderr).contains("/dev/stdin: byte 0"),
        "{}",
        text(&o.stderr)
    );
    assert!(!d.join("e.ctf").exists());
}

#[test]
fn a_signal_stops_a_merge_waiting_for_a_fifo_at_once() {
    for sig in ["INT", "TERM"] {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let t0 = std::time::Instant::now();
        // (the FIFO has no writer: the merge waits to open it until the signal)
        let o = sh(
            d,
            &format!(
                "mkfifo f.ctf; $M merge -o m.ctf \"$D/fork/child-1.ctf\" f.ctf & p=$!; \
                 sleep 0.3; t=$(date +%s%N); kill -{sig} $p; wait $p; s=$?; \
                 echo \"$s $(( ($(date +%s%N) - t) / 1000000 ))\""
            ),
        );
        no_panic(&o);
        let out = text(&o.stdout);
        let (status, ms) = out.trim().split_once(' ').unwrap();
        assert_eq!(status, "130", "{sig}: {out} {}", text(&o.stderr));
        assert!(
            ms.parse::<u64>().unwrap() < 1000,
            "{sig}: stopped after {ms} ms"
        );
        assert!(t0.elapsed().as_secs() < 5);
        assert_eq!(
            text(&o.stderr),
            "memtrace-merge: interrupted; no output written\n"
        );
        assert_eq!(listing(d), ["f.ctf"], "{sig}: left behind");
    }
    // and with a writer, the FIFO is merged
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let o = sh(
        d,
        "mkfifo f.ctf; (sleep 0.2; cat \"$D/fork/child-2.ctf\" > f.ctf) & \
         exec timeout 10 $M merge -q -o m.ctf \"$D/fork/child-1.ctf\" f.ctf",
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    equal_to(
        &d.join("m.ctf"),
        &[data("fork/child-1.ctf"), data("fork/child-2.ctf")],
    );
}

#[test]
fn the_same_process_twice_is_merged_once() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::create_dir(d.join("t")).unwrap();
    for n in ["parent", "child-1", "child-2", "child-3", "child-4"] {
        std::fs::copy(data(&format!("fork/{n}.ctf")), d.join(format!("t/{n}.ctf"))).unwrap();
    }
    // a copy of a trace under another name
    std::fs::copy(data("fork/child-1.ctf"), d.join("t/child-1-copy.ctf")).unwrap();
    let o = sh(d, "exec $M merge -q -o m.ctf t");
    let e = text(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{e}");
    equal_to(&d.join("m.ctf"), &[data("fork")]);
    // (child-1-copy.ctf comes first in name order: it is kept)
    assert!(
        e.contains("warning: t/child-1-copy.ctf: t/child-1.ctf is a trace of the same process"),
        "{e}"
    );
    // two earlier merges, and the traces they hold, in one directory
    let o = sh(d, "$M merge -q -o t/merged.ctf t && cp t/merged.ctf t/merged-again.ctf && exec $M merge -q -o m2.ctf t");
    let e = text(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{e}");
    let c = compare(
        &[data("fork")],
        &d.join("m2.ctf"),
        CompareOptions::default(),
    )
    .unwrap();
    assert!(c.equal() && c.merged_allocs == 231_910, "{c:?}\n{e}");
    // (merged-again.ctf comes first in name order: it is kept, and holds the traces)
    assert!(
        e.contains("t/merged.ctf is an earlier merge of the same traces"),
        "{e}"
    );
    assert!(
        e.contains("t/merged-again.ctf: holds t/parent.ctf (pid 14495, the same start time)"),
        "{e}"
    );
    // --keep-duplicates merges each as given
    let o = sh(
        d,
        "exec $M merge -q --keep-duplicates -o m3.ctf t/child-1.ctf t/child-1-copy.ctf",
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let r =
        memtrace_merge::tools::check::check_file(d.join("m3.ctf"), &Default::default()).unwrap();
    assert_eq!(r.counts().split_whitespace().next(), Some("allocs=16672"));
}

#[test]
fn directory_entries_left_out_are_warned_of() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::create_dir(d.join("t")).unwrap();
    std::fs::copy(data("fork/child-1.ctf"), d.join("t/a.ctf")).unwrap();
    std::os::unix::fs::symlink("gone.ctf", d.join("t/dangling.ctf")).unwrap();
    std::fs::create_dir(d.join("t/sub.ctf")).unwrap();
    let o = sh(d, "exec $M merge -q -o m.ctf t");
    let e = text(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{e}");
    assert!(
        e.contains("warning: t/dangling.ctf: a symbolic link to nothing: left out"),
        "{e}"
    );
    assert!(
        e.contains("warning: t/sub.ctf: a directory, not a trace: left out"),
        "{e}"
    );
    // a merge with a context of the caller's into the directory, run again
    for _ in 0..2 {
        let o = sh(
            d,
            "exec $M merge -q --context 'nightly run' -o t/merged.ctf t",
        );
        assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    }
    equal_to(&d.join("t/merged.ctf"), &[data("fork/child-1.ctf")]);
}

#[test]
fn outputs_that_are_not_ours_to_replace_are_written_through() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let fork = [data("fork")];
    // -o -: the trace on stdout
    let o = sh(d, "exec $M merge -q -o - \"$D/fork\" > out.ctf");
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    equal_to(&d.join("out.ctf"), &fork);
    // /dev/stdout and /dev/null, written, not replaced
    let o = sh(
        d,
        "exec $M merge -q -o /dev/stdout \"$D/fork/child-1.ctf\" > so.ctf",
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    equal_to(&d.join("so.ctf"), &[data("fork/child-1.ctf")]);
    let o = sh(d, "exec $M merge -q -o /dev/null \"$D/fork/child-1.ctf\"");
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    use std::os::unix::fs::FileTypeExt;
    assert!(std::fs::metadata("/dev/null")
        .unwrap()
        .file_type()
        .is_char_device());
    // a symbolic link: its target is written, the link stays
    std::fs::write(d.join("real.ctf"), b"old").unwrap();
    std::os::unix::fs::symlink("real.ctf", d.join("link.ctf")).unwrap();
    let o = sh(d, "exec $M merge -q -o link.ctf \"$D/fork/child-1.ctf\"");
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert!(std::fs::symlink_metadata(d.join("link.ctf"))
        .unwrap()
        .file_type()
        .is_symlink());
    equal_to(&d.join("real.ctf"), &[data("fork/child-1.ctf")]);
    // a FIFO: written through to its reader
    let o = sh(
        d,
        "mkfifo p; (timeout 10 cat p > from-fifo.ctf) & timeout 10 $M merge -q -o p \"$D/fork/child-2.ctf\"; s=$?; wait; exit $s",
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    equal_to(&d.join("from-fifo.ctf"), &[data("fork/child-2.ctf")]);
    // a read-only output: refused, unless --force
    std::fs::write(d.join("ro.ctf"), b"keep").unwrap();
    let o = sh(
        d,
        "chmod 444 ro.ctf; exec $M merge -q -o ro.ctf \"$D/fork/child-1.ctf\"",
    );
    let e = text(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{e}");
    assert!(
        e.contains("ro.ctf: output exists and is read-only (--force replaces it)"),
        "{e}"
    );
    assert_eq!(std::fs::read(d.join("ro.ctf")).unwrap(), b"keep");
    let o = sh(
        d,
        "exec $M merge -q --force -o ro.ctf \"$D/fork/child-1.ctf\"",
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    equal_to(&d.join("ro.ctf"), &[data("fork/child-1.ctf")]);
}

#[test]
fn an_output_that_cannot_be_fails_before_the_work() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::create_dir(d.join("adir")).unwrap();
    for (out, want) in [
        (
            "newdir/x.ctf",
            "newdir/x.ctf: create output: No such file or directory",
        ),
        ("adir", "adir: output is a directory"),
        ("adir/", "adir/: output is a directory"),
    ] {
        // (a FIFO input that nobody writes: were the output made after the inputs are read,
        // this would wait forever; `timeout` ends it)
        let o = sh(
            d,
            &format!("mkfifo -m 600 f.ctf 2>/dev/null; exec timeout 5 $M merge -q -o {out} f.ctf"),
        );
        let e = text(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{out}: {e}");
        assert!(
            e.starts_with(&format!("memtrace-merge: {want}")),
            "{out}: {e}"
        );
        assert_eq!(e.lines().count(), 1, "{out}: {e}");
    }
}
