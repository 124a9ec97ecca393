#!/usr/bin/env python3
"""Converts MobilityNet (UC Berkeley e-mission; github.com/MobilityNet/mobilitynet-analysis-scripts,
`bin/data/`) into labelled rides (the layout of Benchmarks/datasets/README.md) for
`drivebus-bench checkout`.

MobilityNet: scripted trips in the SF Bay Area, each carried out by one tester with eight phones
at once (four Android, four iOS; the spec's `phones` gives each its role). The spec
(`USER/SPEC/config~evaluation_spec/*.json`) lists each trip's legs and their modes. The tester
pressed a button on `ucb-sdb-ios-1` at every section change: its `manual~evaluation_transition`
holds `START_EVALUATION_SECTION`/`STOP_EVALUATION_SECTION` (`trip_id` = the leg's id) with `ts`.
Each phone's fixes are in `PHONE/SPEC/background~location/START_END.json` (one file for each
evaluation period): `data.ts`, `latitude`, `longitude`, `accuracy` (m), `sensed_speed` (m/s).

Positive rides: every section of a leg with mode `CAR` whose next section is a `WALKING` leg
(`freeway_driving_weekday`, `suburb_city_driving_weekend`: the tester parks and walks to the
library). `checkin` is the labelled start of the car section, `change` the labelled start of the
walk (the same button press as the car's end). One ride for every phone that has fixes both in the
car section and after the change: its fixes from the check-in to 10 minutes after the change (the
labelled walk lasts 0.5 to 3 minutes; then the tester is at the library, out of the car).

Negative rides (`change`: null), one for each phone and car section at most: the car section's
start to 2 minutes after the last stop in traffic that the phone's own fixes show inside it (at
least 60 s below 2 m/s, with no silence over 30 s, after at least 500 m of driving, and followed
by at least 400 m of driving, 240 m from the stop, in the next 2 minutes, all before the section
ends), for a phone whose car fixes have a median interval of at most 10 s. The labels say the
tester stayed in the car throughout.

`sensed_speed` is left empty when Android gives 0 (its "no speed": two of the Android phones send
0 for most fixes at driving speed) or iOS gives a negative value (invalid); `accuracy` likewise
when not positive. Fixes whose time does not move forward are left out. Where a phone's
`background~location` file is missing (a git snapshot may lack files of 4 MiB and more), its
`background~filtered_location` file of the same period is used, and the label's dataset says so.
Power-control phones (`-4`) record no fixes. Rides are named
mobilitynet-LEG-YYYYMMDD-HHMM-PHONE (the check-in, UTC; PHONE e.g. ios-2), `-jam` for negatives.

Each ride also gets NAME.motion.csv (`start,activity,confidence`): the phone's activity
recognition samples (`background~motion_activity`) from the check-in to the ride's cut, in time
order, after the one in progress at the check-in (the last within 10 minutes before it); a sample lasts until the next one starts, so a sample repeating the one before (same
activity and confidence) is left out. `activity` is stationary, walking, running, automotive,
cycling or unknown. iOS (CMMotionActivity: `data.ts`, booleans): the first true of running,
walking, cycling, automotive, stationary, unknown (none true: unknown); `confidence` as given.
Android (DetectedActivity, obfuscated: `zzbhB` type, `zzbhC` confidence 0-100, time
`metadata.write_ts`): 0 automotive, 1 cycling, 2 (on foot) and 7 walking, 8 running, 3
stationary, 4 unknown, 5 (tilting) left out; confidence >= 75 high, >= 50 medium, else low.

Licence: the repository's LICENSE is BSD 3-Clause ("Copyright (c) 2019, e-mission"); it states no
separate licence for the data. Keep the extracted data and the rides in a temporary folder, never
commit them. Cite (as the project asks): Shankari, Fuerst, Fadel Argerich, Avramidis and Zhang,
"MobilityNet: Towards a Public Dataset for Multimodal Mobility Research", Climate Change AI
workshop at ICLR 2020.

Usage: python3 mobilitynet_rides.py MOBILITYNET_DIR OUT_DIR
(MOBILITYNET_DIR: the repository's files extracted, e.g. with `git archive`, or its `bin/data/`.
A ride's dataset names the spec, phone, role, sensing configuration, platform and file used.)
"""
import datetime, glob, json, math, os, statistics, sys

from track_geometry import driven, speeds

KEEP_AFTER_S = 600
BEFORE_S = 600         # how far back the motion sample in progress at the check-in is looked for
MAX_MEDIAN_DT_S = 10   # sampling of the car part, for a negative ride
SLOW_MPS = 2.0
SLOW_MIN_S = 60
DRIVE_BEFORE_M = 500
DRIVE_AFTER_M = 400
AFTER_SLOW_S = 120
MAX_HOLE_S = 30

