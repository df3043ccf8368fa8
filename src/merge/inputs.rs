//! The inputs of a merge: arguments expanded into files, each process once, pipes spooled,
//! each input opened and described; the merged trace's rate.

use super::MergeOptions;
use crate::error::{Error, Result};
use crate::format::info::TraceInfo;
use crate::format::location::Location;
use crate::fs::{file_id, resolve_output, trace_name, Target};
use crate::reader::{scan_packets_as, Reader};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The sources of the merged trace `merged`, as [`crate::merge()`] takes its inputs: directories
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
pub(super) const MERGE_CONTEXT: &str = "memtrace-merge of ";

/// Input files with the index of their argument, and warnings about directory entries.
pub(super) type Expanded = (Vec<(PathBuf, usize)>, Vec<String>);

/// Directories expanded into their `*.ctf` files, sorted by name, each file with the index
/// of the argument it came from (files named twice are still there). `output` is left out
/// of a directory: always when `always`, else only when it is an earlier merge (its context
/// says so), which the merge is to replace: so a directory can be merged into a file of its
/// own again, while a source named as the output is still refused.
pub(super) fn expand_inputs_from(
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
                if !trace_name(&q) {
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
pub(super) fn drop_repeats(
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

/// What tells one traced process's trace from another's: an earlier merge by the inputs its
/// context records, any other trace by its info packet and first packet (a copy of a trace
/// is the same bytes; another run, even of the same pid, starts at another time).
#[derive(Hash, PartialEq, Eq)]
pub(super) enum Process {
    Merge(Vec<u8>),
    Trace(u64),
}

/// A trace an earlier merge records: pid, and start time where recorded.
pub(super) type Recorded = (u64, Option<u64>);

/// The [`Process`] of the trace at `source`, with its pid and start time and, for an
/// earlier merge, the processes it records; None when it cannot be read.
pub(super) fn process_of(source: &Path) -> Option<(Process, (u64, u64), Vec<Recorded>)> {
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
pub(super) fn drop_same_processes(
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
        let trace = matches!(process, Process::Trace(_));
        match seen.entry(process) {
            Entry::Occupied(mut e) => {
                // (two copies of one trace: the longer is kept, a copy cut short or
                // taken while the process ran having less of it)
                let kept = *e.get();
                let len = |i: usize| std::fs::metadata(&sources[i]).map_or(0, |m| m.len());
                let (kept, left) = if trace && len(k) > len(kept) {
                    e.insert(k);
                    (keep[kept], keep[k]) = (false, true);
                    for r in repeats.iter_mut().filter(|r| r.0 == kept) {
                        r.0 = k;
                    }
                    (k, kept)
                } else {
                    keep[k] = false;
                    (kept, k)
                };
                let note = format!(
                    "{} is {what}: merged once (--keep-duplicates merges both)",
                    paths[left].display()
                );
                repeats.push((kept, note));
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
pub(super) struct Prepared {
    /// Each file once, as named (directories expanded).
    pub(super) paths: Vec<PathBuf>,
    /// What to open for each: the file, or the spool of one that cannot be read twice.
    pub(super) sources: Vec<PathBuf>,
    /// The argument each came from.
    pub(super) args: Vec<usize>,
    /// Files named again, or holding what another holds: (index of the one kept, what the
    /// warning on it says).
    pub(super) repeats: Vec<(usize, String)>,
    /// Warnings about the arguments, not one input (directory entries left out).
    pub(super) arg_warnings: Vec<String>,
    /// Where the output goes.
    pub(super) target: Target,
    pub(super) _spools: Vec<crate::fs::spool::Spool>,
}

/// Check a merge's arguments, expand its directories, leave out files named twice and spool
/// the inputs that cannot be read twice (pipes, FIFOs), each opened once, here, before
/// anything else waits on it.
pub(super) fn prepare_inputs(
    inputs: &[PathBuf],
    output: &Path,
    opts: &MergeOptions,
) -> Result<Prepared> {
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
    let g = gather_inputs(
        inputs,
        output,
        opts.context.as_deref(),
        opts.keep_duplicates,
        &opts.cancel,
        &|p: &Path| {
            if target.is(p) {
                return Err(Error::Usage(format!(
                    "output {} is one of the inputs ({}); refusing to overwrite it",
                    output.display(),
                    p.display()
                )));
            }
            Ok(())
        },
    )?;
    Ok(Prepared {
        paths: g.paths,
        sources: g.sources,
        args: g.args,
        repeats: g.repeats,
        arg_warnings: g.arg_warnings,
        target,
        _spools: g.spools,
    })
}

/// The input files of a merge or an analysis, each once, pipes spooled.
pub(crate) struct Gathered {
    /// Each file once, as named (directories expanded).
    pub(crate) paths: Vec<PathBuf>,
    /// What to open for each: the file, or the spool of one that cannot be read twice.
    pub(crate) sources: Vec<PathBuf>,
    /// The argument each came from.
    pub(crate) args: Vec<usize>,
    /// Files named again, or holding what another holds: (index of the one kept, what the
    /// warning on it says).
    pub(crate) repeats: Vec<(usize, String)>,
    /// Warnings about the arguments, not one input (directory entries left out).
    pub(crate) arg_warnings: Vec<String>,
    pub(crate) spools: Vec<crate::fs::spool::Spool>,
}

/// Expand `inputs`' directories (leaving out `output`, as [`expand_inputs_from`] does),
/// leave out files named twice and (unless `keep_duplicates`) traces another input holds,
/// and spool what cannot be read twice; `refuse` is asked first of each file.
pub(crate) fn gather_inputs(
    inputs: &[PathBuf],
    output: &Path,
    context: Option<&[u8]>,
    keep_duplicates: bool,
    cancel: &crate::cancel::Cancel,
    refuse: &dyn Fn(&Path) -> Result<()>,
) -> Result<Gathered> {
    let (found, arg_warnings) = expand_inputs_from(inputs, output, false, context)?;
    let (paths, args): (Vec<PathBuf>, Vec<usize>) = found.into_iter().unzip();
    // A file given twice is merged once: its process's allocations appear once.
    let (paths, args, mut repeats) = drop_repeats(paths, args);
    let mut sources = Vec::with_capacity(paths.len());
    let mut spools = Vec::new();
    for p in &paths {
        refuse(p)?;
        if crate::fs::spool::needs_spool(p) {
            let s = crate::fs::spool::spool(p, cancel)?;
            sources.push(s.path.clone());
            spools.push(s);
            continue;
        }
        sources.push(p.clone());
    }
    let (paths, sources, args) = if keep_duplicates {
        (paths, sources, args)
    } else {
        drop_same_processes(paths, sources, args, &mut repeats)
    };
    Ok(Gathered {
        paths,
        sources,
        args,
        repeats,
        arg_warnings,
        spools,
    })
}

/// A reader of `source`, which messages name `name` (a spooled pipe by its own name).
pub(super) fn open_as(source: &Path, name: &Path) -> Result<Reader<File>> {
    let f = File::open(source).map_err(|e| Error::input(name, "open", e))?;
    Reader::new(f, &name.display().to_string())
}

/// The executable's file name (without its directory).
pub(super) fn exe_name(i: &TraceInfo) -> String {
    let exe = String::from_utf8_lossy(&i.executable_name);
    exe.rsplit('/').next().unwrap_or("").to_string()
}

pub(super) fn file_name(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// A readable input: its place among the inputs given, its trace info, its domains.
pub(super) struct Opened {
    pub(super) index: usize,
    pub(super) path: PathBuf,
    pub(super) info: TraceInfo,
    pub(super) domains: Vec<u16>,
    /// What to open: `path`, or its spool ([`Prepared::sources`]).
    pub(super) source: PathBuf,
    /// Allocations its packet headers claim (u64::MAX: not counted).
    pub(super) alloc_ids: u64,
}

/// The merged trace's sampling rate: the slowest input's among those that hold allocations
/// (one that holds none, a worker killed before its first event packet, has nothing to
/// thin the others for). Counts the inputs' allocations when their rates differ.
pub(super) fn merged_rate(opened: &mut [Opened]) -> Result<f64> {
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
pub(super) fn thinning_cost(opened: &[Opened], min_rate: f64) -> Option<String> {
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
pub(super) fn merge_context(info: &TraceInfo) -> Option<&[u8]> {
    let c = info.context.as_deref()?;
    c.starts_with(MERGE_CONTEXT.as_bytes()).then_some(c)
}

/// The pids of the traces an earlier merge holds, from the context it was given
/// ([`describe_merge`]; none for another context).
pub(crate) fn merged_pids(info: &TraceInfo) -> Vec<u64> {
    merged_processes(info).into_iter().map(|p| p.0).collect()
}

/// The traces an earlier merge holds: pid and, where recorded (merges since 2026-12), start
/// time, from the context it was given.
pub(super) fn merged_processes(info: &TraceInfo) -> Vec<(u64, Option<u64>)> {
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
pub(super) fn describe_merge(opened: &[Opened]) -> Vec<u8> {
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
