//! The file system side of inputs and outputs: what tells two files apart, where an output
//! goes (a file replaced in one step, a device or pipe written through, stdout), and the
//! temporary file a merge writes before it is given the output's name.

pub(crate) mod spool;

use crate::error::{Error, Result};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// What tells a file from another: its device and inode, and (where a file system's inode
/// numbers are not to be trusted, as some FUSE ones) its size and time of change. None for
/// a file that cannot be found.
pub(crate) fn file_id(p: &Path) -> Option<(u64, u64, u64, i64, i64)> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(p).ok()?;
    Some((m.dev(), m.ino(), m.size(), m.ctime(), m.ctime_nsec()))
}

/// The canonical form of a path that may not exist yet (its directory must).
pub(crate) fn canonical_maybe_new(p: &Path) -> Option<PathBuf> {
    if let Ok(c) = p.canonicalize() {
        return Some(c);
    }
    let name = p.file_name()?;
    let dir = match p.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    Some(dir.canonicalize().ok()?.join(name))
}

pub(crate) fn same_file(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(x), Ok(y)) => x.dev() == y.dev() && x.ino() == y.ino(),
        _ => match (canonical_maybe_new(a), canonical_maybe_new(b)) {
            (Some(x), Some(y)) => x == y,
            _ => false,
        },
    }
}

/// The output file under construction: an unnamed file in the target's directory (Linux
/// `O_TMPFILE`), named only once finished, so that even a killed merge leaves nothing; or,
/// where the file system has no unnamed files, a temporary beside the target, removed
/// unless committed.
pub(crate) struct TempOutput {
    /// The temporary's name beside the target: from the start, or once given at the commit.
    tmp: Option<PathBuf>,
    dir: PathBuf,
    /// the target's name, cut to fit in a temporary's
    stem: String,
    nanos: u32,
    target: PathBuf,
    committed: bool,
}

impl TempOutput {
    pub(crate) fn create(target: &Path) -> Result<(TempOutput, File)> {
        Self::create_as(target, true)
    }

    /// (`unnamed`: unless the file system has none; else always a temporary name)
    fn create_as(target: &Path, unnamed: bool) -> Result<(TempOutput, File)> {
        let name = target.file_name().ok_or_else(|| {
            Error::Usage(format!("{}: output is not a file name", target.display()))
        })?;
        let dir = match target.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        if target.is_dir() {
            return Err(Error::Usage(format!(
                "{}: output is a directory",
                target.display()
            )));
        }
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        // (the name's first 100 bytes or so: a file name holds at most 255)
        let name = name.to_string_lossy();
        let stem = name[..name.floor_char_boundary(100)].to_string();
        let mut t = TempOutput {
            tmp: None,
            dir,
            stem,
            nanos,
            target: target.to_path_buf(),
            committed: false,
        };
        if let Some(f) = unnamed
            .then(|| crate::sys::create_unnamed(&t.dir))
            .flatten()
        {
            return Ok((t, f));
        }
        let f = t.create_named()?;
        Ok((t, f))
    }

    /// A new file of a temporary name beside the target (kept in `tmp`).
    fn create_named(&mut self) -> Result<File> {
        for attempt in 0..100u32 {
            let tmp = self.temp_name(attempt);
            match std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&tmp)
            {
                Ok(f) => {
                    pending(&tmp, true);
                    self.tmp = Some(tmp);
                    return Ok(f);
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                // (named as the caller gave it: the temporary's name is ours)
                Err(e) => return Err(Error::output(&self.target, "create output", e)),
            }
        }
        Err(self.names_taken())
    }

    fn temp_name(&self, attempt: u32) -> PathBuf {
        self.dir.join(format!(
            ".{}.tmp-{}-{}-{}",
            self.stem,
            std::process::id(),
            self.nanos,
            attempt
        ))
    }

    fn names_taken(&self) -> Error {
        Error::output(
            &self.target,
            "create a temporary file beside it",
            std::io::Error::new(std::io::ErrorKind::AlreadyExists, "100 names taken"),
        )
    }

