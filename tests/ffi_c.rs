//! A C program (tests/c/merge_test.c) built against include/memtrace_merge.h and the static
//! library, run on the corpus: the C ABI works from C, errors included.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Build the static library with the profile of this test (cargo is a no-op when it is fresh)
/// and return its path, as cargo reports it.
fn static_library() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    // target/<profile>/deps/ffi_c-HASH
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("test binary in target/<profile>/deps");
    let profile = match profile_dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") => "dev",
        Some(p) => p,
        None => "dev",
    };
    let target_dir = profile_dir.parent().expect("target directory");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args([
            "build",
            "--lib",
            "--message-format=json-render-diagnostics",
            "--profile",
            profile,
        ])
        .arg("--manifest-path")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml"))
        .arg("--target-dir")
        .arg(target_dir)
        .output()
        .expect("run cargo build --lib");
    assert!(
        out.status.success(),
        "cargo build --lib failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The compiler-artifact message of this crate lists the files made, the .a among them.
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .rev()
        .find(|l| {
            l.contains("\"reason\":\"compiler-artifact\"")
                && l.contains("\"name\":\"memtrace_merge\"")
        })
        .expect("cargo reported no artifact of memtrace_merge");
    let files = &line[line.find("\"filenames\":[").expect("filenames") + 13..];
    let files = &files[..files.find(']').unwrap()];
    let lib = files
        .split(',')
        .map(|f| f.trim_matches('"'))
        .find(|f| f.ends_with("libmemtrace_merge.a"))
        .unwrap_or_else(|| panic!("no libmemtrace_merge.a among {files}"));
    PathBuf::from(lib)
}

fn host_triple() -> String {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let out = Command::new(rustc).arg("-vV").output().expect("rustc -vV");
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find_map(|l| l.strip_prefix("host: "))
        .expect("host triple")
        .trim()
        .to_string()
}

/// Compile `src` (a C file of tests/c) against the header and the static library into
/// `exe`, warnings as errors.
fn compile_c(src: &str, exe: &Path) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let lib = static_library();
    let triple = host_triple();
    let compiler = cc::Build::new()
        .target(&triple)
        .host(&triple)
        .opt_level(0)
        .cargo_metadata(false)
        .get_compiler();
    let mut cmd = compiler.to_command();
    cmd.args(["-std=c99", "-Wall", "-Wextra", "-Werror", "-g"])
        .arg("-I")
        .arg(root.join("include"))
        .arg(root.join(src))
        .arg("-o")
        .arg(exe)
        .arg(&lib)
        .args(["-lpthread", "-ldl", "-lm"]);
    let out = cmd.output().expect("run the C compiler");
    assert!(
        out.status.success(),
        "compiling {src} failed ({cmd:?}):\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn c_program_merges_and_reports_errors() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let tmp = tempfile::tempdir().unwrap();
    let exe = tmp.path().join("merge_test");
    compile_c("tests/c/merge_test.c", &exe);
    let scratch = tmp.path().join("scratch");
    std::fs::create_dir(&scratch).unwrap();
    let out = Command::new(&exe)
        .arg(root.join("tests/data"))
        .arg(&scratch)
        .output()
        .expect("run merge_test");
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    eprintln!("{}", String::from_utf8_lossy(&out.stderr));
    let failed: Vec<&str> = stdout.lines().filter(|l| l.starts_with("FAILED")).collect();
    assert!(
        out.status.success(),
        "merge_test failed ({}):\n{}",
        out.status,
        failed.join("\n")
    );
}

/// The README's C example (tests/c/example.c, which the README shows whole) compiles
/// without warnings and merges fork/ given as a directory, naming each file.
#[test]
fn the_readme_c_example_merges() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let tmp = tempfile::tempdir().unwrap();
    let exe = tmp.path().join("example");
    compile_c("tests/c/example.c", &exe);
    let merged = tmp.path().join("merged.ctf");
    let fork = root.join("tests/data/fork");
    let out = Command::new(&exe).arg(&merged).arg(&fork).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains(&format!(
            "{}/child-4.ctf: 16499 allocations",
            fork.display()
        )),
        "{stdout}"
    );
    assert!(
        stdout.contains("231910 allocations, 30463 promotions, 223009 collections"),
        "{stdout}"
    );
    let out = Command::new(&exe).arg(&merged).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
}
