//! The backtrace codec: a 2^14-entry two-way skewed-associative cache of location codes with
//! one prediction per entry. Reader and writer mirror the reference's decisions exactly.

use crate::error::Malformed;
use crate::format::buf::{ocaml_int, Cursor, WriteBuf};
use crate::format::event::LocationCode;
use crate::format::packet::CacheVerifier;

pub const CACHE_SIZE: usize = 1 << 14;
const MASK: u64 = CACHE_SIZE as u64 - 1;
/// The reference writer's per-backtrace encoding budget in bytes.
pub const MAX_LENGTH: usize = 4096;
/// Largest encoding of one frame (codeword + 64-bit code).
pub const MAX_ENTRY: usize = 2 + 8;
/// A decoded backtrace longer than this is refused (no real stack comes close).
pub const MAX_FRAMES: usize = 1 << 22;
/// Reader cache entries never filled by a miss hold this (not a valid 63-bit code).
const EMPTY: u64 = 1 << 63;

/// The two candidate buckets of a code, from OCaml's 63-bit arithmetic (only low bits matter).
#[inline]
pub fn buckets(code: LocationCode) -> (usize, usize) {
    let s = code.0;
    let h1 = (s.wrapping_mul(0x4983723) >> 11) & MASK;
    let h2 = (s.wrapping_mul(0xfdea731) >> 21) & MASK;
    (h1 as usize, h2 as usize)
}

/// A value whose top bit is set for EMPTY and for no code: codes are OCaml ints, whose
/// top two bits are equal, while EMPTY's differ. (The decoder ORs it over the frames it
/// copies and looks at the top bit once.)
#[inline(always)]
fn not_a_code(v: u64) -> u64 {
    v ^ (v << 1)
}

/// [`crate::writer::common_prefix`] for long runs: compared 16 frames at a time first,
/// without a branch each.
#[inline]
fn same_run(a: &[LocationCode], b: &[LocationCode]) -> usize {
    let mut m = 0;
    for (x, y) in a.chunks_exact(16).zip(b.chunks_exact(16)) {
        if !x.iter().zip(y).fold(true, |all, (x, y)| all & (x.0 == y.0)) {
            break;
        }
        m += 16;
    }
    m + crate::writer::common_prefix(&a[m..], &b[m..])
}

/// Whether any frame is EMPTY.
#[cfg(test)]
fn any_empty(frames: &[LocationCode]) -> bool {
    frames.iter().fold(0u64, |a, v| a | not_a_code(v.0)) >> 63 != 0
}

/// Append to `hints` the cache entries `slots[from..to]` that a reader lent with a
/// backtrace, or as many zeros (no hint) when it kept none: `hints` grows with the frames
/// appended beside it.
pub(crate) fn push_slots(hints: &mut Vec<u16>, slots: &[u16], from: usize, to: usize) {
    match slots.get(from..to) {
        Some(s) => hints.extend_from_slice(s),
        None => hints.resize(hints.len() + (to - from), 0),
    }
}

/// Decoder state of one stream (one per domain): cache, predictions and the last backtrace.
#[derive(Clone)]
pub struct CacheReader {
    /// None until the first decode.
    tables: Option<ReaderTables>,
    /// The last decoded backtrace, caller-first, is `last[..last_len]` (the rest is room).
    last: Vec<LocationCode>,
    last_len: usize,
    scratch: Vec<LocationCode>,
    /// When kept ([`CacheReader::keep_slots`]): the entry each frame of `last` came from.
    slots: Option<Vec<u16>>,
}

/// The cache's codes (EMPTY where no miss ever filled them) and predictions.
#[derive(Clone)]
struct ReaderTables {
    loc: Box<[u64; CACHE_SIZE]>,
    pred: Box<[u16; CACHE_SIZE]>,
}

impl Default for CacheReader {
    /// An empty cache; its tables are allocated by the first [`CacheReader::decode`] (a
    /// format-3 trace may name thousands of domains that never allocate).
    fn default() -> Self {
        CacheReader {
            tables: None,
            last: Vec::new(),
            last_len: 0,
            scratch: Vec::new(),
            slots: None,
        }
    }
}

impl CacheReader {
    /// The backtrace decoded last (caller-first).
    #[inline]
    pub fn backtrace(&self) -> &[LocationCode] {
        &self.last[..self.last_len]
    }

    /// Keep, for every decoded frame, the cache entry it came from (see
    /// [`CacheReader::slots`]): a writer whose cache is in the same state can check a frame
    /// there without following predictions.
    pub fn keep_slots(&mut self, yes: bool) {
        self.slots = yes.then(|| vec![0; self.last.len()]);
    }

    /// The cache entry of each frame of [`CacheReader::backtrace`] (empty unless kept).
    #[inline]
    pub fn slots(&self) -> &[u16] {
        match &self.slots {
            Some(s) => &s[..self.last_len],
            None => &[],
        }
    }

