//! Source locations and the location event's codec: 48-bit packed line/char fields and
//! move-to-front tables for file names (31) and, per file, definition names.

use crate::error::Malformed;
use crate::format::buf::{Cursor, WriteBuf};
use crate::format::event::LocationCode;
use std::collections::HashMap;
use std::fmt;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;

/// One source location (several make up one backtrace frame when code was inlined).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Location {
    /// The source file, as the compiler named it.
    pub filename: Arc<[u8]>,
    /// The line, from 1.
    pub line: u32,
    /// First column of the expression, from 0.
    pub start_char: u32,
    /// Column after its end.
    pub end_char: u32,
    /// The function (OCaml's definition name) the location is in.
    pub defname: Arc<[u8]>,
}

impl Location {
    /// What the writer substitutes for a location list too large to encode.
    pub fn unknown() -> Location {
        Location {
            filename: Arc::from(&b"<unknown>"[..]),
            line: 1,
            start_char: 1,
            end_char: 1,
            defname: Arc::from(&b"??"[..]),
        }
    }

    /// `defname@filename:line:start-end`, as the reference prints it.
    pub fn write_to(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.defname);
        out.push(b'@');
        out.extend_from_slice(&self.filename);
        use std::io::Write;
        let _ = write!(out, ":{}:{}-{}", self.line, self.start_char, self.end_char);
    }
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut v = Vec::new();
        self.write_to(&mut v);
        f.write_str(&String::from_utf8_lossy(&v))
    }
}

/// The locations of one code (caller-side first, as the runtime lists inlined frames).
pub type LocationList = Arc<[Location]>;

/// A fast hasher for integer keys (location codes, object ids).
#[derive(Default, Clone, Copy)]
pub struct IntHasher(u64);

impl Hasher for IntHasher {
    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(5) ^ b as u64).wrapping_mul(0x517c_c1b7_2722_0a95);
        }
    }
    #[inline]
    fn write_u64(&mut self, n: u64) {
        let h = (self.0 ^ n).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        self.0 = h ^ (h >> 29);
    }
    #[inline]
    fn write_u128(&mut self, n: u128) {
        self.write_u64(n as u64 ^ (n >> 64) as u64)
    }
    #[inline]
    fn write_u8(&mut self, n: u8) {
        self.write_u64(n as u64)
    }
    #[inline]
    fn write_u16(&mut self, n: u16) {
        self.write_u64(n as u64)
    }
    #[inline]
    fn write_u32(&mut self, n: u32) {
        self.write_u64(n as u64)
    }
    #[inline]
    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64)
    }
}

pub type IntMap<K, V> = HashMap<K, V, BuildHasherDefault<IntHasher>>;

/// Every code's locations, as defined by a trace's location events.
pub type LocationTable = IntMap<LocationCode, LocationList>;

/// Location lists shared by the readers of one merge: inputs of one executable define
/// the same codes alike, and a merge of thousands of them would hold thousands of copies.
#[derive(Default)]
pub(crate) struct LocationPool {
    lists: std::sync::Mutex<std::collections::HashSet<LocationList>>,
}

impl LocationPool {
    /// The pool's list equal to `locs`, which joins the pool if none is.
    pub(crate) fn intern(&self, locs: &LocationList) -> LocationList {
        let mut lists = self.lists.lock().unwrap_or_else(|e| e.into_inner());
        match lists.get(locs) {
            Some(l) => l.clone(),
            None => {
                lists.insert(locs.clone());
                locs.clone()
            }
        }
    }
}

/// Number of entries in a move-to-front table; code 31 means "new string follows".
const MTF_LEN: usize = 31;
const MTF_NEW: u8 = 31;

/// A move-to-front table of strings with a value per entry (front = code 0).
#[derive(Clone, Debug)]
struct Mtf<T> {
    entries: Vec<(Arc<[u8]>, T)>,
}

impl<T> Default for Mtf<T> {
    fn default() -> Self {
        // (empty until used: a reader has a table of names per file, most of them short,
        // and a merge of thousands of inputs has thousands of readers)
        Mtf {
            entries: Vec::new(),
        }
    }
}

impl<T> Mtf<T> {
    fn push(&mut self, k: Arc<[u8]>, v: T) -> Option<(Arc<[u8]>, T)> {
        let dropped = if self.entries.len() == MTF_LEN {
            self.entries.pop()
        } else {
            None
        };
        self.entries.insert(0, (k, v));
        dropped
    }
    fn move_to_front(&mut self, i: usize) {
        let e = self.entries.remove(i);
        self.entries.insert(0, e);
    }
    /// Encoder: the code for `k` (moving it to front), or `MTF_NEW` after pushing it (the
    /// table shares `k`, nothing is copied).
    fn encode(&mut self, k: &Arc<[u8]>, if_absent: impl FnOnce() -> T) -> u8 {
        match self
            .entries
            .iter()
            .position(|(e, _)| Arc::ptr_eq(e, k) || same_bytes(e, k))
        {
            Some(i) => {
                self.move_to_front(i);
                i as u8
            }
            None => {
                self.push(k.clone(), if_absent());
                MTF_NEW
            }
        }
    }
}

