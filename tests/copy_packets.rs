//! Format-3 merges that copy their inputs' packets, only the headers rewritten: every copied
//! body is an input's byte for byte, the merge holds every source event (compare) and is
//! valid (check, babeltrace2 when installed); inputs that cannot be copied (damaged,
//! thinned, tagged, codes meaning otherwise) are merged as before beside the copied ones.

mod common;

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