UTC = datetime.timezone.utc


def iso(t):
    whole = math.floor(t)
    ms = min(999, int(round((t - whole) * 1000)))
    return datetime.datetime.fromtimestamp(whole, UTC).strftime("%Y-%m-%dT%H:%M:%S") + ".%03dZ" % ms


def stamp(t):
    return datetime.datetime.fromtimestamp(t, UTC).strftime("%Y%m%d-%H%M")


def load(path):
    with open(path) as f:
        return json.load(f)


def specs(data):
    for path in sorted(glob.glob(os.path.join(data, "*", "*", "config~evaluation_spec", "*.json"))):
        yield load(path)["data"]["label"]


def sections(data, spec_id, phones):
    """(leg id, start, end) of every labelled section of the spec, in time order, from whichever
    phones hold the button presses."""
    presses = []
    for phone in phones:
        for path in glob.glob(os.path.join(data, phone, spec_id, "manual~evaluation_transition", "*.json")):
            presses += [e["data"] for e in load(path) if e["data"].get("spec_id") == spec_id]
    presses.sort(key=lambda p: p["ts"])
    out, open_at = [], {}
    for p in presses:
        if p["transition"] in ("START_EVALUATION_SECTION", 6):
            open_at[p["trip_id"]] = p["ts"]
        elif p["transition"] in ("STOP_EVALUATION_SECTION", 7) and p["trip_id"] in open_at:
            out.append((p["trip_id"], open_at.pop(p["trip_id"]), p["ts"]))
    out.sort(key=lambda s: s[1])
    return out


def sensing(data, phone, spec_id, t):
    """The phone's sensing configuration during its evaluation period holding t: the part after
    ':' of the `START_EVALUATION_PERIOD` trip_id (e.g. `HAMFDC`, `ACCURACY_CONTROL`)."""
    config = "?"
    for path in glob.glob(os.path.join(data, phone, spec_id, "manual~evaluation_transition", "*.json")):
        for p in sorted((e["data"] for e in load(path)), key=lambda p: p["ts"]):
            if p.get("spec_id") == spec_id and p["transition"] in ("START_EVALUATION_PERIOD", 2) and p["ts"] <= t:
                config = p["trip_id"].split(":")[-1]
    return config


def period_file(data, phone, spec_id, key, start, end):
    """The phone's file of `key` whose period (its name) holds [start, end], or None."""
    for path in sorted(glob.glob(os.path.join(data, phone, spec_id, key, "*.json"))):
        first, last = (int(x) for x in os.path.basename(path)[:-5].split("_"))
        if first - 60 <= start and end <= last + 60:
            return path
    return None


def read_fixes(path, platform):
    """(t, lat, lon, speed or None, accuracy or None) in time order, times moving forward."""
    fixes = []
    for e in sorted((e["data"] for e in load(path)), key=lambda d: d["ts"]):
        if fixes and e["ts"] <= fixes[-1][0]:
            continue
        speed, accuracy = e.get("sensed_speed"), e.get("accuracy")
        if speed is not None and (speed < 0 or (platform == "android" and speed == 0)):
            speed = None
        if accuracy is not None and accuracy <= 0:
            accuracy = None
        fixes.append((e["ts"], e["latitude"], e["longitude"], speed, accuracy))
    return fixes


IOS_ACTIVITIES = ("running", "walking", "cycling", "automotive", "stationary", "unknown")
ANDROID_ACTIVITIES = {0: "automotive", 1: "cycling", 2: "walking", 3: "stationary", 4: "unknown", 7: "walking",
                      8: "running"}


def read_motion(data, phone, spec_id, platform, start, end):
    """(t, activity, confidence) of the phone's motion samples in [start, end], in time order,
    repeats left out (see the docstring), after the one in progress at `start` (within 10 min)."""
    samples = []
    for path in glob.glob(os.path.join(data, phone, spec_id, "background~motion_activity", "*.json")):
        first, last = (int(x) for x in os.path.basename(path)[:-5].split("_"))
        if last + 60 < start - BEFORE_S or end < first - 60:
            continue
        for e in load(path):
            d = e["data"]
            if platform == "ios":
                activity = next((a for a in IOS_ACTIVITIES if d.get(a)), "unknown")
                samples.append((d["ts"], activity, d.get("confidence") or "low"))
            elif d.get("zzbhB") in ANDROID_ACTIVITIES:
                c = d.get("zzbhC", 0)
                samples.append((e["metadata"]["write_ts"], ANDROID_ACTIVITIES[d["zzbhB"]],
                                "high" if c >= 75 else "medium" if c >= 50 else "low"))
    samples.sort()
    before = [s for s in samples if start - BEFORE_S <= s[0] < start][-1:]
    out = []
    for sample in before + [s for s in samples if start <= s[0] <= end]:
        if not out or out[-1][1:] != sample[1:]:
            out.append(sample)
    return out


