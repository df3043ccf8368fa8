#!/usr/bin/env bash
# Build the Rust static library for the OCaml bindings. Run by dune (see ./dune) in the build
# directory of ocaml-bindings, with the project root's path relative to it as $1. Runs
# `cargo build --release --lib --no-default-features` (the library alone: no command-line
# parser) in the source tree, reusing cargo's target/; or, where opam fetched the crates into
# ./crates, builds the library offline from them. Then copies the archive here as
# libmemtrace_merge_rs.a, with a shared copy dllmemtrace_merge_rs.so for bytecode, and writes
# rust_paths.txt (source root, target dir).
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
if [ ! -f "$root/Cargo.toml" ] || [ ! -f "$root/src/capi.rs" ]; then
  echo "cargo_build.sh: $root is not the memtrace_merge crate (no Cargo.toml, src/capi.rs)" >&2
  exit 1
fi

target=${CARGO_TARGET_DIR:-$root/target}
case "$target" in /*) ;; *) target=$root/$target ;; esac
crates=$root/ocaml-bindings/crates
if compgen -G "$crates/*.crate" > /dev/null; then
  # Offline, as opam builds (its sandbox has no network): the crates opam fetched (the
  # extra-sources of memtrace_merge.opam, listed in crates.txt) unpacked as a directory
  # source, and a manifest of the library alone, so that cargo resolves nothing else (the
  # crate's own manifest also names the command line's and the tests' crates).
  work=$here/rust-offline
  rm -rf "$work"
  mkdir -p "$work/vendor"
  deps=
  while read -r name version sum; do
    file=$crates/$name-$version.crate
    if [ ! -f "$file" ] || [ "$(sha256sum < "$file" | cut -d' ' -f1)" != "$sum" ]; then
      echo "cargo_build.sh: $file is missing or not the crate Cargo.lock names" >&2
      exit 1
    fi
    tar xzf "$file" -C "$work/vendor"
    printf '{"files":{},"package":"%s"}' "$sum" > "$work/vendor/$name-$version/.cargo-checksum.json"
    deps+="$name = \"=$version\""$'\n'
  done < "$root/ocaml-bindings/crates.txt"
  version=$(awk -F'"' '/^version = / { print $2; exit }' "$root/Cargo.toml")
  {
    printf '[package]\nname = "memtrace_merge"\nversion = "%s"\nedition = "2021"\n\n' "$version"
    printf '[lib]\npath = "%s/src/lib.rs"\ncrate-type = ["staticlib"]\n\n' "$root"
    printf '[dependencies]\n%s\n' "$deps"
    printf '[profile.release]\npanic = "unwind"\ncodegen-units = 1\n\n'
    # (a workspace of its own: not the build tree's copy of the crate's manifest above it)
    printf '[workspace]\n'
  } > "$work/Cargo.toml"
  CARGO_TARGET_DIR=$work/target cargo build --quiet --release --offline \
    --manifest-path "$work/Cargo.toml" \
    --config 'source.crates-io.replace-with="offline"' \
    --config "source.offline.directory=\"$work/vendor\""
  target=$work/target
else
  CARGO_TARGET_DIR=$target cargo build --quiet --release --lib --no-default-features \
    --manifest-path "$root/Cargo.toml"
fi

cp "$target/release/libmemtrace_merge.a" libmemtrace_merge_rs.a
# Every object of the archive, so that bytecode programs (ocamlrun) can load the C ABI too.
${CC:-cc} -shared -o dllmemtrace_merge_rs.so \
  -Wl,--whole-archive libmemtrace_merge_rs.a -Wl,--no-whole-archive -lpthread -ldl -lm
printf '%s\n%s\n' "$root" "$target" > rust_paths.txt
