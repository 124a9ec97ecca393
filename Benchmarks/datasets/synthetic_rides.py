#!/usr/bin/env python3
"""Writes the synthetic labelled rides in Tests/Fixtures/checkout-rides (the layout of
Benchmarks/datasets/README.md). Physical, not real: a taxi that accelerates and brakes at
1.5-2.5 m/s^2, a jam of stop-and-go with GPS drift, a rider who pays, walks at 1.2-1.5 m/s and
waits at a crossing, a courier who steps across the road to a door and back; positions carry a random walk of GPS error (5-8 m) with fresh noise on top.
Deterministic: python3 synthetic_rides.py OUT_DIR"""
import json, math, random, sys, datetime

ORIGIN = (48.2000, 16.3700)
T0 = datetime.datetime(2026, 5, 4, 17, 0, 0, tzinfo=datetime.timezone.utc)

def latlon(x, y):
    lat = ORIGIN[0] + y / 111_320.0
    lon = ORIGIN[1] + x / (111_320.0 * math.cos(math.radians(ORIGIN[0])))
    return lat, lon

def iso(t):
    return (T0 + datetime.timedelta(seconds=t)).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"

class Phone:
    """Samples a true path at an interval with correlated GPS error."""
    def __init__(self, rng, interval, speed_reported):
        self.rng, self.interval, self.speed_reported = rng, interval, speed_reported
        self.ex = self.ey = 0.0
        self.rows = []
    def sample(self, t, x, y, v):
        self.ex = 0.9 * self.ex + self.rng.gauss(0, 1.5)
        self.ey = 0.9 * self.ey + self.rng.gauss(0, 1.5)
        lat, lon = latlon(x + self.ex + self.rng.gauss(0, 1), y + self.ey + self.rng.gauss(0, 1))
        speed = "" if not self.speed_reported else "%.2f" % max(0.0, v + self.rng.gauss(0, 0.3) if v > 0.3 else 0.0)
        self.rows.append("%s,%.7f,%.7f,%s,%d" % (iso(t), lat, lon, speed, self.rng.choice([5, 6, 8, 10])))

def simulate(phases, phone, dt=0.1):
    """phases: (duration, target speed m/s, heading deg); speed changes at <= 2 m/s^2."""
    t = x = y = v = 0.0
    next_sample = 0.0
    for duration, target, heading in phases:
        end = t + duration
        while t < end:
            dv = max(-2.0 * dt, min(2.0 * dt, target - v))
            v = max(0.0, v + dv)
            x += v * math.cos(math.radians(heading)) * dt
            y += v * math.sin(math.radians(heading)) * dt
            t += dt
            if t >= next_sample:
                phone.sample(t, x, y, v)
                next_sample += phone.interval
    return t

def write(out, name, phone, checkin, change, change_is=None, motion=()):
    with open("%s/%s.csv" % (out, name), "w") as f:
        f.write("time,lat,lon,speed,accuracy\n" + "\n".join(phone.rows) + "\n")
    if motion:
        with open("%s/%s.motion.csv" % (out, name), "w") as f:
            f.write("start,activity,confidence\n" + "".join("%s,%s,%s\n" % (iso(t), a, c) for t, a, c in motion))
    label = {"checkin": iso(checkin), "change": iso(change) if change is not None else None,
             "dataset": "synthetic", "mode": "taxi"}
    if change_is:
        label["change_is"] = change_is
    with open("%s/%s.label.json" % (out, name), "w") as f:
        json.dump(label, f)
        f.write("\n")

def main(out):
    rng = random.Random(17)
    # 1: 1 Hz, speed reported; ride with lights, stop, pay 40 s, walk with a 20 s wait.
    phone = Phone(rng, 1.0, True)
    ride = [(30, 1.3, 90), (5, 0, 90), (120, 13, 0), (20, 0, 0), (150, 11, 90), (40, 0, 90)]
    change = sum(d for d, _, _ in ride)  # out of the taxi once paid: the walk begins
    simulate(ride + [(60, 1.4, 180), (20, 0, 180), (120, 1.3, 200)], phone)
    write(out, "ride-1hz-pay-and-walk", phone, 35, change)
    # 2: every 5 s, no speed; a stop-and-go jam with drift, the ride resumes, then the walk.
    phone = Phone(rng, 5.0, False)
    jam = []
    for _ in range(8):
        jam += [(25, 0, 0), (8, 3.5, 0)]
    ride = [(200, 12, 0)] + jam + [(180, 14, 0), (30, 0, 0)]
    change = sum(d for d, _, _ in ride)
    simulate(ride + [(300, 1.35, 270)], phone)
    write(out, "ride-5s-jam-then-walk", phone, 0, change)
    # 3: 1 Hz, speed reported; the ride ends in a long queue at lights: no walk in the file. The
    # phone says automotive, and walking for 40 s while the rider shifts in the seat.
    phone = Phone(rng, 1.0, True)
    ride = [(240, 12, 0), (90, 0, 0), (6, 2.5, 0), (80, 0, 0), (6, 2.5, 0), (60, 0, 0)]
    simulate(ride, phone)
    motion = [(5, "automotive", "high"), (280, "walking", "medium"), (320, "automotive", "high")]
    write(out, "ride-ends-in-queue", phone, 0, None, motion=motion)
    # 4: every 5 s, no speed; a courier's van: labelled when it stopped (as GOAL labels), the
    # driver sits 20 s, walks 25 m across the road to a door, waits and walks back.
    phone = Phone(rng, 5.0, False)
    ride = [(150, 12, 90), (12, 0, 90)]
    stop = sum(d for d, _, _ in ride)
    simulate(ride + [(20, 0, 0), (19, 1.3, 0), (40, 0, 0), (19, 1.3, 180), (30, 0, 180)], phone)
    write(out, "ride-5s-courier-steps-aside", phone, 0, stop - 6, "stop")

if __name__ == "__main__":
    main(sys.argv[1])
