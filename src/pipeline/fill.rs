//! Filling a batch from a reader: each event narrowed into the batch's format and, for a
//! stream encoded ahead, its backtrace encoded in the stream's share of the output cache.

use super::batch::{Batch, Ev, Timed, BATCH_FRAMES, CUT, ENCODING_ROOM, WIDE_LENGTH, WIDE_SAMPLES};
use crate::format::backtrace::CacheWriter;
use crate::format::event::{AllocSource, LocationCode};
use crate::format::location::LocationList;
use crate::pipeline::files::LazyFile;
use crate::pipeline::share::{Share, ShareOf};
use crate::reader::EventSink;
use crate::reader::Reader;
use crate::thin::Thinner;

/// What the decoder learned about each input.
#[derive(Default)]
pub(crate) struct DecodeReport {
    /// The input could not be opened again for a stream (removed since): the merge fails.
    pub reopen_failed: Option<crate::error::Error>,
    pub warnings: Warnings,
    pub skipped_packets: u64,
    /// Packets after the info packet (read or skipped).
    pub packets: u64,
    /// A stream of the input stopped at an error before its end.
    pub stopped_at_error: bool,
}

/// A stream's decoding state: its reader, what was learned reading it, its encoder.
pub(crate) struct DecState {
    pub(crate) reader: Option<Reader<LazyFile>>,
    /// the stream's input, and what was learned about it reading this stream
    pub(crate) input: usize,
    pub(crate) rep: DecodeReport,
    pub(crate) bt_valid: bool,
    /// Its encoder (a stream in a share).
    pub(crate) enc: Option<Box<Encoder>>,
    /// Batches filled so far.
    pub(crate) seq: u64,
    pub(crate) done: bool,
    /// no batch filled yet (the first is small, so that the merge starts sooner)
    pub(crate) first: bool,
    /// bytes of this reader already added to the shared count
    pub(crate) counted: u64,
}

/// Warnings about one input, each said once (at most 1,000 kept).
#[derive(Clone, Debug, Default)]
pub(crate) struct Warnings {
    pub list: Vec<String>,
    seen: std::collections::HashSet<String>,
}

impl Warnings {
    pub fn push(&mut self, msg: String) {
        if self.seen.len() < 1000 && self.seen.insert(msg.clone()) {
            self.list.push(msg);
        }
    }
}

/// The encoder of a stream in its share of an output domain's cache ([`crate::pipeline::share`]),
/// kept with the stream's decoding state: whichever thread fills a batch of the stream
/// encodes it, and the bytes do not depend on which: an encoding depends on the stream's
/// own earlier backtraces only.
pub(crate) struct Encoder {
    /// Its share of the domain's cache; None for a stream alone in its output domain
    /// (format 3), encoded in the whole cache as the merging thread would, after the
    /// frames it keeps of its previous backtrace (see [`crate::pipeline::decoder::StreamSpec::solo`]).
    pub share: Option<Share>,
    /// Its share's entries (the rest of these tables is unused); alone, the domain's.
    pub tables: CacheWriter,
    /// Alone: the hints of the new frames (the encoder sets them).
    solo_hints: Vec<u16>,
    /// Allocations encoded so far (each encoding's date in the cache).
    pub allocs: i64,
    /// For a tagged process: the backtrace as encoded, [`TAG_FRAME`] first, and the
    /// input's cache entry of each frame (0 for the tag, which has none).
    tagged: Option<(Vec<LocationCode>, Vec<u16>)>,
    /// For a thinned input: the merging thread's draws, made again in the same order (the
    /// input's allocations, one stream), to leave out of the share the allocations that
    /// thinning leaves out of the merge.
    thinner: Option<Thinner>,
    /// The positions of the share's path (its last encoded backtrace) that every
    /// backtrace left out since has kept (`usize::MAX` when none was left out).
    kept: usize,
}

/// An allocation's `new` in a batch encoded ahead when thinning left it out: nothing of it
/// was encoded (see [`Encoder::thinner`]).
pub(crate) const THINNED_OUT: u32 = u32::MAX;

/// The root frame of a tagged process's backtraces, as its share encodes them: no input
/// code (an OCaml int, whose top two bits are equal) has this value, so the tag never
/// shares an entry with one of the input's frames. The merging thread writes the input's
/// tag code over it where it is sent whole (the stream's remap).
pub(crate) const TAG_FRAME: LocationCode = LocationCode(0xa000_0000_0000_7a90);

