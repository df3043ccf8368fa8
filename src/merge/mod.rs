//! The k-way merge of several traces into one: a heap over per-input cursors by absolute
//! time, object ids renumbered, location codes kept or remapped, rates thinned to one.
//!
//! The file-order invariant: a reader meets every promote and collect after the allocation
//! it names. Events are written in time order, an object's allocation before its promote
//! and collect (one in the same microsecond that comes first waits for it), and each
//! promote and collect goes to the output stream that allocated its object
//! ([`Writer::put_id_event_where_allocated`]), not to the one of the domain it came from: OCaml 5 hands
//! a terminated domain's blocks to another domain, whose stream then names them. One
//! stream's packets are written in order, so the invariant holds whatever other domains'
//! packets are still open, and each id delta is non-negative (the reference reader refuses
//! a negative one for promotes).

pub(crate) mod codes;
pub(crate) mod live;

use crate::error::{Error, Result};
use crate::format::buf::WriteBuf;
use crate::format::event::{DomainId, LocationCode, ObjId, Timestamp};
use crate::format::info::TraceInfo;
use crate::format::location::{IntMap, Location};
use crate::fs::{file_id, resolve_output, Target};
use crate::merge::codes::Codes;
use crate::merge::live::LiveObjects;
use crate::pipeline::decoder::{
    order_key, Batch, Decoder, Ev, Hooks, StreamSpec, Timed, Warnings, TAG_FRAME, THINNED_OUT,
    WIDE_LENGTH, WIDE_SAMPLES,
};
use crate::pipeline::output::OutputFile;
use crate::pipeline::placement::Placement;
use crate::pipeline::share::ShareOf;
use crate::reader::{scan_packets_as, PacketScan, Reader};
use crate::thin::Thinner;
use crate::writer::{common_prefix, Writer, WriterOptions};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::fs::File;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Streams of one output domain encoded ahead, each in its share of the cache: at most
/// this many (a share of 1,000 entries still holds a stream's working set of codes).
const MAX_SHARES: usize = 16;

/// Whether encoding ahead pays for these streams: when, in their first 64 allocations, the
/// frames of a backtrace are at least 4 times the frames new since the stream's previous
/// one. Taking turns, each allocation is encoded after another stream's, sharing little
/// with it: the merging thread would encode most frames again, each time. Ahead, a
/// stream's decoder encodes its new frames, and counts the rest, as its input did.
fn ahead_pays(specs: &[StreamSpec], members: &[usize]) -> bool {
    let (mut frames, mut new) = (0u64, 0u64);
    for &j in members {
        let Ok(mut r) = Reader::open(&specs[j].path) else {
            return false;
        };
        r.set_domain_filter(specs[j].domain);
        let mut allocs = 0;
        while allocs < 64 {
            match r.next_event() {
                Ok(Some(crate::format::event::Event::Alloc(a))) => {
                    let n = a.backtrace.len() as u64;
                    frames += n;
                    new += n - a.common_prefix.min(n);
                    allocs += 1;
                }
                Ok(Some(_)) => {}
                _ => break,
            }
        }
    }
    frames > 0 && frames >= 4 * new
}

/// The codes an encoding in a share sent whole (each at its offset in `buf`), in merged
/// codes: written over the input's code in `buf` where that was remapped, and listed in
/// `missed` (whose locations go out before the packet).
#[inline(always)]
fn merged_misses(
    remap: &IntMap<LocationCode, LocationCode>,
    buf: &mut WriteBuf,
    sent: &[(u32, LocationCode)],
    missed: &mut Vec<LocationCode>,
) {
    missed.clear();
    // (most encodings send no code whole)
    if !sent.is_empty() {
        remap_misses(remap, buf, sent, missed);
    }
}

/// [`merged_misses`] for an encoding that sent codes whole.
#[inline(never)]
fn remap_misses(
    remap: &IntMap<LocationCode, LocationCode>,
    buf: &mut WriteBuf,
    sent: &[(u32, LocationCode)],
    missed: &mut Vec<LocationCode>,
) {
    for &(at, code) in sent {
        let out = remap.get(&code).copied().unwrap_or(code);
        if out != code {
            buf.set_u64(at as usize, out.0);
        }
        missed.push(out);
    }
}

/// What to do when inputs were sampled at different rates.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RateMismatch {
    /// Thin every faster input to the slowest rate (binomial thinning, seeded).
    #[default]
    Thin,
    /// Refuse to merge.
    Fail,
}

/// Options of a merge; `Default` gives the documented defaults.
#[derive(Clone, Debug, Default)]
pub struct MergeOptions {
    /// Output format version (2 or 3); None: 2 when every input is ≤ 2, else 3.
    pub format: Option<u16>,
    pub rate_mismatch: RateMismatch,
    /// Seed of the thinning's random numbers.
    pub seed: u64,
    /// Give every backtrace a synthetic root frame naming its input.
    pub tag_processes: bool,
    /// Leave out inputs that cannot be read at all (with a warning) instead of failing.
    pub skip_bad_inputs: bool,
    /// The merged trace's pid (default: the first input's).
    pub pid: Option<u64>,
    /// The merged trace's context (default: the first input's, or a merge description).
    pub context: Option<Vec<u8>>,
    /// Print a progress line on stderr (when it is a terminal) for long merges.
    pub progress: bool,
    /// Replace an existing output that is read-only (refused otherwise).
    pub force: bool,
    /// Merge every input, even one that holds what another holds (a copy of a trace, or
    /// an earlier merge of the same traces), which is otherwise merged once.
    pub keep_duplicates: bool,
    /// Cancels the merge when set (from another thread): it then returns
    /// [`Error::Cancelled`], leaving no output.
    pub cancel: crate::Cancel,
    /// Flush the output to disk before renaming it into place, so that it survives a power
    /// loss (a few milliseconds). Without it the output is still never seen half-written.
    pub fsync: bool,
    /// Threads decoding the inputs ahead of the merge (None: the cores but one, at least
    /// one, at most four). The output does not depend on it.
    pub decode_threads: Option<usize>,
    /// Encode the backtraces of streams that take turns in one output domain ahead, each
    /// whole in its own share of the domain's cache (see [`crate::pipeline::share`]), as they are
    /// decoded (by the decoding threads, or by the merging thread rather than wait for
    /// them), rather than each after the previous allocation of the domain on the
    /// merging thread; a stream alone in its domain (format 3) is encoded ahead in the
    /// whole cache, after the frames it keeps of its previous backtrace, as the merging
    /// thread would. None: when that pays (backtraces that repeat much of the stream's
    /// previous one); never beyond 16 streams a domain, for a lone input (copied as it
    /// is), nor for a thinned input of several streams (its draws are made again as its
    /// stream is encoded). The output is valid either way, but not the same bytes.
    /// Encoding ahead, a backtrace too deep for its share (more distinct frames than the
    /// share holds) has the merge made again without encoding ahead, rather than cut.
    pub encode_ahead: Option<bool>,
}

