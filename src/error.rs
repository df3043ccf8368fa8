//! The library's one error type: every variant says where (file, byte offset, packet) and what.
//! Readers, writers and the merge all return `Result<T, Error>`; nothing here panics.

use std::fmt;
use std::path::PathBuf;

/// Where in an input a problem was found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Position {
    /// The file (or a name given by the caller for in-memory input).
    pub file: String,
    /// Byte offset from the start of the file.
    pub offset: u64,
    /// Index of the packet (0 = the trace-info packet), when known.
    pub packet: Option<u64>,
}

impl fmt::Display for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: byte {}", self.file, self.offset)?;
        if let Some(p) = self.packet {
            write!(f, " (packet {p})")?;
        }
        Ok(())
    }
}

/// What went wrong in a trace that does not follow the format.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum Malformed {
    /// The file ends where more bytes were needed (e.g. inside a header).
    Truncated {
        /// Bytes the header or event needs.
        needed: u64,
        /// Bytes left in the file.
        available: u64,
    },
    /// A packet header does not start with 0xc1fc1fc1.
    BadMagic(u32),
    /// The file does not start with a CTF packet header (or is empty): the reason.
    NotATrace(&'static str),
    /// A format version this reader does not know.
    UnsupportedVersion(u16),
    /// Declared packet size (in bits) that cannot hold the header.
    BadPacketSize(u32),
    /// timestamp_begin > timestamp_end in a packet header.
    PacketTimesReversed {
        /// The header's timestamp_begin.
        begin: u64,
        /// The header's timestamp_end.
        end: u64,
    },
    /// alloc_id_begin > alloc_id_end in a packet header.
    PacketIdsReversed {
        /// The header's alloc_id_begin.
        begin: u64,
        /// The header's alloc_id_end.
        end: u64,
    },
    /// The first packet is not a lone trace_info event.
    BadInfoPacket(&'static str),
    /// An event code that is not 0-4 or 101-116.
    UnknownEventCode(u32),
    /// An event time outside [timestamp_begin, timestamp_end] of its packet.
    TimeOutOfPacket {
        /// The event's time.
        time: u64,
        /// The packet's timestamp_begin.
        begin: u64,
        /// The packet's timestamp_end.
        end: u64,
    },
    /// An event earlier than the previous one (of the same domain in format 3).
    NonMonotoneTime {
        /// The event's time.
        time: u64,
        /// The time of the event before it.
        previous: u64,
    },
    /// A second trace_info event.
    MultipleTraceInfo,
    /// An allocation source byte other than 0, 1, 2.
    BadAllocSource(u8),
    /// A negative or absurd value in a field.
    BadValue {
        /// The field's name in the format.
        field: &'static str,
        /// The value read.
        value: i64,
    },
    /// Promote/collect of an object id that was not allocated yet.
    BadObjectId {
        /// `promote` or `collect`.
        event: &'static str,
        /// The id the event names.
        id: i64,
        /// The next id an allocation would get.
        next: u64,
    },
    /// (format 3) A promote naming an id at or above its packet's next one (a negative id
    /// delta): OCaml 5's promote of a block taken over from a terminated domain, which the
    /// reference reader refuses (`promote id sync`). An error only in strict mode
    /// ([`crate::Reader::set_strict_promotes`]); `time` is the event's.
    PromoteAhead {
        /// The id promoted.
        id: u64,
        /// The (negative) id delta as written.
        delta: i64,
        /// The event's time.
        time: u64,
    },
    /// The packet's alloc_id_end disagrees with the allocations it holds.
    AllocIdSync {
        /// The header's alloc_id_end.
        header_end: u64,
        /// The id after the packet's last allocation.
        counted: u64,
    },
    /// The packet header's backtrace-cache verifier does not match the cache.
    CacheVerification {
        /// The cache slot the header names.
        index: u16,
    },
    /// A move-to-front code names an empty slot.
    MtfEmptySlot {
        /// Which table: `location` or `function`.
        table: &'static str,
        /// The code's index in the table.
        index: u8,
    },
    /// A string runs past the end of its packet (no NUL).
    UnterminatedString,
    /// A location code given two different location lists.
    InconsistentLocation {
        /// The location code.
        code: u64,
    },
    /// A backtrace names a location code never defined by a location event.
    UndefinedLocation {
        /// The location code.
        code: u64,
    },
    /// A backtrace frame read from a cache entry that no miss ever filled.
    EmptyCacheEntry,
    /// Bytes left over in the trace-info packet or an event ran past its packet.
    EventOverrun,
    /// Object lifecycle violated (check only): promote/collect of a dead or unknown object.
    Lifecycle {
        /// `promote` or `collect`.
        event: &'static str,
        /// The object's id.
        id: u64,
        /// What is wrong, in words.
        why: &'static str,
    },
}

impl fmt::Display for Malformed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use Malformed::*;
        match self {
            Truncated { needed, available } => {
                write!(f, "truncated: needed {needed} bytes, only {available} left")
            }
            BadMagic(m) => write!(f, "not a CTF packet (magic {m:#010x}, expected 0xc1fc1fc1)"),
            NotATrace(why) => write!(f, "not a memtrace trace ({why})"),
            UnsupportedVersion(v) => {
                write!(
                    f,
                    "trace format v{v:03}, but this reader knows v001 to v003"
                )
            }
            BadPacketSize(s) => write!(f, "bad packet size {s} bits"),
            PacketTimesReversed { begin, end } => {
                write!(f, "packet timestamp_begin {begin} > timestamp_end {end}")
            }
            PacketIdsReversed { begin, end } => {
                write!(f, "packet alloc_id_begin {begin} > alloc_id_end {end}")
            }
            BadInfoPacket(why) => write!(f, "bad trace-info packet: {why}"),
            UnknownEventCode(c) => write!(f, "unknown event code {c}"),
            TimeOutOfPacket { time, begin, end } => {
                write!(f, "event time {time} outside its packet [{begin}, {end}]")
            }
            NonMonotoneTime { time, previous } => {
                write!(
                    f,
                    "event time {time} is before the previous event's {previous}"
                )
            }
            MultipleTraceInfo => write!(f, "multiple trace-info events present"),
            BadAllocSource(s) => write!(f, "bad allocation source {s}"),
            BadValue { field, value } => write!(f, "bad {field} {value}"),
            BadObjectId { event, id, next } => {
                write!(f, "{event} of object id {id}, but only {next} allocated")
            }
            PromoteAhead { id, delta, .. } => write!(
                f,
                "promote of object {id} with a negative id delta {delta} (a block taken over \
                 from a terminated domain), which the reference reader refuses (promote id sync)"
            ),
            AllocIdSync {
                header_end,
                counted,
            } => write!(
                f,
                "alloc id sync: packet says alloc_id_end {header_end}, events reach {counted}"
            ),
            CacheVerification { index } => {
                write!(f, "backtrace cache verification failed at index {index}")
            }
            MtfEmptySlot { table, index } => {
                write!(f, "{table} move-to-front code {index} names an empty slot")
            }
            UnterminatedString => write!(f, "string not NUL-terminated within its packet"),
            InconsistentLocation { code } => {
                write!(f, "location code {code:#x} given different locations")
            }
            UndefinedLocation { code } => {
                write!(f, "location code {code:#x} used but never defined")
            }
            EmptyCacheEntry => write!(f, "backtrace frame from a cache entry never filled"),
            EventOverrun => write!(f, "event runs past the end of its packet"),
            Lifecycle { event, id, why } => write!(f, "{event} of object {id}: {why}"),
        }
    }
}

