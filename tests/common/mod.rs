//! Helpers shared by the integration tests: where the corpus is, reference files beside each
//! trace, a streaming comparing/hashing writer for huge dumps, reading whole traces into
//! owned events, and comparing event streams positionally.
#![allow(dead_code)]

use memtrace_merge::{
    AllocSource, DomainId, Event, LocationCode, LocationList, LocationTable, ObjId, Reader,
    Timestamp, TraceInfo,
};
use sha2::{Digest, Sha256};
use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::fs::File;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

/// `tests/data` of this crate.
pub fn data_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join("data")
}

/// `../shared/corpus` (the optional full corpus, absent in CI).
pub fn shared_corpus() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("shared")
        .join("corpus")
}

/// The optional `../shared/corpus/ocamlopt.ctf`, when present.
pub fn ocamlopt() -> Option<PathBuf> {
    let p = shared_corpus().join("ocamlopt.ctf");
    if p.is_file() {
        Some(p)
    } else {
        eprintln!("note: {} is absent; skipping", p.display());
        None
    }
}

/// Every `.ctf` under `dir` (recursively), as sorted '/'-separated paths relative to `dir`.
pub fn all_ctf(dir: &Path) -> Vec<String> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| e.unwrap().path())
            .collect();
        entries.sort();
        for p in entries {
            if p.is_dir() {
                walk(root, &p, out);
            } else if p.extension().is_some_and(|e| e == "ctf") {
                let rel = p.strip_prefix(root).unwrap();
                let parts: Vec<String> = rel
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy().into_owned())
                    .collect();
                out.push(parts.join("/"));
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

/// `dir/x/NAME.ctf` → `dir/x/NAME.<ext>`.
pub fn sibling(ctf: &Path, ext: &str) -> PathBuf {
    let stem = ctf.file_stem().unwrap().to_string_lossy().into_owned();
    ctf.with_file_name(format!("{stem}.{ext}"))
}

/// The reference dump beside `ctf`: `NAME.dump`, or `NAME.dump.gz` uncompressed as it is
/// read (None when there is neither).
pub fn open_reference_dump(ctf: &Path) -> Option<Box<dyn Read>> {
    let (plain, gz) = (sibling(ctf, "dump"), sibling(ctf, "dump.gz"));
    let open = |p: &Path| io::BufReader::new(File::open(p).unwrap());
    if plain.is_file() {
        Some(Box::new(open(&plain)))
    } else if gz.is_file() {
        Some(Box::new(flate2::read::GzDecoder::new(open(&gz))))
    } else {
        None
    }
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

pub fn hex(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        write!(s, "{b:02x}").unwrap();
    }
    s
}

/// Parsed `NAME.dump.sha256`:
/// `<sha>  NAME.dump\nbytes=N lines=N dump_exit_status=N tool=...`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DumpSha {
    pub sha256: String,
    pub bytes: u64,
    pub lines: u64,
    pub exit_status: Option<i32>,
}

pub fn parse_dump_sha(path: &Path) -> DumpSha {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let sha256 = text.split_whitespace().next().expect("sha256").to_string();
    let field = |k: &str| {
        text.split_whitespace()
            .find_map(|w| w.strip_prefix(k).and_then(|v| v.strip_prefix('=')))
            .map(|v| v.to_string())
    };
    DumpSha {
        sha256,
        bytes: field("bytes").expect("bytes=").parse().unwrap(),
        lines: field("lines").expect("lines=").parse().unwrap(),
        exit_status: field("dump_exit_status").map(|v| v.parse().unwrap()),
    }
}

/// Parsed `NAME.copy.sha256`: `<sha> <size> bytes: ...`.
pub fn parse_copy_sha(path: &Path) -> (String, u64) {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut w = text.split_whitespace();
    let sha = w.next().expect("sha").to_string();
    let size = w.next().expect("size").parse().unwrap();
    assert_eq!(
        w.next(),
        Some("bytes:"),
        "{}: unexpected format",
        path.display()
    );
    (sha, size)
}

/// Parsed `NAME.stderr`: the reference tool's stderr lines and its exit status.
#[derive(Debug, Clone)]
pub struct RefStderr {
    pub lines: Vec<String>,
    pub exit_status: i32,
}

