//! memtrace-merge: read, write, check and merge memtrace traces (`.ctf`) of OCaml programs.
//!
//! Modules mirror the format: [`buf`] (primitives), [`packet`] (headers), [`location`] (MTF
//! codec), [`backtrace`] (cache codec), [`event`], [`info`], [`reader`], [`writer`]; then the
//! tools built on them.

pub mod cancel;
mod capi;
pub mod cli;
pub mod error;
pub mod format;
pub(crate) mod fs;
pub mod merge;
pub mod pipeline;
pub mod reader;
mod sys;
pub mod thin;
pub mod tools;
pub mod writer;

pub use format::{backtrace, buf, event, info, location, packet};
pub use tools::{check, compare, copy, dump, summary};

pub use cancel::Cancel;
pub use error::{Error, Malformed, Position, Result, Side};
pub use event::{
    Alloc, AllocSource, DomainId, Event, LocationCode, ObjId, OwnedAlloc, OwnedEvent, Timestamp,
};
pub use info::TraceInfo;
pub use location::{Location, LocationList, LocationTable};
pub use reader::{ReadStats, Reader, Warning};
pub use writer::{WriteStats, Writer, WriterOptions};
