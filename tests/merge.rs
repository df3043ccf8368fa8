//! Acceptance tests of the merge: every merged file is read back and compared with its
//! sources allocation by allocation (time, kind, samples, length, resolved backtrace,
//! promote and collect times), checked by `memtrace-merge check`, and by babeltrace2 if present.

mod common;

use memtrace_merge::AllocHeader;

use memtrace_merge::scan_domains;
use memtrace_merge::tools::compare::{allocations, compare, CompareOptions, CompareReport, Digest};
use memtrace_merge::{merge, MergeOptions, MergeReport, RateMismatch};
use memtrace_merge::{
    AllocSource, DomainId, Event, Location, LocationCode, LocationList, Reader, Timestamp,
    TraceInfo, Writer, WriterOptions,
};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

fn data(p: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(p)
}

fn fork() -> Vec<PathBuf> {
    ["parent", "child-1", "child-2", "child-3", "child-4"]
        .iter()
        .map(|n| data(&format!("fork/{n}.ctf")))
        .collect()
}

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_memtrace-merge")
}

/// `memtrace-merge check` must accept the file; babeltrace2 (when installed) must frame it.
fn assert_valid(path: &Path) {
    let out = Command::new(bin()).arg("check").arg(path).output().unwrap();
    assert!(
        out.status.success(),
        "check failed on {}: {}{}",
        path.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    common::babeltrace_frames(path);
}

fn merged(inputs: &[PathBuf], opts: &MergeOptions) -> (tempfile::TempDir, PathBuf, MergeReport) {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("merged.ctf");
    let report = merge(inputs, &out, opts).unwrap();
    (dir, out, report)
}

/// Merge, then require semantic equality with the union of the sources and validity; the
/// same with backtraces encoded ahead (where possible) and not.
fn merge_and_compare(inputs: &[PathBuf], opts: &MergeOptions) -> MergeReport {
    for ahead in [Some(true), Some(false)] {
        if opts.encode_ahead != ahead {
            let o = MergeOptions {
                encode_ahead: ahead,
                ..opts.clone()
            };
            let r = merge_and_compare_as(inputs, &o);
            assert!(!r.encoded_ahead || ahead == Some(true));
        }
    }
    merge_and_compare_as(inputs, opts)
}

/// [`merge_and_compare`] once: the sources read whole, and read as the merge reads them (a
/// format-3 source a domain at a time), must both equal the merged trace.
fn merge_and_compare_as(inputs: &[PathBuf], opts: &MergeOptions) -> MergeReport {
    let (_dir, out, report) = merged(inputs, opts);
    for readable_part in [false, true] {
        let cmp = compare(
            inputs,
            &out,
            CompareOptions {
                thinned: false,
                tagged: opts.tag_processes,
                readable_part,
            },
        )
        .unwrap();
        assert!(
            cmp.equal() && cmp.sources_cut == 0,
            "merged differs from sources (read as the merge reads them: {readable_part}): {cmp:?}"
        );
        assert!(cmp.source_allocs > 0);
        assert_eq!(cmp.source_allocs, cmp.merged_allocs);
        assert_eq!(report.allocs, cmp.merged_allocs);
    }
    assert_valid(&out);
    report
}

#[test]
fn fork_set_is_merged_exactly() {
    let r = merge_and_compare(&fork(), &MergeOptions::default());
    assert_eq!(
        (r.allocs, r.promotes, r.collects),
        (231_910, 30_463, 223_009)
    );
    assert_eq!(r.format, 2);
    assert_eq!(
        r.remapped_codes, 0,
        "forked children share the parent's codes"
    );
    assert_eq!(r.inputs.len(), 5);
}

#[test]
fn fork_set_as_a_directory_and_in_format_3() {
    let r = merge_and_compare(
        &[data("fork")],
        &MergeOptions {
            format: Some(3),
            ..Default::default()
        },
    );
    assert_eq!(r.format, 3);
    assert_eq!(r.inputs.len(), 5);
}

/// A file named twice (a file and the directory holding it, another spelling, a link) is
/// merged once, with a warning naming the repeat: its process's allocations appear once.
#[test]
fn a_file_given_twice_is_merged_once() {
    let dir = tempfile::tempdir().unwrap();
    let link = dir.path().join("again.ctf");
    std::os::unix::fs::symlink(data("fork/child-2.ctf"), &link).unwrap();
    let dotted = data("fork").join(".").join("child-4.ctf");
    let inputs = [data("fork/child-1.ctf"), data("fork"), link.clone(), dotted];
    let (_d, out, r) = merged(&inputs, &MergeOptions::default());
    let cmp = compare(&fork(), &out, CompareOptions::default()).unwrap();
    assert!(cmp.equal(), "{cmp:?}");
    assert_eq!(r.allocs, 231_910);
    let names: Vec<String> = r
        .inputs
        .iter()
        .map(|i| i.path.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        names,
        [
            "child-1.ctf",
            "child-2.ctf",
            "child-3.ctf",
            "child-4.ctf",
            "parent.ctf"
        ]
    );
    let warned = |k: usize| {
        r.inputs[k]
            .warnings
            .iter()
            .filter(|w| w.contains("given again as"))
            .count()
    };
    assert_eq!(
        (warned(0), warned(1), warned(2), warned(3), warned(4)),
        (1, 1, 0, 1, 0)
    );
    assert!(r.inputs[1]
        .warnings
        .iter()
        .any(|w| w.contains(&*link.to_string_lossy())));
    // one file named twice is still a copy, byte for byte
    let (_d, out, r) = merged(&[data("fork/child-2.ctf"), link], &MergeOptions::default());
    assert_eq!(r.inputs.len(), 1);
    assert_eq!(
        std::fs::read(out).unwrap(),
        std::fs::read(data("fork/child-2.ctf")).unwrap()
    );
}

/// A directory merged into a file of its own (again, once that file exists): the earlier
/// output, known by the context a merge gives it, is no input; a comparison leaves the
/// merged trace out of its sources' directory. A directory holding nothing but the output
/// says so.
#[test]
fn a_directory_merged_into_itself_leaves_its_output_out() {
    let dir = tempfile::tempdir().unwrap();
    for f in fork() {
        std::fs::copy(&f, dir.path().join(f.file_name().unwrap())).unwrap();
    }
    let out = dir.path().join("merged.ctf");
    let src = [dir.path().to_path_buf()];
    let first = merge(&src, &out, &MergeOptions::default()).unwrap();
    let bytes = std::fs::read(&out).unwrap();
    let again = merge(&src, &out, &MergeOptions::default()).unwrap();
    assert_eq!((first.inputs.len(), again.inputs.len()), (5, 5));
    assert!(
        again.inputs.iter().all(|i| i.path != out),
        "{:?}",
        again.inputs
    );
    assert_eq!(std::fs::read(&out).unwrap(), bytes);
    let cmp = compare(&src, &out, CompareOptions::default()).unwrap();
    assert!(cmp.equal() && cmp.source_allocs == 231_910, "{cmp:?}");
    // named as an input, it is still refused; and so is a file of the directory that is
    // not an earlier merge (a source, or a merge given a context of the caller's)
    let e = merge(
        &[src[0].clone(), out.clone()],
        &out,
        &MergeOptions::default(),
    )
    .unwrap_err();
    assert!(e.to_string().contains("one of the inputs"), "{e}");
    let source = dir.path().join("child-1.ctf");
    let e = merge(&src, &source, &MergeOptions::default()).unwrap_err();
    assert!(e.to_string().contains("one of the inputs"), "{e}");
    let own = MergeOptions {
        context: Some(b"nightly run".to_vec()),
        ..Default::default()
    };
    // (merged again with the same context of the caller's: the earlier output is left out)
    merge(&src, &out, &own).unwrap();
    let r = merge(&src, &out, &own).unwrap();
    assert_eq!(r.allocs, 231_910);
    let alone = tempfile::tempdir().unwrap();
    let lone = alone.path().join("merged.ctf");
    std::fs::write(&lone, &bytes).unwrap();
    let e = merge(
        &[alone.path().to_path_buf()],
        &lone,
        &MergeOptions::default(),
    )
    .unwrap_err();
    assert!(
        e.to_string()
            .ends_with("directory has no .ctf files but the output"),
        "{e}"
    );
}

/// An earlier merge merged again beside a trace it records (the same pid and start time)
/// holds it: the trace is left out, with a warning naming it.
#[test]
fn a_trace_an_earlier_merge_holds_is_merged_once() {
    let (_d, earlier, _) = merged(&fork(), &MergeOptions::default());
    let (_d2, out, r) = merged(
        &[earlier.clone(), data("fork/child-3.ctf")],
        &MergeOptions::default(),
    );
    assert_eq!(r.inputs.len(), 1);
    assert!(
        (r.inputs[0].warnings.iter()).any(|w| w.contains("holds ") && w.contains("child-3.ctf")),
        "{:?}",
        r.inputs[0].warnings
    );
    let c = compare(&fork(), &out, CompareOptions::default()).unwrap();
    assert!(c.equal(), "{c:?}");
}

/// An earlier merge that records no start times (as merges before 2026-12) merged again
/// beside a trace of a pid it holds is warned about, naming that trace; beside traces it
/// does not hold, it is not.
#[test]
fn an_earlier_merge_beside_a_trace_it_holds_is_warned_about() {
    let old_style = MergeOptions {
        context: Some(
            b"memtrace-merge of 5 traces: child-3.ctf (pid 14498, main.exe, rate 0.0003);".to_vec(),
        ),
        ..Default::default()
    };
    let (_d, earlier, _) = merged(&fork(), &old_style);
    let twice = |r: &MergeReport, k: usize| -> Vec<String> {
        r.inputs[k]
            .warnings
            .iter()
            .filter(|w| w.contains("an earlier merge that holds pid"))
            .cloned()
            .collect()
    };
    let (_d2, _, r) = merged(
        &[earlier.clone(), data("fork/child-3.ctf")],
        &MergeOptions::default(),
    );
    let w = twice(&r, 0);
    assert_eq!(w.len(), 1, "{:?}", r.inputs[0].warnings);
    assert!(w[0].contains(&format!("pid {}", r.inputs[1].pid)) && w[0].contains("child-3.ctf"));
    assert!(twice(&r, 1).is_empty());
    let (_d3, _, r) = merged(&[earlier, data("long.ctf")], &MergeOptions::default());
    assert!(twice(&r, 0).is_empty(), "{:?}", r.inputs[0].warnings);
}

#[test]
fn multidomain_with_fork_both_formats() {
    let mut inputs = fork();
    inputs.push(data("v3/multidomain.ctf"));
    let r = merge_and_compare(&inputs, &MergeOptions::default());
    assert_eq!(
        r.format, 3,
        "a format-3 input makes format-3 output by default"
    );
    let r = merge_and_compare(
        &inputs,
        &MergeOptions {
            format: Some(2),
            ..Default::default()
        },
    );
    assert_eq!(r.format, 2);
}

#[test]
fn one_multidomain_trace_converted_to_format_2() {
    let (_d, out, _) = merged(
        &[data("v3/multidomain.ctf")],
        &MergeOptions {
            format: Some(2),
            ..Default::default()
        },
    );
    assert_eq!(Reader::open(&out).unwrap().info().version, 2);
    let c = compare(
        &[data("v3/multidomain.ctf")],
        &out,
        CompareOptions::default(),
    )
    .unwrap();
    assert!(c.equal(), "{c:?}");
    assert_valid(&out);
}

#[test]
fn truncated_inputs_merge_their_readable_parts() {
    // (both are cut from fork/child-2.ctf: the same process, merged once unless asked)
    let inputs = [data("truncated.ctf"), data("truncated-header.ctf")];
    let (_d, _, r) = merged(&inputs, &MergeOptions::default());
    assert_eq!(r.allocs, 6407);
    let r = merge_and_compare(
        &inputs,
        &MergeOptions {
            keep_duplicates: true,
            ..Default::default()
        },
    );
    assert_eq!(r.allocs, 2 * 6407);
    for i in &r.inputs {
        assert_eq!(i.skipped_packets, 1, "{:?}", i);
        assert!(
            i.warnings.iter().any(|w| w.contains("byte 87099")),
            "{:?}",
            i.warnings
        );
    }
}

/// Two copies of one trace, the first given cut short: the whole one is merged, the cut
/// one named as the repeat (either order).
#[test]
fn of_two_copies_of_a_trace_the_longer_is_merged() {
    let dir = tempfile::tempdir().unwrap();
    let whole = data("fork/child-1.ctf");
    let cut = dir.path().join("cut.ctf");
    let bytes = std::fs::read(&whole).unwrap();
    std::fs::write(&cut, &bytes[..3000]).unwrap();
    let full = merged(std::slice::from_ref(&whole), &MergeOptions::default())
        .2
        .allocs;
    for inputs in [[cut.clone(), whole.clone()], [whole.clone(), cut.clone()]] {
        let (_d, _, r) = merged(&inputs, &MergeOptions::default());
        assert_eq!(r.allocs, full, "{inputs:?}");
        assert_eq!(r.inputs.len(), 1);
        assert_eq!(r.inputs[0].path, whole);
        assert!(
            (r.inputs[0].warnings.iter())
                .any(|w| w.contains("cut.ctf is a trace of the same process")),
            "{:?}",
            r.inputs[0].warnings
        );
    }
}

#[test]
fn long_and_external_time_wrap_and_external_allocations() {
    let r = merge_and_compare(
        &[data("long.ctf"), data("external.ctf")],
        &MergeOptions::default(),
    );
    assert_eq!(r.allocs, 77_522 + 8_126);
}

#[test]
fn tagged_processes_get_a_root_frame_naming_them() {
    let inputs = fork();
    merge_and_compare(
        &inputs,
        &MergeOptions {
            tag_processes: true,
            ..Default::default()
        },
    );
    let (_d, out, _) = merged(
        &inputs,
        &MergeOptions {
            tag_processes: true,
            ..Default::default()
        },
    );
    let mut r = Reader::open(&out).unwrap();
    let mut roots = HashMap::new();
    while let Some((ev, table)) = r.next_with_locations().unwrap() {
        if let memtrace_merge::Event::Alloc(a) = ev {
            let root = &table[&a.backtrace[0]][0];
            *roots
                .entry(String::from_utf8_lossy(&root.defname).into_owned())
                .or_insert(0u64) += 1;
        }
    }
    assert_eq!(roots.len(), 5);
    assert_eq!(roots["pid 14495 forkwork"], 88_445);
    assert_eq!(roots["pid 14496 forkwork"], 8_336);
    // the comparison checks each tag: a source under another file name does not match
    let dir = tempfile::tempdir().unwrap();
    let renamed = dir.path().join("renamed.ctf");
    std::fs::copy(&inputs[1], &renamed).unwrap();
    let mut others = inputs.clone();
    others[1] = renamed;
    let tagged = CompareOptions {
        thinned: false,
        tagged: true,
        ..Default::default()
    };
    let c = compare(&others, &out, tagged).unwrap();
    assert!(
        !c.equal() && c.missing == 8_336 && c.extra == 8_336,
        "{c:?}"
    );
}

/// A trace info for synthetic inputs.
fn info(pid: u64, start: u64, rate: f64, exe: &str) -> TraceInfo {
    TraceInfo {
        sample_rate: rate,
        word_size: 64,
        executable_name: exe.as_bytes().to_vec(),
        host_name: b"test".to_vec(),
        ocaml_runtime_params: b"".to_vec(),
        pid,
        start_time: Timestamp(start),
        context: None,
        initial_domain: DomainId(0),
        version: 2,
    }
}

fn locs(file: &str, def: &str, line: u32) -> LocationList {
    Arc::from(vec![Location {
        filename: Arc::from(file.as_bytes()),
        line,
        start_char: 1,
        end_char: 9,
        defname: Arc::from(def.as_bytes()),
    }])
}

/// A lossless writer of format `version` of the synthetic trace info (pid, executable),
/// starting at 1,000,000 µs, sampling at 1e-4.
fn lossless_writer(path: &Path, version: u16, pid: u64, exe: &str) -> Writer<std::fs::File> {
    let mut i = info(pid, 1_000_000, 1e-4, exe);
    i.version = version;
    let opts = WriterOptions {
        version,
        lossless: true,
    };
    Writer::new(std::fs::File::create(path).unwrap(), &i, opts).unwrap()
}

/// Write a synthetic trace in which codes 100..110 mean `file:def_i` and allocations use them.
fn write_synthetic(path: &Path, pid: u64, start: u64, file: &str, deep: usize) {
    let table: HashMap<LocationCode, LocationList> = (0..10u64)
        .map(|i| {
            (
                LocationCode(100 + i),
                locs(file, &format!("f{i}"), i as u32 + 1),
            )
        })
        .collect();
    let f = std::fs::File::create(path).unwrap();
    let mut w = Writer::new(
        f,
        &info(pid, start, 1e-4, file),
        WriterOptions {
            version: 2,
            lossless: true,
        },
    )
    .unwrap();
    let mut t = start;
    for k in 0..2000u64 {
        t += 37;
        let mut bt: Vec<LocationCode> = (0..(1 + k % 7))
            .map(|i| LocationCode(100 + (k + i) % 10))
            .collect();
        if deep > 0 && k % 500 == 3 {
            // a deep, irregular stack: more than the reference's 4 KiB per backtrace
            bt.extend((0..deep as u64).map(|i| LocationCode(100 + (i * i + k) % 10)));
        }
        let lookup = |c: LocationCode| table.get(&c).cloned();
        let id = w
            .put_alloc(
                &AllocHeader {
                    time: Timestamp(t),
                    domain: DomainId(0),
                    length: 1 + k % 20,
                    nsamples: 1,
                    source: AllocSource::Minor,
                },
                &bt,
                lookup,
            )
            .unwrap();
        if k % 3 == 0 {
            w.put_collect(Timestamp(t + 5), DomainId(0), id).unwrap();
            t += 5;
        }
    }
    w.finish().unwrap();
}

/// The output is the same bytes however many threads decode: streams decode
/// independently, and codes are claimed in merged order on the merging thread. (CI's two
/// cores run one decoding thread by default, so this is where several are exercised.)
#[test]
fn output_does_not_depend_on_the_decoding_threads() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = colliding_pair(dir.path());
    let mut inputs = fork();
    inputs.push(data("v3/multidomain.ctf"));
    inputs.extend([a, b, data("rates/fast.ctf")]);
    for format in [2, 3] {
        let run = |threads: usize| {
            let (_d, out, r) = merged(
                &inputs,
                &MergeOptions {
                    format: Some(format),
                    decode_threads: Some(threads),
                    ..Default::default()
                },
            );
            (std::fs::read(out).unwrap(), r.remapped_codes)
        };
        let (one, remapped) = run(1);
        assert!(remapped > 0, "the colliding pair is remapped");
        for threads in [2, 3, 8] {
            assert!(
                run(threads) == (one.clone(), remapped),
                "format {format}: {threads} decoding threads wrote other bytes than one"
            );
        }
    }
}

