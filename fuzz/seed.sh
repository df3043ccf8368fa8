#!/usr/bin/env bash
# Build the seed corpora of the fuzz targets from the real traces in tests/data:
#   corpus/check: every trace whole, plus its first 64 KiB and 16 KiB (cut inside a packet);
#   corpus/merge: pairs "A SEP B" of 32 KiB prefixes and of the small traces whole.
# Usage: fuzz/seed.sh   (then: RUSTC_BOOTSTRAP=1 cargo fuzz run check corpus/check -- ...)
set -euo pipefail
cd "$(dirname "$0")"
data=../tests/data
mkdir -p corpus/check corpus/merge
sep=$'\n--memtrace-merge-fuzz-split--\n'
mapfile -t traces < <(cd "$data" && find . -name '*.ctf' -not -path './fuzz/*' | sort)
for t in "${traces[@]}"; do
  n=$(echo "${t#./}" | tr '/' '_')
  cp "$data/$t" "corpus/check/$n"
  size=$(stat -c %s "$data/$t")
  if [ "$size" -gt 65536 ]; then head -c 65536 "$data/$t" >"corpus/check/$n.64k"; fi
  head -c 16384 "$data/$t" >"corpus/check/$n.16k"
  head -c 32768 "$data/$t" >"corpus/merge/$n.32k.tmp"
done
# pairs: each 32 KiB prefix with the next trace's (a ring), and a few whole small traces
mapfile -t parts < <(ls corpus/merge/*.tmp)
for i in "${!parts[@]}"; do
  a=${parts[$i]}
  b=${parts[$(((i + 1) % ${#parts[@]}))]}
  { cat "$a"; printf '%s' "$sep"; cat "$b"; } >"corpus/merge/pair-$i"
done
small=(rates/slow.ctf bytecode-location-overflow.ctf v3/bytecode-location-overflow.ctf)
for a in "${small[@]}"; do
  for b in "${small[@]}"; do
    { cat "$data/$a"; printf '%s' "$sep"; cat "$data/$b"; } \
      >"corpus/merge/whole-$(echo "$a-$b" | tr '/' '_')"
  done
done
rm -f corpus/merge/*.tmp
echo "check: $(ls corpus/check | wc -l) seeds; merge: $(ls corpus/merge | wc -l) seeds"
