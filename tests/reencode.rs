//! Re-encoding real traces with `copy::copy`:
//! * in the input's own format version, every undamaged trace is reproduced byte for byte
//!   (as the reference `test/copy.ml` does), and each damaged trace gives exactly the
//!   reference copy tool's output (sha256 and size from `NAME.copy.sha256`);
//! * format conversions 2→3 and 3→2 (single-domain traces) keep every event, and converting
//!   back gives the original bytes; 3→2 of a multi-domain trace fails with a Write error.

mod common;
use memtrace_merge::AllocHeader;

use common::*;
use memtrace_merge::{
    tools::copy::{copy, copy_on_one_thread, copy_reading_ahead},
    DomainId, Error, Malformed, Reader, TraceInfo, Writer, WriterOptions,
};
use std::path::{Path, PathBuf};

fn opts(version: u16) -> WriterOptions {
    WriterOptions {
        version,
        lossless: false,
    }
}

/// Re-encode the bytes of a trace in `version` (None: the input's), both ways: reading
/// ahead on another thread only where backtraces are deep (`copy`), and always; the two
/// must agree (same bytes and warnings, or the same error).
fn reencode(
    bytes: &[u8],
    name: &str,
    version: Option<u16>,
) -> memtrace_merge::Result<(Vec<u8>, Vec<String>)> {
    let each = |ahead: bool| -> memtrace_merge::Result<(Vec<u8>, Vec<String>)> {
        let mut r = Reader::new(bytes, name)?;
        let v = version.unwrap_or(r.info().version.max(2));
        let (out, _stats, warnings) = if ahead {
            copy_reading_ahead(&mut r, Vec::new(), opts(v))?
        } else {
            copy(&mut r, Vec::new(), opts(v))?
        };
        Ok((out, warnings.into_iter().map(|w| w.to_string()).collect()))
    };
    let (a, b) = (each(false), each(true));
    match (&a, &b) {
        (Ok(x), Ok(y)) => assert!(x == y, "{name}: reading ahead changed the copy"),
        (Err(x), Err(y)) => assert_eq!(x.to_string(), y.to_string(), "{name}"),
        _ => panic!(
            "{name}: copy gave {:?}, reading ahead {:?}",
            a.err(),
            b.err()
        ),
    }
    // and on one thread, from a reader that cannot go to another (`Rc` is not `Send`)
    let one = (|| -> memtrace_merge::Result<(Vec<u8>, Vec<String>)> {
        let mut r = Reader::new(NotSend(bytes, std::marker::PhantomData), name)?;
        let v = version.unwrap_or(r.info().version.max(2));
        let (out, _stats, warnings) = copy_on_one_thread(&mut r, Vec::new(), opts(v))?;
        Ok((out, warnings.into_iter().map(|w| w.to_string()).collect()))
    })();
    match (&a, &one) {
        (Ok(x), Ok(y)) => assert!(x == y, "{name}: one thread changed the copy"),
        (Err(x), Err(y)) => assert_eq!(x.to_string(), y.to_string(), "{name}"),
        _ => panic!(
            "{name}: copy gave {:?}, one thread {:?}",
            a.err(),
            one.err()
        ),
    }
    a
}

/// A reader of bytes that may not move to another thread.
struct NotSend<'a>(&'a [u8], std::marker::PhantomData<std::rc::Rc<()>>);

impl std::io::Read for NotSend<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.0.read(buf)
    }
}