    /// Give the finished unnamed file a temporary name beside the target (or, where it
    /// cannot be linked, a copy of it).
    fn name_unnamed(&mut self, f: &mut File, sync: bool) -> Result<()> {
        for attempt in 0..100u32 {
            let tmp = self.temp_name(attempt);
            match crate::sys::link_unnamed(f, &tmp) {
                Ok(()) => {
                    pending(&tmp, true);
                    self.tmp = Some(tmp);
                    return Ok(());
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(_) => {
                    use std::io::Seek;
                    let mut copy = self.create_named()?;
                    let at = self.tmp.clone().unwrap_or_default();
                    f.rewind()
                        .and_then(|_| std::io::copy(f, &mut copy))
                        .and_then(|_| if sync { copy.sync_all() } else { Ok(()) })
                        .map_err(|e| Error::output(&at, "copy output", e))?;
                    return Ok(());
                }
            }
        }
        Err(self.names_taken())
    }

    /// Put the finished file at the target's path (after flushing it to disk if `sync`).
    pub(crate) fn commit(mut self, mut f: File, sync: bool) -> Result<()> {
        if sync {
            f.sync_all()
                .map_err(|e| Error::output(&self.target, "sync output", e))?;
        }
        let existing = std::fs::symlink_metadata(&self.target);
        if self.tmp.is_none() {
            // Nothing at the target: the file is given its name in one step (a link,
            // which fails rather than replace what appeared there since).
            if existing.is_err() && crate::sys::link_unnamed(&f, &self.target).is_ok() {
                self.committed = true;
                return Ok(());
            }
            self.name_unnamed(&mut f, sync)?;
        }
        drop(f);
        let tmp = self.tmp.clone().unwrap_or_default();
        // An existing file is exchanged with the new one, then removed under the temporary
        // name (renamed over, it would cost a write-out of the new file on ext4); anything
        // else, or where exchanging fails, is renamed over.
        if existing.is_ok_and(|m| m.is_file())
            && crate::sys::exchange_paths(&tmp, &self.target).is_ok()
        {
            self.committed = true;
            // (the old output, which is not an input: that was refused before)
            let _ = std::fs::remove_file(&tmp);
            return Ok(());
        }
        std::fs::rename(&tmp, &self.target)
            .map_err(|e| Error::output(&self.target, "rename output", e))?;
        self.committed = true;
        Ok(())
    }
}

impl Drop for TempOutput {
    fn drop(&mut self) {
        if let Some(tmp) = &self.tmp {
            if !self.committed {
                let _ = std::fs::remove_file(tmp);
            }
            pending(tmp, false);
        }
    }
}

/// The temporary files of this process that bear a name, until committed or removed.
static PENDING: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

fn pending(p: &Path, add: bool) {
    let mut v = PENDING.lock().unwrap_or_else(|e| e.into_inner());
    if add {
        v.push(p.to_path_buf());
    } else {
        v.retain(|q| q != p);
    }
}

/// Remove every temporary file of this process that bears a name: for a process about to
/// exit at once (the command line, interrupted while a merge is blocked).
pub fn remove_pending_temporaries() {
    let v = PENDING.lock().unwrap_or_else(|e| e.into_inner());
    for p in v.iter() {
        let _ = std::fs::remove_file(p);
    }
}

/// Whether [`write_output`] could write `output`, asked before the work that makes what it
/// writes: a missing directory, a directory, a read-only file or one of `inputs` is an
/// error now, not after the work.
pub fn check_output(output: &Path, inputs: &[PathBuf]) -> Result<()> {
    output_target(output, inputs).map(|_| ())
}

fn output_target(output: &Path, inputs: &[PathBuf]) -> Result<Target> {
    let target = resolve_output(output, false)?;
    if let Some(i) = input_at(&target, inputs) {
        return Err(Error::Usage(format!(
            "{}: the output is the input {}; refused (it would be overwritten)",
            output.display(),
            i.display()
        )));
    }
    // (a report named as a trace in a directory of inputs: every later read of the
    // directory would stop at it)
    if let Target::File(p) = &target {
        let dir = p.parent().filter(|d| !d.as_os_str().is_empty());
        let dir = dir.unwrap_or(Path::new("."));
        let trace_named = trace_name(p);
        if let Some(i) = inputs.iter().find(|i| trace_named && same_file(i, dir)) {
            return Err(Error::Usage(format!(
                "{}: a .ctf name in the input directory {}, whose later reads would take it \
                 for a trace; refused",
                output.display(),
                i.display()
            )));
        }
    }
    Ok(target)
}

/// Whether `p` is named as a trace: what a directory given as an input is read for (its
/// `.ctf` files).
pub(crate) fn trace_name(p: &Path) -> bool {
    p.extension().is_some_and(|x| x == "ctf")
}

/// The input that `target` is, if any: one of `inputs`, or one of the traces (`.ctf`
/// files) of a directory among them, which is read as its traces.
fn input_at(target: &Target, inputs: &[PathBuf]) -> Option<PathBuf> {
    for i in inputs {
        if target.is(i) {
            return Some(i.clone());
        }
        if let Ok(entries) = std::fs::read_dir(i) {
            let traces = (entries.flatten().map(|e| e.path())).filter(|q| trace_name(q));
            for q in traces {
                if target.is(&q) {
                    return Some(q);
                }
            }
        }
    }
    None
}

/// Write a report (an SVG, a profile) to `output` as a merge writes its trace: a file is
/// written under no name and named when `write` has succeeded, so a failure leaves nothing;
/// `-` is stdout, a device or FIFO is written through. An output that is one of `inputs` is
/// refused.
pub fn write_output(
    output: &Path,
    inputs: &[PathBuf],
    write: impl FnOnce(&mut dyn std::io::Write) -> std::io::Result<()>,
) -> Result<()> {
    let target = output_target(output, inputs)?;
    let name = match target {
        Target::Stdout => Path::new("<stdout>"),
        _ => output,
    };
    let (sink, f) = target.create()?;
    let mut w = std::io::BufWriter::with_capacity(1 << 16, f);
    write(&mut w).map_err(|e| Error::output(name, "write", e))?;
    let f = w
        .into_inner()
        .map_err(|e| Error::output(name, "write", e.into_error()))?;
    sink.commit(f, false)
}

/// Where an output goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Target {
    /// A file, new or replaced in one step when finished (a symbolic link's target).
    File(PathBuf),
    /// Written through as it is, from the start: a character device, a FIFO, a socket, or
    /// a descriptor of this process (`/dev/stdout`, `/dev/fd/N`, `/proc/self/fd/N`).
    Through(PathBuf),
    /// This process's standard output (`-`).
    Stdout,
}

