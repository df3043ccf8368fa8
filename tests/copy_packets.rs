//! Format-3 merges that copy their inputs' packets, only the headers rewritten: every copied
//! body is an input's byte for byte, the merge holds every source event (compare) and is
//! valid (check, babeltrace2 when installed); inputs that cannot be copied (damaged,
//! thinned, tagged, codes meaning otherwise) are merged as before beside the copied ones.

mod common;
#[path = "support/splitmix.rs"]
mod splitmix;

use memtrace_merge::tools::compare::{compare, CompareOptions};
use memtrace_merge::{merge, MergeOptions, MergeReport};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

fn data(p: &str) -> PathBuf {
    common::data_dir().join(p)
}

fn fork() -> Vec<PathBuf> {
    ["parent", "child-1", "child-2", "child-3", "child-4"]
        .iter()
        .map(|n| data(&format!("fork/{n}.ctf")))
        .collect()
}

/// The bodies of a trace's packets after its info packet, with their header's domain.
fn bodies(path: &Path) -> Vec<(u16, Vec<u8>)> {
    let b = std::fs::read(path).unwrap();
    let mut out = Vec::new();
    let mut off = 0;
    let mut first = true;
    while off + 30 <= b.len() {
        let word = |at: usize, n: usize| {
            let mut v = [0u8; 8];
            v[..n].copy_from_slice(&b[off + at..off + at + n]);
            u64::from_le_bytes(v)
        };
        let size = word(4, 4) as usize / 8;
        let version = word(28, 2);
        let (hs, domain) = if version >= 3 {
            (68, word(38, 2) as u16)
        } else {
            (66, 0)
        };
        if !first && size > hs {
            out.push((domain, b[off + hs..off + size].to_vec()));
        }
        first = false;
        off += size;
    }
    out
}

/// Merge `inputs` with `opts`; the merge must equal its sources and be valid.
fn merge_checked(
    inputs: &[PathBuf],
    opts: &MergeOptions,
) -> (tempfile::TempDir, PathBuf, MergeReport) {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("merged.ctf");
    let r = merge(inputs, &out, opts).unwrap();
    for readable_part in [false, true] {
        let c = compare(
            inputs,
            &out,
            CompareOptions {
                thinned: r.inputs.iter().any(|i| i.keep_fraction < 1.0),
                tagged: opts.tag_processes,
                readable_part,
            },
        )
        .unwrap();
        assert!(c.equal(), "{readable_part}: {c:?}");
        assert_eq!(c.merged_allocs, r.allocs);
    }
    let check = Command::new(env!("CARGO_BIN_EXE_memtrace-merge"))
        .arg("check")
        .arg(&out)
        .output()
        .unwrap();
    assert!(
        check.status.success(),
        "check: {}",
        String::from_utf8_lossy(&check.stdout)
    );
    common::babeltrace_frames(&out);
    (dir, out, r)
}

/// The fork/ traces (format 2) and an OCaml 5 trace of two domains, merged to format 3:
/// every input copied, each input domain in an output domain of its own, every body the
/// input's, and the same events as the merge that re-encodes them.
#[test]
fn clean_inputs_are_copied_body_for_body() {
    let mut inputs = fork();
    inputs.push(data("v3/multidomain.ctf"));
    let f3 = MergeOptions {
        format: Some(3),
        ..Default::default()
    };
    let (_d, out, r) = merge_checked(&inputs, &f3);
    assert!(r.inputs.iter().all(|i| i.copied), "{r:?}");
    // Each output domain's bodies are, in order, one input domain's.
    let mut by_domain: HashMap<u16, Vec<Vec<u8>>> = HashMap::new();
    for (d, b) in bodies(&out) {
        by_domain.entry(d).or_default().push(b);
    }
    let mut sources: Vec<Vec<Vec<u8>>> = Vec::new();
    for p in &inputs {
        let mut per: HashMap<u16, Vec<Vec<u8>>> = HashMap::new();
        for (d, b) in bodies(p) {
            per.entry(d).or_default().push(b);
        }
        let mut ds: Vec<_> = per.into_iter().collect();
        ds.sort();
        sources.extend(ds.into_iter().map(|(_, b)| b));
    }
    assert_eq!(by_domain.len(), sources.len());
    for (d, s) in sources.iter().enumerate() {
        assert!(
            by_domain.get(&(d as u16)) == Some(s),
            "output domain {d}: not its input domain's bodies"
        );
    }
    // Not copied, the same allocations (compare) in other bytes.
    let o = MergeOptions {
        copy_packets: Some(false),
        ..f3
    };
    let (_d2, again, r2) = merge_checked(&inputs, &o);
    assert!(r2.inputs.iter().all(|i| !i.copied));
    assert_eq!(r.allocs, r2.allocs);
    assert_ne!(std::fs::read(&out).unwrap(), std::fs::read(&again).unwrap());
}

