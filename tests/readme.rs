//! The README's examples are the files the tests build: its OCaml example is
//! ocaml-bindings/examples/fork_and_merge.ml (built by ocaml-bindings/test-install.sh) and its
//! C example tests/c/example.c (built and run by tests/ffi_c.rs), each shown whole.

use std::path::Path;

/// The code blocks of `lang` in the README's section `heading`.
fn blocks(heading: &str, lang: &str) -> Vec<String> {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
    let section = readme
        .split("\n## ")
        .find(|s| s.starts_with(heading))
        .unwrap_or_else(|| panic!("no section {heading}"));
    let fence = format!("```{lang}\n");
    section
        .split(&fence)
        .skip(1)
        .map(|b| b.split("```").next().unwrap().to_string())
        .collect()
}

fn file(p: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(p)).unwrap()
}

#[test]
fn the_ocaml_example_is_the_file_ci_builds() {
    let b = blocks("From OCaml", "ocaml");
    assert_eq!(b.len(), 1, "{b:?}");
    assert_eq!(b[0], file("ocaml-bindings/examples/fork_and_merge.ml"));
}

#[test]
fn the_c_example_is_the_file_ci_builds() {
    let b = blocks("From C", "c");
    assert_eq!(b.len(), 1, "{b:?}");
    assert_eq!(b[0], file("tests/c/example.c"));
}

/// The key paths of a JSON value (`a.b[].c`), arrays taken as their elements.
fn key_paths(v: &serde_json::Value, at: &str, out: &mut std::collections::BTreeSet<String>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, x) in m {
                let p = format!("{at}.{k}");
                out.insert(p.clone());
                key_paths(x, &p, out);
            }
        }
        serde_json::Value::Array(a) => a.iter().for_each(|x| key_paths(x, &format!("{at}[]"), out)),
        _ => {}
    }
}

/// The README's `top --json` example has the keys `top --json` writes, no more, no fewer.
#[test]
fn the_json_schema_in_the_readme_is_what_top_writes() {
    let b = blocks("Where the memory goes", "json");
    assert_eq!(b.len(), 1, "{b:?}");
    let documented: serde_json::Value = serde_json::from_str(&b[0]).unwrap();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_memtrace-merge"))
        .args(["top", "--json", "-n", "1"])
        .arg(root.join("tests/data/external.ctf"))
        .output()
        .unwrap();
    assert!(out.status.success());
    let written: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let (mut a, mut b) = Default::default();
    key_paths(&documented, "", &mut a);
    key_paths(&written, "", &mut b);
    assert_eq!(a, b);
}
