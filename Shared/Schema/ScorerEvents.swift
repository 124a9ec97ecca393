import Foundation

/// The kinds of `drive.event`.
public enum DriveEventType: String, Codable, Sendable, CaseIterable {
    case harshBrake = "harsh_brake"
    case harshAccel = "harsh_accel"
    case harshCorner = "harsh_corner"
    case speeding
}

/// `drive.event.<device>`: one harsh or speeding episode, published live as it ends.
public struct DriveEvent: Codable, Sendable, Equatable {
    public var device: String
    /// Set when the trip was already known as the event was published; always set inside
    /// `drive.scored`.
    public var tripID: String?
    public var type: DriveEventType
    /// Where and when the episode began.
    public var time: Date
    public var lat: Double
    public var lon: Double
    /// The peak smoothed acceleration: negative for `harsh_brake`, positive (lateral magnitude) for
    /// `harsh_corner`. Absent for `speeding`.
    public var peakMps2: Double?
    /// `speeding` only: the peak speed above the limit (not above limit × tolerance).
    public var overKmh: Double?
    /// `speeding` only: the limit in force at the peak.
    public var limitKmh: Double?
    /// `speeding` only: where that limit came from: `osm` (the road's `maxspeed`), `road_class`
    /// (the configured limit for its class of road), `zone` or `global` (docs/speed-limits.md).
    public var limitSource: String?
    public var durationS: Double
    /// The journal seq of the episode's first fix; it identifies the event.
    public var firstSeq: UInt64

    public init(
        device: String, tripID: String? = nil, type: DriveEventType, time: Date, lat: Double, lon: Double,
        peakMps2: Double? = nil, overKmh: Double? = nil, limitKmh: Double? = nil, limitSource: String? = nil, durationS: Double,
        firstSeq: UInt64
    ) {
        self.device = device
        self.tripID = tripID
        self.type = type
        self.time = time
        self.lat = lat
        self.lon = lon
        self.peakMps2 = peakMps2
        self.overKmh = overKmh
        self.limitKmh = limitKmh
        self.limitSource = limitSource
        self.durationS = durationS
        self.firstSeq = firstSeq
    }

    enum CodingKeys: String, CodingKey {
        case device, type, time, lat, lon
        case tripID = "trip_id"
        case peakMps2 = "peak_mps2"
        case overKmh = "over_kmh"
        case limitKmh = "limit_kmh"
        case limitSource = "limit_source"
        case durationS = "duration_s"
        case firstSeq = "first_seq"
    }
}

/// The driving-school session a trip belongs to.
public struct DriveSession: Codable, Sendable, Equatable {
    public var id: String
    public var candidate: String

    public init(id: String, candidate: String) {
        self.id = id
        self.candidate = candidate
    }
}

/// `drive.scored.<device>`: once per trip, after `trip.ended`.
public struct DriveScored: Codable, Sendable, Equatable {
    public var tripID: String
    public var device: String
    public var startTime: Date
    public var endTime: Date?
    /// 0–100, one decimal.
    public var score: Double
    public var distanceM: Double
    public var events: [DriveEvent]
    /// Every type, zeros included: `{"harsh_brake": 1, "harsh_accel": 0, …}`.
    public var counts: [String: Int]
    /// Harsh events (speeding excluded) per 100 km, over at least the configured minimum distance.
    public var eventsPer100km: Double
    public var speedingS: Double
    /// Distance driven above limit × tolerance, and distance where a limit was known (absent in
    /// payloads from before speed limits were matched to roads).
    public var speedingM: Double?
    public var limitKnownM: Double?
    /// The three speeding episodes furthest above their limit, worst first (each with its
    /// `limit_kmh`, `over_kmh` and `limit_source`; the speed is their sum). Absent without limits.
    public var worstSpeeding: [DriveEvent]?
    /// The standard deviation of smoothed longitudinal acceleration, m/s².
    public var speedVariation: Double
    /// Why the score is what it is: each measure, its value and the points it cost. Absent in
    /// payloads from before components existed.
    public var components: [ScoreComponent]?
    public var session: DriveSession?
    /// True when the trip was an imported one (`TripEnded.imported`); absent for a live one.
    public var imported: Bool?

    public init(
        tripID: String, device: String, startTime: Date, endTime: Date? = nil, score: Double, distanceM: Double,
        events: [DriveEvent], counts: [String: Int], eventsPer100km: Double, speedingS: Double,
        speedingM: Double? = nil, limitKnownM: Double? = nil, worstSpeeding: [DriveEvent]? = nil,
        speedVariation: Double, components: [ScoreComponent]? = nil, session: DriveSession? = nil, imported: Bool? = nil
    ) {
        self.tripID = tripID
        self.device = device
        self.startTime = startTime
        self.endTime = endTime
        self.score = score
        self.distanceM = distanceM
        self.events = events
        self.counts = counts
        self.eventsPer100km = eventsPer100km
        self.speedingS = speedingS
        self.speedingM = speedingM
        self.limitKnownM = limitKnownM
        self.worstSpeeding = worstSpeeding
        self.speedVariation = speedVariation
        self.components = components
        self.session = session
        self.imported = imported
    }

    enum CodingKeys: String, CodingKey {
        case device, score, events, counts, session, components, imported
        case tripID = "trip_id"
        case startTime = "start_time"
        case endTime = "end_time"
        case distanceM = "distance_m"
        case eventsPer100km = "events_per_100km"
        case speedingS = "speeding_s"
        case speedingM = "speeding_m"
        case limitKnownM = "limit_known_m"
        case worstSpeeding = "worst_speeding"
        case speedVariation = "speed_variation"
    }
}

/// One measure of a scored trip: `{"name": "harsh_brake", "value": 2.5, "unit": "per_100km",
/// "points": 7.5}`. The score is 100 minus the sum of `points`, clamped to 0–100.
public struct ScoreComponent: Codable, Sendable, Equatable {
    /// `speed_variation`, `harsh_brake`, `harsh_accel`, `harsh_corner`, `speeding`.
    public var name: String
    public var value: Double
    /// `mps2` (speed variation), `per_100km` (harsh events), `s_per_h` (speeding).
    public var unit: String
    public var points: Double

    public init(name: String, value: Double, unit: String, points: Double) {
        self.name = name
        self.value = value
        self.unit = unit
        self.points = points
    }
}

/// `session.started.<device>`: an instructor started a mock test (`POST /api/v1/sessions/start`).
public struct SessionStarted: Codable, Sendable, Equatable {
    public var sessionID: String
    public var device: String
    public var candidate: String
    public var instructor: String?
    public var note: String?
    public var time: Date

    public init(sessionID: String, device: String, candidate: String, instructor: String? = nil, note: String? = nil, time: Date) {
        self.sessionID = sessionID
        self.device = device
        self.candidate = candidate
        self.instructor = instructor
        self.note = note
        self.time = time
    }

    enum CodingKeys: String, CodingKey {
        case device, candidate, instructor, note, time
        case sessionID = "session_id"
    }
}

/// `session.stopped.<device>` (`POST /api/v1/sessions/stop`).
public struct SessionStopped: Codable, Sendable, Equatable {
    public var sessionID: String
    public var device: String
    public var time: Date

    public init(sessionID: String, device: String, time: Date) {
        self.sessionID = sessionID
        self.device = device
        self.time = time
    }

    enum CodingKeys: String, CodingKey {
        case device, time
        case sessionID = "session_id"
    }
}
