use super::*;
use std::ffi::CString;
use std::ptr::{null, null_mut};

type Outcome = (MemtraceMergeStatus, String);

/// Call through `merge_with` with a fake merge that must not be reached.
fn call(
    inputs: &[*const c_char],
    n: usize,
    output: *const c_char,
    options: Option<&MemtraceMergeOptions>,
) -> Outcome {
    call_with(inputs.as_ptr(), n, output, options, |_, _, _| {
        panic!("merge reached")
    })
}

fn call_with<F>(
    inputs: *const *const c_char,
    n: usize,
    output: *const c_char,
    options: Option<&MemtraceMergeOptions>,
    f: F,
) -> Outcome
where
    F: FnOnce(&[PathBuf], &Path, &MergeOptions) -> crate::error::Result<MergeReport>,
{
    let mut buf = [0x55 as c_char; 256];
    let opts = options.map_or(null(), |o| o as *const _);
    let status = unsafe {
        merge_with(
            inputs,
            n,
            output,
            opts,
            null_mut(),
            buf.as_mut_ptr(),
            buf.len(),
            f,
        )
    };
    let msg = unsafe { CStr::from_ptr(buf.as_ptr()) }
        .to_string_lossy()
        .into_owned();
    (status, msg)
}

fn zero_options() -> MemtraceMergeOptions {
    MemtraceMergeOptions {
        struct_size: 0,
        format: 0,
        on_rate_mismatch: 0,
        seed: 0,
        tag_processes: 0,
        skip_bad_inputs: 0,
        pid: 0,
        context: null(),
        cancel: null(),
    }
}

fn assert_bad(o: Outcome, needle: &str) {
    assert_eq!(o.0, MemtraceMergeStatus::BadArguments, "{}", o.1);
    assert!(o.1.contains(needle), "message {:?} lacks {:?}", o.1, needle);
}

#[test]
fn null_and_empty_arguments_are_bad() {
    let a = CString::new("a.ctf").unwrap();
    let out = CString::new("out.ctf").unwrap();
    let empty = CString::new("").unwrap();
    let ins = [a.as_ptr()];
    assert_bad(
        call_with(null(), 1, out.as_ptr(), None, |_, _, _| panic!()),
        "inputs is NULL",
    );
    assert_bad(call(&ins, 0, out.as_ptr(), None), "no inputs");
    assert_bad(
        call(&ins, MEMTRACE_MERGE_MAX_INPUTS + 1, out.as_ptr(), None),
        "more than the limit",
    );
    assert_bad(
        call(&[a.as_ptr(), null()], 2, out.as_ptr(), None),
        "inputs[1] is NULL",
    );
    assert_bad(
        call(&[a.as_ptr(), empty.as_ptr()], 2, out.as_ptr(), None),
        "inputs[1] is an empty string",
    );
    assert_bad(call(&ins, 1, null(), None), "output is NULL");
    assert_bad(
        call(&ins, 1, empty.as_ptr(), None),
        "output is an empty string",
    );
}

#[test]
fn out_of_range_options_are_bad() {
    let a = CString::new("a.ctf").unwrap();
    let out = CString::new("out.ctf").unwrap();
    let ins = [a.as_ptr()];
    for f in [1, 4, u32::MAX] {
        let o = MemtraceMergeOptions {
            format: f,
            ..zero_options()
        };
        assert_bad(call(&ins, 1, out.as_ptr(), Some(&o)), "options->format");
    }
    for r in [2, 7, u32::MAX] {
        let o = MemtraceMergeOptions {
            on_rate_mismatch: r,
            ..zero_options()
        };
        assert_bad(call(&ins, 1, out.as_ptr(), Some(&o)), "on_rate_mismatch");
    }
}

#[test]
fn output_equal_to_an_input_is_bad() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("t.ctf");
    std::fs::write(&f, b"data").unwrap();
    let a = CString::new(f.to_str().unwrap()).unwrap();
    let same = CString::new(format!("{}/./t.ctf", dir.path().display())).unwrap();
    // (refused by the merge itself, a usage error)
    let real =
        |out: *const c_char| call_with([a.as_ptr()].as_ptr(), 1, out, None, crate::merge::merge);
    assert_bad(real(a.as_ptr()), "refusing to overwrite");
    assert_bad(real(same.as_ptr()), "refusing to overwrite");
    assert_eq!(std::fs::read(&f).unwrap(), b"data");
}

