//! The writer's allocations: the backtrace after the frames it shares with its domain's
//! previous one, through the cache (hinted, or encoded ahead by the caller), a deep one
//! moved to a packet of its own rather than cut.

use super::{common_prefix, Writer, MAX_EV_SIZE};
use crate::error::{Error, Result};
use crate::format::backtrace::{self};
use crate::format::buf::WriteBuf;
use crate::format::event::{
    AllocHeader, AllocSource, DomainId, EventCode, LocationCode, ObjId, Timestamp,
};
use crate::format::location::LocationList;
use crate::format::packet::MAX_PACKET_SIZE;
use std::io::Write;

impl<W: Write> Writer<W> {
    /// Write an allocation with its backtrace (caller-first). `resolve` gives the locations
    /// of a code the first time it misses the cache (and again after eviction).
    /// Returns the id the allocation gets in this trace.
    pub fn put_alloc(
        &mut self,
        header: &AllocHeader,
        backtrace: &[LocationCode],
        resolve: impl FnMut(LocationCode) -> Option<LocationList>,
    ) -> Result<ObjId> {
        let AllocHeader {
            time,
            domain,
            length,
            nsamples,
            source,
        } = *header;
        let si = self.stream_at(domain, time.0)?;
        let s = &mut self.streams[si];
        let common = common_prefix(&s.last_backtrace, backtrace);
        let new = &backtrace[common..];
        s.last_backtrace.truncate(common);
        s.last_backtrace.extend_from_slice(new);
        self.put_alloc_in(
            si,
            time,
            length,
            nsamples,
            source,
            common,
            new,
            &mut [],
            resolve,
        )
    }

