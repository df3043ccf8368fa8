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

/// [`common_prefix`] for long runs: compared 16 frames at a time first,
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
    m + common_prefix(&a[m..], &b[m..])
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

mod tables;
use tables::{ReaderTables, Tables};

/// The error of a backtrace longer than [`MAX_FRAMES`].
fn too_long(len: usize) -> Malformed {
    Malformed::BadValue {
        field: "backtrace length",
        value: len as i64,
    }
}

/// The next codeword's entry, tag and count of predicted frames (a miss or a hit, and the
/// hit's predictions), the entry made what `pred`'s entry predicts.
#[inline(always)]
fn codeword<T: Tables>(
    t: &mut T,
    c: &mut Cursor<'_>,
    pred: usize,
) -> Result<(usize, u16, usize), Malformed> {
    const M: usize = CACHE_SIZE - 1;
    let cw = c.u16()?;
    let bucket = (cw >> 2) as usize & M;
    let tag = cw & 3;
    t.set_pred(pred & M, bucket as u16);
    let n = match tag {
        0 | 3 => 0,
        1 => 1,
        _ => c.u8()? as usize,
    };
    Ok((bucket, tag, n))
}

/// A miss's code, which a location event must have defined, put in entry `bucket`.
#[inline(always)]
fn missed<T: Tables>(
    t: &mut T,
    c: &mut Cursor<'_>,
    bucket: usize,
    defined: &impl Fn(LocationCode) -> bool,
) -> Result<u64, Malformed> {
    let lit = ocaml_int(c.u64()?) as u64;
    if !defined(LocationCode(lit)) {
        return Err(Malformed::UndefinedLocation { code: lit });
    }
    t.set_loc(bucket, lit);
    Ok(lit)
}

/// A reader's tables, made at its first backtrace (sparse ones if asked for).
#[inline(always)]
fn made(tables: &mut Option<ReaderTables>, sparse: bool) -> &mut ReaderTables {
    tables.get_or_insert_with(|| match sparse {
        true => ReaderTables::default(),
        false => ReaderTables::dense(),
    })
}

/// The decoder's room: the last backtrace, its length, its frames' entries (when kept)
/// and the scratch room.
type BacktraceRoom<'a> = (
    &'a mut Vec<LocationCode>,
    &'a mut usize,
    &'a mut Option<Vec<u16>>,
    &'a mut Vec<LocationCode>,
);

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
    /// Sparse tables until many entries are used ([`CacheReader::sparse`]).
    sparse: bool,
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
            sparse: false,
        }
    }
}

impl CacheReader {
    /// The backtrace decoded last (caller-first).
    #[inline]
    pub fn backtrace(&self) -> &[LocationCode] {
        &self.last[..self.last_len]
    }

    /// Keep the cache in sparse tables until the stream uses many entries (a merge of
    /// thousands of inputs keeps a reader per input; alone, dense tables are faster).
    pub fn sparse(&mut self, yes: bool) {
        self.sparse = yes;
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
        let t = made(&mut self.tables, self.sparse);
        let (last, last_len, slots, scratch) = (
            &mut self.last,
            &mut self.last_len,
            &mut self.slots,
            &mut self.scratch,
        );
        match t {
            ReaderTables::Dense(d) => Self::decode_in(
                d,
                c,
                nencoded,
                common_prefix,
                (last, last_len, slots, scratch),
                defined,
            ),
            ReaderTables::Sparse(s) => {
                let r = Self::decode_in(
                    s,
                    c,
                    nencoded,
                    common_prefix,
                    (last, last_len, slots, scratch),
                    defined,
                );
                t.settle();
                r
            }
        }
    }

