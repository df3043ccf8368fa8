//! A share of one domain's backtrace cache for one of several sources merged into it, in
//! which the source encodes each backtrace whole, whatever was written before it.
//!
//! The reader follows whatever entries the writer names, so a writer may give each source
//! its own range of entries. Nothing but the source's own backtraces then changes its range
//! (entry 0, which the first codeword of every backtrace re-points, belongs to nobody): an
//! encoding depends on the source's earlier backtraces only, not on the merged order, and
//! a merge's decoding threads make them ahead, each stream in its share. Sent whole (no
//! frames shared with the previous allocation, another source's), a backtrace that shares
//! a prefix with the source's previous one is one hit and a run of predictions for that
//! prefix, counted without looking at its frames: the path of entries the last one took is
//! still there. A position is looked at only when something this source wrote since may
//! have changed it (the positions in "doubt"), as in a path that holds one entry twice.

use crate::format::backtrace::{date_of, table, CacheWriter, Date, CACHE_SIZE};
use crate::format::buf::WriteBuf;
use crate::format::event::LocationCode;

const M: usize = CACHE_SIZE - 1;

/// Paths up to this long have the positions in a changed entry found and doubted; longer
/// ones are tangled (see [`Share::tangled`]).
const SCAN_MAX: usize = 1024;

/// Past 256 positions, an encoding finds the positions of changed entries this many times
/// at most (each a look at the whole path); then it tangles, which costs about as much
/// once (a path holding many entries twice would otherwise be looked at whole for each).
const SCANS_MAX: u32 = 4;

/// Which share of a domain's cache a source writes in: `index` of `count` equal ranges of
/// the entries after entry 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShareOf {
    pub index: u16,
    pub count: u16,
}

/// One share: its range of entries, and the path of entries its last backtrace took.
#[derive(Clone, Debug)]
pub struct Share {
    lo: usize,
    len: usize,
    /// The path: the entry of each position of the last backtrace (whose frames are the
    /// next backtrace's, as far as it keeps them).
    at: Vec<u16>,
    /// Per entry, how many positions of the path are in it.
    uses: Box<[u32; CACHE_SIZE]>,
    /// Per position, a bit set when its entry might no longer hold its frame, or the entry
    /// before might no longer predict it. A clear bit at `p > 0` guarantees
    /// `next[at[p-1]] == at[p]` and that `at[p]` holds the frame, unless `tangled`.
    doubt: Vec<u64>,
    /// Set when an encoding changed an entry that more than one position of a long path
    /// is in (a path holding an entry twice, or an entry it was in given another code):
    /// rather than finding those positions, the rest of the encoding looks at every frame
    /// and the bits are found again at its end. (A short path's positions are found.)
    tangled: bool,
    /// How many times this encoding found the positions in an entry (see [`SCANS_MAX`]).
    scans: u32,
    /// Per entry of the input's cache, the entry here of the frame last seen in it.
    xlat: Box<[u16; CACHE_SIZE]>,
    /// The last encoding, when it was of the path as it is and left the tables and the
    /// path as it found them (but for dates and entry 0): encoding that path again from
    /// here gives the same codewords ([`Share::encode`]).
    memo: Memo,
    /// (tests: never take a shortcut, to compare the shortcuts' encodings with)
    #[cfg(test)]
    long_way: bool,
}

/// An encoding that the same backtrace, encoded again, repeats (see [`Share::memo`]).
#[derive(Clone, Debug, Default)]
struct Memo {
    valid: bool,
    bytes: Vec<u8>,
    codes: usize,
    /// The entry each codeword names (all hits), in order.
    hits: Vec<u16>,
    /// Before the encoding: the path, its doubts, and the prediction of each entry in it.
    at: Vec<u16>,
    doubt: Vec<u64>,
    next: Vec<u16>,
}

impl Share {
    pub fn new(of: ShareOf) -> Share {
        let count = of.count.max(1) as usize;
        let len = (CACHE_SIZE - 1) / count;
        assert!((of.index as usize) < count && len > 0, "bad share {of:?}");
        Share {
            lo: 1 + of.index as usize * len,
            len,
            at: Vec::new(),
            uses: table(),
            doubt: Vec::new(),
            tangled: false,
            scans: 0,
            xlat: table(),
            memo: Memo::default(),
            #[cfg(test)]
            long_way: false,
        }
    }

