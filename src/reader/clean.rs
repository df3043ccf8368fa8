//! A trace read whole in one tight loop a packet, for a merge that copies its packets: the
//! events as [`Reader::read_events`] gives them, or why the reader would not read it cleanly.

use super::body::{read_event_body, EventSink};
use super::Reader;
use crate::error::Result;
use crate::format::buf::Cursor;
use crate::format::packet::{header_size, PacketHeader};
use std::io::Read;

impl<R: Read> Reader<R> {
    /// Read every remaining event into `sink` (each code a location event defines before
    /// the event after it), each parsed as [`Reader::read_events`] parses it; Ok(Some(why))
    /// at the first thing that reader would skip, warn of or stop at (what was read before
    /// it handed to `sink`), or once the sink says it is full. For a whole trace, faster:
    /// one cursor a packet. A sink that looks at no frames ([`EventSink::backtraces`]) gets
    /// empty backtraces, each checked all the same.
    pub fn read_clean(&mut self, sink: &mut impl EventSink) -> Result<Option<String>> {
        self.read_clean_with(sink, |_, _, _| {})
    }

    /// [`Reader::read_clean`], each packet's header shown to `packet` before its events,
    /// with its body's length and its offset in the file.
    pub(crate) fn read_clean_with(
        &mut self,
        sink: &mut impl EventSink,
        packet: impl FnMut(&PacketHeader, usize, u64),
    ) -> Result<Option<String>> {
        // (one stream: promotes and collects of another domain's ids stay as read)
        self.parse_backtraces = true;
        self.only_domain = None;
        match sink.backtraces() {
            true => self.clean_loop::<false>(sink, packet),
            false => self.clean_loop::<true>(sink, packet),
        }
    }

    /// [`Reader::read_clean_with`]'s loop; with `WALK`, backtraces run through the cache
    /// only.
    fn clean_loop<const WALK: bool>(
        &mut self,
        sink: &mut impl EventSink,
        mut packet: impl FnMut(&PacketHeader, usize, u64),
    ) -> Result<Option<String>> {
        loop {
            let at = self.base + self.start as u64;
            let refuse = |why: &str| Ok(Some(format!("{why} at byte {at}")));
            let Some(h) = self.read_header()? else {
                return match self.warnings.first() {
                    Some(w) => Ok(Some(w.to_string())),
                    None => Ok(None),
                };
            };
            let size = h.size as usize;
            if self.fill(size)? < size {
                return refuse("a packet cut short");
            }
            let v3 = h.version >= 3;
            let d = self.domain_slot(h.domain);
            let ds = &mut self.domains[d];
            if h.pid != self.info.pid {
                return refuse("a packet of another pid");
            }
            if !v3 && (self.last_time > h.time_begin || self.alloc_id != h.alloc_id_begin) {
                return refuse("a packet out of the alloc-id or time sequence");
            }
            if v3 && ds.last_time > h.time_begin {
                return refuse("a packet before its domain's last event");
            }
            if v3 {
                self.alloc_id = h.alloc_id_begin;
            }
            if !ds.cache.verify(&h.verifier) {
                return refuse("a cache verifier that does not match");
            }
            let body = self.start + header_size(h.version)..self.start + size;
            packet(&h, body.len(), at);
            let mut c = Cursor::new(&self.buf[body.clone()]);
            while c.remaining() > 0 {
                let ev_at = body.start + c.pos();
                let p = read_event_body(
                    &mut c,
                    &h,
                    ds,
                    &mut self.last_time,
                    &mut self.alloc_id,
                    &mut self.locations,
                    &mut self.new_codes,
                    true,
                    WALK,
                );
                for code in self.new_codes.drain(..) {
                    if let Some(l) = self.locations.get_mut(&code) {
                        // (the pool's copy, as read_events keeps)
                        if let Some(pool) = &self.pool {
                            *l = pool.intern(l);
                        }
                        sink.location(code, l);
                    }
                }
                match p {
                    Ok(None) => {}
                    Ok(Some(p)) => {
                        let frames = if WALK { &[] } else { ds.cache.backtrace() };
                        p.give(sink, frames, &[]);
                        if sink.full() {
                            return Ok(Some("stopped by its reader".into()));
                        }
                    }
                    Err(e) => {
                        let at = self.base + ev_at as u64;
                        return Ok(Some(format!("{e} at byte {at}")));
                    }
                }
            }
            if self.alloc_id != h.alloc_id_end {
                return refuse("a packet whose alloc-id range is not its allocations'");
            }
            self.start += size;
            self.packet_index += 1;
        }
    }
}
