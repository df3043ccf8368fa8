//! Inputs that cannot be read twice (pipes, FIFOs, character devices such as `/dev/stdin`)
//! are read once, before the merge, into memory up to a bound and then into a temporary file.
//!
//! A merge reads each input more than once (its info packet, then a stream per domain, each
//! from its own descriptor), so it reads a spool in their place: a file of no name, reached
//! again through `/proc/self/fd`, gone with the merge however it ends.

use crate::error::{Error, Result};
use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

/// Bytes of a spooled input held in memory before the rest goes to a temporary file.
const IN_MEMORY: u64 = 64 << 20;

/// An input read once into a file of no name.
pub(crate) struct Spool {
    /// Held open: the spool lives as long as this.
    _file: File,
    /// Where it opens again (`/proc/self/fd/N`).
    pub path: PathBuf,
}

/// Whether `path` must be spooled: it is there, and neither a regular file nor a directory
/// (a pipe, a FIFO, a character device or a socket).
pub(crate) fn needs_spool(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| !m.is_file() && !m.is_dir())
}

/// Read all of `path` into a spool; `cancel` set stops the reading (waiting for a FIFO's
/// writer is ended by the command line's watchdog instead).
pub(crate) fn spool(path: &Path, cancel: &crate::cancel::Cancel) -> Result<Spool> {
    spool_with_bound(path, cancel, IN_MEMORY)
}

fn spool_with_bound(
    path: &Path,
    cancel: &crate::cancel::Cancel,
    in_memory_bound: u64,
) -> Result<Spool> {
    let mut src = File::open(path).map_err(|e| Error::input(path, "open", e))?;
    let mut file = crate::sys::memory_file("memtrace-merge input")
        .map_err(|e| Error::input(path, "spool (memory file)", e))?;
    let mut in_memory = true;
    let mut total = 0u64;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        if cancel.is_cancelled() {
            return Err(Error::Cancelled);
        }
        let n = match src.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(Error::input(path, "read", e)),
        };
        if in_memory && total + n as u64 > in_memory_bound {
            // (past the bound: what memory holds moves to a temporary file, and the rest)
            let mut disk = temporary_file(&std::env::temp_dir())
                .map_err(|e| Error::input(path, "spool (temporary file)", e))?;
            file.seek(SeekFrom::Start(0))
                .and_then(|_| std::io::copy(&mut file, &mut disk))
                .map_err(|e| Error::input(path, "spool", e))?;
            file = disk;
            in_memory = false;
        }
        file.write_all(&buf[..n])
            .map_err(|e| Error::input(path, "spool", e))?;
        total += n as u64;
    }
    let path = crate::sys::reopen_path(&file);
    Ok(Spool { _file: file, path })
}

/// A file of no name in `dir` (Linux `O_TMPFILE`; elsewhere one created and removed at once).
fn temporary_file(dir: &Path) -> std::io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    let unnamed = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .mode(0o600)
        .custom_flags(libc::O_TMPFILE)
        .open(dir);
    if let Ok(f) = unnamed {
        return Ok(f);
    }
    for attempt in 0..100u32 {
        let p = dir.join(format!(
            ".memtrace-merge-spool-{}-{attempt}",
            std::process::id()
        ));
        match std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&p)
        {
            Ok(f) => {
                std::fs::remove_file(&p)?;
                return Ok(f);
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
    Err(std::io::Error::from(std::io::ErrorKind::AlreadyExists))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;
    use std::process::{Command, Stdio};

    /// `data` through `cat`: the read end of a pipe, as `<(...)` gives one.
    fn piped(data: &[u8]) -> (std::process::Child, std::process::ChildStdout) {
        let mut c = Command::new("cat")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut w = c.stdin.take().unwrap();
        let sent = data.to_vec();
        std::thread::spawn(move || w.write_all(&sent));
        let out = c.stdout.take().unwrap();
        (c, out)
    }

    #[test]
    fn a_pipe_is_read_once_and_opens_again_whole() {
        let data: Vec<u8> = (0..300_000u32).map(|i| (i * 7) as u8).collect();
        for bound in [IN_MEMORY, 1000] {
            let (mut child, out) = piped(&data);
            let p = PathBuf::from(format!("/proc/self/fd/{}", out.as_raw_fd()));
            assert!(needs_spool(&p));
            let s = spool_with_bound(&p, &crate::cancel::Cancel::new(), bound).unwrap();
            child.wait().unwrap();
            // (read again, and again: whole each time)
            for _ in 0..2 {
                assert_eq!(std::fs::read(&s.path).unwrap(), data, "bound {bound}");
            }
            assert!(!needs_spool(&s.path));
        }
    }

    #[test]
    fn an_interrupt_stops_the_spooling() {
        let (mut child, out) = piped(b"abc");
        let p = PathBuf::from(format!("/proc/self/fd/{}", out.as_raw_fd()));
        let cancel = crate::cancel::Cancel::new();
        cancel.cancel();
        let e = spool(&p, &cancel).err().unwrap();
        assert!(matches!(e, Error::Cancelled), "{e}");
        drop(out);
        child.wait().unwrap();
    }
}