impl Encoder {
    /// Encode an allocation's backtrace (`keep` frames the last one's, when `valid`) into
    /// the batch's `enc`, its codes sent whole into `misses`: the codewords and frames
    /// encoded; None when thinning left the allocation out (nothing encoded).
    #[inline(always)]
    fn encode(
        &mut self,
        b: &mut Batch,
        valid: bool,
        keep: usize,
        backtrace: &[LocationCode],
        slots: &[u16],
        nsamples: u64,
    ) -> Option<(usize, usize)> {
        let Encoder {
            share,
            tables,
            solo_hints,
            allocs,
            tagged,
            thinner,
            kept,
        } = self;
        // (a tagged process's: the tag, then the reader's backtrace, whose first `keep`
        // frames are the last one's)
        let (frames, hints, keep) = match tagged {
            Some((f, h)) => {
                f.truncate(1 + keep);
                f.extend_from_slice(&backtrace[keep..]);
                h.truncate(1 + keep);
                h.extend_from_slice(slots.get(keep..).unwrap_or_default());
                h.resize(f.len(), 0);
                (&f[..], &h[..], if valid { 1 + keep } else { 0 })
            }
            None => (backtrace, slots, keep),
        };
        if (thinner.as_mut()).is_some_and(|t| t.keep(nsamples) == 0 && nsamples > 0) {
            // left out: the next encoding keeps of the path only what this one kept
            *kept = keep.min(*kept);
            return None;
        }
        let keep = keep.min(std::mem::replace(kept, usize::MAX));
        let enc = &mut b.enc;
        let head = enc.len();
        enc.u32(0);
        let misses = &mut b.misses;
        *allocs += 1;
        // (the frames the output keeps of the previous backtrace, then the encoding)
        let (common, (ncodes, done)) = match share {
            Some(share) => {
                let limit = head + 4 + ENCODING_ROOM;
                let on_miss = |i, at: usize| misses.push((at as u32, frames[i]));
                let encoded =
                    share.encode(tables, enc, *allocs, frames, hints, keep, limit, on_miss);
                (0, encoded)
            }
            None => {
                // alone in the domain: the new frames, after the `keep` of the last one
                enc.u32(keep as u32);
                solo_hints.clear();
                solo_hints.extend_from_slice(hints.get(keep..).unwrap_or_default());
                let limit = enc.len() + ENCODING_ROOM;
                let new = &frames[keep..];
                let on_miss = |i, at: usize| misses.push((at as u32, new[i]));
                let encoded = tables.encode_hinted(enc, *allocs, new, solo_hints, limit, on_miss);
                (keep, encoded)
            }
        };
        let len = enc.len() - head - 4;
        let cut = if common + done < frames.len() { CUT } else { 0 };
        enc.set_u32(head, len as u32 | cut);
        Some((ncodes, done))
    }

    pub(crate) fn new(of: Option<ShareOf>, tagged: bool, thinner: Option<Thinner>) -> Encoder {
        Encoder {
            share: of.map(Share::new),
            tables: CacheWriter::default(),
            solo_hints: Vec::new(),
            allocs: 0,
            tagged: tagged.then(|| (vec![TAG_FRAME], vec![0])),
            thinner,
            kept: usize::MAX,
        }
    }
}

/// A batch being filled by the reader, with the stream's state.
struct Filler<'a> {
    b: &'a mut Batch,
    /// Frames past which the batch is full.
    most_frames: usize,
    bt_valid: &'a mut bool,
    enc: Option<&'a mut Encoder>,
}

impl Filler<'_> {
    /// The frames an allocation of `len` keeps of the stream's previous backtrace: none
    /// when that one was not taken in whole.
    #[inline(always)]
    fn kept(&self, common_prefix: u64, len: usize) -> usize {
        match *self.bt_valid {
            true => (common_prefix as usize).min(len),
            false => 0,
        }
    }

    /// Add an allocation to the batch (`keep` and `new` as [`Ev::Alloc`] says).
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn push_alloc(
        &mut self,
        time: u64,
        id: u64,
        length: u64,
        nsamples: u64,
        source: AllocSource,
        keep: u32,
        new: u32,
    ) {
        let length = narrow(length, WIDE_LENGTH, &mut self.b.wide);
        let nsamples = narrow(nsamples, WIDE_SAMPLES, &mut self.b.wide);
        self.b.evs.push(Timed {
            time,
            ev: Ev::Alloc {
                id,
                length,
                nsamples,
                source,
                keep,
                new,
            },
        });
    }
}

