//! A trace writer (format 2 or 3) making exactly the reference writer's decisions: packet
//! flushes, location packets, cache hashing and eviction, verifiers, format-3 id chunks.

mod alloc;

use crate::error::{Error, Result};
pub use crate::format::backtrace::common_prefix;
use crate::format::backtrace::{self, CacheWriter, Journal};
use crate::format::buf::WriteBuf;
use crate::format::event::{
    encode_header, DomainId, EventCode, LocationCode, ObjId, Timestamp, PACKET_MAX_TIME,
};
use crate::format::info::TraceInfo;
use crate::format::location::{
    IntMap, LocationCodec, LocationList, MAX_LENGTH as LOCATION_MAX_LENGTH,
};
use crate::format::packet::{CacheVerifier, PacketHeader, MAX_PACKET_SIZE, NO_VERIFIER};
use std::io::Write;

/// Fixed-size part of any event (upper bound) plus the larger of the two encoding budgets.
const MAX_EV_SIZE: usize = 100 + backtrace::MAX_LENGTH;
/// The owner of an id chunk reserved for packets copied whole ([`Writer::reserve_ids`]).
const COPIED_CHUNK: u32 = u32::MAX;

/// Format-3 writers hand out object ids in chunks of this many per domain.
pub const IDS_PER_CHUNK: u64 = 10_000;
/// A packet with more new locations than this is flushed before the next event.
const MAX_NEW_LOCS: usize = 128;

/// How to write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WriterOptions {
    /// Format version: 2 (memtrace ≤ 0.2.x, one stream) or 3 (per-domain streams).
    pub version: u16,
    /// Never truncate a backtrace: when one does not fit the reference's 4 KiB budget, it
    /// is moved to a fresh packet and encoded in the packet's room (up to 32 KiB).
    /// Output is byte-identical to the reference whenever the reference would not truncate.
    pub lossless: bool,
}

impl Default for WriterOptions {
    fn default() -> Self {
        WriterOptions {
            version: 2,
            lossless: false,
        }
    }
}

/// The state of one domain's stream of packets.
struct Stream {
    domain: u16,
    codec: LocationCodec,
    cache: CacheWriter,
    new_locs: Vec<(LocationCode, LocationList)>,
    /// The previous allocation's backtrace, caller-first.
    last_backtrace: Vec<LocationCode>,
    start_id: u64,
    next_id: u64,
    /// End of the current id chunk (format 3); u64::MAX in format 2.
    last_id: u64,
    time_start: u64,
    time_end: u64,
    packet: WriteBuf,
    /// Where the previous backtrace was cut (lossless mode), and the frames left out.
    cut: Option<(usize, Vec<LocationCode>)>,
    /// Backtraces come encoded by the caller ([`Writer::put_alloc_encoded`]): `cache`
    /// knows nothing of them, so packets carry no cache verifier.
    encoded: bool,
}

impl Stream {
    /// The reference's reasons to flush before an event: the packet nearly full, many new
    /// locations, a span over 30 s, or (format 3) the id chunk used up.
    #[inline(always)]
    fn must_flush(&self, now: u64) -> bool {
        MAX_PACKET_SIZE - self.packet.len() < MAX_EV_SIZE
            || self.new_locs.len() > MAX_NEW_LOCS
            || (now as i64).wrapping_sub(self.time_start as i64) > PACKET_MAX_TIME as i64
            || self.next_id >= self.last_id
    }
}

/// Counts of what was written.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct WriteStats {
    /// Packets written, the trace-info packet included.
    pub packets: u64,
    /// Bytes written.
    pub bytes: u64,
    /// Allocations written.
    pub allocs: u64,
    /// Promotes written.
    pub promotes: u64,
    /// Collects written.
    pub collects: u64,
    /// Backtraces that did not fit the reference budget and were moved to a fresh packet.
    pub relocated_backtraces: u64,
    /// Backtraces too deep for one whole packet (lossless mode), kept cut to what fits.
    pub cut_backtraces: u64,
}

