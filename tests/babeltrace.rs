//! An independent check of packet and event framing: babeltrace2 (the reference CTF reader)
//! decodes real traces and freshly written ones with memtrace's own CTF metadata
//! (tests/tsdl/memtrace-v2.tsdl and memtrace-v3.tsdl, unchanged from the memtrace library),
//! and must see exactly the events our reader sees: one `trace_info`, one line per location
//! event, and then each alloc/promote/collect with the same time (the 25-bit event time
//! rebuilt by babeltrace's own clock logic), the same domain, and for allocations the same
//! length, sample count and source.
//!
//! Skipped, with a note, when `babeltrace2` is not on PATH (Debian package babeltrace2).
//! Traces are decoded in file order (`run` with the ctf.fs source straight into the pretty
//! sink), as format-3 traces with several domains are not in global time order.

mod common;
#[path = "support/splitmix.rs"]
mod splitmix;
use memtrace_merge::AllocHeader;

use common::*;
use memtrace_merge::{
    AllocSource, DomainId, Event, Location, LocationCode, LocationList, Reader, Timestamp,
    TraceInfo, Writer, WriterOptions,
};
use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;

fn babeltrace() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    let found = std::env::split_paths(&path)
        .map(|d| d.join("babeltrace2"))
        .find(|p| p.is_file());
    if found.is_none() {
        eprintln!("note: babeltrace2 is not on PATH; skipping (Debian package babeltrace2)");
    }
    found
}

fn tsdl(version: u16) -> PathBuf {
    let name = if version >= 3 {
        "memtrace-v3.tsdl"
    } else {
        "memtrace-v2.tsdl"
    };
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join("tsdl")
        .join(name)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Alloc,
    Promote,
    Collect,
}

/// An event as both sides can see it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Seen {
    kind: Kind,
    time: u64,
    domain: u16,
    /// Allocations only.
    length: Option<u64>,
    nsamples: Option<u64>,
    source: Option<AllocSource>,
}

impl Seen {
    fn of(e: &Event<'_>) -> Seen {
        let (kind, length, nsamples, source) = match e {
            Event::Alloc(a) => (
                Kind::Alloc,
                Some(a.length),
                Some(a.nsamples),
                Some(a.source),
            ),
            Event::Promote { .. } => (Kind::Promote, None, None, None),
            Event::Collect { .. } => (Kind::Collect, None, None, None),
        };
        Seen {
            kind,
            time: e.time().0,
            domain: e.domain().0,
            length,
            nsamples,
            source,
        }
    }
}

/// What babeltrace2 printed.
struct BtOutput {
    ok: bool,
    status: String,
    stderr: String,
    lines: u64,
    trace_info: Vec<u64>,
    locations: u64,
    events: Vec<Seen>,
    first_line: String,
}

/// A vint field of the pretty sink: `NAME = { tag = ( "u8" : container = N ), value = { { } } }`
/// (the value is the container for the u8 tag) or `... ( "u16" : container = 253 ), value = { V } }`.
fn vint_field(line: &str, field: &str) -> Option<u64> {
    let key = format!("{field} = {{ tag = ( \"");
    let rest = &line[line.find(&key)? + key.len()..];
    let tag = &rest[..rest.find('"')?];
    let digits = |s: &str| {
        s.chars()
            .take_while(|c| c.is_ascii_digit())
            .collect::<String>()
            .parse::<u64>()
            .ok()
    };
    if tag == "u8" {
        let c = rest.find("container = ")? + "container = ".len();
        digits(&rest[c..])
    } else {
        let v = rest.find("value = { ")? + "value = { ".len();
        digits(&rest[v..])
    }
}

fn parse_line(line: &str) -> Option<(u64, &str)> {
    let close = line.find("] ")?;
    let time = line.get(1..close)?.parse().ok()?;
    let rest = &line[close + 2..];
    let name = &rest[..rest.find(':')?];
    Some((time, name))
}

