//! Copying an input's packets into a format-3 merge with only their headers rewritten: the
//! survey that says what an input holds and whether it reads cleanly, and the copy itself.
//!
//! Why a body can be copied (benches/PERFORMANCE.md, "Copying packet bodies"): the reference
//! reader keeps a backtrace cache, location tables and a last time per domain, reads event
//! times against the packet's begin and object ids against the packet's `alloc_id_begin`
//! (promotes and collects as deltas from the packet's running id). A packet whose domain
//! is the output domain of its input's domain, whose `alloc_id_begin`/`end` are moved by a
//! per-input offset and whose pid is the merged trace's reads as in its input, ids moved.

use crate::cancel::Cancel;
use crate::error::{Error, Result};
use crate::format::buf::{Cursor, WriteBuf};
use crate::format::event::{AllocSource, LocationCode};
use crate::format::location::{LocationList, LocationPool};
use crate::format::packet::{header_size, PacketHeader, MAX_PACKET_SIZE};
use crate::pipeline::files::{FilePool, LazyFile};
use crate::reader::{EventSink, Reader, READ_BUFFER};
use std::fs::File;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Ids above this are not followed (a format-3 trace's chunks may be sparse): its packets
/// are then not copied.
const MAX_SURVEYED_ID: u64 = 1 << 28;

/// What an input holds, read in full as the merge's reader reads it.
#[derive(Clone, Debug, Default)]
pub struct Survey {
    /// Why its packets cannot be copied as they are (None: they can).
    pub refused: Option<String>,
    /// Its location codes with their locations, in the order defined.
    pub locations: Vec<(LocationCode, LocationList)>,
    pub allocs: u64,
    pub promotes: u64,
    pub collects: u64,
    pub samples: u64,
    /// One past its highest object id.
    pub id_end: u64,
    /// The domains of its packets that hold events.
    pub domains: Vec<u16>,
}

/// Object states by id, two bits each: 0 never allocated, 1 live, 2 live and promoted, 3
/// collected. (A quarter of a byte each, so that a million objects take 250 KB.)
struct Lives<'a> {
    state: Vec<u64>,
    bad: Option<String>,
    survey: Survey,
    cancel: &'a Cancel,
    events: u64,
}

impl Lives<'_> {
    /// The word and shift of `id`'s state.
    #[inline]
    fn slot(&mut self, id: u64) -> Option<(usize, u32)> {
        if id >= MAX_SURVEYED_ID {
            self.refuse(format!("object id {id} beyond the ids followed"));
            return None;
        }
        let (w, shift) = ((id / 32) as usize, (id % 32) as u32 * 2);
        if w >= self.state.len() {
            self.state
                .resize((w + 1).next_power_of_two().max(1 << 12), 0);
        }
        Some((w, shift))
    }

    /// Move `id` from a state `from` allows to `to`; the state it was in (and nothing
    /// changed) when `from` does not allow it.
    #[inline]
    fn change(&mut self, id: u64, from: impl Fn(u64) -> bool, to: u64) -> Option<u64> {
        let (w, shift) = self.slot(id)?;
        let was = (self.state[w] >> shift) & 3;
        if from(was) {
            self.state[w] ^= (was ^ to) << shift;
            None
        } else {
            Some(was)
        }
    }

    #[cold]
    fn refuse(&mut self, why: String) {
        self.bad.get_or_insert(why);
    }

    /// A promote (`to` 2) or collect (`to` 3) of `id`: of a live object, promoted once.
    fn follow(&mut self, id: u64, to: u64, what: &str) {
        let from = |was: u64| {
            if to == 2 {
                was == 1
            } else {
                was == 1 || was == 2
            }
        };
        if let Some(was) = self.change(id, from, to) {
            self.refuse(format!("{what} of object {id} in state {was}"));
        }
    }
}

impl EventSink for Lives<'_> {
    fn location(&mut self, code: LocationCode, locs: &LocationList) {
        self.survey.locations.push((code, locs.clone()));
    }
    fn alloc(
        &mut self,
        _time: u64,
        id: u64,
        _length: u64,
        nsamples: u64,
        _source: AllocSource,
        _common_prefix: u64,
        _backtrace: &[crate::format::event::LocationCode],
        _slots: &[u16],
    ) {
        self.survey.allocs += 1;
        self.survey.samples += nsamples;
        self.survey.id_end = self.survey.id_end.max(id.saturating_add(1));
        if self.change(id, |was| was == 0, 1).is_some() {
            self.refuse(format!("object id {id} allocated twice"));
        }
    }
    fn promote(&mut self, _time: u64, id: u64) {
        self.events += 1;
        self.survey.promotes += 1;
        self.follow(id, 2, "promote");
    }
    fn collect(&mut self, _time: u64, id: u64) {
        self.events += 1;
        self.survey.collects += 1;
        self.follow(id, 3, "collect");
    }
    /// (a survey needs no frames: the reader checks them)
    fn backtraces(&self) -> bool {
        false
    }
    /// (the reading stops at the first refusal, and when the merge is cancelled)
    fn full(&self) -> bool {
        self.bad.is_some()
            || (self.events + self.survey.allocs).is_multiple_of(1 << 16)
                && self.cancel.is_cancelled()
    }
}