#[test]
fn options_are_converted() {
    let a = CString::new("a.ctf").unwrap();
    let out = CString::new("out.ctf").unwrap();
    let ctx = CString::new("ctx \u{e9}").unwrap();
    let o = MemtraceMergeOptions {
        struct_size: std::mem::size_of::<MemtraceMergeOptions>(),
        format: 3,
        on_rate_mismatch: 1,
        seed: 42,
        tag_processes: 7,
        skip_bad_inputs: 1,
        pid: 99,
        context: ctx.as_ptr(),
        cancel: null(),
    };
    let (status, msg) = call_with(
        [a.as_ptr()].as_ptr(),
        1,
        out.as_ptr(),
        Some(&o),
        |i, out, opts| {
            assert_eq!(i, [PathBuf::from("a.ctf")]);
            assert_eq!(out, Path::new("out.ctf"));
            assert_eq!(opts.format, Some(3));
            assert_eq!(opts.rate_mismatch, RateMismatch::Fail);
            assert_eq!(opts.seed, 42);
            assert!(opts.tag_processes && opts.skip_bad_inputs && !opts.progress);
            assert_eq!(opts.pid, Some(99));
            assert_eq!(opts.context.as_deref(), Some("ctx \u{e9}".as_bytes()));
            Ok(MergeReport::default())
        },
    );
    assert_eq!((status, msg.as_str()), (MemtraceMergeStatus::Ok, ""));
    let (status, _) = call_with(
        [a.as_ptr()].as_ptr(),
        1,
        out.as_ptr(),
        None,
        |_, _, opts| {
            assert_eq!(
                (opts.format, opts.pid, opts.context.as_ref()),
                (None, None, None)
            );
            assert_eq!(
                (opts.rate_mismatch, opts.seed, opts.tag_processes),
                (RateMismatch::Thin, 0, false)
            );
            Ok(MergeReport::default())
        },
    );
    assert_eq!(status, MemtraceMergeStatus::Ok);
}

#[cfg(unix)]
#[test]
fn non_utf8_paths_are_accepted() {
    use std::os::unix::ffi::OsStrExt;
    let a = CString::new(b"caf\xe9.ctf".to_vec()).unwrap();
    let out = CString::new(b"\xff.ctf".to_vec()).unwrap();
    let (status, _) = call_with([a.as_ptr()].as_ptr(), 1, out.as_ptr(), None, |i, out, _| {
        assert_eq!(i[0].as_os_str().as_bytes(), b"caf\xe9.ctf");
        assert_eq!(out.as_os_str().as_bytes(), b"\xff.ctf");
        Ok(MergeReport::default())
    });
    assert_eq!(status, MemtraceMergeStatus::Ok);
}

#[test]
fn errors_are_classified_by_their_side() {
    let io = |side| {
        let e = std::io::Error::from(std::io::ErrorKind::NotFound);
        match side {
            Side::Input => Error::input("in/a.ctf", "open", e),
            _ => Error::output("out/o.ctf", "create output", e),
        }
    };
    use MemtraceMergeStatus::*;
    assert_eq!(classify(&io(Side::Input)), InputError);
    assert_eq!(classify(&io(Side::Output)), OutputError);
    assert_eq!(classify(&Error::Usage("u".into())), BadArguments);
    assert_eq!(classify(&Error::Incompatible("i".into())), InputError);
    assert_eq!(classify(&Error::Write("w".into())), OutputError);
    assert_eq!(classify(&Error::Internal("p".into())), InternalError);
    assert_eq!(classify(&Error::Cancelled), Cancelled);
    let m = Error::malformed(
        "dir/a.ctf",
        4,
        Some(0),
        crate::error::Malformed::BadMagic(0),
    );
    assert_eq!(classify(&m), InputError);
}

#[test]
fn a_struct_of_another_size_is_refused() {
    let a = CString::new("a.ctf").unwrap();
    let out = CString::new("out.ctf").unwrap();
    let o = MemtraceMergeOptions {
        struct_size: 8,
        ..zero_options()
    };
    let (status, msg) = call_with(
        [a.as_ptr()].as_ptr(),
        1,
        out.as_ptr(),
        Some(&o),
        |_, _, _| Ok(MergeReport::default()),
    );
    assert_eq!(status, MemtraceMergeStatus::BadArguments);
    assert!(msg.contains("options.struct_size is 8"), "{msg}");
}

#[test]
fn merge_errors_give_status_and_message() {
    let a = CString::new("missing.ctf").unwrap();
    let out = CString::new("/tmp/out.ctf").unwrap();
    let (status, msg) = call_with([a.as_ptr()].as_ptr(), 1, out.as_ptr(), None, |_, _, _| {
        Err(Error::input(
            "missing.ctf",
            "open",
            std::io::Error::from(std::io::ErrorKind::NotFound),
        ))
    });
    assert_eq!(status, MemtraceMergeStatus::InputError);
    assert!(msg.starts_with("missing.ctf: open:"), "{msg}");
}

#[test]
fn panics_become_internal_errors() {
    let a = CString::new("a.ctf").unwrap();
    let out = CString::new("out.ctf").unwrap();
    let (status, msg) = call_with([a.as_ptr()].as_ptr(), 1, out.as_ptr(), None, |_, _, _| {
        panic!("boom {}", 42)
    });
    assert_eq!(status, MemtraceMergeStatus::InternalError);
    assert!(msg.contains("boom 42"), "{msg}");
}

fn input(path: &str, allocs: u64, keep: f64, warnings: &[&str]) -> InputReport {
    InputReport {
        path: path.into(),
        // (the arguments: x.ctf, d, y.ctf)
        arg: ["x.ctf", "d", "y.ctf"]
            .iter()
            .position(|a| path == *a || path.starts_with(&format!("{a}/")))
            .unwrap(),
        pid: 7,
        format: 2,
        sample_rate: 1e-4,
        events: allocs * 2,
        allocs,
        allocs_written: allocs,
        keep_fraction: keep,
        warnings: warnings.iter().map(|s| s.to_string()).collect(),
        ..InputReport::default()
    }
}

