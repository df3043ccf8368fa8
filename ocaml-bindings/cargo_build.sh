#!/usr/bin/env bash
# Build the Rust static library for the OCaml bindings. Run by dune (see ./dune) in the build
# directory of ocaml-bindings, with the project root's path relative to it as $1. Runs
# `cargo build --release --lib` in the source tree (cargo's target/ is reused: nothing is built
# twice), then copies the archive here as libmemtrace_merge_rs.a, with a shared copy
# dllmemtrace_merge_rs.so for bytecode, and writes rust_paths.txt (source root, target dir).
set -euo pipefail

rel=${1:?usage: cargo_build.sh PROJECT_ROOT_RELATIVE_TO_HERE}
here=$(pwd -P)

# The source tree: dune gives actions DUNE_SOURCEROOT (the workspace's source root) and
# INSIDE_DUNE (the build context's root, of which this directory is a part).
if [ -n "${MEMTRACE_MERGE_ROOT:-}" ]; then
  root=$MEMTRACE_MERGE_ROOT
elif [ -n "${DUNE_SOURCEROOT:-}" ] && [ -n "${INSIDE_DUNE:-}" ]; then
  context=$(cd "$INSIDE_DUNE" && pwd -P)
  case "$here" in
    "$context") sub= ;;
    "$context"/*) sub=${here#"$context"/} ;;
    *) echo "cargo_build.sh: $here is not inside the build context $context" >&2; exit 1 ;;
  esac
  root=$(cd "$DUNE_SOURCEROOT/$sub/$rel" && pwd -P)
else
  echo "cargo_build.sh: run me from dune (or set MEMTRACE_MERGE_ROOT to the Rust crate's root)" >&2
  exit 1
fi
if [ ! -f "$root/Cargo.toml" ] || [ ! -f "$root/src/ffi.rs" ]; then
  echo "cargo_build.sh: $root is not the memtrace_merge crate (no Cargo.toml, src/ffi.rs)" >&2
  exit 1
fi

target=${CARGO_TARGET_DIR:-$root/target}
case "$target" in /*) ;; *) target=$root/$target ;; esac
CARGO_TARGET_DIR=$target cargo build --quiet --release --lib --manifest-path "$root/Cargo.toml"

cp "$target/release/libmemtrace_merge.a" libmemtrace_merge_rs.a
# Every object of the archive, so that bytecode programs (ocamlrun) can load the C ABI too.
${CC:-cc} -shared -o dllmemtrace_merge_rs.so \
  -Wl,--whole-archive libmemtrace_merge_rs.a -Wl,--no-whole-archive -lpthread -ldl -lm
printf '%s\n%s\n' "$root" "$target" > rust_paths.txt
