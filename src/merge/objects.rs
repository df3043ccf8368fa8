//! What a merge keeps of each input's objects: their merged ids, and promotes and collects
//! written where their object was allocated, waiting for it within a microsecond.

use super::InputReport;
use crate::error::Result;
use crate::format::event::{LocationCode, ObjId, Timestamp};
use crate::merge::live::LiveObjects;
use crate::pipeline::fill::Warnings;
use crate::pipeline::output::OutputFile;
use crate::thin::Thinner;
use crate::writer::Writer;

pub(super) struct InputState {
    pub(super) report: InputReport,
    /// Source object id → merged id (DROPPED when thinned away); only live objects.
    pub(super) live: LiveObjects,
    pub(super) thinner: Option<Thinner>,
    pub(super) tag: Option<LocationCode>,
    /// the merging thread's warnings (the decoder keeps its own)
    pub(super) warnings: Warnings,
    /// Promotes and collects of objects not live when their turn came (in time order):
    /// another domain may still allocate the object in the same microsecond, behind an
    /// event of its own that came first. (source id, time, a collect)
    pub(super) waiting: Vec<(u64, u64, bool)>,
}

impl InputState {
    /// Count an allocation of `nsamples` read: the samples it is written with, or None
    /// when thinning left it out (took its every sample; one of none stays).
    #[inline(always)]
    pub(super) fn read_alloc(&mut self, nsamples: u64) -> Option<u64> {
        self.report.allocs += 1;
        self.report.samples_read += nsamples;
        let n = match &mut self.thinner {
            Some(t) => t.keep(nsamples),
            None => nsamples,
        };
        (n > 0 || nsamples == 0).then_some(n)
    }
}

/// A promote or collect of an object not live: it waits for an allocation of that object
/// in the same microsecond (another domain's), after those whose time has passed are given
/// up.
pub(super) fn wait_for_object(st: &mut InputState, id: u64, time: u64, collect: bool) {
    give_up_waiting(st, time);
    st.waiting.push((id, time, collect));
}

/// Leave out the waiting events before `time` (all of them: None): their object was never
/// allocated in their microsecond.
pub(super) fn give_up_waiting(st: &mut InputState, time: impl Into<Option<u64>>) {
    let time = time.into();
    let n = (st.waiting.iter())
        .take_while(|w| time.is_none_or(|t| w.1 < t))
        .count();
    for (id, _, collect) in st.waiting.drain(..n) {
        left_out_not_live(&mut st.warnings, id, collect);
    }
}

/// Warn of a promote (`collect` false) or collect of source object `id`, not live, left out.
pub(super) fn left_out_not_live(warnings: &mut Warnings, id: u64, collect: bool) {
    let what = if collect { "collect" } else { "promote" };
    warnings.push(format!("{what} of object {id} that is not live; left out"));
}

/// A promote (`collect` false) or collect of source object `id` at `time`, written when
/// the object is live (left out when thinned away, or a second promote); false when it is
/// not live. It is written in the output domain that allocated the object, which may not
/// be the one of the stream it came in (see the module doc).
#[inline(always)]
pub(super) fn follow_object(
    st: &mut InputState,
    w: &mut Writer<OutputFile>,
    id: u64,
    time: u64,
    collect: bool,
) -> Result<bool> {
    if collect {
        match st.live.remove(id) {
            Some(DROPPED) => {}
            Some(o) => {
                w.put_id_event_where_allocated(true, Timestamp(time), ObjId(o & !PROMOTED))?
            }
            None => return Ok(false),
        }
        return Ok(true);
    }
    match st.live.get_mut(id) {
        Some(&mut DROPPED) => {}
        Some(o) if *o & PROMOTED != 0 => {
            warn_input(st, format!("second promote of object {id}; left out"));
        }
        Some(o) => {
            let out = ObjId(*o);
            *o |= PROMOTED;
            w.put_id_event_where_allocated(false, Timestamp(time), out)?;
        }
        None => return Ok(false),
    }
    Ok(true)
}

/// Object `id` was just allocated at `time`: the promotes and collects of it that wait
/// (in that microsecond) follow it now.
#[cold]
pub(super) fn release_waiting(
    st: &mut InputState,
    w: &mut Writer<OutputFile>,
    id: u64,
    time: u64,
) -> Result<()> {
    give_up_waiting(st, time);
    while let Some(k) = st.waiting.iter().position(|x| x.0 == id) {
        let (_, t, collect) = st.waiting.remove(k);
        // (a collect of it may have come first: a promote after it is not live either)
        if !follow_object(st, w, id, t, collect)? {
            left_out_not_live(&mut st.warnings, id, collect);
        }
    }
    Ok(())
}

pub(super) const DROPPED: u64 = u64::MAX - 1;

/// Set in a live entry's merged id once the object was promoted (a second promote is left out).
pub(super) const PROMOTED: u64 = 1 << 63;

pub(super) fn warn_input(st: &mut InputState, msg: String) {
    st.warnings.push(msg);
}