/// What happened to one input.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct InputReport {
    pub path: PathBuf,
    /// The argument it came from: its index among the inputs given (a file, or the
    /// directory holding it).
    pub arg: usize,
    pub pid: u64,
    pub format: u16,
    pub sample_rate: f64,
    /// Events read (allocs + promotes + collects).
    pub events: u64,
    pub allocs: u64,
    pub promotes: u64,
    pub collects: u64,
    /// Allocations written to the output (fewer than `allocs` when thinned).
    pub allocs_written: u64,
    pub samples_read: u64,
    pub samples_written: u64,
    /// Fraction of samples kept by thinning (1.0 when not thinned).
    pub keep_fraction: f64,
    pub skipped_packets: u64,
    /// Location codes given a fresh code because another input used them differently.
    pub remapped_codes: u64,
    /// Allocations whose backtrace was too deep for one whole packet, written cut.
    pub cut_backtraces: u64,
    /// Left out entirely (unreadable, with `skip_bad_inputs`).
    pub skipped: bool,
    /// Reading stopped at an error before the input's end (a warning says where): what
    /// came before it was merged, the rest left out.
    pub stopped_at_error: bool,
    /// Reader warnings and merge notes about this input.
    pub warnings: Vec<String>,
}

/// What a merge did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MergeReport {
    pub inputs: Vec<InputReport>,
    pub output: PathBuf,
    pub format: u16,
    pub allocs: u64,
    pub promotes: u64,
    pub collects: u64,
    pub remapped_codes: u64,
    pub warnings: u64,
    /// Whether backtraces were encoded ahead ([`MergeOptions::encode_ahead`]).
    pub encoded_ahead: bool,
    /// Warnings about the arguments rather than one input: entries of a directory left out
    /// (a symbolic link to nothing, a directory or a FIFO named `*.ctf`).
    pub argument_warnings: Vec<String>,
}

/// The sources of the merged trace `merged`, as [`merge`] takes its inputs: directories
/// expanded into their `*.ctf` files (sorted by name) but for `merged` itself, files kept as
/// given, and each file once.
pub fn expand_inputs(inputs: &[PathBuf], merged: &Path) -> Result<Vec<PathBuf>> {
    let (paths, args) = expand_inputs_from(inputs, merged, true, None)?
        .0
        .into_iter()
        .unzip();
    Ok(drop_repeats(paths, args).0)
}

/// The context an output of several inputs gets, unless one is given ([`describe_merge`]).
const MERGE_CONTEXT: &str = "memtrace-merge of ";

/// Input files with the index of their argument, and warnings about directory entries.
type Expanded = (Vec<(PathBuf, usize)>, Vec<String>);

/// Directories expanded into their `*.ctf` files, sorted by name, each file with the index
/// of the argument it came from (files named twice are still there). `output` is left out
/// of a directory: always when `always`, else only when it is an earlier merge (its context
/// says so), which the merge is to replace: so a directory can be merged into a file of its
/// own again, while a source named as the output is still refused.
fn expand_inputs_from(
    inputs: &[PathBuf],
    output: &Path,
    always: bool,
    own_context: Option<&[u8]>,
) -> Result<Expanded> {
    let output = file_id(output);
    // (an earlier merge: by the context a merge gives, or the one given to this merge)
    let earlier_merge = |q: &Path| {
        Reader::open(q).is_ok_and(|r| {
            merge_context(r.info()).is_some()
                || own_context.is_some_and(|c| r.info().context.as_deref() == Some(c))
        })
    };
    let left_out =
        |q: &Path| output.is_some() && file_id(q) == output && (always || earlier_merge(q));
    let mut out = Vec::new();
    let mut warnings = Vec::new();
    for (arg, p) in inputs.iter().enumerate() {
        if p.as_os_str().is_empty() {
            return Err(Error::Usage("empty input path".into()));
        }
        if p.is_dir() {
            let mut v: Vec<PathBuf> = Vec::new();
            let entries = std::fs::read_dir(p).map_err(|e| Error::input(p, "read directory", e))?;
            for q in entries.filter_map(|e| e.ok().map(|e| e.path())) {
                if q.extension().is_none_or(|x| x != "ctf") {
                    continue;
                }
                match std::fs::metadata(&q) {
                    Ok(m) if m.is_file() => v.push(q),
                    Ok(m) if m.is_dir() => warnings.push(format!(
                        "{}: a directory, not a trace: left out",
                        q.display()
                    )),
                    Ok(_) => warnings.push(format!(
                        "{}: not a regular file (name it on its own to read it): left out",
                        q.display()
                    )),
                    Err(e) => warnings.push(format!(
                        "{}: {}: left out",
                        q.display(),
                        if std::fs::symlink_metadata(&q).is_ok() {
                            "a symbolic link to nothing".to_string()
                        } else {
                            e.to_string()
                        }
                    )),
                }
            }
            // (merging a directory into a file of it again: the earlier output is no input)
            let all = v.len();
            v.retain(|q| !left_out(q));
            v.sort();
            if v.is_empty() {
                return Err(Error::Usage(format!(
                    "{}: directory has no .ctf files{}",
                    p.display(),
                    if all > 0 { " but the output" } else { "" }
                )));
            }
            out.extend(v.into_iter().map(|q| (q, arg)));
        } else {
            out.push((p.clone(), arg));
        }
    }
    warnings.sort();
    Ok((out, warnings))
}

/// `paths` (with their arguments) each file once: a file named again (however spelled: a
/// directory and a file in it, a link; see [`file_id`]) is left out, and listed after the
/// index of the entry kept for it.
fn drop_repeats(
    paths: Vec<PathBuf>,
    args: Vec<usize>,
) -> (Vec<PathBuf>, Vec<usize>, Vec<(usize, String)>) {
    // (each file's index among those kept)
    let mut seen = std::collections::HashMap::with_capacity(paths.len());
    let (mut kept, mut kept_args, mut repeats) = (Vec::new(), Vec::new(), Vec::new());
    for (p, a) in paths.into_iter().zip(args) {
        // (a file that cannot be read is kept: opening it says what is wrong)
        if let Some(id) = file_id(&p) {
            if let Some(&k) = seen.get(&id) {
                repeats.push((k, format!("given again as {}: merged once", p.display())));
                continue;
            }
            seen.insert(id, kept.len());
        }
        kept.push(p);
        kept_args.push(a);
    }
    (kept, kept_args, repeats)
}

/// One stream being merged (an input, or one domain of a format-3 input), as decoded
/// ahead in batches: the current batch and its last allocation's backtrace.
struct Stream {
    input: usize,
    out_domain: DomainId,
    batch: Batch,
    pos: usize,
    frame_pos: usize,
    /// the batch's next location definition to take in
    loc_pos: usize,
    /// index of `out_domain` among the output domains
    out_slot: usize,
    /// (a stream in a share of its output domain's cache, whose batches come encoded) the
    /// batch's next encoding in its `enc`, and its next code sent whole in its `misses`
    enc_pos: usize,
    /// encoded alone in its output domain: each encoding starts with the count of frames
    /// kept of the previous backtrace ([`StreamSpec::solo`])
    solo: bool,
    miss_pos: usize,
    /// the batch's next entry in `wide`
    wide_pos: usize,
    /// its events' bits of [`order_key`] below the time and rank
    key_bits: u128,
    /// The stream's codes that mean something else in the merged trace, with their new
    /// codes: a stream's own, as each domain of a format-3 input is read with a location
    /// table of its own, and two may give one code different meanings.
    remap: IntMap<LocationCode, LocationCode>,
}

