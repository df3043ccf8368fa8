//! Golden tests: the library's dump of every trace under tests/data (and of the optional
//! ../shared/corpus/ocamlopt.ctf) must equal the reference dump tool's output byte for byte,
//! fail where the reference failed (after printing the same stdout) and warn where it warned.
//!
//! References beside `NAME.ctf`: `NAME.dump` (compared exactly), or `NAME.dump.gz` (streamed
//! and compared on the fly) with `NAME.dump.sha256` (sha256, byte and line counts of the
//! unpacked dump); `NAME.stderr` gives the reference tool's exit status.
//!
//! `BLESS=1 cargo test --test golden` writes our output as `NAME.dump` (and `NAME.stderr`
//! when we warned or failed) for traces that have no reference at all; it never overwrites
//! an existing reference.

mod common;

use common::*;
use memtrace_merge::tools::dump;
use memtrace_merge::Reader;
use std::io::Read;
use std::path::Path;

/// What our dump did.
struct Outcome {
    sha256: String,
    bytes: u64,
    lines: u64,
    mismatch: Option<Mismatch>,
    result: Result<(), String>,
    warnings: Vec<String>,
}

fn run_dump(ctf: &Path, expected: Option<Box<dyn Read>>) -> Outcome {
    let mut out = CheckingWriter::new(expected);
    let mut warnings = Vec::new();
    let result = match Reader::open(ctf) {
        Ok(mut r) => dump::dump(&mut r, &mut out, |w| warnings.push(w.to_string()))
            .map_err(|e| e.to_string()),
        Err(e) => Err(e.to_string()),
    };
    let (sha256, bytes, lines, mismatch) = out.finish();
    Outcome {
        sha256,
        bytes,
        lines,
        mismatch,
        result,
        warnings,
    }
}

/// Write our output as the reference of a trace that has none (BLESS=1).
fn bless_trace(ctf: &Path) {
    let mut out = Vec::new();
    let mut warnings = Vec::new();
    let result = match Reader::open(ctf) {
        Ok(mut r) => dump::dump(&mut r, &mut out, |w| warnings.push(w.to_string()))
            .map_err(|e| e.to_string()),
        Err(e) => Err(e.to_string()),
    };
    let dump_path = sibling(ctf, "dump");
    std::fs::write(&dump_path, &out).unwrap();
    eprintln!("blessed {} ({} bytes)", dump_path.display(), out.len());
    let status = if result.is_err() { 2 } else { 0 };
    if result.is_err() || !warnings.is_empty() {
        let mut text = String::new();
        for w in &warnings {
            text.push_str(w);
            text.push('\n');
        }
        if let Err(e) = &result {
            text.push_str(e);
            text.push('\n');
        }
        text.push_str(&format!("[exit status: {status}]\n"));
        std::fs::write(sibling(ctf, "stderr"), text).unwrap();
    }
}

fn check_golden(ctf: &Path) {
    assert!(ctf.is_file(), "{} is missing", ctf.display());
    let dump_path = sibling(ctf, "dump");
    let gz_path = sibling(ctf, "dump.gz");
    let sha_path = sibling(ctf, "dump.sha256");
    let has_ref = dump_path.is_file() || gz_path.is_file() || sha_path.is_file();
    if !has_ref {
        if bless() {
            bless_trace(ctf);
            return;
        }
        panic!("{}: no reference dump (NAME.dump, NAME.dump.gz or NAME.dump.sha256); run with BLESS=1 to create one", ctf.display());
    }

    let sha = sha_path.is_file().then(|| parse_dump_sha(&sha_path));
    let stderr = parse_stderr(&sibling(ctf, "stderr"));
    let expected = open_reference_dump(ctf);
    let exit_status = stderr
        .as_ref()
        .map(|s| s.exit_status)
        .or(sha.as_ref().and_then(|s| s.exit_status))
        .unwrap_or(0);
    if let (Some(s), Some(sha)) = (&stderr, &sha) {
        if let Some(st) = sha.exit_status {
            assert_eq!(
                s.exit_status,
                st,
                "{}: .stderr and .dump.sha256 disagree on the exit status",
                ctf.display()
            );
        }
    }

    let o = run_dump(ctf, expected);
    let name = ctf.display();
    eprintln!(
        "{name}: {} bytes, {} lines, sha256 {}, result {:?}, {} warning(s)",
        o.bytes,
        o.lines,
        o.sha256,
        o.result,
        o.warnings.len()
    );
    for w in o.warnings.iter().take(5) {
        eprintln!("  warning: {w}");
    }
    let mut problems = Vec::new();
    if let Some(m) = &o.mismatch {
        problems.push(format!("dump differs from the reference: {}", m.report()));
    }
    if let Some(sha) = &sha {
        if (o.sha256.as_str(), o.bytes, o.lines) != (sha.sha256.as_str(), sha.bytes, sha.lines) {
            problems.push(format!(
                "dump sha256/bytes/lines {} {} {} != reference {} {} {}",
                o.sha256, o.bytes, o.lines, sha.sha256, sha.bytes, sha.lines
            ));
        }
    }
    match (&o.result, exit_status) {
        (Ok(()), 0) => {}
        (Err(e), 0) => problems.push(format!(
            "our dump failed ({e}) where the reference succeeded"
        )),
        // A file cut inside a packet header crashes the reference ("Buffer underflow");
        // our reader deliberately ends the trace there with a warning instead, after the
        // same events.
        (Ok(()), _)
            if !o.warnings.is_empty()
                && o.warnings
                    .iter()
                    .any(|w| w.contains("inside a packet header")) => {}
        (Ok(()), st) => problems.push(format!(
            "our dump succeeded where the reference failed with exit status {st} ({:?})",
            stderr.as_ref().map(|s| &s.lines)
        )),
        (Err(e), _) => {
            // Our error must say where: the file and a byte offset.
            if !(e.contains(&ctf.display().to_string()) && e.contains("byte ")) {
                problems.push(format!(
                    "error does not name the file and a byte offset: {e}"
                ));
            }
        }
    }
    if exit_status == 0 {
        let ref_warned = stderr.as_ref().is_some_and(|s| !s.lines.is_empty());
        if ref_warned && o.warnings.is_empty() {
            problems.push(format!(
                "the reference warned ({:?}) but our reader gave no warning",
                stderr.as_ref().unwrap().lines
            ));
        }
        if !ref_warned && !o.warnings.is_empty() {
            problems.push(format!(
                "our reader warned ({:?}) where the reference was silent",
                o.warnings
            ));
        }
    }
    assert!(problems.is_empty(), "{name}:\n{}", problems.join("\n"));
}

