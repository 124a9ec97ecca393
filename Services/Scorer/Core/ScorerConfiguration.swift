import DrivebusRoadLimits
import DrivebusGeo
import Foundation

/// Everything the scorer can be tuned with: the `scorer:` section of the YAML file, one key per
/// property in snake_case (see `CodingKeys`). Missing keys keep their defaults. The thresholds and
/// their published sources are in docs/scoring.md.
public struct ScorerConfiguration: Sendable, Equatable, Codable {
    /// `harsh_brake_mps2`: negative, as fitted from the phone's speeds over `smoothing_window_s`
    /// (which sees less than an accelerometer's peak); calibrated on real drives in docs/scoring.md.
    public var harshBrakeMps2 = -1.8
    /// `harsh_accel_mps2`: likewise.
    public var harshAccelMps2 = 1.8
    /// `harsh_corner_mps2`: lateral; 3.9 m/s² is 0.40 g. The most a corner is allowed at any
    /// speed (see `corner_margin`).
    public var harshCornerMps2 = 3.9
    /// `corner_margin`: a corner is harsh beyond this multiple of the lateral acceleration road
    /// design allows at the speed driven (docs/scoring.md).
    public var cornerMargin = 1.2
    /// `corner_min_speed_mps`: below it, heading changes are manoeuvring, not cornering.
    public var cornerMinSpeedMps = 8.0
    /// `speed_limit_kmh`: the limit outside every zone; `nil` means none.
    public var speedLimitKmh: Double? = nil
    /// `speeding_tolerance`: speeding starts above limit × tolerance (Traccar's overspeed rule)
    /// and ends at or below the limit itself.
    public var speedingTolerance = 1.1
    /// `speeding_min_duration_s`: shorter speeding episodes still add to `speeding_s` but are not
    /// events.
    public var speedingMinDurationS = 3.0
    /// `zone_speed_limits`: normally filled from the top-level `zones[]` that have a
    /// `speed_limit_kmh`. Inside a zone its limit replaces the global one; inside several, the
    /// lowest applies.
    public var zoneSpeedLimits: [Zone] = []
    /// `road_class_limits_kmh`: limits for roads matched from the speed-limit index that have no
    /// `maxspeed` tagged, by OSM class (`{residential: 50, motorway: 130}`). Empty (off) by
    /// default: an implicit limit is a guess, and a guess should not cost points unasked.
    public var roadClassLimitsKmh: [String: Double] = [:]
    /// `smoothing_window_s`: speed and heading are fitted by least squares over the fixes within
    /// ±window/2 of each fix. 3 s holds three fixes at 1 Hz.
    public var smoothingWindowS = 3.0
    /// `max_gap_s`: a longer silence between fixes starts a new segment; nothing is differentiated
    /// across it. Phones on the road often record every 5–10 s.
    public var maxGapS = 15.0
    /// `max_accuracy_m`: fixes reported less accurate than this are left out.
    public var maxAccuracyM = 100.0
    /// `episode_gap_s`: an episode that resumes within this time after releasing is the same episode.
    public var episodeGapS = 3.0
    /// `release_fraction`: a harsh episode ends when the value falls below threshold × fraction.
    public var releaseFraction = 0.75
    /// `score_min_distance_km`: events per 100 km are counted over at least this distance, so one
    /// event on a 2 km hop does not count as 50 per 100 km.
    public var scoreMinDistanceKm = 10.0
    /// `score_min_duration_s`: speeding seconds per hour are counted over at least this time.
    public var scoreMinDurationS = 600.0
    /// `speed_variation_calm_mps2`: speed variation up to this costs no points.
    public var speedVariationCalmMps2 = 0.25
    /// `weights`: score points lost per unit (see docs/scoring.md).
    public var weights = Weights()
    /// `history_fixes`: per-device fixes remembered to attribute work to a trip that is announced
    /// after it began or ended. 2048 is 34 min at 1 Hz.
    public var historyFixes = 2048

    public struct Weights: Sendable, Equatable, Codable {
        /// `harsh_brake`: points per harsh brake per 100 km.
        public var harshBrake = 1.0
        /// `harsh_accel`: points per harsh acceleration per 100 km.
        public var harshAccel = 1.0
        /// `harsh_corner`: points per harsh corner per 100 km.
        public var harshCorner = 1.0
        /// `speeding_s_per_h`: points per second of speeding per hour.
        public var speedingSPerH = 0.05
        /// `speed_variation`: points per 0.1 m/s² of speed variation above the calm level.
        public var speedVariation = 6.0

        public init() {}

