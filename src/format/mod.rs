//! The wire format, one concept per file: primitives ([`buf`]), packet headers ([`packet`]),
//! events ([`event`]), the trace info ([`info`]), locations ([`location`]), backtraces
//! ([`backtrace`]). Imports nothing of the crate but its error type.

pub mod backtrace;
pub mod buf;
pub mod event;
pub mod info;
pub mod location;
pub mod packet;