/// Writes one trace.
pub struct Writer<W: Write> {
    out: W,
    /// named in I/O errors
    path: std::path::PathBuf,
    version: u16,
    pid: u64,
    start_time: u64,
    lossless: bool,
    switch_flush: bool,
    streams: Vec<Stream>,
    stream_of: IntMap<u16, usize>,
    last: usize,
    /// Next free id chunk (format 3).
    global_ids: u64,
    /// (format 3) The stream each id chunk was handed to, in chunk order.
    chunk_owner: Vec<u32>,
    loc_buf: WriteBuf,
    journal: Journal,
    stats: WriteStats,
    /// End a trace of nothing but its info packet without an empty packet.
    end_bare: bool,
    /// The codes whose locations were written, when each is written once
    /// ([`Writer::set_locations_once`]); None: at every cache miss, as the reference.
    sent: Option<IntMap<LocationCode, ()>>,
}

impl<W: Write> Writer<W> {
    /// Start a trace: writes the info packet.
    pub fn new(out: W, info: &TraceInfo, opts: WriterOptions) -> Result<Self> {
        if !(2..=3).contains(&opts.version) {
            return Err(Error::Usage(format!(
                "cannot write format version {}",
                opts.version
            )));
        }
        let domain = if opts.version >= 3 {
            info.initial_domain.0
        } else {
            0
        };
        let mut w = Writer {
            out,
            path: "<output>".into(),
            version: opts.version,
            pid: info.pid,
            start_time: info.start_time.0,
            lossless: opts.lossless,
            switch_flush: true,
            end_bare: false,
            streams: Vec::new(),
            stream_of: IntMap::default(),
            last: 0,
            global_ids: 0,
            chunk_owner: Vec::new(),
            loc_buf: WriteBuf::with_capacity(MAX_PACKET_SIZE),
            journal: Journal::default(),
            stats: WriteStats::default(),
            sent: None,
        };
        let mut b = WriteBuf::with_capacity(1024);
        PacketHeader::start(&mut b, w.version, w.pid, domain, dummy_verifier());
        let mut info = info.clone();
        info.version = w.version;
        info.encode(&mut b);
        PacketHeader::finish(&mut b, w.version, w.start_time, w.start_time, 0, 0);
        if b.len() > MAX_PACKET_SIZE {
            return Err(Error::Usage(format!(
                "trace info of {} bytes (names, context): memtrace reads at most {MAX_PACKET_SIZE}",
                b.len()
            )));
        }
        w.emit(b.bytes())?;
        let s = w.new_stream(domain);
        w.streams.push(s);
        w.stream_of.insert(domain, 0);
        Ok(w)
    }

    /// A trace of nothing but its info packet ends so, where the reference (and this writer
    /// by default) ends every trace with a packet, empty if need be: a copy of a trace that
    /// has no other packet (its process killed before its first) is then the same bytes.
    pub fn set_end_without_empty_packet(&mut self) {
        self.end_bare = true;
    }

    /// The path that I/O errors name (default `<output>`).
    pub fn set_output_path(&mut self, path: &std::path::Path) {
        self.path = path.to_path_buf();
    }

    /// Format 3: whether switching domains flushes the previous domain's packet, as the
    /// reference's multiplexed writer does (default). Without it, each domain keeps its
    /// packet open until full, so interleaved domains still make full packets.
    pub fn set_flush_on_domain_switch(&mut self, yes: bool) {
        self.switch_flush = yes;
    }

    /// Fault in the pages of its streams' tables now, rather than one by one as they are
    /// used (the merging thread does it while it waits for its inputs' first events).
    pub fn fault_in(&mut self) {
        for s in &mut self.streams {
            s.cache.fault_in();
        }
    }

    /// Its output.
    pub fn get_mut(&mut self) -> &mut W {
        &mut self.out
    }

    /// Counts of what was written so far.
    pub fn stats(&self) -> &WriteStats {
        &self.stats
    }
    /// The format version written (2 or 3).
    pub fn version(&self) -> u16 {
        self.version
    }

