//! memtrace-merge: read, write, check and merge memtrace traces (`.ctf`) of OCaml programs.
//!
//! Modules mirror the format: [`buf`] (primitives), [`packet`] (headers), [`location`] (MTF
//! codec), [`backtrace`] (cache codec), [`event`], [`info`], [`reader`], [`writer`]; then the
//! tools built on them.

pub mod backtrace;
pub mod buf;
pub mod check;
pub(crate) mod codes;
pub mod compare;
pub mod copy;
pub(crate) mod decode;
pub mod dump;
pub mod error;
pub mod event;
pub mod ffi;
pub(crate) mod fs;
pub mod info;
pub mod input;
pub(crate) mod live;
pub mod location;
pub mod merge;
pub mod output;
pub mod packet;
pub(crate) mod placement;
pub mod reader;
pub mod share;
pub(crate) mod spool;
pub mod summary;
pub mod thin;
pub mod writer;

pub use error::{Error, Malformed, Position, Result};
pub use event::{
    Alloc, AllocSource, DomainId, Event, LocationCode, ObjId, OwnedAlloc, OwnedEvent, Timestamp,
};
pub use info::TraceInfo;
pub use location::{Location, LocationList, LocationTable};
pub use reader::{ReadStats, Reader, Warning};
pub use writer::{WriteStats, Writer, WriterOptions};
