//! The events of a trace (alloc, promote, collect) and their 32-bit headers, with the
//! newtypes the format speaks in: timestamps, object ids, domains, location codes.

use crate::error::Malformed;
use std::fmt;

/// Microseconds since the Unix epoch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp(pub u64);

impl Timestamp {
    /// Microseconds since `start` (negative when before it), as the dump prints it.
    pub fn since(self, start: Timestamp) -> i64 {
        self.0.wrapping_sub(start.0) as i64
    }
}

/// An allocation's id: allocations are numbered implicitly, in order (per chunk in format 3).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjId(pub u64);

/// A format-3 domain (0 in formats 1 and 2).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DomainId(pub u16);

/// An opaque 63-bit code (a code address of the traced program) naming a backtrace frame.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LocationCode(pub u64);

impl LocationCode {
    /// The code as the reference reader holds it: the 64-bit field truncated to OCaml's
    /// 63-bit int (`Int64.to_int`) and widened back.
    #[inline]
    pub fn from_raw(raw: u64) -> Self {
        LocationCode(crate::format::buf::ocaml_int(raw) as u64)
    }
}

impl fmt::Display for LocationCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The reference prints codes as OCaml ints (signed decimal).
        write!(f, "{}", self.0 as i64)
    }
}

/// Where an allocation was made.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum AllocSource {
    /// Allocated on the minor heap (`alloc` in the dump).
    Minor = 0,
    /// Allocated directly on the major heap (`alloc_major`).
    Major = 1,
    /// Memory outside the OCaml heap (`alloc_ext`), e.g. a Bigarray's.
    External = 2,
}

impl AllocSource {
    /// The source from its byte in the format (0, 1, 2).
    pub fn from_u8(b: u8) -> Result<Self, Malformed> {
        match b {
            0 => Ok(AllocSource::Minor),
            1 => Ok(AllocSource::Major),
            2 => Ok(AllocSource::External),
            _ => Err(Malformed::BadAllocSource(b)),
        }
    }
    /// The dump tool's name for it.
    pub fn name(self) -> &'static str {
        match self {
            AllocSource::Minor => "alloc",
            AllocSource::Major => "alloc_major",
            AllocSource::External => "alloc_ext",
        }
    }
}

/// An allocation's fields other than its backtrace and id: what a writer is given
/// ([`crate::Writer::put_alloc`]; the writer numbers the allocations itself).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AllocHeader {
    /// When: microseconds since the epoch.
    pub time: Timestamp,
    /// The OCaml 5 domain that allocated (0 in format 2).
    pub domain: DomainId,
    /// The block's length in words (bytes for external allocations).
    pub length: u64,
    /// Samples drawn from the block: its weight in estimates.
    pub nsamples: u64,
    /// Minor, major or external.
    pub source: AllocSource,
}

/// An allocation as read: its backtrace is lent (caller-first) until the reader's next event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Alloc<'a> {
    /// When: microseconds since the epoch.
    pub time: Timestamp,
    /// The OCaml 5 domain whose stream holds the event (0 in format 2).
    pub domain: DomainId,
    /// The object's id, as the trace numbers its allocations.
    pub id: ObjId,
    /// The block's length in words (bytes for external allocations).
    pub length: u64,
    /// Samples drawn from the block: its weight in estimates.
    pub nsamples: u64,
    /// Minor, major or external.
    pub source: AllocSource,
    /// Frames shared with the previous allocation's backtrace of the same domain, as encoded.
    pub common_prefix: u64,
    /// Caller-first (program entry first, allocation site last).
    pub backtrace: &'a [LocationCode],
    /// The backtrace cache entry of each frame, when the reader keeps them
    /// ([`crate::Reader::set_keep_slots`]); empty otherwise.
    pub slots: &'a [u16],
}

/// An event as read from a trace. Location events are absorbed by the reader.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event<'a> {
    /// An allocation.
    Alloc(Alloc<'a>),
    /// The object survived a minor collection and moved to the major heap.
    Promote {
        /// When: microseconds since the epoch.
        time: Timestamp,
        /// The OCaml 5 domain whose stream holds the event (0 in format 2).
        domain: DomainId,
        /// The object's id, as the trace numbers its allocations.
        id: ObjId,
    },
    /// The object was freed.
    Collect {
        /// When: microseconds since the epoch.
        time: Timestamp,
        /// The OCaml 5 domain whose stream holds the event (0 in format 2).
        domain: DomainId,
        /// The object's id, as the trace numbers its allocations.
        id: ObjId,
    },
}

impl<'a> Event<'a> {
    /// When: microseconds since the epoch.
    pub fn time(&self) -> Timestamp {
        match self {
            Event::Alloc(a) => a.time,
            Event::Promote { time, .. } | Event::Collect { time, .. } => *time,
        }
    }
    /// The OCaml 5 domain whose stream holds the event (0 in format 2).
    pub fn domain(&self) -> DomainId {
        match self {
            Event::Alloc(a) => a.domain,
            Event::Promote { domain, .. } | Event::Collect { domain, .. } => *domain,
        }
    }
    /// An owned copy (the backtrace copied out of the reader's buffer).
    pub fn to_owned_event(&self) -> OwnedEvent {
        match *self {
            Event::Alloc(a) => OwnedEvent::Alloc(OwnedAlloc {
                time: a.time,
                domain: a.domain,
                id: a.id,
                length: a.length,
                nsamples: a.nsamples,
                source: a.source,
                backtrace: a.backtrace.to_vec(),
            }),
            Event::Promote { time, domain, id } => OwnedEvent::Promote { time, domain, id },
            Event::Collect { time, domain, id } => OwnedEvent::Collect { time, domain, id },
        }
    }
}

