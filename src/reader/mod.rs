//! A streaming trace reader for formats 1-3: packets are read one at a time into a reused
//! buffer, and each event's backtrace is lent as a slice borrowed until the next event.

use crate::error::{Error, Malformed, Position, Result};
mod body;
mod clean;
mod packets;
mod scan;

pub use body::EventSink;
use body::Pending;
pub(crate) use scan::scan_packets_as;
pub use scan::{scan_domains, scan_packets, PacketScan, MAX_MERGE_DOMAINS};

use crate::format::backtrace::CacheReader;
use crate::format::event::{Alloc, DomainId, Event, ObjId, Timestamp};
use crate::format::info::TraceInfo;
use crate::format::location::{IntMap, LocationCodec, LocationList, LocationPool, LocationTable};
use crate::format::packet::PacketHeader;
use std::fs::File;
use std::io::Read;
use std::path::Path;
use std::sync::Arc;

/// Something the reader skipped or tolerated, with where it happened.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Warning {
    /// Where: file, byte offset, packet.
    pub at: Position,
    /// What happened, in words.
    pub what: String,
}

impl std::fmt::Display for Warning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.at, self.what)
    }
}

/// Counts kept while reading.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReadStats {
    /// Packets after the info packet that were read (processed or skipped).
    pub packets: u64,
    /// Packets skipped (wrong pid, out of sequence, truncated).
    pub skipped_packets: u64,
    /// Location events read.
    pub location_events: u64,
    /// Allocations read.
    pub allocs: u64,
    /// Promotes read.
    pub promotes: u64,
    /// Collects read.
    pub collects: u64,
    /// Bytes consumed from the input.
    pub bytes: u64,
}

/// Per-domain decoder state (format 3 keeps one per domain; older formats have domain 0).
#[derive(Default)]
struct DomainState {
    codec: LocationCodec,
    cache: CacheReader,
    last_time: u64,
}

const MAX_KEPT_WARNINGS: usize = 1000;

/// Reads one trace.
pub struct Reader<R> {
    src: R,
    name: String,
    info: TraceInfo,
    buf: Vec<u8>,
    /// The buffer's first size, and the least it grows by.
    chunk: usize,
    /// Read packets whole in the file this many bytes at a time ([`Reader::windowed`]).
    window: Option<usize>,
    file_len: u64,
    /// The current packet is read a window at a time (and not all of it is in `buf`).
    windowed: bool,
    /// Valid bytes are buf[start..end]; buf[0] is at file offset `base`.
    start: usize,
    end: usize,
    base: u64,
    eof: bool,
    /// Current packet: content is buf[pkt_start..pkt_end], read up to `pkt_pos`.
    pkt_start: usize,
    pkt_pos: usize,
    pkt_end: usize,
    header: PacketHeader,
    packet_index: u64,
    domains: Vec<DomainState>,
    domain_index: IntMap<u16, usize>,
    cur: usize,
    /// Next allocation id (v1/v2: of the trace; v3: of the current packet).
    alloc_id: u64,
    /// Last event time of the whole trace (formats 1-2 check it globally).
    last_time: u64,
    locations: LocationTable,
    /// Where its location lists are kept, when shared with other readers.
    pool: Option<Arc<LocationPool>>,
    /// Codes defined since the last event was handed out.
    new_codes: Vec<crate::format::event::LocationCode>,
    parse_backtraces: bool,
    keep_slots: bool,
    only_domain: Option<u16>,
    /// Refuse, as the reference reader does, a promote of an id above the packet's count.
    strict_promotes: bool,
    /// Such a promote was read (and warned of) already.
    warned_promote_ahead: bool,
    in_packet: bool,
    done: bool,
    /// An allocation read but held back by [`Reader::read_events`]'s sink (no room), its
    /// backtrace still the cache's last: handed over first by the next call.
    held: Option<Pending>,
    warnings: Vec<Warning>,
    warnings_dropped: u64,
    stats: ReadStats,
}