    fn emit(&mut self, bytes: &[u8]) -> Result<()> {
        self.out
            .write_all(bytes)
            .map_err(|e| Error::output(&self.path, "write", e))?;
        self.stats.packets += 1;
        self.stats.bytes += bytes.len() as u64;
        Ok(())
    }

    fn new_stream(&mut self, domain: u16) -> Stream {
        let (next_id, last_id) = if self.version >= 3 {
            let n = self.global_ids;
            self.global_ids += IDS_PER_CHUNK;
            // (the stream is pushed next)
            self.chunk_owner.push(self.streams.len() as u32);
            (n, n + IDS_PER_CHUNK)
        } else {
            (0, u64::MAX)
        };
        let mut packet = WriteBuf::with_capacity(MAX_PACKET_SIZE);
        PacketHeader::start(
            &mut packet,
            self.version,
            self.pid,
            domain,
            dummy_verifier(),
        );
        Stream {
            domain,
            codec: LocationCodec::default(),
            cache: CacheWriter::default(),
            new_locs: Vec::new(),
            last_backtrace: Vec::new(),
            start_id: next_id,
            next_id,
            last_id,
            time_start: self.start_time,
            time_end: self.start_time,
            packet,
            cut: None,
            encoded: false,
        }
    }

    /// The stream of `domain`, switching to it as the reference's multiplexed writer does
    /// (flushing the previous domain's packet first).
    /// The stream of `domain`, checking that `now` does not go back in its time.
    #[inline(always)]
    fn stream_at(&mut self, domain: DomainId, now: u64) -> Result<usize> {
        let cur = self.last;
        if let Some(s) = self.streams.get(cur) {
            if s.domain == domain.0 && now >= s.time_end {
                return Ok(cur);
            }
        }
        self.stream_at_slow(domain, now)
    }

    #[cold]
    #[inline(never)]
    fn stream_at_slow(&mut self, domain: DomainId, now: u64) -> Result<usize> {
        let si = self.select(domain)?;
        self.check_time(si, now)?;
        Ok(si)
    }

    fn select(&mut self, domain: DomainId) -> Result<usize> {
        let cur = self.last;
        if self.streams[cur].domain == domain.0 {
            return Ok(cur);
        }
        if self.version < 3 {
            return Err(Error::Write(format!(
                "format 2 has no domains (event of domain {})",
                domain.0
            )));
        }
        if self.switch_flush {
            let now = self.streams[cur].time_end;
            self.flush_at(cur, now)?;
        }
        let i = match self.stream_of.get(&domain.0) {
            Some(&i) => i,
            None => {
                let s = self.new_stream(domain.0);
                self.streams.push(s);
                let i = self.streams.len() - 1;
                self.stream_of.insert(domain.0, i);
                i
            }
        };
        self.last = i;
        Ok(i)
    }

    #[cold]
    #[inline(never)]
    fn flush_cold(&mut self, si: usize, now: u64) -> Result<()> {
        self.flush_at(si, now)
    }

    /// Write each code's locations once, before its first use, rather than at every miss of
    /// the cache as the reference writer does: the reader keeps one table of them per
    /// trace. A merge of many streams taking turns in one cache misses often, and spent a
    /// quarter of its time writing locations again (benches/PERFORMANCE.md, "Many inputs").
    pub fn set_locations_once(&mut self, yes: bool) {
        self.sent = yes.then(IntMap::default);
    }

