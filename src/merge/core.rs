//! The heap loop: every stream's events in merged order, written through the writer.

use super::objects::{
    follow_object, give_up_waiting, release_waiting, wait_for_object, InputState, DROPPED,
};
use super::streams::{merged_misses, Backtrace, Stream};
use crate::error::{Error, Result};
use crate::format::backtrace::push_slots;
use crate::format::event::{AllocSource, LocationCode, Timestamp};
use crate::merge::codes::Codes;
use crate::pipeline::decoder::{Decoder, Ev, Timed, THINNED_OUT};
use crate::pipeline::output::OutputFile;
use crate::writer::{common_prefix, Writer};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::io::Write;
use std::time::{Duration, Instant};

/// Where a merge stands, for its progress line on stderr.
pub(super) struct Progress {
    /// the merge's, polled with the progress
    pub(super) cancel: crate::cancel::Cancel,
    pub(super) show: bool,
    pub(super) started: Instant,
    pub(super) last: Instant,
    pub(super) total_bytes: u64,
}

/// How merging the streams ended.
pub(super) enum Merged {
    Done,
    /// A backtrace encoded in its stream's share of the cache did not fit a packet (a
    /// deep stack of more distinct frames than a share holds): the merge is to be made
    /// again without encoding ahead, which sends only what differs from the previous one.
    ShareTooSmall,
}

/// The merge proper: every stream's events in merged order, written through `w`; the ids,
/// live objects, codes and counts of each input kept in `states`.
pub(super) fn merge_streams(
    streams: &mut [Stream],
    states: &mut [InputState],
    bts: &mut [Backtrace],
    codes: &mut Codes,
    w: &mut Writer<OutputFile>,
    pipe: &Decoder,
    progress: &mut Progress,
) -> Result<Merged> {
    let ndomains = streams.iter().map(|s| s.out_slot + 1).max().unwrap_or(0);
    // Per output domain: the stream of the last allocation written, and its version.
    let mut last_written: Vec<Option<(usize, u64)>> = vec![None; ndomains];
    let mut heap = first_batches(streams, pipe);
    let mut nevents = 0u64;
    let mut missed: Vec<LocationCode> = Vec::new();
    while let Some(&Reverse(first)) = heap.peek() {
        let i = first as u32 as usize;
        // The stream goes on alone while its events come before every other stream's next.
        let bound = (heap.as_slice()[1..].iter().take(2))
            .map(|r| r.0)
            .min()
            .unwrap_or(u128::MAX);
        if bound != u128::MAX {
            // (the stream most likely next: its event, backtrace and new frames asked for
            // now, while this one's event is merged)
            let n = &streams[bound as u32 as usize];
            if let Some(e) = n.batch.evs.get(n.pos) {
                crate::sys::prefetch(e);
            }
            crate::sys::prefetch(&bts[bound as u32 as usize]);
            if let Some(f) = n.batch.frames.get(n.frame_pos) {
                crate::sys::prefetch(f);
            }
        }
        let s = &mut streams[i];
        let st = &mut states[s.input];
        loop {
            let Timed { time, ev } = s.batch.evs[s.pos];
            take_in_locations(s, st, codes);
            match ev {
                Ev::Alloc {
                    id,
                    length,
                    nsamples,
                    source,
                    keep,
                    new,
                } => {
                    let (length, nsamples) = s.length_and_samples(length, nsamples);
                    let a = AllocEv {
                        time,
                        id,
                        length,
                        nsamples,
                        source,
                        keep,
                        new,
                    };
                    if s.batch.encoded {
                        if !alloc_encoded(s, st, codes, w, a, &mut missed)? {
                            return Ok(Merged::ShareTooSmall);
                        }
                    } else {
                        alloc_plain(i, s, st, bts, codes, w, &mut last_written, a)?;
                    }
                    if !st.waiting.is_empty() {
                        release_waiting(st, w, id, time)?;
                    }
                }
                Ev::Promote { id } => {
                    st.report.promotes += 1;
                    if !follow_object(st, w, id, time, false)? {
                        wait_for_object(st, id, time, false);
                    }
                }
                Ev::Collect { id } => {
                    st.report.collects += 1;
                    if !follow_object(st, w, id, time, true)? {
                        wait_for_object(st, id, time, true);
                    }
                }
            }
            s.pos += 1;
            if s.pos == s.batch.evs.len() && !s.batch.last {
                next_batch(s, i, pipe);
            }
            nevents += 1;
            if nevents.is_multiple_of(4096) {
                tick(progress, nevents, pipe)?;
            }
            match s.batch.evs.get(s.pos).map(|t| t.key(s.key_bits)) {
                Some(next) if next < bound => continue,
                // replace the top in place (one sift-down instead of a pop and a push)
                Some(next) => {
                    if let Some(mut top) = heap.peek_mut() {
                        *top = Reverse(next);
                    }
                }
                None => {
                    heap.pop();
                }
            }
            break;
        }
    }
    for st in states.iter_mut() {
        give_up_waiting(st, None);
    }
    Ok(Merged::Done)
}

