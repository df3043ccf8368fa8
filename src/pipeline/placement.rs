//! Where a merge's threads run: its helper threads (decoding, writing the output) are kept
//! off the CPU that its merging thread, the busiest, is on, wherever the kernel moves it.
//!
//! Left to itself, the kernel often puts a new thread, or one that another wakes, on the
//! CPU of the thread that made or woke it: a merging and a decoding thread then take turns
//! on one CPU while another is idle; keeping the helpers off the merging thread's CPU is
//! as fast as pinning all three threads (benches/PERFORMANCE.md, "placement"). The merging thread itself (the caller's) is never
//! restricted: only the helpers, only within the CPUs they were given, while they run.

use crate::sys::{current_cpu, keep_off, this_thread, CpuSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// No CPU known yet.
const UNKNOWN: usize = usize::MAX;

/// The helpers of one merge and the CPU its merging thread was last seen on.
pub(crate) struct Placement {
    /// Each running helper's thread id and the CPUs it was given.
    helpers: Mutex<Vec<(i32, CpuSet)>>,
    cpu: AtomicUsize,
}

/// A helper thread's registration: it is kept off the merging thread's CPU until this is
/// dropped (before the thread ends, so that its id is never used once it may be reused).
pub(crate) struct Helper {
    of: Arc<Placement>,
    tid: i32,
}

impl Placement {
    /// For a merge whose merging thread is the calling one.
    pub fn new() -> Arc<Placement> {
        Arc::new(Placement {
            helpers: Mutex::new(Vec::new()),
            cpu: AtomicUsize::new(current_cpu().unwrap_or(UNKNOWN)),
        })
    }

    /// Register the calling thread as a helper (None where threads cannot be placed).
    pub fn helper(self: &Arc<Self>) -> Option<Helper> {
        let (tid, allowed) = this_thread()?;
        let mut h = self.helpers.lock().unwrap_or_else(|e| e.into_inner());
        let cpu = self.cpu.load(Ordering::Relaxed);
        if cpu != UNKNOWN {
            keep_off(tid, &allowed, cpu);
        }
        h.push((tid, allowed));
        Some(Helper {
            of: self.clone(),
            tid,
        })
    }

    /// Called by the merging thread now and then (a system call only when it has moved):
    /// keep the helpers off the CPU it is on now.
    #[inline]
    pub fn follow(&self) {
        let Some(cpu) = current_cpu() else { return };
        if cpu == self.cpu.load(Ordering::Relaxed) {
            return;
        }
        self.cpu.store(cpu, Ordering::Relaxed);
        let h = self.helpers.lock().unwrap_or_else(|e| e.into_inner());
        for (tid, allowed) in h.iter() {
            keep_off(*tid, allowed, cpu);
        }
    }
}

impl Drop for Helper {
    fn drop(&mut self) {
        let mut h = self.of.helpers.lock().unwrap_or_else(|e| e.into_inner());
        h.retain(|&(t, _)| t != self.tid);
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    use crate::sys::allowed_cpus as allowed_now;

    /// The CPUs this thread may run on and a placement made here, or None on a machine of
    /// one CPU (where there is nothing to keep off).
    fn on_several_cpus() -> Option<(Vec<usize>, Arc<Placement>)> {
        let before = allowed_now();
        (before.len() >= 2).then(|| (before, Placement::new()))
    }

    /// A helper may run anywhere it could but on the merging thread's CPU; once it is
    /// dropped it is no longer followed. (Skipped on a machine of one CPU.)
    #[test]
    fn a_helper_is_kept_off_the_merging_threads_cpu() {
        let Some((before, p)) = on_several_cpus() else {
            return;
        };
        let merging = p.cpu.load(Ordering::Relaxed);
        assert!(before.contains(&merging));
        let p2 = p.clone();
        let (seen, after_drop) = std::thread::spawn(move || {
            let h = p2.helper().expect("a helper on Linux");
            let seen = allowed_now();
            drop(h);
            // the merging thread "moves": a dropped helper is left alone
            p2.cpu.store(UNKNOWN, Ordering::Relaxed);
            p2.follow();
            (seen, allowed_now())
        })
        .join()
        .unwrap();
        let expected: Vec<usize> = before.iter().copied().filter(|&c| c != merging).collect();
        assert_eq!(seen, expected);
        assert_eq!(after_drop, expected);
        assert!(p.helpers.lock().unwrap().is_empty());
    }

    /// When the merging thread is seen on another CPU, the helpers move off that one.
    #[test]
    fn helpers_follow_the_merging_thread() {
        let Some((before, p)) = on_several_cpus() else {
            return;
        };
        // pretend the merging thread was on another CPU than this one, `a`; the helper
        // starts off it
        let here = p.cpu.load(Ordering::Relaxed);
        let a = before.iter().copied().find(|&c| c != here).unwrap();
        p.cpu.store(a, Ordering::Relaxed);
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let (back, seen) = std::sync::mpsc::channel();
        let p2 = p.clone();
        let t = std::thread::spawn(move || {
            let _h = p2.helper().unwrap();
            back.send(allowed_now()).unwrap();
            rx.recv().unwrap();
            back.send(allowed_now()).unwrap();
        });
        let first = seen.recv().unwrap();
        assert!(!first.contains(&a) && first.len() == before.len() - 1);
        // the merging thread is now seen elsewhere: follow moves the helper off its CPU
        p.cpu.store(UNKNOWN, Ordering::Relaxed);
        p.follow();
        let now = p.cpu.load(Ordering::Relaxed);
        tx.send(()).unwrap();
        let second = seen.recv().unwrap();
        t.join().unwrap();
        let expected: Vec<usize> = before.iter().copied().filter(|&c| c != now).collect();
        assert_eq!(second, expected);
        // (unless this thread moved to `a` meanwhile, the helper did move)
        assert!(now == a || second != first);
    }
}
