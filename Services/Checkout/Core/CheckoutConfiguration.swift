import DrivebusSchema
import Foundation

/// The `checkout:` section of the config. Coding keys are the YAML keys; missing keys keep their
/// defaults, so a partial section decodes.
public struct CheckoutConfiguration: Sendable, Equatable, Codable {
    /// Walking that starts sooner than this after the check-in is walking *to* the taxi.
    public var gracePeriodS = 60.0
    /// Motion rule: how long a walking or running activity must last to count.
    public var leadTimeS = 60.0
    /// Walking and running samples below this confidence do not count.
    public var minConfidence = MotionSample.Confidence.medium
    /// With no check-out by then (in the ride's own time), the ride ends `max_ride`.
    public var maxRideS = 21_600.0
    /// Fixes rule: moving at least this fast (over `SpeedWindow.seconds`) means the taxi is moving.
    public var ridingSpeedMps = 5.0
    /// Fixes rule: faster than this (over the window) is not walking: a crawl in traffic.
    public var walkingSpeedMaxMps = 2.5
    /// Fixes rule: how long after the taxi stopped the fixes must still show no vehicle.
    public var walkConfirmS = 60.0
    /// Fixes rule: how far from where the taxi stopped the rider must be by then, beyond the
    /// fixes' accuracy.
    public var walkMinDistanceM = 30.0
    /// Fixes rule: or how far off the road the taxi came along (across it, or back against it),
    /// beyond half the fixes' accuracy, on two fixes in a row: where a car in traffic does not go.
    public var walkAsideM = 12.0
    /// Fixes less accurate than this are left out of the fixes rule and of `ride_distance_m`.
    public var maxAccuracyM = 100.0

    public init() {}

    enum CodingKeys: String, CodingKey {
        case gracePeriodS = "grace_period_s"
        case leadTimeS = "lead_time_s"
        case minConfidence = "min_confidence"
        case maxRideS = "max_ride_s"
        case ridingSpeedMps = "riding_speed_mps"
        case walkingSpeedMaxMps = "walking_speed_max_mps"
        case walkConfirmS = "walk_confirm_s"
        case walkMinDistanceM = "walk_min_distance_m"
        case walkAsideM = "walk_aside_m"
        case maxAccuracyM = "max_accuracy_m"
    }

    public init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        let defaults = CheckoutConfiguration()
        gracePeriodS = try container.decodeIfPresent(Double.self, forKey: .gracePeriodS) ?? defaults.gracePeriodS
        leadTimeS = try container.decodeIfPresent(Double.self, forKey: .leadTimeS) ?? defaults.leadTimeS
        minConfidence = try container.decodeIfPresent(MotionSample.Confidence.self, forKey: .minConfidence) ?? defaults.minConfidence
        maxRideS = try container.decodeIfPresent(Double.self, forKey: .maxRideS) ?? defaults.maxRideS
        ridingSpeedMps = try container.decodeIfPresent(Double.self, forKey: .ridingSpeedMps) ?? defaults.ridingSpeedMps
        walkingSpeedMaxMps = try container.decodeIfPresent(Double.self, forKey: .walkingSpeedMaxMps) ?? defaults.walkingSpeedMaxMps
        walkConfirmS = try container.decodeIfPresent(Double.self, forKey: .walkConfirmS) ?? defaults.walkConfirmS
        walkMinDistanceM = try container.decodeIfPresent(Double.self, forKey: .walkMinDistanceM) ?? defaults.walkMinDistanceM
        walkAsideM = try container.decodeIfPresent(Double.self, forKey: .walkAsideM) ?? defaults.walkAsideM
        maxAccuracyM = try container.decodeIfPresent(Double.self, forKey: .maxAccuracyM) ?? defaults.maxAccuracyM
    }
}