    /// Decode `nencoded` codewords after `common_prefix` frames of the previous backtrace.
    /// When the prefix exceeds the previous (truncated) backtrace, the reference keeps the
    /// previous backtrace as it was, still updating the cache; so do we.
    /// `defined(code)` says whether a location event defined a code; every code that
    /// enters the cache (a miss) must be defined, and no frame may come from an entry no
    /// miss ever filled, so every decoded frame has locations.
    #[inline(always)]
    pub fn decode(
        &mut self,
        c: &mut Cursor<'_>,
        nencoded: usize,
        common_prefix: u64,
        defined: impl Fn(LocationCode) -> bool,
    ) -> Result<(), Malformed> {
        let t = self.tables.get_or_insert_with(|| ReaderTables {
            loc: table_of(EMPTY),
            pred: table_of(0),
        });
        if common_prefix <= self.last_len as u64 {
            let start = common_prefix as usize;
            if nencoded == 0 {
                self.last_len = start;
                return Ok(());
            }
            let last = &mut self.last;
            let r = match &mut self.slots {
                None => Self::decode_into::<false>(
                    t,
                    c,
                    nencoded,
                    last,
                    &mut Vec::new(),
                    start,
                    defined,
                ),
                // (out of line: the usual decoding stays small)
                Some(s) => Self::decode_apart(t, c, nencoded, last, Some(s), start, defined),
            };
            // on error the backtrace is left as the prefix (the event is not handed out)
            self.last_len = *r.as_ref().unwrap_or(&(common_prefix as usize));
            r.map(|_| ())
        } else {
            // The rare case of a common prefix longer than the previous backtrace: decode
            // into the scratch room (the cache learns; the backtrace stays as it was).
            let scratch = &mut self.scratch;
            Self::decode_apart(t, c, nencoded, scratch, None, 0, defined).map(|_| ())
        }
    }

    /// [`CacheReader::decode_into`], out of line.
    #[inline(never)]
    fn decode_apart(
        t: &mut ReaderTables,
        c: &mut Cursor<'_>,
        nencoded: usize,
        out: &mut Vec<LocationCode>,
        entries: Option<&mut Vec<u16>>,
        start: usize,
        defined: impl Fn(LocationCode) -> bool,
    ) -> Result<usize, Malformed> {
        match entries {
            Some(e) => Self::decode_into::<true>(t, c, nencoded, out, e, start, defined),
            None => {
                Self::decode_into::<false>(t, c, nencoded, out, &mut Vec::new(), start, defined)
            }
        }
    }

    /// Decode into `out[start..]` (growing it as needed, never shrinking); the new length.
    /// With `S`, `entries` (as long as `out`) gets the cache entry of each frame (without,
    /// it is left alone).
    #[inline(always)]
    fn decode_into<const S: bool>(
        t: &mut ReaderTables,
        c: &mut Cursor<'_>,
        nencoded: usize,
        out: &mut Vec<LocationCode>,
        entries: &mut Vec<u16>,
        start: usize,
        defined: impl Fn(LocationCode) -> bool,
    ) -> Result<usize, Malformed> {
        const M: usize = CACHE_SIZE - 1;
        let mut pred = 0usize;
        let mut len = start;
        for _ in 0..nencoded {
            // room for the most one codeword can give (a hit and 255 predictions)
            if out.len() < len + 256 {
                if len > MAX_FRAMES {
                    return Err(Malformed::BadValue {
                        field: "backtrace length",
                        value: len as i64,
                    });
                }
                out.resize(len + 256 + len / 2, LocationCode(0));
                if S {
                    entries.resize(out.len(), 0);
                }
            }
            let cw = c.u16()?;
            let bucket = (cw >> 2) as usize & M;
            let tag = cw & 3;
            t.pred[pred & M] = bucket as u16;
            let slots = &mut out[len..len + 256];
            let ents: &mut [u16] = if S {
                &mut entries[len..len + 256]
            } else {
                &mut []
            };
            if tag == 3 {
                let lit = ocaml_int(c.u64()?) as u64;
                if !defined(LocationCode(lit)) {
                    return Err(Malformed::UndefinedLocation { code: lit });
                }
                t.loc[bucket] = lit;
                slots[0] = LocationCode(lit);
                if S {
                    ents[0] = bucket as u16;
                }
                len += 1;
                pred = bucket;
            } else {
                let n = match tag {
                    0 => 0,
                    1 => 1,
                    _ => c.u8()? as usize,
                };
                let mut p = bucket;
                slots[0] = LocationCode(t.loc[p]);
                if S {
                    ents[0] = p as u16;
                }
                // An entry no miss filled holds EMPTY. Predictions lead only to entries
                // checked when they were set, or to entry 0 (the initial prediction): only
                // the hit itself and, while entry 0 is empty, the predicted frames need
                // looking at.
                let hit_empty = slots[0].0 == EMPTY;
                let predicted_empty = if t.loc[0] == EMPTY {
                    Self::predicted::<S, true>(&t.pred, &t.loc, &mut p, &mut slots[..=n], ents)
                } else {
                    Self::predicted::<S, false>(&t.pred, &t.loc, &mut p, &mut slots[..=n], ents)
                };
                if hit_empty || predicted_empty {
                    return Err(Malformed::EmptyCacheEntry);
                }
                len += n + 1;
                pred = p;
            }
        }
        if len > MAX_FRAMES {
            return Err(Malformed::BadValue {
                field: "backtrace length",
                value: len as i64,
            });
        }
        Ok(len)
    }

    /// The frames a hit in entry `p` predicts, into `slots[1..]` (their entries into
    /// `ents[1..]` with `S`), `p` left at the last; whether one is not a code (looked at only
    /// with `CHECK`: false without).
    /// Recursion predicts an entry from itself: the rest of the run is then that frame.
    #[inline(always)]
    fn predicted<const S: bool, const CHECK: bool>(
        pred: &[u16; CACHE_SIZE],
        loc: &[u64; CACHE_SIZE],
        p: &mut usize,
        slots: &mut [LocationCode],
        ents: &mut [u16],
    ) -> bool {
        const M: usize = CACHE_SIZE - 1;
        let mut acc = 0u64;
        let mut q = *p;
        for j in 1..slots.len() {
            let next = pred[q] as usize & M;
            if next == q {
                // (the frame is the one before, already checked)
                slots[j..].fill(LocationCode(loc[q]));
                if S {
                    ents[j..slots.len()].fill(q as u16);
                }
                break;
            }
            q = next;
            let v = loc[q];
            if CHECK {
                acc |= not_a_code(v);
            }
            slots[j] = LocationCode(v);
            if S {
                ents[j] = q as u16;
            }
        }
        *p = q;
        acc >> 63 != 0
    }

