import Foundation

/// `taxi.checkout.<device>`: the moment a taxi passenger got out, once per check-in.
public struct TaxiCheckout: Codable, Sendable, Equatable {
    public enum Reason: String, Codable, Sendable, CaseIterable {
        /// A sustained walking or running motion activity.
        case walking, running
        /// The taxi stopped, then the fixes showed the rider on foot, away from it.
        case fixes
        /// Nothing else decided within `max_ride_s`.
        case maxRide = "max_ride"
    }

    public var device: String
    /// The journal seq of the check-in; with `device` it makes the event id.
    public var checkinSeq: UInt64?
    public var checkinTime: Date
    public var checkoutTime: Date
    public var reason: Reason
    /// The motion sample's confidence for `walking` and `running`; for `fixes`, `high` when the
    /// rider got twice `walk_min_distance_m` away, `medium` when that far, `low` when only
    /// `walk_aside_m` off the taxi's road; null for `max_ride`.
    public var confidence: MotionSample.Confidence?
    /// `checkout_time - checkin_time`, in seconds.
    public var rideS: Double
    /// Distance along the ride's fixes up to `checkout_time`; omitted when there were none.
    public var rideDistanceM: Double?
    /// How far the rider had walked when it was decided: for `fixes`, from the stop in a straight
    /// line beyond the fixes' accuracy; for a motion walk, along the fixes since it began.
    public var walkedM: Double?
    /// The ride's time when the evidence sufficed (a fix's or sample's time, or the clock):
    /// `checkout_time` is found after the fact, this is when it was known.
    public var decidedAt: Date?
    /// For `fixes`: when the taxi stopped, before the rider left it at `checkout_time`.
    public var stoppedAt: Date?

    public init(
        device: String, checkinSeq: UInt64?, checkinTime: Date, checkoutTime: Date, reason: Reason,
        confidence: MotionSample.Confidence?, rideS: Double, rideDistanceM: Double?,
        walkedM: Double? = nil, decidedAt: Date? = nil, stoppedAt: Date? = nil
    ) {
        self.device = device
        self.checkinSeq = checkinSeq
        self.checkinTime = checkinTime
        self.checkoutTime = checkoutTime
        self.reason = reason
        self.confidence = confidence
        self.rideS = rideS
        self.rideDistanceM = rideDistanceM
        self.walkedM = walkedM
        self.decidedAt = decidedAt
        self.stoppedAt = stoppedAt
    }

    enum CodingKeys: String, CodingKey {
        case device, reason, confidence
        case checkinSeq = "checkin_seq"
        case checkinTime = "checkin_time"
        case checkoutTime = "checkout_time"
        case rideS = "ride_s"
        case rideDistanceM = "ride_distance_m"
        case walkedM = "walked_m"
        case decidedAt = "decided_at"
        case stoppedAt = "stopped_at"
    }

    // Written by hand so that `confidence` is always present (null when the reason has none),
    // while the other optional fields are omitted when unknown, as elsewhere on the bus.
    public func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(device, forKey: .device)
        try container.encodeIfPresent(checkinSeq, forKey: .checkinSeq)
        try container.encode(checkinTime, forKey: .checkinTime)
        try container.encode(checkoutTime, forKey: .checkoutTime)
        try container.encode(reason, forKey: .reason)
        try container.encode(confidence, forKey: .confidence)
        try container.encode(rideS, forKey: .rideS)
        try container.encodeIfPresent(rideDistanceM, forKey: .rideDistanceM)
        try container.encodeIfPresent(walkedM, forKey: .walkedM)
        try container.encodeIfPresent(decidedAt, forKey: .decidedAt)
        try container.encodeIfPresent(stoppedAt, forKey: .stoppedAt)
    }
}
