//! The C ABI of the merge (`memtrace_merge()` and its option, report and status types), used
//! by C programs and the OCaml bindings. Header: include/memtrace_merge.h (cbindgen).

use crate::error::{Error, Side};
use crate::merge::{InputReport, MergeOptions, MergeReport, RateMismatch};
use std::any::Any;
use std::ffi::CStr;
use std::os::raw::{c_char, c_int};
use std::panic::{self, AssertUnwindSafe};
use std::path::{Path, PathBuf};

/// `MemtraceMergeOptions.format`: format 2 when every input is at most 2, else 3.
pub const MEMTRACE_MERGE_FORMAT_AUTO: u32 = 0;
/// `MemtraceMergeOptions.format`: write format version 2.
pub const MEMTRACE_MERGE_FORMAT_V2: u32 = 2;
/// `MemtraceMergeOptions.format`: write format version 3.
pub const MEMTRACE_MERGE_FORMAT_V3: u32 = 3;
/// `MemtraceMergeOptions.on_rate_mismatch`: thin faster inputs to the slowest sampling rate.
pub const MEMTRACE_MERGE_RATE_THIN: u32 = 0;
/// `MemtraceMergeOptions.on_rate_mismatch`: refuse inputs sampled at different rates.
pub const MEMTRACE_MERGE_RATE_FAIL: u32 = 1;
/// The most inputs one call accepts; more is taken for a caller's bug (BAD_ARGUMENTS).
pub const MEMTRACE_MERGE_MAX_INPUTS: usize = 1_000_000;
/// `MemtraceMergeInputReport.arg_index` of an input whose argument could not be told.
#[allow(clippy::unnecessary_cast)] // so that cbindgen writes `~(size_t)0` (SIZE_MAX)
pub const MEMTRACE_MERGE_UNKNOWN_ARG: usize = !(0 as usize);

/// What `memtrace_merge()` did; every value but the first two means nothing was written.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemtraceMergeStatus {
    /// The output was written.
    Ok = 0,
    /// The output was written, but some input had warnings or was skipped; `errbuf` holds
    /// the first warning.
    OkWithWarnings = 1,
    /// The call was wrong: NULL or empty argument, bad option value, output = an input, ...
    BadArguments = 2,
    /// An input is missing, unreadable, malformed or incompatible with the others.
    InputError = 3,
    /// The output (or its temporary file beside it) could not be written.
    OutputError = 4,
    /// A fault of the library (a Rust panic was caught, a thread could not start);
    /// `errbuf` says what.
    InternalError = 5,
    /// The merge was cancelled (`MemtraceMergeOptions.cancel`); nothing was written.
    Cancelled = 6,
}

/// Options of a merge. All zero (`MemtraceMergeOptions o = {0};`) means the defaults, as does
/// passing NULL instead of a pointer to it.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct MemtraceMergeOptions {
    /// `sizeof(MemtraceMergeOptions)`, or 0: which version of this struct the caller has
    /// (later versions add fields at the end, read only when this says they are there).
    pub struct_size: usize,
    /// Output format: `MEMTRACE_MERGE_FORMAT_AUTO` (0), `_V2` (2) or `_V3` (3).
    pub format: u32,
    /// `MEMTRACE_MERGE_RATE_THIN` (0) or `MEMTRACE_MERGE_RATE_FAIL` (1).
    pub on_rate_mismatch: u32,
    /// Seed of the thinning's random numbers (same seed, same inputs: same output bytes).
    pub seed: u64,
    /// Non-zero: give every backtrace a synthetic root frame naming its input.
    pub tag_processes: c_int,
    /// Non-zero: leave out inputs that cannot be read at all (a warning) instead of failing.
    pub skip_bad_inputs: c_int,
    /// The merged trace's pid; 0: the first input's.
    pub pid: u64,
    /// The merged trace's context (NUL-terminated); NULL: the first input's, or a description
    /// of the merge. The bytes are taken as they are (need not be UTF-8).
    pub context: *const c_char,
    /// NULL, or an `int` that cancels the merge once non-zero (set it from another thread
    /// with an atomic store, e.g. `__atomic_store_n(&flag, 1, __ATOMIC_RELAXED)`): the
    /// merge stops within milliseconds and returns `MEMTRACE_MERGE_STATUS_CANCELLED`. It
    /// must stay valid until the call returns.
    pub cancel: *const c_int,
}