/// `v` in a narrower field, or `wide` (and `v` pushed on `wides`) when it is that or does
/// not fit.
#[inline(always)]
fn narrow<T: TryFrom<u64> + PartialEq + Copy>(v: u64, wide: T, wides: &mut Vec<u64>) -> T {
    match T::try_from(v) {
        Ok(n) if n != wide => n,
        _ => {
            wides.push(v);
            wide
        }
    }
}

impl EventSink for Filler<'_> {
    #[inline]
    fn location(&mut self, code: LocationCode, locs: &LocationList) {
        self.b
            .locs
            .push((self.b.evs.len() as u32, code, locs.clone()));
    }

    #[inline]
    fn alloc(
        &mut self,
        time: u64,
        id: u64,
        length: u64,
        nsamples: u64,
        source: AllocSource,
        common_prefix: u64,
        backtrace: &[LocationCode],
        slots: &[u16],
    ) {
        let valid = *self.bt_valid;
        let keep = self.kept(common_prefix, backtrace.len());
        *self.bt_valid = true;
        // (in a stream encoded ahead: codewords and frames encoded, else kept and new frames)
        let (first, second) = if let Some(e) = &mut self.enc {
            let Some(done) = e.encode(self.b, valid, keep, backtrace, slots, nsamples) else {
                return self.push_alloc(time, id, length, nsamples, source, 0, THINNED_OUT);
            };
            done
        } else {
            let new = &backtrace[keep..];
            let frames = &mut self.b.frames;
            if frames.capacity() - frames.len() < new.len() {
                // (by a quarter, not doubled: a merge of thousands of inputs holds a batch
                // per input, of a size set by the frames its allocations need)
                frames.reserve_exact(new.len().max(frames.len() / 4));
            }
            frames.extend_from_slice(new);
            // (a reader that keeps no entries gives no hints: the batch has none)
            if !slots.is_empty() {
                crate::format::backtrace::push_slots(
                    &mut self.b.slots,
                    slots,
                    keep,
                    backtrace.len(),
                );
            }
            (keep, backtrace.len() - keep)
        };
        self.push_alloc(
            time,
            id,
            length,
            nsamples,
            source,
            first as u32,
            second as u32,
        );
    }

    #[inline]
    fn promote(&mut self, time: u64, id: u64) {
        self.b.evs.push(Timed {
            time,
            ev: Ev::Promote { id },
        });
    }

    #[inline]
    fn collect(&mut self, time: u64, id: u64) {
        self.b.evs.push(Timed {
            time,
            ev: Ev::Collect { id },
        });
    }

    #[inline]
    fn full(&self) -> bool {
        self.b.frames.len() >= self.most_frames || self.b.enc.len() >= 8 * self.most_frames
    }

    /// (the small batches of many streams, without the slack of the large ones: their
    /// frames are not grown for a deep backtrace that does not fit them, the batch ends
    /// before it. Grown, a batch kept for reuse stays as large, and with thousands of
    /// streams every batch would in time be as large as the largest.)
    #[inline]
    fn cramped(&self) -> bool {
        self.enc.is_none() && self.b.frames.capacity() < BATCH_FRAMES
    }

    #[inline]
    fn room_for(&self, common_prefix: u64, len: usize) -> bool {
        let f = &self.b.frames;
        self.b.evs.is_empty() || f.capacity() - f.len() >= len - self.kept(common_prefix, len)
    }
}

/// Decode up to `n` events of a stream into `b`, fewer once it holds `most_frames` frames
/// (encoding its backtraces with the stream's encoder, if it is in a share).
pub(crate) fn fill(s: &mut DecState, b: &mut Batch, n: usize, most_frames: usize) {
    b.encoded = s.enc.is_some();
    let Some(r) = s.reader.as_mut() else {
        b.last = true;
        return;
    };
    let mut sink = Filler {
        b,
        most_frames,
        bt_valid: &mut s.bt_valid,
        enc: s.enc.as_deref_mut(),
    };
    match r.read_events(&mut sink, n) {
        Ok(true) => {}
        Ok(false) => b.last = true,
        Err(e) => {
            s.rep
                .warnings
                .push(format!("stopped reading after an error: {e}"));
            s.rep.stopped_at_error = true;
            b.last = true;
        }
    }
    for w in r.take_warnings() {
        s.rep.warnings.push(w.to_string());
    }
    if b.last {
        r.get_ref().close();
    }
}
