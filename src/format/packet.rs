//! CTF packet headers: magic, size in bits, time range, version, pid, [v3] domain, the
//! backtrace-cache verifier and the alloc-id range. Parsing checks what the reference checks.

use crate::error::Malformed;
use crate::format::buf::{Cursor, WriteBuf};

pub const MAGIC: u32 = 0xc1fc_1fc1;
/// The reference reader's buffer: no packet may be larger (header included).
pub const MAX_PACKET_SIZE: usize = 1 << 15;
/// Verifier index meaning "no verifier" (info and location packets, first packet).
pub const NO_VERIFIER: u16 = 0xffff;

/// Header size in bytes for a format version.
pub fn header_size(version: u16) -> usize {
    if version >= 3 {
        68
    } else {
        66
    }
}

/// The cache-verifier triple carried by a packet header.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct CacheVerifier {
    pub index: u16,
    pub prediction: u16,
    pub value: u64,
}

/// A decoded packet header.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct PacketHeader {
    /// Packet size in bytes, header included.
    pub size: u64,
    pub time_begin: u64,
    pub time_end: u64,
    pub flush_duration: u32,
    pub version: u16,
    pub pid: u64,
    pub domain: u16,
    pub verifier: CacheVerifier,
    pub alloc_id_begin: u64,
    pub alloc_id_end: u64,
}

impl PacketHeader {
    /// Bytes after the header.
    #[cfg(test)]
    pub fn content_size(&self) -> u64 {
        self.size - header_size(self.version) as u64
    }

    /// Parse a header. `Truncated` when the bytes run out; other errors for bad fields,
    /// in the reference's order (fields first, then magic, version, size, ranges).
    pub fn parse(c: &mut Cursor<'_>) -> Result<PacketHeader, Malformed> {
        let magic = c.u32()?;
        let size_bits = c.u32()?;
        let time_begin = c.u64()?;
        let time_end = c.u64()?;
        let flush_duration = c.u32()?;
        let version = c.u16()?;
        let pid = c.u64()?;
        let domain = if version >= 3 { c.u16()? } else { 0 };
        let verifier = CacheVerifier {
            index: c.u16()?,
            prediction: c.u16()?,
            value: c.u64()?,
        };
        let alloc_id_begin = c.u64()?;
        let alloc_id_end = c.u64()?;
        if magic != MAGIC {
            return Err(Malformed::BadMagic(magic));
        }
        if !(1..=3).contains(&version) {
            return Err(Malformed::UnsupportedVersion(version));
        }
        // As the reference: the size a signed 32-bit count of bits, rounded down to bytes;
        // times and ids compared as signed 64-bit numbers.
        let size = size_bits as u64 / 8;
        if (size_bits as i32) < 0 || size < header_size(version) as u64 {
            return Err(Malformed::BadPacketSize(size_bits));
        }
        if (time_begin as i64) > (time_end as i64) {
            return Err(Malformed::PacketTimesReversed {
                begin: time_begin,
                end: time_end,
            });
        }
        if (alloc_id_begin as i64) > (alloc_id_end as i64) {
            return Err(Malformed::PacketIdsReversed {
                begin: alloc_id_begin,
                end: alloc_id_end,
            });
        }
        Ok(PacketHeader {
            size,
            time_begin,
            time_end,
            flush_duration,
            version,
            pid,
            domain,
            verifier,
            alloc_id_begin,
            alloc_id_end,
        })
    }

    /// Write a header whose size, times and alloc ids are filled in by [`finish`] later.
    pub fn start(b: &mut WriteBuf, version: u16, pid: u64, domain: u16, verifier: CacheVerifier) {
        b.u32(MAGIC);
        b.skip(4 + 8 + 8 + 4);
        b.u16(version);
        b.u64(pid);
        if version >= 3 {
            b.u16(domain);
        }
        b.u16(verifier.index);
        b.u16(verifier.prediction);
        b.u64(verifier.value);
        b.skip(16);
    }

