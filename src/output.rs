//! Writing a file on a thread of its own: the bytes are gathered into large buffers that the
//! thread writes, so that the caller never waits in the kernel (a merge's merging thread).

use crate::placement::Placement;
use std::fs::File;
use std::io::{self, Write};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::Arc;
use std::thread::JoinHandle;

/// Bytes gathered before a buffer goes to the writing thread (small enough that the few
/// buffers in use stay the same ones: each new one costs page faults).
const CHUNK: usize = 1 << 18;
/// Buffers in flight: the caller waits when the writing thread is this far behind.
const IN_FLIGHT: usize = 4;

/// A [`Write`] whose writes to `File` happen on a thread. An error of the thread comes back
/// from a later `write` or from `flush`/[`BackgroundFile::finish`].
pub struct BackgroundFile {
    buf: Vec<u8>,
    to_thread: Option<SyncSender<Vec<u8>>>,
    from_thread: Receiver<Vec<u8>>,
    thread: Option<JoinHandle<io::Result<File>>>,
}

impl BackgroundFile {
    pub fn new(file: File) -> io::Result<Self> {
        Self::placed(file, None)
    }

    /// [`BackgroundFile::new`], its thread a helper of `placement` (kept off the CPU of
    /// the merging thread).
    pub(crate) fn placed(file: File, placement: Option<Arc<Placement>>) -> io::Result<Self> {
        let (to_thread, jobs) = sync_channel::<Vec<u8>>(IN_FLIGHT);
        let (give_back, from_thread) = sync_channel::<Vec<u8>>(IN_FLIGHT + 1);
        let thread = std::thread::Builder::new()
            .name("memtrace-merge-output".into())
            .spawn(move || {
                let _placed = placement.as_ref().and_then(|p| p.helper());
                let mut file = file;
                for mut b in jobs {
                    file.write_all(&b)?;
                    b.clear();
                    // (the caller may be gone or have buffers enough: either is fine)
                    let _ = give_back.try_send(b);
                }
                Ok(file)
            })?;
        Ok(BackgroundFile {
            buf: Vec::with_capacity(CHUNK),
            to_thread: Some(to_thread),
            from_thread,
            thread: Some(thread),
        })
    }

    /// Hand the gathered bytes to the thread and take an empty buffer.
    fn send(&mut self) -> io::Result<()> {
        let next = self
            .from_thread
            .try_recv()
            .unwrap_or_else(|_| Vec::with_capacity(CHUNK));
        let full = std::mem::replace(&mut self.buf, next);
        let sent = self.to_thread.as_ref().map(|t| t.send(full));
        match sent {
            Some(Ok(())) => Ok(()),
            // the thread stopped: its error says why
            _ => Err(self.join().err().unwrap_or_else(stopped)),
        }
    }

    /// Stop the thread and take its result.
    fn join(&mut self) -> io::Result<File> {
        self.to_thread = None;
        match self.thread.take() {
            Some(t) => t.join().unwrap_or_else(|_| Err(stopped())),
            None => Err(stopped()),
        }
    }

    /// Write what is left, wait for the thread and give the file back.
    pub fn finish(mut self) -> io::Result<File> {
        if !self.buf.is_empty() {
            self.send()?;
        }
        self.join()
    }
}

fn stopped() -> io::Error {
    io::Error::other("the output thread stopped")
}

impl Write for BackgroundFile {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        // (sent before it would outgrow its room: no buffer is ever reallocated)
        if self.buf.len() + b.len() > CHUNK && !self.buf.is_empty() {
            self.send()?;
        }
        self.buf.extend_from_slice(b);
        Ok(b.len())
    }

    /// Only hands the gathered bytes over (the file is flushed by [`BackgroundFile::finish`]).
    fn flush(&mut self) -> io::Result<()> {
        if !self.buf.is_empty() {
            self.send()?;
        }
        Ok(())
    }
}

impl Drop for BackgroundFile {
    fn drop(&mut self) {
        let _ = self.join();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    /// Many writes of odd sizes across several buffers come out whole and in order.
    #[test]
    fn writes_arrive_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out");
        let mut w = BackgroundFile::new(File::create(&path).unwrap()).unwrap();
        let mut want = Vec::new();
        for i in 0..20_000u32 {
            let piece: Vec<u8> = (0..(i % 977)).map(|k| (k ^ i) as u8).collect();
            w.write_all(&piece).unwrap();
            want.extend_from_slice(&piece);
        }
        assert!(want.len() > 4 * CHUNK);
        drop(w.finish().unwrap());
        let mut got = Vec::new();
        File::open(&path).unwrap().read_to_end(&mut got).unwrap();
        assert!(got == want);
    }

    /// A write error on the thread reaches the caller (here: a file opened read-only).
    #[test]
    fn the_threads_error_comes_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ro");
        File::create(&path).unwrap();
        let mut w = BackgroundFile::new(File::open(&path).unwrap()).unwrap();
        let mut failed = false;
        for _ in 0..(4 * IN_FLIGHT) {
            if w.write_all(&[7u8; CHUNK]).is_err() {
                failed = true;
                break;
            }
        }
        assert!(failed || w.finish().is_err());
    }
}
