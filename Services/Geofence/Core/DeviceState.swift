import DrivebusSchema
import Foundation

/// What the engine remembers about one device; the checkpoint is a list of these. Times are
/// seconds since 1970 as `Double`, so a checkpoint round-trips exactly whatever the encoder's date
/// strategy.
struct DeviceState: Sendable, Equatable, Codable {
    struct Position: Sendable, Equatable, Codable {
        var time: Double
        var lat: Double
        var lon: Double
        var seq: UInt64?
        /// True for a fix from `drivebus import`; absent for a live one (and in older checkpoints).
        var imported: Bool?
    }

    /// One stay inside a zone, from the entering fix until a fix more than the hysteresis outside.
    struct Visit: Sendable, Equatable, Codable {
        var zoneID: String
        /// Into the model's zones; resolved from `zoneID` on decoding.
        var zone: Int = -1
        var enteredAt: Double
        var dwellFired: Bool
        /// The last fix inside at or before the dwell moment: where the dwell event says it was.
        var anchor: Position

        enum CodingKeys: String, CodingKey {
            case zoneID = "zone"
            case enteredAt = "entered_at"
            case dwellFired = "dwell_fired"
            case anchor
        }
    }

    struct Motion: Sendable, Equatable, Codable {
        var start: Double
        var activity: MotionSample.Activity
    }

    struct Firing: Sendable, Equatable, Codable {
        var gateID: String
        var gate: Int = -1
        /// The triggering fix's time and seq.
        var time: Double
        var seq: UInt64?

        enum CodingKeys: String, CodingKey {
            case gateID = "gate"
            case time, seq
        }
    }

    var id: String
    /// The newest fix seen, for derived speed and to skip stragglers.
    var lastFix: Position?
    /// `now` when the last fix was handled: a device silent for `min_dwell_s` gets its dwell on a tick.
    var lastSeenAt: Double?
    var visits: [Visit] = []
    /// The latest samples, oldest first; the one in effect at a fix's time decides `motion:`.
    var motion: [Motion] = []
    var firings: [Firing] = []

    static let motionHistory = 8

    init(id: String) {
        self.id = id
    }

    enum CodingKeys: String, CodingKey {
        case id, visits, motion, firings
        case lastFix = "last_fix"
        case lastSeenAt = "last_seen_at"
    }

    /// The activity of the sample in effect at `time`.
    func activity(at time: Double) -> MotionSample.Activity? {
        motion.last { $0.start <= time }?.activity
    }

    mutating func record(_ sample: Motion) {
        if let same = motion.firstIndex(where: { $0.start == sample.start }) {
            motion[same] = sample
            return
        }
        let position = motion.firstIndex { $0.start > sample.start } ?? motion.count
        motion.insert(sample, at: position)
        if motion.count > Self.motionHistory { motion.removeFirst(motion.count - Self.motionHistory) }
    }

    /// Points zone and gate indices into `model`, dropping what it no longer has.
    mutating func resolve(in model: GeofenceModel) {
        visits = visits.compactMap { visit in
            guard let zone = model.zoneByID[visit.zoneID] else { return nil }
            var visit = visit
            visit.zone = zone
            return visit
        }
        firings = firings.compactMap { firing in
            guard let gate = model.gateByID[firing.gateID] else { return nil }
            var firing = firing
            firing.gate = gate
            return firing
        }
    }
}