/// Encoded ahead, too, the bytes do not depend on how many threads decode (each stream
/// encodes in its own share of the cache, whichever thread it is on).
#[test]
fn encoded_ahead_output_does_not_depend_on_the_decoding_threads() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = colliding_pair(dir.path());
    let (c, d) = (dir.path().join("c.ctf"), dir.path().join("d.ctf"));
    write_repeating(&c, 3, 1_000_050);
    write_repeating(&d, 4, 1_000_070);
    let inputs = [a, b, c, d];
    let run = |threads: usize| {
        let (_d, out, r) = merged(
            &inputs,
            &MergeOptions {
                decode_threads: Some(threads),
                encode_ahead: Some(true),
                ..Default::default()
            },
        );
        assert!(r.encoded_ahead && r.remapped_codes > 0);
        std::fs::read(out).unwrap()
    };
    let one = run(1);
    for threads in [2, 3, 8] {
        assert!(
            run(threads) == one,
            "{threads} decoding threads wrote other bytes"
        );
    }
}

/// Encoding ahead is chosen where backtraces mostly repeat the stream's previous one (as
/// in `write_synthetic`, whose stacks change by a frame or so), not for the `fork/` set
/// (deep stacks, much of them new each time), and never for a thinned input of several
/// streams (a format-3 trace's domains into one format-2 domain), even when asked for;
/// tagged processes are encoded ahead (their tag the root of every path), and so are
/// streams alone in a format-3 domain; but not streams whose codes their shares cannot
/// hold.
#[test]
fn encoding_ahead_is_chosen_where_it_pays() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a.ctf"), dir.path().join("b.ctf"));
    write_repeating(&a, 1, 1_000_000);
    write_repeating(&b, 2, 1_000_100);
    let auto = MergeOptions::default();
    assert!(merge_and_compare(&[a.clone(), b.clone()], &auto).encoded_ahead);
    // format 3: each alone in its domain, after what it keeps of its previous backtrace
    // (when re-encoded rather than copied)
    let f3 = MergeOptions {
        format: Some(3),
        copy_packets: Some(false),
        ..Default::default()
    };
    assert!(merge_and_compare(&[a.clone(), b.clone()], &f3).encoded_ahead);
    // (the codewords the merging thread would write: only the packets' cache verifiers,
    // of no use to a domain encoded ahead, differ)
    let size = |encode_ahead| {
        let o = MergeOptions {
            encode_ahead,
            ..f3.clone()
        };
        std::fs::metadata(merged(&[a.clone(), b.clone()], &o).1)
            .unwrap()
            .len()
    };
    assert_eq!(size(Some(true)), size(Some(false)));
    assert!(!merge_and_compare(&fork(), &auto).encoded_ahead);
    let forced = MergeOptions {
        encode_ahead: Some(true),
        ..Default::default()
    };
    let thinned = [data("rates/fast.ctf"), data("rates/slow.ctf")];
    assert!(merged(&thinned, &forced).2.encoded_ahead);
    let domains_thinned = [data("v3/multidomain.ctf"), data("rates/slow.ctf")];
    let (_d, _, r) = merged(
        &domains_thinned,
        &MergeOptions {
            format: Some(2),
            ..forced.clone()
        },
    );
    assert!(r.inputs[0].keep_fraction < 1.0 && !r.encoded_ahead);
    let tagged = MergeOptions {
        tag_processes: true,
        ..Default::default()
    };
    assert!(merge_and_compare(&[a, b], &tagged).encoded_ahead);
    // Streams of 3,000 codes each: two have room in halves of the cache, ten not in
    // tenths (1,638 entries), where they would push each other's codes out.
    let wide: Vec<PathBuf> = (0..10u64)
        .map(|k| {
            let p = dir.path().join(format!("wide{k}.ctf"));
            write_repeating_wide(&p, 10 + k, 1_000_000 + 7 * k);
            p
        })
        .collect();
    assert!(merge_and_compare(&wide[..2], &auto).encoded_ahead);
    assert!(!merge_and_compare(&wide, &auto).encoded_ahead);
}

