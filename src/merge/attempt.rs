//! One attempt at a merge, from the inputs found to the output named.

use super::core::{merge_streams, Merged, Progress};
use super::inputs::{
    describe_merge, merged_pids, merged_rate, open_as, process_tag, thinning_cost, Opened, Prepared,
};
use super::objects::{warn_input, InputState};
use super::streams::{ahead_pays, Backtrace, Stream, MAX_SHARES};
use super::{InputReport, MergeOptions, MergeReport, RateMismatch};
use crate::error::{Error, Result};
use crate::format::event::{DomainId, Timestamp};
use crate::format::location::IntMap;
use crate::merge::codes::Codes;
use crate::merge::live::LiveObjects;
use crate::pipeline::decoder::{order_key, Batch, Decoder, Hooks, StreamSpec, Warnings, TAG_FRAME};
use crate::pipeline::output::OutputFile;
use crate::pipeline::placement::Placement;
use crate::pipeline::share::ShareOf;
use crate::reader::{scan_packets_as, PacketScan};
use crate::thin::Thinner;
use crate::writer::{Writer, WriterOptions};
use std::io::{IsTerminal, Write};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// [`merge_with`], once: None when a backtrace did not fit its share of the cache.
pub(super) fn merge_attempt(
    prepared: &Prepared,
    output: &Path,
    opts: &MergeOptions,
    hooks: Hooks,
) -> Result<Option<MergeReport>> {
    let Prepared {
        paths,
        sources,
        args,
        repeats,
        ..
    } = prepared;
    // Read every input's info packet and find its domains. Each entry keeps the index of
    // its path, so that reports come out in the order the inputs were given.
    let mut opened: Vec<Opened> = Vec::new();
    let mut skipped: Vec<(usize, InputReport)> = Vec::new();
    let mut first_bad = None;
    for (k, p) in paths.iter().enumerate() {
        let src = &sources[k];
        let res = open_as(src, p).and_then(|r| {
            let info = r.info().clone();
            let scan = if info.version >= 3 {
                scan_packets_as(src, p, true)?
            } else {
                PacketScan {
                    domains: vec![0],
                    alloc_ids: u64::MAX,
                }
            };
            Ok((info, scan))
        });
        match res {
            Ok((info, scan)) => opened.push(Opened {
                index: k,
                path: p.clone(),
                source: src.clone(),
                info,
                domains: scan.domains,
                alloc_ids: scan.alloc_ids,
            }),
            Err(e) if opts.skip_bad_inputs => {
                skipped.push((
                    k,
                    InputReport {
                        path: p.clone(),
                        arg: args[k],
                        skipped: true,
                        keep_fraction: 0.0,
                        warnings: vec![format!("skipped unreadable input: {e}")],
                        ..Default::default()
                    },
                ));
                first_bad.get_or_insert(e);
            }
            Err(e) => return Err(e),
        }
    }
    if opened.is_empty() {
        // (every input skipped: what was wrong with the first)
        return Err(first_bad.unwrap_or_else(|| Error::Usage("no input traces".into())));
    }
    let word = opened[0].info.word_size;
    if let Some(Opened {
        path: p, info: i, ..
    }) = opened.iter().find(|o| o.info.word_size != word)
    {
        return Err(Error::Incompatible(format!(
            "{}: word size {} differs from {}'s {}",
            p.display(),
            i.word_size,
            opened[0].path.display(),
            word
        )));
    }
    let min_rate = merged_rate(&mut opened)?;
    if opts.rate_mismatch == RateMismatch::Fail {
        if let Some(Opened {
            path: p, info: i, ..
        }) = (opened.iter()).find(|o| o.info.sample_rate != min_rate && o.alloc_ids > 0)
        {
            return Err(Error::Incompatible(format!(
                "sampling rates differ: {} has {}, the slowest input has {} (--rate-mismatch \
                 thin thins the faster ones to it)",
                p.display(),
                i.sample_rate,
                min_rate
            )));
        }
    }
    let single = opened.len() == 1;
    let format = opts.format.unwrap_or_else(|| {
        if opened.iter().all(|o| o.info.version <= 2) {
            2
        } else {
            3
        }
    });
    let first = &opened[0].info;
    let mut info = first.clone();
    info.start_time = Timestamp(
        opened
            .iter()
            .map(|o| o.info.start_time.0)
            .min()
            .unwrap_or(0),
    );
    info.sample_rate = min_rate;
    info.pid = opts.pid.unwrap_or(first.pid);
    info.version = format;
    info.context = match &opts.context {
        Some(c) => Some(c.iter().copied().filter(|&b| b != 0).collect()),
        None if single => first.context.clone(),
        None => Some(describe_merge(&opened)),
    };
    if format < 3 || !single {
        info.initial_domain = DomainId(0);
    }

    // Per-input state (thinning, live objects) and streams (an input, or a domain of one).
    let mut codes = Codes::default();
    let mut states = Vec::new();
    let mut streams = Vec::new();
    let mut specs = Vec::new();
    let mut bts: Vec<Backtrace> = Vec::new();
    let mut out_domains: Vec<DomainId> = Vec::new();
    let mut next_domain = 0u16;
    for (k, o) in opened.iter().enumerate() {
        let (p, i) = (&o.path, &o.info);
        let p_keep = if i.sample_rate > min_rate {
            min_rate / i.sample_rate
        } else {
            1.0
        };
        let mut st = InputState {
            report: InputReport {
                path: p.clone(),
                arg: args[o.index],
                pid: i.pid,
                format: i.version,
                sample_rate: i.sample_rate,
                keep_fraction: 1.0,
                ..Default::default()
            },
            live: LiveObjects::default(),
            thinner: None,
            tag: None,
            warnings: Warnings::default(),
            waiting: Vec::new(),
        };
        if p_keep < 1.0 {
            st.thinner = Some(Thinner::new(p_keep, opts.seed, k as u64));
        } else if i.sample_rate < min_rate {
            warn_input(
                &mut st,
                format!(
                    "sampled at rate {}, but it holds no allocations: the merge keeps the \
                     rate of the others ({min_rate})",
                    i.sample_rate
                ),
            );
        }
        if i.sample_rate == min_rate
            && opened.iter().position(|x| x.info.sample_rate == min_rate) == Some(k)
        {
            if let Some(m) = thinning_cost(&opened, min_rate) {
                warn_input(&mut st, m);
            }
        }
        // An earlier merge beside one of the traces it holds (a directory merged before,
        // its output kept under another name): that process's allocations would be twice.
        let held = merged_pids(i);
        for x in opened
            .iter()
            .filter(|x| x.index != o.index && held.contains(&x.info.pid))
        {
            warn_input(
                &mut st,
                format!(
                    "an earlier merge that holds pid {}, whose trace {} is merged too: if \
                     that is the same process, its allocations appear twice",
                    x.info.pid,
                    x.path.display()
                ),
            );
        }
        for (_, again) in repeats.iter().filter(|(at, _)| *at == o.index) {
            warn_input(&mut st, again.clone());
        }
        if opts.tag_processes {
            st.tag = Some(codes.fresh(Arc::from(vec![process_tag(p, i)])));
        }
        let size = std::fs::metadata(&o.source).map(|m| m.len()).unwrap_or(0);
        for &d in &o.domains {
            let out_domain = if format < 3 {
                DomainId(0)
            } else if single {
                DomainId(d)
            } else {
                next_domain = next_domain
                    .checked_add(1)
                    .ok_or_else(|| Error::Incompatible("more than 65535 domains".into()))?;
                DomainId(next_domain - 1)
            };
            let out_slot = match out_domains.iter().position(|&x| x == out_domain) {
                Some(i) => i,
                None => {
                    out_domains.push(out_domain);
                    out_domains.len() - 1
                }
            };
            specs.push(StreamSpec {
                input: k,
                path: o.source.clone(),
                name: p.clone(),
                domain: if i.version >= 3 { Some(d) } else { None },
                size,
                share: None,
                tagged: st.tag.is_some(),
                thinner: None,
                solo: false,
            });
            streams.push(Stream {
                input: k,
                out_domain,
                batch: Batch::default(),
                pos: 0,
                frame_pos: 0,
                loc_pos: 0,
                out_slot,
                enc_pos: 0,
                solo: false,
                miss_pos: 0,
                wide_pos: 0,
                key_bits: order_key(0, k, 0, streams.len()),
                remap: IntMap::default(),
            });
            bts.push(Backtrace {
                frames: st.tag.into_iter().collect(),
                hints: Vec::new(),
                version: 0,
            });
        }
        states.push(st);
    }
    // decoders on the cores the merging thread leaves (at least one)
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads = opts
        .decode_threads
        .unwrap_or_else(|| (cpus - 1).clamp(1, 4));
    // Streams that take turns in one output domain, encoded ahead when that pays: as they
    // are decoded, by whichever thread fills a batch (the merging thread fills one rather
    // than wait for it).
    let mut encoded_ahead = false;
    for slot in 0..out_domains.len() {
        let members: Vec<usize> = (0..streams.len())
            .filter(|&j| streams[j].out_slot == slot)
            .collect();
        // (a stream alone in its domain, format 3, is encoded ahead in the domain's whole
        // cache, after what it keeps of its previous backtrace, but never a lone input's,
        // which the merge copies as it is; a thinned input's draws are made again as its
        // stream is encoded, in the order the merging thread makes them: its one stream's)
        let possible = (1..=MAX_SHARES).contains(&members.len())
            && !single
            && members.iter().all(|&j| {
                let k = streams[j].input;
                states[k].thinner.is_none() || opened[k].domains.len() == 1
            });
        let ahead = possible
            && opts
                .encode_ahead
                .unwrap_or_else(|| ahead_pays(&specs, &members));
        if ahead {
            encoded_ahead = true;
            for (rank, &j) in members.iter().enumerate() {
                let of = ShareOf {
                    index: rank as u16,
                    count: members.len() as u16,
                };
                if members.len() == 1 {
                    specs[j].solo = true;
                    streams[j].solo = true;
                } else {
                    specs[j].share = Some(of);
                }
                // (its share encodes the tag as TAG_FRAME: sent whole, it is the input's tag)
                let st = &states[streams[j].input];
                if let Some(t) = st.tag {
                    streams[j].remap.insert(TAG_FRAME, t);
                }
                specs[j].thinner = st.thinner.clone();
            }
        }
    }

    // Decoding starts first: it reads the inputs while the output file is made (dropped on
    // an error below, the decoder stops its threads).
    let total_bytes: u64 = specs.iter().map(|s| s.size).sum();
    let started = Instant::now();
    // (the helper threads are kept off the CPU of this thread, the merging one)
    let placement = Placement::new();
    let pipe = Decoder::start(specs, opened.len(), threads, hooks, placement.clone())
        .map_err(|e| Error::Internal(format!("cannot start the decoding threads: {e}")))?;
    let (sink, file) = prepared.target.create()?;
    // The file is written on a thread of its own where a CPU is free for it (the merging
    // thread is the busiest), or where the decoding threads have time to spare: when the
    // merging thread encodes the backtraces itself, it is the busier side (in fork/ it
    // found a batch not ready 10 times in 424) and writing elsewhere took 0.94 of the time
    // on two CPUs. Else on this one (see [`OutputFile::here`]).
    let out = if cpus > threads + 1 || (cpus > 1 && !encoded_ahead) {
        OutputFile::on_thread(file, Some(placement))
            .map_err(|e| Error::output(output, "start writing", e))?
    } else {
        OutputFile::here(file)
    };
    let wopts = WriterOptions {
        version: format,
        lossless: true,
    };
    // (a trace info too long for a packet is the caller's with a context of theirs, else
    // the first input's names)
    let mut w = Writer::new(out, &info, wopts).map_err(|e| match e {
        Error::Usage(m) if opts.context.is_none() => {
            Error::Incompatible(format!("{}: {m}", opened[0].path.display()))
        }
        e => e,
    })?;
    w.set_output_path(output);
    if !single {
        w.set_flush_on_domain_switch(false);
    }

    let show_progress = opts.progress && std::io::stderr().is_terminal();
    let mut progress = Progress {
        cancel: opts.cancel.clone(),
        show: show_progress,
        started,
        last: started,
        total_bytes,
    };
    // Fault in the pages this thread would otherwise fault in one by one as it starts
    // merging (the output's cache tables, its first buffer; the output thread faults in
    // the next ones), while the decoding threads open the inputs and fill their first
    // batches (~1 ms on fork/, the page faults ~0.3 ms): fork/ 0.987 and 0.985 of the
    // time (60 pairs in turns each), the 78 MB and 94 MB sets 1.00.
    w.fault_in();
    w.get_mut().fault_in();
    let merged = merge_streams(
        &mut streams,
        &mut states,
        &mut bts,
        &mut codes,
        &mut w,
        &pipe,
        &mut progress,
    )?;
    if let Merged::ShareTooSmall = merged {
        return Ok(None);
    }
    if show_progress && started.elapsed() > Duration::from_secs(1) {
        let _ = writeln!(std::io::stderr());
    }
    let mut decoded = pipe
        .finish()
        .map_err(|m| Error::Internal(format!("a decoding thread panicked: {m}")))?;
    // A lone input of no packets but its info (a process killed before its first) is
    // copied as it is: without the empty packet a writer ends with.
    if single && decoded.iter().all(|d| d.packets == 0) {
        w.set_end_without_empty_packet();
    }
    // (an input gone since it was first opened: its streams read nothing)
    if let Some(e) = decoded.iter_mut().find_map(|d| d.reopen_failed.take()) {
        return Err(e);
    }
    for (st, d) in states.iter_mut().zip(decoded) {
        st.report.skipped_packets = d.skipped_packets;
        st.report.stopped_at_error = d.stopped_at_error;
        st.report.warnings = d.warnings.list;
        let n = st.report.cut_backtraces;
        if n > 0 {
            warn_input(
                st,
                format!(
                    "{n} allocation(s) had a backtrace too deep for one packet (over ~3,000 \
                     new frames): each was kept cut to what fits"
                ),
            );
        }
    }
    let (out, wstats) = w.finish_with_stats()?;
    let file = out
        .finish()
        .map_err(|e| Error::output(output, "write", e))?;
    sink.commit(file, opts.fsync)?;

    let info_rate = min_rate;
    let mut report = MergeReport {
        output: output.to_path_buf(),
        format,
        allocs: wstats.allocs,
        promotes: wstats.promotes,
        collects: wstats.collects,
        encoded_ahead,
        ..Default::default()
    };
    // Reports in the order of the inputs as given (skipped ones included).
    let mut by_index: Vec<(usize, InputReport)> = states
        .into_iter()
        .zip(&opened)
        .map(|(mut st, o)| {
            st.report.warnings.append(&mut st.warnings.list);
            st.report.events = st.report.allocs + st.report.promotes + st.report.collects;
            if st.thinner.is_some() {
                st.report.keep_fraction = if st.report.samples_read == 0 {
                    1.0
                } else {
                    st.report.samples_written as f64 / st.report.samples_read as f64
                };
                if st.report.samples_read > 0 {
                    let msg = format!(
                        "sampled at rate {}, thinned to the slowest input's {}: kept {} of \
                         {} samples ({:.2}%) and {} of {} allocations",
                        st.report.sample_rate,
                        info_rate,
                        st.report.samples_written,
                        st.report.samples_read,
                        100.0 * st.report.keep_fraction,
                        st.report.allocs_written,
                        st.report.allocs
                    );
                    st.report.warnings.push(msg);
                }
            }
            (o.index, st.report)
        })
        .collect();
    by_index.extend(skipped);
    by_index.sort_by_key(|(k, _)| *k);
    let by_path: Vec<InputReport> = by_index.into_iter().map(|(_, r)| r).collect();
    report.remapped_codes = by_path.iter().map(|r| r.remapped_codes).sum();
    report.argument_warnings = prepared.arg_warnings.clone();
    report.warnings = by_path.iter().map(|r| r.warnings.len() as u64).sum::<u64>()
        + report.argument_warnings.len() as u64;
    report.inputs = by_path;
    Ok(Some(report))
}
