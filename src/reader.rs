//! A streaming trace reader for formats 1-3: packets are read one at a time into a reused
//! buffer, and each event's backtrace is lent as a slice borrowed until the next event.

use crate::error::{Error, Malformed, Position, Result};
use crate::format::backtrace::CacheReader;
use crate::format::buf::Cursor;
use crate::format::event::{
    decode_header, Alloc, AllocSource, DomainId, Event, EventCode, LocationCode, ObjId, Timestamp,
};
use crate::format::info::TraceInfo;
use crate::format::location::{IntMap, LocationCodec, LocationList, LocationTable};
use crate::format::packet::{header_size, PacketHeader};
use std::fs::File;
use std::io::{ErrorKind, Read};
use std::path::Path;

/// Something the reader skipped or tolerated, with where it happened.
#[derive(Clone, Debug, PartialEq)]
pub struct Warning {
    pub at: Position,
    pub what: String,
}

impl std::fmt::Display for Warning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.at, self.what)
    }
}

/// Counts kept while reading.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReadStats {
    /// Packets after the info packet that were read (processed or skipped).
    pub packets: u64,
    pub skipped_packets: u64,
    pub location_events: u64,
    pub allocs: u64,
    pub promotes: u64,
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

impl<R: Read> Reader<R> {
    /// Read the info packet of a trace from `src`; `name` is used in messages.
    pub fn new(src: R, name: &str) -> Result<Self> {
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
            buf: vec![0; 1 << 16],
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
            new_codes: Vec::new(),
            parse_backtraces: true,
            keep_slots: false,
            only_domain: None,
            strict_promotes: false,
            warned_promote_ahead: false,
            in_packet: false,
            done: false,
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

    pub fn info(&self) -> &TraceInfo {
        &self.info
    }
    pub fn name(&self) -> &str {
        &self.name
    }
    /// Locations of every code defined so far.
    pub fn locations(&self) -> &LocationTable {
        &self.locations
    }
    pub fn lookup(&self, code: crate::format::event::LocationCode) -> Option<&LocationList> {
        self.locations.get(&code)
    }
    pub fn stats(&self) -> &ReadStats {
        &self.stats
    }
    /// Warnings so far (at most 1000 kept; see [`Reader::warnings_dropped`]).
    pub fn warnings(&self) -> &[Warning] {
        &self.warnings
    }
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

    /// Make at least `n` bytes available from `start`, unless the input ends first.
    /// Returns how many are available (≤ n only at end of input). Grows the buffer only as
    /// data actually arrives, so a bogus declared size cannot make it allocate.
    fn fill(&mut self, n: usize) -> Result<usize> {
        while self.end - self.start < n && !self.eof {
            if self.start > 0 && (self.end == self.buf.len() || self.start > self.buf.len() / 2) {
                self.buf.copy_within(self.start..self.end, 0);
                // The current packet (if any) is behind us by now; keep offsets right.
                self.end -= self.start;
                self.base += self.start as u64;
                self.pkt_start = self.pkt_start.saturating_sub(self.start);
                self.pkt_pos = self.pkt_pos.saturating_sub(self.start);
                self.pkt_end = self.pkt_end.saturating_sub(self.start);
                self.start = 0;
            }
            if self.end == self.buf.len() {
                let want = (self.buf.len() * 2).min(self.start + n.max(1 << 16));
                self.buf.resize(want.max(self.buf.len() + 1), 0);
            }
            match self.src.read(&mut self.buf[self.end..]) {
                Ok(0) => self.eof = true,
                Ok(k) => self.end += k,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(Error::input(&self.name, "read", e)),
            }
        }
        Ok((self.end - self.start).min(n))
    }

    /// Read a packet header at `start`. Ok(None) at a clean end of input.
    /// A header cut by the end of input ends the trace with a warning.
    fn read_header(&mut self) -> Result<Option<PacketHeader>> {
        let avail = self.fill(68)?;
        if avail == 0 {
            return Ok(None);
        }
        let mut c = Cursor::new(&self.buf[self.start..self.start + avail]);
        let magic = crate::format::packet::MAGIC.to_le_bytes();
        let first = self.packet_index == 0;
        match PacketHeader::parse(&mut c) {
            Ok(h) => Ok(Some(h)),
            Err(Malformed::BadMagic(_)) if first => {
                Err(self.err_at(self.start, Malformed::NotATrace("no CTF packet header")))
            }
            Err(Malformed::Truncated { .. })
                if first
                    && self.buf[self.start..self.start + avail.min(4)] != magic[..avail.min(4)] =>
            {
                Err(self.err_at(self.start, Malformed::NotATrace("no CTF packet header")))
            }
            Err(Malformed::Truncated { .. }) if avail < 68 => {
                if first {
                    return Err(self.err_at(
                        self.start,
                        Malformed::Truncated {
                            needed: 66,
                            available: avail as u64,
                        },
                    ));
                }
                self.warn(
                    self.start,
                    format!("file ends inside a packet header ({avail} bytes); trace ends here"),
                );
                self.stats.packets += 1;
                self.stats.skipped_packets += 1;
                self.stats.bytes += avail as u64;
                self.start += avail;
                Ok(None)
            }
            Err(e) => Err(self.err_at(self.start, e)),
        }
    }

    fn read_info(&mut self) -> Result<()> {
        let h = match self.read_header()? {
            Some(h) => h,
            None => return Err(self.err_at(self.start, Malformed::NotATrace("empty file"))),
        };
        let size = h.size as usize;
        if size > crate::format::packet::MAX_PACKET_SIZE {
            // (the reference reads the info packet into a buffer of this size)
            return Err(self.err_at(
                self.start,
                Malformed::BadInfoPacket("larger than 32 KiB, which memtrace cannot read"),
            ));
        }
        let avail = self.fill(size)?;
        if avail < size {
            return Err(self.err_at(
                self.start,
                Malformed::Truncated {
                    needed: size as u64,
                    available: avail as u64,
                },
            ));
        }
        let hs = header_size(h.version);
        let content = &self.buf[self.start + hs..self.start + size];
        let mut c = Cursor::new(content);
        let word = c.u32().map_err(|e| self.err_at(self.start + hs, e))?;
        let (code, time) = decode_header(word, h.time_begin, h.time_end)
            .map_err(|e| self.err_at(self.start + hs, e))?;
        if code != EventCode::TraceInfo {
            return Err(self.err_at(
                self.start + hs,
                Malformed::BadInfoPacket("first event is not trace_info"),
            ));
        }
        if time.0 != h.time_begin {
            return Err(self.err_at(
                self.start + hs,
                Malformed::BadInfoPacket("trace_info time is not the packet's"),
            ));
        }
        let info = TraceInfo::decode(&mut c, time, h.version, h.domain)
            .map_err(|e| self.err_at(self.start + hs + c.pos(), e))?;
        if c.remaining() != 0 {
            return Err(self.err_at(
                self.start + hs + c.pos(),
                Malformed::BadInfoPacket("bytes after trace_info"),
            ));
        }
        self.info = info;
        self.last_time = self.info.start_time.0;
        self.start += size;
        self.stats.bytes += size as u64;
        self.packet_index = 1;
        self.pkt_start = self.start;
        self.pkt_pos = self.start;
        self.pkt_end = self.start;
        Ok(())
    }

    fn domain_slot(&mut self, d: u16) -> usize {
        if let Some(&i) = self.domain_index.get(&d) {
            return i;
        }
        let i = self.domains.len();
        self.domains.push(DomainState {
            last_time: self.info.start_time.0,
            ..Default::default()
        });
        self.domains[i].cache.keep_slots(self.keep_slots);
        self.domain_index.insert(d, i);
        i
    }

    /// Move to the next packet with events to read. Ok(false) at the end of the trace.
    fn next_packet(&mut self) -> Result<bool> {
        loop {
            let h = match self.read_header()? {
                Some(h) => h,
                None => return Ok(false),
            };
            self.stats.packets += 1;
            let size = h.size as usize;
            let avail = self.fill(size)?;
            let hstart = self.start;
            if avail < size {
                self.warn(
                    hstart,
                    format!("skipping truncated packet (declares {size} bytes, file has {avail}); trace ends here"),
                );
                self.stats.skipped_packets += 1;
                self.stats.bytes += avail as u64;
                self.start += avail;
                self.pkt_start = self.start;
                self.pkt_pos = self.start;
                self.pkt_end = self.start;
                self.packet_index += 1;
                return Ok(false);
            }
            let hs = header_size(h.version);
            self.stats.bytes += size as u64;
            self.pkt_start = self.start + hs;
            self.pkt_pos = self.pkt_start;
            self.pkt_end = self.start + size;
            self.header = h;
            let v3 = h.version >= 3;
            if let Some(d) = self.only_domain {
                if h.domain != d {
                    self.start = self.pkt_end;
                    self.packet_index += 1;
                    continue;
                }
            }
            let skip = if h.pid != self.info.pid {
                Some(format!(
                    "skipping bad packet (wrong pid: {}, but tracing {})",
                    h.pid, self.info.pid
                ))
            } else if !v3 && (self.last_time > h.time_begin || self.alloc_id != h.alloc_id_begin) {
                Some(format!(
                    "skipping bad packet at id {} {}-{} (does not continue the alloc-id or time sequence)",
                    self.alloc_id, h.alloc_id_begin, h.alloc_id_end
                ))
            } else if v3 && {
                let d = self.domain_slot(h.domain);
                self.domains[d].last_time > h.time_begin
            } {
                Some(format!(
                    "skipping bad packet of domain {} starting at {} (before that domain's last event)",
                    h.domain, h.time_begin
                ))
            } else {
                None
            };
            if let Some(msg) = skip {
                self.warn(hstart, msg);
                self.stats.skipped_packets += 1;
                self.start = self.pkt_end;
                self.packet_index += 1;
                continue;
            }
            self.cur = self.domain_slot(h.domain);
            if v3 {
                self.alloc_id = h.alloc_id_begin;
            }
            if self.parse_backtraces && !self.domains[self.cur].cache.verify(&h.verifier) {
                return Err(self.err_at(
                    hstart,
                    Malformed::CacheVerification {
                        index: h.verifier.index,
                    },
                ));
            }
            return Ok(true);
        }
    }

    fn finish_packet(&mut self) -> Result<()> {
        self.in_packet = false;
        if self.alloc_id != self.header.alloc_id_end {
            return Err(self.err_at(
                self.pkt_end,
                Malformed::AllocIdSync {
                    header_end: self.header.alloc_id_end,
                    counted: self.alloc_id,
                },
            ));
        }
        self.start = self.pkt_end;
        self.packet_index += 1;
        Ok(())
    }

    /// Parse one event of the current packet. None for a location event.
    #[inline]
    fn read_event(&mut self) -> Result<Option<Pending>> {
        let at = self.pkt_pos;
        let mut c = Cursor::new(&self.buf[self.pkt_pos..self.pkt_end]);
        let r = read_event_body(
            &mut c,
            &self.header,
            &mut self.domains[self.cur],
            &mut self.last_time,
            &mut self.alloc_id,
            &mut self.locations,
            &mut self.new_codes,
            self.parse_backtraces,
        );
        let used = c.pos();
        match r {
            Ok(p) => {
                self.pkt_pos += used;
                Ok(p)
            }
            Err(Malformed::PromoteAhead { id, delta, time }) if !self.strict_promotes => {
                self.promote_ahead(at, id, delta);
                self.pkt_pos += used;
                Ok(Some(Pending::Promote { time, id }))
            }
            // Errors name the offset of the event they are about.
            Err(Malformed::Truncated { .. }) => Err(self.err_at(at, Malformed::EventOverrun)),
            Err(what) => Err(self.err_at(at, what)),
        }
    }

    /// A format-3 promote of object `id`, at or above the packet's next id (a negative
    /// delta), read: warned of once per trace.
    #[cold]
    #[inline(never)]
    fn promote_ahead(&mut self, at: usize, id: u64, delta: i64) {
        if !self.warned_promote_ahead {
            self.warned_promote_ahead = true;
            let what = format!(
                "promote of object {id} with a negative id delta {delta} (a block taken over \
                 from a terminated domain): read as that object; the reference reader stops \
                 here (promote id sync)"
            );
            self.warn(at, what);
        }
    }

    /// At the end of a packet: finish it and move to the next one with events.
    /// Ok(false) at the end of the trace (and after an error, which ends it).
    #[cold]
    #[inline(never)]
    fn advance(&mut self) -> Result<bool> {
        if self.done {
            return Ok(false);
        }
        let r = if self.in_packet {
            self.finish_packet()
        } else {
            Ok(())
        };
        match r.and_then(|_| self.next_packet()) {
            Ok(true) => {
                self.in_packet = true;
                Ok(true)
            }
            Ok(false) => {
                self.done = true;
                Ok(false)
            }
            Err(e) => {
                self.done = true;
                Err(e)
            }
        }
    }

    /// The next event of the trace, parsed (the caller counts it): Ok(None) at its end,
    /// Some(None) for a location event (absorbed into the table). An error ends the trace.
    #[inline(always)]
    fn next_pending(&mut self) -> Result<Option<Option<Pending>>> {
        // (a packet may hold no events at all)
        while self.pkt_pos >= self.pkt_end {
            if !self.advance()? {
                return Ok(None);
            }
        }
        let p = match self.read_event() {
            Ok(p) => p,
            Err(e) => {
                self.done = true;
                return Err(e);
            }
        };
        Ok(Some(p))
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

    /// Read up to `max` events into `sink` (with the codes location events define, each
    /// before the first event after it), fewer if the sink says it is full: the batch form
    /// of [`Reader::next_full`], for consumers that copy what they need. Ok(false) once the
    /// trace has ended.
    pub fn read_events(&mut self, sink: &mut impl EventSink, max: usize) -> Result<bool> {
        let mut n = 0;
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
            match p {
                None => self.stats.location_events += 1,
                Some(Pending::Alloc {
                    time,
                    id,
                    length,
                    nsamples,
                    source,
                    common_prefix,
                }) => {
                    self.stats.allocs += 1;
                    n += 1;
                    let (bt, slots) = self.last_backtrace();
                    sink.alloc(time, id, length, nsamples, source, common_prefix, bt, slots);
                    if sink.full() {
                        break;
                    }
                }
                Some(Pending::Promote { time, id }) => {
                    self.stats.promotes += 1;
                    n += 1;
                    sink.promote(time, id);
                }
                Some(Pending::Collect { time, id }) => {
                    self.stats.collects += 1;
                    n += 1;
                    sink.collect(time, id);
                }
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

/// What [`Reader::read_events`] hands events to (times and ids as plain numbers).
pub trait EventSink {
    /// A location event defined `code` (the first time it is defined).
    fn location(&mut self, code: LocationCode, locs: &LocationList);
    /// An allocation; its backtrace shares its first `common_prefix` frames (at most) with
    /// the previous allocation's of the same domain.
    #[allow(clippy::too_many_arguments)]
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
    );
    fn promote(&mut self, time: u64, id: u64);
    fn collect(&mut self, time: u64, id: u64);
    /// Asked after each allocation: true ends the batch early (before `max` events).
    fn full(&self) -> bool {
        false
    }
}

/// An event parsed but not yet handed out.
#[derive(Clone, Copy)]
enum Pending {
    Alloc {
        time: u64,
        id: u64,
        length: u64,
        nsamples: u64,
        source: AllocSource,
        common_prefix: u64,
    },
    Promote {
        time: u64,
        id: u64,
    },
    Collect {
        time: u64,
        id: u64,
    },
}

fn non_negative(field: &'static str, v: i64) -> Result<u64, Malformed> {
    if v < 0 {
        Err(Malformed::BadValue { field, value: v })
    } else {
        Ok(v as u64)
    }
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn read_event_body(
    c: &mut Cursor<'_>,
    h: &PacketHeader,
    d: &mut DomainState,
    global_last: &mut u64,
    alloc_id: &mut u64,
    locations: &mut LocationTable,
    new_codes: &mut Vec<crate::format::event::LocationCode>,
    parse_backtraces: bool,
) -> Result<Option<Pending>, Malformed> {
    let word = c.u32()?;
    let (code, time) = decode_header(word, h.time_begin, h.time_end)?;
    let time = time.0;
    let v3 = h.version >= 3;
    let last = if v3 { &mut d.last_time } else { global_last };
    if time < *last {
        return Err(Malformed::NonMonotoneTime {
            time,
            previous: *last,
        });
    }
    *last = time;
    if !v3 {
        d.last_time = time;
    }
    match code {
        EventCode::TraceInfo => Err(Malformed::MultipleTraceInfo),
        EventCode::Location => {
            let (code, locs) = d.codec.decode(c)?;
            match locations.get(&code) {
                Some(old) if **old != *locs => {
                    return Err(Malformed::InconsistentLocation { code: code.0 })
                }
                Some(_) => {}
                None => {
                    locations.insert(code, locs);
                    new_codes.push(code);
                }
            }
            Ok(None)
        }
        EventCode::Alloc | EventCode::ShortAlloc(_) => {
            let (length, nsamples, source, common_prefix, nencoded) =
                if let EventCode::ShortAlloc(n) = code {
                    let common_prefix = non_negative("common prefix", c.vint()?)?;
                    (
                        n as u64,
                        1,
                        AllocSource::Minor,
                        common_prefix,
                        c.u8()? as usize,
                    )
                } else {
                    let length = non_negative("length", c.vint()?)?;
                    let nsamples = non_negative("nsamples", c.vint()?)?;
                    let source = AllocSource::from_u8(c.u8()?)?;
                    let common_prefix = non_negative("common prefix", c.vint()?)?;
                    (length, nsamples, source, common_prefix, c.u16()? as usize)
                };
            if parse_backtraces {
                let table = &*locations;
                d.cache
                    .decode(c, nencoded, common_prefix, |code| table.contains_key(&code))?;
            } else {
                CacheReader::skip(c, nencoded)?;
            }
            let id = *alloc_id;
            // (a packet's first id may be anything up to u64::MAX)
            *alloc_id = id.checked_add(1).ok_or(Malformed::BadValue {
                field: "allocation id",
                value: id as i64,
            })?;
            Ok(Some(Pending::Alloc {
                time,
                id,
                length,
                nsamples,
                source,
                common_prefix,
            }))
        }
        EventCode::Promote | EventCode::Collect => {
            let delta = c.vint()?;
            let is_promote = code == EventCode::Promote;
            // v3 promotes and collects may name a later id (another domain's chunk: OCaml 5
            // hands a terminated domain's blocks to another domain); the reference reader
            // accepts this only for collects (see [`Reader::set_strict_promotes`]).
            if delta < 0 && (is_promote || !v3) {
                return Err(negative_delta(v3, is_promote, delta, *alloc_id, time));
            }
            let id = (*alloc_id as i64).wrapping_sub(1).wrapping_sub(delta);
            if id < 0 {
                return Err(Malformed::BadObjectId {
                    event: if is_promote { "promote" } else { "collect" },
                    id,
                    next: *alloc_id,
                });
            }
            let id = id as u64;
            Ok(Some(if is_promote {
                Pending::Promote { time, id }
            } else {
                Pending::Collect { time, id }
            }))
        }
    }
}

/// The error of a promote or collect with a negative id delta: a bad value but for a
/// format-3 promote ([`Malformed::PromoteAhead`], which the reader reads unless strict).
#[cold]
#[inline(never)]
fn negative_delta(v3: bool, is_promote: bool, delta: i64, next: u64, time: u64) -> Malformed {
    if let Some(id) = (v3.then_some(next as i64 - 1)).and_then(|n| n.checked_sub(delta)) {
        return Malformed::PromoteAhead {
            id: id as u64,
            delta,
            time,
        };
    }
    Malformed::BadValue {
        field: if is_promote {
            "promote id delta"
        } else {
            "collect id delta"
        },
        value: delta,
    }
}

/// Most domains of one trace that a merge reads: each is read as a stream of its own (the
/// whole file again), so a trace naming thousands is refused rather than read thousands of
/// times over.
pub const MAX_MERGE_DOMAINS: usize = 1024;

/// The domains of a trace that have events, in order of first appearance (the info
/// packet's first), from its packet headers alone (formats 1-2: just domain 0). Stops
/// quietly at the first damaged header. More than [`MAX_MERGE_DOMAINS`] is an error.
pub fn scan_domains(path: &Path) -> Result<Vec<u16>> {
    Ok(scan_packets(path, false)?.domains)
}

/// What a trace's packet headers say, read without its events.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PacketScan {
    /// As [`scan_domains`].
    pub domains: Vec<u16>,
    /// Allocations the headers' id ranges claim (format 2: the last id; format 3: the sum
    /// of each packet's range), when asked for.
    pub alloc_ids: u64,
}

/// Scan a trace's packet headers: its domains and, with `count_allocs` (or in format 3),
/// its allocations. Stops quietly at the first damaged header.
pub fn scan_packets(path: &Path, count_allocs: bool) -> Result<PacketScan> {
    scan_packets_as(path, path, count_allocs)
}

/// [`scan_packets`] of `path`, which messages name `name`.
pub(crate) fn scan_packets_as(path: &Path, name: &Path, count_allocs: bool) -> Result<PacketScan> {
    use std::io::{Seek, SeekFrom};
    let mut f = File::open(path).map_err(|e| Error::input(name, "open", e))?;
    let len = f
        .metadata()
        .map_err(|e| Error::input(name, "stat", e))?
        .len();
    let mut off = 0u64;
    let mut scan = PacketScan::default();
    let mut seen = vec![false; 1 << 16];
    let mut hdr = [0u8; 68];
    let mut first = true;
    while off < len {
        f.seek(SeekFrom::Start(off))
            .map_err(|e| Error::input(name, "seek", e))?;
        let n = (len - off).min(68) as usize;
        if f.read_exact(&mut hdr[..n]).is_err() {
            break;
        }
        let h = match PacketHeader::parse(&mut Cursor::new(&hdr[..n])) {
            Ok(h) => h,
            Err(_) => break,
        };
        if h.version < 3 {
            if !count_allocs {
                scan.domains = vec![0];
                return Ok(scan);
            }
            // (the reader skips packets out of sequence: the last id counts them all)
            if h.size <= len - off {
                scan.alloc_ids = scan.alloc_ids.max(h.alloc_id_end);
            }
        } else if h.size <= len - off {
            scan.alloc_ids += h.alloc_id_end.saturating_sub(h.alloc_id_begin);
        }
        // a packet that is only its header holds no event: it needs no stream
        let has_events = h.size > header_size(h.version) as u64;
        if h.version >= 3 && (first || has_events) && !seen[h.domain as usize] {
            seen[h.domain as usize] = true;
            scan.domains.push(h.domain);
            if scan.domains.len() > MAX_MERGE_DOMAINS {
                return Err(Error::Incompatible(format!(
                    "{}: more than {MAX_MERGE_DOMAINS} domains with events (another one at byte {off}); merging so many domains of one trace is not supported",
                    name.display()
                )));
            }
        }
        first = false;
        off += h.size;
    }
    if scan.domains.is_empty() {
        scan.domains.push(0);
    }
    Ok(scan)
}