/// A thinned input of one stream is encoded ahead: its decoder draws what the merging
/// thread draws, in the same order, and leaves out of its share what thinning leaves out
/// (a backtrace after some left out keeps of the share's path only what all of them
/// kept). The merge holds the allocations, with their thinned samples, of the merge made
/// without encoding ahead, tagged or not (rates 1e-3 and, in format 3 of one domain, 1e-4
/// thinned to 1e-5).
#[test]
fn thinned_inputs_encoded_ahead_keep_the_same_allocations() {
    let both = [
        data("rates/fast.ctf"),
        data("v3/single.ctf"),
        data("rates/slow.ctf"),
    ];
    for tag_processes in [false, true] {
        let run = |ahead| {
            merged(
                &both,
                &MergeOptions {
                    seed: 99,
                    format: Some(2),
                    tag_processes,
                    encode_ahead: Some(ahead),
                    ..Default::default()
                },
            )
        };
        let (_d1, ahead_out, ahead) = run(true);
        let (_d2, plain_out, plain) = run(false);
        assert!(ahead.encoded_ahead && !plain.encoded_ahead);
        assert_valid(&ahead_out);
        let thinned = CompareOptions {
            thinned: true,
            tagged: tag_processes,
            ..Default::default()
        };
        let c = compare(&both, &ahead_out, thinned).unwrap();
        assert!(c.equal() && c.dropped > 0, "{c:?}");
        let c = compare(&[plain_out], &ahead_out, CompareOptions::default()).unwrap();
        assert!(c.equal() && c.merged_allocs == plain.allocs, "{c:?}");
        for (a, p) in ahead.inputs.iter().zip(&plain.inputs) {
            assert_eq!(
                (a.allocs_written, a.samples_read, a.samples_written),
                (p.allocs_written, p.samples_read, p.samples_written)
            );
        }
        assert!(ahead.inputs[0].allocs_written < ahead.inputs[0].allocs / 10);
        assert!(ahead.inputs[1].allocs_written < ahead.inputs[1].allocs / 5);
    }
}