    /// The range's two candidate entries for a code. (Not the reference's hashes: scaled
    /// down to a share, they crowd neighbouring codes into few entries.)
    #[inline(always)]
    fn candidates(&self, code: u64) -> (usize, usize) {
        let x = code.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let y = (x ^ (x >> 29)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        let scale = |h: u64| self.lo + (((h >> 32) * self.len as u64) >> 32) as usize;
        (scale(x) & M, scale(y) & M)
    }

    #[inline(always)]
    fn set_doubt(&mut self, p: usize) {
        self.doubt[p >> 6] |= 1 << (p & 63);
    }

    /// The first doubted position in `from..to` (`to` if none).
    #[inline(always)]
    fn next_doubt(&self, from: usize, to: usize) -> usize {
        let mut w = from >> 6;
        let mut bits = self.doubt[w] & (!0u64 << (from & 63));
        loop {
            if bits != 0 {
                return ((w << 6) + bits.trailing_zeros() as usize).min(to);
            }
            w += 1;
            if w << 6 >= to {
                return to;
            }
            bits = self.doubt[w];
        }
    }

    /// Keep the path's first `keep` positions.
    #[inline(always)]
    fn truncate(&mut self, keep: usize) {
        if keep == self.at.len() {
            return;
        }
        self.memo.valid = false;
        for &e in &self.at[keep..] {
            self.uses[e as usize & M] -= 1;
        }
        self.at.truncate(keep);
        self.doubt.truncate(keep.div_ceil(64));
        if keep & 63 != 0 {
            if let Some(w) = self.doubt.last_mut() {
                *w &= (1u64 << (keep & 63)) - 1;
            }
        }
    }

    /// Append a position in entry `e`, which the entry before predicts. (Position 0 is
    /// always sent as a codeword, so its bit says nothing.)
    #[inline(always)]
    fn push(&mut self, e: usize) {
        if self.at.len() & 63 == 0 {
            self.doubt.push(0);
        }
        self.at.push(e as u16);
        self.uses[e & M] += 1;
    }

    /// Position `p` of the path is now in entry `e`, which the entry before predicts.
    #[inline(always)]
    fn replace(&mut self, p: usize, e: usize) {
        let old = self.at[p] as usize & M;
        if old != e {
            self.uses[old] -= 1;
            self.uses[e & M] += 1;
            self.at[p] = e as u16;
            // the next position was predicted from the old entry (`p` itself is in doubt
            // already: its entry changes only after the old one got another code)
            if p + 1 < self.at.len() {
                self.set_doubt(p + 1);
            }
        }
        self.doubt[p >> 6] &= !(1 << (p & 63));
    }

    /// Entry `x` (of the position before `p`, the one being placed) now predicts `e`: any
    /// other position in `x` no longer predicts the one after it.
    #[inline(always)]
    fn repoint(&mut self, next: &mut [u16; CACHE_SIZE], x: usize, e: usize, p: usize) {
        let old = next[x] as usize;
        next[x] = e as u16;
        if x != 0 && old != e && self.uses[x] > 1 {
            self.doubt_after(x, e, p);
        }
    }

    /// The positions in entry `x` among the 64 from `64 * w`, as bits.
    #[inline(always)]
    fn in_entry(&self, x: usize, w: usize) -> u64 {
        const LOW: u64 = 0x7fff_7fff_7fff_7fff;
        let lo = w << 6;
        let part = &self.at[lo.min(self.at.len())..self.at.len().min(lo + 64)];
        let one = x as u64 & 0xffff;
        let x = one * 0x0001_0001_0001_0001;
        let mut m = 0u64;
        // four positions at a time, as the lanes of a u64: a lane of `v` is 0 where the
        // position is in `x`; its top bit, set where it is not, is exact per lane (no
        // carry crosses lanes), and one multiplication gathers the four bits (from bits 0,
        // 16, 32 and 48 to 48-51; no other product reaches those)
        let mut quads = part.chunks_exact(4);
        for (q, c) in quads.by_ref().enumerate() {
            let v =
                (c[0] as u64 | (c[1] as u64) << 16 | (c[2] as u64) << 32 | (c[3] as u64) << 48) ^ x;
            let zero = !(((v & LOW) + LOW) | v) & !LOW;
            let bits = ((zero >> 15)
                .wrapping_mul(0x0001_0000_0000_0000 | 1 << 33 | 1 << 18 | 1 << 3))
                >> 48;
            m |= (bits & 0xf) << (4 * q);
        }
        let done = part.len() & !3;
        for (k, &a) in quads.remainder().iter().enumerate() {
            m |= ((a as u64 == one) as u64) << (done + k);
        }
        m
    }

    /// Whether the positions in an entry are to be found (else the share tangles).
    #[inline(always)]
    fn may_scan(&mut self) -> bool {
        let n = self.at.len();
        self.scans += 1;
        !self.tangled && (n <= 256 || (n <= SCAN_MAX && self.scans <= SCANS_MAX))
    }

    /// [`Share::repoint`] for an entry that more than one position is in: in a short path
    /// the positions after those are doubted, a long one is tangled.
    #[cold]
    #[inline(never)]
    fn doubt_after(&mut self, x: usize, e: usize, p: usize) {
        let n = self.at.len();
        if !self.may_scan() {
            self.tangled = true;
            return;
        }
        for w in 0..n.div_ceil(64) {
            let mut m = self.in_entry(x, w);
            while m != 0 {
                let j = (w << 6) + m.trailing_zeros() as usize;
                m &= m - 1;
                if j + 1 < n && j + 1 != p && self.at[j + 1] as usize != e {
                    self.set_doubt(j + 1);
                }
            }
        }
    }

    /// Entry `e` gets another code: the positions in it no longer hold theirs.
    #[inline(always)]
    fn overwrite(&mut self, e: usize) {
        if self.uses[e] > 0 {
            if !self.may_scan() {
                self.tangled = true;
            } else {
                for w in 0..self.doubt.len() {
                    self.doubt[w] |= self.in_entry(e, w);
                }
            }
        }
    }

    /// Doubt exactly the positions whose link does not hold in the tables as they are.
    #[cold]
    #[inline(never)]
    fn recheck(
        &mut self,
        frames: &[LocationCode],
        cache: &[u64; CACHE_SIZE],
        next: &[u16; CACHE_SIZE],
    ) {
        for w in self.doubt.iter_mut() {
            *w = 0;
        }
        for (p, f) in frames.iter().enumerate().take(self.at.len()) {
            let (a, e) = (
                self.at[p.saturating_sub(1)] as usize & M,
                self.at[p] as usize & M,
            );
            let good = p > 0 && a != 0 && e != 0 && next[a] as usize == e;
            if !(good && cache[e] == f.0) {
                self.set_doubt(p);
            }
        }
        self.tangled = false;
    }

    /// Encode a whole backtrace (`frames`, caller-first) in this share, whose previous one
    /// shared its first `keep` frames with it. `hints` (empty, or one per frame) are the
    /// frames' entries in the input's cache: checked, never trusted, they say where this
    /// share last put a frame that was in that entry there. Codewords are written to `b`
    /// while it stays within `limit` bytes; `on_miss(i, at)` is told of every frame `i`
    /// sent as a new code, whose 8 bytes are at `at` in `b`. Returns (codewords written,
    /// frames encoded): fewer than `frames.len()` only when `limit` stopped it.
    #[allow(clippy::too_many_arguments)]
    #[inline(never)]
    pub fn encode(
        &mut self,
        cw: &mut CacheWriter,
        b: &mut WriteBuf,
        alloc_id: i64,
        frames: &[LocationCode],
        hints: &[u16],
        keep: usize,
        limit: usize,
        mut on_miss: impl FnMut(usize, usize),
    ) -> (usize, usize) {
        self.truncate(keep.min(self.at.len()).min(frames.len()));
        let (cache, date, next) = cw.tables();
        let alloc_id = date_of(alloc_id);
        let n = frames.len();
        if let Some(done) = self.shortcut(cache, date, next, b, alloc_id, frames, limit) {
            return done;
        }
        // (an encoding of the path as it is may leave it and the tables as they are: the
        // state before it, to tell)
        let again = n == self.at.len() && !self.tangled;
        self.scans = 0;
        self.memo.valid = false;
        let b0 = b.len();
        if again {
            self.save_state(next);
        }
        let mut missed = false;
        let mut pos = 0;
        let mut ncodes = 0usize;
        let mut predictor = 0usize;
        while pos < n && b.len() <= limit {
            if pos == self.at.len() {
                // past the path: the rest of the frames are appended to it
                let (end, codes, missing) = self.append(
                    cache,
                    date,
                    next,
                    b,
                    alloc_id,
                    frames,
                    hints,
                    pos,
                    predictor,
                    limit,
                    &mut on_miss,
                );
                missed |= missing;
                pos = end;
                ncodes += codes;
                break;
            }
            // a position of the path, replayed: where the frame is is its entry in the
            // path, the entry here of its entry in the input, or one of its candidates
            let code = frames[pos].0;
            let mut e = self.at[pos] as usize & M;
            if e == 0 || cache[e] != code {
                let looked = self.look(hints, pos);
                match self.locate(cache, date, next, b, alloc_id, code, predictor, pos, looked) {
                    Ok(found) => e = found,
                    Err(sent) => {
                        on_miss(pos, b.len() - 8);
                        missed = true;
                        self.replace(pos, sent);
                        predictor = sent;
                        pos += 1;
                        ncodes += 1;
                        continue;
                    }
                }
            }
            let hit = e;
            date[hit] = alloc_id;
            self.repoint(next, predictor, hit, pos);
            self.replace(pos, hit);
            predictor = hit;
            pos += 1;
            ncodes += 1;
            let start = pos;
            (pos, predictor) = self.run_after_hit(cache, next, frames, hints, pos, predictor);
            CacheWriter::put_hit(b, hit, pos - start);
        }
        // (tangled, the doubts are found again before they are compared: whether the
        // encoding looked at every frame or skipped those known good, the codewords are
        // the same, given by the tables)
        if self.tangled {
            self.recheck(frames, cache, next);
        }
        if again && pos == n && !missed && self.left_as_found(next) {
            self.remember(&b.bytes()[b0..], ncodes);
        }
        (ncodes, pos)
    }

    /// The two shortcuts of [`Share::encode`], for the stream's last backtrace again: its
    /// path all known good (one hit and a run of n - 1, or of 255, and so on from every
    /// 256th position, while each codeword starts in `limit`, as the loop would write), or
    /// the codewords the last encoding of it wrote, from the tables it left as it found
    /// them (naming entries last used now). None: encode it in full.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn shortcut(
        &mut self,
        cache: &[u64; CACHE_SIZE],
        date: &mut [Date; CACHE_SIZE],
        next: &mut [u16; CACHE_SIZE],
        b: &mut WriteBuf,
        alloc_id: Date,
        frames: &[LocationCode],
        limit: usize,
    ) -> Option<(usize, usize)> {
        let n = frames.len();
        let hits = n.div_ceil(256);
        if n == self.at.len()
            && n >= 2
            && !self.tangled
            && b.len() + 3 * (hits - 1) <= limit
            && self.shortcuts()
        {
            let e = self.at[0] as usize & M;
            if e != 0 && cache[e] == frames[0].0 && self.next_doubt(1, n) == n {
                next[0] = e as u16;
                self.doubt[0] &= !1;
                date[e] = alloc_id;
                if n <= 256 {
                    CacheWriter::put_hit(b, e, n - 1);
                } else {
                    self.put_path(b, date, alloc_id);
                }
                return Some((hits, n));
            }
        }
        let shortcuts = self.shortcuts();
        let m = &mut self.memo;
        if m.valid
            && shortcuts
            && n == self.at.len()
            && b.len() + m.bytes.len() <= limit
            && cache[m.hits[0] as usize & M] == frames[0].0
        {
            b.extend(&m.bytes);
            for &e in &m.hits {
                date[e as usize & M] = alloc_id;
            }
            next[0] = m.hits[0];
            return Some((m.codes, n));
        }
        None
    }