/// What happened to one input (one file: a directory argument gives one per `*.ctf` file).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MemtraceMergeInputReport {
    /// Index in `inputs` of the argument this file came from, or `MEMTRACE_MERGE_UNKNOWN_ARG`.
    pub arg_index: usize,
    /// The input's pid.
    pub pid: u64,
    /// The input's format version.
    pub format: u32,
    /// Non-zero: left out entirely (unreadable, with `skip_bad_inputs`).
    pub skipped: c_int,
    /// The input's sampling rate.
    pub sample_rate: f64,
    /// Fraction of samples kept by thinning (1.0 when not thinned).
    pub keep_fraction: f64,
    /// Events read (allocations + promotions + collections).
    pub events: u64,
    /// Allocations read.
    pub allocs: u64,
    /// Promotions read.
    pub promotes: u64,
    /// Collections read.
    pub collects: u64,
    /// Allocations written to the output (fewer than `allocs` when thinned).
    pub allocs_written: u64,
    /// Samples read (the sum of the allocations' sample counts).
    pub samples_read: u64,
    /// Samples written.
    pub samples_written: u64,
    /// Packets left out as unreadable.
    pub skipped_packets: u64,
    /// Location codes given a fresh code because another input used them differently.
    pub remapped_codes: u64,
    /// Number of warnings about this input.
    pub warnings: u64,
    /// The file's name in the directory given as its argument (NUL-terminated; "" when the
    /// argument is the file itself): its path is that argument, a `/`, and this name.
    pub file_name: [c_char; 256],
}

impl Default for MemtraceMergeInputReport {
    fn default() -> Self {
        MemtraceMergeInputReport {
            arg_index: 0,
            pid: 0,
            format: 0,
            skipped: 0,
            sample_rate: 0.0,
            keep_fraction: 0.0,
            events: 0,
            allocs: 0,
            promotes: 0,
            collects: 0,
            allocs_written: 0,
            samples_read: 0,
            samples_written: 0,
            skipped_packets: 0,
            remapped_codes: 0,
            warnings: 0,
            file_name: [0; 256],
        }
    }
}

/// `name` as a NUL-terminated C string of at most 255 bytes.
fn c_name(name: &[u8]) -> [c_char; 256] {
    let mut out = [0 as c_char; 256];
    for (o, &b) in out.iter_mut().zip(name.iter().take(255)) {
        *o = b as c_char;
    }
    out
}

/// What a merge did: totals, and optionally one `MemtraceMergeInputReport` per input in an
/// array that the caller owns. Nothing in it needs freeing.
///
/// Before the call set `inputs` and `inputs_capacity` (or leave both zero); the call writes
/// every other field, zeroes on failure. `inputs[0 .. min(n_inputs, inputs_capacity)]` are
/// filled, in merge order.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct MemtraceMergeReport {
    /// In: `sizeof(MemtraceMergeReport)`, or 0 (see `MemtraceMergeOptions.struct_size`).
    pub struct_size: usize,
    /// In: caller-owned array for per-input reports, or NULL.
    pub inputs: *mut MemtraceMergeInputReport,
    /// In: number of elements of `inputs`.
    pub inputs_capacity: usize,
    /// Inputs considered, after expanding directories (skipped ones included).
    pub n_inputs: u64,
    /// Inputs left out (with `skip_bad_inputs`).
    pub n_inputs_skipped: u64,
    /// Inputs thinned to a slower sampling rate (`keep_fraction` < 1).
    pub n_inputs_thinned: u64,
    /// Format version of the output (2 or 3).
    pub format: u32,
    /// Padding; always 0.
    pub reserved: u32,
    /// Allocations written to the output.
    pub allocs: u64,
    /// Promotions written to the output.
    pub promotes: u64,
    /// Collections written to the output.
    pub collects: u64,
    /// Location codes remapped, all inputs together.
    pub remapped_codes: u64,
    /// Warnings, all inputs together.
    pub warnings: u64,
    /// Events read, all inputs together.
    pub input_events: u64,
    /// Allocations read, all inputs together (more than `allocs` when thinned).
    pub input_allocs: u64,
    /// Samples read, all inputs together.
    pub samples_read: u64,
    /// Samples written.
    pub samples_written: u64,
    /// Packets left out as unreadable, all inputs together.
    pub skipped_packets: u64,
}