/// Decode `bytes` (a trace of format `version`) with babeltrace2, in file order.
fn run_babeltrace(bt: &Path, bytes: &[u8], version: u16) -> BtOutput {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().join("trace");
    std::fs::create_dir(&d).unwrap();
    std::fs::copy(tsdl(version), d.join("metadata")).unwrap();
    std::fs::write(d.join("stream_0"), bytes).unwrap();
    let err_path = dir.path().join("stderr");
    let mut child = Command::new(bt)
        .arg("run")
        .arg("--component=src:source.ctf.fs")
        .arg(format!("--params=inputs=[\"{}\"]", d.display()))
        .arg("--component=sink:sink.text.pretty")
        .arg("--params=clock-cycles=yes,no-delta=yes")
        .arg("--connect=src:sink")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&err_path).unwrap())
        .spawn()
        .expect("running babeltrace2");
    let mut out = BtOutput {
        ok: false,
        status: String::new(),
        stderr: String::new(),
        lines: 0,
        trace_info: Vec::new(),
        locations: 0,
        events: Vec::new(),
        first_line: String::new(),
    };
    let stdout = BufReader::with_capacity(1 << 20, child.stdout.take().unwrap());
    for line in stdout.lines() {
        let line = line.unwrap();
        out.lines += 1;
        if out.lines == 1 {
            out.first_line = line.chars().take(300).collect();
        }
        let Some((time, name)) = parse_line(&line) else {
            panic!("unexpected babeltrace2 line {}: {:.300}", out.lines, line)
        };
        let domain = vint_or_plain(&line, "domain").unwrap_or(0) as u16;
        let seen = |kind| Seen {
            kind,
            time,
            domain,
            length: None,
            nsamples: None,
            source: None,
        };
        match name {
            "trace_info" => out.trace_info.push(time),
            "location" => out.locations += 1,
            "promote" => out.events.push(seen(Kind::Promote)),
            "collect" => out.events.push(seen(Kind::Collect)),
            "alloc" => {
                let source = if line.contains("source = ( \"MINOR\"") {
                    AllocSource::Minor
                } else if line.contains("source = ( \"MAJOR\"") {
                    AllocSource::Major
                } else if line.contains("source = ( \"EXTERNAL\"") {
                    AllocSource::External
                } else {
                    panic!("no source in {line:.400}")
                };
                out.events.push(Seen {
                    length: vint_field(&line, "length"),
                    nsamples: vint_field(&line, "samples"),
                    source: Some(source),
                    ..seen(Kind::Alloc)
                });
            }
            short if short.len() == 7 && short.starts_with("alloc") => {
                let n: u64 = short[5..]
                    .parse()
                    .unwrap_or_else(|_| panic!("event name {short}"));
                out.events.push(Seen {
                    length: Some(n),
                    nsamples: Some(1),
                    source: Some(AllocSource::Minor),
                    ..seen(Kind::Alloc)
                });
            }
            other => panic!("unknown event {other} in line {}", out.lines),
        }
    }
    let status = child.wait().unwrap();
    out.ok = status.success();
    out.status = status.to_string();
    out.stderr = std::fs::read_to_string(&err_path).unwrap_or_default();
    out
}

/// A plain integer field of the packet context (`domain = 3`).
fn vint_or_plain(line: &str, field: &str) -> Option<u64> {
    let key = format!(" {field} = ");
    let rest = &line[line.find(&key)? + key.len()..];
    rest.chars()
        .take_while(|c| c.is_ascii_digit())
        .collect::<String>()
        .parse()
        .ok()
}

/// Our reader's view: trace info, every event, and the location events counted by
/// re-encoding the trace (each location event the writer emits is one `resolve` call; the
/// re-encoding must reproduce the input for that count to be the input's).
struct Ours {
    start_time: u64,
    version: u16,
    events: Vec<Seen>,
    location_events: u64,
}

fn read_ours(bytes: &[u8], name: &str) -> Ours {
    let mut r = Reader::new(bytes, name).unwrap();
    let mut events = Vec::new();
    while let Some(e) = r.next_event().unwrap() {
        events.push(Seen::of(&e));
    }
    // (but for the one warning of OCaml 5's promotes of a terminated domain's blocks,
    // which the reference reader refuses and babeltrace reads as we do)
    let w = r.warnings();
    assert!(
        w.is_empty() || (w.len() == 1 && w[0].what.contains("the reference reader stops here")),
        "{name}: {w:?}"
    );
    Ours {
        start_time: r.info().start_time.0,
        version: r.info().version,
        events,
        location_events: r.stats().location_events,
    }
}

