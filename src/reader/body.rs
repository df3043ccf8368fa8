//! An event's body as a reader parses it: the fields of each kind, checked.

use super::DomainState;
use crate::error::{Malformed, Result};
use crate::format::backtrace::CacheReader;
use crate::format::buf::Cursor;
use crate::format::event::{decode_header, AllocSource, EventCode, LocationCode};
use crate::format::location::{LocationList, LocationTable};
use crate::format::packet::PacketHeader;

/// What [`crate::Reader::read_events`] hands events to (times and ids as plain numbers).
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
    /// A promote of object `id` at `time`.
    fn promote(&mut self, time: u64, id: u64);
    /// A collect of object `id` at `time`.
    fn collect(&mut self, time: u64, id: u64);
    /// Asked after each allocation: true ends the batch early (before `max` events).
    fn full(&self) -> bool {
        false
    }
    /// Whether [`EventSink::room_for`] may say no: asked once by each call of
    /// [`crate::Reader::read_events`].
    fn cramped(&self) -> bool {
        false
    }
    /// Asked by [`crate::Reader::read_events`] of a [`EventSink::cramped`] sink before an
    /// allocation (whose backtrace of `len` frames shares `common_prefix` with the
    /// previous one) is handed over: false ends the batch before it, and the next call
    /// hands it over first. A sink that holds a batch in vectors of a fixed room ends it
    /// rather than grow them.
    fn room_for(&self, common_prefix: u64, len: usize) -> bool {
        let _ = (common_prefix, len);
        true
    }
    /// Whether [`EventSink::alloc`] looks at the frames. A sink that does not (it counts,
    /// or follows objects) may say so to [`crate::Reader::read_clean`], which then checks
    /// every backtrace as it reads (the cache run, each frame's entry known filled) but
    /// hands out empty ones, at less cost.
    fn backtraces(&self) -> bool {
        true
    }
}

/// An event parsed but not yet handed out.
#[derive(Clone, Copy)]
pub(super) enum Pending {
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

impl Pending {
    /// Hand the event to `sink` (an allocation with its backtrace and cache entries).
    #[inline(always)]
    pub(super) fn give(self, sink: &mut impl EventSink, backtrace: &[LocationCode], slots: &[u16]) {
        match self {
            Pending::Alloc {
                time,
                id,
                length,
                nsamples,
                source,
                common_prefix,
            } => sink.alloc(
                time,
                id,
                length,
                nsamples,
                source,
                common_prefix,
                backtrace,
                slots,
            ),
            Pending::Promote { time, id } => sink.promote(time, id),
            Pending::Collect { time, id } => sink.collect(time, id),
        }
    }
}

pub(super) fn non_negative(field: &'static str, v: i64) -> Result<u64, Malformed> {
    if v < 0 {
        Err(Malformed::BadValue { field, value: v })
    } else {
        Ok(v as u64)
    }
}

/// A location event: its code's locations taken in (a code given other locations than
/// before is an error).
fn location_event(
    c: &mut Cursor<'_>,
    d: &mut DomainState,
    locations: &mut LocationTable,
    new_codes: &mut Vec<LocationCode>,
) -> Result<(), Malformed> {
    let (code, locs) = d.codec.decode(c)?;
    match locations.get(&code) {
        Some(old) if **old != *locs => Err(Malformed::InconsistentLocation { code: code.0 }),
        Some(_) => Ok(()),
        None => {
            locations.insert(code, locs);
            new_codes.push(code);
            Ok(())
        }
    }
}

/// An allocation's fields before its backtrace: length, samples, source, common prefix and
/// the count of codewords (a short allocation has its length in its code, one sample).
#[inline(always)]
pub(super) fn alloc_fields(
    c: &mut Cursor<'_>,
    code: EventCode,
) -> Result<(u64, u64, AllocSource, u64, usize), Malformed> {
    if let EventCode::ShortAlloc(n) = code {
        let common_prefix = non_negative("common prefix", c.vint()?)?;
        return Ok((
            n as u64,
            1,
            AllocSource::Minor,
            common_prefix,
            c.u8()? as usize,
        ));
    }
    let length = non_negative("length", c.vint()?)?;
    let nsamples = non_negative("nsamples", c.vint()?)?;
    let source = AllocSource::from_u8(c.u8()?)?;
    let common_prefix = non_negative("common prefix", c.vint()?)?;
    Ok((length, nsamples, source, common_prefix, c.u16()? as usize))
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(super) fn read_event_body(
    c: &mut Cursor<'_>,
    h: &PacketHeader,
    d: &mut DomainState,
    global_last: &mut u64,
    alloc_id: &mut u64,
    locations: &mut LocationTable,
    new_codes: &mut Vec<crate::format::event::LocationCode>,
    parse_backtraces: bool,
    walk: bool,
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
            location_event(c, d, locations, new_codes)?;
            Ok(None)
        }
        EventCode::Alloc | EventCode::ShortAlloc(_) => {
            let (length, nsamples, source, common_prefix, nencoded) = alloc_fields(c, code)?;
            let table = &*locations;
            let defined = |code| table.contains_key(&code);
            if parse_backtraces && walk {
                d.cache.walk(c, nencoded, common_prefix, defined)?;
            } else if parse_backtraces {
                d.cache.decode(c, nencoded, common_prefix, defined)?;
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
pub(super) fn negative_delta(
    v3: bool,
    is_promote: bool,
    delta: i64,
    next: u64,
    time: u64,
) -> Malformed {
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