/// Where `output` goes, found before any work: a directory, a missing directory, or (unless
/// `force`) an existing read-only file is an error now.
pub(crate) fn resolve_output(output: &Path, force: bool) -> Result<Target> {
    use std::os::unix::ffi::OsStrExt;
    let given = output;
    if output.as_os_str() == "-" {
        return Ok(Target::Stdout);
    }
    if output.as_os_str().as_bytes().ends_with(b"/") {
        return Err(Error::Usage(format!(
            "{}: output is a directory",
            given.display()
        )));
    }
    let mut p = output.to_path_buf();
    for _ in 0..40 {
        match std::fs::symlink_metadata(&p) {
            Ok(m) if m.file_type().is_symlink() => {
                let t = std::fs::read_link(&p).map_err(|e| Error::output(&p, "read link", e))?;
                let t = match p.parent() {
                    Some(d) if t.is_relative() => d.join(t),
                    _ => t,
                };
                // (a descriptor of this process: written through, whatever it is)
                if t.starts_with("/proc") || t.starts_with("/dev/fd") {
                    return Ok(Target::Through(given.to_path_buf()));
                }
                p = t;
            }
            Ok(m) if m.is_dir() => {
                return Err(Error::Usage(format!(
                    "{}: output is a directory",
                    given.display()
                )))
            }
            Ok(m) if m.is_file() => {
                if m.permissions().readonly() && !force {
                    return Err(Error::Usage(format!(
                        "{}: output exists and is read-only (--force replaces it)",
                        given.display()
                    )));
                }
                return Ok(Target::File(p));
            }
            Ok(_) => return Ok(Target::Through(p)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let dir = match p.parent() {
                    Some(d) if !d.as_os_str().is_empty() => d,
                    _ => Path::new("."),
                };
                return match std::fs::metadata(dir) {
                    Ok(m) if m.is_dir() => Ok(Target::File(p)),
                    Ok(_) => Err(Error::Usage(format!(
                        "{}: {} is not a directory",
                        given.display(),
                        dir.display()
                    ))),
                    Err(e) => Err(Error::output(given, "create output", e)),
                };
            }
            Err(e) => return Err(Error::output(given, "stat output", e)),
        }
    }
    Err(Error::Usage(format!(
        "{}: output is a loop of symbolic links",
        given.display()
    )))
}

impl Target {
    /// Whether `input` is this output (refused: it would be overwritten).
    pub(crate) fn is(&self, input: &Path) -> bool {
        match self {
            Target::File(p) | Target::Through(p) => same_file(input, p),
            Target::Stdout => false,
        }
    }