    /// Skip a backtrace without decoding it (cache left untouched, as the reference's skip).
    pub fn skip(c: &mut Cursor<'_>, nencoded: usize) -> Result<(), Malformed> {
        for _ in 0..nencoded {
            match c.u16()? & 3 {
                2 => {
                    c.u8()?;
                }
                3 => {
                    c.u64()?;
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Does a packet header's verifier agree with this cache?
    pub fn verify(&self, v: &CacheVerifier) -> bool {
        if v.index == crate::format::packet::NO_VERIFIER {
            return true;
        }
        let i = v.index as usize;
        // (tables not allocated yet: every entry empty, every prediction 0)
        let (loc, pred) = match &self.tables {
            Some(t) if i < CACHE_SIZE => (t.loc[i], t.pred[i]),
            _ => (EMPTY, 0),
        };
        let loc = if loc == EMPTY { 0 } else { loc };
        i < CACHE_SIZE && pred == v.prediction && loc == ocaml_int(v.value) as u64
    }
}

/// An entry's date of last use: the id of the allocation that last used it, saturated at
/// `u32::MAX`. Half the memory of the reference's 63-bit ints, for a table that encoding
/// in a share writes at every frame; the same choices as the reference's for the first
/// 4,294,967,295 allocations of an output (past them the writer's choice of entry, which
/// a reader follows whatever it is, can differ from the reference's: the frames do not).
pub(crate) type Date = u32;

/// The date of allocation `alloc_id`.
#[inline(always)]
pub(crate) fn date_of(alloc_id: i64) -> Date {
    alloc_id.clamp(0, Date::MAX as i64) as Date
}

/// Saved cache entries, to undo an encoding (index, cache, date, next).
#[derive(Clone, Debug, Default)]
pub struct Journal {
    saved: Vec<(u16, u64, Date, u16)>,
}

impl Journal {
    pub fn clear(&mut self) {
        self.saved.clear()
    }
}

/// Encoder state of one stream: cache, the alloc id at each entry's last use, predictions.
#[derive(Clone)]
pub struct CacheWriter {
    cache: Box<[u64; CACHE_SIZE]>,
    date: Box<[Date; CACHE_SIZE]>,
    next: Box<[u16; CACHE_SIZE]>,
    next_verify: u16,
}

/// A zeroed fixed-size table on the heap (no 128 KiB array on the stack).
pub(crate) fn table<T: Copy + Default>() -> Box<[T; CACHE_SIZE]> {
    table_of(T::default())
}

/// A fixed-size table of `v` on the heap.
fn table_of<T: Copy>(v: T) -> Box<[T; CACHE_SIZE]> {
    vec![v; CACHE_SIZE]
        .into_boxed_slice()
        .try_into()
        .unwrap_or_else(|_| unreachable!())
}

impl CacheWriter {
    /// Fault its tables' pages in now (see [`crate::format::buf::fault_in`]).
    pub(crate) fn fault_in(&mut self) {
        crate::format::buf::fault_in(&mut self.cache[..]);
        crate::format::buf::fault_in(&mut self.date[..]);
        crate::format::buf::fault_in(&mut self.next[..]);
    }
}

impl Default for CacheWriter {
    fn default() -> Self {
        CacheWriter {
            cache: table(),
            date: table(),
            next: table(),
            next_verify: 4242,
        }
    }
}

impl CacheWriter {
    /// The verifier for the next packet header (index steps by 5413 mod 2^14 from 4242).
    pub fn next_verifier(&mut self) -> CacheVerifier {
        let ix = self.next_verify;
        self.next_verify = ((ix as usize + 5413) & (CACHE_SIZE - 1)) as u16;
        CacheVerifier {
            index: ix,
            prediction: self.next[ix as usize],
            value: self.cache[ix as usize],
        }
    }

    #[inline(always)]
    pub(crate) fn put_hit(b: &mut WriteBuf, bucket: usize, ncorrect: usize) {
        match ncorrect {
            0 => b.u16((bucket << 2) as u16),
            1 => b.u16(((bucket << 2) | 1) as u16),
            n => {
                b.u16(((bucket << 2) | 2) as u16);
                b.u8(n as u8)
            }
        }
    }

    /// The tables, to encode in a share of them ([`crate::pipeline::share::Share`]): codes, dates of
    /// last use, predictions.
    #[allow(clippy::type_complexity)]
    pub(crate) fn tables(
        &mut self,
    ) -> (
        &mut [u64; CACHE_SIZE],
        &mut [Date; CACHE_SIZE],
        &mut [u16; CACHE_SIZE],
    ) {
        (&mut *self.cache, &mut *self.date, &mut *self.next)
    }

    /// Follow the predictions from `predictor` while they give `frames[pos..end]`: the
    /// position of the first frame they miss (or `end`), `predictor` at the last they give.
    #[inline(always)]
    fn follow(
        frames: &[LocationCode],
        mut pos: usize,
        end: usize,
        predictor: &mut usize,
        cache: &[u64; CACHE_SIZE],
        next: &[u16; CACHE_SIZE],
    ) -> usize {
        const M: usize = CACHE_SIZE - 1;
        while pos < end {
            let pb = next[*predictor & M] as usize & M;
            if cache[pb] != frames[pos].0 {
                break;
            }
            *predictor = pb;
            pos += 1;
        }
        pos
    }

    /// In a run of predictions 16 frames long, at `pos`: when the last frames repeat every 1
    /// or 2 (recursion), they are in entries repeating so (a code is in one entry at most,
    /// but for 0, which every entry never filled holds) that predict each other, and
    /// predictions change nothing: the next frames are predicted exactly while they repeat
    /// the ones before. Returns the position after them, `predictor` set to the last entry.
    #[inline(never)]
    fn skip_recursion(
        frames: &[LocationCode],
        pos: usize,
        end: usize,
        predictor: &mut usize,
        next: &[u16; CACHE_SIZE],
    ) -> usize {
        let f = |j: usize| frames[j].0;
        let p = if f(pos - 1) == 0 || f(pos - 2) == 0 {
            return pos;
        } else if f(pos - 1) == f(pos - 2) {
            1
        } else if f(pos - 1) == f(pos - 3) && f(pos - 2) == f(pos - 4) {
            2
        } else {
            return pos;
        };
        let m = same_run(&frames[pos..end], &frames[pos - p..end - p]);
        if p == 2 && m % 2 == 1 {
            // an odd number more: the run ends on the other entry
            *predictor = next[*predictor & (CACHE_SIZE - 1)] as usize & (CACHE_SIZE - 1);
        }
        pos + m
    }

    /// Undo the changes recorded in `journal` (latest first).
    pub fn rollback(&mut self, journal: &mut Journal) {
        while let Some((i, c, d, n)) = journal.saved.pop() {
            let i = i as usize;
            self.cache[i] = c;
            self.date[i] = d;
            self.next[i] = n;
        }
    }

    /// Encode `frames` (the new frames, caller-first) while the buffer stays within `limit`
    /// bytes (the reference passes its position + 4096 - 10). Calls `on_miss(i, at)` for every
    /// frame `i` that misses the cache (its locations must be logged), whose code's 8 bytes
    /// are at `at` in `b`. Returns (codewords
    /// written, frames encoded): fewer frames than given means the backtrace was truncated.
    /// `LONG`: for many new frames, where deep recursion shows; its long runs of predicted
    /// frames are then counted without following each prediction (see
    /// [`CacheWriter::skip_recursion`]), for the same bytes.
    pub fn encode<const LONG: bool>(
        &mut self,
        b: &mut WriteBuf,
        alloc_id: i64,
        frames: &[LocationCode],
        limit: usize,
        journal: Option<&mut Journal>,
        on_miss: impl FnMut(usize, usize),
    ) -> (usize, usize) {
        let mut none = Journal::default();
        match journal {
            Some(j) => self.encode_with::<true, LONG, false>(
                b,
                alloc_id,
                frames,
                &mut [],
                limit,
                j,
                on_miss,
            ),
            None => self.encode_with::<false, LONG, false>(
                b,
                alloc_id,
                frames,
                &mut [],
                limit,
                &mut none,
                on_miss,
            ),
        }
    }

    /// [`CacheWriter::encode`] (no journal; with the recursion shortcut) with `hints`, one
    /// per frame: the entry the frame was in when last encoded (any value will do: hints
    /// are checked, and only save following predictions one after the other, each waiting
    /// for the last). On return each encoded frame's hint is its entry (in its low 14 bits),
    /// but for frames of a run of recursion counted without looking at them, whose hints
    /// are left as they were. With fewer hints than frames, this is [`CacheWriter::encode`].
    #[inline(never)]
    pub fn encode_hinted(
        &mut self,
        b: &mut WriteBuf,
        alloc_id: i64,
        frames: &[LocationCode],
        hints: &mut [u16],
        limit: usize,
        on_miss: impl FnMut(usize, usize),
    ) -> (usize, usize) {
        if hints.len() < frames.len() {
            return self.encode::<false>(b, alloc_id, frames, limit, None, on_miss);
        }
        let mut none = Journal::default();
        self.encode_with::<false, true, true>(b, alloc_id, frames, hints, limit, &mut none, on_miss)
    }

    /// [`CacheWriter::follow`] with hints: while each frame's hint is the entry the one
    /// before predicts and holds the frame, no load waits for another.
    #[inline(always)]
    fn follow_hinted(
        frames: &[LocationCode],
        hints: &mut [u16],
        mut pos: usize,
        end: usize,
        predictor: &mut usize,
        cache: &[u64; CACHE_SIZE],
        next: &[u16; CACHE_SIZE],
    ) -> usize {
        const M: usize = CACHE_SIZE - 1;
        let mut p = *predictor;
        while pos < end {
            let h = hints[pos] as usize & M;
            if (next[p & M] as usize & M == h) & (cache[h] == frames[pos].0) {
                p = h;
                pos += 1;
                continue;
            }
            let pb = next[p & M] as usize & M;
            if cache[pb] != frames[pos].0 {
                break;
            }
            hints[pos] = pb as u16;
            p = pb;
            pos += 1;
        }
        *predictor = p;
        pos
    }

    /// [`CacheWriter::encode`], recording every entry it changes in `journal` when `J`,
    /// looking for recursion in long runs of predictions when `R`.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn encode_with<const J: bool, const R: bool, const H: bool>(
        &mut self,
        b: &mut WriteBuf,
        alloc_id: i64,
        frames: &[LocationCode],
        hints: &mut [u16],
        limit: usize,
        journal: &mut Journal,
        mut on_miss: impl FnMut(usize, usize),
    ) -> (usize, usize) {
        const M: usize = CACHE_SIZE - 1;
        let (cache, date, next) = (&mut *self.cache, &mut *self.date, &mut *self.next);
        let today = date_of(alloc_id);
        let mut save = |i: usize,
                        cache: &[u64; CACHE_SIZE],
                        date: &[Date; CACHE_SIZE],
                        next: &[u16; CACHE_SIZE]| {
            if J {
                let i = i & M;
                journal.saved.push((i as u16, cache[i], date[i], next[i]));
            }
        };
        let n = frames.len();
        let mut pos = 0usize;
        let mut ncodes = 0usize;
        let mut predictor = 0usize;
        // code_no_prediction
        'outer: loop {
            if pos >= n || b.len() > limit {
                return (ncodes, pos);
            }
            let code = frames[pos];
            let slot = code.0;
            let (h1, h2) = buckets(code);
            let (h1, h2) = (h1 & M, h2 & M);
            let mut hit = if cache[h1] == slot {
                h1
            } else if cache[h2] == slot {
                h2
            } else {
                let bucket = if date[h1] < date[h2] { h1 } else { h2 };
                save(bucket, cache, date, next);
                save(predictor, cache, date, next);
                cache[bucket] = slot;
                date[bucket] = today;
                next[predictor & M] = bucket as u16;
                b.u16(((bucket << 2) | 3) as u16);
                b.u64(slot);
                on_miss(pos, b.len() - 8);
                if H {
                    hints[pos] = bucket as u16;
                }
                predictor = bucket;
                pos += 1;
                ncodes += 1;
                continue;
            };
            // code_cache_hit / code_with_prediction
            loop {
                save(hit, cache, date, next);
                save(predictor, cache, date, next);
                date[hit & M] = today;
                next[predictor & M] = hit as u16;
                let orig = hit;
                predictor = hit;
                if H {
                    hints[pos] = hit as u16;
                }
                pos += 1;
                ncodes += 1;
                // Predictions write nothing, so the reference's room check (made before each
                // predicted frame) has the same answer for the whole run: make it once.
                if b.len() + 2 > limit {
                    Self::put_hit(b, orig, 0);
                    return (ncodes, pos);
                }
                // the run of correctly predicted frames after the hit (at most 255)
                let start = pos;
                let end = n.min(pos + 255);
                // (16 frames first: only a run that long is looked at for recursion)
                let first = if R { end.min(pos + 16) } else { end };
                pos = if H {
                    Self::follow_hinted(frames, hints, pos, first, &mut predictor, cache, next)
                } else {
                    Self::follow(frames, pos, first, &mut predictor, cache, next)
                };
                if R && pos == first && pos < end {
                    // (the hints of the frames counted are left as they were: filling them
                    // in would cost what counting saves)
                    pos = Self::skip_recursion(frames, pos, end, &mut predictor, next);
                    pos = if H {
                        Self::follow_hinted(frames, hints, pos, end, &mut predictor, cache, next)
                    } else {
                        Self::follow(frames, pos, end, &mut predictor, cache, next)
                    };
                }
                Self::put_hit(b, orig, pos - start);
                if pos == n {
                    return (ncodes, pos);
                }
                let pb = next[predictor & M] as usize & M;
                if pos - start == 255 && cache[pb] == frames[pos].0 {
                    // a 256th correct prediction starts a new hit (code_cache_hit pb)
                    hit = pb;
                    continue;
                }
                continue 'outer;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn codes(v: &[u64]) -> Vec<LocationCode> {
        v.iter().map(|&x| LocationCode(x)).collect()
    }

    /// Encode a sequence of backtraces (each fully new), decode them back.
    fn round_trip(bts: &[Vec<LocationCode>]) {
        let mut w = CacheWriter::default();
        let mut r = CacheReader::default();
        for (id, bt) in bts.iter().enumerate() {
            let mut b = WriteBuf::default();
            let mut misses = 0;
            let (n, done) =
                w.encode::<false>(&mut b, id as i64, bt, usize::MAX, None, |_, _| misses += 1);
            assert_eq!(done, bt.len());
            let mut c = Cursor::new(b.bytes());
            r.decode(&mut c, n, 0, |_| true).unwrap();
            assert_eq!(c.remaining(), 0);
            assert_eq!(r.backtrace(), &bt[..]);
            let v = w.next_verifier();
            assert!(r.verify(&v));
        }
    }

    #[test]
    fn hits_predictions_and_misses() {
        let a = codes(&[10, 20, 30, 40, 50]);
        let b = codes(&[10, 20, 30, 41, 50]);
        let deep: Vec<LocationCode> = (0..1000).map(|i| LocationCode(7 + (i % 2))).collect();
        round_trip(&[a.clone(), a.clone(), b, a, deep.clone(), deep]);
    }

    #[test]
    fn long_runs_of_predictions_overflow_255() {
        let bt: Vec<LocationCode> = (0..600).map(|i| LocationCode(1000 + i)).collect();
        round_trip(&[bt.clone(), bt.clone(), bt]);
    }

    /// A small random generator: `rnd(n)` is below `n`.
    fn xorshift(mut x: u64) -> impl FnMut(u64) -> u64 {
        move |n| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        }
    }

    /// The transcribed reference encoder's tables, empty: codes, dates (OCaml ints),
    /// predictions.
    fn reference_tables() -> (Vec<u64>, Vec<i64>, Vec<u16>) {
        (
            vec![0u64; CACHE_SIZE],
            vec![0i64; CACHE_SIZE],
            vec![0u16; CACHE_SIZE],
        )
    }

    /// The reference's encoder transcribed frame by frame (`code_no_prediction`,
    /// `code_cache_hit`, `code_with_prediction`), without any of the shortcuts.
    fn reference_encode(
        cache: &mut [u64],
        date: &mut [i64],
        next: &mut [u16],
        id: i64,
        frames: &[LocationCode],
    ) -> Vec<u8> {
        let mut out = Vec::new();
        let (mut pos, mut predictor) = (0usize, 0usize);
        while pos < frames.len() {
            let code = frames[pos];
            let (h1, h2) = buckets(code);
            let mut hit = if cache[h1] == code.0 {
                h1
            } else if cache[h2] == code.0 {
                h2
            } else {
                let bucket = if date[h1] < date[h2] { h1 } else { h2 };
                cache[bucket] = code.0;
                date[bucket] = id;
                next[predictor] = bucket as u16;
                out.extend_from_slice(&(((bucket << 2) | 3) as u16).to_le_bytes());
                out.extend_from_slice(&code.0.to_le_bytes());
                predictor = bucket;
                pos += 1;
                continue;
            };
            loop {
                date[hit] = id;
                next[predictor] = hit as u16;
                predictor = hit;
                pos += 1;
                let mut ncorrect = 0;
                let mut again = false;
                while pos < frames.len() {
                    let pb = next[predictor] as usize;
                    if cache[pb] != frames[pos].0 {
                        break;
                    }
                    if ncorrect == 255 {
                        again = true;
                        break;
                    }
                    ncorrect += 1;
                    predictor = pb;
                    pos += 1;
                }
                match ncorrect {
                    0 | 1 => out.extend_from_slice(&(((hit << 2) | ncorrect) as u16).to_le_bytes()),
                    n => {
                        out.extend_from_slice(&(((hit << 2) | 2) as u16).to_le_bytes());
                        out.push(n as u8);
                    }
                }
                if again {
                    hit = next[predictor] as usize;
                    continue;
                }
                break;
            }
        }
        out
    }

    /// The reference's decoder transcribed codeword by codeword, frame by frame: the
    /// frames, and the entry each came from.
    fn reference_decode(
        loc: &mut [u64],
        pred: &mut [u16],
        bytes: &[u8],
        ncodes: usize,
    ) -> (Vec<LocationCode>, Vec<u16>) {
        let (mut frames, mut entries) = (Vec::new(), Vec::new());
        let mut c = Cursor::new(bytes);
        let mut predictor = 0usize;
        for _ in 0..ncodes {
            let cw = c.u16().unwrap();
            let bucket = (cw >> 2) as usize;
            pred[predictor] = bucket as u16;
            let n = match cw & 3 {
                0 => 0,
                1 => 1,
                2 => c.u8().unwrap() as usize,
                _ => {
                    loc[bucket] = ocaml_int(c.u64().unwrap()) as u64;
                    0
                }
            };
            let mut e = bucket;
            frames.push(LocationCode(loc[e]));
            entries.push(e as u16);
            for _ in 0..n {
                e = pred[e] as usize;
                frames.push(LocationCode(loc[e]));
                entries.push(e as u16);
            }
            predictor = e;
        }
        (frames, entries)
    }

    /// Backtraces full of recursion (runs of one code, of two alternating codes, of three;
    /// code 0 among them, which entries never filled hold), some longer than 255 frames,
    /// encode to exactly the reference's bytes and decode back to themselves.
    #[test]
    fn recursion_shortcuts_write_the_reference_bytes() {
        let mut rnd = xorshift(0x2545_f491_4f6c_dd1d);
        let mut w = CacheWriter::default();
        let mut r = CacheReader::default();
        let (mut cache, mut date, mut next) = reference_tables();
        let (mut loc, mut pred) = (vec![0u64; CACHE_SIZE], vec![0u16; CACHE_SIZE]);
        r.keep_slots(true);
        // (and a hinted encoder, its hints kept between backtraces)
        let mut h = CacheWriter::default();
        let mut hints: Vec<u16> = Vec::new();
        let mut bt: Vec<LocationCode> = Vec::new();
        for id in 0..3000i64 {
            bt.truncate(rnd(bt.len() as u64 + 1) as usize);
            for _ in 0..rnd(6) + 1 {
                let period = rnd(4) as usize;
                let len = [1, 3, 40, 300, 600][rnd(5) as usize];
                let cycle: Vec<LocationCode> = (0..period.max(1))
                    .map(|_| LocationCode(rnd(60) + (id < 1500) as u64))
                    .collect();
                for k in 0..len {
                    bt.push(cycle[k % cycle.len()]);
                }
                if rnd(3) == 0 {
                    // a break in the pattern
                    bt.push(LocationCode(rnd(60) + (id < 1500) as u64));
                }
            }
            let mut b = WriteBuf::default();
            // (with and without a journal, as the writer's two uses)
            let mut journal = Journal::default();
            let j = (id % 2 == 0).then_some(&mut journal);
            let (ncodes, done) = w.encode::<true>(&mut b, id, &bt, usize::MAX, j, |_, _| {});
            assert_eq!(done, bt.len());
            let want = reference_encode(&mut cache, &mut date, &mut next, id, &bt);
            assert_eq!(b.bytes(), &want[..], "backtrace {id}");
            hints.resize(bt.len(), 0);
            let mut hb = WriteBuf::default();
            h.encode_hinted(&mut hb, id, &bt, &mut hints, usize::MAX, |_, _| {});
            assert_eq!(hb.bytes(), &want[..], "backtrace {id}, hinted");
            // and they decode back (until code 0 comes in, at 1500, which the reference
            // encodes as hits on entries no miss filled, and which this reader refuses),
            // each frame's entry kept as the reference's decoder finds it
            if id < 1500 {
                let mut c = Cursor::new(b.bytes());
                r.decode(&mut c, ncodes, 0, |_| true).unwrap();
                assert_eq!(r.backtrace(), &bt[..], "backtrace {id}");
                assert_eq!(c.remaining(), 0);
                let (frames, entries) = reference_decode(&mut loc, &mut pred, b.bytes(), ncodes);
                assert_eq!(frames, bt, "backtrace {id}");
                assert_eq!(r.slots(), &entries[..], "backtrace {id}");
            }
        }
    }

    /// Dates are u32 (see [`Date`]): the reference's choices of entry up to allocation
    /// `u32::MAX`, and past it, where every date is the same, backtraces that still decode
    /// to their frames.
    #[test]
    fn dates_near_and_past_u32_max() {
        assert_eq!(date_of(-5), 0);
        assert_eq!(date_of(7), 7);
        assert_eq!(date_of(u32::MAX as i64 + 9), u32::MAX);
        let mut rnd = xorshift(0x1234_5678_9abc_def1);
        let mut w = CacheWriter::default();
        let mut r = CacheReader::default();
        let (mut cache, mut date, mut next) = reference_tables();
        let base = u32::MAX as i64 - 2000;
        for id in base..base + 4000 {
            // paths of 1-40 frames of 30,000 codes: entries evicted all along
            let bt: Vec<LocationCode> = (0..rnd(40) + 1)
                .map(|_| LocationCode(rnd(30_000) + 1))
                .collect();
            let mut b = WriteBuf::default();
            let (n, done) = w.encode::<false>(&mut b, id, &bt, usize::MAX, None, |_, _| {});
            assert_eq!(done, bt.len());
            let want = reference_encode(&mut cache, &mut date, &mut next, id, &bt);
            if id <= u32::MAX as i64 {
                assert_eq!(b.bytes(), &want[..], "backtrace {id}");
            }
            let mut c = Cursor::new(b.bytes());
            r.decode(&mut c, n, 0, |_| true).unwrap();
            assert_eq!(r.backtrace(), &bt[..], "backtrace {id}");
        }
        // (the table filled early on: misses after that chose between dated entries)
        assert!(cache.iter().filter(|&&c| c != 0).count() > CACHE_SIZE * 9 / 10);
    }

    /// Hints change nothing but speed: several streams of backtraces (sharing codes, with
    /// recursion, code 0, more codes than the cache holds, a byte budget) interleaved,
    /// each with its own hints (right, stale or wrong), encode to the reference's bytes,
    /// and each encoded frame's hint is then the entry that holds it.
    #[test]
    fn hints_write_the_reference_bytes() {
        let mut rnd = xorshift(0x9e37_79b9_7f4a_7c15);
        let mut plain = CacheWriter::default();
        let mut hinted = CacheWriter::default();
        let mut streams: Vec<(Vec<LocationCode>, Vec<u16>)> = vec![Default::default(); 4];
        let mut hits = 0;
        for id in 0..6000i64 {
            let s = rnd(4) as usize;
            let (bt, hints) = &mut streams[s];
            let keep = rnd(bt.len() as u64 + 1) as usize;
            bt.truncate(keep);
            for _ in 0..rnd(40) {
                let pool = if id < 3000 { 3000 } else { 40_000 };
                let c = if rnd(8) == 0 && !bt.is_empty() {
                    bt[bt.len() - 1 - rnd(bt.len().min(3) as u64) as usize]
                } else {
                    LocationCode(rnd(pool) * 7 + s as u64 * (rnd(2) * 3))
                };
                bt.push(c);
            }
            match rnd(10) {
                0 => hints.iter_mut().for_each(|h| *h = rnd(1 << 16) as u16),
                _ => hints.resize(bt.len(), 0),
            }
            hints.resize(bt.len().max(hints.len()), 0);
            let from = rnd(keep as u64 + 1) as usize;
            let limit = if rnd(50) == 0 { 40 } else { usize::MAX };
            let mut want = WriteBuf::default();
            let (n1, d1) =
                plain.encode::<false>(&mut want, id, &bt[from..], limit, None, |_, _| {});
            let mut got = WriteBuf::default();
            let before: Vec<u16> = hints[from..bt.len()].to_vec();
            let (n2, d2) = hinted.encode_hinted(
                &mut got,
                id,
                &bt[from..],
                &mut hints[from..],
                limit,
                |_, _| {},
            );
            assert_eq!((n1, d1), (n2, d2), "backtrace {id}");
            assert_eq!(got.bytes(), want.bytes(), "backtrace {id}");
            for k in from..from + d2 {
                if hints[k] == before[k - from] && bt[k].0 != 0 {
                    hits += 1;
                }
                let e = hints[k] as usize & (CACHE_SIZE - 1);
                // (a later miss of the same backtrace may have evicted it)
                if hinted.cache[e] != bt[k].0 {
                    assert!(
                        id >= 3000 || limit != usize::MAX,
                        "backtrace {id} frame {k}"
                    );
                }
            }
        }
        assert_eq!(plain.cache, hinted.cache);
        assert_eq!(plain.next, hinted.next);
        assert_eq!(plain.date, hinted.date);
        // (and the hints were right often enough for the fast path to be tested)
        assert!(hits > 20_000, "{hits}");
    }

    /// Mutual recursion of every length, each ending in another frame, twice: the second
    /// time every frame is predicted, through the entry each run ended on.
    #[test]
    fn runs_of_recursion_end_on_the_right_entry() {
        for len in 1..12usize {
            let mut bt: Vec<LocationCode> = vec![LocationCode(5)];
            bt.extend((0..len).map(|k| LocationCode(10 + (k % 2) as u64)));
            bt.push(LocationCode(20));
            bt.push(LocationCode(21));
            round_trip(&[bt.clone(), bt.clone(), bt[..len].to_vec(), bt.clone(), bt]);
        }
    }

    #[test]
    fn eviction_with_more_than_cache_size_codes() {
        let bts: Vec<Vec<LocationCode>> = (0..40)
            .map(|k| (0..1000).map(|i| LocationCode(k * 1000 + i + 1)).collect())
            .collect();
        let mut again = bts.clone();
        again.extend(bts);
        round_trip(&again);
    }

    #[test]
    fn budget_truncates_the_deep_end() {
        let mut w = CacheWriter::default();
        let bt: Vec<LocationCode> = (0..1000).map(|i| LocationCode(i * 977 + 3)).collect();
        let mut b = WriteBuf::default();
        let (n, done) = w.encode::<false>(&mut b, 0, &bt, MAX_LENGTH - MAX_ENTRY, None, |_, _| {});
        assert!(done < bt.len());
        assert!(b.len() <= MAX_LENGTH);
        let mut r = CacheReader::default();
        r.decode(&mut Cursor::new(b.bytes()), n, 0, |_| true)
            .unwrap();
        assert_eq!(r.backtrace(), &bt[..done]);
    }

    #[test]
    fn prefix_longer_than_previous_keeps_previous() {
        let mut w = CacheWriter::default();
        let mut r = CacheReader::default();
        let mut b = WriteBuf::default();
        let (n, _) = w.encode::<false>(&mut b, 0, &codes(&[1, 2, 3]), usize::MAX, None, |_, _| {});
        r.decode(&mut Cursor::new(b.bytes()), n, 0, |_| true)
            .unwrap();
        let mut b = WriteBuf::default();
        let (n, _) = w.encode::<false>(&mut b, 1, &codes(&[9]), usize::MAX, None, |_, _| {});
        r.decode(&mut Cursor::new(b.bytes()), n, 10, |_| true)
            .unwrap();
        assert_eq!(r.backtrace(), &codes(&[1, 2, 3])[..]);
        // the cache still learned code 9
        let mut b = WriteBuf::default();
        let (n, _) = w.encode::<false>(&mut b, 2, &codes(&[9]), usize::MAX, None, |_, _| {
            panic!("9 must hit")
        });
        r.decode(&mut Cursor::new(b.bytes()), n, 0, |_| true)
            .unwrap();
        assert_eq!(r.backtrace(), &codes(&[9])[..]);
    }

    #[test]
    fn undefined_codes_and_empty_entries_are_errors() {
        let mut w = CacheWriter::default();
        let mut b = WriteBuf::default();
        let (n, _) = w.encode::<false>(&mut b, 0, &codes(&[5]), usize::MAX, None, |_, _| {});
        let mut r = CacheReader::default();
        let e = r.decode(&mut Cursor::new(b.bytes()), n, 0, |c| c.0 != 5);
        assert_eq!(e, Err(Malformed::UndefinedLocation { code: 5 }));
        // a hit on a bucket no miss ever filled
        let mut r = CacheReader::default();
        let e = r.decode(&mut Cursor::new(&[0x10, 0x00]), 1, 0, |_| true);
        assert_eq!(e, Err(Malformed::EmptyCacheEntry));
    }

    /// A miss: bucket, tag 3, then the code.
    fn miss(bucket: u16, code: u64) -> Vec<u8> {
        let mut v = ((bucket << 2) | 3).to_le_bytes().to_vec();
        v.extend_from_slice(&code.to_le_bytes());
        v
    }

    #[test]
    fn empty_is_told_from_every_ocaml_int() {
        let codes: Vec<LocationCode> = [0u64, 1, (1 << 62) - 1, u64::MAX, 0xdead_beef_0000]
            .iter()
            .map(|&v| LocationCode(ocaml_int(v) as u64))
            .chain([LocationCode(ocaml_int(1 << 62) as u64)])
            .collect();
        assert!(!any_empty(&codes));
        for k in 0..codes.len() {
            let mut c = codes.clone();
            c[k] = LocationCode(EMPTY);
            assert!(any_empty(&c), "EMPTY at {k}");
        }
    }

    #[test]
    fn a_prediction_never_set_leads_to_entry_0_and_is_checked_there() {
        // bucket 5 filled; its prediction was never set, so it predicts entry 0
        let hit_and_one = [(5u16 << 2 | 1) as u8, 0];
        let mut r = CacheReader::default();
        r.decode(&mut Cursor::new(&miss(5, 7)), 1, 0, |_| true)
            .unwrap();
        let e = r.decode(&mut Cursor::new(&hit_and_one), 1, 0, |_| true);
        assert_eq!(e, Err(Malformed::EmptyCacheEntry), "entry 0 is empty");
        // once entry 0 holds a code, the same prediction gives it
        let mut r = CacheReader::default();
        let first = [miss(0, 9), miss(5, 7)].concat();
        r.decode(&mut Cursor::new(&first), 2, 0, |_| true).unwrap();
        assert_eq!(r.backtrace(), &codes(&[9, 7])[..]);
        r.decode(&mut Cursor::new(&hit_and_one), 1, 0, |_| true)
            .unwrap();
        assert_eq!(r.backtrace(), &codes(&[7, 9])[..]);
    }

    #[test]
    fn bucket_hashes_match_ocaml() {
        // ((code * 0x4983723) lsr 11) land 0x3fff, computed by hand for code = 0x5555_0000_1234
        let code = 0x5555_0000_1234u64;
        let p1 = code.wrapping_mul(0x4983723) & ((1 << 63) - 1);
        let p2 = code.wrapping_mul(0xfdea731) & ((1 << 63) - 1);
        assert_eq!(
            buckets(LocationCode(code)),
            (
                ((p1 >> 11) & 0x3fff) as usize,
                ((p2 >> 21) & 0x3fff) as usize
            )
        );
    }
}
