//! The committed C header include/memtrace_merge.h is what cbindgen makes of src/capi.rs with
//! cbindgen.toml; `BLESS=1 cargo test --test ffi_header` rewrites it instead of comparing.

use std::path::Path;

#[test]
fn header_is_up_to_date() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(root.join("cbindgen.toml")).expect("cbindgen.toml");
    let bindings = cbindgen::Builder::new()
        .with_config(config)
        .with_src(root.join("src/capi.rs"))
        .generate()
        .expect("cbindgen failed on src/capi.rs");
    let mut generated = Vec::new();
    bindings.write(&mut generated);
    let generated = String::from_utf8(generated).expect("header is UTF-8");
    let path = root.join("include/memtrace_merge.h");
    if std::env::var_os("BLESS").is_some_and(|v| v == "1") {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, &generated).unwrap();
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    if committed != generated {
        let line = committed
            .lines()
            .zip(generated.lines())
            .position(|(a, b)| a != b);
        panic!(
            "include/memtrace_merge.h is out of date with src/capi.rs (first difference at line {}); \
             regenerate it with: BLESS=1 cargo test --test ffi_header",
            line.map_or_else(|| "end".to_string(), |l| (l + 1).to_string())
        );
    }
}
