use super::inputs::{describe_merge, Opened};
use super::*;
use crate::error::Error;
use crate::format::event::AllocHeader;
use crate::format::event::{AllocSource, LocationCode};
use crate::format::event::{DomainId, Timestamp};
use crate::format::info::TraceInfo;
use crate::format::location::Location;
use crate::writer::{Writer, WriterOptions};
use std::sync::Arc;
use std::time::Duration;

fn data(p: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(p)
}

/// The `fork/` traces of these names.
fn fork(names: &[&str]) -> Vec<PathBuf> {
    names
        .iter()
        .map(|n| data(&format!("fork/{n}.ctf")))
        .collect()
}

/// A trace of 4,000 allocations whose stacks repeat, in codes 1000.. that mean
/// something of `file`'s (two such traces of different files collide on every code).
fn write_repeating(path: &Path, pid: u64, file: &str) {
    let info = TraceInfo {
        executable_name: file.as_bytes().to_vec(),
        pid,
        start_time: Timestamp(1_000_000 + pid),
        ..crate::writer::tests::info(2)
    };
    let opts = WriterOptions {
        version: 2,
        lossless: true,
    };
    let mut w = Writer::new(std::fs::File::create(path).unwrap(), &info, opts).unwrap();
    let loc = |c: LocationCode| {
        Some(Arc::from(vec![Location {
            filename: Arc::from(file.as_bytes()),
            line: c.0 as u32,
            start_char: 0,
            end_char: 1,
            defname: Arc::from(format!("f{}", c.0).as_bytes()),
        }]))
    };
    let mut t = 1_000_000 + pid;
    for k in 0..4000u64 {
        t += 3 + k % 5;
        let s = k / (20 + pid) % 9;
        let bt: Vec<LocationCode> = (0..12 + s * 3)
            .map(|d| LocationCode(1000 + (s * 17 + d * 5) % 60))
            .collect();
        let id = w
            .put_alloc(
                &AllocHeader {
                    time: Timestamp(t),
                    domain: DomainId(0),
                    length: 2,
                    nsamples: 1,
                    source: AllocSource::Minor,
                },
                &bt,
                loc,
            )
            .unwrap();
        if k % 3 == 0 {
            w.put_collect(Timestamp(t), DomainId(0), id).unwrap();
        }
    }
    w.finish().unwrap();
}

/// A decoding thread pausing 300 us after every batch (the merging thread then fills
/// the batches it needs), and one holding each stream 300 us before it fills it (the
/// merging thread then finds the stream it needs being filled, and fills other
/// streams' batches ahead).
fn slow_decoding() -> [(&'static str, Hooks); 2] {
    let pause = Hooks {
        pause: Duration::from_micros(300),
        ..Hooks::default()
    };
    let hold = Hooks {
        hold: Duration::from_micros(300),
        ..Hooks::default()
    };
    [("pausing", pause), ("holding", hold)]
}

/// Whichever thread fills a batch of a stream encoded in a share (its decoding thread,
/// or the merging thread rather than wait, while the decoding thread pauses or holds
/// another stream), the bytes are those of a merge by three decoding threads: with
/// codes remapped, and with the domains of a format-3 input as streams of their own.
#[test]
fn encoding_ahead_on_either_thread_does_not_change_the_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let gen: Vec<PathBuf> = ["alpha.ml", "beta.ml", "alpha.ml"]
        .iter()
        .enumerate()
        .map(|(k, file)| {
            let p = dir.path().join(format!("{k}.ctf"));
            write_repeating(&p, k as u64 + 1, file);
            p
        })
        .collect();
    let fork = fork(&["parent", "child-1", "child-2", "child-3", "child-4"]);
    let mut with_v3 = fork.clone();
    with_v3.push(data("v3/multidomain.ctf"));
    let sets: [(Vec<PathBuf>, Option<u16>); 3] = [(gen, None), (fork, None), (with_v3, Some(2))];
    for (set, format) in sets {
        let run = |threads: usize, hooks: Hooks| {
            let out = dir.path().join("out.ctf");
            let opts = MergeOptions {
                decode_threads: Some(threads),
                encode_ahead: Some(true),
                format,
                progress: false,
                ..Default::default()
            };
            let r = merge_with(&set, &out, &opts, hooks).unwrap();
            assert!(r.encoded_ahead);
            (std::fs::read(&out).unwrap(), r.remapped_codes)
        };
        let (want, remapped) = run(3, Hooks::default());
        for (what, hooks) in slow_decoding() {
            // (until a merge in which the merging thread encoded 2 batches or more, which
            // covers that path: the 3 generated inputs have 3 batches each, so holding
            // leaves it only a few to fill ahead, and on a busy machine the decoding
            // thread may still fill nearly all)
            let mut most = 0;
            for _ in 0..10 {
                let before = crate::pipeline::decoder::FILLED_HERE.get();
                let (got, _) = run(1, hooks);
                let encoded = crate::pipeline::decoder::FILLED_HERE.get().encoded - before.encoded;
                assert!(
                    got == want,
                    "{what} ({} inputs, {remapped} codes remapped): other bytes",
                    set.len()
                );
                most = most.max(encoded);
                if most >= 2 {
                    break;
                }
            }
            assert!(
                most >= 2,
                "{what}: only {most} batches encoded by the merging thread ({} inputs)",
                set.len()
            );
        }
    }
}