/// Merge `n_inputs` traces (files, pipes, or directories whose `*.ctf` files are taken in name
/// order, but `output` when it is an earlier merge; a file named twice, or a trace another
/// input holds, is merged once, with a warning) into `output`, written to a temporary file
/// (of no name, where the file system has them) beside it and put in its place at the end:
/// on failure, even a killed process's, no output is left behind. A symbolic link's target
/// is replaced; a device or FIFO is written through; an existing read-only file is refused.
/// Blocks until done; safe to call from several threads at once (on different outputs) and
/// in a forked child.
///
/// - `inputs`: `n_inputs` non-empty NUL-terminated paths (any bytes: paths need not be UTF-8).
/// - `output`: the path to write; must not be one of the inputs.
/// - `options`: NULL for the defaults.
/// - `report`: NULL, or filled in (see `MemtraceMergeReport`).
/// - `errbuf`: NULL, or `errbuf_len` bytes that receive a NUL-terminated message (truncated to
///   fit): the error, the first warning, or "" on a clean success.
///
/// Returns `MEMTRACE_MERGE_STATUS_OK` or `_OK_WITH_WARNINGS` when the output was written.
///
/// # Safety
///
/// Every non-NULL pointer must be valid for what it is documented as: `inputs` for `n_inputs`
/// pointers, each to a NUL-terminated string; `output` and `options->context` NUL-terminated;
/// `report` writable, its `inputs` writable for `inputs_capacity` elements; `errbuf` writable
/// for `errbuf_len` bytes. Nothing is kept after the call returns.
#[no_mangle]
pub unsafe extern "C" fn memtrace_merge(
    inputs: *const *const c_char,
    n_inputs: usize,
    output: *const c_char,
    options: *const MemtraceMergeOptions,
    report: *mut MemtraceMergeReport,
    errbuf: *mut c_char,
    errbuf_len: usize,
) -> MemtraceMergeStatus {
    merge_with(
        inputs,
        n_inputs,
        output,
        options,
        report,
        errbuf,
        errbuf_len,
        crate::merge::merge,
    )
}

/// A static, NUL-terminated name and meaning of a status ("unknown status" for other values).
#[no_mangle]
pub extern "C" fn memtrace_merge_status_string(status: c_int) -> *const c_char {
    let s: &'static [u8] = match status {
        0 => b"OK: output written\0",
        1 => b"OK_WITH_WARNINGS: output written, with warnings\0",
        2 => b"BAD_ARGUMENTS: invalid arguments\0",
        3 => b"INPUT_ERROR: an input could not be read or merged\0",
        4 => b"OUTPUT_ERROR: the output could not be written\0",
        5 => b"INTERNAL_ERROR: fault in memtrace_merge (a bug, or a thread that could not start)\0",
        6 => b"CANCELLED: the merge was cancelled; nothing was written\0",
        _ => b"unknown status\0",
    };
    s.as_ptr().cast()
}

/// The library's version ("0.1.0"), static and NUL-terminated.
#[no_mangle]
pub extern "C" fn memtrace_merge_version() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
}

/// Why a call failed: a status and its message.
struct Failure {
    status: MemtraceMergeStatus,
    message: String,
}

fn bad(message: impl Into<String>) -> Failure {
    Failure {
        status: MemtraceMergeStatus::BadArguments,
        message: message.into(),
    }
}

/// The arguments, checked and turned into Rust values.
struct Args {
    inputs: Vec<PathBuf>,
    output: PathBuf,
    options: MergeOptions,
}