/// Location events in a trace: re-encode it (byte-identically) counting the writer's requests.
fn count_location_events(bytes: &[u8], name: &str) -> u64 {
    let mut r = Reader::new(bytes, name).unwrap();
    let version = r.info().version.max(2);
    let mut w = Writer::new(
        Vec::new(),
        r.info(),
        WriterOptions {
            version,
            lossless: false,
        },
    )
    .unwrap();
    let mut n = 0u64;
    while let Some((e, table)) = r.next_with_locations().unwrap() {
        match e {
            Event::Alloc(a) => {
                w.put_alloc(
                    &AllocHeader {
                        time: a.time,
                        domain: a.domain,
                        length: a.length,
                        nsamples: a.nsamples,
                        source: a.source,
                    },
                    a.backtrace,
                    |c| {
                        n += 1;
                        table.get(&c).cloned()
                    },
                )
                .unwrap();
            }
            Event::Promote { time, domain, id } => w.put_promote(time, domain, id).unwrap(),
            Event::Collect { time, domain, id } => w.put_collect(time, domain, id).unwrap(),
        }
    }
    let out = w.finish().unwrap();
    assert!(
        out == bytes,
        "{name}: re-encoding is not byte-identical, cannot count its location events"
    );
    n
}

/// Compare babeltrace2's view of a trace with our reader's. `written_locations`: the location
/// events the writer emitted, when known.
fn check(bytes: &[u8], name: &str, written_locations: Option<u64>) {
    let Some(bt) = babeltrace() else { return };
    let ours = read_ours(bytes, name);
    let t0 = std::time::Instant::now();
    let b = run_babeltrace(&bt, bytes, ours.version);
    eprintln!(
        "{name}: babeltrace2 {} in {:?}: {} lines = 1 trace_info + {} locations + {} events (ours: {} events, {} location events)",
        b.status,
        t0.elapsed(),
        b.lines,
        b.locations,
        b.events.len(),
        ours.events.len(),
        ours.location_events
    );
    assert!(
        b.ok,
        "{name}: babeltrace2 failed ({}):\n{:.3000}",
        b.status, b.stderr
    );
    assert_eq!(
        b.trace_info,
        vec![ours.start_time],
        "{name}: trace_info events; first line {}",
        b.first_line
    );
    assert!(
        b.first_line.contains("] trace_info:"),
        "{name}: first line {}",
        b.first_line
    );
    assert_eq!(
        b.locations, ours.location_events,
        "{name}: location events (babeltrace2 left, our reader right)"
    );
    if let Some(n) = written_locations {
        assert_eq!(
            b.locations, n,
            "{name}: location events (babeltrace2 left, written right)"
        );
    }
    assert_eq!(
        b.lines,
        1 + b.locations + ours.events.len() as u64,
        "{name}: event lines"
    );
    for (i, (x, y)) in b.events.iter().zip(&ours.events).enumerate() {
        assert_eq!(x, y, "{name}: event #{i} (babeltrace2 left, ours right)");
    }
    assert_eq!(
        b.events.len(),
        ours.events.len(),
        "{name}: number of events"
    );
}

fn check_file(path: &Path) {
    if babeltrace().is_none() {
        return;
    }
    let bytes = std::fs::read(path).unwrap();
    let name = path.display().to_string();
    let locs = count_location_events(&bytes, &name);
    check(&bytes, &name, Some(locs));
}