/// The description of a long merge is cut short between two characters, whatever
/// characters the names hold.
#[test]
fn a_long_description_is_cut_between_characters() {
    for (k, ch) in ["é", "€", "𝄞", "x"].iter().enumerate() {
        let opened: Vec<Opened> = (0..40)
            .map(|i| Opened {
                index: i,
                path: PathBuf::from(format!("{}{}.ctf", "x".repeat(i + k), ch.repeat(120))),
                info: crate::writer::tests::info(2),
                domains: vec![0],
                alloc_ids: 0,
                source: PathBuf::new(),
            })
            .collect();
        let d = String::from_utf8(describe_merge(&opened)).unwrap();
        assert!(
            d.ends_with(" ...") && (3990..=4000).contains(&d.len()),
            "{}",
            d.len()
        );
    }
}

/// Each input's report names the argument it came from, also for a file in a
/// directory given before it (which the directory does not list: not `.ctf`).
#[test]
fn reports_name_the_argument_each_input_came_from() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().join("d");
    std::fs::create_dir(&d).unwrap();
    for n in ["child-1", "child-2"] {
        std::fs::copy(data(&format!("fork/{n}.ctf")), d.join(format!("{n}.ctf"))).unwrap();
    }
    let extra = d.join("parent.trace");
    std::fs::copy(data("fork/parent.ctf"), &extra).unwrap();
    let single = data("fork/child-4.ctf");
    let out = dir.path().join("out.ctf");
    let opts = MergeOptions {
        progress: false,
        ..Default::default()
    };
    let r = merge(&[d.clone(), extra.clone(), single.clone()], &out, &opts).unwrap();
    let got: Vec<(PathBuf, usize)> = r.inputs.iter().map(|i| (i.path.clone(), i.arg)).collect();
    let want = vec![
        (d.join("child-1.ctf"), 0),
        (d.join("child-2.ctf"), 0),
        (extra, 1),
        (single, 2),
    ];
    assert_eq!(got, want);
}

