#!/usr/bin/env bash
# Builds the OwnTracks Recorder for `drivebus-bench system --otrecorder PATH`, the peer the whole
# system is compared with. Its source is not part of this repository: get owntracks/recorder
# yourself and pass its folder. Built as the README's figures were: -O2, HTTP on (MQTT is turned
# off at run time with --port 0), no time-zone lookup, reverse geocoding off at run time
# (--norevgeo). Needs Debian's liblmdb-dev libconfig-dev libcurl4-openssl-dev libmosquitto-dev
# uuid-dev.
set -euo pipefail
src=${1:?usage: build-otrecorder.sh RECORDER_SOURCE_DIR}
cd "$src"
cp config.mk.in config.mk
sed -i 's|^WITH_TZ ?= yes|WITH_TZ ?= no|; s|^STORAGEDEFAULT = .*|STORAGEDEFAULT = /tmp/ot-recorder-store|' config.mk
# The Makefile adds its defines to CFLAGS, so the optimisation goes into its first line.
grep -q -- '-O2' Makefile || sed -i '0,/^CFLAGS\t+= /s//CFLAGS\t+= -O2 /' Makefile
make clean >/dev/null
make -j"$(nproc)" >/dev/null
echo "$src/ot-recorder"