/// `memtrace_merge` with the merge function as a parameter (unit tests pass fakes).
#[allow(clippy::too_many_arguments)]
unsafe fn merge_with<F>(
    inputs: *const *const c_char,
    n_inputs: usize,
    output: *const c_char,
    options: *const MemtraceMergeOptions,
    report: *mut MemtraceMergeReport,
    errbuf: *mut c_char,
    errbuf_len: usize,
    merge_fn: F,
) -> MemtraceMergeStatus
where
    F: FnOnce(&[PathBuf], &Path, &MergeOptions) -> crate::error::Result<MergeReport>,
{
    let run = AssertUnwindSafe(|| {
        // SAFETY: the caller's contract (see `memtrace_merge`).
        let (inputs_array, capacity) = if report.is_null() {
            (std::ptr::null_mut(), 0)
        } else {
            let r = &mut *report;
            check_size(
                r.struct_size,
                std::mem::size_of::<MemtraceMergeReport>(),
                "report",
            )?;
            let caller_array = (r.inputs, r.inputs_capacity);
            *r = empty_report(caller_array.0, caller_array.1);
            caller_array
        };
        let args = parse_args(inputs, n_inputs, output, options)?;
        let merged = merge_fn(&args.inputs, &args.output, &args.options).map_err(|e| Failure {
            status: classify(&e),
            message: e.to_string(),
        })?;
        let per_input = input_reports(&merged, &args.inputs);
        if !report.is_null() {
            *report = totals(&merged, inputs_array, capacity);
            if !inputs_array.is_null() {
                for (i, r) in per_input.into_iter().take(capacity).enumerate() {
                    inputs_array.add(i).write(r);
                }
            }
        }
        Ok::<_, Failure>(warning_of(&merged))
    });
    let (status, message) = match panic::catch_unwind(run) {
        Ok(Ok(None)) => (MemtraceMergeStatus::Ok, String::new()),
        Ok(Ok(Some(warning))) => (MemtraceMergeStatus::OkWithWarnings, warning),
        Ok(Err(f)) => (f.status, f.message),
        Err(payload) => (
            MemtraceMergeStatus::InternalError,
            format!(
                "internal error: panic in memtrace_merge: {}",
                panic_message(&*payload)
            ),
        ),
    };
    copy_message(errbuf, errbuf_len, &message);
    status
}

/// A report with only the caller's array fields set.
fn empty_report(inputs: *mut MemtraceMergeInputReport, capacity: usize) -> MemtraceMergeReport {
    MemtraceMergeReport {
        struct_size: std::mem::size_of::<MemtraceMergeReport>(),
        inputs,
        inputs_capacity: capacity,
        n_inputs: 0,
        n_inputs_skipped: 0,
        n_inputs_thinned: 0,
        format: 0,
        reserved: 0,
        allocs: 0,
        promotes: 0,
        collects: 0,
        remapped_codes: 0,
        warnings: 0,
        input_events: 0,
        input_allocs: 0,
        samples_read: 0,
        samples_written: 0,
        skipped_packets: 0,
    }
}

unsafe fn parse_args(
    inputs: *const *const c_char,
    n_inputs: usize,
    output: *const c_char,
    options: *const MemtraceMergeOptions,
) -> Result<Args, Failure> {
    if inputs.is_null() {
        return Err(bad("memtrace_merge: inputs is NULL"));
    }
    if n_inputs == 0 {
        return Err(bad("memtrace_merge: no inputs (n_inputs is 0)"));
    }
    if n_inputs > MEMTRACE_MERGE_MAX_INPUTS {
        return Err(bad(format!(
            "memtrace_merge: n_inputs is {n_inputs}, more than the limit {MEMTRACE_MERGE_MAX_INPUTS}"
        )));
    }
    let mut paths = Vec::with_capacity(n_inputs);
    for i in 0..n_inputs {
        let p = *inputs.add(i);
        paths.push(path_arg(p, &format!("inputs[{i}]"))?);
    }
    let output = path_arg(output, "output")?;
    let options = if options.is_null() {
        default_options()
    } else {
        convert_options(&*options)?
    };
    Ok(Args {
        inputs: paths,
        output,
        options,
    })
}

fn default_options() -> MergeOptions {
    MergeOptions {
        progress: false,
        fsync: false,
        decode_threads: None,
        ..MergeOptions::default()
    }
}