impl Stream {
    /// An allocation's length and sample count, from its event's (see [`Ev`]).
    #[inline(always)]
    fn length_and_samples(&mut self, length: u32, nsamples: u16) -> (u64, u64) {
        let mut wide = |v: u64, escape: bool| {
            if escape {
                self.wide_pos += 1;
                self.batch.wide[self.wide_pos - 1]
            } else {
                v
            }
        };
        let length = wide(length as u64, length == WIDE_LENGTH);
        (length, wide(nsamples as u64, nsamples == WIDE_SAMPLES))
    }
}

/// Each stream's current allocation backtrace in merged codes (tag frame first if any),
/// with a count of its changes: what the last allocation written in a domain shares with
/// the next one is known without comparing when both come from the same stream.
#[derive(Default)]
struct Backtrace {
    frames: Vec<LocationCode>,
    /// Per frame, the output cache entry it was in when last encoded (see
    /// [`Writer::put_alloc_hinted`]); stale beyond what was kept, which does no harm.
    hints: Vec<u16>,
    version: u64,
}

struct InputState {
    report: InputReport,
    /// Source object id → merged id (DROPPED when thinned away); only live objects.
    live: LiveObjects,
    thinner: Option<Thinner>,
    tag: Option<LocationCode>,
    /// the merging thread's warnings (the decoder keeps its own)
    warnings: Warnings,
    /// Promotes and collects of objects not live when their turn came (in time order):
    /// another domain may still allocate the object in the same microsecond, behind an
    /// event of its own that came first. (source id, time, a collect)
    waiting: Vec<(u64, u64, bool)>,
}