    /// [`CacheReader::decode`] in tables `t`, into the reader's backtrace, its length,
    /// its entries and its scratch room.
    #[inline(always)]
    fn decode_in<T: Tables>(
        t: &mut T,
        c: &mut Cursor<'_>,
        nencoded: usize,
        common_prefix: u64,
        (last, last_len, slots, scratch): BacktraceRoom<'_>,
        defined: impl Fn(LocationCode) -> bool,
    ) -> Result<(), Malformed> {
        if common_prefix <= *last_len as u64 {
            let start = common_prefix as usize;
            if nencoded == 0 {
                *last_len = start;
                return Ok(());
            }
            let r = match slots {
                None => Self::decode_into::<false, T>(
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
            *last_len = *r.as_ref().unwrap_or(&(common_prefix as usize));
            r.map(|_| ())
        } else {
            // The rare case of a common prefix longer than the previous backtrace: decode
            // into the scratch room (the cache learns; the backtrace stays as it was).
            Self::decode_apart(t, c, nencoded, scratch, None, 0, defined).map(|_| ())
        }
    }

    /// [`CacheReader::decode_into`], out of line.
    #[inline(never)]
    fn decode_apart<T: Tables>(
        t: &mut T,
        c: &mut Cursor<'_>,
        nencoded: usize,
        out: &mut Vec<LocationCode>,
        entries: Option<&mut Vec<u16>>,
        start: usize,
        defined: impl Fn(LocationCode) -> bool,
    ) -> Result<usize, Malformed> {
        match entries {
            Some(e) => Self::decode_into::<true, T>(t, c, nencoded, out, e, start, defined),
            None => {
                Self::decode_into::<false, T>(t, c, nencoded, out, &mut Vec::new(), start, defined)
            }
        }
    }

    /// Decode into `out[start..]` (growing it as needed, never shrinking); the new length.
    /// With `S`, `entries` (as long as `out`) gets the cache entry of each frame (without,
    /// it is left alone).
    #[inline(always)]
    fn decode_into<const S: bool, T: Tables>(
        t: &mut T,
        c: &mut Cursor<'_>,
        nencoded: usize,
        out: &mut Vec<LocationCode>,
        entries: &mut Vec<u16>,
        start: usize,
        defined: impl Fn(LocationCode) -> bool,
    ) -> Result<usize, Malformed> {
        let mut pred = 0usize;
        let mut len = start;
        for _ in 0..nencoded {
            if len > MAX_FRAMES {
                return Err(too_long(len));
            }
            let (bucket, tag, n) = codeword(t, c, pred)?;
            if out.len() < len + n + 1 {
                // (grown by an eighth, exactly: a reader is kept per input, and a merge
                // of thousands of inputs holds thousands)
                let need = len + n + 1;
                let room = need + need / 8;
                out.reserve_exact(room.saturating_sub(out.len()));
                out.resize(room, LocationCode(0));
                if S {
                    entries.reserve_exact(room.saturating_sub(entries.len()));
                    entries.resize(room, 0);
                }
            }
            let slots = &mut out[len..len + n + 1];
            let ents: &mut [u16] = if S {
                &mut entries[len..len + n + 1]
            } else {
                &mut []
            };
            if tag == 3 {
                let lit = missed(t, c, bucket, &defined)?;
                slots[0] = LocationCode(lit);
                if S {
                    ents[0] = bucket as u16;
                }
                len += 1;
                pred = bucket;
            } else {
                let mut p = bucket;
                slots[0] = LocationCode(t.loc(p));
                if S {
                    ents[0] = p as u16;
                }
                // An entry no miss filled holds EMPTY. Predictions lead only to entries
                // checked when they were set, or to entry 0 (the initial prediction): only
                // the hit itself and, while entry 0 is empty, the predicted frames need
                // looking at.
                let hit_empty = slots[0].0 == EMPTY;
                let predicted_empty = if t.loc(0) == EMPTY {
                    Self::predicted::<S, true, T>(t, &mut p, slots, ents)
                } else {
                    Self::predicted::<S, false, T>(t, &mut p, slots, ents)
                };
                if hit_empty || predicted_empty {
                    return Err(Malformed::EmptyCacheEntry);
                }
                len += n + 1;
                pred = p;
            }
        }
        if len > MAX_FRAMES {
            return Err(too_long(len));
        }
        Ok(len)
    }

    /// The frames a hit in entry `p` predicts, into `slots[1..]` (their entries into
    /// `ents[1..]` with `S`), `p` left at the last; whether one is not a code (looked at only
    /// with `CHECK`: false without).
    /// Recursion predicts an entry from itself: the rest of the run is then that frame.
    #[inline(always)]
    fn predicted<const S: bool, const CHECK: bool, T: Tables>(
        t: &T,
        p: &mut usize,
        slots: &mut [LocationCode],
        ents: &mut [u16],
    ) -> bool {
        const M: usize = CACHE_SIZE - 1;
        let mut acc = 0u64;
        let mut q = *p;
        for j in 1..slots.len() {
            let next = t.pred(q) as usize & M;
            if next == q {
                // (the frame is the one before, already checked)
                slots[j..].fill(LocationCode(t.loc(q)));
                if S {
                    ents[j..slots.len()].fill(q as u16);
                }
                break;
            }
            q = next;
            let v = t.loc(q);
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

    /// [`CacheReader::decode`] without the frames: the cache, its predictions and the
    /// backtrace's length change as there, and every error is the same, but the frames are
    /// neither looked up nor stored, and [`CacheReader::backtrace`] is left meaningless.
    /// For a reader that checks a trace and needs no backtraces: it must not decode after.
    #[inline(always)]
    pub(crate) fn walk(
        &mut self,
        c: &mut Cursor<'_>,
        nencoded: usize,
        common_prefix: u64,
        defined: impl Fn(LocationCode) -> bool,
    ) -> Result<(), Malformed> {
        let t = made(&mut self.tables, self.sparse);
        // (as in decode_in: a prefix longer than the last backtrace leaves its length)
        let start = match common_prefix <= self.last_len as u64 {
            true => common_prefix as usize,
            false => 0,
        };
        let r = match t {
            ReaderTables::Dense(d) => Self::walk_in(d, c, nencoded, start, defined),
            ReaderTables::Sparse(s) => {
                let r = Self::walk_in(s, c, nencoded, start, defined);
                t.settle();
                r
            }
        };
        if common_prefix <= self.last_len as u64 {
            self.last_len = *r.as_ref().unwrap_or(&start);
        }
        r.map(|_| ())
    }

    /// [`CacheReader::decode_into`]'s steps but the frames': the length it would return.
    #[inline(always)]
    fn walk_in<T: Tables>(
        t: &mut T,
        c: &mut Cursor<'_>,
        nencoded: usize,
        start: usize,
        defined: impl Fn(LocationCode) -> bool,
    ) -> Result<usize, Malformed> {
        const M: usize = CACHE_SIZE - 1;
        let mut pred = 0usize;
        let mut len = start;
        for _ in 0..nencoded {
            if len > MAX_FRAMES {
                return Err(too_long(len));
            }
            let (bucket, tag, n) = codeword(t, c, pred)?;
            if tag == 3 {
                missed(t, c, bucket, &defined)?;
                len += 1;
                pred = bucket;
                continue;
            }
            // (decode_into's checks: the hit's entry, and while entry 0 is empty the
            // predicted ones. A prediction leads to an entry that was filled when it was
            // set, or to entry 0, the first: only that one can be empty.)
            let check = t.loc(0) == EMPTY;
            let mut bad = t.loc(bucket) == EMPTY;
            let mut q = bucket;
            for _ in 0..n {
                let next = t.pred(q) as usize & M;
                if next == q {
                    break;
                }
                q = next;
                bad |= check & (q == 0);
            }
            if bad {
                return Err(Malformed::EmptyCacheEntry);
            }
            len += n + 1;
            pred = q;
        }
        if len > MAX_FRAMES {
            return Err(too_long(len));
        }
        Ok(len)
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
            Some(t) if i < CACHE_SIZE => t.entry(i),
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
                let start = pos;
                pos = Self::run::<R, H>(frames, hints, pos, &mut predictor, cache, next);
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

    /// The run of correctly predicted frames after a hit at `pos - 1` (at most 255): the
    /// position of the first frame not predicted (or the run's end), `predictor` at the
    /// last predicted. With `R`, a run of 16 is looked at for recursion and counted fast.
    #[inline(always)]
    fn run<const R: bool, const H: bool>(
        frames: &[LocationCode],
        hints: &mut [u16],
        pos: usize,
        predictor: &mut usize,
        cache: &[u64; CACHE_SIZE],
        next: &[u16; CACHE_SIZE],
    ) -> usize {
        let end = frames.len().min(pos + 255);
        // (16 frames first: only a run that long is looked at for recursion)
        let first = if R { end.min(pos + 16) } else { end };
        let mut pos = if H {
            Self::follow_hinted(frames, hints, pos, first, predictor, cache, next)
        } else {
            Self::follow(frames, pos, first, predictor, cache, next)
        };
        if R && pos == first && pos < end {
            // (the hints of the frames counted are left as they were: filling them in
            // would cost what counting saves)
            pos = Self::skip_recursion(frames, pos, end, predictor, next);
            pos = if H {
                Self::follow_hinted(frames, hints, pos, end, predictor, cache, next)
            } else {
                Self::follow(frames, pos, end, predictor, cache, next)
            };
        }
        pos
    }
}

/// Length of the longest common prefix of two backtraces.
#[inline]
pub fn common_prefix(a: &[LocationCode], b: &[LocationCode]) -> usize {
    // (shared prefixes are short where this is called often: a plain loop beats memcmp)
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

#[cfg(test)]
mod tests;
