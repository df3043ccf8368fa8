//! One attempt at a merge, from the inputs found to the output named: the inputs opened and
//! checked, the merged trace's info, the plan, the threads started, the loop, the report.

use super::core::{merge_streams, Merged, Progress};
use super::inputs::{describe_merge, merged_rate, open_as, Opened, Prepared};
use super::objects::{warn_input, InputState};
use super::plan::Plan;
use super::verbatim::{copied_inputs, Copied};
use super::{InputReport, MergeOptions, MergeReport, RateMismatch};
use crate::cancel::Cancel;
use crate::error::{Error, Result};
use crate::format::event::{DomainId, Timestamp};
use crate::format::info::TraceInfo;
use crate::pipeline::decoder::{Decoder, Hooks};
use crate::pipeline::fill::DecodeReport;
use crate::pipeline::output::OutputFile;
use crate::pipeline::placement::Placement;
use crate::pipeline::verbatim::{copy_packets, CopiedInput, Survey};
use crate::reader::{scan_packets_as, PacketScan};
use crate::writer::{WriteStats, Writer, WriterOptions};
use std::io::{IsTerminal, Write};
use std::path::Path;
use std::time::{Duration, Instant};

/// Inputs left out as unreadable ([`MergeOptions::skip_bad_inputs`]), with their index.
type Skipped = Vec<(usize, InputReport)>;

/// `merge_with`, once: None when a backtrace did not fit its share of the cache.
pub(super) fn merge_attempt(
    prepared: &Prepared,
    output: &Path,
    opts: &MergeOptions,
    hooks: Hooks,
) -> Result<Option<MergeReport>> {
    let (mut opened, skipped) = open_inputs(prepared, opts)?;
    let min_rate = check_inputs(&mut opened, opts)?;
    let format = opts.format.unwrap_or_else(|| {
        if opened.iter().all(|o| o.info.version <= 2) {
            2
        } else {
            3
        }
    });
    let mut info = merged_info(&opened, opts, format, min_rate);
    let copied_in = copied_inputs(&opened, opts, format, min_rate)?;
    let copied: Vec<bool> = copied_in.surveys.iter().map(Option::is_some).collect();
    let mut plan = Plan::new(&opened, prepared, opts, format, min_rate, &copied)?;
    if copied.contains(&true) {
        // (the writer's first stream, which ends the trace with a packet, in a domain of
        // its own: after a copied domain's packets, its begin time would go back)
        info.initial_domain = DomainId(plan.free_domain);
        take_in_copied(&mut plan, &copied_in);
    }
    // decoders on the cores the merging thread leaves (at least one)
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads = (opts.decode_threads).unwrap_or_else(|| (cpus - 1).clamp(1, 4));
    // Decoding starts first: it reads the inputs while the output file is made (dropped on
    // an error below, the decoder stops its threads).
    let total_bytes: u64 = plan.specs.iter().map(|s| s.size).sum();
    let started = Instant::now();
    // (the helper threads are kept off the CPU of this thread, the merging one)
    let placement = Placement::new();
    let specs = std::mem::take(&mut plan.specs);
    let pipe = Decoder::start(specs, opened.len(), threads, hooks, placement.clone())
        .map_err(|e| Error::Internal(format!("cannot start the decoding threads: {e}")))?;
    let (sink, file) = prepared.target.create()?;
    // The file is written on a thread of its own where a CPU is free for it (the merging
    // thread is the busiest), or where the decoding threads have time to spare: when the
    // merging thread encodes the backtraces itself, it is the busier side. Else on this one
    // (see benches/PERFORMANCE.md, "The output thread").
    let out = if cpus > threads + 1 || (cpus > 1 && !plan.encoded_ahead) {
        OutputFile::on_thread(file, Some(placement))
            .map_err(|e| Error::output(output, "start writing", e))?
    } else {
        OutputFile::here(file)
    };
    let mut w = writer(out, &info, &opened, opts, output)?;
    let show = opts.progress && std::io::stderr().is_terminal();
    let mut progress = Progress {
        cancel: opts.cancel.clone(),
        show,
        started,
        last: started,
        total_bytes,
    };
    // Fault in the pages this thread would otherwise fault in one by one as it starts
    // merging, while the decoding threads open the inputs and fill their first batches.
    w.fault_in();
    w.get_mut().fault_in();
    // The copied inputs' packets first (format 3 orders events per domain only).
    copy_inputs(
        &mut w,
        &plan,
        &opened,
        &copied_in.surveys,
        info.pid,
        &opts.cancel,
    )?;
    let p = &mut plan;
    let merged = merge_streams(
        &mut p.streams,
        &mut p.states,
        &mut p.bts,
        &mut p.codes,
        &mut w,
        &pipe,
        &mut progress,
    )?;
    if let Merged::ShareTooSmall = merged {
        return Ok(None);
    }
    if show && started.elapsed() > Duration::from_secs(1) {
        let _ = writeln!(std::io::stderr());
    }
    let decoded = pipe
        .finish()
        .map_err(|m| Error::Internal(format!("a decoding thread panicked: {m}")))?;
    // A lone input of no packets but its info (a process killed before its first) is
    // copied as it is: without the empty packet a writer ends with.
    if opened.len() == 1 && decoded.iter().all(|d| d.packets == 0) {
        w.set_end_without_empty_packet();
    }
    take_decoded(&mut plan.states, decoded)?;
    let (out, wstats) = w.finish_with_stats()?;
    let file = (out.finish()).map_err(|e| Error::output(output, "write", e))?;
    sink.commit(file, opts.fsync)?;
    let outcome = Outcome {
        format,
        min_rate,
        wstats,
        encoded_ahead: plan.encoded_ahead,
        copied: copied_in
            .surveys
            .iter()
            .flatten()
            .fold((0, 0, 0), |(a, p, c), s| {
                (a + s.allocs, p + s.promotes, c + s.collects)
            }),
    };
    Ok(Some(report(
        plan.states,
        &opened,
        skipped,
        prepared,
        output,
        outcome,
    )))
}

