import DrivebusGeo
import DrivebusRoadLimits
import Foundation

/// The configuration as the hot path needs it. Out-of-range values are clamped here, so even a
/// configuration that skipped `validate()` cannot crash the scorer or put NaN in its state.
struct Tuning: Sendable {
    let halfWindow: Double
    let maxGap: Double
    let maxAccuracy: Double
    /// Magnitudes: braking is compared as −a.
    let brake: Double
    let accel: Double
    let corner: Double
    let cornerMargin: Double
    let cornerMinSpeed: Double
    let release: Double
    let episodeGap: Double
    let tolerance: Double
    let speedingMinDuration: Double
    let globalLimit: Double?
    let zones: [Zone]
    /// The roads' posted limits, when an index has been imported; set by `DriveScorer`.
    let roads: RoadLimitIndex?
    let roadClassLimits: [RoadClass: Double]
    let hasLimits: Bool
    let historyCapacity: Int
    let minDistanceKm: Double
    let minDurationS: Double
    let calmVariation: Double
    let weights: ScorerConfiguration.Weights

    /// Headings below this speed are noise (course from a nearly still phone).
    static let minHeadingSpeed = 2.0
    /// Reported or derived speeds above this are glitches (360 km/h).
    static let maxSpeed = 100.0
    /// Fixes further apart than this are not differentiated (see `sparseAcceleration`).
    static let maxSparseIntervalS = 15.0
    /// How wrong the distance between two fixes seconds apart may be, metres.
    static let sparseDistanceNoiseM = 3.0
    /// A harsh episode needs estimates standing for this long: two fixes at 1 Hz, one sparse
    /// interval. A single noisy sample never makes an event.
    static let minEpisodeSupportS = 1.5
    /// Speeds from positions alone are taken over at least this long (see `derivedSpeed`).
    static let derivedSpeedBaseS = 5.0
    /// Positions closer than this give no direction worth comparing with the course.
    static let minTrackStepM = 3.0
    /// More fixes than this within one smoothing window (over 85 Hz at 3 s) are thinned.
    static let maxWindowSamples = 256

    init(_ c: ScorerConfiguration, roads: RoadLimitIndex? = nil) {
        func clamp(_ value: Double, _ low: Double, _ high: Double, _ fallback: Double) -> Double {
            value.isFinite ? min(max(value, low), high) : fallback
        }
        halfWindow = clamp(c.smoothingWindowS, 0.5, 60, 3) / 2
        maxGap = clamp(c.maxGapS, 0.1, 86_400, 15)
        maxAccuracy = c.maxAccuracyM.isNaN ? 100 : max(c.maxAccuracyM, 0)
        brake = clamp(-c.harshBrakeMps2, 0.1, 100, 1.8)
        accel = clamp(c.harshAccelMps2, 0.1, 100, 1.8)
        corner = clamp(c.harshCornerMps2, 0.1, 100, 3.9)
        cornerMargin = clamp(c.cornerMargin, 0.1, 100, 1.2)
        cornerMinSpeed = clamp(c.cornerMinSpeedMps, 0, 100, 8)
        release = clamp(c.releaseFraction, 0.01, 1, 0.75)
        episodeGap = clamp(c.episodeGapS, 0, 86_400, 3)
        tolerance = clamp(c.speedingTolerance, 1, 3, 1.1)
        speedingMinDuration = clamp(c.speedingMinDurationS, 0, 86_400, 3)
        globalLimit = c.speedLimitKmh.flatMap { $0.isFinite && $0 > 0 ? $0 : nil }
        zones = c.zoneSpeedLimits.compactMap(Zone.init)
        self.roads = roads
        roadClassLimits = Dictionary(
            c.roadClassLimitsKmh.compactMap { name, kmh in
                RoadClass(highway: name).flatMap { kmh.isFinite && kmh > 0 ? ($0, kmh) : nil }
            }, uniquingKeysWith: min)
        hasLimits = globalLimit != nil || !zones.isEmpty || roads != nil
        historyCapacity = min(max(c.historyFixes, 16), 1_000_000)
        minDistanceKm = clamp(c.scoreMinDistanceKm, 0.001, 1_000_000, 10)
        minDurationS = clamp(c.scoreMinDurationS, 1, 1_000_000, 600)
        calmVariation = clamp(c.speedVariationCalmMps2, 0, 100, 0.25)
        var w = c.weights
        w.harshBrake = clamp(w.harshBrake, 0, 1_000_000, 1)
        w.harshAccel = clamp(w.harshAccel, 0, 1_000_000, 1)
        w.harshCorner = clamp(w.harshCorner, 0, 1_000_000, 1)
        w.speedingSPerH = clamp(w.speedingSPerH, 0, 1_000_000, 0.05)
        w.speedVariation = clamp(w.speedVariation, 0, 1_000_000, 6)
        weights = w
    }