    /// Like [`Writer::put_alloc`], for a caller that knows what the backtrace shares with
    /// the previous allocation of this domain: its first `common` frames are that one's,
    /// followed by `new`. Any `common` up to the longest shared prefix makes a valid trace
    /// (the longest gives the reference's bytes); the writer then keeps no backtrace of its
    /// own, so a writer is fed through this or [`Writer::put_alloc`], not both.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn put_alloc_after(
        &mut self,
        time: Timestamp,
        domain: DomainId,
        length: u64,
        nsamples: u64,
        source: AllocSource,
        common: usize,
        new: &[LocationCode],
        resolve: impl FnMut(LocationCode) -> Option<LocationList>,
    ) -> Result<ObjId> {
        let (d, l, n, s) = (domain, length, nsamples, source);
        self.put_alloc_hinted(time, d, l, n, s, common, new, &mut [], resolve)
    }

    /// [`Writer::put_alloc_after`] with a hint per new frame (`hints`, as long as `new`):
    /// the cache entry it was in when last encoded, any value if unknown. Same bytes; the
    /// encoder checks each hint, and a right one spares it waiting on the prediction before.
    /// On return the hints of the encoded frames are their entries.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn put_alloc_hinted(
        &mut self,
        time: Timestamp,
        domain: DomainId,
        length: u64,
        nsamples: u64,
        source: AllocSource,
        common: usize,
        new: &[LocationCode],
        hints: &mut [u16],
        resolve: impl FnMut(LocationCode) -> Option<LocationList>,
    ) -> Result<ObjId> {
        let si = self.stream_at(domain, time.0)?;
        self.put_alloc_in(
            si, time, length, nsamples, source, common, new, hints, resolve,
        )
    }

    /// Write an allocation whose backtrace the caller encoded: its first `common` frames
    /// the previous allocation's (of the domain; 0 for a backtrace sent whole, as
    /// `Share::encode` writes them), then `ncodes` codewords in `codewords`
    /// for `nframes` frames. `misses` are the codes sent
    /// whole among them, whose locations go out before the packet. A domain's allocations
    /// all come this way, or none do: the writer's own cache then knows nothing of the
    /// reader's, and packets carry no cache verifier.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn put_alloc_encoded(
        &mut self,
        time: Timestamp,
        domain: DomainId,
        length: u64,
        nsamples: u64,
        source: AllocSource,
        common: usize,
        nframes: usize,
        ncodes: usize,
        codewords: &[u8],
        misses: &[LocationCode],
        mut resolve: impl FnMut(LocationCode) -> Option<LocationList>,
    ) -> Result<ObjId> {
        let si = self.stream_at(domain, time.0)?;
        let s = &mut self.streams[si];
        s.encoded = true;
        if codewords.len() > backtrace::MAX_LENGTH {
            // a long encoding: in a packet with the room (begin_event leaves only 4 KiB)
            let hdr = crate::format::packet::header_size(self.version);
            let room = MAX_PACKET_SIZE - s.packet.len();
            if s.packet.len() > hdr && room < MAX_EV_SIZE - backtrace::MAX_LENGTH + codewords.len()
            {
                self.flush_cold(si, time.0)?;
            }
        }
        let code = alloc_event(length, nsamples, source, nframes);
        self.begin_event(si, code, time.0)?;
        let s = &mut self.streams[si];
        let id = s.next_id;
        s.next_id += 1;
        let b = &mut s.packet;
        let nenc_at = put_alloc_fields(b, code, length, nsamples, source, common);
        b.extend(codewords);
        set_codeword_count(b, code, nenc_at, ncodes);
        for &c in misses {
            match resolve(c) {
                Some(l) => s.new_locs.push((c, l)),
                None => return Err(no_locations(c)),
            }
        }
        self.stats.allocs += 1;
        Ok(ObjId(id))
    }

    /// [`Writer::put_alloc_in`] for the usual case, a backtrace short enough that the
    /// reference budget always holds it (so there is nothing to undo or cut).
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn put_alloc_whole(
        &mut self,
        si: usize,
        time: Timestamp,
        length: u64,
        nsamples: u64,
        source: AllocSource,
        common: usize,
        new: &[LocationCode],
        hints: &mut [u16],
        mut resolve: impl FnMut(LocationCode) -> Option<LocationList>,
    ) -> Result<ObjId> {
        let code = alloc_event(length, nsamples, source, new.len());
        self.begin_event(si, code, time.0)?;
        let s = &mut self.streams[si];
        let id = s.next_id;
        s.next_id += 1;
        let b = &mut s.packet;
        let nenc_at = put_alloc_fields(b, code, length, nsamples, source, common);
        let limit = b.len() + backtrace::MAX_LENGTH - backtrace::MAX_ENTRY;
        let new_locs = &mut s.new_locs;
        let mut missing = None;
        let on_miss = |i: usize, _| match resolve(new[i]) {
            Some(l) => new_locs.push((new[i], l)),
            None => missing = Some(new[i]),
        };
        let (ncodes, _) = if hints.len() >= new.len() && !new.is_empty() {
            s.cache
                .encode_hinted(b, id as i64, new, hints, limit, on_miss)
        } else {
            s.cache
                .encode::<false>(b, id as i64, new, limit, None, on_miss)
        };
        if let Some(c) = missing {
            return Err(no_locations(c));
        }
        set_codeword_count(b, code, nenc_at, ncodes);
        self.stats.allocs += 1;
        Ok(ObjId(id))
    }

    #[allow(clippy::too_many_arguments)]
    #[inline]
    fn put_alloc_in(
        &mut self,
        si: usize,
        time: Timestamp,
        length: u64,
        nsamples: u64,
        source: AllocSource,
        common: usize,
        new: &[LocationCode],
        hints: &mut [u16],
        resolve: impl FnMut(LocationCode) -> Option<LocationList>,
    ) -> Result<ObjId> {
        if always_fits(new.len()) && self.streams[si].cut.is_none() {
            return self.put_alloc_whole(
                si, time, length, nsamples, source, common, new, hints, resolve,
            );
        }
        self.put_alloc_deep(si, time, length, nsamples, source, common, new, resolve)
    }

    /// [`Writer::put_alloc_in`] for a backtrace that may not fit the reference budget, or
    /// after one was cut (rare: kept out of the callers' way).
    #[allow(clippy::too_many_arguments)]
    #[cold]
    #[inline(never)]
    fn put_alloc_deep(
        &mut self,
        si: usize,
        time: Timestamp,
        length: u64,
        nsamples: u64,
        source: AllocSource,
        common: usize,
        new: &[LocationCode],
        mut resolve: impl FnMut(LocationCode) -> Option<LocationList>,
    ) -> Result<ObjId> {
        // After a backtrace had to be cut, the reader holds only its encoded part: frames
        // this one shares beyond the cut are sent again.
        let joined;
        let (common, new) = match self.streams[si].cut.take() {
            Some((at, tail)) if common > at => {
                joined = [&tail[..(common - at).min(tail.len())], new].concat();
                (at, &joined[..])
            }
            _ => (common, new),
        };
        let code = alloc_event(length, nsamples, source, new.len());
        let journal = self.lossless && !always_fits(new.len());
        let mut missing = None;
        let mut attempt = 0;
        loop {
            let s = &self.streams[si];
            let saved = (s.packet.len(), s.new_locs.len(), s.time_end, s.next_id);
            let packets_before = self.stats.packets;
            self.begin_event(si, code, time.0)?;
            let s = &mut self.streams[si];
            let id = s.next_id;
            s.next_id += 1;
            let b = &mut s.packet;
            let nenc_at = put_alloc_fields(b, code, length, nsamples, source, common);
            let limit = if attempt == 0 {
                b.len() + backtrace::MAX_LENGTH - backtrace::MAX_ENTRY
            } else {
                MAX_PACKET_SIZE - backtrace::MAX_ENTRY
            };
            let new_locs = &mut s.new_locs;
            self.journal.clear();
            let (ncodes, done) = s.cache.encode::<true>(
                b,
                id as i64,
                new,
                limit,
                if journal {
                    Some(&mut self.journal)
                } else {
                    None
                },
                |i, _| match resolve(new[i]) {
                    Some(l) => new_locs.push((new[i], l)),
                    None => missing = Some(new[i]),
                },
            );
            if let Some(c) = missing {
                return Err(no_locations(c));
            }
            if done < new.len() && journal && attempt > 0 {
                // Not even a whole packet holds it: keep what fits (the reference would have
                // kept less) and remember the rest for the next backtrace's shared frames.
                s.cut = Some((common + done, new[done..].to_vec()));
                self.stats.cut_backtraces += 1;
            } else if done < new.len() && journal {
                // Undo this attempt and retry in a fresh packet with the whole packet's room.
                s.cache.rollback(&mut self.journal);
                let (plen, nlocs, tend, nid) = saved;
                let flushed = self.stats.packets != packets_before;
                let hdr = crate::format::packet::header_size(self.version);
                if flushed {
                    // begin_event flushed: the packet holds only this event; drop it.
                    s.packet.truncate(hdr);
                    s.new_locs.clear();
                    s.next_id -= 1;
                    s.time_end = time.0;
                } else {
                    s.packet.truncate(plen);
                    s.new_locs.truncate(nlocs);
                    s.time_end = tend;
                    s.next_id = nid;
                    if s.packet.len() > hdr {
                        self.flush_at(si, time.0)?;
                    }
                }
                self.stats.relocated_backtraces += 1;
                attempt += 1;
                continue;
            }
            set_codeword_count(&mut s.packet, code, nenc_at, ncodes);
            self.stats.allocs += 1;
            return Ok(ObjId(id));
        }
    }
}