/// Read every input's info packet and find its domains, in the order of their paths (the
/// unreadable left out, if asked, with a report saying why).
fn open_inputs(prepared: &Prepared, opts: &MergeOptions) -> Result<(Vec<Opened>, Skipped)> {
    let mut opened: Vec<Opened> = Vec::new();
    let mut skipped = Vec::new();
    let mut first_bad = None;
    for (k, p) in prepared.paths.iter().enumerate() {
        let src = &prepared.sources[k];
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
                let r = InputReport {
                    path: p.clone(),
                    arg: prepared.args[k],
                    skipped: true,
                    keep_fraction: 0.0,
                    warnings: vec![format!("skipped unreadable input: {e}")],
                    ..Default::default()
                };
                skipped.push((k, r));
                first_bad.get_or_insert(e);
            }
            Err(e) => return Err(e),
        }
    }
    if opened.is_empty() {
        // (every input skipped: what was wrong with the first)
        return Err(first_bad.unwrap_or_else(|| Error::Usage("no input traces".into())));
    }
    Ok((opened, skipped))
}

/// That the inputs can be merged together (one word size, rates as the options allow);
/// the merged rate.
fn check_inputs(opened: &mut [Opened], opts: &MergeOptions) -> Result<f64> {
    let word = opened[0].info.word_size;
    if let Some(o) = opened.iter().find(|o| o.info.word_size != word) {
        return Err(Error::Incompatible(format!(
            "{}: word size {} differs from {}'s {}",
            o.path.display(),
            o.info.word_size,
            opened[0].path.display(),
            word
        )));
    }
    let min_rate = merged_rate(opened)?;
    if opts.rate_mismatch == RateMismatch::Fail {
        let faster = opened
            .iter()
            .find(|o| o.info.sample_rate != min_rate && o.alloc_ids > 0);
        if let Some(o) = faster {
            return Err(Error::Incompatible(format!(
                "sampling rates differ: {} has {}, the slowest input has {} (--rate-mismatch \
                 thin thins the faster ones to it)",
                o.path.display(),
                o.info.sample_rate,
                min_rate
            )));
        }
    }
    Ok(min_rate)
}

/// The merged trace's info: the first input's, with the earliest start time, the merged
/// rate, the pid and context asked for (else the first input's, or a description of the
/// merge).
fn merged_info(opened: &[Opened], opts: &MergeOptions, format: u16, min_rate: f64) -> TraceInfo {
    let single = opened.len() == 1;
    let first = &opened[0].info;
    let mut info = first.clone();
    let start = opened.iter().map(|o| o.info.start_time.0).min();
    info.start_time = Timestamp(start.unwrap_or(0));
    info.sample_rate = min_rate;
    info.pid = opts.pid.unwrap_or(first.pid);
    info.version = format;
    info.context = match &opts.context {
        Some(c) => Some(c.iter().copied().filter(|&b| b != 0).collect()),
        None if single => first.context.clone(),
        None => Some(describe_merge(opened)),
    };
    if format < 3 || !single {
        info.initial_domain = DomainId(0);
    }
    info
}

/// The writer of the merged trace on `out`.
fn writer(
    out: OutputFile,
    info: &TraceInfo,
    opened: &[Opened],
    opts: &MergeOptions,
    output: &Path,
) -> Result<Writer<OutputFile>> {
    let wopts = WriterOptions {
        version: info.version,
        lossless: true,
    };
    // (a trace info too long for a packet is the caller's with a context of theirs, else
    // the first input's names)
    let mut w = Writer::new(out, info, wopts).map_err(|e| match e {
        Error::Usage(m) if opts.context.is_none() => {
            Error::Incompatible(format!("{}: {m}", opened[0].path.display()))
        }
        e => e,
    })?;
    w.set_output_path(output);
    if opened.len() > 1 {
        w.set_flush_on_domain_switch(false);
        // (several inputs taking turns miss the cache more than any of them did alone)
        w.set_locations_once(true);
    }
    Ok(w)
}