    /// Fill in the fields of a header started at offset 0 of `b`, now that the packet is complete.
    pub fn finish(
        b: &mut WriteBuf,
        version: u16,
        time_begin: u64,
        time_end: u64,
        id_begin: u64,
        id_end: u64,
    ) {
        let size_bits = (b.len() as u32).wrapping_mul(8);
        b.set_u32(4, size_bits);
        b.set_u64(8, time_begin);
        b.set_u64(16, time_end);
        b.set_u32(24, 0);
        let ids = header_size(version) - 16;
        b.set_u64(ids, id_begin);
        b.set_u64(ids + 8, id_end);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trip_v2_and_v3() {
        for version in [2u16, 3] {
            let mut b = WriteBuf::default();
            let v = CacheVerifier {
                index: 4242,
                prediction: 7,
                value: 0xdead_beef,
            };
            PacketHeader::start(&mut b, version, 1234, 5, v);
            assert_eq!(b.len(), header_size(version));
            b.u32(0); // one event's worth of content
            PacketHeader::finish(&mut b, version, 100, 200, 3, 9);
            let h = PacketHeader::parse(&mut Cursor::new(b.bytes())).unwrap();
            assert_eq!(h.size, b.len() as u64);
            assert_eq!(h.content_size(), 4);
            assert_eq!(
                (h.time_begin, h.time_end, h.alloc_id_begin, h.alloc_id_end),
                (100, 200, 3, 9)
            );
            assert_eq!((h.version, h.pid, h.verifier), (version, 1234, v));
            assert_eq!(h.domain, if version == 3 { 5 } else { 0 });
        }
    }

    #[test]
    fn bad_headers_are_rejected() {
        let mut b = WriteBuf::default();
        PacketHeader::start(&mut b, 2, 1, 0, CacheVerifier::default());
        PacketHeader::finish(&mut b, 2, 10, 5, 0, 0);
        assert_eq!(
            PacketHeader::parse(&mut Cursor::new(b.bytes())),
            Err(Malformed::PacketTimesReversed { begin: 10, end: 5 })
        );
        b.set_u32(0, 0x1234);
        assert_eq!(
            PacketHeader::parse(&mut Cursor::new(b.bytes())),
            Err(Malformed::BadMagic(0x1234))
        );
        assert!(matches!(
            PacketHeader::parse(&mut Cursor::new(&b.bytes()[..20])),
            Err(Malformed::Truncated { .. })
        ));
        let mut b = WriteBuf::default();
        PacketHeader::start(&mut b, 4, 1, 0, CacheVerifier::default());
        PacketHeader::finish(&mut b, 4, 1, 1, 0, 0);
        assert_eq!(
            PacketHeader::parse(&mut Cursor::new(b.bytes())),
            Err(Malformed::UnsupportedVersion(4))
        );
        // as the reference reads them: sizes rounded down to bytes, a negative one (as a
        // signed 32-bit count) refused; times and ids ordered as signed numbers
        let mut b = WriteBuf::default();
        PacketHeader::start(&mut b, 2, 1, 0, CacheVerifier::default());
        PacketHeader::finish(&mut b, 2, 10, 20, 0, 0);
        let parse = |b: &WriteBuf| PacketHeader::parse(&mut Cursor::new(b.bytes()));
        let bits = 8 * b.len() as u32;
        b.set_u32(4, bits + 5);
        assert_eq!(parse(&b).map(|h| h.size), Ok(bits as u64 / 8));
        b.set_u32(4, bits | 1 << 31);
        assert_eq!(parse(&b), Err(Malformed::BadPacketSize(bits | 1 << 31)));
        b.set_u32(4, bits);
        b.set_u64(16, 1 << 63);
        assert_eq!(
            parse(&b),
            Err(Malformed::PacketTimesReversed {
                begin: 10,
                end: 1 << 63
            })
        );
        b.set_u64(16, 20);
        let ids = b.len() - 16;
        b.set_u64(ids, 1 << 63);
        assert!(parse(&b).is_ok());
    }
}