impl Reader<File> {
    /// Open a trace file and read its info packet.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let f = File::open(path).map_err(|e| Error::input(path, "open", e))?;
        Reader::new(f, &path.display().to_string())
    }
}

/// The bytes a reader reads at a time, at most: a packet's largest size and more.
pub(crate) const READ_BUFFER: usize = 1 << 16;

impl<R: Read> Reader<R> {
    /// Read the info packet of a trace from `src`; `name` is used in messages.
    pub fn new(src: R, name: &str) -> Result<Self> {
        Self::with_buffer(src, name, READ_BUFFER)
    }

    /// [`Reader::new`], reading `bytes` at a time (grown only to hold a packet): a merge
    /// of thousands of inputs keeps a reader, and so a buffer, per input.
    pub fn with_buffer(src: R, name: &str, bytes: usize) -> Result<Self> {
        let bytes = bytes.clamp(256, READ_BUFFER);
        let mut r = Reader {
            src,
            name: name.to_string(),
            info: TraceInfo {
                sample_rate: 0.0,
                word_size: 0,
                executable_name: vec![],
                host_name: vec![],
                ocaml_runtime_params: vec![],
                pid: 0,
                start_time: Timestamp(0),
                context: None,
                initial_domain: DomainId(0),
                version: 0,
            },
            buf: vec![0; bytes],
            chunk: bytes,
            window: None,
            file_len: 0,
            windowed: false,
            start: 0,
            end: 0,
            base: 0,
            eof: false,
            pkt_start: 0,
            pkt_pos: 0,
            pkt_end: 0,
            header: PacketHeader::default(),
            packet_index: 0,
            domains: Vec::new(),
            domain_index: IntMap::default(),
            cur: 0,
            alloc_id: 0,
            last_time: 0,
            locations: LocationTable::default(),
            pool: None,
            new_codes: Vec::new(),
            parse_backtraces: true,
            keep_slots: false,
            only_domain: None,
            strict_promotes: false,
            warned_promote_ahead: false,
            in_packet: false,
            done: false,
            held: None,
            warnings: Vec::new(),
            warnings_dropped: 0,
            stats: ReadStats::default(),
        };
        r.read_info()?;
        Ok(r)
    }

    /// Skip backtrace decoding (faster; events then carry empty backtraces and the
    /// per-packet cache verifier is not checked).
    pub fn set_parse_backtraces(&mut self, yes: bool) {
        self.parse_backtraces = yes;
    }

    /// Also lend, with each allocation, the backtrace cache entry of each of its frames
    /// ([`Alloc::slots`]): hints for a writer whose cache is in the same state (a copy).
    pub fn set_keep_slots(&mut self, yes: bool) {
        self.keep_slots = yes;
        for d in &mut self.domains {
            d.cache.keep_slots(yes);
        }
    }

    /// The input this reader reads from.
    pub fn get_ref(&self) -> &R {
        &self.src
    }

    /// Read only the events of one domain (format 3): other domains' packets are passed
    /// over silently (each domain's stream is self-contained).
    pub fn set_domain_filter(&mut self, domain: Option<u16>) {
        self.only_domain = domain;
    }

    /// Stop, as the reference reader does, at a format-3 promote with a negative id delta
    /// (default: read it, with one warning per trace). OCaml 5 writes one when a domain
    /// promotes a block it took over from a terminated domain whose id chunk lies above its
    /// own count; the id is the one the writer meant, so reading on loses nothing.
    pub fn set_strict_promotes(&mut self, yes: bool) {
        self.strict_promotes = yes;
    }

