#!/usr/bin/env python3
"""Converts Microsoft GeoLife GPS Trajectories 1.3 into labelled rides (the layout of
Benchmarks/datasets/README.md) for `drivebus-bench checkout`.

GeoLife: Data/NNN/Trajectory/*.plt (6 header lines, then `lat,lon,0,altitude_ft,days,date,time`,
GMT) and, for the users who labelled transport modes, Data/NNN/labels.txt (`Start Time<TAB>End
Time<TAB>Transportation Mode`, GMT, e.g. `2008/04/02 11:24:21`).

Positive rides: every labelled `taxi` or `car` interval that is immediately followed (the next
label of that user starts at most 120 s after the car/taxi end) by a `walk` interval of at least
60 s. The ride holds the user's points from the car/taxi start to the walk end, at most 10 minutes
after the walk start; `checkin` is the labelled car/taxi start, `change` the labelled walk start.
Car/taxi intervals followed by another mode or by nothing are skipped.

Negative rides (`change`: null): a car/taxi interval of at least 10 minutes, not followed by a
walk, that holds a stretch of at least 60 s below 2 m/s (speed from positions, over about 10 s; no
hole over 30 s) after at least 500 m of driving, and followed by driving again (at least 400 m
of path and 240 m from the stop in the next 2 minutes, inside the interval): a jam or lights. The
ride is the interval's start to 2 minutes after the slow stretch ends; at most one per interval,
and the first 3 of each user.

A ride is kept only when its points during the car part have a median interval <= 10 s (and, for
a positive ride, there are points after the change). GeoLife has no speed nor accuracy: both
columns are left empty. A ride another user's folder already gave (same times, same points: some
folders share tracks and labels) is written once. Rides are named geolife-USER-YYYYMMDDHHMMSS
(the car/taxi start).

Licence: Microsoft Research licence (non-commercial use only, no distribution of the data or of
derivative works): fetch into a temporary folder, never commit.
Cite: Zheng et al., WWW 2009; UbiComp 2008; IEEE Data Eng. Bull. 33(2), 2010.

Usage: python3 geolife_rides.py GEOLIFE_DATA_DIR OUT_DIR
(GEOLIFE_DATA_DIR is the folder holding 000 ... 181, i.e. `Geolife Trajectories 1.3/Data`.)
"""
import bisect, datetime, glob, json, os, statistics, sys

from track_geometry import driven, speeds

GAP_S = 120            # car/taxi end -> walk start
MIN_WALK_S = 60        # shortest labelled walk
WALK_KEEP_S = 600      # how much of the walk to keep
MAX_MEDIAN_DT_S = 10   # sampling of the car part
NEG_MIN_CAR_S = 600    # shortest car/taxi interval for a negative ride
SLOW_MPS = 2.0
SLOW_MIN_S = 60
DRIVE_BEFORE_M = 500   # driving before the slow stretch (displacement)
DRIVE_AFTER_M = 400    # driving in the AFTER_SLOW_S after it (path; displacement >= 60 % of it)
MAX_NEG_PER_USER = 3   # a few negatives per user, the earliest ones
AFTER_SLOW_S = 120
MAX_HOLE_S = 30        # no hole in the points longer than this inside a slow stretch

UTC = datetime.timezone.utc


def epoch(text, fmt):
    return int(datetime.datetime.strptime(text, fmt).replace(tzinfo=UTC).timestamp())


def iso(t):
    return datetime.datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def stamp(t):
    return datetime.datetime.fromtimestamp(t, UTC).strftime("%Y%m%d%H%M%S")


def read_labels(path):
    labels = []
    with open(path) as f:
        next(f, None)
        for line in f:
            parts = line.rstrip("\r\n").split("\t")
            if len(parts) < 3:
                continue
            start = epoch(parts[0].strip(), "%Y/%m/%d %H:%M:%S")
            end = epoch(parts[1].strip(), "%Y/%m/%d %H:%M:%S")
            labels.append((start, end, parts[2].strip().lower()))
    labels.sort()
    return labels


def read_points(user_dir):
    """All points of a user, sorted by time, one per second (the first one kept)."""
    seen = {}
    for plt in sorted(glob.glob(os.path.join(user_dir, "Trajectory", "*.plt"))):
        with open(plt) as f:
            for _ in range(6):
                next(f, None)
            for line in f:
                parts = line.strip().split(",")
                if len(parts) < 7:
                    continue
                try:
                    t = epoch(parts[5] + " " + parts[6], "%Y-%m-%d %H:%M:%S")
                    lat, lon = float(parts[0]), float(parts[1])
                except ValueError:
                    continue
                if t not in seen:
                    seen[t] = (t, lat, lon)
    return [seen[t] for t in sorted(seen)]


