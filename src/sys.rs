//! Every call to the operating system that needs `unsafe`: signals, files of no name
//! (`memfd_create`, `O_TMPFILE` linked in, `renameat2`), CPU affinity, resource limits.

use std::os::raw::c_int;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

/// Set by the SIGINT and SIGTERM handler of [`on_interrupt_set_flag`].
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// Make SIGINT and SIGTERM set a flag ([`interrupted`]) instead of ending the process.
pub(crate) fn on_interrupt_set_flag() {
    extern "C" fn on_signal(_: c_int) {
        INTERRUPTED.store(true, Ordering::Relaxed);
    }
    let handler: extern "C" fn(c_int) = on_signal;
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe {
        libc::signal(libc::SIGINT, handler as libc::sighandler_t);
        libc::signal(libc::SIGTERM, handler as libc::sighandler_t);
    }
}

/// Whether SIGINT or SIGTERM came since [`on_interrupt_set_flag`].
pub(crate) fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::Relaxed)
}

/// Make a write past the file size limit (`ulimit -f`) fail with an error (EFBIG) rather than
/// kill the process with SIGXFSZ.
pub(crate) fn ignore_file_size_signal() {
    // SAFETY: setting a signal's disposition to SIG_IGN runs no code of ours.
    unsafe {
        libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
    }
}

/// Let a write to a closed pipe end the process quietly (SIGPIPE's default action).
pub(crate) fn default_broken_pipe_signal() {
    // SAFETY: restoring a signal's default disposition runs no code of ours.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// The soft limit of open files (`RLIMIT_NOFILE`), or 1024 where unknown.
pub(crate) fn open_files_limit() -> usize {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit fills the struct given it.
    let ok = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } == 0;
    if ok && r.rlim_cur != libc::RLIM_INFINITY {
        usize::try_from(r.rlim_cur).unwrap_or(usize::MAX)
    } else if ok {
        usize::MAX
    } else {
        1024
    }
}

/// A file of no name in memory (Linux `memfd_create`).
pub(crate) fn memory_file(name: &str) -> std::io::Result<std::fs::File> {
    use std::os::fd::FromRawFd;
    let name = std::ffi::CString::new(name)
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    // SAFETY: name is NUL-terminated; a descriptor returned is fresh and owned by the File.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fd is a new descriptor that nothing else owns.
    Ok(unsafe { std::fs::File::from_raw_fd(fd) })
}

/// The path that opens `f` again, with an offset of its own (Linux `/proc/self/fd/N`).
pub(crate) fn reopen_path(f: &std::fs::File) -> PathBuf {
    use std::os::fd::AsRawFd;
    PathBuf::from(format!("/proc/self/fd/{}", f.as_raw_fd()))
}

/// A path as the system takes it (no NUL inside).
#[cfg(target_os = "linux")]
fn c_path(p: &Path) -> std::io::Result<std::ffi::CString> {
    use std::os::unix::ffi::OsStrExt;
    std::ffi::CString::new(p.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))
}

/// A system call's result: 0 is `Ok`, anything else the error in `errno`.
#[cfg(target_os = "linux")]
fn os_result(r: libc::c_int) -> std::io::Result<()> {
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Swap two paths in one step (Linux `renameat2` with `RENAME_EXCHANGE`): how a finished
/// output takes the place of an existing file. Renamed over it instead, ext4 first starts
/// writing the whole new file out (its guard for files replaced by rename), 50-100 ms for
/// a 100 MB output. `Err` where the system or file system cannot exchange.
#[cfg(target_os = "linux")]
pub(crate) fn exchange_paths(a: &Path, b: &Path) -> std::io::Result<()> {
    let (a, b) = (c_path(a)?, c_path(b)?);
    // SAFETY: both are NUL-terminated strings that outlive the call.
    let r = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            a.as_ptr(),
            libc::AT_FDCWD,
            b.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    os_result(r)
}

#[cfg(not(target_os = "linux"))]
pub(crate) fn exchange_paths(_: &Path, _: &Path) -> std::io::Result<()> {
    Err(std::io::ErrorKind::Unsupported.into())
}

/// A new file without a name in directory `dir` (Linux `O_TMPFILE`), to be given one by
/// [`link_unnamed`]; `None` where the system or file system has no such files, or no
/// `/proc/self/fd` to link them through.
#[cfg(target_os = "linux")]
pub(crate) fn create_unnamed(dir: &Path) -> Option<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    if !Path::new("/proc/self/fd").is_dir() {
        return None;
    }
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_TMPFILE)
        .open(dir)
        .ok()
}

