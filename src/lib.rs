//! memtrace-merge: read, write, check and merge the memory traces (`.ctf`) that Jane Street's
//! memtrace writes of OCaml programs; merge those of several processes into one valid trace.
//!
//! ```no_run
//! use memtrace_merge::{merge, MergeOptions};
//! use std::path::PathBuf;
//!
//! let inputs = [PathBuf::from("run.ctf"), PathBuf::from("workers/")];
//! let report = merge(&inputs, "merged.ctf".as_ref(), &MergeOptions::default())?;
//! println!("{} allocations from {} traces", report.allocs, report.inputs.len());
//! # Ok::<(), memtrace_merge::Error>(())
//! ```
//!
//! Reading and writing one trace: [`Reader`] lends each event (its backtrace as a slice),
//! [`Writer`] makes the reference writer's decisions byte for byte. The [`tools`] are library
//! functions returning reports: dump, summary (info), check, compare, copy.
//!
//! # Layers
//!
//! Each in its folder, each importing only what is below it:
//! - `format/`: the wire format (buf, packet, event, info, location, backtrace); imports only
//!   the error type;
//! - `reader/`, `writer/`: one trace, streamed;
//! - `merge/`: what a merge means (inputs, plan, lifecycles, codes, the heap loop): its
//!   changes change outputs;
//! - `pipeline/`: how it is made fast (batches decoded and encoded ahead on other threads,
//!   the output written on its own); never imports `merge/`, `tools/` or the C ABI;
//! - `tools/`: dump, summary, check, compare, copy; `analysis/`: where the memory of a
//!   run goes (top, timeline, flame graphs), from one trace or many, merged on the fly;
//! - `fs/` (file identity, output targets, spools), `sys` (every OS call needing `unsafe`),
//!   `capi` (the C ABI, `include/memtrace_merge.h`), `cli` (signals for the command line).
//!
//! Only `sys` and `capi` hold `unsafe` code; nothing imports `capi`; there are no import
//! cycles.

#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod analysis;
mod cancel;
#[allow(unsafe_code)]
mod capi;
pub mod cli;
mod error;
#[cfg(feature = "export")]
pub mod export;
mod format;
mod fs;
mod merge;
mod pipeline;
mod reader;
#[allow(unsafe_code)]
mod sys;
mod thin;
pub mod tools;
mod writer;

pub use cancel::Cancel;
pub use error::{Error, Malformed, Position, Result, Side};
pub use format::event::{
    Alloc, AllocHeader, AllocSource, DomainId, Event, LocationCode, ObjId, OwnedAlloc, OwnedEvent,
    Timestamp,
};
pub use format::info::TraceInfo;
pub use format::location::{Location, LocationList, LocationTable};
pub use fs::{check_output, write_output};
pub use merge::{
    expand_inputs, format_report, format_warnings, merge, InputReport, MergeOptions, MergeReport,
    RateMismatch,
};
pub use reader::{
    scan_domains, scan_packets, EventSink, PacketScan, ReadStats, Reader, Warning,
    MAX_MERGE_DOMAINS,
};
pub use writer::{WriteStats, Writer, WriterOptions, IDS_PER_CHUNK};