        enum CodingKeys: String, CodingKey {
            case harshBrake = "harsh_brake"
            case harshAccel = "harsh_accel"
            case harshCorner = "harsh_corner"
            case speedingSPerH = "speeding_s_per_h"
            case speedVariation = "speed_variation"
        }

        public init(from decoder: any Decoder) throws {
            let c = try decoder.container(keyedBy: CodingKeys.self)
            let d = Weights()
            harshBrake = try c.decodeIfPresent(Double.self, forKey: .harshBrake) ?? d.harshBrake
            harshAccel = try c.decodeIfPresent(Double.self, forKey: .harshAccel) ?? d.harshAccel
            harshCorner = try c.decodeIfPresent(Double.self, forKey: .harshCorner) ?? d.harshCorner
            speedingSPerH = try c.decodeIfPresent(Double.self, forKey: .speedingSPerH) ?? d.speedingSPerH
            speedVariation = try c.decodeIfPresent(Double.self, forKey: .speedVariation) ?? d.speedVariation
        }
    }

    public init() {}

    enum CodingKeys: String, CodingKey {
        case harshBrakeMps2 = "harsh_brake_mps2"
        case harshAccelMps2 = "harsh_accel_mps2"
        case harshCornerMps2 = "harsh_corner_mps2"
        case cornerMargin = "corner_margin"
        case cornerMinSpeedMps = "corner_min_speed_mps"
        case speedLimitKmh = "speed_limit_kmh"
        case speedingTolerance = "speeding_tolerance"
        case speedingMinDurationS = "speeding_min_duration_s"
        case zoneSpeedLimits = "zone_speed_limits"
        case roadClassLimitsKmh = "road_class_limits_kmh"
        case smoothingWindowS = "smoothing_window_s"
        case maxGapS = "max_gap_s"
        case maxAccuracyM = "max_accuracy_m"
        case episodeGapS = "episode_gap_s"
        case releaseFraction = "release_fraction"
        case scoreMinDistanceKm = "score_min_distance_km"
        case scoreMinDurationS = "score_min_duration_s"
        case speedVariationCalmMps2 = "speed_variation_calm_mps2"
        case weights
        case historyFixes = "history_fixes"
    }

    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        let d = ScorerConfiguration()
        func value<T: Decodable>(_ key: CodingKeys, _ fallback: T) throws -> T {
            try c.decodeIfPresent(T.self, forKey: key) ?? fallback
        }
        harshBrakeMps2 = try value(.harshBrakeMps2, d.harshBrakeMps2)
        harshAccelMps2 = try value(.harshAccelMps2, d.harshAccelMps2)
        harshCornerMps2 = try value(.harshCornerMps2, d.harshCornerMps2)
        cornerMargin = try value(.cornerMargin, d.cornerMargin)
        cornerMinSpeedMps = try value(.cornerMinSpeedMps, d.cornerMinSpeedMps)
        speedLimitKmh = try c.decodeIfPresent(Double.self, forKey: .speedLimitKmh)
        speedingTolerance = try value(.speedingTolerance, d.speedingTolerance)
        speedingMinDurationS = try value(.speedingMinDurationS, d.speedingMinDurationS)
        zoneSpeedLimits = try value(.zoneSpeedLimits, d.zoneSpeedLimits)
        roadClassLimitsKmh = try value(.roadClassLimitsKmh, d.roadClassLimitsKmh)
        smoothingWindowS = try value(.smoothingWindowS, d.smoothingWindowS)
        maxGapS = try value(.maxGapS, d.maxGapS)
        maxAccuracyM = try value(.maxAccuracyM, d.maxAccuracyM)
        episodeGapS = try value(.episodeGapS, d.episodeGapS)
        releaseFraction = try value(.releaseFraction, d.releaseFraction)
        scoreMinDistanceKm = try value(.scoreMinDistanceKm, d.scoreMinDistanceKm)
        scoreMinDurationS = try value(.scoreMinDurationS, d.scoreMinDurationS)
        speedVariationCalmMps2 = try value(.speedVariationCalmMps2, d.speedVariationCalmMps2)
        weights = try value(.weights, d.weights)
        historyFixes = try value(.historyFixes, d.historyFixes)
    }

    /// Refuses values that make no sense, naming the key (relative to `scorer.`). The scorer
    /// itself never crashes on a bad configuration, but its results would be meaningless.
    public func validate() throws(ScorerConfigurationError) {
        func check(_ ok: Bool, _ key: String, _ reason: String) throws(ScorerConfigurationError) {
            if !ok { throw ScorerConfigurationError(key: key, reason: reason) }
        }
        func finite(_ values: Double...) -> Bool { values.allSatisfy(\.isFinite) }
        try check(finite(harshBrakeMps2) && harshBrakeMps2 < 0 && harshBrakeMps2 > -50, "harsh_brake_mps2", "must be negative (a deceleration), above -50")
        try check(finite(harshAccelMps2) && harshAccelMps2 > 0 && harshAccelMps2 < 50, "harsh_accel_mps2", "must be between 0 and 50")
        try check(finite(harshCornerMps2) && harshCornerMps2 > 0 && harshCornerMps2 < 50, "harsh_corner_mps2", "must be between 0 and 50")
        try check(finite(cornerMargin) && cornerMargin >= 0.1 && cornerMargin <= 100, "corner_margin", "must be between 0.1 and 100")
        try check(finite(cornerMinSpeedMps) && cornerMinSpeedMps >= 0, "corner_min_speed_mps", "must be 0 or more")
        if let limit = speedLimitKmh {
            try check(finite(limit) && limit > 0, "speed_limit_kmh", "must be positive")
        }
        try check(finite(speedingTolerance) && speedingTolerance >= 1 && speedingTolerance <= 3, "speeding_tolerance", "must be between 1 and 3")
        try check(finite(speedingMinDurationS) && speedingMinDurationS >= 0, "speeding_min_duration_s", "must be 0 or more")
        for (index, zone) in zoneSpeedLimits.enumerated() {
            let key = "zone_speed_limits[\(index)]"
            try check(!zone.id.isEmpty, "\(key).id", "must not be empty")
            try check(finite(zone.speedLimitKmh ?? 0) && (zone.speedLimitKmh ?? 0) > 0, "\(key).speed_limit_kmh", "must be positive")
            switch zone.shape {
            case .polygon(let polygon):
                try check(polygon.count >= 3, "\(key).polygon", "needs at least 3 vertices")
                try check(polygon.allSatisfy { abs($0.lat) <= 90 && abs($0.lon) <= 180 }, "\(key).polygon", "has a vertex outside -90…90, -180…180")
            case .circle(let center, let radiusM):
                try check(abs(center.lat) <= 90 && abs(center.lon) <= 180, "\(key).center", "is outside -90…90, -180…180")
                try check(radiusM > 0 && finite(radiusM), "\(key).radius_m", "must be positive")
            }
        }
        for (name, limit) in roadClassLimitsKmh.sorted(by: { $0.key < $1.key }) {
            try check(RoadClass(highway: name) != nil, "road_class_limits_kmh.\(name)", "is not a class of road for cars (motorway, trunk, primary, secondary, tertiary, unclassified, residential, living_street, service, road, track, busway, or a _link)")
            try check(finite(limit) && limit > 0 && limit <= 300, "road_class_limits_kmh.\(name)", "must be above 0 and at most 300")
        }
        try check(finite(smoothingWindowS) && smoothingWindowS >= 0.5 && smoothingWindowS <= 60, "smoothing_window_s", "must be between 0.5 and 60")
        try check(finite(maxGapS) && maxGapS > 0, "max_gap_s", "must be positive")
        try check(finite(maxAccuracyM) && maxAccuracyM > 0, "max_accuracy_m", "must be positive")
        try check(finite(episodeGapS) && episodeGapS >= 0, "episode_gap_s", "must be 0 or more")
        try check(finite(releaseFraction) && releaseFraction > 0 && releaseFraction <= 1, "release_fraction", "must be above 0 and at most 1")
        try check(finite(scoreMinDistanceKm) && scoreMinDistanceKm > 0, "score_min_distance_km", "must be positive")
        try check(finite(scoreMinDurationS) && scoreMinDurationS > 0, "score_min_duration_s", "must be positive")
        for (name, weight) in [("harsh_brake", weights.harshBrake), ("harsh_accel", weights.harshAccel), ("harsh_corner", weights.harshCorner), ("speeding_s_per_h", weights.speedingSPerH)] {
            try check(finite(weight) && weight >= 0, "weights.\(name)", "must be 0 or more")
        }
        try check((16...1_000_000).contains(historyFixes), "history_fixes", "must be between 16 and 1000000")
    }
}

public struct ScorerConfigurationError: Error, Sendable, Equatable, CustomStringConvertible {
    /// The key under `scorer.`, e.g. `harsh_brake_mps2` or `zone_speed_limits[2].radius_m`.
    public var key: String
    public var reason: String

    public init(key: String, reason: String) {
        self.key = key
        self.reason = reason
    }

    public var description: String { "scorer.\(key): \(reason)" }
}