/// Tagged and encoded ahead, a process whose own frames use the very code its tag gets
/// (the merge's first fresh codes, from the top of the 63-bit range) keeps them apart:
/// in its share the tag is a value no input code can take, so a frame of that code is
/// never read back as the tag (nor the tag as the frame).
#[test]
fn a_tagged_process_whose_frames_use_its_tag_code_keeps_both() {
    let dir = tempfile::tempdir().unwrap();
    let top = (1u64 << 62) - 1;
    let mut inputs = Vec::new();
    for k in 0..2u64 {
        let p = dir.path().join(format!("p{k}.ctf"));
        let mut w = lossless_writer(&p, 2, 10 + k, "clash.exe");
        // codes: the tags' (top, top - 1), then a few ordinary ones
        let codes: Vec<LocationCode> = [top, top - 1, 500, 501, 502, 503]
            .into_iter()
            .map(LocationCode)
            .collect();
        let resolve = |c: LocationCode| Some(locs("clash.ml", &format!("c{}", c.0 % 1000), 7));
        let mut t = 1_000_000 + k * 3;
        for i in 0..400usize {
            t += 10;
            // stacks repeating the previous one, now and then another rotation of the codes
            let r = i / 25 % codes.len();
            let bt: Vec<LocationCode> = (0..5).map(|d| codes[(r + d) % codes.len()]).collect();
            w.put_alloc(
                &AllocHeader {
                    time: Timestamp(t),
                    domain: DomainId(0),
                    length: 2,
                    nsamples: 1,
                    source: AllocSource::Minor,
                },
                &bt,
                resolve,
            )
            .unwrap();
        }
        w.finish().unwrap();
        inputs.push(p);
    }
    let tagged = MergeOptions {
        tag_processes: true,
        encode_ahead: Some(true),
        ..Default::default()
    };
    let r = merge_and_compare(&inputs, &tagged);
    assert!(r.encoded_ahead);
    assert!(r.remapped_codes >= 2, "{r:?}");
}

/// A process whose allocations come from a few deep stacks, each used many times running.
fn write_repeating(path: &Path, pid: u64, start: u64) {
    let stacks: Vec<Vec<u64>> = (0..8u64)
        .map(|s| (0..30).map(|d| (s * 31 + d * 7) % 200).collect())
        .collect();
    write_stacks(path, pid, start, &stacks, 3000);
}

/// [`write_repeating`] with 100 stacks of 30 codes of their own (3,000 in all), in 4,000
/// allocations.
fn write_repeating_wide(path: &Path, pid: u64, start: u64) {
    let stacks: Vec<Vec<u64>> = (0..100u64)
        .map(|s| (0..30).map(|d| s * 30 + d).collect())
        .collect();
    write_stacks(path, pid, start, &stacks, 4000);
}

/// `allocs` allocations from `stacks` (of codes 1000 and up, by their offsets), each
/// stack used 40 times running, in turn.
fn write_stacks(path: &Path, pid: u64, start: u64, stacks: &[Vec<u64>], allocs: u64) {
    let stacks: Vec<Vec<LocationCode>> = stacks
        .iter()
        .map(|s| s.iter().map(|&c| LocationCode(1000 + c)).collect())
        .collect();
    let table: HashMap<LocationCode, LocationList> = stacks
        .iter()
        .flatten()
        .map(|&c| {
            let i = c.0 - 1000;
            (c, locs("r.ml", &format!("g{i}"), i as u32 + 1))
        })
        .collect();
    let f = std::fs::File::create(path).unwrap();
    let mut w = Writer::new(
        f,
        &info(pid, start, 1e-4, "r.ml"),
        WriterOptions {
            version: 2,
            lossless: true,
        },
    )
    .unwrap();
    let mut t = start;
    for k in 0..allocs {
        t += 50;
        let lookup = |c: LocationCode| table.get(&c).cloned();
        let bt = &stacks[(k / 40) as usize % stacks.len()];
        w.put_alloc(
            &AllocHeader {
                time: Timestamp(t),
                domain: DomainId(0),
                length: 4,
                nsamples: 1,
                source: AllocSource::Minor,
            },
            bt,
            lookup,
        )
        .unwrap();
    }
    w.finish().unwrap();
}

/// Two traces of different executables (pids 1 and 2) using the same 10 codes for their
/// own locations (alpha.ml, beta.ml).
fn colliding_pair(dir: &Path) -> (PathBuf, PathBuf) {
    let a = dir.join("a.ctf");
    let b = dir.join("b.ctf");
    write_synthetic(&a, 1, 1_000_000, "alpha.ml", 0);
    write_synthetic(&b, 2, 1_000_010, "beta.ml", 0);
    (a, b)
}

/// A format-3 trace whose two domains give the same codes different locations (which the
/// reference reader, with one table per trace, refuses; read a domain at a time, each
/// domain is consistent): the merge keeps each domain's meanings for its own allocations,
/// and a domain that redefines a code the other remapped keeps its own meaning, rather
/// than take the other's.
#[test]
fn codes_a_domain_means_otherwise_stay_with_their_domain() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("domains.ctf");
    let mut w = lossless_writer(&src, 3, 7, "two.exe");
    let files = ["zero.ml", "one.ml"];
    let mut t = 1_000_000;
    for k in 0..600u64 {
        // domain 0 first, then the two in turns, then domain 0 again
        let d = match k {
            0..100 => 0,
            500.. => 0,
            _ => (k % 2) as u16,
        };
        t += 11;
        let bt: Vec<LocationCode> = (0..(1 + k % 5))
            .map(|i| LocationCode(100 + (k + i) % 10))
            .collect();
        let file = files[d as usize];
        let resolve = |c: LocationCode| Some(locs(file, &format!("f{}", c.0), c.0 as u32));
        w.put_alloc(
            &AllocHeader {
                time: Timestamp(t),
                domain: DomainId(d),
                length: 1 + k % 9,
                nsamples: 1,
                source: AllocSource::Minor,
            },
            &bt,
            resolve,
        )
        .unwrap();
    }
    w.finish().unwrap();
    assert_eq!(scan_domains(&src).unwrap(), vec![0, 1]);
    let (_d, out, r) = merged(std::slice::from_ref(&src), &MergeOptions::default());
    assert_eq!(r.remapped_codes, 10, "{r:?}");
    let mut rd = Reader::open(&out).unwrap();
    let mut seen = [0u64; 2];
    while let Some((ev, table)) = rd.next_with_locations().unwrap() {
        if let memtrace_merge::Event::Alloc(al) = ev {
            let d = al.domain.0 as usize;
            seen[d] += 1;
            for c in al.backtrace {
                assert_eq!(
                    &*table[c][0].filename,
                    files[d].as_bytes(),
                    "a domain {d} allocation at {}",
                    al.time.0
                );
            }
        }
    }
    assert_eq!(seen, [400, 200]);
    let lenient = CompareOptions {
        readable_part: true,
        ..Default::default()
    };
    let c = compare(std::slice::from_ref(&src), &out, lenient).unwrap();
    assert!(c.equal() && c.merged_allocs == 600, "{c:?}");
}

#[test]
fn colliding_codes_of_different_executables_are_kept_apart() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = colliding_pair(dir.path());
    let r = merge_and_compare(&[a.clone(), b.clone()], &MergeOptions::default());
    assert_eq!(
        r.remapped_codes, 10,
        "every code of the second executable means something else"
    );
    assert_eq!(r.inputs[0].remapped_codes, 0);
    assert_eq!(r.inputs[1].remapped_codes, 10);
    // the same in format 3, each input alone in its domain (encoded ahead there, the codes
    // sent whole written over with their merged codes)
    let f3 = MergeOptions {
        format: Some(3),
        ..Default::default()
    };
    assert_eq!(
        merge_and_compare(&[a.clone(), b.clone()], &f3).remapped_codes,
        10
    );
    // and never one input's frames on the other's allocations
    let (_d, out, _) = merged(
        &[a, b],
        &MergeOptions {
            tag_processes: true,
            ..Default::default()
        },
    );
    let mut rd = Reader::open(&out).unwrap();
    while let Some((ev, table)) = rd.next_with_locations().unwrap() {
        if let memtrace_merge::Event::Alloc(al) = ev {
            let root = String::from_utf8_lossy(&table[&al.backtrace[0]][0].defname).into_owned();
            let want: &[u8] = if root.starts_with("pid 1 ") {
                b"alpha.ml"
            } else {
                b"beta.ml"
            };
            for c in &al.backtrace[1..] {
                assert_eq!(&*table[c][0].filename, want);
            }
        }
    }
}