    /// The trace-info packet's contents.
    pub fn info(&self) -> &TraceInfo {
        &self.info
    }
    /// The name errors and warnings give the input (its path, for files).
    pub fn name(&self) -> &str {
        &self.name
    }
    /// Locations of every code defined so far.
    pub fn locations(&self) -> &LocationTable {
        &self.locations
    }
    /// The locations of one code, if defined so far.
    pub fn lookup(&self, code: crate::format::event::LocationCode) -> Option<&LocationList> {
        self.locations.get(&code)
    }
    /// Counts of what was read so far.
    pub fn stats(&self) -> &ReadStats {
        &self.stats
    }
    /// Warnings so far (at most 1000 kept; see [`Reader::warnings_dropped`]).
    pub fn warnings(&self) -> &[Warning] {
        &self.warnings
    }
    /// Warnings counted beyond the ones kept.
    pub fn warnings_dropped(&self) -> u64 {
        self.warnings_dropped
    }
    /// Take the warnings gathered so far.
    pub fn take_warnings(&mut self) -> Vec<Warning> {
        std::mem::take(&mut self.warnings)
    }

    /// Where the reader is: the file, the offset of the next unread event, the packet.
    pub fn position(&self) -> Position {
        self.pos_at(self.pkt_pos.max(self.start).min(self.end))
    }

    fn pos_at(&self, off_in_buf: usize) -> Position {
        Position {
            file: self.name.clone(),
            offset: self.base + off_in_buf as u64,
            packet: Some(self.packet_index),
        }
    }

    #[cold]
    #[inline(never)]
    fn err_at(&self, off_in_buf: usize, what: Malformed) -> Error {
        Error::Malformed {
            at: self.pos_at(off_in_buf),
            what,
        }
    }

    fn warn(&mut self, off_in_buf: usize, what: String) {
        if self.warnings.len() < MAX_KEPT_WARNINGS {
            let at = self.pos_at(off_in_buf);
            self.warnings.push(Warning { at, what });
        } else {
            self.warnings_dropped += 1;
        }
    }

    /// The backtrace of the last allocation read, with its cache entries (if kept): empty
    /// before the first, or when backtraces are not parsed. (With a domain filter, the
    /// filtered domain's: the reader only reads its packets.)
    #[inline(always)]
    pub(crate) fn last_backtrace(&self) -> (&[crate::format::event::LocationCode], &[u16]) {
        match self.domains.get(self.cur) {
            Some(d) if self.parse_backtraces => (d.cache.backtrace(), d.cache.slots()),
            _ => (&[], &[]),
        }
    }

    /// [`Reader::with_buffer`], its location lists kept in `locations` (one copy of each
    /// for all the readers that share it): inputs of one executable define their codes
    /// alike, and a merge of many would hold a copy of its tables for each.
    pub(crate) fn pooled(
        src: R,
        name: &str,
        bytes: usize,
        locations: Arc<LocationPool>,
    ) -> Result<Self> {
        let mut r = Self::with_buffer(src, name, bytes)?;
        r.pool = Some(locations);
        Ok(r)
    }

    /// [`Reader::new`], reading packets whole in the file `window` bytes at a time rather
    /// than whole, the file being `file_len` bytes long (a packet past it is read whole,
    /// as without a window), its caches in sparse tables, its location lists kept in
    /// `locations` (one copy of each for all the readers that share it): a merge of
    /// thousands of inputs holds a reader, and so a buffer and a cache, per input.
    pub(crate) fn windowed(
        src: R,
        name: &str,
        window: usize,
        file_len: u64,
        locations: Arc<LocationPool>,
    ) -> Result<Self> {
        let mut r = Self::pooled(src, name, window, locations)?;
        // (set before any packet after the info one: each domain's cache is made sparse
        // as it is met)
        r.window = Some(window.clamp(256, READ_BUFFER));
        r.file_len = file_len;
        Ok(r)
    }

    /// Read up to `max` events into `sink` (with the codes location events define, each
    /// before the first event after it), fewer if the sink says it is full: the batch form
    /// of [`Reader::next_full`], for consumers that copy what they need. Ok(false) once the
    /// trace has ended.
    pub fn read_events(&mut self, sink: &mut impl EventSink, max: usize) -> Result<bool> {
        match sink.cramped() {
            true => self.read_events_in::<true>(sink, max),
            false => self.read_events_in::<false>(sink, max),
        }
    }

