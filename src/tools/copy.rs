//! Re-encoding one trace in file order through the writer, as the reference `copy` test
//! does: the proof that reader and writer agree with the OCaml library byte for byte.
use crate::format::event::AllocHeader;

use crate::error::{Error, Result};
use crate::format::event::{AllocSource, DomainId, Event, LocationCode, ObjId, Timestamp};
use crate::format::location::{LocationList, LocationTable};
use crate::reader::{Reader, Warning};
use crate::writer::{WriteStats, Writer, WriterOptions};
use std::io::{Read, Write};
use std::sync::atomic::{AtomicBool, Ordering};

/// Read every event of `reader` and write it again with the same trace info.
/// With `opts.version` equal to the input's format, the output reproduces the input; where
/// its backtraces are deep, the reading then goes on ahead of the writing on a thread of
/// its own (hence `Send`; [`copy_on_one_thread`] takes any reader). After an error, where
/// the reader stands is unspecified.
pub fn copy<R: Read + Send, W: Write>(
    reader: &mut Reader<R>,
    out: W,
    opts: WriterOptions,
) -> Result<(W, WriteStats, Vec<Warning>)> {
    let path = std::path::Path::new("<output>");
    copy_named(reader, out, opts, path, |r, w| copy_same_layout(r, w, true))
}

/// [`copy`] on the calling thread only.
pub fn copy_on_one_thread<R: Read, W: Write>(
    reader: &mut Reader<R>,
    out: W,
    opts: WriterOptions,
) -> Result<(W, WriteStats, Vec<Warning>)> {
    let path = std::path::Path::new("<output>");
    copy_named(reader, out, opts, path, |r, w| {
        let mut warnings = Vec::new();
        copy_in_turn(r, w, &mut warnings, |_, _| true)?;
        Ok(warnings)
    })
}

/// [`copy`] reading ahead on another thread from the first event, however shallow the
/// backtraces (for tests: the same output, by the other way).
#[doc(hidden)]
pub fn copy_reading_ahead<R: Read + Send, W: Write>(
    reader: &mut Reader<R>,
    out: W,
    opts: WriterOptions,
) -> Result<(W, WriteStats, Vec<Warning>)> {
    let path = std::path::Path::new("<output>");
    copy_named(reader, out, opts, path, |r, w| {
        copy_same_layout(r, w, false)
    })
}

/// [`copy`], naming `path` in output errors, with `same_layout` copying when the format's
/// id layout is kept.
fn copy_named<R: Read, W: Write>(
    reader: &mut Reader<R>,
    out: W,
    opts: WriterOptions,
    path: &std::path::Path,
    same_layout: impl FnOnce(&mut Reader<R>, &mut Writer<W>) -> Result<Vec<Warning>>,
) -> Result<(W, WriteStats, Vec<Warning>)> {
    let mut info = reader.info().clone();
    if opts.version < 3 {
        info.initial_domain = DomainId(0);
    }
    let mut w = Writer::new(out, &info, opts)?;
    w.set_output_path(path);
    let v2_out = opts.version < 3;
    let warnings = if v2_out == (reader.info().version < 3) {
        same_layout(reader, &mut w)?
    } else {
        convert(reader, &mut w, v2_out)?
    };
    let (out, stats) = w.finish_with_stats()?;
    Ok((out, stats, warnings))
}

/// Events per batch handed from the reading thread to the writing one.
const BATCH: usize = 1024;
/// A batch ends early once it holds this many frames (deep backtraces).
const BATCH_FRAMES: usize = 16_384;
/// Batches read ahead.
const AHEAD: usize = 4;

/// An event read ahead; an allocation's new frames (after its `common` prefix) are the
/// batch's next `new`, and `locs` codes were defined just before it.
enum Item {
    Alloc {
        time: Timestamp,
        domain: DomainId,
        id: ObjId,
        length: u64,
        nsamples: u64,
        source: AllocSource,
        common: usize,
        new: usize,
        locs: usize,
    },
    Promote(Timestamp, DomainId, ObjId, usize),
    Collect(Timestamp, DomainId, ObjId, usize),
}

