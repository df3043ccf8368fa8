//! The opam package builds offline from the crates its opam file lists (extra-sources):
//! those must be exactly the crates Cargo.lock gives the library, at their versions and
//! checksums. `ocaml-bindings/opam-crates.sh --check` regenerates both lists and compares.

use std::path::Path;
use std::process::Command;

#[test]
fn the_opam_files_name_the_crates_of_cargo_lock() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = Command::new("bash")
        .arg(root.join("ocaml-bindings/opam-crates.sh"))
        .arg("--check")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // (and the generated opam file carries the template)
    let opam = std::fs::read_to_string(root.join("memtrace_merge.opam")).unwrap();
    let template = std::fs::read_to_string(root.join("memtrace_merge.opam.template")).unwrap();
    assert!(
        opam.ends_with(&template),
        "memtrace_merge.opam: run dune build"
    );
    let crates = std::fs::read_to_string(root.join("ocaml-bindings/crates.txt")).unwrap();
    for line in crates.lines() {
        let mut f = line.split(' ');
        let (name, version, sum) = (f.next().unwrap(), f.next().unwrap(), f.next().unwrap());
        assert!(
            template.contains(&format!("{name}-{version}.crate"))
                && template.contains(&format!("sha256={sum}")),
            "{line}"
        );
    }
}

/// The check fails when Cargo.lock moves on: a copy of the files with another checksum.
#[test]
fn a_stale_crate_list_fails_the_check() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    for f in ["Cargo.toml", "Cargo.lock", "memtrace_merge.opam.template"] {
        std::fs::copy(root.join(f), d.join(f)).unwrap();
    }
    std::fs::create_dir_all(d.join("ocaml-bindings")).unwrap();
    std::fs::create_dir_all(d.join("src/bin/memtrace-merge")).unwrap();
    std::fs::write(d.join("src/lib.rs"), "").unwrap();
    std::fs::write(d.join("src/bin/memtrace-merge/main.rs"), "fn main() {}").unwrap();
    std::fs::copy(
        root.join("ocaml-bindings/opam-crates.sh"),
        d.join("ocaml-bindings/opam-crates.sh"),
    )
    .unwrap();
    let crates = std::fs::read_to_string(root.join("ocaml-bindings/crates.txt")).unwrap();
    let check = || {
        Command::new("bash")
            .arg(d.join("ocaml-bindings/opam-crates.sh"))
            .arg("--check")
            .env("CARGO_TARGET_DIR", d.join("target"))
            .output()
            .unwrap()
    };
    std::fs::write(d.join("ocaml-bindings/crates.txt"), &crates).unwrap();
    let strip_benches = std::fs::read_to_string(d.join("Cargo.toml"))
        .unwrap()
        .split("\n[[bench]]")
        .next()
        .unwrap()
        .to_string();
    std::fs::write(d.join("Cargo.toml"), strip_benches).unwrap();
    let ok = check();
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let stale = crates.replacen(
        &crates[crates.find(' ').unwrap()..crates.find('\n').unwrap()],
        " 0.0.1 0000",
        1,
    );
    std::fs::write(d.join("ocaml-bindings/crates.txt"), stale).unwrap();
    let bad = check();
    assert!(!bad.status.success());
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("crates.txt disagrees with Cargo.lock"),
        "{}",
        String::from_utf8_lossy(&bad.stderr)
    );
}