/// Which side of a merge or copy a file is on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    /// A trace read.
    Input,
    /// The trace written (or stdout).
    Output,
}

/// The library's error.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// The input does not follow the memtrace format.
    Malformed {
        /// Where in which input.
        at: Position,
        /// What was wrong.
        what: Malformed,
    },
    /// An I/O error on a named file, of an input or of the output.
    Io {
        /// The file.
        path: PathBuf,
        /// Whether the file is an input or the output.
        side: Side,
        /// What was being done (`open`, `read`, `rename`, ...).
        op: &'static str,
        /// The OS's error.
        source: std::io::Error,
    },
    /// The merge was cancelled ([`crate::Cancel`]); nothing was written.
    Cancelled,
    /// The caller asked for something impossible (bad option, output = input, ...).
    Usage(String),
    /// A writer was given events it cannot encode (out-of-order time, unknown id, ...).
    Write(String),
    /// Inputs that cannot be merged together (word size, sampling rate policy, ...).
    Incompatible(String),
    /// An analysis with nothing to answer: its filters leave no allocation, or the time
    /// asked about is outside the traces.
    NothingToAnalyse(String),
    /// A fault of this library, not of the input or the caller: a thread that panicked or
    /// could not start, a broken invariant.
    Internal(String),
}

impl Error {
    /// A [`Error::Malformed`] at byte `offset` of `file` (in packet `packet`, if known).
    pub fn malformed(file: &str, offset: u64, packet: Option<u64>, what: Malformed) -> Error {
        Error::Malformed {
            at: Position {
                file: file.to_string(),
                offset,
                packet,
            },
            what,
        }
    }
    /// An I/O error on input `path`, while doing `op`.
    pub fn input(path: impl Into<PathBuf>, op: &'static str, source: std::io::Error) -> Error {
        Error::Io {
            path: path.into(),
            side: Side::Input,
            op,
            source,
        }
    }
    /// An I/O error on the output `path`, while doing `op`.
    pub fn output(path: impl Into<PathBuf>, op: &'static str, source: std::io::Error) -> Error {
        Error::Io {
            path: path.into(),
            side: Side::Output,
            op,
            source,
        }
    }
    /// The side the error is about: inputs (a malformed trace, inputs that cannot be merged
    /// together, an input's I/O) or the output (its I/O, events it cannot hold); None for
    /// the caller's mistakes, cancellation and faults of this library.
    pub fn side(&self) -> Option<Side> {
        match self {
            Error::Malformed { .. } | Error::Incompatible(_) => Some(Side::Input),
            Error::Io { side, .. } => Some(*side),
            Error::Write(_) => Some(Side::Output),
            Error::Usage(_) | Error::Cancelled | Error::Internal(_) => None,
            Error::NothingToAnalyse(_) => None,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Malformed { at, what } => write!(f, "{at}: {what}"),
            Error::Io {
                path, op, source, ..
            } => write!(f, "{}: {op}: {source}", path.display()),
            Error::Cancelled => f.write_str("merge cancelled; no output written"),
            Error::Usage(s)
            | Error::Write(s)
            | Error::Incompatible(s)
            | Error::NothingToAnalyse(s) => f.write_str(s),
            Error::Internal(s) => write!(f, "internal error: {s}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// The library's result: [`Error`] unless said otherwise.
pub type Result<T, E = Error> = std::result::Result<T, E>;