/// Beside copied inputs, those that cannot be copied are merged as before: a truncated
/// trace (its readable part), a faster-sampled one (thinned), and, tagged, all of them.
#[test]
fn inputs_that_cannot_be_copied_are_merged_beside() {
    let f3 = MergeOptions {
        format: Some(3),
        ..Default::default()
    };
    // (truncated.ctf is cut from fork/child-2.ctf: another process beside it)
    let inputs = [data("truncated.ctf"), data("fork/child-3.ctf")];
    let (_d, _, r) = merge_checked(&inputs, &f3);
    assert_eq!(
        r.inputs.iter().map(|i| i.copied).collect::<Vec<_>>(),
        [false, true]
    );
    let rates = [
        data("rates/fast.ctf"),
        data("rates/slow.ctf"),
        data("fork/child-4.ctf"),
    ];
    let (_d, _, r) = merge_checked(&rates, &f3);
    let copied: Vec<bool> = r.inputs.iter().map(|i| i.copied).collect();
    let thinned: Vec<bool> = r.inputs.iter().map(|i| i.keep_fraction < 1.0).collect();
    assert!(copied.iter().zip(&thinned).all(|(c, t)| *c != *t), "{r:?}");
    let tagged = MergeOptions {
        tag_processes: true,
        ..f3
    };
    let (_d, _, r) = merge_checked(&fork(), &tagged);
    assert!(r.inputs.iter().all(|i| !i.copied));
}

/// OCaml 5 traces whose domains take over a terminated domain's blocks (a collect in
/// another domain than the allocation's): copied or not, the merge holds their events.
#[test]
fn handed_over_blocks_are_merged_copied_or_not() {
    let dir = data("ocaml5/handover/fork5");
    let mut inputs: Vec<PathBuf> = ["parent", "child-1", "child-2", "child-3"]
        .iter()
        .map(|n| dir.join(format!("{n}.ctf")))
        .collect();
    inputs.push(data("ocaml5/handover/child-killed.ctf"));
    let (_d, _, r) = merge_checked(&inputs, &MergeOptions::default());
    assert_eq!(r.format, 3);
    eprintln!(
        "copied: {:?}",
        r.inputs.iter().map(|i| i.copied).collect::<Vec<_>>()
    );
}

/// A merge that would copy, cancelled (here before it starts: the surveys and the copy
/// ask too), fails so and leaves no output.
#[test]
fn a_cancelled_copying_merge_leaves_no_output() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("merged.ctf");
    let cancel = memtrace_merge::Cancel::new();
    cancel.cancel();
    let opts = MergeOptions {
        format: Some(3),
        cancel,
        ..Default::default()
    };
    let r = merge(&fork(), &out, &opts);
    assert!(matches!(r, Err(memtrace_merge::Error::Cancelled)), "{r:?}");
    assert!(!out.exists());
}

/// Every event a reader hands out, folded into one number with their count.
#[derive(Default, PartialEq, Debug)]
struct Digest(u64, u64);

impl Digest {
    fn add(&mut self, words: &[u64]) {
        for &w in words {
            self.0 = (self.0 ^ w).wrapping_mul(0x100_0000_01b3).rotate_left(17);
        }
        self.1 += 1;
    }
}

impl memtrace_merge::EventSink for Digest {
    fn location(
        &mut self,
        code: memtrace_merge::LocationCode,
        locs: &memtrace_merge::LocationList,
    ) {
        self.add(&[1, code.0, locs.len() as u64]);
    }
    fn alloc(
        &mut self,
        time: u64,
        id: u64,
        length: u64,
        nsamples: u64,
        source: memtrace_merge::AllocSource,
        common_prefix: u64,
        backtrace: &[memtrace_merge::LocationCode],
        _slots: &[u16],
    ) {
        self.add(&[2, time, id, length, nsamples, source as u64, common_prefix]);
        self.add(&backtrace.iter().map(|c| c.0).collect::<Vec<_>>());
    }
    fn promote(&mut self, time: u64, id: u64) {
        self.add(&[3, time, id]);
    }
    fn collect(&mut self, time: u64, id: u64) {
        self.add(&[4, time, id]);
    }
}

