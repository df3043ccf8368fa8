//! The command line as a Unix user uses it: closed and full stdout and stderr, file size
//! limits, pipes and FIFOs as inputs, stdout and devices as outputs, signals, and the
//! messages it prints (`-q`, `--no-warnings`, rates, not-a-trace files, `--pid 0`). Each
//! case runs the real binary through `sh`, and checks its exit status and every line it
//! printed: never a panic, never an empty output with exit 0.

use memtrace_merge::compare::{compare, CompareOptions};
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
        "exec $M merge -o m.ctf \"$D/fork\" \"$D/truncated.ctf\" 2>/dev/full",
    );
    no_panic(&o);
    assert_eq!(o.status.code(), Some(0));
    let c = compare(
        &[data("fork"), data("truncated.ctf")],
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
