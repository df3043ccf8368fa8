//! Cancelling a merge as it runs: a handle its caller keeps and sets from anywhere (another
//! thread, a signal's watchdog, a C caller's flag); each merge polls its own.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// A handle that cancels the merges given it ([`crate::MergeOptions::cancel`]); clones
/// share it. A merge that sees it set stops within a few milliseconds, leaving no output
/// and no temporary file, and returns [`crate::Error::Cancelled`].
#[derive(Clone, Default)]
pub struct Cancel(Arc<Flag>);

enum Flag {
    Own(AtomicBool),
    /// Asked of a function of the caller's (the C ABI's flag).
    Polled(Box<dyn Fn() -> bool + Send + Sync>),
}

impl Default for Flag {
    fn default() -> Self {
        Flag::Own(AtomicBool::new(false))
    }
}

impl Cancel {
    /// A handle not set.
    pub fn new() -> Cancel {
        Cancel::default()
    }

    /// A handle set when `f` says so (asked every few thousand events).
    pub fn polling(f: impl Fn() -> bool + Send + Sync + 'static) -> Cancel {
        Cancel(Arc::new(Flag::Polled(Box::new(f))))
    }

    /// Cancel every merge given this handle (or a clone of it).
    pub fn cancel(&self) {
        if let Flag::Own(b) = &*self.0 {
            b.store(true, Ordering::Relaxed);
        }
    }

    /// Whether it was cancelled.
    pub fn is_cancelled(&self) -> bool {
        match &*self.0 {
            Flag::Own(b) => b.load(Ordering::Relaxed),
            Flag::Polled(f) => f(),
        }
    }
}

impl std::fmt::Debug for Cancel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Cancel({})", self.is_cancelled())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clones_share_a_handle_and_handles_are_apart() {
        let (a, b) = (Cancel::new(), Cancel::new());
        let a2 = a.clone();
        a2.cancel();
        assert!(a.is_cancelled() && !b.is_cancelled());
        let flag = Arc::new(AtomicBool::new(false));
        let f = flag.clone();
        let p = Cancel::polling(move || f.load(Ordering::Relaxed));
        assert!(!p.is_cancelled());
        flag.store(true, Ordering::Relaxed);
        assert!(p.is_cancelled());
    }
}