/// A `struct_size` field: 0 or the size of this version of the struct.
fn check_size(size: usize, want: usize, what: &str) -> Result<(), Failure> {
    if size == 0 || size == want {
        return Ok(());
    }
    Err(bad(format!(
        "memtrace_merge: {what}.struct_size is {size}, not {want}: built against another \
         version of memtrace_merge.h"
    )))
}

/// A C caller's cancel flag, read while the merge runs (valid until it returns).
struct CancelFlag(*const c_int);

// SAFETY: the caller keeps the flag valid for the call and writes it atomically (documented
// on `MemtraceMergeOptions.cancel`); it is only read, atomically.
unsafe impl Send for CancelFlag {}
// SAFETY: as for Send: shared reads of an atomic int.
unsafe impl Sync for CancelFlag {}

impl CancelFlag {
    fn is_set(&self) -> bool {
        // SAFETY: see the impls above; an int is aligned for an AtomicI32.
        unsafe { std::sync::atomic::AtomicI32::from_ptr(self.0 as *mut i32) }
            .load(std::sync::atomic::Ordering::Relaxed)
            != 0
    }
}

unsafe fn convert_options(o: &MemtraceMergeOptions) -> Result<MergeOptions, Failure> {
    check_size(
        o.struct_size,
        std::mem::size_of::<MemtraceMergeOptions>(),
        "options",
    )?;
    let format = match o.format {
        MEMTRACE_MERGE_FORMAT_AUTO => None,
        MEMTRACE_MERGE_FORMAT_V2 => Some(2),
        MEMTRACE_MERGE_FORMAT_V3 => Some(3),
        f => {
            return Err(bad(format!(
                "memtrace_merge: options->format is {f}, not 0 (auto), 2 or 3"
            )))
        }
    };
    let rate_mismatch = match o.on_rate_mismatch {
        MEMTRACE_MERGE_RATE_THIN => RateMismatch::Thin,
        MEMTRACE_MERGE_RATE_FAIL => RateMismatch::Fail,
        r => {
            return Err(bad(format!(
                "memtrace_merge: options->on_rate_mismatch is {r}, not 0 (thin) or 1 (fail)"
            )))
        }
    };
    let context = if o.context.is_null() {
        None
    } else {
        Some(CStr::from_ptr(o.context).to_bytes().to_vec())
    };
    Ok(MergeOptions {
        format,
        rate_mismatch,
        seed: o.seed,
        tag_processes: o.tag_processes != 0,
        skip_bad_inputs: o.skip_bad_inputs != 0,
        pid: if o.pid == 0 { None } else { Some(o.pid) },
        context,
        cancel: if o.cancel.is_null() {
            crate::cancel::Cancel::new()
        } else {
            let flag = CancelFlag(o.cancel);
            crate::cancel::Cancel::polling(move || flag.is_set())
        },
        ..default_options()
    })
}

/// A path argument: not NULL, not empty; any other bytes are a path (on Unix).
unsafe fn path_arg(p: *const c_char, what: &str) -> Result<PathBuf, Failure> {
    if p.is_null() {
        return Err(bad(format!("memtrace_merge: {what} is NULL")));
    }
    let bytes = CStr::from_ptr(p).to_bytes();
    if bytes.is_empty() {
        return Err(bad(format!("memtrace_merge: {what} is an empty string")));
    }
    path_of_bytes(bytes).ok_or_else(|| bad(format!("memtrace_merge: {what} is not valid UTF-8")))
}

#[cfg(unix)]
fn path_of_bytes(b: &[u8]) -> Option<PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    Some(PathBuf::from(std::ffi::OsStr::from_bytes(b)))
}

#[cfg(not(unix))]
fn path_of_bytes(b: &[u8]) -> Option<PathBuf> {
    std::str::from_utf8(b).ok().map(PathBuf::from)
}