#[cfg(not(target_os = "linux"))]
pub(crate) fn create_unnamed(_: &Path) -> Option<std::fs::File> {
    None
}

/// Give a file made by [`create_unnamed`] the name `to` (`linkat` of its `/proc/self/fd`
/// link); `Err` of kind `AlreadyExists` when `to` is taken.
#[cfg(target_os = "linux")]
pub(crate) fn link_unnamed(f: &std::fs::File, to: &Path) -> std::io::Result<()> {
    use std::os::unix::io::AsRawFd;
    let from = c_path(Path::new(&format!("/proc/self/fd/{}", f.as_raw_fd())))?;
    let to = c_path(to)?;
    // SAFETY: both are NUL-terminated strings that outlive the call.
    let r = unsafe {
        libc::linkat(
            libc::AT_FDCWD,
            from.as_ptr(),
            libc::AT_FDCWD,
            to.as_ptr(),
            libc::AT_SYMLINK_FOLLOW,
        )
    };
    os_result(r)
}

#[cfg(not(target_os = "linux"))]
pub(crate) fn link_unnamed(_: &std::fs::File, _: &Path) -> std::io::Result<()> {
    Err(std::io::ErrorKind::Unsupported.into())
}

/// A set of CPUs, as `sched_setaffinity` takes it.
#[cfg(target_os = "linux")]
#[derive(Clone, Copy)]
pub(crate) struct CpuSet(libc::cpu_set_t);

/// The calling thread's kernel id and the CPUs it may run on (None where unknown).
#[cfg(target_os = "linux")]
pub(crate) fn this_thread() -> Option<(i32, CpuSet)> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set, which sched_getaffinity fills for
    // the calling thread (0) within its size; gettid takes nothing.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        let r = libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set);
        let tid = libc::syscall(libc::SYS_gettid) as i32;
        (r == 0 && tid > 0).then_some((tid, CpuSet(set)))
    }
}

/// The CPU the calling thread is running on, if the kernel says.
#[cfg(target_os = "linux")]
pub(crate) fn current_cpu() -> Option<usize> {
    // SAFETY: takes nothing, returns a CPU number or -1.
    usize::try_from(unsafe { libc::sched_getcpu() }).ok()
}

/// Let thread `tid` (of this process, alive) run on the CPUs of `allowed` but `cpu`; left
/// as it is when that would leave none. Best effort: an error changes nothing.
#[cfg(target_os = "linux")]
pub(crate) fn keep_off(tid: i32, allowed: &CpuSet, cpu: usize) {
    let mut set = allowed.0;
    if cpu >= libc::CPU_SETSIZE as usize {
        return;
    }
    // SAFETY: `cpu` is below CPU_SETSIZE, so CPU_ISSET and CPU_CLR stay within the set;
    // sched_setaffinity reads size_of::<cpu_set_t>() bytes of it.
    unsafe {
        if !libc::CPU_ISSET(cpu, &set) {
            return;
        }
        libc::CPU_CLR(cpu, &mut set);
        if libc::CPU_COUNT(&set) > 0 {
            libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &set);
        }
    }
}

/// (Tests) the CPUs the calling thread may run on.
#[cfg(all(test, target_os = "linux"))]
pub(crate) fn allowed_cpus() -> Vec<usize> {
    let Some((_, set)) = this_thread() else {
        return Vec::new();
    };
    // SAFETY: every index is below CPU_SETSIZE, within the set.
    (0..libc::CPU_SETSIZE as usize)
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set.0) })
        .collect()
}

#[cfg(not(target_os = "linux"))]
#[derive(Clone, Copy)]
pub(crate) struct CpuSet;

#[cfg(not(target_os = "linux"))]
pub(crate) fn this_thread() -> Option<(i32, CpuSet)> {
    None
}

#[cfg(not(target_os = "linux"))]
pub(crate) fn current_cpu() -> Option<usize> {
    None
}

#[cfg(not(target_os = "linux"))]
pub(crate) fn keep_off(_: i32, _: &CpuSet, _: usize) {}

/// Ask the core to bring the cache line of `r` in, without waiting for it: the next
/// stream's event, decoded on another core, is then there when the merge comes to it.
#[inline(always)]
pub(crate) fn prefetch<T>(r: &T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch reads nothing the program sees, and `r` is a valid reference.
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        _mm_prefetch::<_MM_HINT_T0>((r as *const T).cast::<i8>());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = r;
}
