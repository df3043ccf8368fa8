//! The streams of a merge (an input, or a domain of one) and how each is encoded: in its
//! output domain's cache by the merging thread, or ahead in a share of it.

use crate::format::backtrace::CACHE_SIZE;
use crate::format::buf::WriteBuf;
use crate::format::event::{DomainId, LocationCode};
use crate::format::location::IntMap;
use crate::pipeline::decoder::{Batch, StreamSpec, WIDE_LENGTH, WIDE_SAMPLES};
use crate::reader::Reader;

/// Streams of one output domain encoded ahead, each in its share of the cache: at most
/// this many (shares of fewer than 1,000 entries would hold few streams' codes; whether
/// these streams' codes fit their shares, [`ahead_pays`] reads).
pub(super) const MAX_SHARES: usize = 16;

/// Allocations of each stream whose backtraces say whether encoding ahead pays.
const JUDGED_ALLOCS: usize = 64;

/// Allocations of each stream read for the codes it uses: most streams have named nearly
/// all of theirs by then.
const WORKING_SET_ALLOCS: usize = 4096;

/// Whether encoding ahead pays for these streams: when, in their first 64 allocations, the
/// frames of a backtrace are at least 4 times the frames new since the stream's previous
/// one, and each stream's codes (those defined in its first 4,096 allocations) are at most
/// 1.5 times the entries of its share. Taking turns, each allocation is encoded after
/// another stream's, sharing little with it: the merging thread would encode most frames
/// again, each time. Ahead, a stream's decoder encodes its new frames, and counts the
/// rest, as its input did; but in a share much smaller than its codes they push each
/// other out and are sent whole again and again: the output grows by a third or more, for
/// no gain in time (benches/PERFORMANCE.md, "Encoding ahead: shares too small").
pub(super) fn ahead_pays(specs: &[StreamSpec], members: &[usize]) -> bool {
    use crate::format::event::Event;
    let (mut frames, mut new) = (0u64, 0u64);
    let mut readers = Vec::with_capacity(members.len());
    for &j in members {
        let Ok(mut r) = Reader::open(&specs[j].path) else {
            return false;
        };
        r.set_domain_filter(specs[j].domain);
        let (mut allocs, mut codes) = (0, 0);
        while allocs < JUDGED_ALLOCS {
            match r.next_full() {
                Ok(Some((Event::Alloc(a), _, defined))) => {
                    let n = a.backtrace.len() as u64;
                    frames += n;
                    new += n - a.common_prefix.min(n);
                    allocs += 1;
                    codes += defined.len();
                }
                Ok(Some((_, _, defined))) => codes += defined.len(),
                _ => break,
            }
        }
        readers.push((r, allocs, codes));
    }
    if frames == 0 || frames < 4 * new {
        return false;
    }
    // (the rest of the allocations read only for their codes, defined by location events:
    // their backtraces are not decoded)
    let share = (CACHE_SIZE - 1) / members.len().max(1);
    let room = share + share / 2;
    readers.into_iter().all(|(mut r, mut allocs, mut codes)| {
        r.set_parse_backtraces(false);
        while codes <= room && allocs < WORKING_SET_ALLOCS {
            match r.next_full() {
                Ok(Some((e, _, defined))) => {
                    codes += defined.len();
                    allocs += matches!(e, Event::Alloc(_)) as usize;
                }
                _ => break,
            }
        }
        codes <= room
    })
}

/// The codes an encoding in a share sent whole (each at its offset in `buf`), in merged
/// codes: written over the input's code in `buf` where that was remapped, and listed in
/// `missed` (whose locations go out before the packet).
#[inline(always)]
pub(super) fn merged_misses(
    remap: &IntMap<LocationCode, LocationCode>,
    buf: &mut WriteBuf,
    sent: &[(u32, LocationCode)],
    missed: &mut Vec<LocationCode>,
) {
    missed.clear();
    // (most encodings send no code whole)
    if !sent.is_empty() {
        remap_misses(remap, buf, sent, missed);
    }
}

/// [`merged_misses`] for an encoding that sent codes whole.
#[inline(never)]
pub(super) fn remap_misses(
    remap: &IntMap<LocationCode, LocationCode>,
    buf: &mut WriteBuf,
    sent: &[(u32, LocationCode)],
    missed: &mut Vec<LocationCode>,
) {
    for &(at, code) in sent {
        let out = remap.get(&code).copied().unwrap_or(code);
        if out != code {
            buf.set_u64(at as usize, out.0);
        }
        missed.push(out);
    }
}

/// One stream being merged (an input, or one domain of a format-3 input), as decoded
/// ahead in batches: the current batch and its last allocation's backtrace.
pub(super) struct Stream {
    pub(super) input: usize,
    pub(super) out_domain: DomainId,
    pub(super) batch: Batch,
    pub(super) pos: usize,
    pub(super) frame_pos: usize,
    /// the batch's next location definition to take in
    pub(super) loc_pos: usize,
    /// index of `out_domain` among the output domains
    pub(super) out_slot: usize,
    /// (a stream in a share of its output domain's cache, whose batches come encoded) the
    /// batch's next encoding in its `enc`, and its next code sent whole in its `misses`
    pub(super) enc_pos: usize,
    /// encoded alone in its output domain: each encoding starts with the count of frames
    /// kept of the previous backtrace ([`StreamSpec::solo`])
    pub(super) solo: bool,
    pub(super) miss_pos: usize,
    /// the batch's next entry in `wide`
    pub(super) wide_pos: usize,
    /// its events' bits of [`order_key`] below the time and rank
    pub(super) key_bits: u128,
    /// The stream's codes that mean something else in the merged trace, with their new
    /// codes: a stream's own, as each domain of a format-3 input is read with a location
    /// table of its own, and two may give one code different meanings.
    pub(super) remap: IntMap<LocationCode, LocationCode>,
}

impl Stream {
    /// An allocation's length and sample count, from its event's (see [`Ev`]).
    #[inline(always)]
    pub(super) fn length_and_samples(&mut self, length: u32, nsamples: u16) -> (u64, u64) {
        let mut wide = |v: u64, escape: bool| {
            if escape {
                self.wide_pos += 1;
                self.batch.wide[self.wide_pos - 1]
            } else {
                v
            }
        };
        let length = wide(length as u64, length == WIDE_LENGTH);
        (length, wide(nsamples as u64, nsamples == WIDE_SAMPLES))
    }
}

/// Each stream's current allocation backtrace in merged codes (tag frame first if any),
/// with a count of its changes: what the last allocation written in a domain shares with
/// the next one is known without comparing when both come from the same stream.
#[derive(Default)]
pub(super) struct Backtrace {
    pub(super) frames: Vec<LocationCode>,
    /// Per frame, the output cache entry it was in when last encoded (see
    /// [`Writer::put_alloc_hinted`]); stale beyond what was kept, which does no harm.
    pub(super) hints: Vec<u16>,
    pub(super) version: u64,
}