/// The copied inputs' counts in their reports, and their codes in the merged codes first:
/// those of the inputs merged otherwise are remapped around them.
fn take_in_copied(plan: &mut Plan, copied: &Copied) {
    for (c, l) in &copied.codes {
        plan.codes.map(*c, l);
    }
    for (st, s) in plan.states.iter_mut().zip(&copied.surveys) {
        let Some(s) = s else { continue };
        let r = &mut st.report;
        r.copied = true;
        (r.allocs, r.allocs_written) = (s.allocs, s.allocs);
        (r.promotes, r.collects) = (s.promotes, s.collects);
        (r.samples_read, r.samples_written) = (s.samples, s.samples);
    }
}

/// Write the packets of the inputs the plan copies, each input's ids in chunks reserved
/// for it.
fn copy_inputs(
    w: &mut Writer<OutputFile>,
    plan: &Plan,
    opened: &[Opened],
    surveys: &[Option<Survey>],
    pid: u64,
    cancel: &Cancel,
) -> Result<()> {
    let mut inputs = Vec::new();
    for (k, s) in surveys.iter().enumerate() {
        let (Some(s), Some(domains)) = (s, &plan.copied[k]) else {
            continue;
        };
        inputs.push(CopiedInput {
            path: opened[k].source.clone(),
            name: opened[k].path.clone(),
            id_offset: w.reserve_ids(s.id_end)?,
            domains: domains.clone(),
        });
    }
    let mut n = 0u32;
    copy_packets(&inputs, pid, |b| {
        n = n.wrapping_add(1);
        if n.is_multiple_of(256) && cancel.is_cancelled() {
            return Err(Error::Cancelled);
        }
        w.put_packet(b)
    })
}

/// Take in what the decoding threads say of each input.
fn take_decoded(states: &mut [InputState], mut decoded: Vec<DecodeReport>) -> Result<()> {
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
            let m = format!(
                "{n} allocation(s) had a backtrace too deep for one packet (over ~3,000 new \
                 frames): each was kept cut to what fits"
            );
            warn_input(st, m);
        }
    }
    Ok(())
}

/// What the merge wrote, for its report.
struct Outcome {
    format: u16,
    min_rate: f64,
    wstats: WriteStats,
    encoded_ahead: bool,
    /// Allocations, promotes and collects of the packets copied.
    copied: (u64, u64, u64),
}

/// The merge's report: the inputs' in the order given (skipped ones included), the totals.
fn report(
    states: Vec<InputState>,
    opened: &[Opened],
    skipped: Skipped,
    prepared: &Prepared,
    output: &Path,
    o: Outcome,
) -> MergeReport {
    let mut by_index: Vec<(usize, InputReport)> = (states.into_iter().zip(opened))
        .map(|(st, op)| (op.index, input_report(st, o.min_rate)))
        .collect();
    by_index.extend(skipped);
    by_index.sort_by_key(|(k, _)| *k);
    let inputs: Vec<InputReport> = by_index.into_iter().map(|(_, r)| r).collect();
    let argument_warnings = prepared.arg_warnings.clone();
    MergeReport {
        output: output.to_path_buf(),
        format: o.format,
        allocs: o.wstats.allocs + o.copied.0,
        promotes: o.wstats.promotes + o.copied.1,
        collects: o.wstats.collects + o.copied.2,
        encoded_ahead: o.encoded_ahead,
        remapped_codes: inputs.iter().map(|r| r.remapped_codes).sum(),
        warnings: inputs.iter().map(|r| r.warnings.len() as u64).sum::<u64>()
            + argument_warnings.len() as u64,
        argument_warnings,
        inputs,
    }
}

/// An input's report, its merge's warnings last, with what thinning kept of it.
fn input_report(mut st: InputState, min_rate: f64) -> InputReport {
    st.report.warnings.append(&mut st.warnings.list);
    let r = &mut st.report;
    r.events = r.allocs + r.promotes + r.collects;
    if st.thinner.is_some() {
        r.keep_fraction = if r.samples_read == 0 {
            1.0
        } else {
            r.samples_written as f64 / r.samples_read as f64
        };
        if r.samples_read > 0 {
            let msg = format!(
                "sampled at rate {}, thinned to the slowest input's {min_rate}: kept {} of {} \
                 samples ({:.2}%) and {} of {} allocations",
                r.sample_rate,
                r.samples_written,
                r.samples_read,
                100.0 * r.keep_fraction,
                r.allocs_written,
                r.allocs
            );
            r.warnings.push(msg);
        }
    }
    st.report
}
