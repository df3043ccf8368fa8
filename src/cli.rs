//! Signals as a command line is expected to take them, for this crate's `memtrace-merge` (a
//! library must not take over its host's signals: only a program's `main` calls these).

use crate::cancel::Cancel;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// How long an interrupted merge has to stop by itself before the process ends.
pub const INTERRUPT_GRACE: Duration = Duration::from_millis(500);

/// SIGINT and SIGTERM cancel `cancel`, then, if the process has not ended
/// [`INTERRUPT_GRACE`] later (it waits on a FIFO with no writer, say), its named temporary
/// files are removed and it exits with status 130 and one line on stderr.
pub fn cancel_on_interrupt(cancel: &Cancel) {
    crate::sys::on_interrupt_set_flag();
    let cancel = cancel.clone();
    std::thread::spawn(move || loop {
        std::thread::sleep(Duration::from_millis(20));
        if crate::sys::interrupted() {
            cancel.cancel();
            std::thread::sleep(INTERRUPT_GRACE);
            crate::fs::remove_pending_temporaries();
            if first_to_report_interrupt() {
                use std::io::Write;
                let _ = writeln!(
                    std::io::stderr(),
                    "memtrace-merge: interrupted; no output written"
                );
            }
            std::process::exit(130);
        }
    });
}

/// True for the first caller only: who says that the merge was interrupted.
pub fn first_to_report_interrupt() -> bool {
    static SAID: AtomicBool = AtomicBool::new(false);
    !SAID.swap(true, Ordering::SeqCst)
}

/// A write past the file size limit (`ulimit -f`) fails with an error naming the file
/// (EFBIG) rather than kill the process with SIGXFSZ.
pub fn ignore_file_size_signal() {
    crate::sys::ignore_file_size_signal();
}

/// A write to a closed pipe ends the process quietly, as it ends `cat`.
pub fn default_broken_pipe_signal() {
    crate::sys::default_broken_pipe_signal();
}
