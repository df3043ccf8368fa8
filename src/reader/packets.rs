//! The reader's packets: the input read into its buffer, each packet header checked and the
//! packet taken or skipped, each event parsed in its packet.

use super::body::{read_event_body, Pending};
use super::{DomainState, Reader};
use crate::error::{Error, Malformed, Result};
use crate::format::buf::Cursor;
use crate::format::event::{decode_header, EventCode};
use crate::format::info::TraceInfo;
use crate::format::packet::{header_size, PacketHeader};
use std::io::{ErrorKind, Read};

impl<R: Read> Reader<R> {
    /// Make at least `n` bytes available from `start`, unless the input ends first.
    /// Returns how many are available (≤ n only at end of input). Grows the buffer only as
    /// data actually arrives, so a bogus declared size cannot make it allocate.
    pub(super) fn fill(&mut self, n: usize) -> Result<usize> {
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
                let want = (self.buf.len() * 2)
                    .max(self.chunk)
                    .min(self.start + n.max(self.chunk));
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
    pub(super) fn read_header(&mut self) -> Result<Option<PacketHeader>> {
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

    pub(super) fn read_info(&mut self) -> Result<()> {
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

    pub(super) fn domain_slot(&mut self, d: u16) -> usize {
        if let Some(&i) = self.domain_index.get(&d) {
            return i;
        }
        let i = self.domains.len();
        self.domains.push(DomainState {
            last_time: self.info.start_time.0,
            ..Default::default()
        });
        self.domains[i].cache.keep_slots(self.keep_slots);
        self.domains[i].cache.sparse(self.window.is_some());
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
            // (windowed: a packet whole in the file is read a window at a time)
            self.windowed = self.window.is_some_and(|w| {
                size > w && self.base + (self.start + size) as u64 <= self.file_len
            });
            let avail = match self.window {
                Some(w) if self.windowed => match self.fill(w)? {
                    a if a < w => {
                        self.windowed = false;
                        self.fill(size)?
                    }
                    _ => size,
                },
                _ => self.fill(size)?,
            };
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
                    self.skip_packet()?;
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
                self.skip_packet()?;
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

    /// Go past the current packet, unread (windowed, what of it is not in the buffer is
    /// read and dropped).
    fn skip_packet(&mut self) -> Result<()> {
        if self.pkt_end <= self.end {
            self.start = self.pkt_end;
            return Ok(());
        }
        let mut left = self.pkt_end - self.end;
        self.base += self.end as u64;
        (
            self.start,
            self.end,
            self.pkt_start,
            self.pkt_pos,
            self.pkt_end,
        ) = (0, 0, 0, 0, 0);
        while left > 0 && !self.eof {
            let room = left.min(self.buf.len());
            match self.src.read(&mut self.buf[..room]) {
                Ok(0) => self.eof = true,
                Ok(k) => {
                    self.base += k as u64;
                    left -= k;
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(Error::input(&self.name, "read", e)),
            }
        }
        Ok(())
    }

    /// Windowed: make the next event's bytes available (at most the most its fields say
    /// it can take; a location event, the rest of the packet), consumed bytes let go.
    /// Nothing is parsed for good before its bytes are all there: decoding a backtrace
    /// changes the cache as it goes.
    #[cold]
    #[inline(never)]
    fn window_for_event(&mut self) -> Result<()> {
        let left = self.pkt_end - self.pkt_pos;
        let w = self.window.unwrap_or(0);
        self.start = self.pkt_pos;
        loop {
            let have = self.end - self.pkt_pos;
            if have >= left {
                self.windowed = false;
                return Ok(());
            }
            let need = self.event_bound(&self.buf[self.pkt_pos..self.end]);
            if have >= need {
                return Ok(());
            }
            let want = need.max(w).min(left);
            if self.fill(want)? < want {
                // (the packet was whole in the file when its header was read)
                self.done = true;
                let e = std::io::Error::new(
                    ErrorKind::UnexpectedEof,
                    "the file became shorter while it was read",
                );
                return Err(Error::input(&self.name, "read", e));
            }
        }
    }

    /// The most bytes the event starting `b` may take, as far as `b` tells (more than `b`
    /// holds when its fields are cut; `usize::MAX` for a location event).
    fn event_bound(&self, b: &[u8]) -> usize {
        const FIELDS: usize = 64;
        let mut c = Cursor::new(b);
        let Ok(word) = c.u32() else {
            return FIELDS;
        };
        match decode_header(word, self.header.time_begin, self.header.time_end) {
            Ok((EventCode::Location, _)) => usize::MAX,
            Ok((code @ (EventCode::Alloc | EventCode::ShortAlloc(_)), _)) => {
                match super::body::alloc_fields(&mut c, code) {
                    Ok((.., nencoded)) => c.pos() + nencoded * crate::format::backtrace::MAX_ENTRY,
                    Err(_) => FIELDS,
                }
            }
            // (a promote or collect: its fields; an error: the word tells it)
            _ => FIELDS,
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
        if self.windowed {
            self.window_for_event()?;
        }
        let at = self.pkt_pos;
        let defined = self.new_codes.len();
        let mut c = Cursor::new(&self.buf[self.pkt_pos..self.pkt_end.min(self.end)]);
        let r = read_event_body(
            &mut c,
            &self.header,
            &mut self.domains[self.cur],
            &mut self.last_time,
            &mut self.alloc_id,
            &mut self.locations,
            &mut self.new_codes,
            self.parse_backtraces,
            false,
        );
        let used = c.pos();
        if self.new_codes.len() > defined {
            self.pool_locations(defined);
        }
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

    /// The codes defined from `new_codes[from]` on: their lists the pool's copies, if the
    /// reader shares a pool.
    #[cold]
    #[inline(never)]
    fn pool_locations(&mut self, from: usize) {
        if let Some(pool) = &self.pool {
            for code in &self.new_codes[from..] {
                if let Some(l) = self.locations.get_mut(code) {
                    *l = pool.intern(l);
                }
            }
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
    pub(super) fn next_pending(&mut self) -> Result<Option<Option<Pending>>> {
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
}