/// Events read ahead, with their new frames, the reader's cache entry of each (hints for
/// the writer) and the codes location events defined.
#[derive(Default)]
struct Batch {
    items: Vec<Item>,
    frames: Vec<LocationCode>,
    slots: Vec<u16>,
    locs: Vec<(LocationCode, LocationList)>,
    warnings: Vec<Warning>,
    /// The last batch: how the reading ended.
    end: Option<Result<()>>,
}

impl Batch {
    fn with_capacity(events: usize) -> Batch {
        Batch {
            items: Vec::with_capacity(events),
            frames: Vec::with_capacity(events * 8),
            slots: Vec::with_capacity(events * 8),
            ..Default::default()
        }
    }
}

/// Fill `b` with up to [`BATCH`] events; sets `b.end` at the end of the trace or on error.
/// `stop`: the writing side has stopped, so should the reading.
fn read_batch<R: Read>(reader: &mut Reader<R>, b: &mut Batch, stop: &AtomicBool) {
    while b.items.len() < BATCH && b.frames.len() < BATCH_FRAMES {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let (ev, table, defined) = match reader.next_full() {
            Ok(Some(e)) => e,
            Ok(None) => {
                b.end = Some(Ok(()));
                break;
            }
            Err(e) => {
                b.end = Some(Err(e));
                break;
            }
        };
        let locs = defined.len();
        for c in defined {
            if let Some(l) = table.get(c) {
                b.locs.push((*c, l.clone()));
            }
        }
        b.items.push(match ev {
            Event::Alloc(a) => {
                // Each output domain's previous backtrace is the input's: the prefix the
                // input shares with it is shared in the output (the reference writer's
                // own choice when the input was written by one).
                let common = (a.common_prefix as usize).min(a.backtrace.len());
                let new = &a.backtrace[common..];
                b.frames.extend_from_slice(new);
                crate::format::backtrace::push_slots(
                    &mut b.slots,
                    a.slots,
                    common,
                    a.backtrace.len(),
                );
                Item::Alloc {
                    time: a.time,
                    domain: a.domain,
                    id: a.id,
                    length: a.length,
                    nsamples: a.nsamples,
                    source: a.source,
                    common,
                    new: new.len(),
                    locs,
                }
            }
            Event::Promote { time, domain, id } => Item::Promote(time, domain, id, locs),
            Event::Collect { time, domain, id } => Item::Collect(time, domain, id, locs),
        });
        if !reader.warnings().is_empty() {
            b.warnings.extend(reader.take_warnings());
        }
    }
    b.warnings.extend(reader.take_warnings());
}

/// Copy keeping the format's id layout. Where backtraces are deep (many frames to decode
/// and encode per event), the reading goes on ahead on a thread of its own, and the
/// reader's cache entries are hints for the writer's cache (in the same state while the
/// output reproduces the input). Without `probe` it reads ahead from the start.
fn copy_same_layout<R: Read + Send, W: Write>(
    reader: &mut Reader<R>,
    w: &mut Writer<W>,
    probe: bool,
) -> Result<Vec<Warning>> {
    let mut warnings = Vec::new();
    let shallow = |events, frames| events < PROBE_EVENTS || frames < DEEP * events;
    if probe && copy_in_turn(reader, w, &mut warnings, shallow)? {
        return Ok(warnings);
    }
    reader.set_keep_slots(true);
    let to = Output {
        table: reader.locations().clone(),
        warnings,
        v2: w.version() < 3,
    };
    let copied = read_ahead(reader, w, to);
    reader.set_keep_slots(false);
    copied
}