#[test]
fn deep_backtraces_are_never_truncated() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("deep.ctf");
    let b = dir.path().join("other.ctf");
    write_synthetic(&a, 1, 1_000_000, "deep.ml", 6000);
    write_synthetic(&b, 2, 1_000_005, "other.ml", 0);
    // the source holds the 6000-frame stacks whole (written losslessly)...
    let mut r = Reader::open(&a).unwrap();
    let mut max = 0;
    while let Some(ev) = r.next_event().unwrap() {
        if let memtrace_merge::Event::Alloc(al) = ev {
            max = max.max(al.backtrace.len());
        }
    }
    assert!(max > 6000);
    // ...and so does the merge
    merge_and_compare(&[a, b], &MergeOptions::default());
}

/// A stack of more distinct frames than a share of the cache holds (16 inputs: 1,023
/// entries each) cannot be encoded whole in its share: the merge is made again without
/// encoding ahead, and no backtrace is cut.
#[test]
fn stacks_too_deep_for_a_share_are_not_cut() {
    let dir = tempfile::tempdir().unwrap();
    let deep = dir.path().join("deep.ctf");
    let mut w = lossless_writer(&deep, 2, 1, "deep.ml");
    let mut t = 1_000_000;
    for step in 1..=18u64 {
        // a stack growing 200 frames at a time, every frame its own code
        let bt: Vec<LocationCode> = (0..200 * step).map(|i| LocationCode(10_000 + i)).collect();
        for _ in 0..3 {
            t += 97;
            let l = |c: LocationCode| Some(locs("deep.ml", "r", c.0 as u32));
            w.put_alloc(
                &AllocHeader {
                    time: Timestamp(t),
                    domain: DomainId(0),
                    length: 4,
                    nsamples: 1,
                    source: AllocSource::Minor,
                },
                &bt,
                l,
            )
            .unwrap();
        }
    }
    w.finish().unwrap();
    let mut inputs = vec![deep];
    for k in 0..15 {
        let p = dir.path().join(format!("small-{k}.ctf"));
        write_synthetic(&p, 2 + k, 1_000_003 + k, &format!("small{k}.ml"), 0);
        inputs.push(p);
    }
    let ahead = MergeOptions {
        encode_ahead: Some(true),
        ..MergeOptions::default()
    };
    let r = merge_and_compare_as(&inputs, &ahead);
    assert!(!r.encoded_ahead);
    assert!(r
        .inputs
        .iter()
        .all(|i| i.cut_backtraces == 0 && i.warnings.is_empty()));
}

/// Allocations of no samples (the format allows them, though memtrace never writes one)
/// are kept as any other, whichever way the merge goes; alone, the input is copied.
#[test]
fn allocations_of_no_samples_are_kept() {
    let dir = tempfile::tempdir().unwrap();
    let z = dir.path().join("zero.ctf");
    let b = dir.path().join("other.ctf");
    write_synthetic(&b, 2, 1_000_005, "other.ml", 0);
    let mut w = lossless_writer(&z, 2, 1, "zero.ml");
    let mut t = 1_000_000;
    for k in 0..300u64 {
        t += 41;
        let bt: Vec<LocationCode> = (0..3 + k % 4).map(|i| LocationCode(7 + i)).collect();
        let l = |c: LocationCode| Some(locs("zero.ml", "g", c.0 as u32));
        let id = w
            .put_alloc(
                &AllocHeader {
                    time: Timestamp(t),
                    domain: DomainId(0),
                    length: 8,
                    nsamples: k % 2,
                    source: AllocSource::Minor,
                },
                &bt,
                l,
            )
            .unwrap();
        if k % 5 == 0 {
            w.put_promote(Timestamp(t + 1), DomainId(0), id).unwrap();
            w.put_collect(Timestamp(t + 2), DomainId(0), id).unwrap();
            t += 2;
        }
    }
    w.finish().unwrap();
    let inputs = [z.clone(), b];
    merge_and_compare(&inputs, &MergeOptions::default());
    let tagged = MergeOptions {
        tag_processes: true,
        ..MergeOptions::default()
    };
    merge_and_compare(&inputs, &tagged);
    let (_d, out, _) = merged(std::slice::from_ref(&z), &MergeOptions::default());
    assert!(std::fs::read(&out).unwrap() == std::fs::read(&z).unwrap());
    // thinned to a slower input's rate, it keeps them too, as the comparison expects
    let (_d, _, c) = thinned_by_slow(&z);
    assert!(c.equal() && c.dropped > 0, "{c:?}");
}

/// `input` merged with `rates/slow.ctf` (so thinned to a tenth or less), and the merged
/// trace compared with both allowing for thinning.
fn thinned_by_slow(input: &Path) -> (tempfile::TempDir, PathBuf, CompareReport) {
    let inputs = [input.to_path_buf(), data("rates/slow.ctf")];
    let (dir, out, _) = merged(&inputs, &MergeOptions::default());
    let opts = CompareOptions {
        thinned: true,
        tagged: false,
        ..Default::default()
    };
    let c = compare(&inputs, &out, opts).unwrap();
    (dir, out, c)
}

/// The (length, sample count) of `path`'s allocations of at least `min_length` words, in
/// order.
fn long_allocs(path: &Path, min_length: u64) -> Vec<(u64, u64)> {
    let mut r = Reader::open(path).unwrap();
    let mut got = Vec::new();
    while let Some(e) = r.next_event().unwrap() {
        if let Event::Alloc(a) = e {
            if a.length >= min_length {
                got.push((a.length, a.nsamples));
            }
        }
    }
    got
}

#[test]
fn lengths_and_sample_counts_too_wide_for_a_batch_event_are_kept() {
    // (a merge's batches hold lengths that do not fit 32 bits, and counts that do not fit
    // 16, apart from the events, in order: the length, then the count)
    let dir = tempfile::tempdir().unwrap();
    let big = dir.path().join("big.ctf");
    let b = dir.path().join("other.ctf");
    write_synthetic(&b, 2, 1_000_005, "other.ml", 0);
    let mut w = lossless_writer(&big, 2, 1, "big.ml");
    let counts = [
        u16::MAX as u64 - 1,
        u16::MAX as u64,
        u16::MAX as u64 + 1,
        u32::MAX as u64 - 1,
        u32::MAX as u64,
        u32::MAX as u64 + 1,
        1 << 40,
        (1 << 62) - 1,
    ];
    let lengths = [
        1 << 20,
        u32::MAX as u64 - 1,
        u32::MAX as u64,
        u32::MAX as u64 + 1,
        1 << 50,
    ];
    let mut t = 1_000_000;
    let mut want = Vec::new();
    for k in 0..3000u64 {
        t += 29;
        let n = if k % 7 == 3 {
            counts[(k / 7) as usize % counts.len()]
        } else {
            1 + k % 3
        };
        let length = lengths[(k / 3) as usize % lengths.len()];
        want.push((length, n));
        let bt: Vec<LocationCode> = (0..2 + k % 5).map(|i| LocationCode(7 + i)).collect();
        let l = |c: LocationCode| Some(locs("big.ml", "g", c.0 as u32));
        w.put_alloc(
            &AllocHeader {
                time: Timestamp(t),
                domain: DomainId(0),
                length,
                nsamples: n,
                source: AllocSource::Major,
            },
            &bt,
            l,
        )
        .unwrap();
    }
    w.finish().unwrap();
    let inputs = [big, b];
    merge_and_compare(&inputs, &MergeOptions::default());
    let (_d, out, _) = merged(&inputs, &MergeOptions::default());
    assert_eq!(long_allocs(&out, 1 << 20), want);
    // thinned to a slower input's rate (a tenth), the counts past 32 bits stay within
    // what was read, and the comparison (largest to largest) holds
    let (_d, out, c) = thinned_by_slow(&inputs[0]);
    assert!(c.equal(), "{c:?}");
    let got = long_allocs(&out, 1 << 20);
    let big = got.iter().filter(|&&(_, n)| n > u32::MAX as u64).count();
    // (of each 2^40 and 2^62 - 1 count, about a tenth is left: still past 32 bits)
    assert!(big > 100, "{big} thinned counts past 32 bits");
    // (and every length is one of those written, in the order written)
    let mut written = want.iter().map(|&(l, _)| l);
    assert!(got.iter().all(|&(l, _)| written.any(|w| w == l)));
}

