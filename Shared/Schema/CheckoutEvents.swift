import Foundation

/// `taxi.checkout.<device>`: the moment a taxi passenger got out, once per check-in.
public struct TaxiCheckout: Codable, Sendable, Equatable {
    public enum Reason: String, Codable, Sendable, CaseIterable {
        /// A sustained walking or running motion activity.
        case walking, running
        /// Riding speeds, then walking pace, from location fixes (phones without motion data).
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
    /// The motion sample's confidence for `walking` and `running`; null for `fixes` and `max_ride`.
    public var confidence: MotionSample.Confidence?
    /// `checkout_time - checkin_time`, in seconds.
    public var rideS: Double
    /// Distance along the ride's fixes up to `checkout_time`; omitted when there were none.
    public var rideDistanceM: Double?

    public init(
        device: String, checkinSeq: UInt64?, checkinTime: Date, checkoutTime: Date, reason: Reason,
        confidence: MotionSample.Confidence?, rideS: Double, rideDistanceM: Double?
    ) {
        self.device = device
        self.checkinSeq = checkinSeq
        self.checkinTime = checkinTime
        self.checkoutTime = checkoutTime
        self.reason = reason
        self.confidence = confidence
        self.rideS = rideS
        self.rideDistanceM = rideDistanceM
    }

    enum CodingKeys: String, CodingKey {
        case device, reason, confidence
        case checkinSeq = "checkin_seq"
        case checkinTime = "checkin_time"
        case checkoutTime = "checkout_time"
        case rideS = "ride_s"
        case rideDistanceM = "ride_distance_m"
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
    }
}
