//! Writing a file in large buffers, on a thread of its own when a CPU is free for it, so
//! that the caller (a merge's merging thread) does not wait in the kernel.

use crate::pipeline::placement::Placement;
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
/// Buffers the writing thread faults in for the caller when it starts.
const PREPARED: usize = 2;

/// A [`Write`] that gathers bytes into buffers of `CHUNK` bytes and writes them to `File`,
/// on a thread ([`OutputFile::on_thread`]: an error of the thread comes back from a later
/// `write` or from `flush`/[`OutputFile::finish`]) or on the caller's ([`OutputFile::here`]).
pub struct OutputFile {
    buf: Vec<u8>,
    to: To,
}

/// Where an [`OutputFile`]'s buffers go.
enum To {
    Thread {
        to_thread: Option<SyncSender<Vec<u8>>>,
        from_thread: Receiver<Vec<u8>>,
        thread: Option<JoinHandle<io::Result<File>>>,
    },
    /// (None once given back by [`OutputFile::finish`])
    Here(Option<File>),
}

impl OutputFile {
    /// Written on the caller's thread: where no CPU is free for another (a merge on two
    /// CPUs, its merging thread on one and a decoding thread on the other), a writing
    /// thread would share the decoding thread's CPU and push its tables out of the core's
    /// caches. Where the merging thread encodes the backtraces itself it is the busier one,
    /// and the file is written on a thread of its own (benches/PERFORMANCE.md, "OutputFile::here").
    pub fn here(file: File) -> Self {
        OutputFile {
            buf: Vec::with_capacity(CHUNK),
            to: To::Here(Some(file)),
        }
    }

    /// Written on a thread of its own.
    #[cfg(test)]
    pub fn new(file: File) -> io::Result<Self> {
        Self::on_thread(file, None)
    }

    /// [`OutputFile::new`], its thread a helper of `placement` (kept off the CPU of the
    /// merging thread).
    pub(crate) fn on_thread(file: File, placement: Option<Arc<Placement>>) -> io::Result<Self> {
        let (to_thread, jobs) = sync_channel::<Vec<u8>>(IN_FLIGHT);
        let (give_back, from_thread) = sync_channel::<Vec<u8>>(IN_FLIGHT + 1);
        let thread = std::thread::Builder::new()
            .name("memtrace-merge-output".into())
            .spawn(move || {
                let _placed = placement.as_ref().and_then(|p| p.helper());
                let mut file = file;
                // The next buffers, faulted in here rather than on the caller's thread.
                for _ in 0..PREPARED {
                    let mut b = Vec::with_capacity(CHUNK);
                    fault_in_room(&mut b);
                    let _ = give_back.try_send(b);
                }
                for mut b in jobs {
                    file.write_all(&b)?;
                    b.clear();
                    // (the caller may be gone or have buffers enough: either is fine)
                    let _ = give_back.try_send(b);
                }
                Ok(file)
            })?;
        Ok(OutputFile {
            buf: Vec::with_capacity(CHUNK),
            to: To::Thread {
                to_thread: Some(to_thread),
                from_thread,
                thread: Some(thread),
            },
        })
    }

    /// Fault in the pages of the buffer being filled now, rather than one by one as bytes
    /// come in.
    pub fn fault_in(&mut self) {
        fault_in_room(&mut self.buf);
    }

    /// Write the gathered bytes, or hand them to the thread and take an empty buffer.
    fn send(&mut self) -> io::Result<()> {
        let (to_thread, from_thread) = match &mut self.to {
            To::Here(Some(f)) => {
                f.write_all(&self.buf)?;
                self.buf.clear();
                return Ok(());
            }
            To::Here(None) => return Err(stopped()),
            To::Thread {
                to_thread,
                from_thread,
                ..
            } => (to_thread, from_thread),
        };
        let next = from_thread
            .try_recv()
            .unwrap_or_else(|_| Vec::with_capacity(CHUNK));
        let full = std::mem::replace(&mut self.buf, next);
        let sent = to_thread.as_ref().map(|t| t.send(full));
        match sent {
            Some(Ok(())) => Ok(()),
            // the thread stopped: its error says why
            _ => Err(self.join().err().unwrap_or_else(stopped)),
        }
    }

    /// Stop the thread and take its result (the file, written here).
    fn join(&mut self) -> io::Result<File> {
        match &mut self.to {
            To::Here(f) => f.take().ok_or_else(stopped),
            To::Thread {
                to_thread, thread, ..
            } => {
                *to_thread = None;
                match thread.take() {
                    Some(t) => t.join().unwrap_or_else(|_| Err(stopped())),
                    None => Err(stopped()),
                }
            }
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

/// Write a zero into each page of `b`'s room past its bytes: those pages are faulted in now
/// (the bytes it holds stay as they are).
fn fault_in_room(b: &mut Vec<u8>) {
    for x in b.spare_capacity_mut().iter_mut().step_by(4096) {
        x.write(0);
    }
}

fn stopped() -> io::Error {
    io::Error::other("the output thread stopped")
}

impl Write for OutputFile {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        // (sent before it would outgrow its room: no buffer is ever reallocated)
        if self.buf.len() + b.len() > CHUNK && !self.buf.is_empty() {
            self.send()?;
        }
        self.buf.extend_from_slice(b);
        Ok(b.len())
    }

    /// Only writes or hands over the gathered bytes (the file is flushed by
    /// [`OutputFile::finish`]).
    fn flush(&mut self) -> io::Result<()> {
        if !self.buf.is_empty() {
            self.send()?;
        }
        Ok(())
    }
}

impl Drop for OutputFile {
    fn drop(&mut self) {
        let _ = self.join();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    /// Both ways of writing: on a thread, and on the caller's.
    fn both(file: impl Fn() -> File) -> [OutputFile; 2] {
        [OutputFile::new(file()).unwrap(), OutputFile::here(file())]
    }

    /// Many writes of odd sizes across several buffers come out whole and in order.
    #[test]
    fn writes_arrive_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out");
        for mut w in both(|| File::create(&path).unwrap()) {
            let mut want = Vec::new();
            for i in 0..20_000u32 {
                // (faulting in the buffer's room, empty or part-filled, changes nothing)
                if i % 5_000 == 0 || i == 1 {
                    w.fault_in();
                }
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
    }

    /// A write error (on the thread or not) reaches the caller (here: a file opened
    /// read-only).
    #[test]
    fn the_threads_error_comes_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ro");
        File::create(&path).unwrap();
        for mut w in both(|| File::open(&path).unwrap()) {
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
}