/// A decoding thread that panics fails the merge with its message, and leaves no
/// output: with the streams encoded ahead (the stream it was filling, and its encoder,
/// left behind a poisoned lock) or not.
#[test]
fn a_decoding_thread_that_panics_fails_the_merge_with_its_message() {
    let dir = tempfile::tempdir().unwrap();
    let set = fork(&["parent", "child-3", "child-4"]);
    for ahead in [true, false] {
        for threads in [1, 2] {
            let out = dir.path().join("out.ctf");
            let opts = MergeOptions {
                decode_threads: Some(threads),
                encode_ahead: Some(ahead),
                progress: false,
                ..Default::default()
            };
            let hooks = Hooks {
                panic_at: Some(2),
                ..Hooks::default()
            };
            let e = merge_with(&set, &out, &opts, hooks).err();
            assert!(
                matches!(&e, Some(Error::Internal(m))
                    if m.contains("a decoding thread panicked: injected panic before batch ")),
                "ahead {ahead}, {threads} threads: {e:?}"
            );
            assert!(!out.exists());
        }
    }
}

/// When the decoding thread is slow (here it pauses after every batch), the merging
/// thread fills the batches it would wait for itself, from the same readers (and, for
/// streams encoded ahead, with the same encoders); when the stream it needs is being
/// filled (here held a while before each batch), it fills other streams' batches
/// ahead. The bytes are those of a merge by three decoding threads (where the merging
/// thread seldom waits).
#[test]
fn batches_the_merging_thread_fills_itself_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut set = fork(&["parent", "child-1", "child-2", "child-3", "child-4"]);
    set.push(data("v3/multidomain.ctf"));
    // (format 3 keeps each input in a domain of its own: no shares to encode ahead in)
    let (mut ahead_all, mut ahead_other_all) = (0, 0);
    for (format, ahead) in [(2, false), (3, false), (2, true)] {
        let run = |threads: usize, hooks: Hooks| {
            let out = dir.path().join("out.ctf");
            let opts = MergeOptions {
                decode_threads: Some(threads),
                format: Some(format),
                encode_ahead: Some(ahead),
                progress: false,
                // (re-encoded: a copied input has no streams to fill)
                copy_packets: Some(false),
                ..Default::default()
            };
            let r = merge_with(&set, &out, &opts, hooks).unwrap();
            assert_eq!(r.encoded_ahead, ahead);
            std::fs::read(&out).unwrap()
        };
        let want = run(3, Hooks::default());
        for (what, hooks) in slow_decoding() {
            // (until a merge in which the merging thread did the most of the work, 20
            // batches or more: on a busy machine the decoding thread may still do it)
            let mut shortfall = String::new();
            for _ in 0..5 {
                let before = crate::pipeline::decoder::FILLED_HERE.get();
                let got = run(1, hooks);
                let after = crate::pipeline::decoder::FILLED_HERE.get();
                assert!(
                    got == want,
                    "format {format}, ahead {ahead}, {what}: other bytes"
                );
                let (filled, filled_ahead, encoded, ahead_other) = (
                    after.needed - before.needed,
                    after.ahead - before.ahead,
                    after.encoded - before.encoded,
                    after.ahead_other - before.ahead_other,
                );
                ahead_all += filled_ahead;
                ahead_other_all += ahead_other;
                let (here, done) = if hooks.hold.is_zero() {
                    ("filled", filled)
                } else {
                    ("filled ahead", filled_ahead)
                };
                shortfall = if done < 20 {
                    format!(
                        "format {format}, {what}: only {done} batches {here} by the merging thread"
                    )
                } else if ahead && hooks.hold.is_zero() && encoded < 20 {
                    format!("only {encoded} batches encoded ahead here, of {filled} filled")
                } else {
                    String::new()
                };
                if shortfall.is_empty() {
                    break;
                }
            }
            assert!(shortfall.is_empty(), "{shortfall}");
        }
    }
    // Filling ahead, the merging thread keeps to one stream while it has room (its
    // tables stay in this core's caches): about 40% of its batches ahead are of
    // another stream than the one before, 80% when it takes the one with the fewest.
    assert!(
        ahead_all >= 100 && ahead_other_all * 5 <= ahead_all * 3,
        "{ahead_other_all} of {ahead_all} batches filled ahead of another stream than the last"
    );
}
