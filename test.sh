#!/usr/bin/env bash
# The whole test suite, as CI runs it (.ci/run): the Rust crate (library, command line, C ABI
# and its header), the OCaml bindings (dune), then formatting and lints.
# Needs cargo, a C compiler, and OCaml 4.13 with dune 2.9 and findlib (Debian: ocaml-nox
# ocaml-dune ocaml-findlib). Usage: ./test.sh
set -euo pipefail
cd "$(dirname "$0")"

step() { printf '\n=== %s\n' "$*"; }

step cargo build --release
cargo build --release
step cargo test --release
cargo test --release
step dune build
dune build 2>&1
step dune test
# --force: run the OCaml tests even when dune has them cached from an earlier run.
dune test --force 2>&1
step OCaml library: in this workspace, vendored, installed as opam builds it
bash ocaml-bindings/test-install.sh
step OCaml 5.3 "(when a build of it is at hand)"
bash ocaml-bindings/test-ocaml5.sh
step cargo fmt --check
cargo fmt --check
step cargo doc: every public item documented, no broken links
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --quiet
step cargo clippy --all-targets -- -D warnings
cargo clippy --all-targets -- -D warnings
step all tests passed
