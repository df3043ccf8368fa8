//! Programs run as children of a bench and timed: the release CLI (built if missing), each
//! run's wall and CPU time and peak RSS from `wait4`; shared by the benches (with `#[path]`).
use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

/// The release CLI beside this bench's executable (built if missing).
pub fn cli() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap().parent().unwrap();
    let bin = dir.join("memtrace-merge");
    if !bin.exists() {
        let st = Command::new(env!("CARGO"))
            .args(["build", "--release", "--bin", "memtrace-merge"])
            .status()
            .unwrap();
        assert!(st.success());
    }
    bin
}

/// One run of a program: its wall time, the CPU time of all its threads (user and system),
/// and its peak RSS in KiB if known.
#[derive(Clone, Copy)]
pub struct Run {
    pub secs: f64,
    pub cpu: f64,
    pub rss: Option<u64>,
}

/// Run `cmd` as a child and wait for it with `wait4` (its stderr said when it fails). The CPU
/// time and peak RSS come from the kernel's accounting of that child, so nothing (no
/// `/usr/bin/time`) runs between the clock and the program timed.
pub fn run_child(cmd: &mut Command) -> Run {
    try_run_child(cmd).unwrap_or_else(|e| panic!("{e}"))
}

/// [`run_child`], a failure returned (what the program was, its exit status, its stderr)
/// rather than a panic: for runs that are checks as much as timings.
// (the child is reaped by `wait4`, which clippy does not see)
#[allow(clippy::zombie_processes)]
pub fn try_run_child(cmd: &mut Command) -> Result<Run, String> {
    use std::io::Read;
    let start = Instant::now();
    let mut child = cmd
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = String::new();
    // (small: the child cannot block on a full pipe before it ends)
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    let mut status = 0;
    // SAFETY: `rusage` is plain data that `wait4` fills; `status` is a valid int.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    let pid = child.id() as libc::pid_t;
    let r = unsafe { libc::wait4(pid, &mut status, 0, &mut ru) };
    let secs = start.elapsed().as_secs_f64();
    assert!(r == pid, "wait4 failed");
    // (`child` is not waited for again: dropping it does not wait)
    let rss = u64::try_from(ru.ru_maxrss).ok().filter(|&k| k > 0);
    if !(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0) {
        let how = if libc::WIFSIGNALED(status) {
            format!("killed by signal {}", libc::WTERMSIG(status))
        } else {
            format!("exit {}", libc::WEXITSTATUS(status))
        };
        let mb = rss.map_or("?".into(), |k| format!("{:.1}", k as f64 / 1024.0));
        return Err(format!(
            "{:?} failed ({how}) after {secs:.2} s, peak RSS {mb} MB: {}",
            cmd.get_program(),
            err.trim_end()
        ));
    }
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    let cpu = tv(ru.ru_utime) + tv(ru.ru_stime);
    Ok(Run { secs, cpu, rss })
}

/// The median of `v` (the upper one of an even count; NaN when empty), sorting it.
pub fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}