macro_rules! golden {
    ($($test:ident => $path:literal,)*) => {
        $(
            #[test]
            fn $test() {
                check_golden(&data_dir().join($path));
            }
        )*
        /// Every trace that has a test above.
        const COVERED: &[&str] = &[$($path),*];
    };
}

golden! {
    bytecode_location_overflow => "bytecode-location-overflow.ctf",
    bytecode => "bytecode.ctf",
    external => "external.ctf",
    fork_child_1 => "fork/child-1.ctf",
    fork_child_2 => "fork/child-2.ctf",
    fork_child_3 => "fork/child-3.ctf",
    fork_child_4 => "fork/child-4.ctf",
    fork_parent => "fork/parent.ctf",
    long => "long.ctf",
    ocaml5_domains => "ocaml5/domains.ctf",
    ocaml5_handover_fork5_parent => "ocaml5/handover/fork5/parent.ctf",
    ocaml5_handover_fork5_child_1 => "ocaml5/handover/fork5/child-1.ctf",
    ocaml5_handover_fork5_child_2 => "ocaml5/handover/fork5/child-2.ctf",
    ocaml5_handover_fork5_child_3 => "ocaml5/handover/fork5/child-3.ctf",
    ocaml5_handover_child_killed => "ocaml5/handover/child-killed.ctf",
    ocaml5_handover_many => "ocaml5/handover/many.ctf",
    ocaml5_perdomain => "ocaml5/perdomain.ctf",
    ocaml5_rejected_child_2 => "ocaml5/rejected/child-2.ctf",
    ocaml5_rejected_parent => "ocaml5/rejected/parent.ctf",
    rates_fast => "rates/fast.ctf",
    rates_slow => "rates/slow.ctf",
    synthetic_duplicate_packet => "synthetic/duplicate-packet.ctf",
    synthetic_wrong_pid => "synthetic/wrong-pid.ctf",
    truncated_header => "truncated-header.ctf",
    truncated => "truncated.ctf",
    v3_bytecode_location_overflow => "v3/bytecode-location-overflow.ctf",
    v3_multidomain => "v3/multidomain.ctf",
    v3_ocamlopt_head => "v3/ocamlopt-head.ctf",
    v3_single => "v3/single.ctf",
}

/// No trace under tests/data is silently skipped: each has its own test above.
#[test]
fn every_trace_is_covered() {
    let found = all_ctf(&data_dir());
    if bless() {
        // A new trace gets its reference now; it still needs a line in `golden!` above.
        for rel in &found {
            let ctf = data_dir().join(rel);
            let has_ref = ["dump", "dump.gz", "dump.sha256"]
                .iter()
                .any(|e| sibling(&ctf, e).is_file());
            if !has_ref {
                bless_trace(&ctf);
            }
        }
    }
    let mut covered: Vec<String> = COVERED.iter().map(|s| s.to_string()).collect();
    covered.sort();
    assert!(
        !found.is_empty(),
        "no .ctf found under {}",
        data_dir().display()
    );
    assert_eq!(
        found, covered,
        "the .ctf files under tests/data and the golden tests differ"
    );
}

/// The memtrace repository's own test trace, when the shared corpus is present.
#[test]
fn shared_ocamlopt() {
    if let Some(p) = ocamlopt() {
        check_golden(&p);
    }
}

/// The comparing writer itself: a one-byte change is found at the right line and column,
/// and a shorter or longer output is a difference too.
#[test]
fn checking_writer_finds_differences() {
    use std::io::Write;
    let expected = b"line one\nline two\nline three\n".to_vec();
    let check = |ours: &[u8], chunk: usize| {
        let mut w = CheckingWriter::new(Some(Box::new(std::io::Cursor::new(expected.clone()))));
        for c in ours.chunks(chunk) {
            w.write_all(c).unwrap();
        }
        w.finish().3
    };
    for chunk in [1, 3, 100] {
        assert!(check(&expected, chunk).is_none());
        let m = check(b"line one\nline twX\nline three\n", chunk).unwrap();
        assert_eq!((m.line, m.column), (2, 7), "chunk {chunk}");
        assert_eq!(m.expected, b"line two");
        assert_eq!(m.ours, b"line twX");
        let m = check(b"line one\nline two\n", chunk).unwrap();
        assert_eq!((m.line, m.column), (3, 0));
        assert_eq!(m.expected, b"line three");
        let m = check(b"line one\nline two\nline three\nmore\n", chunk).unwrap();
        assert_eq!((m.line, m.column), (4, 0));
        assert_eq!(m.ours, b"more");
    }
}
