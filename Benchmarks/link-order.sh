#!/usr/bin/env bash
# Writes deploy/link-order/<executable>.txt: the functions each executable runs from its start
# until it rests (the first round's in the order they first ran, each later round's after them).
# Package.swift gives the files to the linker (lld's --symbol-ordering-file), which places those
# functions' sections together at the front of the code. Why: the kernel maps an executable's code
# in 64 KB around every page touched, and start-up code scattered through 13 MB kept 9 MB of stats'
# code resident (docs/performance.md, "Memory at rest").
#
# How: `drivebus up` on the built-in config and one phone in a temporary directory, with the
# disk's read-ahead off and the page cache dropped, so that every page of code faults on its own;
# `perf` records every page fault for the first 25 s or so (not the stop), and each fault whose
# address is its own instruction names a function.
# Pages already mapped hide the functions after the first in them, so it runs six rounds,
# relinking in between, and each round adds what it found to what the files held.
#
# Needs root (the page cache, read-ahead), perf (Debian's linux-perf) and an idle machine.
# Symbols that later vanish from the code are ignored by the linker, and new code is only placed
# as before: rerun after large changes, and commit the lists.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${ROUNDS:-6}
executables=(drivebus drivebus-bus drivebus-ingest drivebus-trips drivebus-geofence drivebus-checkout drivebus-scorer drivebus-stats drivebus-mqtt)
# Run under sudo, the build and the lists stay the user's.
as_user=()
[ -n "${SUDO_USER:-}" ] && as_user=(sudo -u "$SUDO_USER")
work=$(mktemp -d)
up=
saved=
readahead=
broker=
restore() {
  [ -n "$up" ] && kill -KILL "$up" 2>/dev/null
  [ -n "$broker" ] && kill "$broker" 2>/dev/null
  [ -n "$saved" ] && echo "$saved" > "$readahead"
  rm -rf "$work"
}
trap restore EXIT
# The read-ahead of the disk that holds the build (a partition's is its disk's).
disk=/sys/dev/block/$(findmnt -no MAJ:MIN --target . | tr -d " ")
[ -e "$disk/partition" ] && disk=$disk/..
readahead=$disk/queue/read_ahead_kb
[ -w "$readahead" ] || { echo "link-order: no read-ahead setting at $readahead (root needed)" >&2; exit 1; }
saved=$(cat "$readahead")
"${as_user[@]}" mkdir -p deploy/link-order
for exe in "${executables[@]}"; do "${as_user[@]}" touch "deploy/link-order/$exe.txt"; done

# The built-in config with a phone, as every home has one, and the MQTT bridge with Home
# Assistant on a Mosquitto of its own (deploy/setup --with-broker installs it).
echo "devices: [{id: phone, token: link-order-$RANDOM$RANDOM$RANDOM}]" > "$work/drivebus.yaml"
port=$((20000 + RANDOM % 20000))
printf 'listener %s 127.0.0.1\nallow_anonymous true\nuser root\nlog_dest file %s/mosquitto.log\n' "$port" "$work" > "$work/mosquitto.conf"
mosquitto -c "$work/mosquitto.conf" &
broker=$!
echo "mqtt: {broker: \"127.0.0.1:$port\", home_assistant: {discovery_prefix: homeassistant}}" >> "$work/drivebus.yaml"

for round in $(seq 1 "$rounds"); do
  # The linker does not know these files as inputs: remove the executables to relink them.
  for exe in "${executables[@]}"; do rm -f ".build/release/$exe"; done
  "${as_user[@]}" swift build -c release >/dev/null
  release=$(readlink -f .build/release)
  rm -rf "$work/state" && mkdir -p "$work/state"
  echo 0 > "$readahead"
  sync && echo 3 > /proc/sys/vm/drop_caches
  # Start to rest only: the recording ends before the system is stopped.
  perf record -q -c 1 -e page-faults -d -a -o "$work/faults.data" -- sleep 27 &
  recording=$!
  until [ -s "$work/faults.data" ]; do sleep 0.1; done
  (cd "$work/state" && exec "$release/drivebus" up --config "$work/drivebus.yaml" > "$work/up.log" 2>&1) &
  up=$!
  wait "$recording"
  kill -INT "$up"
  timeout 30 tail --pid="$up" -f /dev/null || kill -KILL "$up"
  up=
  echo "$saved" > "$readahead"
  perf script -i "$work/faults.data" -F addr,ip,sym,dso --no-demangle 2>/dev/null > "$work/faults.txt"
  for exe in "${executables[@]}"; do
    file="deploy/link-order/$exe.txt"
    # Fields: address, its symbol, (its file), instruction pointer, its symbol, (its file).
    awk -v dso="($release/$exe)" '$1 == $4 && $6 == dso && $5 != "[unknown]" { print $5 }' "$work/faults.txt" \
      | cat "$file" - | awk 'NF && !seen[$0]++' > "$work/order" && cat "$work/order" > "$file"
    echo "round $round: $exe $(wc -l < "$file") functions"
  done
done
for exe in "${executables[@]}"; do rm -f ".build/release/$exe"; done
"${as_user[@]}" swift build -c release >/dev/null
