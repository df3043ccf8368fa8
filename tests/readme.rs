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