/// Whether two strings are equal, testing their last 8 bytes first: names in one table
/// often share a long start and a length (`src/module_12.ml`, `src/module_57.ml`), so
/// this usually answers without a full comparison.
#[inline]
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && (a.len() < 8 || tail8(a) == tail8(b)) && a == b
}

/// The last 8 bytes of a string of at least 8, as one word.
#[inline(always)]
fn tail8(s: &[u8]) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&s[s.len() - 8..]);
    u64::from_ne_bytes(w)
}

/// Per-stream MTF state of the location codec (one per domain).
#[derive(Clone, Debug, Default)]
pub struct LocationCodec {
    files: Mtf<Mtf<()>>,
}

/// Worst-case encoded size of a location list, as the reference writer bounds it.
fn size_bound(locs: &[Location]) -> usize {
    locs.iter().fold(8 + 1, |sz, l| {
        sz + 6 + (l.filename.len() + 1) + (l.defname.len() + 1)
    })
}

/// Location lists over this size (or longer than 255) are written as one `<unknown>`.
pub const MAX_LENGTH: usize = 4096;

impl LocationCodec {
    /// Decode the body of a location event.
    pub fn decode(
        &mut self,
        c: &mut Cursor<'_>,
    ) -> Result<(LocationCode, LocationList), Malformed> {
        let code = LocationCode::from_raw(c.u64()?);
        let n = c.u8()?;
        let mut locs = Vec::with_capacity(n as usize);
        for _ in 0..n {
            let low = c.u32()? as u64;
            let high = c.u16()? as u64;
            let enc = (high << 32) | low;
            let line = (enc & 0xfffff) as u32;
            let start_char = ((enc >> 20) & 0xff) as u32;
            let end_char = ((enc >> 28) & 0x3ff) as u32;
            let fcode = ((enc >> 38) & 0x1f) as u8;
            let dcode = ((enc >> 43) & 0x1f) as u8;
            if fcode == MTF_NEW {
                let s: Arc<[u8]> = Arc::from(c.string()?);
                // The format-1 encoder's quirk: a new file reuses the defname table of
                // the entry it pushes off the end.
                let defs = if self.files.entries.len() == MTF_LEN {
                    self.files.entries.pop().map(|(_, d)| d).unwrap_or_default()
                } else {
                    Mtf::default()
                };
                self.files.push(s, defs);
            } else if (fcode as usize) < self.files.entries.len() {
                self.files.move_to_front(fcode as usize);
            } else {
                return Err(Malformed::MtfEmptySlot {
                    table: "filename",
                    index: fcode,
                });
            }
            let (filename, defs) = &mut self.files.entries[0];
            let filename = filename.clone();
            if dcode == MTF_NEW {
                let s: Arc<[u8]> = Arc::from(c.string()?);
                defs.push(s, ());
            } else if (dcode as usize) < defs.entries.len() {
                defs.move_to_front(dcode as usize);
            } else {
                return Err(Malformed::MtfEmptySlot {
                    table: "defname",
                    index: dcode,
                });
            }
            let defname = defs.entries[0].0.clone();
            locs.push(Location {
                filename,
                line,
                start_char,
                end_char,
                defname,
            });
        }
        Ok((code, locs.into()))
    }