pub fn parse_stderr(path: &Path) -> Option<RefStderr> {
    let text = std::fs::read_to_string(path).ok()?;
    let mut lines = Vec::new();
    let mut exit_status = None;
    for l in text.lines() {
        // (`[exit status: N]`, or `exit status N` in the ocaml5/ files)
        if let Some(v) = (l.strip_prefix("[exit status: "))
            .and_then(|v| v.strip_suffix(']'))
            .or_else(|| l.strip_prefix("exit status "))
        {
            exit_status = Some(v.trim().parse().unwrap());
        } else if !l.trim().is_empty() {
            lines.push(l.to_string());
        }
    }
    Some(RefStderr {
        lines,
        exit_status: exit_status.unwrap_or_else(|| panic!("{}: no exit status", path.display())),
    })
}

/// A writer that hashes what it is given (sha256, bytes, lines) and, when given the expected
/// stream, compares against it on the fly, remembering the first differing line. Nothing is
/// buffered beyond the current line, so dumps of hundreds of MB are fine.
pub struct CheckingWriter {
    hasher: Sha256,
    pub bytes: u64,
    pub lines: u64,
    expected: Option<Box<dyn Read>>,
    exp_buf: Vec<u8>,
    /// Our current line (since the last '\n').
    cur_line: Vec<u8>,
    /// The expected stream's current line, up to the difference.
    mismatch: Option<Mismatch>,
}

#[derive(Debug, Clone)]
pub struct Mismatch {
    /// 1-based line number and 0-based byte column of the first difference.
    pub line: u64,
    pub column: usize,
    pub ours: Vec<u8>,
    pub expected: Vec<u8>,
    ours_done: bool,
    expected_done: bool,
}

/// Longest line kept when reporting a difference.
const MAX_KEPT_LINE: usize = 1 << 22;

impl CheckingWriter {
    pub fn new(expected: Option<Box<dyn Read>>) -> Self {
        CheckingWriter {
            hasher: Sha256::new(),
            bytes: 0,
            lines: 0,
            expected,
            exp_buf: Vec::new(),
            cur_line: Vec::new(),
            mismatch: None,
        }
    }

    fn read_expected(&mut self, n: usize) -> usize {
        let exp = self.expected.as_mut().unwrap();
        self.exp_buf.resize(n, 0);
        let mut got = 0;
        while got < n {
            match exp.read(&mut self.exp_buf[got..]) {
                Ok(0) => break,
                Ok(k) => got += k,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => panic!("reading the reference dump: {e}"),
            }
        }
        got
    }

    /// Extend a mismatch's captured lines up to their newlines.
    fn capture(line: &mut Vec<u8>, done: &mut bool, data: &[u8]) {
        if *done {
            return;
        }
        match data.iter().position(|&b| b == b'\n') {
            Some(i) => {
                line.extend_from_slice(&data[..i]);
                *done = true;
            }
            None => line.extend_from_slice(data),
        }
        if line.len() > MAX_KEPT_LINE {
            line.truncate(MAX_KEPT_LINE);
            *done = true;
        }
    }

    /// Finish: the sha256 (hex) of everything written, and the first difference from the
    /// expected stream (including the expected stream being longer), if any.
    pub fn finish(mut self) -> (String, u64, u64, Option<Mismatch>) {
        if self.expected.is_some() {
            // Whatever is left in the expected stream is a difference (ours is shorter).
            let mut rest = Vec::new();
            loop {
                let got = self.read_expected(1 << 16);
                if got == 0 {
                    break;
                }
                rest.extend_from_slice(&self.exp_buf[..got]);
                if let Some(m) = &self.mismatch {
                    if m.expected_done {
                        break;
                    }
                }
                if self.mismatch.is_none() || rest.len() > MAX_KEPT_LINE {
                    break;
                }
            }
            if !rest.is_empty() && self.mismatch.is_none() {
                let mut m = Mismatch {
                    line: self.lines + 1,
                    column: self.cur_line.len(),
                    ours: self.cur_line.clone(),
                    expected: self.cur_line.clone(),
                    ours_done: true,
                    expected_done: false,
                };
                Self::capture(&mut m.expected, &mut m.expected_done, &rest);
                self.mismatch = Some(m);
            } else if let Some(m) = &mut self.mismatch {
                Self::capture(&mut m.expected, &mut m.expected_done, &rest);
            }
        }
        (
            hex(&self.hasher.finalize()),
            self.bytes,
            self.lines,
            self.mismatch,
        )
    }
}

