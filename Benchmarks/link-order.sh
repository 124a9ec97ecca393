#!/usr/bin/env bash
# Writes deploy/link-order/<executable>.txt: the functions each executable runs from its start
# until it rests, in the order it first runs them. Package.swift gives the files to the linker
# (lld's --symbol-ordering-file), which places those functions' sections together at the front of
# the code. Why: the kernel maps an executable's code in 64 KB around every page touched, and
# start-up code scattered through 13 MB kept 9 MB of stats' code resident (README, "Memory at rest").
#
# How: `drivebus up` on the built-in config in a temporary directory, with the disk's read-ahead
# off and the page cache dropped, so that every page of code faults on its own; `perf` records
# every page fault for 25 s, and each fault whose address is its own instruction names a function.
# Pages already mapped hide the functions after the first in them, so it runs six rounds,
# relinking in between, and each round adds what it found to what the files held.
#
# Needs root (the page cache, read-ahead), perf (Debian's linux-perf) and an idle machine.
# Symbols that later vanish from the code are ignored by the linker; rerun after large changes.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${ROUNDS:-6}
executables=(drivebus drivebus-bus drivebus-ingest drivebus-trips drivebus-geofence drivebus-checkout drivebus-scorer drivebus-stats)
device=$(findmnt -no SOURCE --target . | sed 's#/dev/##; s#[0-9]*$##; s#p$##')
readahead=/sys/block/$device/queue/read_ahead_kb
work=$(mktemp -d)
saved=$(cat "$readahead")
restore() { echo "$saved" > "$readahead"; rm -rf "$work"; }
trap restore EXIT
mkdir -p deploy/link-order
# drivebus-mqtt needs a broker, which the built-in config has not: its file stays empty.
for exe in "${executables[@]}" drivebus-mqtt; do touch "deploy/link-order/$exe.txt"; done

for round in $(seq 1 "$rounds"); do
  # The linker does not know these files as inputs: remove the executables to relink them.
  for exe in "${executables[@]}"; do rm -f ".build/release/$exe"; done
  swift build -c release >/dev/null
  release=$(readlink -f .build/release)
  rm -rf "$work/state" && mkdir -p "$work/state"
  echo 0 > "$readahead"
  sync && echo 3 > /proc/sys/vm/drop_caches
  (cd "$work/state" && perf record -q -c 1 -e page-faults -d -a -o "$work/faults.data" -- \
    bash -c "$release/drivebus up > $work/up.log 2>&1 & up=\$!; sleep 25; kill -INT \$up; wait \$up")
  echo "$saved" > "$readahead"
  perf script -i "$work/faults.data" -F addr,ip,sym,dso --no-demangle 2>/dev/null > "$work/faults.txt"
  for exe in "${executables[@]}"; do
    file="deploy/link-order/$exe.txt"
    # Fields: address, its symbol, (its file), instruction pointer, its symbol, (its file).
    awk -v dso="($release/$exe)" '$1 == $4 && $6 == dso && $5 != "[unknown]" { print $5 }' "$work/faults.txt" \
      | cat "$file" - | awk 'NF && !seen[$0]++' > "$work/order" && mv "$work/order" "$file"
    echo "round $round: $exe $(wc -l < "$file") functions"
  done
done
for exe in "${executables[@]}"; do rm -f ".build/release/$exe"; done
swift build -c release >/dev/null
