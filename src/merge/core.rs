//! The heap loop: every stream's events in merged order, written through the writer.

use super::objects::{
    follow_object, give_up_waiting, release_waiting, wait_for_object, InputState, DROPPED,
};
use super::streams::{merged_misses, Backtrace, Stream};
use crate::error::{Error, Result};
use crate::format::event::{LocationCode, Timestamp};
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
    pub(super) cancel: crate::Cancel,
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
    let mut heap = BinaryHeap::new();
    for (i, s) in streams.iter_mut().enumerate() {
        s.batch = pipe.next_batch(i);
        if s.pos < s.batch.evs.len() {
            heap.push(Reverse(s.batch.evs[0].key(s.key_bits)));
        }
    }
    let mut nevents = 0u64;
    let mut missed: Vec<LocationCode> = Vec::new();
    while let Some(&Reverse(first)) = heap.peek() {
        let i = first as u32 as usize;
        // The stream goes on alone while its events come before every other stream's next.
        let bound = heap.as_slice()[1..]
            .iter()
            .take(2)
            .map(|r| r.0)
            .min()
            .unwrap_or(u128::MAX);
        let s = &mut streams[i];
        let st = &mut states[s.input];
        let dom = s.out_domain;
        let tag = st.tag.is_some() as usize;
        loop {
            let Timed { time, ev } = s.batch.evs[s.pos];
            // Take in the codes the stream defined before this event.
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
            match ev {
                Ev::Alloc {
                    id,
                    length,
                    nsamples,
                    source,
                    keep: ncodes,
                    new: nframes,
                } if s.batch.encoded => {
                    let (length, nsamples) = s.length_and_samples(length, nsamples);
                    let kept = st.read_alloc(nsamples);
                    // (the decoder drew the same, and encoded nothing of one left out)
                    if kept.is_none() != (nframes == THINNED_OUT) {
                        return Err(Error::Internal(format!(
                            "{}: an allocation thinned otherwise when encoded ahead",
                            st.report.path.display()
                        )));
                    }
                    if let Some(n) = kept {
                        let (mut at, cut) = s.batch.encoding(s.enc_pos);
                        if cut {
                            return Ok(Merged::ShareTooSmall);
                        }
                        s.enc_pos = at.end;
                        let common = if s.solo {
                            let b = &s.batch.enc.bytes()[at.start..at.start + 4];
                            at.start += 4;
                            u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize
                        } else {
                            0
                        };
                        let first = s.miss_pos;
                        while matches!(s.batch.misses.get(s.miss_pos), Some(m) if (m.0 as usize) < at.end)
                        {
                            s.miss_pos += 1;
                        }
                        let sent = &s.batch.misses[first..s.miss_pos];
                        merged_misses(&s.remap, &mut s.batch.enc, sent, &mut missed);
                        let out_id = w.put_alloc_encoded(
                            Timestamp(time),
                            dom,
                            length,
                            n,
                            source,
                            common,
                            nframes as usize,
                            ncodes as usize,
                            &s.batch.enc.bytes()[at],
                            &missed,
                            |c| codes.meanings.get(&c).cloned(),
                        )?;
                        st.live.insert(id, out_id.0);
                        st.report.allocs_written += 1;
                        st.report.samples_written += n;
                    } else {
                        st.live.insert(id, DROPPED);
                    }
                    if !st.waiting.is_empty() {
                        release_waiting(st, w, id, time)?;
                    }
                }
                Ev::Alloc {
                    id,
                    length,
                    nsamples,
                    source,
                    keep,
                    new,
                } => {
                    let (length, nsamples) = s.length_and_samples(length, nsamples);
                    let keep = tag + keep as usize;
                    let bt = &mut bts[i];
                    bt.frames.truncate(keep);
                    let f = s.frame_pos;
                    let fresh = &s.batch.frames[f..f + new as usize];
                    // (the new frames' hints: their entries in the input's cache)
                    bt.hints.resize(keep, 0);
                    bt.hints
                        .extend_from_slice(&s.batch.slots[f..f + new as usize]);
                    if s.remap.is_empty() {
                        bt.frames.extend_from_slice(fresh);
                    } else {
                        let remap = &s.remap;
                        bt.frames
                            .extend(fresh.iter().map(|c| remap.get(c).copied().unwrap_or(*c)));
                    }
                    bt.version += 1;
                    s.frame_pos += new as usize;
                    if let Some(n) = st.read_alloc(nsamples) {
                        let cut_before = w.stats().cut_backtraces;
                        let resolve = |c| codes.meanings.get(&c).cloned();
                        // What it shares with the last allocation written in its domain:
                        // the stream's own common prefix when that was this stream's
                        // previous one.
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
                            Timestamp(time),
                            dom,
                            length,
                            n,
                            source,
                            common,
                            &bt.frames[common..],
                            &mut bt.hints[common..],
                            resolve,
                        )?;
                        if w.stats().cut_backtraces != cut_before {
                            st.report.cut_backtraces += 1;
                        }
                        st.live.insert(id, out_id.0);
                        st.report.allocs_written += 1;
                        st.report.samples_written += n;
                    } else {
                        st.live.insert(id, DROPPED);
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
                let next = pipe.next_batch(i);
                pipe.recycle(std::mem::replace(&mut s.batch, next));
                s.pos = 0;
                s.frame_pos = 0;
                s.loc_pos = 0;
                s.enc_pos = 0;
                s.miss_pos = 0;
                s.wide_pos = 0;
            }
            nevents += 1;
            if nevents.is_multiple_of(4096) {
                if progress.cancel.is_cancelled() {
                    return Err(Error::Cancelled);
                }
                if progress.show && nevents.is_multiple_of(65536) {
                    let now = Instant::now();
                    if now.duration_since(progress.started) > Duration::from_secs(1)
                        && now.duration_since(progress.last) > Duration::from_millis(250)
                    {
                        progress.last = now;
                        let done = pipe.bytes_read();
                        let _ = write!(
                            std::io::stderr(),
                            "\rmemtrace-merge: {} events, {:.0}%   ",
                            nevents,
                            100.0 * (done as f64 / progress.total_bytes.max(1) as f64).min(1.0)
                        );
                    }
                }
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
