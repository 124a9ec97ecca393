import DrivebusGeo
import DrivebusSchema
import Foundation

/// What the segmenter is fed, in journal order. `tick` is the only input from a wall clock.
public enum TripsInput: Sendable {
    case fix(Fix)
    case motion(MotionSample)
    case importFinished(ImportFinished)
    case tick(now: Date)
}

/// What it publishes. Every id is derived from the journal, so a replay yields the same ids.
public enum TripsOutput: Sendable, Equatable {
    case started(TripStarted)
    case ended(TripEnded)
    case silent(DeviceSilent)

    /// The event type, which is also the topic without its device suffix.
    public var type: String {
        switch self {
        case .started: "trip.started"
        case .ended: "trip.ended"
        case .silent: "device.silent"
        }
    }

    public var device: String {
        switch self {
        case .started(let event): event.device
        case .ended(let event): event.device
        case .silent(let event): event.device
        }
    }

    /// `trip.started-car-1234`, `trip.ended-car-1234` (device and the seq of the trip's first
    /// fix), `device.silent-car-1300` (device and the seq of its last fix before the silence).
    public var eventID: String {
        switch self {
        case .started(let event): "trip.started-\(event.tripID)"
        case .ended(let event): "trip.ended-\(event.tripID)"
        case .silent(let event):
            "device.silent-\(Naming.key(device: event.device, seq: event.lastSeq, time: event.lastTime))"
        }
    }
}

/// Per-device trip segmentation as a pure state machine: the same inputs give the same outputs,
/// and a snapshot (it is `Codable`) taken between any two inputs, restored and fed the rest, gives
/// exactly what an uninterrupted run gives.
///
/// The rules, Traccar's with its defaults and the repairs its users ask for:
/// - **Moving** once an accepted fix lies `min_distance_m` from where the device last rested (the
///   mean of its resting fixes there). The trip starts at the last fix at rest before that, so its
///   first metres are not lost; a stream that begins in motion starts at its first fix. With
///   `automotive` motion of medium or high confidence, half the distance will do. While the device
///   is on foot (walking or running, medium or high), it starts no trip.
/// - **Stopped** once its fixes have stayed within a circle `min_distance_m` across (within half
///   of it of the stay's first fix) for `min_duration_s`. A car circling city blocks inside 200 m
///   is driving, not parked; the Vienna fixture does that for eight minutes. The trip ends at the
///   first fix of the stay, taken as where the device came within `min_distance_m / 4` of where
///   it rested and stopped moving at `min_distance_m / min_duration_s`, so the approach to a
///   parking space is not cut off.
/// - **Walking** (medium or high) that lasts `walking_end_s` ends the trip early, where the device
///   stopped before the walk began.
/// - **Gaps**: a gap between accepted fixes longer than `min(stop_gap_s, idle_close_s)` ends the
///   trip as `tick` would have (below), and the fix after it starts afresh: no trip spans a gap.
/// - **Outliers**: a fix with accuracy worse than `max_accuracy_m`, with the same time as the last
///   accepted fix, or implying more than `max_speed_mps` from it, adds no distance and moves no
///   state. Three fast fixes in a row that agree with one another mean the device really jumped
///   (or the earlier fix was wrong): the third is accepted, as after a gap.
/// - **Out of order**: a fix older than the device's last accepted fix is counted and skipped.
/// - **Distance** is summed in steps of at least `distance_noise_m`, so GPS scatter while stopped
///   in traffic adds nothing.
///
/// Why gaps close like ticks: `tick` closes a trip whose device has sent no accepted fix for more
/// than `idle_close_s`, at a point taken from the data alone: the first fix of its final rest when
/// it had come to rest (stayed within `min_distance_m / 4` for `min_duration_s / 4`), else its last
/// fix. A replay has no ticks, so there the next fix after the silence closes the trip at the same
/// point, and the live run and the replay publish the same trip with the same id. The one case
/// that still differs is a phone that uploads fixes more than `idle_close_s` late: the live run has
/// already closed the trip, and the late fixes make a trip of their own.
public struct TripSegmenter: Sendable, Codable {
    /// Settable, so that a segmenter restored from a checkpoint runs with today's config: an
    /// edited `trips:` section applies from the next input after a restart.
    public var configuration: TripsConfiguration
    /// The highest journal seq processed. Inputs with a seq at or below it are ignored, so a replay
    /// that overlaps what was already processed changes nothing. Inputs without a seq are always
    /// processed.
    public private(set) var lastSeq: UInt64 = 0
    /// Fixes older than their device's last accepted fix, skipped.
    public private(set) var outOfOrderCount = 0
    /// Fixes dropped as outliers (accuracy, speed, a repeated time or invalid numbers).
    public private(set) var outlierCount = 0

    private var devices: [DeviceTrack] = []
    private var slots: [String: Int] = [:]
    /// The last device looked up: fixes come in runs from one device.
    private var cachedDevice = ""
    private var cachedSlot = -1

    public init(configuration: TripsConfiguration) {
        self.configuration = configuration
    }