impl Write for CheckingWriter {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        self.hasher.update(data);
        if self.expected.is_some() {
            if let Some(m) = &mut self.mismatch {
                Self::capture(&mut m.ours, &mut m.ours_done, data);
                if !m.expected_done {
                    let got = self.read_expected(data.len().max(1 << 12));
                    let m = self.mismatch.as_mut().unwrap();
                    Self::capture(&mut m.expected, &mut m.expected_done, &self.exp_buf[..got]);
                }
            } else {
                let got = self.read_expected(data.len());
                let exp = &self.exp_buf[..got];
                let diff = data
                    .iter()
                    .zip(exp)
                    .position(|(a, b)| a != b)
                    .or(if got < data.len() { Some(got) } else { None });
                match diff {
                    None => {
                        // Keep our current line for reporting (bounded).
                        match data.iter().rposition(|&b| b == b'\n') {
                            Some(i) => {
                                self.cur_line.clear();
                                self.cur_line.extend_from_slice(&data[i + 1..]);
                            }
                            None => self.cur_line.extend_from_slice(data),
                        }
                        if self.cur_line.len() > MAX_KEPT_LINE {
                            let cut = self.cur_line.len() - MAX_KEPT_LINE;
                            self.cur_line.drain(..cut);
                        }
                    }
                    Some(d) => {
                        let before = &data[..d];
                        let nl = before.iter().filter(|&&b| b == b'\n').count() as u64;
                        let mut prefix = match before.iter().rposition(|&b| b == b'\n') {
                            Some(i) => before[i + 1..].to_vec(),
                            None => {
                                let mut p = self.cur_line.clone();
                                p.extend_from_slice(before);
                                p
                            }
                        };
                        if prefix.len() > MAX_KEPT_LINE {
                            prefix.drain(..prefix.len() - MAX_KEPT_LINE);
                        }
                        let mut m = Mismatch {
                            line: self.lines + nl + 1,
                            column: prefix.len(),
                            ours: prefix.clone(),
                            expected: prefix,
                            ours_done: false,
                            expected_done: false,
                        };
                        Self::capture(&mut m.ours, &mut m.ours_done, &data[d..]);
                        Self::capture(&mut m.expected, &mut m.expected_done, &exp[d.min(got)..]);
                        if got < data.len() {
                            m.expected_done = true; // the expected stream ended here
                        }
                        self.mismatch = Some(m);
                    }
                }
            }
        }
        self.bytes += data.len() as u64;
        self.lines += data.iter().filter(|&&b| b == b'\n').count() as u64;
        Ok(data.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Mismatch {
    /// A readable report: the line number and a window of both lines around the difference.
    pub fn report(&self) -> String {
        let window = |l: &[u8]| {
            let from = self.column.saturating_sub(160);
            let to = (self.column + 240).min(l.len());
            let s = String::from_utf8_lossy(&l[from.min(l.len())..to]).into_owned();
            format!(
                "{}{}{}  ({} bytes)",
                if from > 0 { "…" } else { "" },
                s,
                if to < l.len() { "…" } else { "" },
                l.len()
            )
        };
        format!(
            "first difference at line {}, byte column {}:\n  expected: {}\n  ours:     {}",
            self.line,
            self.column,
            window(&self.expected),
            window(&self.ours)
        )
    }
}

/// A whole trace read into memory.
#[derive(Debug)]
pub struct OwnedTrace {
    pub info: TraceInfo,
    pub events: Vec<memtrace_merge::OwnedEvent>,
    pub locations: LocationTable,
    pub warnings: Vec<String>,
}

pub fn read_all<R: Read>(mut r: Reader<R>) -> memtrace_merge::Result<OwnedTrace> {
    let mut events = Vec::new();
    let mut warnings = Vec::new();
    while let Some(e) = r.next_event()? {
        events.push(e.to_owned_event());
        warnings.extend(r.take_warnings().into_iter().map(|w| w.to_string()));
    }
    warnings.extend(r.take_warnings().into_iter().map(|w| w.to_string()));
    Ok(OwnedTrace {
        info: r.info().clone(),
        events,
        locations: r.locations().clone(),
        warnings,
    })
}

pub fn read_bytes(bytes: &[u8], name: &str) -> memtrace_merge::Result<OwnedTrace> {
    read_all(Reader::new(bytes, name)?)
}

/// An event with its object named by position (the n-th allocation of the stream) rather
/// than by id, so that streams written with different id layouts compare equal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NormEvent {
    Alloc {
        time: Timestamp,
        domain: DomainId,
        length: u64,
        nsamples: u64,
        source: AllocSource,
        backtrace: Vec<LocationCode>,
    },
    Promote {
        time: Timestamp,
        domain: DomainId,
        alloc: Option<usize>,
    },
    Collect {
        time: Timestamp,
        domain: DomainId,
        alloc: Option<usize>,
    },
}

/// Turns events into [`NormEvent`]s, remembering which codes were used.
#[derive(Default)]
pub struct Normalizer {
    ordinal: HashMap<ObjId, usize>,
    next: usize,
    pub used_codes: HashSet<LocationCode>,
    /// Keep domains (false: every event is put in domain 0, for comparisons across formats).
    pub ignore_domains: bool,
}

impl Normalizer {
    pub fn new(ignore_domains: bool) -> Self {
        Normalizer {
            ignore_domains,
            ..Default::default()
        }
    }
    pub fn norm(&mut self, e: &Event<'_>) -> NormEvent {
        let dom = |d: DomainId| if self.ignore_domains { DomainId(0) } else { d };
        match *e {
            Event::Alloc(a) => {
                self.ordinal.insert(a.id, self.next);
                self.next += 1;
                self.used_codes.extend(a.backtrace.iter().copied());
                NormEvent::Alloc {
                    time: a.time,
                    domain: dom(a.domain),
                    length: a.length,
                    nsamples: a.nsamples,
                    source: a.source,
                    backtrace: a.backtrace.to_vec(),
                }
            }
            Event::Promote { time, domain, id } => NormEvent::Promote {
                time,
                domain: dom(domain),
                alloc: self.ordinal.get(&id).copied(),
            },
            Event::Collect { time, domain, id } => NormEvent::Collect {
                time,
                domain: dom(domain),
                alloc: self.ordinal.get(&id).copied(),
            },
        }
    }
}

/// Read two traces in lockstep and require the same events (positionally: objects are
/// compared by allocation order, not id) and the same locations for every code used.
/// Returns the number of events compared.
pub fn assert_same_events<R1: Read, R2: Read>(
    a: &mut Reader<R1>,
    b: &mut Reader<R2>,
    ignore_domains: bool,
) -> u64 {
    let mut na = Normalizer::new(ignore_domains);
    let mut nb = Normalizer::new(ignore_domains);
    let mut n = 0u64;
    loop {
        let ea = match a.next_event() {
            Ok(e) => e.map(|e| na.norm(&e)),
            Err(e) => panic!("reading event #{n}: {e}"),
        };
        let eb = match b.next_event() {
            Ok(e) => e.map(|e| nb.norm(&e)),
            Err(e) => panic!("reading event #{n}: {e}"),
        };
        match (ea, eb) {
            (None, None) => break,
            (ea, eb) => {
                assert!(
                    ea == eb,
                    "event #{n} differs between {} and {}:\n  {ea:?}\n  {eb:?}",
                    a.name(),
                    b.name()
                );
            }
        }
        n += 1;
    }
    assert_eq!(na.used_codes, nb.used_codes);
    let mut codes: Vec<_> = na.used_codes.iter().copied().collect();
    codes.sort();
    for c in codes {
        let la: Option<&LocationList> = a.lookup(c);
        let lb: Option<&LocationList> = b.lookup(c);
        assert!(la.is_some(), "{}: code {c} used but not defined", a.name());
        assert_eq!(
            la,
            lb,
            "locations of code {c} differ between {} and {}",
            a.name(),
            b.name()
        );
    }
    n
}

/// `BLESS=1` in the environment.
pub fn bless() -> bool {
    std::env::var_os("BLESS").is_some_and(|v| v == "1")
}

/// babeltrace2 (when installed, with our CTF description of the trace's format) frames
/// every packet and event of the trace at `path`.
pub fn babeltrace_frames(path: &Path) {
    use std::process::Command;
    if Command::new("babeltrace2")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("babeltrace2 not installed: framing check skipped");
        return;
    }
    let version = Reader::open(path).unwrap().info().version;
    let tsdl = Path::new(env!("CARGO_MANIFEST_DIR")).join(if version >= 3 {
        "tests/tsdl/memtrace-v3.tsdl"
    } else {
        "tests/tsdl/memtrace-v2.tsdl"
    });
    if !tsdl.exists() {
        eprintln!("{} missing: framing check skipped", tsdl.display());
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(&tsdl, dir.path().join("metadata")).unwrap();
    std::fs::copy(path, dir.path().join("stream_0")).unwrap();
    let out = Command::new("babeltrace2")
        .args(["run", "--component=src:source.ctf.fs"])
        .arg(format!("--params=inputs=[\"{}\"]", dir.path().display()))
        .args(["--component=sink:sink.utils.dummy", "--connect=src:sink"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "babeltrace2 rejects {}: {}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}