    /// [`Reader::read_events`], asking [`EventSink::room_for`] before each allocation
    /// when `CRAMPED`.
    #[inline(always)]
    fn read_events_in<const CRAMPED: bool>(
        &mut self,
        sink: &mut impl EventSink,
        max: usize,
    ) -> Result<bool> {
        let mut n = 0;
        // (whatever the sink says now: a batch of another room may follow one that held
        // an allocation back)
        if let Some(p) = self.held.take() {
            let (bt, slots) = self.last_backtrace();
            p.give(sink, bt, slots);
            n += 1;
            if sink.full() {
                return Ok(true);
            }
        }
        if self.done {
            return Ok(false);
        }
        while n < max {
            let Some(p) = self.next_pending()? else {
                return Ok(false);
            };
            if !self.new_codes.is_empty() {
                for code in self.new_codes.drain(..) {
                    if let Some(l) = self.locations.get(&code) {
                        sink.location(code, l);
                    }
                }
            }
            let Some(p) = p else {
                self.stats.location_events += 1;
                continue;
            };
            n += 1;
            let alloc = matches!(p, Pending::Alloc { .. });
            match p {
                Pending::Alloc { .. } => self.stats.allocs += 1,
                Pending::Promote { .. } => self.stats.promotes += 1,
                Pending::Collect { .. } => self.stats.collects += 1,
            }
            let (bt, slots) = self.last_backtrace();
            if let (true, Pending::Alloc { common_prefix, .. }) = (CRAMPED, p) {
                if !sink.room_for(common_prefix, bt.len()) {
                    self.held = Some(p);
                    break;
                }
            }
            p.give(sink, bt, slots);
            if alloc && sink.full() {
                break;
            }
        }
        Ok(true)
    }

    /// The next event, or None at the end of the trace. Location events are absorbed into
    /// the location table. The event's backtrace is borrowed until the next call.
    pub fn next_event(&mut self) -> Result<Option<Event<'_>>> {
        Ok(self.next_with_locations()?.map(|(e, _)| e))
    }

    /// Like [`Reader::next_event`], also lending the location table (to resolve the backtrace).
    pub fn next_with_locations(&mut self) -> Result<Option<(Event<'_>, &LocationTable)>> {
        Ok(self.next_full()?.map(|(e, t, _)| (e, t)))
    }

    /// Like [`Reader::next_with_locations`], also lending the codes that location events
    /// defined since the previous event (each code is listed once, when first defined).
    #[allow(clippy::type_complexity)]
    pub fn next_full(
        &mut self,
    ) -> Result<
        Option<(
            Event<'_>,
            &LocationTable,
            &[crate::format::event::LocationCode],
        )>,
    > {
        self.new_codes.clear();
        if self.done {
            return Ok(None);
        }
        let p = loop {
            match self.next_pending()? {
                Some(Some(p)) => break p,
                Some(None) => self.stats.location_events += 1,
                None => return Ok(None),
            }
        };
        let domain = DomainId(self.header.domain);
        match p {
            Pending::Alloc { .. } => self.stats.allocs += 1,
            Pending::Promote { .. } => self.stats.promotes += 1,
            Pending::Collect { .. } => self.stats.collects += 1,
        }
        let ev = match p {
            Pending::Alloc {
                time,
                id,
                length,
                nsamples,
                source,
                common_prefix,
            } => {
                let (backtrace, slots) = self.last_backtrace();
                Event::Alloc(Alloc {
                    time: Timestamp(time),
                    domain,
                    id: ObjId(id),
                    length,
                    nsamples,
                    source,
                    common_prefix,
                    backtrace,
                    slots,
                })
            }
            Pending::Promote { time, id } => Event::Promote {
                time: Timestamp(time),
                domain,
                id: ObjId(id),
            },
            Pending::Collect { time, id } => Event::Collect {
                time: Timestamp(time),
                domain,
                id: ObjId(id),
            },
        };
        Ok(Some((ev, &self.locations, &self.new_codes)))
    }
}

#[cfg(test)]
mod tests;
