#!/usr/bin/env python3
"""Writes the synthetic labelled drives in Tests/Fixtures/drives (the layout of
Benchmarks/datasets/README.md): one driver on one urban route, driven calmly and aggressively.
Physical, not real: the same route (straights, four 90-degree corners of 25 m radius, three
stops at lights); the calm driver accelerates at 1.0 m/s^2, brakes at 1.2 m/s^2, cruises at
13.5 m/s and takes corners at 6 m/s; the aggressive one accelerates at 3.2, brakes at 4.2,
cruises at 17 m/s with swings of +-2 m/s and takes corners at 9 m/s. Phone noise: Doppler speed
+-0.3 m/s, course +-3 degrees, positions with a slowly drifting error of a few metres, and one
speed glitch (a reading of 0 at cruising speed) in each drive. 1 Hz.
Deterministic: python3 synthetic_drives.py OUT_DIR"""
import json, math, random, sys, datetime

ORIGIN = (48.2000, 16.3700)

def latlon(x, y):
    return (ORIGIN[0] + y / 111_320.0, ORIGIN[1] + x / (111_320.0 * math.cos(math.radians(ORIGIN[0]))))

def drive(rng, style, t0):
    accel, brake, cruise, corner_speed, swing = style
    dt = 0.05
    t = x = y = v = 0.0
    heading = 90.0
    rows = []
    ex = ey = 0.0
    next_sample = 1.0
    glitch_at = 100

    def run_until(condition, target, turn_radius=None):
        nonlocal t, x, y, v, heading, next_sample, ex, ey, glitch_at
        while not condition():
            if v < target:
                v = min(target, v + accel * dt)
            elif v > target:
                v = max(target, v - brake * dt)
            if turn_radius and v > 0.5:
                heading += math.degrees(v / turn_radius) * dt
            x += v * math.sin(math.radians(heading)) * dt
            y += v * math.cos(math.radians(heading)) * dt
            t += dt
            if t >= next_sample:
                next_sample += 1.0
                ex = 0.9 * ex + rng.gauss(0, 1.0)
                ey = 0.9 * ey + rng.gauss(0, 1.0)
                lat, lon = latlon(x + ex, y + ey)
                speed = max(0.0, v + rng.gauss(0, 0.3)) if v > 0.2 else 0.0
                glitch_at -= 1
                if glitch_at == 0 and v > 10:
                    speed = 0.0
                course = (heading + rng.gauss(0, 3)) % 360 if v > 1 else ""
                stamp = (t0 + datetime.timedelta(seconds=round(t))).strftime("%Y-%m-%dT%H:%M:%SZ")
                rows.append("%s,%.7f,%.7f,%.2f,%s,%d" % (stamp, lat, lon, speed, "%.1f" % course if course != "" else "", 5))

    def straight(metres, speed):
        nonlocal swing
        start = (x, y)
        travelled = lambda: math.hypot(x - start[0], y - start[1])
        stop_distance = lambda: v * v / (2 * brake) + 2
        target = speed
        k = 0
        while travelled() < metres - stop_distance() - 5:
            k += 1
            wobble = swing * math.sin(k / 3.0)
            run_until(lambda s=t + 3: t >= s, target + wobble)
        return

    def stop(seconds):
        run_until(lambda: v <= 0.01, 0)
        end = t + seconds
        run_until(lambda: t >= end, 0)

    def corner():
        run_until(lambda: v <= corner_speed + 0.05, corner_speed)
        start_heading = heading
        run_until(lambda: heading - start_heading >= 90, corner_speed, turn_radius=25)

    stop(3)
    for leg in range(4):
        straight(600, cruise)
        if leg % 2 == 0:
            stop(20)
        corner()
    straight(400, cruise)
    stop(3)
    return rows

def main(out):
    for behaviour, style, day in [("normal", (1.0, 1.2, 13.5, 6.0, 0.0), 1), ("aggressive", (3.2, 4.2, 17.0, 9.0, 2.0), 2)]:
        rng = random.Random(day)
        t0 = datetime.datetime(2026, 3, day, 9, 0, 0, tzinfo=datetime.timezone.utc)
        rows = drive(rng, style, t0)
        name = "S1-urban-%s" % behaviour
        with open("%s/%s.csv" % (out, name), "w") as f:
            f.write("time,lat,lon,speed,course,accuracy\n" + "\n".join(rows) + "\n")
        with open("%s/%s.label.json" % (out, name), "w") as f:
            json.dump({"driver": "S1", "road": "urban", "behaviour": behaviour, "reference_score": None, "dataset": "synthetic"}, f)
            f.write("\n")

if __name__ == "__main__":
    main(sys.argv[1])