    /// The run of predicted frames after a hit at `pos - 1` (at most 255): first in the
    /// path, where stretches known good are counted without looking at them, then beyond
    /// it, each predicted frame appended to it. Returns the position after the run and the
    /// predictor there.
    #[inline(always)]
    fn run_after_hit(
        &mut self,
        cache: &[u64; CACHE_SIZE],
        next: &[u16; CACHE_SIZE],
        frames: &[LocationCode],
        hints: &[u16],
        mut pos: usize,
        mut predictor: usize,
    ) -> (usize, usize) {
        let end = frames.len().min(pos + 255);
        while pos < end.min(self.at.len()) {
            if !self.tangled {
                let stop = self.next_doubt(pos, end.min(self.at.len()));
                if stop > pos {
                    pos = stop;
                    predictor = self.at[pos - 1] as usize & M;
                    continue;
                }
            }
            let e = next[predictor] as usize & M;
            if e == 0 || cache[e] != frames[pos].0 {
                break;
            }
            self.replace(pos, e);
            predictor = e;
            pos += 1;
        }
        if pos == self.at.len() {
            (pos, predictor, _) =
                self.append_predicted(cache, next, frames, hints, pos, end, predictor);
        }
        (pos, predictor)
    }

    /// Keep the path, its doubts and its entries' predictions as they are before an
    /// encoding, to tell afterwards whether it left them so.
    fn save_state(&mut self, next: &[u16; CACHE_SIZE]) {
        let m = &mut self.memo;
        m.at.clear();
        m.at.extend_from_slice(&self.at);
        m.doubt.clear();
        m.doubt.extend_from_slice(&self.doubt);
        m.next.clear();
        m.next.extend(self.at.iter().map(|&e| next[e as usize & M]));
    }

