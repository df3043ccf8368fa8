//! Primitive little-endian reads and writes of the trace format: fixed-width integers,
//! OCaml-style vints, NUL-terminated strings. Reads never panic: running out is an `Err`.

use crate::error::Malformed;
use byteorder::{ByteOrder, LittleEndian};

/// Truncate a 64-bit value to OCaml's 63-bit `int`, as `Int64.to_int` does (sign from bit 62).
#[inline]
pub fn ocaml_int(v: u64) -> i64 {
    ((v << 1) as i64) >> 1
}

/// A read cursor over one packet's bytes.
#[derive(Clone, Debug)]
pub struct Cursor<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    pub fn new(data: &'a [u8]) -> Self {
        Cursor { data, pos: 0 }
    }
    #[inline]
    pub fn pos(&self) -> usize {
        self.pos
    }
    #[inline]
    pub fn remaining(&self) -> usize {
        self.data.len() - self.pos
    }
    #[inline(always)]
    fn take(&mut self, n: usize) -> Result<&'a [u8], Malformed> {
        if self.remaining() < n {
            return Err(Malformed::Truncated {
                needed: n as u64,
                available: self.remaining() as u64,
            });
        }
        let s = &self.data[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }
    #[inline(always)]
    pub fn u8(&mut self) -> Result<u8, Malformed> {
        match self.data.get(self.pos) {
            Some(&b) => {
                self.pos += 1;
                Ok(b)
            }
            None => Err(Malformed::Truncated {
                needed: 1,
                available: 0,
            }),
        }
    }
    #[inline(always)]
    pub fn u16(&mut self) -> Result<u16, Malformed> {
        Ok(LittleEndian::read_u16(self.take(2)?))
    }
    #[inline(always)]
    pub fn u32(&mut self) -> Result<u32, Malformed> {
        Ok(LittleEndian::read_u32(self.take(4)?))
    }
    #[inline(always)]
    pub fn u64(&mut self) -> Result<u64, Malformed> {
        Ok(LittleEndian::read_u64(self.take(8)?))
    }
    #[inline]
    pub fn f64(&mut self) -> Result<f64, Malformed> {
        Ok(f64::from_bits(self.u64()?))
    }
    /// A vint as OCaml reads it: u8 0..252, 253 + u16, 254 + i32 (sign-extended),
    /// 255 + u64 truncated to 63 bits.
    #[inline]
    pub fn vint(&mut self) -> Result<i64, Malformed> {
        let c = self.u8()?;
        match c {
            0..=252 => Ok(c as i64),
            253 => Ok(self.u16()? as i64),
            254 => Ok(self.u32()? as i32 as i64),
            _ => Ok(ocaml_int(self.u64()?)),
        }
    }
    /// A NUL-terminated string (bytes, not necessarily UTF-8).
    pub fn string(&mut self) -> Result<&'a [u8], Malformed> {
        let rest = &self.data[self.pos..];
        match rest.iter().position(|&b| b == 0) {
            Some(n) => {
                self.pos += n + 1;
                Ok(&rest[..n])
            }
            None => Err(Malformed::UnterminatedString),
        }
    }
}

/// A write buffer for one packet: a fixed block written with plain stores (it grows, on a
/// cold path, only if a caller writes past it; the writer keeps packets under 32 KiB).
#[derive(Clone, Debug)]
pub struct WriteBuf {
    buf: Vec<u8>,
    len: usize,
}

impl Default for WriteBuf {
    fn default() -> Self {
        WriteBuf::with_capacity(256)
    }
}

impl WriteBuf {
    pub fn with_capacity(n: usize) -> Self {
        WriteBuf {
            buf: vec![0; n.max(16)],
            len: 0,
        }
    }
    /// The bytes written so far.
    #[inline]
    pub fn bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub fn clear(&mut self) {
        self.len = 0
    }
    /// Clear it, writing zeros over all its room in one pass (see `Batch::take_back`).
    pub fn clear_and_zero(&mut self) {
        self.buf.fill(0);
        self.len = 0
    }
    /// Forget everything after the first `n` bytes.
    pub fn truncate(&mut self, n: usize) {
        self.len = self.len.min(n)
    }
    #[cold]
    fn grow(&mut self, n: usize) {
        let want = (self.len + n).max(self.buf.len() * 2);
        self.buf.resize(want, 0);
    }
    #[inline(always)]
    fn put<const N: usize>(&mut self, b: [u8; N]) {
        match self.buf.get_mut(self.len..self.len + N) {
            Some(d) => d.copy_from_slice(&b),
            None => self.put_grown(&b),
        }
        self.len += N;
    }

    #[cold]
    #[inline(never)]
    fn put_grown(&mut self, b: &[u8]) {
        self.grow(b.len());
        self.buf[self.len..self.len + b.len()].copy_from_slice(b);
    }
    #[inline]
    pub fn u8(&mut self, v: u8) {
        self.put([v])
    }
    #[inline]
    pub fn u16(&mut self, v: u16) {
        self.put(v.to_le_bytes())
    }
    #[inline]
    pub fn u32(&mut self, v: u32) {
        self.put(v.to_le_bytes())
    }
    #[inline]
    pub fn u64(&mut self, v: u64) {
        self.put(v.to_le_bytes())
    }
    #[inline]
    pub fn f64(&mut self, v: f64) {
        self.u64(v.to_bits())
    }
    /// A vint exactly as OCaml's `put_vint` writes it (negative values take 254 or 255).
    #[inline(always)]
    pub fn vint(&mut self, v: i64) {
        if (0..=252).contains(&v) {
            self.u8(v as u8)
        } else {
            self.vint_big(v)
        }
    }