/// Copy events on this thread, reading and writing each in turn, while `go_on(events,
/// new frames)` (counted from the start); Ok(true) once the trace has ended.
fn copy_in_turn<R: Read, W: Write>(
    reader: &mut Reader<R>,
    w: &mut Writer<W>,
    warnings: &mut Vec<Warning>,
    go_on: impl Fn(usize, usize) -> bool,
) -> Result<bool> {
    let v2 = w.version() < 3;
    let (mut events, mut frames) = (0, 0);
    while go_on(events, frames) {
        let Some((ev, table)) = reader.next_with_locations()? else {
            warnings.extend(reader.take_warnings());
            return Ok(true);
        };
        events += 1;
        let dom = if v2 { DomainId(0) } else { ev.domain() };
        match ev {
            Event::Alloc(a) => {
                // Each output domain's previous backtrace is the input's: the prefix the
                // input shares with it is shared in the output (the reference writer's
                // own choice when the input was written by one).
                let common = (a.common_prefix as usize).min(a.backtrace.len());
                let new = &a.backtrace[common..];
                frames += new.len();
                let (t, l, n, s) = (a.time, a.length, a.nsamples, a.source);
                let id =
                    w.put_alloc_after(t, dom, l, n, s, common, new, |c| table.get(&c).cloned())?;
                check_id(a.id, id)?;
            }
            Event::Promote { time, id, .. } => w.put_promote(time, dom, id)?,
            Event::Collect { time, id, .. } => w.put_collect(time, dom, id)?,
        }
        if !reader.warnings().is_empty() {
            warnings.extend(reader.take_warnings());
        }
    }
    Ok(false)
}

/// A copy keeps every allocation's id.
#[inline(always)]
fn check_id(input: ObjId, output: ObjId) -> Result<()> {
    if input != output {
        return Err(ids_differ(input, output));
    }
    Ok(())
}

#[cold]
fn ids_differ(input: ObjId, output: ObjId) -> Error {
    Error::Write(format!(
        "allocation id {} re-encoded as {} ({IDS_NOT_IN_ORDER})",
        input.0, output.0
    ))
}

const IDS_NOT_IN_ORDER: &str = "input ids are not in file order";

/// The copy could not keep the input's allocation ids ([`ids_differ`]).
fn is_id_layout_error(e: &Error) -> bool {
    matches!(e, Error::Write(m) if m.ends_with(&format!("({IDS_NOT_IN_ORDER})")))
}

/// Events copied on one thread before the reading may move to another.
const PROBE_EVENTS: usize = 16 * BATCH;
/// New frames per event from which reading ahead on another thread pays: below it, handing
/// the events over (a cache line from one core to the other for each 64 bytes) costs
/// about what it saves (benches/PERFORMANCE.md, "copy: DEEP").
const DEEP: usize = 8;

/// The writing side of a batched copy: the codes' locations as defined so far, the
/// reader's warnings, the output's format.
struct Output {
    table: LocationTable,
    warnings: Vec<Warning>,
    v2: bool,
}

impl Output {
    /// Write batch `b` and empty it; Ok(true) when it was the last.
    fn write<W: Write>(&mut self, w: &mut Writer<W>, b: &mut Batch) -> Result<bool> {
        self.warnings.append(&mut b.warnings);
        write_batch(w, b, &mut self.table, self.v2)?;
        if let Some(end) = b.end.take() {
            end?;
            return Ok(true);
        }
        b.items.clear();
        b.frames.clear();
        b.slots.clear();
        b.locs.clear();
        // (a batch that held a huge backtrace gives its room back)
        if b.frames.capacity() > 4 * BATCH_FRAMES {
            b.frames = Vec::with_capacity(BATCH_FRAMES);
            b.slots = Vec::with_capacity(BATCH_FRAMES);
        }
        Ok(false)
    }
}