    /// The file to write, and what makes it the output when finished.
    pub(crate) fn create(&self) -> Result<(Sink, File)> {
        match self {
            Target::File(p) => {
                let (t, f) = TempOutput::create(p)?;
                Ok((Sink(Some(t)), f))
            }
            Target::Through(p) => {
                let f = std::fs::OpenOptions::new()
                    .write(true)
                    .truncate(true)
                    .open(p)
                    .map_err(|e| Error::output(p, "open output", e))?;
                Ok((Sink(None), f))
            }
            Target::Stdout => {
                use std::os::fd::AsFd;
                let f = (std::io::stdout().as_fd().try_clone_to_owned())
                    .map_err(|e| Error::output("<stdout>", "open output", e))?;
                Ok((Sink(None), File::from(f)))
            }
        }
    }
}

/// What makes a written file the output: a temporary given the output's name, or nothing
/// (written through).
pub(crate) struct Sink(Option<TempOutput>);

impl Sink {
    /// The output, finished (flushed to disk first if `sync` and it is a file).
    pub(crate) fn commit(self, f: File, sync: bool) -> Result<()> {
        match self.0 {
            Some(t) => t.commit(f, sync),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A finished output takes the place of what is at its path: a file (by exchange,
    /// which leaves the file's other hard links alone), a symbolic link (the link, not the
    /// file it names), or nothing; no temporary is left, and the exchange swaps. The same
    /// whether it was written unnamed (no name beside the target until the end), under a
    /// temporary name (file systems without unnamed files), or unnamed where it cannot be
    /// linked to the target (here another file system: it is copied).
    #[test]
    fn a_finished_output_replaces_what_was_there() {
        for way in ["unnamed", "named", "elsewhere"] {
            finished_output_replaces(way);
        }
    }

    fn finished_output_replaces(way: &str) {
        use std::io::Write;
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        if way != "named" && crate::sys::create_unnamed(d).is_none() {
            println!("no unnamed files in {}: {way} is not tested", d.display());
            return;
        }
        let shm = Path::new("/dev/shm");
        if way == "elsewhere"
            && !shm
                .metadata()
                .is_ok_and(|m| m.dev() != d.metadata().unwrap().dev())
        {
            println!("no other file system at hand: the copy is not tested");
            return;
        }
        let names = |d: &Path| -> Vec<String> {
            let mut v: Vec<_> = std::fs::read_dir(d)
                .unwrap()
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .collect();
            v.sort();
            v
        };
        let commit = |target: &Path, text: &[u8]| {
            let before = names(d);
            let (tmp, mut f) = TempOutput::create_as(target, way != "named").unwrap();
            // (unnamed: nothing new in the directory while it is written)
            assert_eq!(names(d) == before, way != "named", "{way}");
            if way == "elsewhere" {
                f = crate::sys::create_unnamed(shm).unwrap();
            }
            f.write_all(text).unwrap();
            tmp.commit(f, false).unwrap();
        };
        let (a, b) = (d.join("a"), d.join("b"));
        std::fs::write(&a, b"old a").unwrap();
        std::fs::write(&b, b"old b").unwrap();
        #[cfg(target_os = "linux")]
        {
            crate::sys::exchange_paths(&a, &b).unwrap();
            assert_eq!(std::fs::read(&a).unwrap(), b"old b");
            assert_eq!(std::fs::read(&b).unwrap(), b"old a");
            assert!(crate::sys::exchange_paths(&a, &d.join("none")).is_err());
        }
        // a file, and another name of it
        std::fs::hard_link(&a, d.join("a2")).unwrap();
        commit(&a, b"new a");
        assert_eq!(std::fs::read(&a).unwrap(), b"new a");
        assert_eq!(std::fs::read(d.join("a2")).unwrap(), b"old b");
        // a symbolic link
        std::os::unix::fs::symlink(&b, d.join("l")).unwrap();
        commit(&d.join("l"), b"new l");
        assert!(std::fs::symlink_metadata(d.join("l")).unwrap().is_file());
        assert_eq!(std::fs::read(d.join("l")).unwrap(), b"new l");
        assert_eq!(std::fs::read(&b).unwrap(), b"old a");
        // nothing
        commit(&d.join("c"), b"new c");
        assert_eq!(std::fs::read(d.join("c")).unwrap(), b"new c");
        assert_eq!(names(d), ["a", "a2", "b", "c", "l"], "{way}");
    }
}