def last_stop_end(points, section_end):
    """End of the last slow stretch (see the docstring) that is followed by driving, or None."""
    v, found, i, n = speeds(points), None, 0, len(points)
    while i < n:
        if v[i] >= SLOW_MPS:
            i += 1
            continue
        j = i
        while j + 1 < n and v[j + 1] < SLOW_MPS and points[j + 1][0] - points[j][0] <= MAX_HOLE_S:
            j += 1
        if points[j][0] - points[i][0] >= SLOW_MIN_S and points[j][0] + AFTER_SLOW_S <= section_end:
            _, before = driven(points, points[0][0], points[i][0])
            path, away = driven(points, points[j][0], points[j][0] + AFTER_SLOW_S)
            if before >= DRIVE_BEFORE_M and path >= DRIVE_AFTER_M and away >= DRIVE_AFTER_M * 0.6:
                found = points[j][0]
        i = j + 1
    return found


def write(out, name, rows, checkin, change, dataset, motion):
    with open(os.path.join(out, name + ".motion.csv"), "w") as f:
        f.write("start,activity,confidence\n")
        f.writelines("%s,%s,%s\n" % (iso(t), activity, confidence) for t, activity, confidence in motion)
    with open(os.path.join(out, name + ".csv"), "w") as f:
        f.write("time,lat,lon,speed,accuracy\n")
        for t, lat, lon, speed, accuracy in rows:
            f.write("%s,%.7f,%.7f,%s,%s\n" % (iso(t), lat, lon, "" if speed is None else "%.2f" % speed,
                                              "" if accuracy is None else "%.1f" % accuracy))
    with open(os.path.join(out, name + ".label.json"), "w") as f:
        json.dump({"checkin": iso(checkin), "change": iso(change) if change is not None else None,
                   "dataset": dataset, "mode": "car"}, f)
        f.write("\n")


def main(data, out):
    if os.path.isdir(os.path.join(data, "bin", "data")):
        data = os.path.join(data, "bin", "data")
    os.makedirs(out, exist_ok=True)
    counts = {"car_sections": 0, "positive": 0, "negative": 0, "filtered_location": 0, "no_fixes": 0,
              "motion_ios": 0, "motion_android": 0}
    for spec in specs(data):
        legs = {leg["id"]: leg["mode"] for trip in spec.get("evaluation_trips", []) for leg in trip["legs"]}
        phones = {name: (platform, role) for platform, group in spec["phones"].items() for name, role in group.items()}
        labelled = sections(data, spec["id"], phones)
        for k, (leg, start, end) in enumerate(labelled):
            walk = labelled[k + 1] if k + 1 < len(labelled) else None
            if legs.get(leg) != "CAR" or walk is None or legs.get(walk[0]) != "WALKING" or walk[1] - end > 5:
                continue
            counts["car_sections"] += 1
            change = walk[1]
            until = change + KEEP_AFTER_S
            if k + 2 < len(labelled):
                until = min(until, labelled[k + 2][1])
            for phone, (platform, role) in sorted(phones.items()):
                source = "background~location"
                path = period_file(data, phone, spec["id"], source, start, until)
                if path is None:
                    source = "background~filtered_location"
                    path = period_file(data, phone, spec["id"], source, start, until)
                fixes = read_fixes(path, platform) if path else []
                car = [f for f in fixes if start <= f[0] < end]
                ride = [f for f in fixes if start <= f[0] <= until]
                if len(car) < 2 or not any(f[0] >= change for f in ride):
                    counts["no_fixes"] += 1
                    continue
                short = phone.replace("ucb-sdb-", "")
                name = "mobilitynet-%s-%s-%s" % (leg.replace("_", "-"), stamp(start), short)
                dataset = "MobilityNet %s %s %s %s (%s, %s)" % (spec["id"], phone, role, sensing(data, phone, spec["id"], start),
                                                              platform, source.split("~")[1])
                motion = read_motion(data, phone, spec["id"], platform, start, until)
                counts["motion_" + platform] += len(motion)
                write(out, name, ride, start, change, dataset, motion)
                counts["positive"] += 1
                if source != "background~location":
                    counts["filtered_location"] += 1
                dts = [b[0] - a[0] for a, b in zip(car, car[1:])]
                if statistics.median(dts) > MAX_MEDIAN_DT_S:
                    continue
                stop = last_stop_end(car, end)
                if stop is not None:
                    cut = stop + AFTER_SLOW_S
                    write(out, name + "-jam", [f for f in car if f[0] <= cut], start, None, dataset,
                          [m for m in motion if m[0] <= cut])
                    counts["negative"] += 1
    print(json.dumps(counts))


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