/// The rest of a batched copy, the reader going on ahead on another thread.
fn read_ahead<R: Read + Send, W: Write>(
    reader: &mut Reader<R>,
    w: &mut Writer<W>,
    mut to: Output,
) -> Result<Vec<Warning>> {
    use std::sync::mpsc;
    let (full_tx, full_rx) = mpsc::sync_channel::<Batch>(AHEAD);
    let stop = &AtomicBool::new(false);
    let (free_tx, free_rx) = mpsc::channel::<Batch>();
    std::thread::scope(|sc| {
        let ahead = std::thread::Builder::new()
            .name("memtrace-copy-read".into())
            .spawn_scoped(sc, move || {
                // A fixed set of batches goes round (no memory taken and given back to the
                // system batch after batch).
                let mut made = 0;
                loop {
                    let mut b = match free_rx.try_recv() {
                        Ok(b) => b,
                        Err(_) if made < AHEAD + 2 => {
                            made += 1;
                            Batch::with_capacity(BATCH)
                        }
                        Err(_) => match free_rx.recv() {
                            Ok(b) => b,
                            Err(_) => break,
                        },
                    };
                    read_batch(reader, &mut b, stop);
                    let end = b.end.is_some();
                    // (the writer stopped: so do we)
                    if full_tx.send(b).is_err() || end {
                        break;
                    }
                }
            })
            .map_err(|e| Error::Internal(format!("could not start the reading thread: {e}")))?;
        let mut result = Ok(());
        while let Ok(mut b) = full_rx.recv() {
            match to.write(w, &mut b) {
                Ok(false) => {
                    let _ = free_tx.send(b);
                }
                Ok(true) => break,
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        // (the reading thread stops reading, and whatever it waits on now fails)
        stop.store(true, Ordering::Relaxed);
        drop(full_rx);
        drop(free_tx);
        if ahead.join().is_err() {
            result = Err(Error::Internal("the reading thread panicked".into()));
        }
        result
    })?;
    Ok(to.warnings)
}

/// Write the events of a batch; `table` gathers the codes' locations.
fn write_batch<W: Write>(
    w: &mut Writer<W>,
    b: &mut Batch,
    table: &mut LocationTable,
    v2_out: bool,
) -> Result<()> {
    let (mut f, mut l) = (0, 0);
    let out_domain = |d: DomainId| if v2_out { DomainId(0) } else { d };
    for item in &b.items {
        let (Item::Alloc { locs, .. } | Item::Promote(.., locs) | Item::Collect(.., locs)) = item;
        for (c, list) in &b.locs[l..l + locs] {
            table.insert(*c, list.clone());
        }
        l += locs;
        match *item {
            Item::Alloc {
                time,
                domain,
                id,
                length,
                nsamples,
                source,
                common,
                new,
                ..
            } => {
                let got = w.put_alloc_hinted(
                    time,
                    out_domain(domain),
                    length,
                    nsamples,
                    source,
                    common,
                    &b.frames[f..f + new],
                    &mut b.slots[f..f + new],
                    |c| table.get(&c).cloned(),
                )?;
                f += new;
                check_id(id, got)?;
            }
            Item::Promote(time, domain, id, _) => w.put_promote(time, out_domain(domain), id)?,
            Item::Collect(time, domain, id, _) => w.put_collect(time, out_domain(domain), id)?,
        }
    }
    Ok(())
}

/// Copy changing the id layout (format-3 chunks <-> format-2 sequence): promotes and
/// collects follow their object through a map (of live objects only).
fn convert<R: Read, W: Write>(
    reader: &mut Reader<R>,
    w: &mut Writer<W>,
    v2_out: bool,
) -> Result<Vec<Warning>> {
    let mut warnings = Vec::new();
    let mut ids: crate::format::location::IntMap<u64, u64> = Default::default();
    let remap = |ids: &crate::format::location::IntMap<u64, u64>, id: ObjId, what: &str| {
        ids.get(&id.0)
            .map(|&o| ObjId(o))
            .ok_or_else(|| Error::Write(format!("{what} of object {} which is not live", id.0)))
    };
    while let Some((ev, table)) = reader.next_with_locations()? {
        let dom = if v2_out { DomainId(0) } else { ev.domain() };
        match ev {
            Event::Alloc(a) => {
                let id = w.put_alloc(
                    &AllocHeader {
                        time: a.time,
                        domain: dom,
                        length: a.length,
                        nsamples: a.nsamples,
                        source: a.source,
                    },
                    a.backtrace,
                    |c| table.get(&c).cloned(),
                )?;
                ids.insert(a.id.0, id.0);
            }
            Event::Promote { time, id, .. } => {
                let o = remap(&ids, id, "promote")?;
                w.put_promote(time, dom, o)?
            }
            Event::Collect { time, id, .. } => {
                let o = remap(&ids, id, "collect")?;
                ids.remove(&id.0);
                w.put_collect(time, dom, o)?
            }
        }
        if !reader.warnings().is_empty() {
            warnings.extend(reader.take_warnings());
        }
    }
    warnings.extend(reader.take_warnings());
    Ok(warnings)
}

/// [`copy`] from one file to another: the output is written beside itself under a
/// temporary name and renamed when complete, and it may not be the input. A format-3
/// trace of several domains written as format 2 is merged instead: its domains' events in
/// time order (which file order is not), into the one stream format 2 has. The warnings
/// come as text.
pub fn copy_file(
    input: &std::path::Path,
    output: &std::path::Path,
    version: Option<u16>,
) -> Result<Vec<String>> {
    let target = crate::fs::resolve_output(output, false)?;
    if target.is(input) {
        return Err(Error::Usage(format!(
            "output {} is the input; refusing to overwrite it",
            output.display()
        )));
    }
    // (a pipe is read once into a spool: a copy may read it again, a domain at a time)
    let spooled = crate::fs::spool::needs_spool(input)
        .then(|| crate::fs::spool::spool(input, &crate::cancel::Cancel::new()))
        .transpose()?;
    let name = input;
    let input = spooled.as_ref().map_or(input, |s| s.path.as_path());
    let f = std::fs::File::open(input).map_err(|e| Error::input(name, "open", e))?;
    let mut r = Reader::new(f, &name.display().to_string())?;
    let version = version.unwrap_or(r.info().version.max(2));
    if version < 3 && r.info().version >= 3 && crate::reader::scan_domains(input)?.len() > 1 {
        let opts = crate::merge::MergeOptions {
            format: Some(version),
            progress: false,
            ..Default::default()
        };
        let report = crate::merge::merge(&[input.to_path_buf()], output, &opts)?;
        return Ok(report.inputs.into_iter().flat_map(|i| i.warnings).collect());
    }
    let (tmp, f) = target.create()?;
    let out = std::io::BufWriter::with_capacity(1 << 20, f);
    let opts = WriterOptions {
        version,
        lossless: false,
    };
    let copied = copy_named(&mut r, out, opts, output, |r, w| {
        copy_same_layout(r, w, true)
    });
    let (out, _, warnings) = match copied {
        // Per-domain writers (OCaml 5) take their id chunks in another order than their
        // packets reach the file, which one writer cannot reproduce: the copy is then made
        // as a merge of the one input, in time order, its ids renumbered.
        Err(e) if version >= 3 && is_id_layout_error(&e) => {
            drop(tmp);
            let opts = crate::merge::MergeOptions {
                format: Some(version),
                ..Default::default()
            };
            let report = crate::merge::merge(&[input.to_path_buf()], output, &opts)?;
            let mut warnings = vec![format!(
                "{}: its domains number their objects in another order than their packets \
                 are written (per-domain writers): copied with the same events, the ids \
                 renumbered (not the same bytes)",
                input.display()
            )];
            warnings.extend(report.inputs.into_iter().flat_map(|i| i.warnings));
            return Ok(warnings);
        }
        r => r?,
    };
    let f = out
        .into_inner()
        .map_err(|e| Error::output(output, "write", e.into_error()))?;
    tmp.commit(f, false)?;
    Ok(warnings.iter().map(|w| w.to_string()).collect())
}