/// Whether two paths name the same file: equal, or (when both exist) the same inode.
/// The status of a merge error, by the side it is about ([`Error::side`]).
fn classify(e: &Error) -> MemtraceMergeStatus {
    match (e, e.side()) {
        (Error::Usage(_), _) => MemtraceMergeStatus::BadArguments,
        (Error::Cancelled, _) => MemtraceMergeStatus::Cancelled,
        (_, Some(Side::Output)) => MemtraceMergeStatus::OutputError,
        (_, Some(Side::Input)) => MemtraceMergeStatus::InputError,
        _ => MemtraceMergeStatus::InternalError,
    }
}

fn totals(
    r: &MergeReport,
    inputs: *mut MemtraceMergeInputReport,
    capacity: usize,
) -> MemtraceMergeReport {
    let sum = |f: fn(&InputReport) -> u64| r.inputs.iter().map(f).sum::<u64>();
    MemtraceMergeReport {
        n_inputs: r.inputs.len() as u64,
        n_inputs_skipped: r.inputs.iter().filter(|i| i.skipped).count() as u64,
        n_inputs_thinned: r
            .inputs
            .iter()
            .filter(|i| !i.skipped && i.keep_fraction < 1.0)
            .count() as u64,
        format: u32::from(r.format),
        allocs: r.allocs,
        promotes: r.promotes,
        collects: r.collects,
        remapped_codes: r.remapped_codes,
        warnings: r.warnings,
        input_events: sum(|i| i.events),
        input_allocs: sum(|i| i.allocs),
        samples_read: sum(|i| i.samples_read),
        samples_written: sum(|i| i.samples_written),
        skipped_packets: sum(|i| i.skipped_packets),
        ..empty_report(inputs, capacity)
    }
}

fn input_reports(r: &MergeReport, args: &[PathBuf]) -> Vec<MemtraceMergeInputReport> {
    r.inputs
        .iter()
        .map(|i| MemtraceMergeInputReport {
            arg_index: if i.arg < args.len() {
                i.arg
            } else {
                MEMTRACE_MERGE_UNKNOWN_ARG
            },
            pid: i.pid,
            format: u32::from(i.format),
            skipped: c_int::from(i.skipped),
            sample_rate: i.sample_rate,
            keep_fraction: i.keep_fraction,
            events: i.events,
            allocs: i.allocs,
            promotes: i.promotes,
            collects: i.collects,
            allocs_written: i.allocs_written,
            samples_read: i.samples_read,
            samples_written: i.samples_written,
            skipped_packets: i.skipped_packets,
            remapped_codes: i.remapped_codes,
            warnings: i.warnings.len() as u64,
            file_name: match args.get(i.arg) {
                Some(a) if *a != i.path => {
                    use std::os::unix::ffi::OsStrExt;
                    c_name(i.path.file_name().map_or(&[][..], |n| n.as_bytes()))
                }
                _ => [0; 256],
            },
        })
        .collect()
}

/// The first warning of a successful merge, if it had any.
fn warning_of(r: &MergeReport) -> Option<String> {
    if let Some((i, w)) = r
        .inputs
        .iter()
        .find_map(|i| i.warnings.first().map(|w| (i, w)))
    {
        let path = i.path.display().to_string();
        return Some(if w.contains(&path) {
            w.clone()
        } else {
            format!("{path}: {w}")
        });
    }
    let skipped = r.inputs.iter().filter(|i| i.skipped).count();
    if skipped > 0 {
        return Some(format!("{skipped} input(s) skipped"));
    }
    (r.warnings > 0).then(|| format!("{} warning(s)", r.warnings))
}

fn panic_message(payload: &(dyn Any + Send)) -> &str {
    if let Some(s) = payload.downcast_ref::<&'static str>() {
        s
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s
    } else {
        "(no message)"
    }
}

/// Copy `msg` into `errbuf` NUL-terminated, cut to fit at a UTF-8 character boundary.
unsafe fn copy_message(errbuf: *mut c_char, len: usize, msg: &str) {
    if errbuf.is_null() || len == 0 {
        return;
    }
    let mut n = msg.len().min(len - 1);
    while !msg.is_char_boundary(n) {
        n -= 1;
    }
    std::ptr::copy_nonoverlapping(msg.as_ptr().cast::<c_char>(), errbuf, n);
    *errbuf.add(n) = 0;
}

#[cfg(test)]
mod tests;
