import Foundation

/// The `trips:` section of the config. Every threshold of the segmenter is here; the few derived
/// values below are documented so that the keys stay few.
public struct TripsConfiguration: Sendable, Equatable, Codable {
    /// `min_distance_m`: a device is moving once a fix lies this far from where it last stopped,
    /// and stopped once it stays within this distance for `min_duration_s`.
    public var minDistanceM = 200.0
    /// `min_duration_s`
    public var minDurationS = 180.0
    /// `stop_gap_s`: a gap between fixes longer than this ends a trip.
    public var stopGapS = 3600.0
    /// `max_speed_mps`: a fix implying more than this from the last accepted fix is an outlier.
    public var maxSpeedMps = 70.0
    /// `max_accuracy_m`: a fix with a worse accuracy is an outlier.
    public var maxAccuracyM = 100.0
    /// `idle_close_s`: a live trip whose device sends no accepted fix for this long is closed.
    public var idleCloseS = 600.0
    /// `silent_after_s`: `device.silent` after this long without an accepted fix.
    public var silentAfterS = 21600.0
    /// `simplify_epsilon_m`: Douglas-Peucker tolerance of `trip.ended`'s track.
    public var simplifyEpsilonM = 5.0
    /// `ascent_hysteresis_m`
    public var ascentHysteresisM = 5.0
    /// `walking_end_s`: walking or running (medium or high confidence) that has lasted this long
    /// ends a trip where the device stopped before the walk began. A minute outlasts a brief
    /// misreading in slow traffic, and is shorter than any walk away from a parked car.
    public var walkingEndS = 60.0
    /// `distance_noise_m`: a trip's distance is summed over steps of at least this much, so the
    /// scatter of a phone stopped in traffic (a few metres a second, for minutes) adds nothing.
    public var distanceNoiseM = 10.0

    public init() {}

    /// Fixes within this of a resting point count as at rest there: a quarter of
    /// `min_distance_m`, about the size of a parked phone's GPS jitter.
    public var restRadiusM: Double { minDistanceM / 4 }
    /// The speed that separates moving from resting: `min_distance_m` in `min_duration_s`.
    public var movingSpeedMps: Double { minDurationS > 0 ? minDistanceM / minDurationS : .greatestFiniteMagnitude }
    /// With `automotive` motion of medium or high confidence, a trip starts at half the distance.
    public var automotiveStartM: Double { minDistanceM / 2 }
    /// A gap this long closes an open trip whether a clock tick or the next fix notices it first.
    public var gapCloseS: Double { min(stopGapS, idleCloseS) }

    /// A value the segmenter cannot work with, named by its config key.
    public struct Invalid: Error, Sendable, Equatable, CustomStringConvertible {
        public var key: String
        public var reason: String
        public var description: String { "trips.\(key): \(reason)" }

        public init(key: String, reason: String) {
            self.key = key
            self.reason = reason
        }
    }

    /// Every field must be finite; distances, durations and speeds positive.
    public func validate() throws(Invalid) {
        let positive: [(String, Double)] = [
            ("min_distance_m", minDistanceM), ("min_duration_s", minDurationS), ("stop_gap_s", stopGapS),
            ("max_speed_mps", maxSpeedMps), ("max_accuracy_m", maxAccuracyM), ("idle_close_s", idleCloseS),
            ("silent_after_s", silentAfterS), ("walking_end_s", walkingEndS),
        ]
        for (key, value) in positive where !(value.isFinite && value > 0) {
            throw Invalid(key: key, reason: "must be a finite number above 0, got \(value)")
        }
        for (key, value) in [
            ("simplify_epsilon_m", simplifyEpsilonM), ("ascent_hysteresis_m", ascentHysteresisM), ("distance_noise_m", distanceNoiseM),
        ]
        where !(value.isFinite && value >= 0) {
            throw Invalid(key: key, reason: "must be a finite number of 0 or more, got \(value)")
        }
    }

    enum CodingKeys: String, CodingKey {
        case minDistanceM = "min_distance_m"
        case minDurationS = "min_duration_s"
        case stopGapS = "stop_gap_s"
        case maxSpeedMps = "max_speed_mps"
        case maxAccuracyM = "max_accuracy_m"
        case idleCloseS = "idle_close_s"
        case silentAfterS = "silent_after_s"
        case simplifyEpsilonM = "simplify_epsilon_m"
        case ascentHysteresisM = "ascent_hysteresis_m"
        case walkingEndS = "walking_end_s"
        case distanceNoiseM = "distance_noise_m"
    }

    /// Missing keys keep their defaults, so a config names only what it changes.
    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        func value(_ key: CodingKeys, _ fallback: Double) throws -> Double {
            try c.decodeIfPresent(Double.self, forKey: key) ?? fallback
        }
        self.init()
        minDistanceM = try value(.minDistanceM, minDistanceM)
        minDurationS = try value(.minDurationS, minDurationS)
        stopGapS = try value(.stopGapS, stopGapS)
        maxSpeedMps = try value(.maxSpeedMps, maxSpeedMps)
        maxAccuracyM = try value(.maxAccuracyM, maxAccuracyM)
        idleCloseS = try value(.idleCloseS, idleCloseS)
        silentAfterS = try value(.silentAfterS, silentAfterS)
        simplifyEpsilonM = try value(.simplifyEpsilonM, simplifyEpsilonM)
        ascentHysteresisM = try value(.ascentHysteresisM, ascentHysteresisM)
        walkingEndS = try value(.walkingEndS, walkingEndS)
        distanceNoiseM = try value(.distanceNoiseM, distanceNoiseM)
    }
}