    /// Write the stream's pending location packets and its events packet; start a new one.
    fn flush_at(&mut self, si: usize, now: u64) -> Result<()> {
        let version = self.version;
        let pid = self.pid;
        if let Some(sent) = &mut self.sent {
            // (marked now: they are written below, before the packet that needs them)
            (self.streams[si].new_locs).retain(|(c, _)| sent.insert(*c, ()).is_none());
        }
        let mut i = 0;
        while i < self.streams[si].new_locs.len() {
            let mut b = std::mem::take(&mut self.loc_buf);
            b.clear();
            let s = &mut self.streams[si];
            PacketHeader::start(&mut b, version, pid, s.domain, dummy_verifier());
            while i < s.new_locs.len() && MAX_PACKET_SIZE - b.len() > LOCATION_MAX_LENGTH {
                b.u32(encode_header(EventCode::Location, Timestamp(s.time_start)));
                let (code, locs) = &s.new_locs[i];
                s.codec.encode(&mut b, *code, locs);
                i += 1;
            }
            PacketHeader::finish(
                &mut b,
                version,
                s.time_start,
                s.time_start,
                s.start_id,
                s.start_id,
            );
            let r = self.emit(b.bytes());
            self.loc_buf = b;
            r?;
        }
        let s = &mut self.streams[si];
        PacketHeader::finish(
            &mut s.packet,
            version,
            s.time_start,
            s.time_end,
            s.start_id,
            s.next_id,
        );
        let packet = std::mem::take(&mut s.packet);
        let r = self.emit(packet.bytes());
        let s = &mut self.streams[si];
        s.packet = packet;
        r?;
        s.time_start = now;
        s.time_end = now;
        s.new_locs.clear();
        s.packet.clear();
        if s.next_id >= s.last_id {
            s.next_id = self.global_ids;
            s.last_id = self.global_ids + IDS_PER_CHUNK;
            self.global_ids += IDS_PER_CHUNK;
            self.chunk_owner.push(si as u32);
        }
        s.start_id = s.next_id;
        let v = if s.encoded {
            dummy_verifier()
        } else {
            s.cache.next_verifier()
        };
        PacketHeader::start(&mut s.packet, version, pid, s.domain, v);
        Ok(())
    }

    fn check_time(&self, si: usize, now: u64) -> Result<()> {
        let s = &self.streams[si];
        if now < s.time_end {
            return Err(Error::Write(format!(
                "out-of-order timestamps: event at {now} after {} (domain {})",
                s.time_end, s.domain
            )));
        }
        Ok(())
    }

    /// The reference's `begin_event`: flush when the packet is nearly full, has many new
    /// locations, would span over 30 s, or (format 3) the id chunk is used up.
    #[inline(always)]
    fn begin_event(&mut self, si: usize, code: EventCode, now: u64) -> Result<()> {
        if self.streams[si].must_flush(now) {
            self.flush_cold(si, now)?;
        }
        let s = &mut self.streams[si];
        s.time_end = now;
        s.packet.u32(encode_header(code, Timestamp(now)));
        Ok(())
    }

    #[inline(always)]
    fn put_id_event(
        &mut self,
        code: EventCode,
        time: Timestamp,
        domain: DomainId,
        id: ObjId,
    ) -> Result<()> {
        let now = time.0;
        let si = self.stream_at(domain, now)?;
        let v2 = self.version < 3;
        let s = &mut self.streams[si];
        if v2 && id.0 >= s.next_id {
            return Err(not_allocated(code, id));
        }
        if s.must_flush(now) {
            self.flush_cold(si, now)?;
        }
        let s = &mut self.streams[si];
        s.time_end = now;
        let delta = (s.next_id as i64).wrapping_sub(1).wrapping_sub(id.0 as i64);
        s.packet.u32(encode_header(code, time));
        s.packet.vint(delta);
        Ok(())
    }

    /// The stream that allocated object `id` (format 2: the one stream), if it was handed
    /// out (format 2: checked when written).
    #[inline(always)]
    fn allocating_stream(&self, id: ObjId) -> Option<usize> {
        if self.version < 3 {
            return Some(0);
        }
        let si = *self.chunk_owner.get((id.0 / IDS_PER_CHUNK) as usize)? as usize;
        // (chunks of packets copied whole belong to no stream of this writer)
        if si == COPIED_CHUNK as usize {
            return None;
        }
        // (a chunk's ids past its stream's count are not handed out yet)
        let s = &self.streams[si];
        (id.0 < s.next_id || id.0 / IDS_PER_CHUNK != s.next_id / IDS_PER_CHUNK).then_some(si)
    }