/// Read `path` (named `name`) in full, every backtrace decoded and every check of the
/// reader made, and each object followed from its allocation: a survey whose `refused`
/// says why its packets may not be copied (a warning of the reader, an error, an object
/// promoted or collected out of turn, a packet that would outgrow the reference's buffer,
/// the merge cancelled).
pub fn survey(
    path: &Path,
    name: &Path,
    locations: &Arc<LocationPool>,
    cancel: &Cancel,
) -> Result<Survey> {
    let f = File::open(path).map_err(|e| Error::input(name, "open", e))?;
    let mut r = Reader::pooled(
        f,
        &name.display().to_string(),
        READ_BUFFER,
        locations.clone(),
    )?;
    let mut lives = Lives {
        state: Vec::new(),
        bad: None,
        survey: Survey::default(),
        cancel,
        events: 0,
    };
    // (what a packet's header allows, met as the reader passes it; said only when the
    // events read cleanly, as their refusals come first)
    let mut domains = Vec::new();
    let mut too_much: Option<String> = None;
    let read = r.read_clean_with(&mut lives, |h, body, at| {
        if body == 0 || too_much.is_some() {
            return;
        }
        // (a packet of no allocation may name any id: moved by an offset, none may wrap)
        if h.alloc_id_end >= MAX_SURVEYED_ID {
            too_much = Some(format!(
                "a packet at byte {at} names ids up to {}, beyond those followed",
                h.alloc_id_end
            ));
        } else if header_size(3) + body > MAX_PACKET_SIZE {
            too_much = Some(format!(
                "a packet of {} bytes at byte {at} would be larger than memtrace reads in format 3",
                h.size
            ));
        } else if !domains.contains(&h.domain) {
            domains.push(h.domain);
        }
    })?;
    let mut s = std::mem::take(&mut lives.survey);
    s.refused = read.or(lives.bad).or(too_much);
    if s.refused.is_none() {
        s.domains = domains;
    }
    Ok(s)
}

/// A trace's packets after its info packet, read in order (a surveyed trace: its headers
/// are known good), each into a buffer its caller shares between traces: a trace holds
/// only its read-ahead and the next packet's first bytes.
struct Packets {
    file: BufReader<LazyFile>,
    name: PathBuf,
    /// The next packet's first bytes (magic, size, begin time); None at the end.
    head: Option<[u8; HEAD]>,
    /// The file offset of the next packet, and of the one handed out last.
    next_at: u64,
    at: u64,
}

/// Bytes of a packet's header read ahead of its turn: up to its begin time.
const HEAD: usize = 16;

impl Packets {
    /// The packets of `path` (named `name`), opened under `pool`'s budget of open files,
    /// read `buffer` bytes ahead (a packet larger than that is read straight into the
    /// caller's buffer).
    fn open(
        pool: &FilePool,
        path: &Path,
        name: &Path,
        buffer: usize,
        packet: &mut Vec<u8>,
    ) -> Result<Packets> {
        let file = pool.open(path).map_err(|e| Error::input(name, "open", e))?;
        let mut p = Packets {
            file: BufReader::with_capacity(buffer, file),
            name: name.to_path_buf(),
            head: None,
            next_at: 0,
            at: 0,
        };
        p.read_head()?;
        // (the info packet is the merged trace's own)
        p.next(packet)?;
        Ok(p)
    }

    fn offset(&self) -> u64 {
        self.at
    }

    /// The error of a packet that no longer reads as when surveyed.
    #[cold]
    fn changed(&self) -> Error {
        Error::Internal(format!(
            "{}: the packet at byte {} no longer reads as when surveyed (file changed?)",
            self.name.display(),
            self.at
        ))
    }