macro_rules! real {
    ($($test:ident => $path:literal,)*) => {
        $( #[test] fn $test() { check_file(&data_dir().join($path)); } )*
    };
}

real! {
    rates_slow => "rates/slow.ctf",
    long_time_wraps => "long.ctf",
    fork_child_1_deep => "fork/child-1.ctf",
    fork_child_4 => "fork/child-4.ctf",
    external => "external.ctf",
    bytecode => "bytecode.ctf",
    v3_single => "v3/single.ctf",
    v3_multidomain => "v3/multidomain.ctf",
    v3_bytecode_location_overflow => "v3/bytecode-location-overflow.ctf",
    ocaml5_stock => "ocaml5/domains.ctf",
}

/// Traces whose packets one writer does not cut alike (per-domain writers flushing each
/// at its own pace): their location events are counted by babeltrace and our reader only.
fn check_file_uncopied(path: &Path) {
    let bytes = std::fs::read(path).unwrap();
    check(&bytes, &path.display().to_string(), None);
}

macro_rules! real_uncopied {
    ($($test:ident => $path:literal,)*) => {
        $( #[test] fn $test() { check_file_uncopied(&data_dir().join($path)); } )*
    };
}

real_uncopied! {
    ocaml5_per_domain => "ocaml5/perdomain.ctf",
    // (the reference reader stops part-way in these; babeltrace and ours read to the end)
    ocaml5_rejected_parent => "ocaml5/rejected/parent.ctf",
    ocaml5_rejected_child => "ocaml5/rejected/child-2.ctf",
}

#[test]
fn shared_ocamlopt() {
    if let Some(p) = ocamlopt() {
        check_file(&p);
    }
}

// ---- freshly written traces ---------------------------------------------------------------

struct Rng(splitmix::SplitMix);
impl Rng {
    fn next(&mut self) -> u64 {
        // SplitMix64: the library's own generator
        self.0.next_u64()
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Write a varied trace: short and long allocs of every source with lengths and sample
/// counts in every vint size, backtraces sharing prefixes, some 2500 fresh frames deep
/// (lossless: moved to packets of their own), gaps over 2^25 us, location lists empty,
/// inlined, with long names or oversized; in format 3, three domains and cross-domain
/// collects (negative id deltas). Returns the bytes and the number of location events
/// (None in lossless mode: a backtrace moved to a fresh packet asks for its locations twice,
/// once for the discarded attempt).
fn fresh_trace(version: u16, lossless: bool, seed: u64) -> (Vec<u8>, Option<u64>) {
    let start = 1_796_026_339_843_713u64;
    let info = TraceInfo {
        sample_rate: 1e-3,
        word_size: 64,
        executable_name: b"/tmp/babeltrace-check".to_vec(),
        host_name: b"vm".to_vec(),
        ocaml_runtime_params: b"s=262144".to_vec(),
        pid: 31337,
        start_time: Timestamp(start),
        context: Some(b"fresh".to_vec()),
        initial_domain: DomainId(0),
        version,
    };
    let mut rng = Rng(splitmix::SplitMix::from_state(seed));
    let codes: Vec<LocationCode> = (0..20_000u64)
        .map(|i| LocationCode(0x5555_0000_0000 + i * 12 + 4))
        .collect();
    let mut locs: HashMap<LocationCode, LocationList> = HashMap::new();
    for (i, &c) in codes.iter().enumerate() {
        let n = [0usize, 1, 1, 1, 2, 3, 1, 1, 300, 1][i % 10];
        let l: Vec<Location> = (0..n)
            .map(|j| Location {
                filename: Arc::from(
                    format!(
                        "src/f{}{}.ml",
                        (i + j) % 50,
                        if i % 37 == 0 {
                            "x".repeat(300)
                        } else {
                            String::new()
                        }
                    )
                    .as_bytes(),
                ),
                line: (i * 7 + j) as u32 % 100_000,
                start_char: (i % 256) as u32,
                end_char: (i % 1024) as u32,
                defname: Arc::from(format!("M{}.f{}", i % 13, (i + 3 * j) % 77).as_bytes()),
            })
            .collect();
        locs.insert(c, l.into());
    }
    let domains: &[u16] = if version >= 3 { &[0, 1, 3] } else { &[0] };
    let mut clock: HashMap<u16, u64> = domains.iter().map(|&d| (d, start)).collect();
    let mut prev: HashMap<u16, Vec<LocationCode>> = HashMap::new();
    let mut live: Vec<(u16, memtrace_merge::ObjId)> = Vec::new();
    let mut w = Writer::new(Vec::new(), &info, WriterOptions { version, lossless }).unwrap();
    let mut resolves = 0u64;
    let mut dom = 0u16;
    for _ in 0..20_000 {
        if rng.below(10) == 0 {
            dom = domains[rng.below(domains.len() as u64) as usize];
        }
        let t = clock.get_mut(&dom).unwrap();
        *t += match rng.below(1000) {
            0..=1 => 33_554_432 + rng.below(100_000_000),
            2..=3 => 30_000_001 + rng.below(3_000_000),
            4..=500 => 0,
            _ => rng.below(3000),
        };
        let time = Timestamp(*t);
        let r = rng.below(10);
        if r < 6 || live.is_empty() {
            let p = prev.entry(dom).or_default();
            let keep = rng.below(p.len() as u64 + 1) as usize;
            let mut bt = p[..keep].to_vec();
            let add = if lossless && rng.below(200) == 0 {
                2500
            } else {
                rng.below(40) as usize
            };
            for _ in 0..add {
                bt.push(codes[rng.below(codes.len() as u64) as usize]);
            }
            bt.truncate(3000);
            *p = bt.clone();
            let length = match rng.below(5) {
                0 => 1 + rng.below(16),
                1 => rng.below(253),
                2 => 253 + rng.below(65_536 - 253),
                3 => 65_536 + rng.below(1_000_000),
                _ => 5_000_000_000 + rng.below(1000), // needs the u64 vint
            };
            let nsamples = if rng.below(3) == 0 {
                1 + rng.below(100_000)
            } else {
                1
            };
            let source = [
                AllocSource::Minor,
                AllocSource::Major,
                AllocSource::External,
            ][rng.below(3) as usize];
            let id = w
                .put_alloc(
                    &AllocHeader {
                        time,
                        domain: DomainId(dom),
                        length,
                        nsamples,
                        source,
                    },
                    &bt,
                    |c| {
                        resolves += 1;
                        locs.get(&c).cloned()
                    },
                )
                .unwrap();
            live.push((dom, id));
        } else {
            // promote or collect an object of this domain, or (format 3) collect another's
            let i = rng.below(live.len() as u64) as usize;
            let (d, id) = live[i];
            if d == dom && r < 8 {
                w.put_promote(time, DomainId(dom), id).unwrap();
            } else if d == dom || version >= 3 {
                live.swap_remove(i);
                w.put_collect(time, DomainId(dom), id).unwrap();
            }
        }
    }
    let relocated = w.stats().relocated_backtraces;
    if lossless {
        assert!(
            relocated > 0,
            "no backtrace was moved to a packet of its own"
        );
    }
    (
        w.finish().unwrap(),
        if lossless { None } else { Some(resolves) },
    )
}

#[test]
fn fresh_v2_reference_budget() {
    let (bytes, locs) = fresh_trace(2, false, 1);
    check(&bytes, "fresh v2", locs);
}

#[test]
fn fresh_v2_lossless_deep() {
    let (bytes, locs) = fresh_trace(2, true, 2);
    check(&bytes, "fresh v2 lossless", locs);
}

#[test]
fn fresh_v3_three_domains_lossless() {
    let (bytes, locs) = fresh_trace(3, true, 3);
    check(&bytes, "fresh v3 lossless", locs);
}

#[test]
fn fresh_v3_three_domains() {
    let (bytes, locs) = fresh_trace(3, false, 4);
    check(&bytes, "fresh v3", locs);
}

/// `ReadStats::location_events` counts the location events read (here compared with the
/// number the writer emits when re-encoding the trace byte for byte; no babeltrace2 needed).
#[test]
fn reader_stats_count_location_events() {
    for rel in ["rates/slow.ctf", "fork/child-4.ctf", "v3/multidomain.ctf"] {
        let bytes = std::fs::read(data_dir().join(rel)).unwrap();
        let want = count_location_events(&bytes, rel);
        let mut r = Reader::new(&bytes[..], rel).unwrap();
        while r.next_event().unwrap().is_some() {}
        assert_eq!(
            r.stats().location_events,
            want,
            "{rel}: ReadStats::location_events"
        );
    }
}