def between(points, times, start, end):
    return points[bisect.bisect_left(times, start):bisect.bisect_right(times, end)]


def median_interval(points):
    if len(points) < 2:
        return None
    return statistics.median(b[0] - a[0] for a, b in zip(points, points[1:]))


def slow_stretch(points):
    """(start, end) of the first stretch >= SLOW_MIN_S below SLOW_MPS with no hole > MAX_HOLE_S,
    after >= DRIVE_BEFORE_M of driving, and followed by driving (>= DRIVE_AFTER_M in the
    AFTER_SLOW_S that follow, and at least as far from where it stopped)."""
    v = speeds(points)
    i, n = 0, len(points)
    while i < n:
        if v[i] < SLOW_MPS:
            j = i
            while j + 1 < n and v[j + 1] < SLOW_MPS and points[j + 1][0] - points[j][0] <= MAX_HOLE_S:
                j += 1
            if points[j][0] - points[i][0] >= SLOW_MIN_S:
                _, before = driven(points, points[0][0], points[i][0])
                path, away = driven(points, points[j][0], points[j][0] + AFTER_SLOW_S)
                if before >= DRIVE_BEFORE_M and path >= DRIVE_AFTER_M and away >= DRIVE_AFTER_M * 0.6:
                    return points[i][0], points[j][0]
            i = j + 1
            continue
        i += 1
    return None


def write(out, name, rows, checkin, change, user, mode, written):
    """Writes a ride, unless another user already gave the same one (some users' folders share
    tracks and labels, e.g. 153 and 163, 126 and 167). Says whether it wrote."""
    key = (checkin, change, tuple(rows))
    if key in written:
        return False
    written.add(key)
    with open(os.path.join(out, name + ".csv"), "w") as f:
        f.write("time,lat,lon,speed,accuracy\n")
        for t, lat, lon in rows:
            f.write("%s,%.6f,%.6f,,\n" % (iso(t), lat, lon))
    with open(os.path.join(out, name + ".label.json"), "w") as f:
        json.dump({"checkin": iso(checkin), "change": iso(change) if change is not None else None,
                   "dataset": "GeoLife 1.3 user %s" % user, "mode": mode}, f)
        f.write("\n")
    return True


def main(data, out):
    os.makedirs(out, exist_ok=True)
    negatives, written = {}, set()
    counts = {"positive": 0, "negative": 0, "duplicate": 0, "not_followed_by_walk": 0, "sparse": 0, "no_points": 0}
    for label_path in sorted(glob.glob(os.path.join(data, "*", "labels.txt"))):
        user_dir = os.path.dirname(label_path)
        user = os.path.basename(user_dir)
        labels = read_labels(label_path)
        cars = [i for i, l in enumerate(labels) if l[2] in ("taxi", "car")]
        if not cars:
            continue
        points = read_points(user_dir)
        times = [p[0] for p in points]
        for i in cars:
            start, end, mode = labels[i]
            name = "geolife-%s-%s" % (user, stamp(start))
            car_part = between(points, times, start, end)
            nxt = labels[i + 1] if i + 1 < len(labels) else None
            if nxt and nxt[2] == "walk" and 0 <= nxt[0] - end <= GAP_S and nxt[1] - nxt[0] >= MIN_WALK_S:
                walk_start = nxt[0]
                rows = between(points, times, start, min(nxt[1], walk_start + WALK_KEEP_S))
                dt = median_interval(car_part)
                if dt is None or not any(p[0] >= walk_start for p in rows):
                    counts["no_points"] += 1
                elif dt > MAX_MEDIAN_DT_S:
                    counts["sparse"] += 1
                elif write(out, name, rows, start, walk_start, user, mode, written):
                    counts["positive"] += 1
                else:
                    counts["duplicate"] += 1
                continue
            counts["not_followed_by_walk"] += 1
            if end - start < NEG_MIN_CAR_S:
                continue
            dt = median_interval(car_part)
            if dt is None or dt > MAX_MEDIAN_DT_S:
                continue
            if negatives.get(user, 0) >= MAX_NEG_PER_USER:
                continue
            slow = slow_stretch(car_part)
            if slow is None or slow[1] + AFTER_SLOW_S > end:
                continue
            if not write(out, name, between(points, times, start, slow[1] + AFTER_SLOW_S), start, None, user, mode, written):
                counts["duplicate"] += 1
                continue
            counts["negative"] += 1
            negatives[user] = negatives.get(user, 0) + 1
    print(json.dumps(counts))


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python3 geolife_rides.py GEOLIFE_DATA_DIR OUT_DIR")
    main(sys.argv[1], sys.argv[2])
