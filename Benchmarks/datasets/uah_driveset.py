#!/usr/bin/env python3
"""Converts the UAH-DriveSet (Romera, Bergasa and Arroyo, "Need data for driver behaviour
analysis? Presenting the public UAH-DriveSet", ITSC 2016) into the drives layout of
Benchmarks/datasets/README.md. Licence CC BY-NC 4.0: fetch it into a temporary folder, never
commit it or its conversion.

Each recording folder (D1/20151111125233-24km-D1-AGGRESSIVE-MOTORWAY/) has RAW_GPS.txt, the
phone's 1 Hz GPS: seconds from the start, speed km/h, lat, lon, altitude, vertical accuracy,
horizontal accuracy, course, course change, ... and SEMANTIC_ONLINE.txt, whose last row's fourth
column is the data set's own total score (0-100) for the drive.
The folder name's time (local time in Spain) is taken as UTC: only differences matter.

    python3 uah_driveset.py UAH-DRIVESET-v1 OUT_DIR"""
import datetime, json, os, re, sys

NAME = re.compile(r"^(\d{14})-\d+km-(D\d)-(NORMAL|AGGRESSIVE|DROWSY)\d?-(MOTORWAY|SECONDARY)$")

def convert(root, out):
    os.makedirs(out, exist_ok=True)
    count = 0
    for driver in sorted(os.listdir(root)):
        folder = os.path.join(root, driver)
        if not os.path.isdir(folder):
            continue
        for recording in sorted(os.listdir(folder)):
            match = NAME.match(recording)
            gps = os.path.join(folder, recording, "RAW_GPS.txt")
            if not match or not os.path.exists(gps):
                continue
            start = datetime.datetime.strptime(match.group(1), "%Y%m%d%H%M%S")
            rows = ["time,lat,lon,speed,course,accuracy"]
            with open(gps) as lines:
                for line in lines:
                    f = line.split()
                    if len(f) < 8:
                        continue
                    stamp = start + datetime.timedelta(seconds=float(f[0]))
                    rows.append("%s,%s,%s,%.3f,%s,%s" % (
                        stamp.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z", f[2], f[3],
                        float(f[1]) / 3.6, f[7], f[6]))
            reference = None
            semantic = os.path.join(folder, recording, "SEMANTIC_ONLINE.txt")
            if os.path.exists(semantic):
                last = [l for l in open(semantic) if l.strip()][-1].split()
                reference = float(last[3])
            with open(os.path.join(out, recording + ".csv"), "w") as csv:
                csv.write("\n".join(rows) + "\n")
            with open(os.path.join(out, recording + ".label.json"), "w") as label:
                json.dump({"driver": match.group(2), "road": match.group(4).lower(),
                           "behaviour": match.group(3).lower(), "reference_score": reference,
                           "dataset": "UAH-DriveSet v1 (CC BY-NC 4.0)"}, label)
            count += 1
    print("%d drives written to %s" % (count, out))

if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    convert(sys.argv[1], sys.argv[2])