    /// Fill `buf` from the file; false if it ended before the first byte.
    fn read_all(&mut self, buf: &mut [u8]) -> Result<bool> {
        let mut got = 0;
        while got < buf.len() {
            match self.file.read(&mut buf[got..]) {
                Ok(0) if got == 0 => return Ok(false),
                Ok(0) => return Err(self.changed()),
                Ok(k) => got += k,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(Error::input(&self.name, "read", e)),
            }
        }
        Ok(true)
    }

    /// Read the next packet's first bytes, if any.
    fn read_head(&mut self) -> Result<()> {
        let mut h = [0; HEAD];
        self.head = self.read_all(&mut h)?.then_some(h);
        Ok(())
    }

    /// The begin time of the next packet; None at the end of the file.
    fn peek_time(&self) -> Option<u64> {
        let h = self.head.as_ref()?;
        // (the header was good when surveyed: its begin time is at bytes 8..16)
        Some(u64::from_le_bytes(h[8..16].try_into().unwrap_or([0; 8])))
    }

    /// The next packet, whole in `packet`, and its header; None at the end of the file.
    fn next(&mut self, packet: &mut Vec<u8>) -> Result<Option<PacketHeader>> {
        let Some(head) = self.head else {
            return Ok(None);
        };
        self.at = self.next_at;
        let bits = u32::from_le_bytes(head[4..8].try_into().unwrap_or([0; 4]));
        let size = bits as usize / 8;
        if !(HEAD..=2 * MAX_PACKET_SIZE).contains(&size) {
            return Err(self.changed());
        }
        packet.clear();
        packet.extend_from_slice(&head);
        packet.resize(size, 0);
        // (a packet of its head alone reads an empty rest: true)
        if !self.read_all(&mut packet[HEAD..])? {
            return Err(self.changed());
        }
        let h = PacketHeader::parse(&mut Cursor::new(packet)).map_err(|_| self.changed())?;
        if h.size as usize != size {
            return Err(self.changed());
        }
        self.next_at += size as u64;
        self.read_head()?;
        Ok(Some(h))
    }
}

/// An input whose packets are copied: where its ids and domains go.
pub struct CopiedInput {
    pub path: PathBuf,
    pub name: PathBuf,
    /// Added to every object id.
    pub id_offset: u64,
    /// (input domain, output domain) of each of its domains with events.
    pub domains: Vec<(u16, u16)>,
}

/// Copy the packets of `inputs` (each surveyed as copyable) in order of their begin times
/// (an input's own in file order, ties to the earlier input), each made a format-3 packet
/// of `pid` in its output domain, ids moved by its offset; each handed to `put` whole.
pub fn copy_packets(
    inputs: &[CopiedInput],
    pid: u64,
    mut put: impl FnMut(&[u8]) -> Result<()>,
) -> Result<()> {
    // (the inputs' read-ahead shares 4 MiB, as few as there are: a merge of a hundred
    // inputs read each through its own MiB; the packets themselves pass through one
    // buffer)
    let buffer = ((4 << 20) / inputs.len().max(1)).clamp(4 << 10, 1 << 20);
    let mut packet = Vec::with_capacity(MAX_PACKET_SIZE);
    // (opened and closed under a budget, as the merge's inputs are: thousands of inputs
    // under `ulimit -n 256`; a quarter of the limit, the decoding threads have half)
    let pool = FilePool::from_rlimit_share(2);
    let mut srcs = Vec::with_capacity(inputs.len());
    for i in inputs {
        srcs.push(Packets::open(&pool, &i.path, &i.name, buffer, &mut packet)?);
    }
    let mut out = WriteBuf::with_capacity(MAX_PACKET_SIZE);
    while let Some(k) = (0..srcs.len())
        .filter(|&k| srcs[k].head.is_some())
        .min_by_key(|&k| (srcs[k].peek_time(), k))
    {
        let inp = &inputs[k];
        if let Some(h) = srcs[k].next(&mut packet)? {
            let body = &packet[header_size(h.version)..];
            if !body.is_empty() {
                let Some(&(_, d)) = inp.domains.iter().find(|(d, _)| *d == h.domain) else {
                    return Err(Error::Internal(format!(
                        "{}: a packet of domain {} at byte {}, which the survey did not see",
                        inp.name.display(),
                        h.domain,
                        srcs[k].offset()
                    )));
                };
                out.clear();
                PacketHeader::start(&mut out, 3, pid, d, h.verifier);
                out.extend(body);
                PacketHeader::finish(
                    &mut out,
                    3,
                    h.time_begin,
                    h.time_end,
                    h.alloc_id_begin + inp.id_offset,
                    h.alloc_id_end + inp.id_offset,
                );
                put(out.bytes())?;
            }
        }
    }
    Ok(())
}