    /// Encode the body of a location event exactly as the reference writer does
    /// (clamping as memtrace HEAD does; oversized lists become `<unknown>`).
    pub fn encode(&mut self, b: &mut WriteBuf, code: LocationCode, locs: &[Location]) {
        let unknown;
        let locs = if locs.len() <= 255 && size_bound(locs) <= MAX_LENGTH {
            locs
        } else {
            unknown = [Location::unknown()];
            &unknown[..]
        };
        b.u64(code.0);
        b.u8(locs.len() as u8);
        for l in locs {
            let line = l.line.min(0xfffff) as u64;
            let start = l.start_char.min(0xff) as u64;
            let end = l.end_char.min(0x3ff) as u64;
            let fcode = self.files.encode(&l.filename, Mtf::default) as u64;
            let defs = &mut self.files.entries[0].1;
            let dcode = defs.encode(&l.defname, || ()) as u64;
            let enc = line | (start << 20) | (end << 28) | (fcode << 38) | (dcode << 43);
            b.u32(enc as u32);
            b.u16((enc >> 32) as u16);
            if fcode == MTF_NEW as u64 {
                b.string(&l.filename);
            }
            if dcode == MTF_NEW as u64 {
                b.string(&l.defname);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tail test only ever shortcuts a comparison: same answers as `==`, including
    /// strings under 8 bytes and strings that differ only at their start or end.
    #[test]
    fn same_bytes_agrees_with_equality() {
        let words: [&[u8]; 10] = [
            b"",
            b"a",
            b"abcdefg",
            b"abcdefgh",
            b"xbcdefgh",
            b"abcdefgx",
            b"src/module_12.ml",
            b"src/module_57.ml",
            b"lib/module_12.ml",
            b"src/module_12.ml",
        ];
        for a in words {
            for b in words {
                assert_eq!(same_bytes(a, b), a == b, "{a:?} {b:?}");
            }
        }
    }

    fn loc(file: &str, def: &str, line: u32) -> Location {
        Location {
            filename: Arc::from(file.as_bytes()),
            line,
            start_char: 3,
            end_char: 9,
            defname: Arc::from(def.as_bytes()),
        }
    }

    #[test]
    fn mtf_round_trip_many_files_and_defs() {
        let mut enc = LocationCodec::default();
        let mut dec = LocationCodec::default();
        let mut b = WriteBuf::default();
        let mut want = Vec::new();
        // 40 files forces eviction from the 31-entry file table.
        for i in 0..200u32 {
            let locs: Vec<Location> = (0..(i % 3 + 1))
                .map(|j| {
                    loc(
                        &format!("f{}.ml", (i * 7 + j) % 40),
                        &format!("d{}", (i + j) % 5),
                        i,
                    )
                })
                .collect();
            enc.encode(&mut b, LocationCode(i as u64 + 1), &locs);
            want.push((LocationCode(i as u64 + 1), locs));
        }
        let mut c = Cursor::new(b.bytes());
        for (code, locs) in want {
            let (c2, l2) = dec.decode(&mut c).unwrap();
            assert_eq!(c2, code);
            assert_eq!(&l2[..], &locs[..]);
        }
        assert_eq!(c.remaining(), 0);
    }

    #[test]
    fn mtf_codes_move_to_front() {
        let mut enc = LocationCodec::default();
        let mut b = WriteBuf::default();
        enc.encode(&mut b, LocationCode(1), &[loc("a.ml", "f", 1)]);
        enc.encode(&mut b, LocationCode(2), &[loc("b.ml", "g", 1)]);
        let start = b.len();
        enc.encode(&mut b, LocationCode(3), &[loc("a.ml", "f", 1)]);
        // code, count, 6 bytes with file code 1 (a.ml is second) and defname code 0, no strings
        assert_eq!(b.len() - start, 8 + 1 + 6);
        let enc48 = u32::from_le_bytes(b.bytes()[start + 9..start + 13].try_into().unwrap()) as u64
            | (u16::from_le_bytes(b.bytes()[start + 13..start + 15].try_into().unwrap()) as u64)
                << 32;
        assert_eq!((enc48 >> 38) & 0x1f, 1);
        assert_eq!((enc48 >> 43) & 0x1f, 0);
    }

    #[test]
    fn clamps_and_oversized_lists() {
        let mut enc = LocationCodec::default();
        let mut dec = LocationCodec::default();
        let mut b = WriteBuf::default();
        let mut l = loc("x.ml", "big", 0x1f_ffff);
        l.start_char = 300;
        l.end_char = 2311;
        enc.encode(&mut b, LocationCode(7), &[l]);
        let long = "y".repeat(5000);
        enc.encode(&mut b, LocationCode(8), &[loc(&long, "d", 1)]);
        let mut c = Cursor::new(b.bytes());
        let (_, l1) = dec.decode(&mut c).unwrap();
        assert_eq!(
            (l1[0].line, l1[0].start_char, l1[0].end_char),
            (0xfffff, 255, 1023)
        );
        let (_, l2) = dec.decode(&mut c).unwrap();
        assert_eq!(&l2[..], &[Location::unknown()]);
    }

    #[test]
    fn empty_slot_is_an_error() {
        let mut dec = LocationCodec::default();
        let mut b = WriteBuf::default();
        b.u64(1);
        b.u8(1);
        let enc: u64 = 5 << 38; // file code 5 of an empty table
        b.u32(enc as u32);
        b.u16((enc >> 32) as u16);
        assert_eq!(
            dec.decode(&mut Cursor::new(b.bytes())),
            Err(Malformed::MtfEmptySlot {
                table: "filename",
                index: 5
            })
        );
    }
}