    /// The lateral acceleration beyond which a corner is harsh at `speed` (m/s): `corner_margin`
    /// times what road design allows there, g × (superelevation 0.06 + side friction), the side
    /// friction falling from 0.28 at 30 km/h to 0.12 at 110 km/h; never above `harsh_corner_mps2`.
    /// A ramp taken at the speed its curve was built for stays under it at any speed.
    func cornerThreshold(speed: Double) -> Double {
        let kmh = speed * 3.6
        let sideFriction = min(max(0.28 - 0.002 * (kmh - 30), 0.12), 0.28)
        return min(corner, cornerMargin * 9.80665 * (0.06 + sideFriction))
    }

    /// The lowest limit of the zones containing a position.
    func zoneLimit(lat: Double, lon: Double) -> Double? {
        var best: Double?
        for zone in zones where zone.contains(lat: lat, lon: lon) {
            best = min(best ?? zone.limit, zone.limit)
        }
        return best
    }

    struct Zone: Sendable {
        let limit: Double
        let shape: Shape

        enum Shape: Sendable {
            case circle(lat: Double, lon: Double, metresPerDegreeLon: Double, radiusSquared: Double)
            case polygon(GeoPolygon, minLat: Double, maxLat: Double)
        }

        init?(_ zone: DrivebusGeo.Zone) {
            guard let limit = zone.speedLimitKmh, limit.isFinite, limit > 0 else { return nil }
            self.limit = limit
            switch zone.shape {
            case .polygon(let vertices):
                guard vertices.count >= 3, vertices.allSatisfy({ abs($0.lat) <= 90 && abs($0.lon) <= 180 }) else { return nil }
                let lats = vertices.map(\.lat)
                shape = .polygon(GeoPolygon(vertices), minLat: lats.min() ?? -90, maxLat: lats.max() ?? 90)
            case .circle(let center, let radius):
                guard abs(center.lat) <= 90, abs(center.lon) <= 180, radius.isFinite, radius > 0 else { return nil }
                shape = .circle(
                    lat: center.lat, lon: center.lon,
                    metresPerDegreeLon: Kinematics.metresPerDegree * cos(center.lat * .pi / 180),
                    radiusSquared: radius * radius)
            }
        }

        func contains(lat: Double, lon: Double) -> Bool {
            switch shape {
            case .circle(let zLat, let zLon, let perLon, let radiusSquared):
                let y = (lat - zLat) * Kinematics.metresPerDegree
                let x = Kinematics.longitudeDelta(lon - zLon) * perLon
                return x * x + y * y <= radiusSquared
            case .polygon(let polygon, let minLat, let maxLat):
                return lat >= minLat && lat <= maxLat && polygon.contains(Coordinate(lat: lat, lon: lon))
            }
        }
    }
}

/// Flat-earth geometry between consecutive fixes, metres apart: accurate enough there and much
/// cheaper than haversine on the hot path.
enum Kinematics {
    static let metresPerDegree = Geo.earthRadiusM * .pi / 180

    @inline(__always)
    static func longitudeDelta(_ delta: Double) -> Double {
        abs(delta) <= 180 ? delta : Geo.normalizedLongitudeDelta(delta)
    }

    /// Metres east and north from `a` to `b`.
    @inline(__always)
    static func offset(fromLat aLat: Double, lon aLon: Double, toLat bLat: Double, lon bLon: Double) -> (x: Double, y: Double) {
        let y = (bLat - aLat) * metresPerDegree
        let x = longitudeDelta(bLon - aLon) * metresPerDegree * cos((aLat + bLat) * (.pi / 360))
        return (x, y)
    }
}
