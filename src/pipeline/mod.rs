//! How a merge is made fast: inputs decoded ahead in batches on other threads, backtraces
//! encoded ahead in shares of the output cache, the output written on a thread of its own.
//! Never imports `merge`: its changes keep the bytes a merge writes.
//!
//! Its words:
//! - *stream*: the events of one domain of one input, in the input's order; the unit
//!   that is decoded, batched and merged by time.
//! - *output domain*: the domain of the merged trace a stream's events are written in
//!   (in format 3 each stream of a merge of several inputs gets one of its own; in
//!   format 2 all are domain 0).
//! - *batch*: a run of a stream's decoded events ([`batch::Batch`]), handed from a
//!   decoding thread to the merging thread and back for reuse.
//! - *share*: a range of entries of an output domain's backtrace cache given to one of
//!   the streams that take turns in that domain ([`share::Share`]), so that the stream's
//!   backtraces can be encoded without knowing the merged order.
//! - *encoded ahead*: a backtrace encoded by a decoding thread, in its stream's share
//!   (or in the whole cache for a *solo* stream), rather than by the merging thread.
//! - *solo*: a stream alone in its output domain; its encodings may use the frames it
//!   shares with its own previous backtrace, as the merging thread would.
//! - *hint*: a frame's cache entry in the input's encoding, given to the output's encoder,
//!   which checks it and, when right, skips a lookup.

pub mod batch;
pub mod decoder;
pub mod files;
pub(crate) mod fill;
pub mod output;
pub mod placement;
pub mod share;
pub mod verbatim;

use std::sync::{Mutex, MutexGuard, TryLockError};

/// `m` locked, going on after a panic elsewhere: the threads that share a lock here change
/// what it guards a step at a time (a push, a pop, a counter), so a panic leaves it whole.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// `m` locked, unless another thread holds it (a poisoned lock is taken as it is).
pub(crate) fn try_lock<T>(m: &Mutex<T>) -> Option<MutexGuard<'_, T>> {
    match m.try_lock() {
        Ok(g) => Some(g),
        Err(TryLockError::Poisoned(p)) => Some(p.into_inner()),
        Err(TryLockError::WouldBlock) => None,
    }
}
