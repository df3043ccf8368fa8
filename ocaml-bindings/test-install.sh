#!/usr/bin/env bash
# The three ways an OCaml user gets the library, each from the files of this checkout, each
# building examples/check_totals.ml natively and as bytecode and merging tests/data/fork/:
#   1. in this workspace (dune exec);
#   2. vendored as a subdirectory of another dune project;
#   3. built as opam builds it (dune build -p memtrace_merge @install, offline: cargo has no
#      network and no registry, only the crates of memtrace_merge.opam's extra-sources, which
#      opam would fetch), installed with dune install --prefix, then used from a separate
#      project through OCAMLPATH (dune, and ocamlfind) with the stub library in stublibs.
# Usage: ocaml-bindings/test-install.sh [SCRATCH_DIR]   (run by ./test.sh)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd -P)
if [ -n "${1:-}" ]; then
  work=$1
else
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
fi
mkdir -p "$work"
work=$(cd "$work" && pwd -P)
fork=$root/tests/data/fork
totals="231910 30463 223009"

step() { printf '\n--- %s\n' "$*"; }

# A checkout's files (tracked and new, not ignored) copied to $1; from a tree that is no
# git checkout (test-ocaml5.sh's copy), all but build outputs.
copy_checkout() {
  mkdir -p "$1"
  if git -C "$root" rev-parse --is-inside-work-tree > /dev/null 2>&1; then
    (cd "$root" && git ls-files -co --exclude-standard -z | xargs -0 tar cf -) | tar xf - -C "$1"
  else
    (cd "$root" && tar cf - --exclude=./_build --exclude=./target .) |
      tar xf - -C "$1"
  fi
}

# A dune project in $1 with check_totals as main, linked native and as bytecode ($2: byte or
# byte_complete).
consumer() {
  mkdir -p "$1"
  echo '(lang dune 2.9)' > "$1/dune-project"
  cp "$root/ocaml-bindings/examples/check_totals.ml" "$1/main.ml"
  printf '(executable\n (name main)\n (modes native %s)\n (libraries memtrace_merge))\n' "$2" \
    > "$1/dune"
}

step "1. this workspace: dune exec"
(
  cd "$root"
  for exe in check_totals.exe check_totals.bc.exe; do
    # shellcheck disable=SC2086
    dune exec --no-print-directory ./ocaml-bindings/examples/$exe -- \
      "$fork" "$work/workspace-$exe.ctf" $totals
  done
)

step "2. vendored in another dune project"
rm -rf "$work/vendoring"
consumer "$work/vendoring" byte_complete
copy_checkout "$work/vendoring/vendor/memtrace-merge"
(
  cd "$work/vendoring"
  # (the vendored crate builds into its own target/, as it would in a user's project)
  env -u CARGO_TARGET_DIR dune build ./main.exe ./main.bc.exe 2>&1
  # shellcheck disable=SC2086
  ./_build/default/main.exe "$fork" "$work/vendored-native.ctf" $totals
  # shellcheck disable=SC2086
  ./_build/default/main.bc.exe "$fork" "$work/vendored-byte.ctf" $totals
)

step "3. built as opam builds it (offline), installed, used through OCAMLPATH"
rm -rf "$work/package" "$work/prefix" "$work/installed" "$work/cargo-home"
copy_checkout "$work/package"
mkdir -p "$work/package/ocaml-bindings/crates" "$work/cargo-home"
# What opam's extra-sources would fetch: from cargo's download cache, else from crates.io.
while read -r name version sum; do
  file=$work/package/ocaml-bindings/crates/$name-$version.crate
  cached=$(ls "${CARGO_HOME:-$HOME/.cargo}"/registry/cache/*/"$name-$version.crate" 2>/dev/null |
    head -1 || true)
  if [ -n "$cached" ]; then
    cp "$cached" "$file"
  else
    curl -fsSL -o "$file" "https://static.crates.io/crates/$name/$name-$version.crate"
  fi
  echo "$sum  $file" | sha256sum -c --quiet
done < "$root/ocaml-bindings/crates.txt"
(
  cd "$work/package"
  # (no registry, no network: the build must come from the crates above)
  CARGO_HOME=$work/cargo-home CARGO_NET_OFFLINE=true env -u CARGO_TARGET_DIR \
    dune build -p memtrace_merge @install 2>&1
  dune install --prefix "$work/prefix" memtrace_merge > /dev/null 2>&1
)
test -f "$work/prefix/lib/stublibs/dllmemtrace_merge_rs.so"
consumer "$work/installed" byte
(
  cd "$work/installed"
  export OCAMLPATH=$work/prefix/lib
  # (bytecode finds the stub library in stublibs, as opam's ld.conf would have it, when
  # linked and when run)
  export CAML_LD_LIBRARY_PATH=$work/prefix/lib/stublibs
  dune build ./main.exe ./main.bc 2>&1
  # shellcheck disable=SC2086
  ./_build/default/main.exe "$fork" "$work/installed-native.ctf" $totals
  # shellcheck disable=SC2086
  ocamlrun ./_build/default/main.bc "$fork" "$work/installed-byte.ctf" $totals
  # (through ocamlfind too, where it is this compiler's)
  if [ "$(ocamlfind ocamlopt -version 2>/dev/null)" = "$(ocamlopt -version)" ]; then
    ocamlfind ocamlopt -package memtrace_merge -linkpkg main.ml -o main-findlib.exe 2>&1
    # shellcheck disable=SC2086
    ./main-findlib.exe "$fork" "$work/installed-findlib.ctf" $totals
  else
    echo "no ocamlfind for $(ocamlopt -version): the ocamlfind build is not tried"
  fi
)
step "4. the README's example, examples/fork_and_merge.ml, on the installed library"
rm -rf "$work/example"
mkdir -p "$work/example"
echo '(lang dune 2.9)' > "$work/example/dune-project"
cp "$root/ocaml-bindings/examples/fork_and_merge.ml" "$work/example/"
printf '(executable\n (name fork_and_merge)\n (libraries memtrace memtrace_merge unix))\n' \
  > "$work/example/dune"
(
  cd "$work/example"
  # memtrace as installed where MEMTRACE_OCAMLPATH says (or findlib finds it), else the
  # stand-in of its signature: built, not run
  export OCAMLPATH=$work/prefix/lib${MEMTRACE_OCAMLPATH:+:$MEMTRACE_OCAMLPATH}
  if ocamlfind query memtrace > /dev/null 2>&1; then
    real=yes
  else
    real=
    cp -r "$root/ocaml-bindings/examples/standin" memtrace
  fi
  dune build ./fork_and_merge.exe 2>&1
  if [ -n "$real" ]; then
    mkdir -p run && cd run
    ../_build/default/fork_and_merge.exe
    cli=$root/target/release/memtrace-merge
    if [ -x "$cli" ]; then
      "$cli" check merged.ctf
      "$cli" compare merged.ctf run.ctf run.ctf.*.ctf
    fi
  else
    echo "memtrace is not installed: fork_and_merge.ml built against the stand-in, not run"
  fi
)

step "the three ways work"
