#!/usr/bin/env python3
"""Converts GOAL (GPS-ordered Activity Labels, Amazon Science) into labelled rides (the layout of
Benchmarks/datasets/README.md) for `drivebus-bench checkout`.

GOAL: 805 CSV files (`data_anon/trajectory_NNNN.csv` in `trajectories.zip`), each a chunk of a
delivery driver's phone track: `timestamp,x,y,groundtruth`, a fix about every 5 s, `x,y` in metres
from an arbitrary centre, times from an arbitrary date, and each fix labelled `Driving` or `OnFoot`.
`OnFoot` includes time spent in the parked vehicle: the change from `Driving` to `OnFoot` is the
moment the vehicle stopped for good, labelled fix by fix by the data set's makers.

Positive rides: every `Driving` run of at least 60 s followed by an `OnFoot` run of at least 60 s.
The ride holds the fixes from the first `Driving` fix (the check-in) to the last `OnFoot` fix of
that run (at most 10 minutes after the change); `change` is the first `OnFoot` fix's time.

Negative rides (`change`: null): every `Driving` run of at least 120 s that holds a stop in traffic,
at least 60 s (as long as the fixes rule waits) below 1 m/s between two fixes at driving speed, cut at the run's last fix.

Positions are placed around an arbitrary point (48.0 N, 11.0 E); GOAL has no speed nor accuracy.
A fix whose time does not move forward is left out.

Licence: CC BY 4.0 (github.com/amazon-science/goal-gps-ordered-activity-labels). Cite: Eftelioglu,
Wolff, Nimmagadda, Kumar and Roy Chowdhury, "Deep Classification of Frequently-Changing Activities
from GPS Trajectories", ACM SIGSPATIAL IWCTS 2022.

Usage: python3 goal_rides.py TRAJECTORIES_ZIP_OR_DIR OUT_DIR
"""
import csv, datetime, io, json, math, os, sys, zipfile

MIN_DRIVE_S = 60
MIN_FOOT_S = 60
KEEP_AFTER_S = 600
NEGATIVE_MIN_DRIVE_S = 120
STOP_SPEED_MPS = 1.0
STOP_MIN_S = 60
DRIVING_SPEED_MPS = 5.0
ORIGIN_LAT, ORIGIN_LON = 48.0, 11.0
EARTH_M = 6371000.0


def seconds(text):
    """`1964-01-12 00:00:05.013000011` as seconds since 1970 (negative is fine)."""
    day, clock = text.split(" ")
    h, m, s = clock.split(":")
    date = datetime.date.fromisoformat(day)
    return (date - datetime.date(1970, 1, 1)).days * 86400 + int(h) * 3600 + int(m) * 60 + float(s)


def iso(t):
    whole = math.floor(t)
    ms = int(round((t - whole) * 1000))
    if ms == 1000:
        whole, ms = whole + 1, 0
    stamp = datetime.datetime(1970, 1, 1) + datetime.timedelta(seconds=whole)
    return stamp.strftime("%Y-%m-%dT%H:%M:%S") + ".%03dZ" % ms


def lat_lon(x, y):
    lat = ORIGIN_LAT + math.degrees(y / EARTH_M)
    lon = ORIGIN_LON + math.degrees(x / (EARTH_M * math.cos(math.radians(ORIGIN_LAT))))
    return lat, lon


def read_chunk(text):
    """Fixes (t, x, y, driving) in time order; a fix whose time does not move forward is dropped."""
    fixes = []
    for row in csv.DictReader(io.StringIO(text)):
        t = seconds(row["timestamp"])
        if fixes and t <= fixes[-1][0]:
            continue
        fixes.append((t, float(row["x"]), float(row["y"]), row["groundtruth"] == "Driving"))
    return fixes


def runs(fixes):
    """[start, end) index ranges of equal labels."""
    out, start = [], 0
    for i in range(1, len(fixes) + 1):
        if i == len(fixes) or fixes[i][3] != fixes[start][3]:
            out.append((start, i))
            start = i
    return out


def speed(a, b):
    return math.hypot(b[1] - a[1], b[2] - a[2]) / (b[0] - a[0])


def has_stop(fixes):
    """A stretch of at least STOP_MIN_S between fix pairs under STOP_SPEED_MPS, with driving speed
    both before and after it: a stop in traffic, not the start or the end of the run."""
    steps = [speed(a, b) for a, b in zip(fixes, fixes[1:])]
    i = 0
    while i < len(steps):
        if steps[i] >= STOP_SPEED_MPS:
            i += 1
            continue
        j = i
        while j < len(steps) and steps[j] < STOP_SPEED_MPS:
            j += 1
        long_enough = fixes[j][0] - fixes[i][0] >= STOP_MIN_S
        if long_enough and any(s >= DRIVING_SPEED_MPS for s in steps[:i]) and \
                any(s >= DRIVING_SPEED_MPS for s in steps[j:]):
            return True
        i = j
    return False


def write(out, name, fixes, checkin, change, chunk):
    with open(os.path.join(out, name + ".csv"), "w") as f:
        f.write("time,lat,lon,speed,accuracy\n")
        for t, x, y, _ in fixes:
            lat, lon = lat_lon(x, y)
            f.write("%s,%.7f,%.7f,,\n" % (iso(t), lat, lon))
    with open(os.path.join(out, name + ".label.json"), "w") as f:
        json.dump({"checkin": iso(checkin), "change": iso(change) if change is not None else None,
                   "change_is": "stop", "dataset": "GOAL %s" % chunk, "mode": "car"}, f)
        f.write("\n")


def chunks(source):
    if os.path.isdir(source):
        folder = os.path.join(source, "data_anon") if os.path.isdir(os.path.join(source, "data_anon")) else source
        for name in sorted(os.listdir(folder)):
            if name.endswith(".csv"):
                with open(os.path.join(folder, name)) as f:
                    yield name[:-4], f.read()
    else:
        with zipfile.ZipFile(source) as z:
            for name in sorted(z.namelist()):
                if name.endswith(".csv"):
                    yield os.path.basename(name)[:-4], z.read(name).decode()


def main(source, out):
    os.makedirs(out, exist_ok=True)
    counts = {"positive": 0, "negative": 0, "chunks": 0}
    for chunk, text in chunks(source):
        counts["chunks"] += 1
        fixes = read_chunk(text)
        spans = runs(fixes)
        for k, (a, b) in enumerate(spans):
            if not fixes[a][3]:
                continue
            drive_s = fixes[b - 1][0] - fixes[a][0]
            nxt = spans[k + 1] if k + 1 < len(spans) else None
            number = chunk.rsplit("_", 1)[-1]
            if nxt and drive_s >= MIN_DRIVE_S and fixes[nxt[1] - 1][0] - fixes[nxt[0]][0] >= MIN_FOOT_S:
                change = fixes[nxt[0]][0]
                ride = [f for f in fixes[a:nxt[1]] if f[0] <= change + KEEP_AFTER_S]
                write(out, "goal-%s-%d" % (number, a), ride, fixes[a][0], change, chunk)
                counts["positive"] += 1
            if drive_s >= NEGATIVE_MIN_DRIVE_S and has_stop(fixes[a:b]):
                write(out, "goal-%s-%d-jam" % (number, a), fixes[a:b], fixes[a][0], None, chunk)
                counts["negative"] += 1
    print(json.dumps(counts))


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