#[test]
fn single_input_is_copied_byte_for_byte() {
    for p in [
        "bytecode.ctf",
        "external.ctf",
        "long.ctf",
        "rates/fast.ctf",
        "rates/slow.ctf",
        "fork/parent.ctf",
        "fork/child-1.ctf",
        "fork/child-2.ctf",
        "fork/child-3.ctf",
        "fork/child-4.ctf",
        "v3/single.ctf",
        "v3/ocamlopt-head.ctf",
        "v3/bytecode-location-overflow.ctf",
    ] {
        let (_d, out, _) = merged(&[data(p)], &MergeOptions::default());
        assert!(
            std::fs::read(&out).unwrap() == std::fs::read(data(p)).unwrap(),
            "{p}: merge of one input is not a copy"
        );
    }
    // a trace of its info packet alone (its process killed before the first packet)
    let dir = tempfile::tempdir().unwrap();
    let whole = std::fs::read(data("fork/child-2.ctf")).unwrap();
    let info_bytes = u32::from_le_bytes(whole[4..8].try_into().unwrap()) as usize / 8;
    let bare = dir.path().join("bare.ctf");
    std::fs::write(&bare, &whole[..info_bytes]).unwrap();
    let (_d, out, _) = merged(std::slice::from_ref(&bare), &MergeOptions::default());
    assert!(
        std::fs::read(&out).unwrap() == whole[..info_bytes],
        "info packet alone"
    );
    // damaged ones give the reference copy tool's readable part
    for p in [
        "truncated",
        "synthetic/wrong-pid",
        "synthetic/duplicate-packet",
    ] {
        let (_d, out, _) = merged(&[data(&format!("{p}.ctf"))], &MergeOptions::default());
        let want = std::fs::read_to_string(data(&format!("{p}.copy.sha256"))).unwrap();
        let got = sha256(&std::fs::read(&out).unwrap());
        assert_eq!(got, want.split_whitespace().next().unwrap(), "{p}");
    }
}

fn sha256(b: &[u8]) -> String {
    use sha2::Digest as _;
    let d = sha2::Sha256::digest(b);
    d.iter().map(|x| format!("{x:02x}")).collect()
}

#[test]
fn rates_are_thinned_to_the_slowest() {
    let (fast, slow) = (data("rates/fast.ctf"), data("rates/slow.ctf"));
    let opts = MergeOptions {
        seed: 1234,
        ..Default::default()
    };
    let (_d, out, report) = merged(&[fast.clone(), slow.clone()], &opts);
    assert_valid(&out);
    let (fast_list, _) = allocations(&mut Reader::open(&fast).unwrap(), None).unwrap();
    let (slow_list, _) = allocations(&mut Reader::open(&slow).unwrap(), None).unwrap();
    let (merged_list, orphans) = allocations(&mut Reader::open(&out).unwrap(), None).unwrap();
    assert_eq!(orphans, 0);
    assert_eq!(Reader::open(&out).unwrap().info().sample_rate, 1e-5);
    // the comparison allows for thinning when told, and only then
    let both = [fast.clone(), slow.clone()];
    let thinned = CompareOptions {
        thinned: true,
        tagged: false,
        ..Default::default()
    };
    let c = compare(&both, &out, thinned).unwrap();
    assert!(c.equal() && c.dropped > 0 && c.dropped + c.merged_allocs == c.source_allocs);
    let c = compare(&both, &out, CompareOptions::default()).unwrap();
    assert!(!c.equal() && c.missing > 0, "{c:?}");
    let mut slow_left: HashMap<(Digest, u64), i64> = HashMap::new();
    for x in &slow_list {
        *slow_left.entry(*x).or_insert(0) += 1;
    }
    let mut fast_by_key: HashMap<Digest, Vec<u64>> = HashMap::new();
    for (d, n) in &fast_list {
        fast_by_key.entry(*d).or_default().push(*n);
    }
    let mut kept_fast_samples = 0u64;
    for (d, n) in &merged_list {
        if let Some(c) = slow_left.get_mut(&(*d, *n)).filter(|c| **c > 0) {
            *c -= 1;
            continue;
        }
        let cands = fast_by_key
            .get_mut(d)
            .unwrap_or_else(|| panic!("merged allocation with no source"));
        let i = cands
            .iter()
            .position(|&orig| orig >= *n)
            .expect("thinned nsamples exceeds the source's");
        cands.swap_remove(i);
        assert!(*n >= 1);
        kept_fast_samples += n;
    }
    assert!(
        slow_left.values().all(|&c| c == 0),
        "slow allocations must all be kept exactly"
    );
    let total: u64 = fast_list.iter().map(|(_, n)| n).sum();
    let p = 1e-5 / 1e-3;
    let mean = total as f64 * p;
    let sd = (total as f64 * p * (1.0 - p)).sqrt();
    assert!(
        (kept_fast_samples as f64 - mean).abs() <= 5.0 * sd,
        "kept {kept_fast_samples}, expected {mean} ± {sd}"
    );
    let fi = &report.inputs[0];
    assert!(fi.keep_fraction < 0.05 && fi.warnings.iter().any(|w| w.contains("thinned")));
    assert_eq!(report.inputs[1].keep_fraction, 1.0);
    // deterministic for a seed, different for another
    let (_d2, out2, _) = merged(&[fast.clone(), slow.clone()], &opts);
    assert_eq!(std::fs::read(&out).unwrap(), std::fs::read(&out2).unwrap());
    let (_d3, out3, _) = merged(
        &[fast.clone(), slow.clone()],
        &MergeOptions {
            seed: 99,
            ..Default::default()
        },
    );
    assert_ne!(std::fs::read(&out).unwrap(), std::fs::read(&out3).unwrap());
    // and refused on request
    let dir = tempfile::tempdir().unwrap();
    let e = merge(
        &[fast, slow],
        &dir.path().join("x.ctf"),
        &MergeOptions {
            rate_mismatch: RateMismatch::Fail,
            ..Default::default()
        },
    )
    .unwrap_err();
    assert!(e.to_string().contains("rates differ"), "{e}");
    assert!(!dir.path().join("x.ctf").exists());
}

/// A merged trace info too long for a packet (the first input's long names, and the
/// context describing the merge) is the inputs' error; with a context given, the caller's.
#[test]
fn a_trace_info_too_long_for_a_packet_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let exe = format!("/{}", "x".repeat(31_000));
    let inputs: Vec<PathBuf> = (0..2)
        .map(|k| {
            let p = dir.path().join(format!("long-{k}.ctf"));
            lossless_writer(&p, 2, 1 + k, &exe).finish().unwrap();
            p
        })
        .collect();
    let out = dir.path().join("out.ctf");
    let e = merge(&inputs, &out, &MergeOptions::default()).unwrap_err();
    assert!(
        matches!(&e, memtrace_merge::Error::Incompatible(m) if m.contains("long-0.ctf") && m.contains("at most 32768")),
        "{e:?}"
    );
    let given = MergeOptions {
        context: Some(vec![b'c'; 2000]),
        ..MergeOptions::default()
    };
    let e = merge(&inputs, &out, &given).unwrap_err();
    assert!(matches!(e, memtrace_merge::Error::Usage(_)), "{e:?}");
    assert!(!out.exists());
}