fn read(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// First differing byte of two buffers (for messages).
fn first_diff(a: &[u8], b: &[u8]) -> String {
    match a.iter().zip(b).position(|(x, y)| x != y) {
        Some(i) => format!(
            "first difference at byte {i} (sizes {} and {})",
            a.len(),
            b.len()
        ),
        None => format!(
            "one is a prefix of the other (sizes {} and {})",
            a.len(),
            b.len()
        ),
    }
}

fn check_identical(path: &Path) {
    let input = read(path);
    let name = path.display().to_string();
    let (out, warnings) = reencode(&input, &name, None).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert!(warnings.is_empty(), "{name}: warnings {warnings:?}");
    assert!(
        out == input,
        "{name}: re-encoding differs from the input: {}",
        first_diff(&out, &input)
    );
}

fn check_damaged(path: &Path) {
    let input = read(path);
    let name = path.display().to_string();
    let (sha, size) = parse_copy_sha(&sibling(path, "copy.sha256"));
    let (out, warnings) = reencode(&input, &name, None).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert!(
        !warnings.is_empty(),
        "{name}: a damaged trace must give a warning"
    );
    assert_eq!(
        (sha256_hex(&out), out.len() as u64),
        (sha, size),
        "{name}: copy output differs from the reference copy tool's"
    );
}

macro_rules! identical {
    ($($test:ident => $path:literal,)*) => {
        $( #[test] fn $test() { check_identical(&data_dir().join($path)); } )*
        const IDENTICAL: &[&str] = &[$($path),*];
    };
}

macro_rules! damaged {
    ($($test:ident => $path:literal,)*) => {
        $( #[test] fn $test() { check_damaged(&data_dir().join($path)); } )*
        const DAMAGED: &[&str] = &[$($path),*];
    };
}

identical! {
    identical_fork_parent => "fork/parent.ctf",
    identical_fork_child_1 => "fork/child-1.ctf",
    identical_fork_child_2 => "fork/child-2.ctf",
    identical_fork_child_3 => "fork/child-3.ctf",
    identical_fork_child_4 => "fork/child-4.ctf",
    identical_external => "external.ctf",
    identical_long => "long.ctf",
    identical_rates_fast => "rates/fast.ctf",
    identical_rates_slow => "rates/slow.ctf",
    identical_bytecode => "bytecode.ctf",
    identical_v3_single => "v3/single.ctf",
    identical_v3_ocamlopt_head => "v3/ocamlopt-head.ctf",
    identical_v3_multidomain => "v3/multidomain.ctf",
    identical_v3_bytecode_location_overflow => "v3/bytecode-location-overflow.ctf",
    identical_ocaml5_stock => "ocaml5/domains.ctf",
}

/// Real OCaml 5 traces of per-domain writers, which flush each domain's packet at its own
/// pace (and take id chunks in another order than their packets are written): one writer
/// cannot cut the same packets. `copy_file` keeps every event, in format 3 and in 2.
const PER_DOMAIN: &[&str] = &[
    "ocaml5/perdomain.ctf",
    "ocaml5/rejected/parent.ctf",
    "ocaml5/rejected/child-2.ctf",
    "ocaml5/handover/fork5/parent.ctf",
    "ocaml5/handover/fork5/child-1.ctf",
    "ocaml5/handover/fork5/child-2.ctf",
    "ocaml5/handover/fork5/child-3.ctf",
    "ocaml5/handover/child-killed.ctf",
    "ocaml5/handover/many.ctf",
];

#[test]
fn per_domain_traces_are_copied_with_every_event() {
    use memtrace_merge::tools::compare::{compare, CompareOptions};
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("copy.ctf");
    for name in PER_DOMAIN {
        let input = data_dir().join(name);
        for version in [Some(3), Some(2)] {
            memtrace_merge::tools::copy::copy_file(&input, &out, version)
                .unwrap_or_else(|e| panic!("{name} to {version:?}: {e}"));
            // (the source read a domain at a time, in time order: in file order some of
            // these promote a block after another domain's packet collected it)
            let opts = CompareOptions {
                readable_part: true,
                ..Default::default()
            };
            let c = compare(std::slice::from_ref(&input), &out, opts).unwrap();
            assert!(
                c.missing == 0 && c.extra == 0 && c.merged_bad_events == 0 && c.sources_cut == 0,
                "{name} to {version:?}: {c:?}"
            );
            assert_eq!(c.merged_allocs, c.source_allocs, "{name}");
        }
    }
}

damaged! {
    damaged_truncated => "truncated.ctf",
    damaged_synthetic_wrong_pid => "synthetic/wrong-pid.ctf",
    damaged_synthetic_duplicate_packet => "synthetic/duplicate-packet.ctf",
}

/// Traces whose re-encoding is expected to fail (both reference readers fail on them too).
const FAILING: &[&str] = &["bytecode-location-overflow.ctf", "truncated-header.ctf"];

#[test]
fn identical_shared_ocamlopt() {
    if let Some(p) = ocamlopt() {
        check_identical(&p);
    }
}

#[test]
fn every_trace_is_covered() {
    let found = all_ctf(&data_dir());
    let mut covered: Vec<String> = IDENTICAL
        .iter()
        .chain(DAMAGED)
        .chain(FAILING)
        .chain(PER_DOMAIN)
        .map(|s| s.to_string())
        .collect();
    covered.sort();
    assert_eq!(found, covered);
}

/// v0.2.3's location encoder overflowed into the file MTF code: the copy must fail with an
/// error naming the file and the byte offset of the bad location event.
#[test]
fn bytecode_location_overflow_fails_with_position() {
    let path = data_dir().join("bytecode-location-overflow.ctf");
    let name = path.display().to_string();
    let mut r = Reader::open(&path).unwrap();
    let err = match copy(&mut r, Vec::new(), opts(2)) {
        Ok(_) => panic!("{name}: copy succeeded"),
        Err(e) => e,
    };
    let msg = err.to_string();
    eprintln!("{msg}");
    match &err {
        Error::Malformed { at, what } => {
            assert_eq!(at.file, name);
            assert!(at.offset > 0 && at.offset < 30602, "offset {}", at.offset);
            assert!(matches!(what, Malformed::MtfEmptySlot { .. }), "{what:?}");
        }
        e => panic!("expected a Malformed error, got {e:?}"),
    }
    assert!(
        msg.contains(&name)
            && msg.contains(&format!(
                "byte {}",
                match &err {
                    Error::Malformed { at, .. } => at.offset,
                    _ => unreachable!(),
                }
            )),
        "{msg}"
    );
}

/// The reference readers fail on a header cut by the end of the file ("Buffer underflow").
/// Ours reads what precedes it; a copy must then reproduce exactly packets #0-#7 (the same
/// output the reference copy tool gives for truncated.ctf, which is cut in the same packet).
#[test]
fn truncated_header_copy_keeps_complete_packets() {
    let path = data_dir().join("truncated-header.ctf");
    let input = read(&path);
    let name = path.display().to_string();
    match reencode(&input, &name, None) {
        Ok((out, warnings)) => {
            assert!(!warnings.is_empty(), "{name}: no warning");
            let (sha, size) = parse_copy_sha(&data_dir().join("truncated.copy.sha256"));
            assert_eq!((sha256_hex(&out), out.len() as u64), (sha, size));
        }
        Err(e) => {
            let msg = e.to_string();
            assert!(msg.contains(&name) && msg.contains("byte "), "{msg}");
        }
    }
}

/// The statistics `copy` returns describe the whole output (its final packet included).
#[test]
fn copy_stats_count_every_byte() {
    let path = data_dir().join("rates/slow.ctf");
    let input = read(&path);
    let mut r = Reader::new(&input[..], "rates/slow.ctf").unwrap();
    let (out, stats, _) = copy(&mut r, Vec::new(), opts(2)).unwrap();
    let rs = r.stats().clone();
    assert_eq!(
        (stats.allocs, stats.promotes, stats.collects),
        (rs.allocs, rs.promotes, rs.collects)
    );
    let packets = 3; // ctfscan in rates/slow.info: 3 packets
    assert_eq!(
        (stats.bytes, stats.packets),
        (out.len() as u64, packets),
        "WriteStats from copy()"
    );
}

// ---- format conversions -------------------------------------------------------------

fn trace_path(rel: &str) -> Option<PathBuf> {
    if rel == "ocamlopt.ctf" {
        ocamlopt()
    } else {
        Some(data_dir().join(rel))
    }
}

/// Convert `rel` to `to`; every event must be kept (compared positionally), and converting
/// back must give the input's bytes.
fn check_conversion(rel: &str, to: u16) {
    let Some(path) = trace_path(rel) else { return };
    let input = read(&path);
    let name = path.display().to_string();
    let from = Reader::new(&input[..], &name).unwrap().info().version;
    assert_ne!(from, to);
    let (converted, warnings) =
        reencode(&input, &name, Some(to)).unwrap_or_else(|e| panic!("{name} → v{to}: {e}"));
    assert!(warnings.is_empty());
    let conv_name = format!("{name} (as v{to})");
    let mut a = Reader::new(&input[..], &name).unwrap();
    let mut b = Reader::new(&converted[..], &conv_name).unwrap();
    assert_eq!(b.info().version, to);
    let mut ia = a.info().clone();
    let ib = b.info().clone();
    ia.version = to;
    assert_eq!(ia, ib, "trace info changed");
    let n = assert_same_events(&mut a, &mut b, true);
    assert!(b.warnings().is_empty(), "{:?}", b.warnings());
    assert!(n > 0);
    // And back.
    let (back, _) = reencode(&converted, &conv_name, Some(from))
        .unwrap_or_else(|e| panic!("{conv_name} → v{from}: {e}"));
    assert!(
        back == input,
        "{name}: v{from} → v{to} → v{from} differs from the input: {}",
        first_diff(&back, &input)
    );
    eprintln!("{name}: {n} events kept through v{from} → v{to} → v{from}");
}

macro_rules! conversions {
    ($($test:ident => $path:literal, $to:literal;)*) => {
        $( #[test] fn $test() { check_conversion($path, $to); } )*
    };
}

conversions! {
    v2_to_v3_ocamlopt => "ocamlopt.ctf", 3;
    v2_to_v3_fork_parent => "fork/parent.ctf", 3;
    v2_to_v3_fork_child_1 => "fork/child-1.ctf", 3;
    v2_to_v3_fork_child_2 => "fork/child-2.ctf", 3;
    v2_to_v3_fork_child_3 => "fork/child-3.ctf", 3;
    v2_to_v3_fork_child_4 => "fork/child-4.ctf", 3;
    v2_to_v3_external => "external.ctf", 3;
    v2_to_v3_long => "long.ctf", 3;
    v2_to_v3_rates_fast => "rates/fast.ctf", 3;
    v2_to_v3_rates_slow => "rates/slow.ctf", 3;
    v2_to_v3_bytecode => "bytecode.ctf", 3;
    v3_to_v2_single => "v3/single.ctf", 2;
    v3_to_v2_ocamlopt_head => "v3/ocamlopt-head.ctf", 2;
    v3_to_v2_bytecode_location_overflow => "v3/bytecode-location-overflow.ctf", 2;
}

/// HEAD's ocamlopt-head.ctf is its re-encoding of v0.2.3's ocamlopt.ctf: converting it to
/// format 2 gives exactly the v0.2.3 file.
#[test]
fn v3_ocamlopt_head_to_v2_is_the_v2_file() {
    let Some(v2) = ocamlopt() else { return };
    let v3 = read(&data_dir().join("v3/ocamlopt-head.ctf"));
    let (out, _) = reencode(&v3, "v3/ocamlopt-head.ctf", Some(2)).unwrap();
    let want = read(&v2);
    assert!(out == want, "{}", first_diff(&out, &want));
}

/// v3/multidomain.ctf is fork/child-4.ctf re-written by HEAD over three domains, in time
/// order: converting it back to format 2 (ids renumbered, promotes and collects following
/// their objects) gives exactly the original format-2 file.
#[test]
fn v3_multidomain_to_v2_is_the_original_file() {
    let path = data_dir().join("v3/multidomain.ctf");
    let input = read(&path);
    let name = path.display().to_string();
    let (out, _) = reencode(&input, &name, Some(2)).expect("conversion");
    let want = read(&data_dir().join("fork/child-4.ctf"));
    assert!(out == want, "{}", first_diff(&out, &want));
}

/// A multi-domain trace whose events are in global time order and whose promotes/collects
/// all name already-allocated ids (in format-2 numbering too): nothing but the domains stands
/// in the way of a 3→2 conversion. Either it fails with a Write error (format 2 has no
/// domains), or it must keep every event, each promote/collect naming the same object.
/// Domain 1 allocates first (v3 id 10,000, the first allocation), then domain 0 allocates
/// 10,001 objects (v3 ids 0..9,999 and 20,000), then domain 1 collects its object.
#[test]
fn v3_time_ordered_multidomain_to_v2_fails_or_keeps_objects() {
    let info = TraceInfo {
        sample_rate: 1e-4,
        word_size: 64,
        executable_name: b"/bin/t".to_vec(),
        host_name: b"vm".to_vec(),
        ocaml_runtime_params: vec![],
        pid: 77,
        start_time: memtrace_merge::Timestamp(1_796_000_000_000_000),
        context: None,
        initial_domain: DomainId(0),
        version: 3,
    };
    let mut w = Writer::new(Vec::new(), &info, opts(3)).unwrap();
    let loc = |_| Some(vec![].into());
    let bt = [memtrace_merge::LocationCode(0x5555_0000)];
    let t = |k: u64| memtrace_merge::Timestamp(info.start_time.0 + k);
    use memtrace_merge::AllocSource::Minor;
    let b0 = w
        .put_alloc(
            &AllocHeader {
                time: t(1),
                domain: DomainId(1),
                length: 4,
                nsamples: 1,
                source: Minor,
            },
            &bt,
            loc,
        )
        .unwrap();
    assert_eq!(b0.0, 10_000);
    for k in 0..10_001 {
        w.put_alloc(
            &AllocHeader {
                time: t(2 + k),
                domain: DomainId(0),
                length: 4,
                nsamples: 1,
                source: Minor,
            },
            &bt,
            loc,
        )
        .unwrap();
    }
    w.put_collect(t(20_000), DomainId(1), b0).unwrap();
    let bytes = w.finish().unwrap();
    let res = std::panic::catch_unwind(|| reencode(&bytes, "two-domains", Some(2)))
        .expect("conversion panicked");
    match res {
        Err(Error::Write(msg)) => eprintln!("refused: {msg}"),
        Err(e) => panic!("expected a Write error, got {e:?}"),
        Ok((out, _)) => {
            let mut a = Reader::new(&bytes[..], "two-domains").unwrap();
            let mut b = Reader::new(&out[..], "two-domains as v2").unwrap();
            assert_same_events(&mut a, &mut b, true);
        }
    }
}

/// The copy reads ahead on another thread: it must fail exactly when reading fails, with
/// the reader's error (file, offset, what), after as many batches as precede it. Bytes of
/// a multi-batch trace are damaged one at a time; reading alone says what is expected.
#[test]
fn copy_fails_exactly_where_reading_fails() {
    let path = data_dir().join("fork").join("child-3.ctf");
    let input = read(&path);
    let (mut failed, mut copied) = (0, 0);
    for k in 0..200usize {
        let mut bytes = input.clone();
        // past the info packet, spread over the file (many batches of events in)
        let at = 4096 + k * (bytes.len() - 4096) / 200;
        bytes[at] ^= 0x5a;
        let name = format!("child-3 with byte {at} damaged");
        let want = (|| -> memtrace_merge::Result<Vec<String>> {
            let mut r = Reader::new(&bytes[..], &name)?;
            while r.next_event()?.is_some() {}
            Ok(r.warnings().iter().map(|w| w.to_string()).collect())
        })();
        let got = reencode(&bytes, &name, None);
        match (want, got) {
            (Ok(a), Ok((_, b))) => {
                assert_eq!(a, b, "{name}");
                copied += 1;
            }
            (Err(a), Err(b)) => {
                assert_eq!(a.to_string(), b.to_string(), "{name}");
                failed += 1;
            }
            (a, b) => panic!("{name}: reading gave {:?}, copying {:?}", a.err(), b.err()),
        }
    }
    // (the damage must have hit both outcomes often enough to tell)
    assert!(
        failed > 20 && copied > 20,
        "failed {failed}, copied {copied}"
    );
}

/// A writer that fails after `room` bytes.
struct FailingOutput {
    room: usize,
}

impl std::io::Write for FailingOutput {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        if b.len() > self.room {
            return Err(std::io::Error::other("disk full (test)"));
        }
        self.room -= b.len();
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// When the output fails the copy stops with that error (the thread reading ahead stops
/// too: the test would hang otherwise), early or late in the trace.
#[test]
fn copy_stops_when_the_output_fails() {
    let input = read(&data_dir().join("fork").join("parent.ctf"));
    for room in [0, 100, 70_000, input.len() / 2, input.len() - 10] {
        for ahead in [false, true] {
            let mut r = Reader::new(&input[..], "parent.ctf").unwrap();
            let out = FailingOutput { room };
            let got = if ahead {
                copy_reading_ahead(&mut r, out, opts(2))
            } else {
                copy(&mut r, out, opts(2))
            };
            match got {
                Ok(_) => panic!("room {room}: copy succeeded"),
                Err(e) => assert!(e.to_string().contains("disk full (test)"), "{room}: {e}"),
            }
            // (the reader is left as it was set: lending no cache entries)
            while let Some(e) = r.next_event().unwrap() {
                if let memtrace_merge::Event::Alloc(a) = e {
                    assert!(a.slots.is_empty(), "room {room}");
                    break;
                }
            }
        }
    }
}
