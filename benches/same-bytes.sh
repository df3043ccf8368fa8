#!/usr/bin/env bash
# Whether two builds of memtrace-merge write the same bytes: the merges of tests/data/fork/,
# of the bench's generated sets (target/bench-data, from `cargo bench --bench merge`) and
# the format-3, tagged, thinned and OCaml 5 cases, each by both, their sha256 compared.
# For changes that must not change what a merge writes (restructuring, speed).
# Usage: benches/same-bytes.sh OLD_BINARY NEW_BINARY
set -euo pipefail
old=${1:?usage: same-bytes.sh OLD_BINARY NEW_BINARY} new=${2:?}
root=$(cd "$(dirname "$0")/.." && pwd -P)
d=$root/tests/data
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cases=(
  "fork|$d/fork"
  "fork-v3|--format 3 $d/fork"
  "multidomain-fork-tagged-v3|--format 3 --tag-processes $d/v3/multidomain.ctf $d/fork"
  "thinned|$d/fork $d/rates/slow.ctf"
  "ocaml5-v3|--format 3 $d/ocaml5/perdomain.ctf $d/v3/single.ctf"
  "ocaml5-handover-v2|--format 2 $d/ocaml5/handover/fork5 $d/ocaml5/handover/many.ctf"
  "single-input|$d/fork/child-4.ctf"
)
for set in "$root"/target/bench-data/*/; do
  [ -d "$set" ] && cases+=("$(basename "$set")|$set")
done
status=0
for c in "${cases[@]}"; do
  name=${c%%|*} args=${c#*|}
  # shellcheck disable=SC2086
  "$old" merge -q --no-warnings -o "$work/old.ctf" $args
  # shellcheck disable=SC2086
  "$new" merge -q --no-warnings -o "$work/new.ctf" $args
  a=$(sha256sum < "$work/old.ctf" | cut -c1-16) b=$(sha256sum < "$work/new.ctf" | cut -c1-16)
  if [ "$a" = "$b" ]; then
    echo "same      $a  $name"
  else
    echo "DIFFERENT $a $b  $name"
    status=1
  fi
done
exit $status
