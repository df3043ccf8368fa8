//! Re-encoding one trace in file order through the writer, as the reference `copy` test
//! does: the proof that reader and writer agree with the OCaml library byte for byte.

use crate::error::{Error, Result};
use crate::event::Event;
use crate::reader::{Reader, Warning};
use crate::writer::{WriteStats, Writer, WriterOptions};
use std::io::{Read, Write};

/// Read every event of `reader` and write it again with the same trace info.
/// With `opts.version` equal to the input's format, the output reproduces the input.
pub fn copy<R: Read, W: Write>(
    reader: &mut Reader<R>,
    out: W,
    opts: WriterOptions,
) -> Result<(W, WriteStats, Vec<Warning>)> {
    copy_named(reader, out, opts, std::path::Path::new("<output>"))
}

/// [`copy`], naming `path` in output errors.
fn copy_named<R: Read, W: Write>(
    reader: &mut Reader<R>,
    out: W,
    opts: WriterOptions,
    path: &std::path::Path,
) -> Result<(W, WriteStats, Vec<Warning>)> {
    let mut info = reader.info().clone();
    if opts.version < 3 {
        info.initial_domain = crate::event::DomainId(0);
    }
    let mut w = Writer::new(out, &info, opts)?;
    w.set_output_path(path);
    let mut warnings = Vec::new();
    let v2_out = opts.version < 3;
    let same_layout = v2_out == (reader.info().version < 3);
    // When the id layout changes (format-3 chunks <-> format-2 sequence), promotes and
    // collects follow their object through this map (live objects only).
    let mut ids: crate::location::IntMap<u64, u64> = Default::default();
    let remap = |ids: &crate::location::IntMap<u64, u64>, id: crate::event::ObjId, what: &str| {
        ids.get(&id.0)
            .map(|&o| crate::event::ObjId(o))
            .ok_or_else(|| Error::Write(format!("{what} of object {} which is not live", id.0)))
    };
    while let Some((ev, table)) = reader.next_with_locations()? {
        let dom = if v2_out {
            crate::event::DomainId(0)
        } else {
            ev.domain()
        };
        match ev {
            Event::Alloc(a) => {
                let id = if same_layout {
                    // Each output domain's previous backtrace is the input's: the prefix the
                    // input shares with it is shared in the output (the reference writer's
                    // own choice when the input was written by one).
                    let common = (a.common_prefix as usize).min(a.backtrace.len());
                    w.put_alloc_after(
                        a.time,
                        dom,
                        a.length,
                        a.nsamples,
                        a.source,
                        common,
                        &a.backtrace[common..],
                        |c| table.get(&c).cloned(),
                    )?
                } else {
                    w.put_alloc(
                        a.time,
                        dom,
                        a.length,
                        a.nsamples,
                        a.source,
                        a.backtrace,
                        |c| table.get(&c).cloned(),
                    )?
                };
                if same_layout && id != a.id {
                    return Err(Error::Write(format!(
                        "allocation id {} re-encoded as {} (input ids are not in file order)",
                        a.id.0, id.0
                    )));
                }
                if !same_layout {
                    ids.insert(a.id.0, id.0);
                }
            }
            Event::Promote { time, id, .. } if !same_layout => {
                let o = remap(&ids, id, "promote")?;
                w.put_promote(time, dom, o)?
            }
            Event::Collect { time, id, .. } if !same_layout => {
                let o = remap(&ids, id, "collect")?;
                ids.remove(&id.0);
                w.put_collect(time, dom, o)?
            }
            Event::Promote { time, id, .. } => w.put_promote(time, dom, id)?,
            Event::Collect { time, id, .. } => w.put_collect(time, dom, id)?,
        }
        if !reader.warnings().is_empty() {
            warnings.extend(reader.take_warnings());
        }
    }
    warnings.extend(reader.take_warnings());
    let (out, stats) = w.finish_with_stats()?;
    Ok((out, stats, warnings))
}

/// [`copy`] from one file to another: the output is written beside itself under a
/// temporary name and renamed when complete, and it may not be the input.
pub fn copy_file(
    input: &std::path::Path,
    output: &std::path::Path,
    version: Option<u16>,
) -> Result<(WriteStats, Vec<Warning>)> {
    if crate::merge::same_file(input, output) {
        return Err(Error::Usage(format!(
            "output {} is the input; refusing to overwrite it",
            output.display()
        )));
    }
    let mut r = Reader::open(input)?;
    let version = version.unwrap_or(r.info().version.max(2));
    let (tmp, f) = crate::merge::TempOutput::create(output)?;
    let out = std::io::BufWriter::with_capacity(1 << 20, f);
    let opts = WriterOptions {
        version,
        lossless: false,
    };
    let (out, stats, warnings) = copy_named(&mut r, out, opts, output)?;
    let f = out
        .into_inner()
        .map_err(|e| Error::io(output, "write", e.into_error()))?;
    tmp.commit(f, false)?;
    Ok((stats, warnings))
}
