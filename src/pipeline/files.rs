//! Input files opened lazily under a shared budget of open descriptors, so a merge of
//! thousands of traces works under a small `ulimit -n` (least recently read is closed first).

use super::lock;
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

struct Slot {
    file: Option<File>,
    offset: u64,
    /// Its place in [`Pool::open_files`] while open: the pool's clock at its last read.
    last_use: u64,
}

struct Pool {
    limit: usize,
    clock: u64,
    /// The open files by their last read, the least recent first: the next to close is
    /// found at once however many files the pool holds.
    open_files: BTreeMap<u64, Arc<Mutex<Slot>>>,
    peak_open: usize,
}

/// A shared budget of open files (its files may be read from any thread, one at a time).
#[derive(Clone)]
pub struct FilePool(Arc<Mutex<Pool>>);

impl FilePool {
    /// At most `limit` files open at once (at least 1).
    pub fn new(limit: usize) -> Self {
        FilePool(Arc::new(Mutex::new(Pool {
            limit: limit.max(1),
            clock: 0,
            open_files: BTreeMap::new(),
            peak_open: 0,
        })))
    }

    /// One of `n` pools (for `n` threads) sharing a budget derived from the process's soft
    /// `RLIMIT_NOFILE`: half of it, leaving room for the host program's own descriptors (at
    /// least 4, at most 512).
    pub fn from_rlimit_share(n: usize) -> Self {
        FilePool::new((open_files_limit() / 2).clamp(4, 512) / n.max(1))
    }

    #[cfg(test)]
    /// Most files ever open at once through this pool.
    pub fn peak_open(&self) -> usize {
        lock(&self.0).peak_open
    }

    /// A file to be opened on first read (checked for existence now).
    pub fn open(&self, path: &Path) -> io::Result<LazyFile> {
        std::fs::metadata(path)?;
        let slot = Arc::new(Mutex::new(Slot {
            file: None,
            offset: 0,
            last_use: 0,
        }));
        Ok(LazyFile {
            path: path.to_path_buf(),
            slot,
            pool: self.clone(),
        })
    }
}

/// The soft limit of open files of this process (`RLIMIT_NOFILE`).
pub fn open_files_limit() -> usize {
    crate::sys::open_files_limit()
}

/// A file that holds a descriptor only while the pool allows it; reopened and re-seeked on
/// demand.
pub struct LazyFile {
    path: PathBuf,
    slot: Arc<Mutex<Slot>>,
    pool: FilePool,
}

impl LazyFile {
    /// Let go of the descriptor (e.g. at the end of the input).
    pub fn close(&self) {
        // (the pool first, then a slot: the order `read` takes them in)
        let mut pool = lock(&self.pool.0);
        let mut s = lock(&self.slot);
        if s.file.take().is_some() {
            pool.open_files.remove(&s.last_use);
        }
    }
}

impl Read for LazyFile {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let mut pool = lock(&self.pool.0);
        pool.clock += 1;
        let now = pool.clock;
        let mut s = lock(&self.slot);
        if s.file.is_some() {
            pool.open_files.remove(&s.last_use);
        } else {
            if pool.open_files.len() >= pool.limit {
                // close the least recently read (never this one: it is not open)
                if let Some((_, v)) = pool.open_files.pop_first() {
                    lock(&v).file = None;
                }
            }
            let mut f = File::open(&self.path)?;
            f.seek(SeekFrom::Start(s.offset))?;
            s.file = Some(f);
            pool.peak_open = pool.peak_open.max(pool.open_files.len() + 1);
        }
        s.last_use = now;
        pool.open_files.insert(now, self.slot.clone());
        // (the slot stays locked once the pool is let go: no other reader can close this
        // file, picking it as the least recently read, before it is read)
        drop(pool);
        let n = s.file.as_mut().expect("opened above").read(buf)?;
        s.offset += n as u64;
        Ok(n)
    }
}

impl Drop for LazyFile {
    fn drop(&mut self) {
        self.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn many_files_under_a_small_budget() {
        let dir = tempfile::tempdir().unwrap();
        let pool = FilePool::new(3);
        let mut files = Vec::new();
        for i in 0..20u8 {
            let p = dir.path().join(format!("f{i}"));
            std::fs::File::create(&p)
                .unwrap()
                .write_all(&[i; 100])
                .unwrap();
            files.push(pool.open(&p).unwrap());
        }
        // read interleaved, 10 bytes at a time
        let mut got = vec![Vec::new(); 20];
        for _ in 0..10 {
            for (i, f) in files.iter_mut().enumerate() {
                let mut b = [0u8; 10];
                f.read_exact(&mut b).unwrap();
                got[i].extend_from_slice(&b);
            }
        }
        for (i, g) in got.iter().enumerate() {
            assert_eq!(g, &vec![i as u8; 100]);
        }
        assert!(pool.peak_open() <= 3);
    }
}
