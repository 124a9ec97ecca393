import Foundation

/// Where a fix came from.
public enum FixSource: String, Codable, Sendable, CaseIterable {
    case owntracks, overland, osmand, gpslogger, api, `import`
}

/// One location fix, as published on `fix.<device>`. Optional fields are omitted when unknown.
public struct Fix: Codable, Sendable, Equatable {
    /// The journal sequence number ingest gave this fix; consumers checkpoint it.
    public var seq: UInt64?
    public var device: String
    public var time: Date
    public var lat: Double
    public var lon: Double
    public var accuracyM: Double?
    public var altitudeM: Double?
    public var speedMps: Double?
    public var courseDeg: Double?
    /// Battery level from 0 to 1.
    public var battery: Double?
    public var source: FixSource
    /// The client's own labels (Overland `device_id`, OwnTracks `tid`, …), kept for reference.
    /// They never decide the device.
    public var meta: [String: String]?

    public init(
        seq: UInt64? = nil, device: String, time: Date, lat: Double, lon: Double,
        accuracyM: Double? = nil, altitudeM: Double? = nil, speedMps: Double? = nil,
        courseDeg: Double? = nil, battery: Double? = nil, source: FixSource, meta: [String: String]? = nil
    ) {
        self.seq = seq
        self.device = device
        self.time = time
        self.lat = lat
        self.lon = lon
        self.accuracyM = accuracyM
        self.altitudeM = altitudeM
        self.speedMps = speedMps
        self.courseDeg = courseDeg
        self.battery = battery
        self.source = source
        self.meta = meta
    }

    enum CodingKeys: String, CodingKey {
        case seq, device, time, lat, lon
        case accuracyM = "accuracy_m"
        case altitudeM = "altitude_m"
        case speedMps = "speed_mps"
        case courseDeg = "course_deg"
        case battery, source, meta
    }
}

/// One motion-activity sample, like iOS `CMMotionActivity`, published on `motion.<device>`.
public struct MotionSample: Codable, Sendable, Equatable {
    public enum Activity: String, Codable, Sendable, CaseIterable {
        case stationary, walking, running, automotive, cycling, unknown
    }

    public enum Confidence: String, Codable, Sendable, CaseIterable, Comparable {
        case low, medium, high

        private var rank: Int {
            switch self {
            case .low: 0
            case .medium: 1
            case .high: 2
            }
        }

        public static func < (a: Confidence, b: Confidence) -> Bool { a.rank < b.rank }
    }

    public var seq: UInt64?
    public var device: String
    /// When this activity started; it lasts until the next sample starts.
    public var start: Date
    public var activity: Activity
    public var confidence: Confidence
    public var source: FixSource

    public init(seq: UInt64? = nil, device: String, start: Date, activity: Activity, confidence: Confidence, source: FixSource) {
        self.seq = seq
        self.device = device
        self.start = start
        self.activity = activity
        self.confidence = confidence
        self.source = source
    }
}

/// `svc.heartbeat.<service>`, every 2 seconds from every service.
public struct Heartbeat: Codable, Sendable, Equatable {
    public var service: String
    public var pid: Int32
    public var epoch: String
    public var startedAt: Date
    public var uptimeS: Double
    /// `ok`, or a short word for what is wrong.
    public var status: String
    /// Messages this service has published in this epoch (the last header `seq`).
    public var publishedSeq: UInt64
    /// The last sequence numbers it processed, by stream: `{"journal": 1234}`.
    public var lastSeq: [String: UInt64]
    /// Things the service counted since it started, by name: `{"dropped_readings.speed_mps.impossible": 2}`.
    public var counters: [String: UInt64]?

    public init(
        service: String, pid: Int32, epoch: String, startedAt: Date, uptimeS: Double, status: String, publishedSeq: UInt64, lastSeq: [String: UInt64],
        counters: [String: UInt64]? = nil
    ) {
        self.service = service
        self.pid = pid
        self.epoch = epoch
        self.startedAt = startedAt
        self.uptimeS = uptimeS
        self.status = status
        self.publishedSeq = publishedSeq
        self.lastSeq = lastSeq
        self.counters = counters
    }

    enum CodingKeys: String, CodingKey {
        case service, pid, epoch, status, counters
        case startedAt = "started_at"
        case uptimeS = "uptime_s"
        case publishedSeq = "published_seq"
        case lastSeq = "last_seq"
    }
}