    #[inline(never)]
    fn vint_big(&mut self, v: i64) {
        if v == v & 0xffff {
            self.put([253, v as u8, (v >> 8) as u8])
        } else if v == v as i32 as i64 {
            let b = (v as i32 as u32).to_le_bytes();
            self.put([254, b[0], b[1], b[2], b[3]])
        } else {
            self.u8(255);
            self.u64(v as u64)
        }
    }
    /// Append bytes as they are.
    pub fn extend(&mut self, s: &[u8]) {
        if self.len + s.len() > self.buf.len() {
            self.grow(s.len());
        }
        self.buf[self.len..self.len + s.len()].copy_from_slice(s);
        self.len += s.len();
    }
    /// A string up to its first NUL, then a NUL (as OCaml's `put_string`).
    pub fn string(&mut self, s: &[u8]) {
        let n = s.iter().position(|&b| b == 0).unwrap_or(s.len());
        if self.len + n + 1 > self.buf.len() {
            self.grow(n + 1);
        }
        self.buf[self.len..self.len + n].copy_from_slice(&s[..n]);
        self.buf[self.len + n] = 0;
        self.len += n + 1;
    }
    /// Reserve `n` bytes to be filled in later; returns their offset.
    #[inline]
    pub fn skip(&mut self, n: usize) -> usize {
        let at = self.len;
        if self.len + n > self.buf.len() {
            self.grow(n);
        }
        self.buf[at..at + n].fill(0);
        self.len += n;
        at
    }
    pub fn set_u8(&mut self, at: usize, v: u8) {
        self.bytes_mut()[at] = v
    }
    pub fn set_u16(&mut self, at: usize, v: u16) {
        self.bytes_mut()[at..at + 2].copy_from_slice(&v.to_le_bytes())
    }
    pub fn set_u32(&mut self, at: usize, v: u32) {
        self.bytes_mut()[at..at + 4].copy_from_slice(&v.to_le_bytes())
    }
    pub fn set_u64(&mut self, at: usize, v: u64) {
        self.bytes_mut()[at..at + 8].copy_from_slice(&v.to_le_bytes())
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.buf[..self.len]
    }
}

/// Write to one element of each page of `s` (the value it holds): its pages are faulted in
/// now rather than one by one as it is used.
pub(crate) fn fault_in<T: Copy>(s: &mut [T]) {
    let step = (4096 / std::mem::size_of::<T>().max(1)).max(1);
    for i in (0..s.len()).step_by(step) {
        s[i] = std::hint::black_box(s[i]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roundtrip(v: i64) -> (Vec<u8>, i64) {
        let mut w = WriteBuf::default();
        w.vint(v);
        let mut c = Cursor::new(w.bytes());
        let r = c.vint().unwrap();
        assert_eq!(c.remaining(), 0);
        (w.bytes().to_vec(), r)
    }

    #[test]
    fn vint_sizes_and_values() {
        assert_eq!(roundtrip(0), (vec![0], 0));
        assert_eq!(roundtrip(252), (vec![252], 252));
        assert_eq!(roundtrip(253), (vec![253, 253, 0], 253));
        assert_eq!(roundtrip(0xffff), (vec![253, 0xff, 0xff], 0xffff));
        assert_eq!(roundtrip(0x10000).0, vec![254, 0, 0, 1, 0]);
        assert_eq!(roundtrip(-1), (vec![254, 0xff, 0xff, 0xff, 0xff], -1));
        assert_eq!(roundtrip(1 << 40).0.len(), 9);
        assert_eq!(roundtrip(1 << 40).1, 1 << 40);
        assert_eq!(roundtrip(i32::MIN as i64 - 1).1, i32::MIN as i64 - 1);
    }

    #[test]
    fn vint_64_bit_is_truncated_to_63() {
        let mut c = Cursor::new(&[255, 0, 0, 0, 0, 0, 0, 0, 0xc0]);
        assert_eq!(c.vint().unwrap(), i64::MIN >> 1);
        let mut c = Cursor::new(&[255, 1, 0, 0, 0, 0, 0, 0, 0x80]);
        assert_eq!(c.vint().unwrap(), 1);
    }

    #[test]
    fn short_reads_are_errors() {
        let mut c = Cursor::new(&[253, 1]);
        assert!(matches!(c.vint(), Err(Malformed::Truncated { .. })));
        let mut c = Cursor::new(b"abc");
        assert_eq!(c.string(), Err(Malformed::UnterminatedString));
        let mut c = Cursor::new(b"abc\0d");
        assert_eq!(c.string().unwrap(), b"abc");
        assert_eq!(c.remaining(), 1);
    }

    #[test]
    fn string_stops_at_nul() {
        let mut w = WriteBuf::default();
        w.string(b"ab\0cd");
        assert_eq!(w.bytes(), b"ab\0");
    }

    /// Faulting pages in leaves every value as it was, whatever the element size and
    /// however the slice ends within a page.
    #[test]
    fn fault_in_keeps_the_values() {
        let mut a: Vec<u8> = (0..10_000u32).map(|i| (i * 7) as u8).collect();
        let mut b: Vec<u16> = (0..9_999u32).map(|i| (i * 31) as u16).collect();
        let mut c: Vec<u64> = (0..5_000u64)
            .map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15))
            .collect();
        let (a0, b0, c0) = (a.clone(), b.clone(), c.clone());
        fault_in(&mut a);
        fault_in(&mut b[1..]);
        fault_in(&mut c);
        fault_in::<u64>(&mut []);
        assert_eq!((a, b, c), (a0, b0, c0));
    }
}