    /// Feeds one input and returns what it causes, in order. `arrivedAt` is the wall-clock time a
    /// fix reached the service: ticks then measure a device's silence from it, not only from the
    /// fix's own time, which for imported history lies far in the past.
    public mutating func handle(_ input: TripsInput, arrivedAt: Date? = nil) -> [TripsOutput] {
        var out: [TripsOutput] = []
        let settings = Settings(configuration)
        switch input {
        case .fix(let fix):
            guard advance(fix.seq) else { return out }
            let index = slot(for: fix.device)
            if let arrivedAt { devices[index].arrivedAt = arrivedAt.timeIntervalSinceReferenceDate }
            switch devices[index].fix(fix, settings, &out) {
            case .accepted: break
            case .outOfOrder: outOfOrderCount += 1
            case .outlier: outlierCount += 1
            }
        case .motion(let sample):
            guard advance(sample.seq) else { return out }
            let index = slot(for: sample.device)
            devices[index].motion(sample, settings, &out)
        case .importFinished(let finished):
            guard advance(finished.seq), let index = existingSlot(for: finished.device) else { return out }
            devices[index].closeOpenTrip(importedOnly: true, settings, &out)
        case .tick(let now):
            let nowT = now.timeIntervalSinceReferenceDate
            guard nowT.isFinite else { return out }
            // Devices in the order they first appeared: a function of the journal, so stable.
            for slot in devices.indices {
                devices[slot].tick(now: nowT, settings, &out)
            }
        }
        return out
    }

    private mutating func advance(_ seq: UInt64?) -> Bool {
        guard let seq else { return true }
        guard seq > lastSeq else { return false }
        lastSeq = seq
        return true
    }

    private mutating func slot(for device: String) -> Int {
        if cachedSlot >= 0, device == cachedDevice { return cachedSlot }
        let slot: Int
        if let known = slots[device] {
            slot = known
        } else {
            slot = devices.count
            devices.append(DeviceTrack(device: device))
            slots[device] = slot
        }
        cachedDevice = device
        cachedSlot = slot
        return slot
    }

    private func existingSlot(for device: String) -> Int? {
        if cachedSlot >= 0, device == cachedDevice { return cachedSlot }
        return slots[device]
    }

    // MARK: Codable (the checkpoint)

    /// The configuration is not in the checkpoint: see `CheckpointConfiguration`.
    enum CodingKeys: String, CodingKey {
        case devices
        case lastSeq = "last_seq"
        case outOfOrderCount = "out_of_order"
        case outlierCount = "outliers"
    }

    public init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        configuration = try CheckpointConfiguration.read(TripsConfiguration.self, from: decoder)
        lastSeq = try container.decode(UInt64.self, forKey: .lastSeq)
        outOfOrderCount = try container.decode(Int.self, forKey: .outOfOrderCount)
        outlierCount = try container.decode(Int.self, forKey: .outlierCount)
        devices = try container.decode([DeviceTrack].self, forKey: .devices)
        for (slot, device) in devices.enumerated() {
            // A damaged checkpoint must fail to load, not crash the service later.
            guard device.isConsistent, slots.updateValue(slot, forKey: device.device) == nil else {
                throw DecodingError.dataCorruptedError(
                    forKey: .devices, in: container, debugDescription: "device \(slot) is inconsistent or repeated")
            }
        }
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(lastSeq, forKey: .lastSeq)
        try container.encode(outOfOrderCount, forKey: .outOfOrderCount)
        try container.encode(outlierCount, forKey: .outlierCount)
        try container.encode(devices, forKey: .devices)
    }
}

/// The configuration with its squares and derived values worked out once per input.
struct Settings {
    let config: TripsConfiguration
    let startSquared: Double
    let automotiveStartSquared: Double
    let staySquared: Double
    let restRadius: Double
    let restSquared: Double
    let restMinS: Double
    let movingSpeed: Double

    init(_ config: TripsConfiguration) {
        self.config = config
        startSquared = config.minDistanceM * config.minDistanceM
        automotiveStartSquared = config.automotiveStartM * config.automotiveStartM
        let stay = config.minDistanceM / 2
        staySquared = stay * stay
        restRadius = config.restRadiusM
        restSquared = restRadius * restRadius
        restMinS = config.minDurationS / 4
        movingSpeed = config.movingSpeedMps
    }
}

/// Ids and keys built from journal data only.
enum Naming {
    /// `car-1234`, or `car-t1635956390000` (epoch ms) for data that carries no journal seq.
    /// Anything outside `[A-Za-z0-9_-]` becomes `_`, so the id is printable ASCII without quotes.
    static func key(device: String, seq: UInt64?, time: Date) -> String {
        var safe = String(decoding: device.utf8.map { isIDByte($0) ? $0 : UInt8(ascii: "_") }, as: UTF8.self)
        if let seq, seq > 0 {
            safe += "-\(seq)"
        } else {
            let ms = (time.timeIntervalSince1970 * 1000).rounded()
            safe += "-t\(ms.magnitude < 9e18 ? Int64(ms) : 0)"
        }
        return safe
    }

    private static func isIDByte(_ byte: UInt8) -> Bool {
        switch byte {
        case UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "a")...UInt8(ascii: "z"),
            UInt8(ascii: "-"), UInt8(ascii: "_"):
            true
        default:
            false
        }
    }
}

/// Flat-earth distances for the thresholds: exact enough at a few hundred metres, and five
/// times cheaper than haversine, which is kept for the distance a trip reports.
@inline(__always)
func flatDistanceSquared(_ a: TrackPoint, _ b: TrackPoint, cosLat: Double) -> Double {
    var dLon = b.lon - a.lon
    if dLon > 180 { dLon -= 360 } else if dLon < -180 { dLon += 360 }
    let x = dLon * cosLat * metresPerDegree
    let y = (b.lat - a.lat) * metresPerDegree
    return x * x + y * y
}

@inline(__always)
func flatDistanceSquared(lat: Double, lon: Double, _ b: TrackPoint, cosLat: Double) -> Double {
    var dLon = b.lon - lon
    if dLon > 180 { dLon -= 360 } else if dLon < -180 { dLon += 360 }
    let x = dLon * cosLat * metresPerDegree
    let y = (b.lat - lat) * metresPerDegree
    return x * x + y * y
}

let metresPerDegree = Geo.earthRadiusM * .pi / 180

@inline(__always)
func cosine(ofLatitude lat: Double) -> Double { cos(lat * .pi / 180) }