impl InputState {
    /// Count an allocation of `nsamples` read: the samples it is written with, or None
    /// when thinning left it out (took its every sample; one of none stays).
    #[inline(always)]
    fn read_alloc(&mut self, nsamples: u64) -> Option<u64> {
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
fn wait_for_object(st: &mut InputState, id: u64, time: u64, collect: bool) {
    give_up_waiting(st, time);
    st.waiting.push((id, time, collect));
}

/// Leave out the waiting events before `time` (all of them: None): their object was never
/// allocated in their microsecond.
fn give_up_waiting(st: &mut InputState, time: impl Into<Option<u64>>) {
    let time = time.into();
    let n = (st.waiting.iter())
        .take_while(|w| time.is_none_or(|t| w.1 < t))
        .count();
    for (id, _, collect) in st.waiting.drain(..n) {
        left_out_not_live(&mut st.warnings, id, collect);
    }
}

/// Warn of a promote (`collect` false) or collect of source object `id`, not live, left out.
fn left_out_not_live(warnings: &mut Warnings, id: u64, collect: bool) {
    let what = if collect { "collect" } else { "promote" };
    warnings.push(format!("{what} of object {id} that is not live; left out"));
}

/// A promote (`collect` false) or collect of source object `id` at `time`, written when
/// the object is live (left out when thinned away, or a second promote); false when it is
/// not live. It is written in the output domain that allocated the object, which may not
/// be the one of the stream it came in (see the module doc).
#[inline(always)]
fn follow_object(
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
fn release_waiting(
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

const DROPPED: u64 = u64::MAX - 1;
/// Set in a live entry's merged id once the object was promoted (a second promote is left out).
const PROMOTED: u64 = 1 << 63;

fn warn_input(st: &mut InputState, msg: String) {
    st.warnings.push(msg);
}

/// A reader of `source`, which messages name `name` (a spooled pipe by its own name).
fn open_as(source: &Path, name: &Path) -> Result<Reader<File>> {
    let f = File::open(source).map_err(|e| Error::input(name, "open", e))?;
    Reader::new(f, &name.display().to_string())
}

/// The executable's file name (without its directory).
fn exe_name(i: &TraceInfo) -> String {
    let exe = String::from_utf8_lossy(&i.executable_name);
    exe.rsplit('/').next().unwrap_or("").to_string()
}

fn file_name(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// A readable input: its place among the inputs given, its trace info, its domains.
struct Opened {
    index: usize,
    path: PathBuf,
    info: TraceInfo,
    domains: Vec<u16>,
    /// What to open: `path`, or its spool ([`Prepared::sources`]).
    source: PathBuf,
    /// Allocations its packet headers claim (u64::MAX: not counted).
    alloc_ids: u64,
}

/// The merged trace's sampling rate: the slowest input's among those that hold allocations
/// (one that holds none, a worker killed before its first event packet, has nothing to
/// thin the others for). Counts the inputs' allocations when their rates differ.
fn merged_rate(opened: &mut [Opened]) -> Result<f64> {
    let rate = |o: &Opened| o.info.sample_rate;
    if opened.iter().all(|o| rate(o) == rate(&opened[0])) {
        return Ok(rate(&opened[0]));
    }
    for o in opened.iter_mut().filter(|o| o.alloc_ids == u64::MAX) {
        o.alloc_ids = scan_packets_as(&o.source, &o.path, true)?.alloc_ids;
    }
    let slowest = |any: bool| {
        (opened.iter())
            .filter(|o| any || o.alloc_ids > 0)
            .map(rate)
            .fold(f64::INFINITY, f64::min)
    };
    let with_allocs = slowest(false);
    Ok(if with_allocs.is_finite() {
        with_allocs
    } else {
        slowest(true)
    })
}

/// When thinning to `min_rate` keeps little of the other inputs (the slowest hold a small
/// share of the allocations), a sentence saying how much the merge drops.
fn thinning_cost(opened: &[Opened], min_rate: f64) -> Option<String> {
    let (mut slow, mut others, mut kept) = (0f64, 0f64, 0f64);
    for o in opened {
        let n = o.alloc_ids as f64;
        if o.info.sample_rate <= min_rate {
            slow += n;
        } else {
            others += n;
            kept += n * min_rate / o.info.sample_rate;
        }
    }
    let share = slow / (slow + others);
    (others > 0.0 && share < 0.25).then(|| {
        format!(
            "sampled at {min_rate}, the slowest rate, the inputs at that rate hold {:.1}% of \
             all allocations: thinning the others to it keeps about {:.1}% of their samples \
             (merge without the slow inputs to keep them, or --rate-mismatch fail to refuse)",
            100.0 * share,
            100.0 * kept / others
        )
    })
}

/// The root frame `--tag-processes` gives an input's backtraces: its file name, its pid
/// and executable.
pub(crate) fn process_tag(path: &Path, info: &TraceInfo) -> Location {
    Location {
        filename: Arc::from(file_name(path).as_bytes()),
        line: 1,
        start_char: 0,
        end_char: 0,
        defname: Arc::from(format!("pid {} {}", info.pid, exe_name(info)).as_bytes()),
    }
}

/// The context of an earlier merge, as [`describe_merge`] made it (None for a trace of
/// another context, or none).
fn merge_context(info: &TraceInfo) -> Option<&[u8]> {
    let c = info.context.as_deref()?;
    c.starts_with(MERGE_CONTEXT.as_bytes()).then_some(c)
}

/// The pids of the traces an earlier merge holds, from the context it was given
/// ([`describe_merge`]; none for another context).
fn merged_pids(info: &TraceInfo) -> Vec<u64> {
    merged_processes(info).into_iter().map(|p| p.0).collect()
}

/// The traces an earlier merge holds: pid and, where recorded (merges since 2026-12), start
/// time, from the context it was given.
fn merged_processes(info: &TraceInfo) -> Vec<(u64, Option<u64>)> {
    let Some(c) = merge_context(info) else {
        return Vec::new();
    };
    let c = String::from_utf8_lossy(c);
    c.split("(pid ")
        .skip(1)
        .filter_map(|rest| {
            let mut fields = rest.split(", ");
            let pid = fields.next()?.parse().ok()?;
            let start = fields
                .next()
                .and_then(|f| f.strip_prefix("started "))
                .and_then(|t| t.parse().ok());
            Some((pid, start))
        })
        .collect()
}

/// The context of a merge of several inputs: which traces, pids and executables.
fn describe_merge(opened: &[Opened]) -> Vec<u8> {
    let mut s = format!("{MERGE_CONTEXT}{} traces:", opened.len());
    for Opened {
        path: p, info: i, ..
    } in opened
    {
        s.push_str(&format!(
            " {} (pid {}, started {}, {}, rate {}{});",
            file_name(p),
            i.pid,
            i.start_time.0,
            exe_name(i),
            i.sample_rate,
            match &i.context {
                Some(c) => format!(", \"{}\"", String::from_utf8_lossy(c)),
                None => String::new(),
            }
        ));
        if s.len() > 4000 {
            // (cut between characters: names and contexts may hold any)
            s.truncate(s.floor_char_boundary(3990));
            s.push_str(" ...");
            break;
        }
    }
    s.into_bytes().into_iter().filter(|&b| b != 0).collect()
}

/// Merge `inputs` (files, or directories whose `*.ctf` files are taken in name order, but
/// `output` when it is an earlier merge; a file named twice, however spelled, is merged
/// once, with a warning) into `output`, written to a temporary file beside it and renamed at
/// the end.
pub fn merge(inputs: &[PathBuf], output: &Path, opts: &MergeOptions) -> Result<MergeReport> {
    merge_with(inputs, output, opts, Hooks::default())
}

/// [`merge`], with (tests) the decoding threads doing what `hooks` say.
fn merge_with(
    inputs: &[PathBuf],
    output: &Path,
    opts: &MergeOptions,
    hooks: Hooks,
) -> Result<MergeReport> {
    let prepared = prepare_inputs(inputs, output, opts)?;
    let mut opts = opts.clone();
    // (written through, an output cannot be made again: no attempt may need another)
    if !matches!(prepared.target, Target::File(_)) {
        opts.encode_ahead = Some(false);
    }
    loop {
        match merge_attempt(&prepared, output, &opts, hooks)? {
            Some(report) => return Ok(report),
            // A backtrace too deep for its share: again without encoding ahead (everything
            // of the first attempt gone, its temporary file too), which cannot need this.
            None => opts.encode_ahead = Some(false),
        }
    }
}

/// What tells one traced process's trace from another's: an earlier merge by the inputs its
/// context records, any other trace by its info packet and first packet (a copy of a trace
/// is the same bytes; another run, even of the same pid, starts at another time).
#[derive(Hash, PartialEq, Eq)]
enum Process {
    Merge(Vec<u8>),
    Trace(u64),
}

/// A trace an earlier merge records: pid, and start time where recorded.
type Recorded = (u64, Option<u64>);

/// The [`Process`] of the trace at `source`, with its pid and start time and, for an
/// earlier merge, the processes it records; None when it cannot be read.
fn process_of(source: &Path) -> Option<(Process, (u64, u64), Vec<Recorded>)> {
    use std::hash::{Hash, Hasher};
    use std::io::Read;
    let r = Reader::open(source).ok()?;
    let me = (r.info().pid, r.info().start_time.0);
    if let Some(c) = merge_context(r.info()) {
        return Some((Process::Merge(c.to_vec()), me, merged_processes(r.info())));
    }
    // (the first two packets' bytes: each header gives its size in bits)
    let mut f = File::open(source).ok()?;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for _ in 0..2 {
        let mut hdr = [0u8; 8];
        if f.read_exact(&mut hdr).is_err() {
            break;
        }
        let size = (u32::from_le_bytes([hdr[4], hdr[5], hdr[6], hdr[7]]) / 8) as usize;
        let mut body = vec![0u8; size.saturating_sub(8).min(1 << 22)];
        let n = f.read(&mut body).ok()?;
        (hdr, &body[..n]).hash(&mut h);
    }
    Some((Process::Trace(h.finish()), me, Vec::new()))
}

/// Leave out the inputs that hold what another one holds ([`Process`]): a repeat of an
/// earlier input, or a trace that an earlier merge given too records (the same pid and
/// start time), each named in `repeats` against the one kept.
fn drop_same_processes(
    paths: Vec<PathBuf>,
    sources: Vec<PathBuf>,
    args: Vec<usize>,
    repeats: &mut Vec<(usize, String)>,
) -> (Vec<PathBuf>, Vec<PathBuf>, Vec<usize>) {
    use std::collections::hash_map::Entry;
    let who: Vec<_> = sources.iter().map(|s| process_of(s)).collect();
    // (pid, start time) -> the earlier merge that holds it
    let mut held = std::collections::HashMap::new();
    for (k, w) in who.iter().enumerate() {
        for &(pid, start) in w.iter().flat_map(|w| &w.2) {
            if let Some(start) = start {
                held.entry((pid, start)).or_insert(k);
            }
        }
    }
    let mut seen = std::collections::HashMap::with_capacity(paths.len());
    // (each input's index among those kept)
    let mut index = vec![usize::MAX; paths.len()];
    let mut keep = vec![true; paths.len()];
    for (k, w) in who.into_iter().enumerate() {
        let Some((process, me, _)) = w else {
            index[k] = k;
            continue;
        };
        let what = match process {
            Process::Merge(_) => "an earlier merge of the same traces",
            Process::Trace(_) => {
                "a trace of the same process (the same pid, start time and first packet)"
            }
        };
        match seen.entry(process) {
            Entry::Occupied(e) => {
                keep[k] = false;
                let note = format!(
                    "{} is {what}: merged once (--keep-duplicates merges both)",
                    paths[k].display()
                );
                repeats.push((*e.get(), note));
            }
            Entry::Vacant(e) => {
                e.insert(k);
                if let Some(&m) = held.get(&me).filter(|&&m| m != k) {
                    keep[k] = false;
                    let note = format!(
                        "holds {} (pid {}, the same start time): that trace is left out, so \
                         that its allocations appear once (--keep-duplicates merges both)",
                        paths[k].display(),
                        me.0
                    );
                    repeats.push((m, note));
                }
            }
        }
    }
    // (the repeats' indices, from among all inputs to among those kept)
    let mut n = 0;
    for k in 0..paths.len() {
        if keep[k] {
            index[k] = n;
            n += 1;
        }
    }
    for r in repeats.iter_mut() {
        r.0 = index[r.0];
    }
    let (mut p2, mut s2, mut a2) = (Vec::new(), Vec::new(), Vec::new());
    for (k, ((p, src), a)) in paths.into_iter().zip(sources).zip(args).enumerate() {
        if keep[k] {
            p2.push(p);
            s2.push(src);
            a2.push(a);
        }
    }
    (p2, s2, a2)
}

/// A merge's input files, found once for all its attempts.
struct Prepared {
    /// Each file once, as named (directories expanded).
    paths: Vec<PathBuf>,
    /// What to open for each: the file, or the spool of one that cannot be read twice.
    sources: Vec<PathBuf>,
    /// The argument each came from.
    args: Vec<usize>,
    /// Files named again, or holding what another holds: (index of the one kept, what the
    /// warning on it says).
    repeats: Vec<(usize, String)>,
    /// Warnings about the arguments, not one input (directory entries left out).
    arg_warnings: Vec<String>,
    /// Where the output goes.
    target: Target,
    _spools: Vec<crate::fs::spool::Spool>,
}

/// Check a merge's arguments, expand its directories, leave out files named twice and spool
/// the inputs that cannot be read twice (pipes, FIFOs), each opened once, here, before
/// anything else waits on it.
fn prepare_inputs(inputs: &[PathBuf], output: &Path, opts: &MergeOptions) -> Result<Prepared> {
    if inputs.is_empty() {
        return Err(Error::Usage("no input traces".into()));
    }
    if output.as_os_str().is_empty() {
        return Err(Error::Usage("empty output path".into()));
    }
    if opts.cancel.is_cancelled() {
        return Err(Error::Cancelled);
    }
    if opts.pid == Some(0) {
        return Err(Error::Usage(
            "pid 0 is not a process id: give a positive pid, or none to keep the first input's"
                .into(),
        ));
    }
    if let Some(f) = opts.format {
        if !(2..=3).contains(&f) {
            return Err(Error::Usage(format!(
                "output format must be 2 or 3, not {f}"
            )));
        }
    }
    // (where the output goes, and that it can go there, before any work)
    let target = resolve_output(output, opts.force)?;
    if let Target::File(_) = target {
        drop(target.create()?);
    }
    let (found, arg_warnings) = expand_inputs_from(inputs, output, false, opts.context.as_deref())?;
    let (paths, args): (Vec<PathBuf>, Vec<usize>) = found.into_iter().unzip();
    // A file given twice is merged once: its process's allocations appear once.
    let (paths, args, mut repeats) = drop_repeats(paths, args);
    let mut sources = Vec::with_capacity(paths.len());
    let mut spools = Vec::new();
    for p in &paths {
        if target.is(p) {
            return Err(Error::Usage(format!(
                "output {} is one of the inputs ({}); refusing to overwrite it",
                output.display(),
                p.display()
            )));
        }
        if crate::fs::spool::needs_spool(p) {
            let s = crate::fs::spool::spool(p, &opts.cancel)?;
            sources.push(s.path.clone());
            spools.push(s);
            continue;
        }
        sources.push(p.clone());
    }
    let (paths, sources, args) = if opts.keep_duplicates {
        (paths, sources, args)
    } else {
        drop_same_processes(paths, sources, args, &mut repeats)
    };
    Ok(Prepared {
        paths,
        sources,
        args,
        repeats,
        arg_warnings,
        target,
        _spools: spools,
    })
}

/// [`merge_with`], once: None when a backtrace did not fit its share of the cache.
fn merge_attempt(
    prepared: &Prepared,
    output: &Path,
    opts: &MergeOptions,
    hooks: Hooks,
) -> Result<Option<MergeReport>> {
    let Prepared {
        paths,
        sources,
        args,
        repeats,
        ..
    } = prepared;
    // Read every input's info packet and find its domains. Each entry keeps the index of
    // its path, so that reports come out in the order the inputs were given.
    let mut opened: Vec<Opened> = Vec::new();
    let mut skipped: Vec<(usize, InputReport)> = Vec::new();
    let mut first_bad = None;
    for (k, p) in paths.iter().enumerate() {
        let src = &sources[k];
        let res = open_as(src, p).and_then(|r| {
            let info = r.info().clone();
            let scan = if info.version >= 3 {
                scan_packets_as(src, p, true)?
            } else {
                PacketScan {
                    domains: vec![0],
                    alloc_ids: u64::MAX,
                }
            };
            Ok((info, scan))
        });
        match res {
            Ok((info, scan)) => opened.push(Opened {
                index: k,
                path: p.clone(),
                source: src.clone(),
                info,
                domains: scan.domains,
                alloc_ids: scan.alloc_ids,
            }),
            Err(e) if opts.skip_bad_inputs => {
                skipped.push((
                    k,
                    InputReport {
                        path: p.clone(),
                        arg: args[k],
                        skipped: true,
                        keep_fraction: 0.0,
                        warnings: vec![format!("skipped unreadable input: {e}")],
                        ..Default::default()
                    },
                ));
                first_bad.get_or_insert(e);
            }
            Err(e) => return Err(e),
        }
    }
    if opened.is_empty() {
        // (every input skipped: what was wrong with the first)
        return Err(first_bad.unwrap_or_else(|| Error::Usage("no input traces".into())));
    }
    let word = opened[0].info.word_size;
    if let Some(Opened {
        path: p, info: i, ..
    }) = opened.iter().find(|o| o.info.word_size != word)
    {
        return Err(Error::Incompatible(format!(
            "{}: word size {} differs from {}'s {}",
            p.display(),
            i.word_size,
            opened[0].path.display(),
            word
        )));
    }
    let min_rate = merged_rate(&mut opened)?;
    if opts.rate_mismatch == RateMismatch::Fail {
        if let Some(Opened {
            path: p, info: i, ..
        }) = (opened.iter()).find(|o| o.info.sample_rate != min_rate && o.alloc_ids > 0)
        {
            return Err(Error::Incompatible(format!(
                "sampling rates differ: {} has {}, the slowest input has {} (--rate-mismatch \
                 thin thins the faster ones to it)",
                p.display(),
                i.sample_rate,
                min_rate
            )));
        }
    }
    let single = opened.len() == 1;
    let format = opts.format.unwrap_or_else(|| {
        if opened.iter().all(|o| o.info.version <= 2) {
            2
        } else {
            3
        }
    });
    let first = &opened[0].info;
    let mut info = first.clone();
    info.start_time = Timestamp(
        opened
            .iter()
            .map(|o| o.info.start_time.0)
            .min()
            .unwrap_or(0),
    );
    info.sample_rate = min_rate;
    info.pid = opts.pid.unwrap_or(first.pid);
    info.version = format;
    info.context = match &opts.context {
        Some(c) => Some(c.iter().copied().filter(|&b| b != 0).collect()),
        None if single => first.context.clone(),
        None => Some(describe_merge(&opened)),
    };
    if format < 3 || !single {
        info.initial_domain = DomainId(0);
    }

    // Per-input state (thinning, live objects) and streams (an input, or a domain of one).
    let mut codes = Codes::default();
    let mut states = Vec::new();
    let mut streams = Vec::new();
    let mut specs = Vec::new();
    let mut bts: Vec<Backtrace> = Vec::new();
    let mut out_domains: Vec<DomainId> = Vec::new();
    let mut next_domain = 0u16;
    for (k, o) in opened.iter().enumerate() {
        let (p, i) = (&o.path, &o.info);
        let p_keep = if i.sample_rate > min_rate {
            min_rate / i.sample_rate
        } else {
            1.0
        };
        let mut st = InputState {
            report: InputReport {
                path: p.clone(),
                arg: args[o.index],
                pid: i.pid,
                format: i.version,
                sample_rate: i.sample_rate,
                keep_fraction: 1.0,
                ..Default::default()
            },
            live: LiveObjects::default(),
            thinner: None,
            tag: None,
            warnings: Warnings::default(),
            waiting: Vec::new(),
        };
        if p_keep < 1.0 {
            st.thinner = Some(Thinner::new(p_keep, opts.seed, k as u64));
        } else if i.sample_rate < min_rate {
            warn_input(
                &mut st,
                format!(
                    "sampled at rate {}, but it holds no allocations: the merge keeps the \
                     rate of the others ({min_rate})",
                    i.sample_rate
                ),
            );
        }
        if i.sample_rate == min_rate
            && opened.iter().position(|x| x.info.sample_rate == min_rate) == Some(k)
        {
            if let Some(m) = thinning_cost(&opened, min_rate) {
                warn_input(&mut st, m);
            }
        }
        // An earlier merge beside one of the traces it holds (a directory merged before,
        // its output kept under another name): that process's allocations would be twice.
        let held = merged_pids(i);
        for x in opened
            .iter()
            .filter(|x| x.index != o.index && held.contains(&x.info.pid))
        {
            warn_input(
                &mut st,
                format!(
                    "an earlier merge that holds pid {}, whose trace {} is merged too: if \
                     that is the same process, its allocations appear twice",
                    x.info.pid,
                    x.path.display()
                ),
            );
        }
        for (_, again) in repeats.iter().filter(|(at, _)| *at == o.index) {
            warn_input(&mut st, again.clone());
        }
        if opts.tag_processes {
            st.tag = Some(codes.fresh(Arc::from(vec![process_tag(p, i)])));
        }
        let size = std::fs::metadata(&o.source).map(|m| m.len()).unwrap_or(0);
        for &d in &o.domains {
            let out_domain = if format < 3 {
                DomainId(0)
            } else if single {
                DomainId(d)
            } else {
                next_domain = next_domain
                    .checked_add(1)
                    .ok_or_else(|| Error::Incompatible("more than 65535 domains".into()))?;
                DomainId(next_domain - 1)
            };
            let out_slot = match out_domains.iter().position(|&x| x == out_domain) {
                Some(i) => i,
                None => {
                    out_domains.push(out_domain);
                    out_domains.len() - 1
                }
            };
            specs.push(StreamSpec {
                input: k,
                path: o.source.clone(),
                name: p.clone(),
                domain: if i.version >= 3 { Some(d) } else { None },
                size,
                share: None,
                tagged: st.tag.is_some(),
                thinner: None,
                solo: false,
            });
            streams.push(Stream {
                input: k,
                out_domain,
                batch: Batch::default(),
                pos: 0,
                frame_pos: 0,
                loc_pos: 0,
                out_slot,
                enc_pos: 0,
                solo: false,
                miss_pos: 0,
                wide_pos: 0,
                key_bits: order_key(0, k, 0, streams.len()),
                remap: IntMap::default(),
            });
            bts.push(Backtrace {
                frames: st.tag.into_iter().collect(),
                hints: Vec::new(),
                version: 0,
            });
        }
        states.push(st);
    }
    // decoders on the cores the merging thread leaves (at least one)
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads = opts
        .decode_threads
        .unwrap_or_else(|| (cpus - 1).clamp(1, 4));
    // Streams that take turns in one output domain, encoded ahead when that pays: as they
    // are decoded, by whichever thread fills a batch (the merging thread fills one rather
    // than wait for it).
    let mut encoded_ahead = false;
    for slot in 0..out_domains.len() {
        let members: Vec<usize> = (0..streams.len())
            .filter(|&j| streams[j].out_slot == slot)
            .collect();
        // (a stream alone in its domain, format 3, is encoded ahead in the domain's whole
        // cache, after what it keeps of its previous backtrace, but never a lone input's,
        // which the merge copies as it is; a thinned input's draws are made again as its
        // stream is encoded, in the order the merging thread makes them: its one stream's)
        let possible = (1..=MAX_SHARES).contains(&members.len())
            && !single
            && members.iter().all(|&j| {
                let k = streams[j].input;
                states[k].thinner.is_none() || opened[k].domains.len() == 1
            });
        let ahead = possible
            && opts
                .encode_ahead
                .unwrap_or_else(|| ahead_pays(&specs, &members));
        if ahead {
            encoded_ahead = true;
            for (rank, &j) in members.iter().enumerate() {
                let of = ShareOf {
                    index: rank as u16,
                    count: members.len() as u16,
                };
                if members.len() == 1 {
                    specs[j].solo = true;
                    streams[j].solo = true;
                } else {
                    specs[j].share = Some(of);
                }
                // (its share encodes the tag as TAG_FRAME: sent whole, it is the input's tag)
                let st = &states[streams[j].input];
                if let Some(t) = st.tag {
                    streams[j].remap.insert(TAG_FRAME, t);
                }
                specs[j].thinner = st.thinner.clone();
            }
        }
    }

    // Decoding starts first: it reads the inputs while the output file is made (dropped on
    // an error below, the decoder stops its threads).
    let total_bytes: u64 = specs.iter().map(|s| s.size).sum();
    let started = Instant::now();
    // (the helper threads are kept off the CPU of this thread, the merging one)
    let placement = Placement::new();
    let pipe = Decoder::start(specs, opened.len(), threads, hooks, placement.clone())
        .map_err(|e| Error::Internal(format!("cannot start the decoding threads: {e}")))?;
    let (sink, file) = prepared.target.create()?;
    // The file is written on a thread of its own where a CPU is free for it (the merging
    // thread is the busiest), or where the decoding threads have time to spare: when the
    // merging thread encodes the backtraces itself, it is the busier side (in fork/ it
    // found a batch not ready 10 times in 424) and writing elsewhere took 0.94 of the time
    // on two CPUs. Else on this one (see [`OutputFile::here`]).
    let out = if cpus > threads + 1 || (cpus > 1 && !encoded_ahead) {
        OutputFile::on_thread(file, Some(placement))
            .map_err(|e| Error::output(output, "start writing", e))?
    } else {
        OutputFile::here(file)
    };
    let wopts = WriterOptions {
        version: format,
        lossless: true,
    };
    // (a trace info too long for a packet is the caller's with a context of theirs, else
    // the first input's names)
    let mut w = Writer::new(out, &info, wopts).map_err(|e| match e {
        Error::Usage(m) if opts.context.is_none() => {
            Error::Incompatible(format!("{}: {m}", opened[0].path.display()))
        }
        e => e,
    })?;
    w.set_output_path(output);
    if !single {
        w.set_flush_on_domain_switch(false);
    }

    let show_progress = opts.progress && std::io::stderr().is_terminal();
    let mut progress = Progress {
        cancel: opts.cancel.clone(),
        show: show_progress,
        started,
        last: started,
        total_bytes,
    };
    // Fault in the pages this thread would otherwise fault in one by one as it starts
    // merging (the output's cache tables, its first buffer; the output thread faults in
    // the next ones), while the decoding threads open the inputs and fill their first
    // batches (~1 ms on fork/, the page faults ~0.3 ms): fork/ 0.987 and 0.985 of the
    // time (60 pairs in turns each), the 78 MB and 94 MB sets 1.00.
    w.fault_in();
    w.get_mut().fault_in();
    let merged = merge_streams(
        &mut streams,
        &mut states,
        &mut bts,
        &mut codes,
        &mut w,
        &pipe,
        &mut progress,
    )?;
    if let Merged::ShareTooSmall = merged {
        return Ok(None);
    }
    if show_progress && started.elapsed() > Duration::from_secs(1) {
        let _ = writeln!(std::io::stderr());
    }
    let mut decoded = pipe
        .finish()
        .map_err(|m| Error::Internal(format!("a decoding thread panicked: {m}")))?;
    // A lone input of no packets but its info (a process killed before its first) is
    // copied as it is: without the empty packet a writer ends with.
    if single && decoded.iter().all(|d| d.packets == 0) {
        w.set_end_without_empty_packet();
    }
    // (an input gone since it was first opened: its streams read nothing)
    if let Some(e) = decoded.iter_mut().find_map(|d| d.reopen_failed.take()) {
        return Err(e);
    }
    for (st, d) in states.iter_mut().zip(decoded) {
        st.report.skipped_packets = d.skipped_packets;
        st.report.stopped_at_error = d.stopped_at_error;
        st.report.warnings = d.warnings.list;
        let n = st.report.cut_backtraces;
        if n > 0 {
            warn_input(
                st,
                format!(
                    "{n} allocation(s) had a backtrace too deep for one packet (over ~3,000 \
                     new frames): each was kept cut to what fits"
                ),
            );
        }
    }
    let (out, wstats) = w.finish_with_stats()?;
    let file = out
        .finish()
        .map_err(|e| Error::output(output, "write", e))?;
    sink.commit(file, opts.fsync)?;

    let info_rate = min_rate;
    let mut report = MergeReport {
        output: output.to_path_buf(),
        format,
        allocs: wstats.allocs,
        promotes: wstats.promotes,
        collects: wstats.collects,
        encoded_ahead,
        ..Default::default()
    };
    // Reports in the order of the inputs as given (skipped ones included).
    let mut by_index: Vec<(usize, InputReport)> = states
        .into_iter()
        .zip(&opened)
        .map(|(mut st, o)| {
            st.report.warnings.append(&mut st.warnings.list);
            st.report.events = st.report.allocs + st.report.promotes + st.report.collects;
            if st.thinner.is_some() {
                st.report.keep_fraction = if st.report.samples_read == 0 {
                    1.0
                } else {
                    st.report.samples_written as f64 / st.report.samples_read as f64
                };
                if st.report.samples_read > 0 {
                    let msg = format!(
                        "sampled at rate {}, thinned to the slowest input's {}: kept {} of \
                         {} samples ({:.2}%) and {} of {} allocations",
                        st.report.sample_rate,
                        info_rate,
                        st.report.samples_written,
                        st.report.samples_read,
                        100.0 * st.report.keep_fraction,
                        st.report.allocs_written,
                        st.report.allocs
                    );
                    st.report.warnings.push(msg);
                }
            }
            (o.index, st.report)
        })
        .collect();
    by_index.extend(skipped);
    by_index.sort_by_key(|(k, _)| *k);
    let by_path: Vec<InputReport> = by_index.into_iter().map(|(_, r)| r).collect();
    report.remapped_codes = by_path.iter().map(|r| r.remapped_codes).sum();
    report.argument_warnings = prepared.arg_warnings.clone();
    report.warnings = by_path.iter().map(|r| r.warnings.len() as u64).sum::<u64>()
        + report.argument_warnings.len() as u64;
    report.inputs = by_path;
    Ok(Some(report))
}

/// Where a merge stands, for its progress line on stderr.
struct Progress {
    /// the merge's, polled with the progress
    cancel: crate::Cancel,
    show: bool,
    started: Instant,
    last: Instant,
    total_bytes: u64,
}

/// How merging the streams ended.
enum Merged {
    Done,
    /// A backtrace encoded in its stream's share of the cache did not fit a packet (a
    /// deep stack of more distinct frames than a share holds): the merge is to be made
    /// again without encoding ahead, which sends only what differs from the previous one.
    ShareTooSmall,
}

/// The merge proper: every stream's events in merged order, written through `w`; the ids,
/// live objects, codes and counts of each input kept in `states`.
fn merge_streams(
    streams: &mut [Stream],
    states: &mut [InputState],
    bts: &mut [Backtrace],
    codes: &mut Codes,
    w: &mut Writer<OutputFile>,
    pipe: &Decoder,
    progress: &mut Progress,
) -> Result<Merged> {
    let ndomains = streams.iter().map(|s| s.out_slot + 1).max().unwrap_or(0);
    // Per output domain: the stream of the last allocation written, and its version.
    let mut last_written: Vec<Option<(usize, u64)>> = vec![None; ndomains];
    let mut heap = BinaryHeap::new();
    for (i, s) in streams.iter_mut().enumerate() {
        s.batch = pipe.next_batch(i);
        if s.pos < s.batch.evs.len() {
            heap.push(Reverse(s.batch.evs[0].key(s.key_bits)));
        }
    }
    let mut nevents = 0u64;
    let mut missed: Vec<LocationCode> = Vec::new();
    while let Some(&Reverse(first)) = heap.peek() {
        let i = first as u32 as usize;
        // The stream goes on alone while its events come before every other stream's next.
        let bound = heap.as_slice()[1..]
            .iter()
            .take(2)
            .map(|r| r.0)
            .min()
            .unwrap_or(u128::MAX);
        let s = &mut streams[i];
        let st = &mut states[s.input];
        let dom = s.out_domain;
        let tag = st.tag.is_some() as usize;
        loop {
            let Timed { time, ev } = s.batch.evs[s.pos];
            // Take in the codes the stream defined before this event.
            while let Some((at, code, locs)) = s.batch.locs.get(s.loc_pos) {
                if *at as usize > s.pos {
                    break;
                }
                let (m, remapped) = codes.map(*code, locs);
                if remapped {
                    st.report.remapped_codes += 1;
                    s.remap.insert(*code, m);
                }
                s.loc_pos += 1;
            }
            match ev {
                Ev::Alloc {
                    id,
                    length,
                    nsamples,
                    source,
                    keep: ncodes,
                    new: nframes,
                } if s.batch.encoded => {
                    let (length, nsamples) = s.length_and_samples(length, nsamples);
                    let kept = st.read_alloc(nsamples);
                    // (the decoder drew the same, and encoded nothing of one left out)
                    if kept.is_none() != (nframes == THINNED_OUT) {
                        return Err(Error::Internal(format!(
                            "{}: an allocation thinned otherwise when encoded ahead",
                            st.report.path.display()
                        )));
                    }
                    if let Some(n) = kept {
                        let (mut at, cut) = s.batch.encoding(s.enc_pos);
                        if cut {
                            return Ok(Merged::ShareTooSmall);
                        }
                        s.enc_pos = at.end;
                        let common = if s.solo {
                            let b = &s.batch.enc.bytes()[at.start..at.start + 4];
                            at.start += 4;
                            u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize
                        } else {
                            0
                        };
                        let first = s.miss_pos;
                        while matches!(s.batch.misses.get(s.miss_pos), Some(m) if (m.0 as usize) < at.end)
                        {
                            s.miss_pos += 1;
                        }
                        let sent = &s.batch.misses[first..s.miss_pos];
                        merged_misses(&s.remap, &mut s.batch.enc, sent, &mut missed);
                        let out_id = w.put_alloc_encoded(
                            Timestamp(time),
                            dom,
                            length,
                            n,
                            source,
                            common,
                            nframes as usize,
                            ncodes as usize,
                            &s.batch.enc.bytes()[at],
                            &missed,
                            |c| codes.meanings.get(&c).cloned(),
                        )?;
                        st.live.insert(id, out_id.0);
                        st.report.allocs_written += 1;
                        st.report.samples_written += n;
                    } else {
                        st.live.insert(id, DROPPED);
                    }
                    if !st.waiting.is_empty() {
                        release_waiting(st, w, id, time)?;
                    }
                }
                Ev::Alloc {
                    id,
                    length,
                    nsamples,
                    source,
                    keep,
                    new,
                } => {
                    let (length, nsamples) = s.length_and_samples(length, nsamples);
                    let keep = tag + keep as usize;
                    let bt = &mut bts[i];
                    bt.frames.truncate(keep);
                    let f = s.frame_pos;
                    let fresh = &s.batch.frames[f..f + new as usize];
                    // (the new frames' hints: their entries in the input's cache)
                    bt.hints.resize(keep, 0);
                    bt.hints
                        .extend_from_slice(&s.batch.slots[f..f + new as usize]);
                    if s.remap.is_empty() {
                        bt.frames.extend_from_slice(fresh);
                    } else {
                        let remap = &s.remap;
                        bt.frames
                            .extend(fresh.iter().map(|c| remap.get(c).copied().unwrap_or(*c)));
                    }
                    bt.version += 1;
                    s.frame_pos += new as usize;
                    if let Some(n) = st.read_alloc(nsamples) {
                        let cut_before = w.stats().cut_backtraces;
                        let resolve = |c| codes.meanings.get(&c).cloned();
                        // What it shares with the last allocation written in its domain:
                        // the stream's own common prefix when that was this stream's
                        // previous one.
                        let slot = s.out_slot;
                        let common = match last_written[slot] {
                            Some((j, v)) if j == i && v + 1 == bts[i].version => keep,
                            Some((j, v)) if j != i && bts[j].version == v => {
                                common_prefix(&bts[j].frames, &bts[i].frames)
                            }
                            _ => 0,
                        };
                        last_written[slot] = Some((i, bts[i].version));
                        let bt = &mut bts[i];
                        let out_id = w.put_alloc_hinted(
                            Timestamp(time),
                            dom,
                            length,
                            n,
                            source,
                            common,
                            &bt.frames[common..],
                            &mut bt.hints[common..],
                            resolve,
                        )?;
                        if w.stats().cut_backtraces != cut_before {
                            st.report.cut_backtraces += 1;
                        }
                        st.live.insert(id, out_id.0);
                        st.report.allocs_written += 1;
                        st.report.samples_written += n;
                    } else {
                        st.live.insert(id, DROPPED);
                    }
                    if !st.waiting.is_empty() {
                        release_waiting(st, w, id, time)?;
                    }
                }
                Ev::Promote { id } => {
                    st.report.promotes += 1;
                    if !follow_object(st, w, id, time, false)? {
                        wait_for_object(st, id, time, false);
                    }
                }
                Ev::Collect { id } => {
                    st.report.collects += 1;
                    if !follow_object(st, w, id, time, true)? {
                        wait_for_object(st, id, time, true);
                    }
                }
            }
            s.pos += 1;
            if s.pos == s.batch.evs.len() && !s.batch.last {
                let next = pipe.next_batch(i);
                pipe.recycle(std::mem::replace(&mut s.batch, next));
                s.pos = 0;
                s.frame_pos = 0;
                s.loc_pos = 0;
                s.enc_pos = 0;
                s.miss_pos = 0;
                s.wide_pos = 0;
            }
            nevents += 1;
            if nevents.is_multiple_of(4096) {
                if progress.cancel.is_cancelled() {
                    return Err(Error::Cancelled);
                }
                if progress.show && nevents.is_multiple_of(65536) {
                    let now = Instant::now();
                    if now.duration_since(progress.started) > Duration::from_secs(1)
                        && now.duration_since(progress.last) > Duration::from_millis(250)
                    {
                        progress.last = now;
                        let done = pipe.bytes_read();
                        let _ = write!(
                            std::io::stderr(),
                            "\rmemtrace-merge: {} events, {:.0}%   ",
                            nevents,
                            100.0 * (done as f64 / progress.total_bytes.max(1) as f64).min(1.0)
                        );
                    }
                }
            }
            match s.batch.evs.get(s.pos).map(|t| t.key(s.key_bits)) {
                Some(next) if next < bound => continue,
                // replace the top in place (one sift-down instead of a pop and a push)
                Some(next) => {
                    if let Some(mut top) = heap.peek_mut() {
                        *top = Reverse(next);
                    }
                }
                None => {
                    heap.pop();
                }
            }
            break;
        }
    }
    for st in states.iter_mut() {
        give_up_waiting(st, None);
    }
    Ok(Merged::Done)
}

/// A person-readable summary of a merge: one line per input, then the totals (warnings
/// apart: [`format_warnings`]).
pub fn format_report(r: &MergeReport) -> String {
    let mut s = String::new();
    for i in &r.inputs {
        if i.skipped {
            s.push_str(&format!("{}: skipped\n", i.path.display()));
            continue;
        }
        s.push_str(&format!(
            "{}: pid {}, format {}, rate {}: {} events ({} allocs, {} promotes, {} collects); {} allocs written{}{}{}\n",
            i.path.display(),
            i.pid,
            i.format,
            i.sample_rate,
            i.events,
            i.allocs,
            i.promotes,
            i.collects,
            i.allocs_written,
            if i.skipped_packets > 0 { format!(", {} packets skipped", i.skipped_packets) } else { String::new() },
            if i.remapped_codes > 0 { format!(", {} location codes renumbered", i.remapped_codes) } else { String::new() },
            if i.keep_fraction < 1.0 { format!(", thinned to {:.2}% of its samples", 100.0 * i.keep_fraction) } else { String::new() },
        ));
    }
    s.push_str(&format!(
        "{}: format {}, {} allocs, {} promotes, {} collects{}\n",
        r.output.display(),
        r.format,
        r.allocs,
        r.promotes,
        r.collects,
        if r.remapped_codes > 0 {
            format!(", {} location codes renumbered", r.remapped_codes)
        } else {
            String::new()
        },
    ));
    s
}

/// Every warning of a merge, a line each, naming its input (the reader's name it already).
pub fn format_warnings(r: &MergeReport) -> String {
    let mut s = String::new();
    for w in &r.argument_warnings {
        s.push_str(&format!("warning: {w}\n"));
    }
    for i in &r.inputs {
        let path = i.path.display().to_string();
        for w in &i.warnings {
            if w.starts_with(&format!("{path}: ")) {
                s.push_str(&format!("warning: {w}\n"));
            } else {
                s.push_str(&format!("warning: {path}: {w}\n"));
            }
        }
    }
    s
}

#[cfg(test)]
mod tests;