/// Whether `new` frames always fit the reference's backtrace budget: at worst 10 bytes a
/// frame, so their encoding can never be truncated.
#[inline(always)]
fn always_fits(new: usize) -> bool {
    new * backtrace::MAX_ENTRY < backtrace::MAX_LENGTH - backtrace::MAX_ENTRY
}

/// The reference's event for an allocation: the short form for a small minor allocation of
/// one sample with fewer than 256 new frames.
#[inline(always)]
fn alloc_event(length: u64, nsamples: u64, source: AllocSource, new: usize) -> EventCode {
    if (1..=16).contains(&length) && source == AllocSource::Minor && nsamples == 1 && new < 256 {
        EventCode::ShortAlloc(length as u8)
    } else {
        EventCode::Alloc
    }
}

/// An allocation's fields after its header, with room for its codeword count (whose offset
/// this returns, for [`set_codeword_count`]).
#[inline(always)]
fn put_alloc_fields(
    b: &mut WriteBuf,
    code: EventCode,
    length: u64,
    nsamples: u64,
    source: AllocSource,
    common: usize,
) -> usize {
    if let EventCode::ShortAlloc(_) = code {
        b.vint(common as i64);
        b.skip(1)
    } else {
        b.vint(length as i64);
        b.vint(nsamples as i64);
        b.u8(source as u8);
        b.vint(common as i64);
        b.skip(2)
    }
}

/// Fill in the codeword count that [`put_alloc_fields`] left room for.
#[inline(always)]
fn set_codeword_count(b: &mut WriteBuf, code: EventCode, at: usize, ncodes: usize) {
    if let EventCode::ShortAlloc(_) = code {
        b.set_u8(at, ncodes as u8);
    } else {
        b.set_u16(at, ncodes.min(0xffff) as u16);
    }
}

#[cold]
#[inline(never)]
fn no_locations(code: LocationCode) -> Error {
    Error::Write(format!(
        "location code {:#x} has no known locations",
        code.0
    ))
}