/// A sink of every event but the frames; which, with `1`, it says it does not look at
/// (the reader then only runs them through its cache).
struct Unframed(Digest, bool);

impl memtrace_merge::EventSink for Unframed {
    fn location(
        &mut self,
        code: memtrace_merge::LocationCode,
        locs: &memtrace_merge::LocationList,
    ) {
        self.0.location(code, locs);
    }
    fn alloc(
        &mut self,
        time: u64,
        id: u64,
        length: u64,
        nsamples: u64,
        source: memtrace_merge::AllocSource,
        common_prefix: u64,
        _backtrace: &[memtrace_merge::LocationCode],
        _slots: &[u16],
    ) {
        (self.0).alloc(time, id, length, nsamples, source, common_prefix, &[], &[]);
    }
    fn promote(&mut self, time: u64, id: u64) {
        self.0.promote(time, id);
    }
    fn collect(&mut self, time: u64, id: u64) {
        self.0.collect(time, id);
    }
    fn backtraces(&self) -> bool {
        !self.1
    }
}

/// What `read_clean` says of `bytes` and the events it hands out but their frames, the
/// frames decoded (false) or only run through the cache (true).
fn unframed_reading(bytes: &[u8], walk: bool) -> Option<(String, Digest)> {
    let mut r = memtrace_merge::Reader::new(bytes, "t").ok()?;
    let mut d = Unframed(Digest::default(), walk);
    let said = r.read_clean(&mut d);
    Some((format!("{said:?}"), d.0))
}

/// Whether `bytes` read cleanly (no warning, no error) with `read_events`, with what it
/// read; the same from `read_clean`.
fn both_readings(bytes: &[u8]) -> Option<((bool, Digest), (bool, Digest))> {
    let mut a = memtrace_merge::Reader::new(bytes, "t").ok()?;
    let mut da = Digest::default();
    let ok_a = loop {
        match a.read_events(&mut da, 1000) {
            Ok(true) => {}
            Ok(false) => break a.warnings().is_empty() && a.warnings_dropped() == 0,
            Err(_) => break false,
        }
    };
    let mut b = memtrace_merge::Reader::new(bytes, "t").ok()?;
    let mut db = Digest::default();
    let ok_b = matches!(b.read_clean(&mut db), Ok(None));
    Some(((ok_a, da), (ok_b, db)))
}

/// `read_clean`, which says whether a merge may copy an input, reads cleanly exactly the
/// traces the reader reads without a warning or an error, and the same events: every
/// trace of tests/data, and each of three of them with 60 bytes changed, one at a time.
/// For a sink of no frames, it says the same with the frames decoded or not.
#[test]
fn read_clean_refuses_exactly_what_the_reader_warns_of() {
    let mut files = Vec::new();
    let mut dirs = vec![common::data_dir()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "ctf") {
                files.push(p);
            }
        }
    }
    files.sort();
    let (mut clean, mut refused) = (0, 0);
    let mut check = |bytes: &[u8], what: &str| {
        // (a sink of no frames: the same refusal, the same events, at the same byte)
        assert_eq!(
            unframed_reading(bytes, false),
            unframed_reading(bytes, true),
            "{what}: frames decoded, then only run through the cache"
        );
        if let Some(((ok_a, da), (ok_b, db))) = both_readings(bytes) {
            assert_eq!(
                ok_a, ok_b,
                "{what}: read_events clean {ok_a}, read_clean {ok_b}"
            );
            if ok_a {
                assert_eq!(da, db, "{what}: other events");
                clean += 1;
            } else {
                refused += 1;
            }
        }
    };
    for f in &files {
        check(&std::fs::read(f).unwrap(), &f.display().to_string());
    }
    let mut rng = splitmix::SplitMix::from_state(34);
    for name in ["fork/child-4.ctf", "v3/multidomain.ctf", "rates/slow.ctf"] {
        let bytes = std::fs::read(data(name)).unwrap();
        for _ in 0..60 {
            let mut b = bytes.clone();
            let at = (rng.next_u64() % b.len() as u64) as usize;
            b[at] ^= 1 << (rng.next_u64() % 8);
            check(&b, &format!("{name} with byte {at} changed"));
        }
    }
    assert!(
        clean > 20 && refused > 20,
        "clean {clean}, refused {refused}"
    );
}
