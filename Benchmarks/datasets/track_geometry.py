"""Distances and speeds along a track of (time in seconds, lat, lon, ...) points, for the ride
converters (geolife_rides.py, mobilitynet_rides.py). Standard library only."""
import math


def metres(a, b):
    lat1, lon1, lat2, lon2 = map(math.radians, (a[1], a[2], b[1], b[2]))
    h = math.sin((lat2 - lat1) / 2) ** 2 + math.cos(lat1) * math.cos(lat2) * math.sin((lon2 - lon1) / 2) ** 2
    return 2 * 6371000.0 * math.asin(math.sqrt(min(1.0, h)))


def speeds(points, half=5):
    """Speed at each point over the points within +-half seconds (at least its neighbours)."""
    out = []
    n = len(points)
    for i, p in enumerate(points):
        j = i
        while j > 0 and p[0] - points[j - 1][0] <= half:
            j -= 1
        k = i
        while k < n - 1 and points[k + 1][0] - p[0] <= half:
            k += 1
        j, k = (max(0, i - 1) if j == i else j), (min(n - 1, i + 1) if k == i else k)
        dt = points[k][0] - points[j][0]
        out.append(metres(points[j], points[k]) / dt if dt > 0 else 0.0)
    return out


def driven(points, start, end):
    """Path length and straight-line displacement of the points between two times."""
    part = [p for p in points if start <= p[0] <= end]
    if len(part) < 2:
        return 0.0, 0.0
    return sum(metres(a, b) for a, b in zip(part, part[1:])), metres(part[0], part[-1])