    /// Whether the encoding left the path, its doubts and predictions as
    /// [`Share::save_state`] found them.
    fn left_as_found(&self, next: &[u16; CACHE_SIZE]) -> bool {
        self.at == self.memo.at
            && self.doubt == self.memo.doubt
            && self
                .at
                .iter()
                .zip(&self.memo.next)
                .all(|(&e, &p)| next[e as usize & M] == p)
    }

    /// The entry of the frame at `p` in the input's cache (CACHE_SIZE if not known), and
    /// the entry here of the frame last seen in that entry (0 if none).
    #[inline(always)]
    fn look(&self, hints: &[u16], p: usize) -> (usize, usize) {
        match hints.get(p) {
            Some(&i) => (i as usize & M, self.xlat[i as usize & M] as usize & M),
            None => (CACHE_SIZE, 0),
        }
    }

    /// Append to the path the frames from `pos` to `end` (at most) that `predictor`'s entry
    /// and those after it predict: (where it stopped, the last entry, [`Share::look`] at
    /// where it stopped). Where the frame's entry in the input gives the entry here, the
    /// loads need not wait for each other.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn append_predicted(
        &mut self,
        cache: &[u64; CACHE_SIZE],
        next: &[u16; CACHE_SIZE],
        frames: &[LocationCode],
        hints: &[u16],
        mut pos: usize,
        end: usize,
        mut predictor: usize,
    ) -> (usize, usize, (usize, usize)) {
        while pos < end {
            let code = frames[pos].0;
            let (i, h) = self.look(hints, pos);
            let p = next[predictor] as usize & M;
            let e = if (p == h) & (cache[h] == code) & (h != 0) {
                h
            } else {
                if p == 0 || cache[p] != code {
                    return (pos, predictor, (i, h));
                }
                if i < CACHE_SIZE {
                    self.xlat[i] = p as u16;
                }
                p
            };
            self.push(e);
            predictor = e;
            pos += 1;
        }
        (pos, predictor, self.look(hints, pos))
    }

    /// The entry of `code` at position `pos` (after `predictor`'s) when the entry
    /// [`Share::look`] gave (`looked`) or one of its two candidates holds it; else (Err) the
    /// one it is put in, the one used less lately (the positions in it doubted), which
    /// `predictor` now predicts, and the miss codeword that says so, written to `b`. Found
    /// elsewhere than `looked` says, the entry is noted for the frame's entry in the input.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn locate(
        &mut self,
        cache: &mut [u64; CACHE_SIZE],
        date: &mut [Date; CACHE_SIZE],
        next: &mut [u16; CACHE_SIZE],
        b: &mut WriteBuf,
        alloc_id: Date,
        code: u64,
        predictor: usize,
        pos: usize,
        looked: (usize, usize),
    ) -> Result<usize, usize> {
        let (i, h) = looked;
        if h != 0 && cache[h] == code {
            return Ok(h);
        }
        // (code 0 is in every entry never filled, which the reader does not know: it is
        // never looked up)
        let (h1, h2) = self.candidates(code);
        let found = if code != 0 && cache[h1] == code {
            Ok(h1)
        } else if code != 0 && cache[h2] == code {
            Ok(h2)
        } else {
            let e = if date[h1] < date[h2] { h1 } else { h2 };
            self.overwrite(e);
            cache[e] = code;
            date[e] = alloc_id;
            self.repoint(next, predictor, e, pos);
            b.u16(((e << 2) | 3) as u16);
            b.u64(code);
            Err(e)
        };
        if i < CACHE_SIZE {
            self.xlat[i] = found.unwrap_or_else(|e| e) as u16;
        }
        found
    }

    /// [`Share::encode`] from `pos` (after `predictor`), the end of the path: each frame is
    /// appended to it. Returns (where it stopped, codewords written, whether any was a
    /// miss).
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn append(
        &mut self,
        cache: &mut [u64; CACHE_SIZE],
        date: &mut [Date; CACHE_SIZE],
        next: &mut [u16; CACHE_SIZE],
        b: &mut WriteBuf,
        alloc_id: Date,
        frames: &[LocationCode],
        hints: &[u16],
        mut pos: usize,
        mut predictor: usize,
        limit: usize,
        on_miss: &mut impl FnMut(usize, usize),
    ) -> (usize, usize, bool) {
        let n = frames.len();
        let (mut ncodes, mut missed) = (0usize, false);
        // (a run of predictions that stops at a frame has looked it up already)
        let mut looked = self.look(hints, pos);
        while pos < n && b.len() <= limit {
            let code = frames[pos].0;
            let hit =
                match self.locate(cache, date, next, b, alloc_id, code, predictor, pos, looked) {
                    Ok(found) => found,
                    Err(sent) => {
                        on_miss(pos, b.len() - 8);
                        missed = true;
                        self.push(sent);
                        predictor = sent;
                        pos += 1;
                        ncodes += 1;
                        looked = self.look(hints, pos);
                        continue;
                    }
                };
            date[hit] = alloc_id;
            self.repoint(next, predictor, hit, pos);
            self.push(hit);
            predictor = hit;
            pos += 1;
            ncodes += 1;
            // the run of predicted frames after the hit (at most 255)
            let start = pos;
            let end = n.min(pos + 255);
            (pos, predictor, looked) =
                self.append_predicted(cache, next, frames, hints, pos, end, predictor);
            CacheWriter::put_hit(b, hit, pos - start);
        }
        (pos, ncodes, missed)
    }

    /// The codewords of a path of more than 256 positions known good: a hit at every
    /// 256th and a run of the ones after it.
    #[cold]
    #[inline(never)]
    fn put_path(&self, b: &mut WriteBuf, date: &mut [Date; CACHE_SIZE], alloc_id: Date) {
        let n = self.at.len();
        CacheWriter::put_hit(b, self.at[0] as usize & M, 255);
        for k in (256..n).step_by(256) {
            let e = self.at[k] as usize & M;
            date[e] = alloc_id;
            CacheWriter::put_hit(b, e, (n - 1 - k).min(255));
        }
    }

    /// Whether [`Share::encode`] may repeat a path without looking at it, or from memory.
    #[inline(always)]
    fn shortcuts(&self) -> bool {
        #[cfg(test)]
        return !self.long_way;
        #[cfg(not(test))]
        true
    }

    /// Keep `bytes` (`codes` codewords, all hits) as the encoding of the path again.
    #[cold]
    #[inline(never)]
    fn remember(&mut self, bytes: &[u8], codes: usize) {
        let m = &mut self.memo;
        m.bytes.clear();
        m.bytes.extend_from_slice(bytes);
        m.codes = codes;
        m.hits.clear();
        let mut k = 0;
        while k + 1 < bytes.len() {
            let w = u16::from_le_bytes([bytes[k], bytes[k + 1]]);
            m.hits.push(w >> 2);
            k += 2 + (w & 3 == 2) as usize;
        }
        m.valid = !m.hits.is_empty();
    }
}

#[cfg(test)]
impl Share {
    /// `uses` counts the positions of `at` in each entry.
    fn check_uses(&self) {
        let mut want = vec![0u32; CACHE_SIZE];
        for &a in &self.at {
            want[a as usize & M] += 1;
        }
        for (e, &n) in want.iter().enumerate() {
            assert_eq!(self.uses[e], n, "uses of entry {e}");
        }
    }
}

#[cfg(test)]
mod tests;
