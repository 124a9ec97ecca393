import DrivebusGeo
import DrivebusRoadLimits
import DrivebusSchema
import Foundation

/// A trip as the scorer needs it; the executable fills it from `trip.started` / `trip.ended`.
public struct ScorerTrip: Sendable, Equatable, Codable {
    public var tripID: String
    public var device: String
    public var startTime: Date
    public var endTime: Date?
    /// The journal seq of the trip's first fix; 0 if unknown (`trip.ended` then takes the one
    /// from `trip.started`).
    public var firstSeq: UInt64
    /// The journal seq of its last fix; `nil` on `trip.started`.
    public var lastSeq: UInt64?
    /// The trips service's distance; without it the scorer sums its own.
    public var distanceM: Double?
    /// The trip began with an imported fix (`TripStarted.imported`).
    public var imported: Bool?

    public init(
        tripID: String, device: String, startTime: Date, endTime: Date? = nil, firstSeq: UInt64, lastSeq: UInt64? = nil, distanceM: Double? = nil,
        imported: Bool? = nil
    ) {
        self.tripID = tripID
        self.device = device
        self.startTime = startTime
        self.endTime = endTime
        self.firstSeq = firstSeq
        self.lastSeq = lastSeq
        self.distanceM = distanceM
        self.imported = imported
    }
}

public enum ScorerInput: Sendable {
    case fix(Fix)
    case tripStarted(ScorerTrip)
    case tripEnded(ScorerTrip)
    case sessionStarted(SessionStarted)
    case sessionStopped(SessionStopped)
}

public enum ScorerOutput: Sendable, Equatable {
    case event(DriveEvent)
    case scored(DriveScored)

    /// The event type, without the device suffix of the topic.
    public var type: String {
        switch self {
        case .event: "drive.event"
        case .scored: "drive.scored"
        }
    }

    public var device: String {
        switch self {
        case .event(let event): event.device
        case .scored(let scored): scored.device
        }
    }

    /// Derived from the inputs only, so re-processing yields the same id and stores deduplicate.
    public var eventID: String {
        switch self {
        case .event(let event): "drive.event-\(event.device)-\(event.firstSeq)-\(event.type.rawValue)"
        case .scored(let scored): "drive.scored-\(scored.tripID)"
        }
    }
}

/// The scorer's state machine for all devices: fixes, trips and sessions in, `drive.event` and
/// `drive.scored` out. No clocks, files or sockets: the output is a function of the input order,
/// and the `Codable` form is the checkpoint (encode, decode, continue == never stopped).
public struct DriveScorer: Sendable, Codable {
    /// Stored in the checkpoint; set it after restoring to apply a changed configuration.
    public var configuration: ScorerConfiguration {
        didSet { tuning = Tuning(configuration, roads: roadLimits) }
    }
    /// The roads' posted limits (`drivebus limits import`); not in the checkpoint. Set it after
    /// restoring, and again whenever a new index is imported: matching starts afresh on it.
    public var roadLimits: RoadLimitIndex? {
        didSet { tuning = Tuning(configuration, roads: roadLimits) }
    }
    /// The highest journal seq seen; fixes at or below it are ignored, so a replay is harmless.
    public private(set) var lastSeq: UInt64 = 0
    private var tuning: Tuning
    private var devices: [String: DeviceState] = [:]
    /// `trip.ended` that arrived before the fixes it covers (replays of different streams); each
    /// is scored once `lastSeq` reaches its `last_seq`.
    private var pendingEnds: [ScorerTrip] = []

    public init(configuration: ScorerConfiguration, roadLimits: RoadLimitIndex? = nil) {
        self.configuration = configuration
        self.roadLimits = roadLimits
        tuning = Tuning(configuration, roads: roadLimits)
    }

    public mutating func handle(_ input: ScorerInput) -> [ScorerOutput] {
        var out: [ScorerOutput] = []
        switch input {
        case .fix(let fix):
            // Ingest gives every journal fix a seq; one without is not from the journal.
            guard let seq = fix.seq, seq > lastSeq else { return out }
            lastSeq = seq
            devices[fix.device, default: DeviceState(device: fix.device)].add(fix, seq: seq, tuning, &out)
            if !pendingEnds.isEmpty { scoreReadyTrips(&out) }
        case .tripStarted(let trip):
            devices[trip.device, default: DeviceState(device: trip.device)].tripStarted(trip)
        case .tripEnded(let trip):
            if let last = trip.lastSeq, last > lastSeq {
                if pendingEnds.count >= Self.maxPendingEnds { scoreTrip(pendingEnds.removeFirst(), &out) }
                pendingEnds.append(trip)
            } else {
                scoreTrip(trip, &out)
            }
        case .sessionStarted(let session):
            devices[session.device, default: DeviceState(device: session.device)].sessionStarted(session)
        case .sessionStopped(let session):
            devices[session.device]?.sessionStopped(session)
        }
        return out
    }

    static let maxPendingEnds = 256

    private mutating func scoreReadyTrips(_ out: inout [ScorerOutput]) {
        var index = 0
        while index < pendingEnds.count {
            if let last = pendingEnds[index].lastSeq, last > lastSeq {
                index += 1
            } else {
                scoreTrip(pendingEnds.remove(at: index), &out)
            }
        }
    }

    private mutating func scoreTrip(_ trip: ScorerTrip, _ out: inout [ScorerOutput]) {
        devices[trip.device, default: DeviceState(device: trip.device)].tripEnded(trip, tuning, &out)
    }

    // MARK: Codable (the checkpoint)

    /// The configuration is not in the checkpoint: see `CheckpointConfiguration`.
    enum CodingKeys: String, CodingKey {
        case lastSeq = "last_seq"
        case devices
        case pendingEnds = "pending_ends"
    }

    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        configuration = try CheckpointConfiguration.read(ScorerConfiguration.self, from: decoder)
        tuning = Tuning(configuration)
        lastSeq = try c.decode(UInt64.self, forKey: .lastSeq)
        devices = try c.decode([String: DeviceState].self, forKey: .devices)
        pendingEnds = try c.decode([ScorerTrip].self, forKey: .pendingEnds)
    }

    public func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: CodingKeys.self)
        try c.encode(lastSeq, forKey: .lastSeq)
        try c.encode(devices, forKey: .devices)
        try c.encode(pendingEnds, forKey: .pendingEnds)
    }
}