    /// A promote (`collect` false) or collect of `id`, written in the stream that allocated
    /// it rather than in a domain the caller names: there it follows its allocation in file
    /// order (a stream's packets go out in the order written) and names it with a
    /// non-negative delta, whatever other domains' packets are still open.
    #[inline(always)]
    pub fn put_id_event_where_allocated(
        &mut self,
        collect: bool,
        time: Timestamp,
        id: ObjId,
    ) -> Result<()> {
        let code = if collect {
            EventCode::Collect
        } else {
            EventCode::Promote
        };
        let Some(si) = self.allocating_stream(id) else {
            return Err(not_allocated(code, id));
        };
        let d = DomainId(self.streams[si].domain);
        self.put_id_event(code, time, d, id)?;
        if collect {
            self.stats.collects += 1;
        } else {
            self.stats.promotes += 1;
        }
        Ok(())
    }

    #[inline]
    /// Write a promote of object `id` (of `domain`'s stream).
    pub fn put_promote(&mut self, time: Timestamp, domain: DomainId, id: ObjId) -> Result<()> {
        self.put_id_event(EventCode::Promote, time, domain, id)?;
        self.stats.promotes += 1;
        Ok(())
    }

    #[inline]
    /// Write a collect of object `id` (of `domain`'s stream).
    pub fn put_collect(&mut self, time: Timestamp, domain: DomainId, id: ObjId) -> Result<()> {
        self.put_id_event(EventCode::Collect, time, domain, id)?;
        self.stats.collects += 1;
        Ok(())
    }

    /// Format 3: reserve `n` object ids, in whole chunks that no stream of this writer is
    /// handed, for packets made elsewhere ([`Writer::put_packet`]); the first of them.
    pub fn reserve_ids(&mut self, n: u64) -> Result<u64> {
        let chunks = n.div_ceil(IDS_PER_CHUNK);
        let first = self.global_ids;
        let end = chunks
            .checked_mul(IDS_PER_CHUNK)
            .and_then(|k| first.checked_add(k))
            .filter(|_| self.version >= 3)
            .ok_or_else(|| Error::Write(format!("cannot reserve {n} object ids")))?;
        self.global_ids = end;
        self.chunk_owner
            .extend(std::iter::repeat_n(COPIED_CHUNK, chunks as usize));
        Ok(first)
    }

    /// Write a whole packet made elsewhere (in a domain, and of ids, that this writer's
    /// streams do not use: [`Writer::reserve_ids`]).
    pub fn put_packet(&mut self, bytes: &[u8]) -> Result<()> {
        self.emit(bytes)
    }

    /// Flush the current domain's packet (as the reference's `flush`/`close`) and hand back
    /// the output.
    pub fn finish(self) -> Result<W> {
        Ok(self.finish_with_stats()?.0)
    }

    /// [`Writer::finish`], also giving the final counts (the last packets included).
    pub fn finish_with_stats(mut self) -> Result<(W, WriteStats)> {
        let empty = crate::format::packet::header_size(self.version);
        let bare = self.end_bare
            && self.stats.packets == 1
            && (self.streams.iter()).all(|s| s.packet.len() == empty && s.new_locs.is_empty());
        if bare {
            // (nothing but the info packet was written, nor is to be)
        } else if self.switch_flush {
            let si = self.last;
            let now = self.streams[si].time_end;
            self.flush_at(si, now)?;
        } else {
            for si in 0..self.streams.len() {
                let now = self.streams[si].time_end;
                self.flush_at(si, now)?;
            }
        }
        self.out
            .flush()
            .map_err(|e| Error::output(&self.path, "flush", e))?;
        Ok((self.out, self.stats))
    }
}

#[cold]
#[inline(never)]
fn not_allocated(code: EventCode, id: ObjId) -> Error {
    Error::Write(format!(
        "{} of object {} which is not allocated yet",
        if code == EventCode::Promote {
            "promote"
        } else {
            "collect"
        },
        id.0
    ))
}

fn dummy_verifier() -> CacheVerifier {
    CacheVerifier {
        index: NO_VERIFIER,
        prediction: 0,
        value: 0,
    }
}

#[cfg(test)]
pub(crate) mod tests;