#[test]
fn trace_info_of_a_merge() {
    let inputs = fork();
    let (_d, out, _) = merged(&inputs, &MergeOptions::default());
    let i = Reader::open(&out).unwrap().info().clone();
    let starts: Vec<u64> = inputs
        .iter()
        .map(|p| Reader::open(p).unwrap().info().start_time.0)
        .collect();
    assert_eq!(i.start_time.0, *starts.iter().min().unwrap());
    assert_eq!(i.pid, 14495);
    let ctx = String::from_utf8(i.context.unwrap()).unwrap();
    assert!(
        ctx.contains("5 traces") && ctx.contains("pid 14499"),
        "{ctx}"
    );
    let (_d, out, _) = merged(
        &inputs,
        &MergeOptions {
            pid: Some(77),
            context: Some(b"mine".to_vec()),
            ..Default::default()
        },
    );
    let i = Reader::open(&out).unwrap().info().clone();
    assert_eq!((i.pid, i.context.as_deref()), (77, Some(&b"mine"[..])));
    assert_valid(&out);
}

/// An output named as long as a file name can be (255 bytes) is written: its temporary
/// file's name takes only the start of it.
#[test]
fn outputs_of_the_longest_names_are_written() {
    let dir = tempfile::tempdir().unwrap();
    for name in ["a".repeat(251), "é".repeat(125) + "a"] {
        let out = dir.path().join(name + ".ctf");
        let r = merge(
            &[data("fork/child-2.ctf"), data("fork/child-4.ctf")],
            &out,
            &MergeOptions::default(),
        );
        assert!(r.is_ok(), "{:?}", r.err());
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(names.len(), 1, "a temporary file left");
        std::fs::remove_file(&out).unwrap();
    }
}

#[test]
fn output_safety() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.ctf");
    std::fs::copy(data("fork/child-2.ctf"), &input).unwrap();
    let before = std::fs::read(&input).unwrap();
    // the output may not be an input, however spelled
    let link = dir.path().join("link.ctf");
    std::os::unix::fs::symlink(&input, &link).unwrap();
    let dotted = dir.path().join(".").join("in.ctf");
    for out in [&input, &link, &dotted] {
        let e = merge(
            &[input.clone(), data("fork/child-4.ctf")],
            out,
            &MergeOptions::default(),
        )
        .unwrap_err();
        assert!(e.to_string().contains("one of the inputs"), "{e}");
    }
    let e = merge(
        std::slice::from_ref(&link),
        &input,
        &MergeOptions::default(),
    )
    .unwrap_err();
    assert!(e.to_string().contains("one of the inputs"), "{e}");
    assert_eq!(std::fs::read(&input).unwrap(), before);
    // a bad input: error naming it, no output, no temporary left behind
    let out = dir.path().join("out.ctf");
    let bad = data("README.md");
    let e = merge(
        &[input.clone(), bad.clone()],
        &out,
        &MergeOptions::default(),
    )
    .unwrap_err();
    assert!(e.to_string().contains("README.md"), "{e}");
    assert!(!out.exists());
    let leftovers: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(leftovers.len(), 2, "{leftovers:?}");
    // unless asked to skip it
    let r = merge(
        &[input.clone(), bad],
        &out,
        &MergeOptions {
            skip_bad_inputs: true,
            ..Default::default()
        },
    )
    .unwrap();
    assert!(r.inputs[1].skipped && !r.inputs[0].skipped);
    assert_eq!(r.allocs, 17_914);
    // an existing output is replaced whole
    std::fs::write(&out, b"old").unwrap();
    merge(std::slice::from_ref(&input), &out, &MergeOptions::default()).unwrap();
    assert_eq!(std::fs::read(&out).unwrap(), before);
    // unwritable directory (one input, and two: decoding has started by then, and stops)
    for inputs in [vec![input.clone()], vec![input, data("fork/child-4.ctf")]] {
        let e = merge(
            &inputs,
            Path::new("/proc/no-such-dir/out.ctf"),
            &MergeOptions::default(),
        )
        .unwrap_err();
        // (named as given, not as the temporary file it could not make there)
        assert!(
            e.to_string()
                .starts_with("/proc/no-such-dir/out.ctf: create output: "),
            "{e}"
        );
    }
    // no inputs, empty paths
    assert!(merge(&[], &out, &MergeOptions::default()).is_err());
    assert!(merge(&[PathBuf::new()], &out, &MergeOptions::default()).is_err());
}

#[test]
fn cli_merge_writes_the_same_as_the_library() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("cli.ctf");
    // (flushed to disk before the rename: the same bytes)
    let st = Command::new(bin())
        .args(["merge", "-q", "--fsync", "-o"])
        .arg(&a)
        .args(fork())
        .status()
        .unwrap();
    assert!(st.success());
    let (_d, b, _) = merged(
        &fork(),
        &MergeOptions {
            progress: false,
            ..Default::default()
        },
    );
    assert_eq!(std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
    let out = Command::new(bin())
        .arg("compare")
        .arg(&a)
        .args(fork())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    // compare notices a missing input
    let out = Command::new(bin())
        .arg("compare")
        .arg(&a)
        .arg(data("fork/parent.ctf"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
}

#[test]
fn format_3_output_gives_every_input_domain_its_own_id() {
    let mut inputs = fork();
    inputs.push(data("v3/multidomain.ctf"));
    let (_d, out, _) = merged(
        &inputs,
        &MergeOptions {
            format: Some(3),
            ..Default::default()
        },
    );
    let mut r = Reader::open(&out).unwrap();
    let mut per_domain: HashMap<u16, (u64, Vec<u64>)> = HashMap::new();
    while let Some(ev) = r.next_event().unwrap() {
        if let memtrace_merge::Event::Alloc(a) = ev {
            let e = per_domain.entry(a.domain.0).or_default();
            e.0 += 1;
            e.1.push(a.time.0);
        }
    }
    // five format-2 inputs (one stream each) and the three domains of multidomain.ctf
    assert_eq!(
        per_domain.len(),
        8,
        "{:?}",
        per_domain.keys().collect::<Vec<_>>()
    );
    let mut counts: Vec<u64> = per_domain.values().map(|v| v.0).collect();
    counts.sort_unstable();
    let mut want = vec![88_445, 8_336, 17_914, 100_716, 16_499, 5_557, 5_638, 5_304];
    want.sort_unstable();
    assert_eq!(counts, want);
    for (_, times) in per_domain.values() {
        assert!(
            times.windows(2).all(|w| w[0] <= w[1]),
            "each domain in time order"
        );
    }
}

#[test]
fn inputs_of_different_word_sizes_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a.ctf");
    write_synthetic(&a, 1, 1_000_000, "alpha.ml", 0);
    let mut i32b = info(2, 1_000_000, 1e-4, "beta.ml");
    i32b.word_size = 32;
    let b = dir.path().join("b32.ctf");
    let w = Writer::new(
        std::fs::File::create(&b).unwrap(),
        &i32b,
        WriterOptions {
            version: 2,
            lossless: true,
        },
    )
    .unwrap();
    w.finish().unwrap();
    let out = dir.path().join("out.ctf");
    let e = merge(&[a, b], &out, &MergeOptions::default()).unwrap_err();
    assert!(e.to_string().contains("word size 32"), "{e}");
    assert!(!out.exists());
}

/// An object allocated by one domain and collected by another in the same microsecond,
/// the allocation behind another event of its own domain in that microsecond (which meets
/// the other domain's collection first): the collection waits for it.
#[test]
fn same_microsecond_collect_waits_for_an_allocation_behind_another_event() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("tie.ctf");
    let mut w = lossless_writer(&p, 3, 2, "tie.ml");
    let bt = [LocationCode(100)];
    let l = |_| Some(locs("tie.ml", "f", 1));
    let (d0, d1) = (DomainId(0), DomainId(1));
    let t = Timestamp(1_000_500);
    let minor = AllocSource::Minor;
    let early = w
        .put_alloc(
            &AllocHeader {
                time: Timestamp(1_000_100),
                domain: d1,
                length: 2,
                nsamples: 1,
                source: minor,
            },
            &bt,
            l,
        )
        .unwrap();
    w.put_collect(t, d1, early).unwrap();
    let late = w
        .put_alloc(
            &AllocHeader {
                time: t,
                domain: d1,
                length: 3,
                nsamples: 1,
                source: minor,
            },
            &bt,
            l,
        )
        .unwrap();
    w.put_collect(t, d0, late).unwrap();
    w.finish().unwrap();
    for format in [2, 3] {
        let opts = MergeOptions {
            format: Some(format),
            ..Default::default()
        };
        let r = merge_and_compare_as(std::slice::from_ref(&p), &opts);
        assert_eq!(
            (r.allocs, r.collects),
            (2, 2),
            "format {format}: {:?}",
            r.inputs[0].warnings
        );
        assert!(r.inputs[0].warnings.is_empty());
    }
}