#[test]
fn report_is_filled() {
    let names = ["x.ctf", "d", "y.ctf"].map(|s| CString::new(s).unwrap());
    let ins = names.each_ref().map(|c| c.as_ptr());
    let out = CString::new("out.ctf").unwrap();
    let fake = MergeReport {
        inputs: vec![
            input("x.ctf", 10, 1.0, &[]),
            input("d/1.ctf", 20, 0.5, &["d/1.ctf: byte 9: odd"]),
            input("d/2.ctf", 30, 1.0, &[]),
            input("y.ctf", 40, 1.0, &["late"]),
        ],
        format: 3,
        allocs: 85,
        promotes: 5,
        collects: 6,
        remapped_codes: 2,
        warnings: 2,
        ..MergeReport::default()
    };
    let mut per = [MemtraceMergeInputReport::default(); 3];
    let mut report = empty_report(per.as_mut_ptr(), per.len());
    report.allocs = 12345;
    let mut buf = [0 as c_char; 64];
    let status = unsafe {
        merge_with(
            ins.as_ptr(),
            3,
            out.as_ptr(),
            null(),
            &mut report,
            buf.as_mut_ptr(),
            buf.len(),
            |_, _, _| Ok(fake),
        )
    };
    let msg = unsafe { CStr::from_ptr(buf.as_ptr()) }.to_str().unwrap();
    assert_eq!(
        (status, msg),
        (MemtraceMergeStatus::OkWithWarnings, "d/1.ctf: byte 9: odd")
    );
    assert_eq!(
        (
            report.n_inputs,
            report.n_inputs_thinned,
            report.n_inputs_skipped
        ),
        (4, 1, 0)
    );
    assert_eq!(
        (
            report.format,
            report.allocs,
            report.promotes,
            report.collects
        ),
        (3, 85, 5, 6)
    );
    assert_eq!(
        (
            report.remapped_codes,
            report.warnings,
            report.input_allocs,
            report.input_events
        ),
        (2, 2, 100, 200)
    );
    assert_eq!(
        (report.inputs, report.inputs_capacity),
        (per.as_mut_ptr(), 3)
    );
    assert_eq!(per.map(|p| p.arg_index), [0, 1, 1]);
    assert_eq!(
        (
            per[1].allocs,
            per[1].keep_fraction,
            per[1].warnings,
            per[1].pid
        ),
        (20, 0.5, 1, 7)
    );
}

#[test]
fn report_is_zeroed_on_error() {
    let mut per = [MemtraceMergeInputReport::default(); 1];
    let mut report = MemtraceMergeReport {
        allocs: 5,
        warnings: 3,
        ..empty_report(per.as_mut_ptr(), 1)
    };
    let status = unsafe { memtrace_merge(null(), 1, null(), null(), &mut report, null_mut(), 0) };
    assert_eq!(status, MemtraceMergeStatus::BadArguments);
    assert_eq!(
        (report.allocs, report.warnings, report.inputs_capacity),
        (0, 0, 1)
    );
}

#[test]
fn messages_are_truncated_and_terminated() {
    let mut buf = [0x55 as c_char; 8];
    unsafe { copy_message(buf.as_mut_ptr(), 5, "abcdefgh") };
    assert_eq!(unsafe { CStr::from_ptr(buf.as_ptr()) }.to_bytes(), b"abcd");
    assert_eq!(buf[5], 0x55);
    // Cut at a character boundary: "é" is 2 bytes.
    unsafe { copy_message(buf.as_mut_ptr(), 3, "aé") };
    assert_eq!(unsafe { CStr::from_ptr(buf.as_ptr()) }.to_bytes(), b"a");
    unsafe { copy_message(buf.as_mut_ptr(), 1, "abc") };
    assert_eq!(buf[0], 0);
    unsafe { copy_message(null_mut(), 10, "abc") };
    buf[0] = 0x55;
    unsafe { copy_message(buf.as_mut_ptr(), 0, "abc") };
    assert_eq!(buf[0], 0x55);
}

#[test]
fn status_strings_and_version() {
    for s in 0..=6 {
        let t = unsafe { CStr::from_ptr(memtrace_merge_status_string(s)) }
            .to_str()
            .unwrap();
        assert!(!t.is_empty() && t != "unknown status");
    }
    let ok = unsafe {
        CStr::from_ptr(memtrace_merge_status_string(
            MemtraceMergeStatus::OkWithWarnings as c_int,
        ))
    };
    assert!(ok.to_str().unwrap().starts_with("OK_WITH_WARNINGS"));
    for s in [-1, 7, c_int::MAX] {
        let t = unsafe { CStr::from_ptr(memtrace_merge_status_string(s)) };
        assert_eq!(t.to_str().unwrap(), "unknown status");
    }
    let v = unsafe { CStr::from_ptr(memtrace_merge_version()) };
    assert_eq!(v.to_str().unwrap(), env!("CARGO_PKG_VERSION"));
}
