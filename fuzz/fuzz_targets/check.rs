//! Arbitrary bytes as a trace: the reader, `check`, `dump` and `summary` must end in `Ok` or a
//! clean `Err` (never a panic, a hang or a huge allocation).
#![no_main]

use libfuzzer_sys::fuzz_target;
use memtrace_merge::tools::{check, dump, summary};
use memtrace_merge::Reader;

fuzz_target!(|data: &[u8]| {
    if let Ok(mut r) = Reader::new(data, "fuzz.ctf") {
        let rep = check::check(&mut r, &check::CheckOptions::default()).expect("no I/O errors");
        if rep.reader_error {
            assert!(!rep.problems.is_empty());
        }
    }
    if let Ok(mut r) = Reader::new(data, "fuzz.ctf") {
        let _ = dump::dump(&mut r, &mut std::io::sink(), |_| {});
    }
    if let Ok(mut r) = Reader::new(data, "fuzz.ctf") {
        let _ = summary::summarize(&mut r);
    }
    // without backtraces, too (the merge's scan and `info` paths skip them)
    if let Ok(mut r) = Reader::new(data, "fuzz.ctf") {
        r.set_parse_backtraces(false);
        while let Ok(Some(_)) = r.next_event() {}
    }
});