/// Every stream's first batch, and the heap of their first events' keys.
fn first_batches(streams: &mut [Stream], pipe: &Decoder) -> BinaryHeap<Reverse<u128>> {
    let mut heap = BinaryHeap::new();
    for (i, s) in streams.iter_mut().enumerate() {
        s.batch = pipe.next_batch(i);
        if s.pos < s.batch.evs.len() {
            heap.push(Reverse(s.batch.evs[0].key(s.key_bits)));
        }
    }
    heap
}

/// An allocation of a batch, its length and samples widened.
#[derive(Clone, Copy)]
struct AllocEv {
    time: u64,
    id: u64,
    length: u64,
    nsamples: u64,
    source: AllocSource,
    /// frames kept of the stream's previous backtrace (encoded ahead: codewords)
    keep: u32,
    /// new frames (encoded ahead: frames, or [`THINNED_OUT`])
    new: u32,
}

/// Take in the codes the stream defined before its next event.
#[inline(always)]
fn take_in_locations(s: &mut Stream, st: &mut InputState, codes: &mut Codes) {
    while let Some((at, code, locs)) = s.batch.locs.get(s.loc_pos) {
        if *at as usize > s.pos {
            break;
        }
        let (m, remapped) = codes.map(*code, locs);
        if remapped {
            st.report.remapped_codes += 1;
            s.remap.insert(*code, m);
        }
        s.loc_pos += 1;
    }
}

/// An allocation whose backtrace came encoded ahead: its codewords copied, the codes sent
/// whole in merged codes. False when it did not fit its share (the merge is redone).
#[inline(always)]
fn alloc_encoded(
    s: &mut Stream,
    st: &mut InputState,
    codes: &Codes,
    w: &mut Writer<OutputFile>,
    a: AllocEv,
    missed: &mut Vec<LocationCode>,
) -> Result<bool> {
    let kept = st.read_alloc(a.nsamples);
    // (the decoder drew the same, and encoded nothing of one left out)
    if kept.is_none() != (a.new == THINNED_OUT) {
        return Err(Error::Internal(format!(
            "{}: an allocation thinned otherwise when encoded ahead",
            st.report.path.display()
        )));
    }
    let Some(n) = kept else {
        st.live.insert(a.id, DROPPED);
        return Ok(true);
    };
    let e = s.batch.encoding(s.enc_pos, s.solo);
    if e.cut {
        return Ok(false);
    }
    s.enc_pos = e.next;
    let first = s.miss_pos;
    while matches!(s.batch.misses.get(s.miss_pos), Some(m) if (m.0 as usize) < e.next) {
        s.miss_pos += 1;
    }
    let sent = &s.batch.misses[first..s.miss_pos];
    merged_misses(&s.remap, &mut s.batch.enc, sent, missed);
    let out_id = w.put_alloc_encoded(
        Timestamp(a.time),
        s.out_domain,
        a.length,
        n,
        a.source,
        e.kept,
        a.new as usize,
        a.keep as usize,
        &s.batch.enc.bytes()[e.codewords],
        missed,
        |c| codes.meanings.get(&c).cloned(),
    )?;
    st.live.insert(a.id, out_id.0);
    st.report.allocs_written += 1;
    st.report.samples_written += n;
    Ok(true)
}

