import Foundation

/// A position in a trip event, `{"lat": …, "lon": …}` in WGS 84 degrees.
public struct TripPoint: Codable, Sendable, Equatable {
    public var lat: Double
    public var lon: Double

    public init(lat: Double, lon: Double) {
        self.lat = lat
        self.lon = lon
    }
}

/// `trip.started.<device>`: a device began to move. The trip's start is the last fix at which it
/// was still at rest, so `start_time` is usually a little before the event was published.
public struct TripStarted: Codable, Sendable, Equatable {
    /// Device plus the journal seq of the trip's first fix: the same on every replay.
    public var tripID: String
    public var device: String
    public var startTime: Date
    public var start: TripPoint
    /// The journal seq of the trip's first fix.
    public var firstSeq: UInt64?
    /// True when the fix on which the trip was found to start came from `drivebus import`: a
    /// trip in a history, not one happening now (Home Assistant's trip states ignore it).
    /// Absent for a live one.
    public var imported: Bool?

    public init(tripID: String, device: String, startTime: Date, start: TripPoint, firstSeq: UInt64?, imported: Bool? = nil) {
        self.tripID = tripID
        self.device = device
        self.startTime = startTime
        self.start = start
        self.firstSeq = firstSeq
        self.imported = imported
    }

    enum CodingKeys: String, CodingKey {
        case device, start, imported
        case tripID = "trip_id"
        case startTime = "start_time"
        case firstSeq = "first_seq"
    }
}

/// `trip.ended.<device>`: a finished trip with its summary and simplified track.
public struct TripEnded: Codable, Sendable, Equatable {
    /// The same id as the trip's `trip.started`.
    public var tripID: String
    public var device: String
    public var startTime: Date
    public var endTime: Date
    public var durationS: Double
    /// Along the accepted fixes; GPS outliers add nothing.
    public var distanceM: Double
    /// The top speed the device reported, or else the top implied over at least 5 s.
    public var maxSpeedMps: Double
    /// `distance_m / duration_s`, 0 for a trip of no duration.
    public var avgSpeedMps: Double
    /// Climb and descent with a hysteresis; omitted when no fix of the trip had an altitude.
    public var ascentM: Double?
    public var descentM: Double?
    public var start: TripPoint
    public var end: TripPoint
    /// Accepted fixes from `start` to `end`, both included.
    public var fixCount: Int
    public var firstSeq: UInt64?
    public var lastSeq: UInt64?
    /// `[[lat, lon], …]`, simplified with Douglas-Peucker at `simplify_epsilon_m`.
    public var track: [[Double]]
    /// True when the fix on which the trip was found to start came from `drivebus import`: a
    /// trip in a history, not one happening now (Home Assistant's trip states ignore it).
    /// Absent for a live one.
    public var imported: Bool?

    public init(
        tripID: String, device: String, startTime: Date, endTime: Date, durationS: Double, distanceM: Double,
        maxSpeedMps: Double, avgSpeedMps: Double, ascentM: Double?, descentM: Double?, start: TripPoint, end: TripPoint,
        fixCount: Int, firstSeq: UInt64?, lastSeq: UInt64?, track: [[Double]], imported: Bool? = nil
    ) {
        self.tripID = tripID
        self.device = device
        self.startTime = startTime
        self.endTime = endTime
        self.durationS = durationS
        self.distanceM = distanceM
        self.maxSpeedMps = maxSpeedMps
        self.avgSpeedMps = avgSpeedMps
        self.ascentM = ascentM
        self.descentM = descentM
        self.start = start
        self.end = end
        self.fixCount = fixCount
        self.firstSeq = firstSeq
        self.lastSeq = lastSeq
        self.track = track
        self.imported = imported
    }

    enum CodingKeys: String, CodingKey {
        case device, start, end, track, imported
        case tripID = "trip_id"
        case startTime = "start_time"
        case endTime = "end_time"
        case durationS = "duration_s"
        case distanceM = "distance_m"
        case maxSpeedMps = "max_speed_mps"
        case avgSpeedMps = "avg_speed_mps"
        case ascentM = "ascent_m"
        case descentM = "descent_m"
        case fixCount = "fix_count"
        case firstSeq = "first_seq"
        case lastSeq = "last_seq"
    }
}

/// `device.silent.<device>`: a device that was reporting has sent no usable fix for
/// `silent_after_s`. Published once per silence; the next fix ends it.
public struct DeviceSilent: Codable, Sendable, Equatable {
    public var device: String
    /// The time of its last accepted fix.
    public var lastTime: Date
    public var lastSeq: UInt64?
    /// How long it had been silent when this was noticed.
    public var silentS: Double
    /// When the silence was noticed (the server's clock).
    public var time: Date

    public init(device: String, lastTime: Date, lastSeq: UInt64?, silentS: Double, time: Date) {
        self.device = device
        self.lastTime = lastTime
        self.lastSeq = lastSeq
        self.silentS = silentS
        self.time = time
    }

    enum CodingKeys: String, CodingKey {
        case device, time
        case lastTime = "last_time"
        case lastSeq = "last_seq"
        case silentS = "silent_s"
    }
}
