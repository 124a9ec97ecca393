import DrivebusSchema
import Foundation

/// The `checkout:` section of the config. Coding keys are the YAML keys; missing keys keep their
/// defaults, so a partial section decodes.
public struct CheckoutConfiguration: Sendable, Equatable, Codable {
    /// Walking that starts sooner than this after the check-in is walking *to* the taxi.
    public var gracePeriodS = 60.0
    /// How long a walk (motion) or walking-pace fixes must last to count.
    public var leadTimeS = 60.0
    /// Walking and running samples below this confidence do not count.
    public var minConfidence = MotionSample.Confidence.medium
    /// With no check-out by then, the ride ends `max_ride` at check-in plus this.
    public var maxRideS = 21_600.0
    /// Fixes rule: a fix at least this fast means the taxi is moving.
    public var ridingSpeedMps = 5.0
    /// Fixes rule: walking pace, inclusive.
    public var walkingSpeedMinMps = 0.5
    public var walkingSpeedMaxMps = 2.5
    /// Fixes less accurate than this are left out of the fixes rule and of `ride_distance_m`.
    public var maxAccuracyM = 100.0
    /// A device that sent a motion sample at most this long before a check-in (or sends one
    /// during the ride) is a motion device: its ride is decided by the motion rule only.
    public var motionMemoryS = 86_400.0

    public init() {}

    enum CodingKeys: String, CodingKey {
        case gracePeriodS = "grace_period_s"
        case leadTimeS = "lead_time_s"
        case minConfidence = "min_confidence"
        case maxRideS = "max_ride_s"
        case ridingSpeedMps = "riding_speed_mps"
        case walkingSpeedMinMps = "walking_speed_min_mps"
        case walkingSpeedMaxMps = "walking_speed_max_mps"
        case maxAccuracyM = "max_accuracy_m"
        case motionMemoryS = "motion_memory_s"
    }

    public init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        let defaults = CheckoutConfiguration()
        gracePeriodS = try container.decodeIfPresent(Double.self, forKey: .gracePeriodS) ?? defaults.gracePeriodS
        leadTimeS = try container.decodeIfPresent(Double.self, forKey: .leadTimeS) ?? defaults.leadTimeS
        minConfidence = try container.decodeIfPresent(MotionSample.Confidence.self, forKey: .minConfidence) ?? defaults.minConfidence
        maxRideS = try container.decodeIfPresent(Double.self, forKey: .maxRideS) ?? defaults.maxRideS
        ridingSpeedMps = try container.decodeIfPresent(Double.self, forKey: .ridingSpeedMps) ?? defaults.ridingSpeedMps
        walkingSpeedMinMps = try container.decodeIfPresent(Double.self, forKey: .walkingSpeedMinMps) ?? defaults.walkingSpeedMinMps
        walkingSpeedMaxMps = try container.decodeIfPresent(Double.self, forKey: .walkingSpeedMaxMps) ?? defaults.walkingSpeedMaxMps
        maxAccuracyM = try container.decodeIfPresent(Double.self, forKey: .maxAccuracyM) ?? defaults.maxAccuracyM
        motionMemoryS = try container.decodeIfPresent(Double.self, forKey: .motionMemoryS) ?? defaults.motionMemoryS
    }
}