/// An allocation encoded here: its backtrace (in merged codes) after what it shares with
/// the last allocation written in its output domain, with the frames' cache hints.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn alloc_plain(
    i: usize,
    s: &mut Stream,
    st: &mut InputState,
    bts: &mut [Backtrace],
    codes: &Codes,
    w: &mut Writer<OutputFile>,
    last_written: &mut [Option<(usize, u64)>],
    a: AllocEv,
) -> Result<()> {
    let keep = st.tag.is_some() as usize + a.keep as usize;
    let bt = &mut bts[i];
    bt.frames.truncate(keep);
    let f = s.frame_pos;
    let fresh = &s.batch.frames[f..f + a.new as usize];
    // (the new frames' hints: their entries in the input's cache; a stream whose reader
    // keeps none, one of many, holds none)
    let hinted = !s.batch.slots.is_empty();
    if hinted {
        bt.hints.resize(keep, 0);
        push_slots(&mut bt.hints, &s.batch.slots, f, f + a.new as usize);
    } else {
        bt.hints.clear();
    }
    if s.remap.is_empty() {
        bt.frames.extend_from_slice(fresh);
    } else {
        let remap = &s.remap;
        bt.frames
            .extend(fresh.iter().map(|c| remap.get(c).copied().unwrap_or(*c)));
    }
    bt.version += 1;
    s.frame_pos += a.new as usize;
    let Some(n) = st.read_alloc(a.nsamples) else {
        st.live.insert(a.id, DROPPED);
        return Ok(());
    };
    let cut_before = w.stats().cut_backtraces;
    // What it shares with the last allocation written in its domain: the stream's own
    // common prefix when that was this stream's previous one.
    let slot = s.out_slot;
    let common = match last_written[slot] {
        Some((j, v)) if j == i && v + 1 == bts[i].version => keep,
        Some((j, v)) if j != i && bts[j].version == v => {
            common_prefix(&bts[j].frames, &bts[i].frames)
        }
        _ => 0,
    };
    last_written[slot] = Some((i, bts[i].version));
    let bt = &mut bts[i];
    let out_id = w.put_alloc_hinted(
        Timestamp(a.time),
        s.out_domain,
        a.length,
        n,
        a.source,
        common,
        &bt.frames[common..],
        if hinted {
            &mut bt.hints[common..]
        } else {
            &mut []
        },
        |c| codes.meanings.get(&c).cloned(),
    )?;
    if w.stats().cut_backtraces != cut_before {
        st.report.cut_backtraces += 1;
    }
    st.live.insert(a.id, out_id.0);
    st.report.allocs_written += 1;
    st.report.samples_written += n;
    Ok(())
}

/// The stream's next batch in place of the one it used up (handed back for reuse).
#[inline(always)]
fn next_batch(s: &mut Stream, i: usize, pipe: &Decoder) {
    let next = pipe.next_batch(i);
    pipe.recycle(std::mem::replace(&mut s.batch, next));
    s.pos = 0;
    s.frame_pos = 0;
    s.loc_pos = 0;
    s.enc_pos = 0;
    s.miss_pos = 0;
    s.wide_pos = 0;
}

/// Every 4,096 events: the cancel handle asked, the progress line redrawn now and then.
#[cold]
#[inline(never)]
fn tick(progress: &mut Progress, nevents: u64, pipe: &Decoder) -> Result<()> {
    if progress.cancel.is_cancelled() {
        return Err(Error::Cancelled);
    }
    if progress.show && nevents.is_multiple_of(65536) {
        let now = Instant::now();
        if now.duration_since(progress.started) > Duration::from_secs(1)
            && now.duration_since(progress.last) > Duration::from_millis(250)
        {
            progress.last = now;
            let done = pipe.bytes_read() as f64 / progress.total_bytes.max(1) as f64;
            let _ = write!(
                std::io::stderr(),
                "\rmemtrace-merge: {nevents} events, {:.0}%   ",
                100.0 * done.min(1.0)
            );
        }
    }
    Ok(())
}