/// An allocation that owns its backtrace.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct OwnedAlloc {
    /// When: microseconds since the epoch.
    pub time: Timestamp,
    /// The OCaml 5 domain whose stream holds the event (0 in format 2).
    pub domain: DomainId,
    /// The object's id, as the trace numbers its allocations.
    pub id: ObjId,
    /// The block's length in words (bytes for external allocations).
    pub length: u64,
    /// Samples drawn from the block: its weight in estimates.
    pub nsamples: u64,
    /// Minor, major or external.
    pub source: AllocSource,
    /// Caller-first (program entry first, allocation site last).
    pub backtrace: Vec<LocationCode>,
}

/// An event that owns its data.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum OwnedEvent {
    /// An allocation.
    Alloc(OwnedAlloc),
    /// The object survived a minor collection and moved to the major heap.
    Promote {
        /// When: microseconds since the epoch.
        time: Timestamp,
        /// The OCaml 5 domain whose stream holds the event (0 in format 2).
        domain: DomainId,
        /// The object's id, as the trace numbers its allocations.
        id: ObjId,
    },
    /// The object was freed.
    Collect {
        /// When: microseconds since the epoch.
        time: Timestamp,
        /// The OCaml 5 domain whose stream holds the event (0 in format 2).
        domain: DomainId,
        /// The object's id, as the trace numbers its allocations.
        id: ObjId,
    },
}

impl OwnedEvent {
    /// When: microseconds since the epoch.
    pub fn time(&self) -> Timestamp {
        match self {
            OwnedEvent::Alloc(a) => a.time,
            OwnedEvent::Promote { time, .. } | OwnedEvent::Collect { time, .. } => *time,
        }
    }
    /// The OCaml 5 domain whose stream holds the event (0 in format 2).
    pub fn domain(&self) -> DomainId {
        match self {
            OwnedEvent::Alloc(a) => a.domain,
            OwnedEvent::Promote { domain, .. } | OwnedEvent::Collect { domain, .. } => *domain,
        }
    }
}

/// The 7-bit event code of an event header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventCode {
    TraceInfo,
    Location,
    Alloc,
    Promote,
    Collect,
    /// Short allocation of length 1..=16.
    ShortAlloc(u8),
}

impl EventCode {
    pub fn to_u32(self) -> u32 {
        match self {
            EventCode::TraceInfo => 0,
            EventCode::Location => 1,
            EventCode::Alloc => 2,
            EventCode::Promote => 3,
            EventCode::Collect => 4,
            EventCode::ShortAlloc(n) => 100 + n as u32,
        }
    }
    pub fn from_u32(c: u32) -> Result<Self, Malformed> {
        Ok(match c {
            0 => EventCode::TraceInfo,
            1 => EventCode::Location,
            2 => EventCode::Alloc,
            3 => EventCode::Promote,
            4 => EventCode::Collect,
            101..=116 => EventCode::ShortAlloc((c - 100) as u8),
            _ => return Err(Malformed::UnknownEventCode(c)),
        })
    }
}

/// Bits of the event time kept in an event header.
pub const TIME_BITS: u32 = 25;
pub const TIME_MASK: u32 = (1 << TIME_BITS) - 1;
/// The writer never lets one packet span more than this many microseconds.
pub const PACKET_MAX_TIME: u64 = 30_000_000;

/// Encode an event header: `code << 25 | (time & 0x1ffffff)`.
#[inline]
pub fn encode_header(code: EventCode, time: Timestamp) -> u32 {
    (code.to_u32() << TIME_BITS) | (time.0 as u32 & TIME_MASK)
}

/// Decode an event header, rebuilding the full time from the packet's begin time and
/// checking it lies within [begin, end].
#[inline]
pub fn decode_header(word: u32, begin: u64, end: u64) -> Result<(EventCode, Timestamp), Malformed> {
    let start_low = begin as u32 & TIME_MASK;
    let mut low = (word & TIME_MASK) as u64;
    if (low as u32) < start_low {
        low += 1 << TIME_BITS;
    }
    let time = (begin & !(TIME_MASK as u64)).wrapping_add(low);
    if !(begin <= time && time <= end) {
        return Err(Malformed::TimeOutOfPacket { time, begin, end });
    }
    let code = EventCode::from_u32(word >> TIME_BITS)?;
    Ok((code, Timestamp(time)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_time_wraps_within_packet() {
        let begin = (5u64 << 25) + 0x1ff_fff0;
        let end = begin + 100;
        let t = Timestamp(begin + 50); // crosses a 2^25 boundary
        let w = encode_header(EventCode::Alloc, t);
        assert_eq!(decode_header(w, begin, end).unwrap(), (EventCode::Alloc, t));
        let w = encode_header(EventCode::ShortAlloc(16), Timestamp(begin));
        assert_eq!(
            decode_header(w, begin, end).unwrap(),
            (EventCode::ShortAlloc(16), Timestamp(begin))
        );
    }

    #[test]
    fn header_time_outside_packet_is_an_error() {
        let w = encode_header(EventCode::Collect, Timestamp(1000));
        assert!(matches!(
            decode_header(w, 500, 900),
            Err(Malformed::TimeOutOfPacket { .. })
        ));
        let w = (99 << 25) | 600;
        assert_eq!(
            decode_header(w, 500, 900),
            Err(Malformed::UnknownEventCode(99))
        );
    }

    #[test]
    fn location_codes_are_63_bit() {
        assert_eq!(LocationCode::from_raw(0x8000_0000_0000_0001).0, 1);
        assert_eq!(
            LocationCode::from_raw(0x4000_0000_0000_0000).0,
            0xc000_0000_0000_0000
        );
        assert_eq!(
            LocationCode::from_raw(0x4000_0000_0000_0000).to_string(),
            "-4611686018427387904"
        );
    }
}