/// A format-3 trace whose domains overlap in time (file order is not time order), copied
/// to format 2, has its events put in time order, as a merge does.
#[test]
fn copying_overlapping_domains_to_format_2_orders_them_in_time() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("overlap.ctf");
    let mut w = lossless_writer(&p, 3, 3, "overlap.ml");
    w.set_flush_on_domain_switch(false);
    let l = |c: LocationCode| Some(locs("overlap.ml", "f", c.0 as u32));
    for k in 0..400u64 {
        let d = DomainId((k % 2) as u16);
        let bt = [LocationCode(100 + k % 3), LocationCode(200 + k % 5)];
        let t = Timestamp(1_000_000 + 10 * k);
        let id = w
            .put_alloc(
                &AllocHeader {
                    time: t,
                    domain: d,
                    length: 2,
                    nsamples: 1,
                    source: AllocSource::Minor,
                },
                &bt,
                l,
            )
            .unwrap();
        if k % 3 == 0 {
            w.put_collect(Timestamp(t.0 + 3), d, id).unwrap();
        }
    }
    w.finish().unwrap();
    let out = dir.path().join("v2.ctf");
    memtrace_merge::tools::copy::copy_file(&p, &out, Some(2)).unwrap();
    assert_eq!(Reader::open(&out).unwrap().info().version, 2);
    let c = compare(std::slice::from_ref(&p), &out, CompareOptions::default()).unwrap();
    assert!(c.equal() && c.merged_allocs == 400, "{c:?}");
    assert_valid(&out);
}

/// An object allocated by one domain and collected by another in the same microsecond,
/// the collecting domain's packet first in the file: the merge must still put the
/// allocation first (and keep the collection).
#[test]
fn same_microsecond_collect_by_another_domain_follows_its_allocation() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("v3.ctf");
    let mut w = lossless_writer(&p, 3, 2, "gamma.ml");
    w.set_flush_on_domain_switch(false);
    let bt = [LocationCode(100)];
    let l = |_| Some(locs("gamma.ml", "f", 1));
    let t = Timestamp(1_000_010);
    w.put_alloc(
        &AllocHeader {
            time: Timestamp(1_000_005),
            domain: DomainId(0),
            length: 2,
            nsamples: 1,
            source: AllocSource::Minor,
        },
        &bt,
        l,
    )
    .unwrap();
    let id = w
        .put_alloc(
            &AllocHeader {
                time: t,
                domain: DomainId(1),
                length: 3,
                nsamples: 1,
                source: AllocSource::Minor,
            },
            &bt,
            l,
        )
        .unwrap();
    w.put_collect(t, DomainId(0), id).unwrap();
    w.finish().unwrap();
    for format in [2, 3] {
        let (_d, out, r) = merged(
            std::slice::from_ref(&p),
            &MergeOptions {
                format: Some(format),
                ..Default::default()
            },
        );
        assert_eq!(
            (r.allocs, r.collects),
            (2, 1),
            "format {format}: {:?}",
            r.inputs[0].warnings
        );
        // (compare reads the source in file order, where the collection comes first, unless
        // it reads it as the merge does, a domain at a time and in time order; and the
        // merged events directly)
        let whole = compare(std::slice::from_ref(&p), &out, CompareOptions::default()).unwrap();
        assert!(!whole.equal(), "{whole:?}");
        let as_merged = CompareOptions {
            readable_part: true,
            ..Default::default()
        };
        let c = compare(std::slice::from_ref(&p), &out, as_merged).unwrap();
        assert!(
            c.equal() && c.merged_allocs == 2 && c.sources_cut == 0,
            "{c:?}"
        );
        let mut rd = Reader::open(&out).unwrap();
        let mut evs = Vec::new();
        while let Some(ev) = rd.next_event().unwrap() {
            evs.push(ev.to_owned_event());
        }
        let ids: Vec<u64> = evs
            .iter()
            .filter_map(|e| match e {
                memtrace_merge::OwnedEvent::Alloc(a) if a.length == 3 => Some(a.id.0),
                memtrace_merge::OwnedEvent::Collect { id, .. } => Some(id.0),
                _ => None,
            })
            .collect();
        assert_eq!(ids.len(), 2, "{evs:?}");
        assert_eq!(
            ids[0], ids[1],
            "the collection names the allocation before it: {evs:?}"
        );
        assert!(matches!(
            evs.last(),
            Some(memtrace_merge::OwnedEvent::Collect { .. })
        ));
        assert_valid(&out);
    }
}

#[test]
fn cli_copy_never_overwrites_its_input() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a.ctf");
    std::fs::copy(data("rates/slow.ctf"), &a).unwrap();
    let before = std::fs::read(&a).unwrap();
    let link = dir.path().join("link.ctf");
    std::os::unix::fs::symlink(&a, &link).unwrap();
    for out in [&a, &link] {
        let o = Command::new(bin())
            .arg("copy")
            .arg(&a)
            .arg(out)
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(2));
        assert!(String::from_utf8_lossy(&o.stderr).contains("is the input"));
    }
    assert_eq!(std::fs::read(&a).unwrap(), before);
    let b = dir.path().join("b.ctf");
    assert!(Command::new(bin())
        .arg("copy")
        .arg(&a)
        .arg(&b)
        .status()
        .unwrap()
        .success());
    assert_eq!(
        std::fs::read(&b).unwrap(),
        before,
        "a copy in the same format is byte-identical"
    );
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names.len(), 3, "no temporary left: {names:?}");
}

/// Streams taking turns in shares of one output cache miss their codes again and again:
/// each code's locations are written once all the same (the reference writer writes them at
/// every miss, which made most of the bytes of such a merge), and the merge equals its
/// sources, encoded ahead or not.
#[test]
fn each_codes_locations_are_written_once() {
    const CODES: u64 = 3000;
    let table: HashMap<LocationCode, LocationList> = (0..CODES)
        .map(|i| {
            let l = locs("turns.ml", &format!("Turns.f{i}"), i as u32 + 1);
            (LocationCode(0x10_0000 + i), l)
        })
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let inputs: Vec<PathBuf> = (0..8u64)
        .map(|k| {
            let path = dir.path().join(format!("w{k}.ctf"));
            // (the processes start together; their events 10 µs apart, the k-th's k µs on)
            let start = 1_000_000 + k;
            let mut w = lossless_writer(&path, 2, 30_000 + k, "/usr/bin/turns");
            // 15 frames every backtrace shares, then 5 of the 3,000 codes, drawn anew
            let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ k;
            for i in 0..6000u64 {
                let bt: Vec<LocationCode> = (0..20u64)
                    .map(|j| {
                        if j < 15 {
                            return LocationCode(0x10_0000 + j);
                        }
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        LocationCode(0x10_0000 + x % CODES)
                    })
                    .collect();
                let header = AllocHeader {
                    time: Timestamp(start + 10 * i),
                    domain: DomainId(0),
                    length: 2,
                    nsamples: 1,
                    source: AllocSource::Minor,
                };
                let id = w
                    .put_alloc(&header, &bt, |c| table.get(&c).cloned())
                    .unwrap();
                w.put_collect(Timestamp(start + 10 * i + 5), DomainId(0), id)
                    .unwrap();
            }
            w.finish().unwrap();
            path
        })
        .collect();
    for ahead in [Some(true), Some(false)] {
        let opts = MergeOptions {
            encode_ahead: ahead,
            ..MergeOptions::default()
        };
        let (_dir, out, report) = merged(&inputs, &opts);
        assert_eq!(report.encoded_ahead, ahead == Some(true), "{ahead:?}");
        let mut r = Reader::open(&out).unwrap();
        while r.next_event().unwrap().is_some() {}
        let written = r.stats().location_events;
        assert!(
            written <= CODES,
            "{written} location events for {CODES} codes (encoded ahead: {ahead:?})"
        );
    }
    merge_and_compare(&inputs, &MergeOptions::default());
}
