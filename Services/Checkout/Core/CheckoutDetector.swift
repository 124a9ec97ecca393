import DrivebusGeo
import DrivebusSchema
import Foundation

/// What the detector is fed, in journal order. `tick` is the wall clock; it carries no seq.
public enum CheckoutInput: Sendable {
    case checkin(TaxiCheckin)
    case motion(MotionSample)
    case fix(Fix)
    case tick(now: Date)
}

/// Taxi check-out for all devices, as a pure state machine: the output is a function of the
/// inputs alone, and the value itself (Codable) is the checkpoint. See `docs/checkout.md`.
public struct CheckoutDetector: Sendable, Codable, Equatable {
    public var configuration: CheckoutConfiguration
    /// The highest journal seq handled; inputs at or below it are replays and are ignored.
    public private(set) var lastSeq: UInt64 = 0
    private var devices: [String: DeviceState] = [:]

    public init(configuration: CheckoutConfiguration = CheckoutConfiguration()) {
        self.configuration = configuration
    }

    /// The configuration is not in the checkpoint: see `CheckpointConfiguration`.
    enum CodingKeys: String, CodingKey {
        case lastSeq = "last_seq"
        case devices
    }

    public init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        configuration = try CheckpointConfiguration.read(CheckoutConfiguration.self, from: decoder)
        lastSeq = try container.decode(UInt64.self, forKey: .lastSeq)
        devices = try container.decode([String: DeviceState].self, forKey: .devices)
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(lastSeq, forKey: .lastSeq)
        try container.encode(devices, forKey: .devices)
    }

    /// Check-ins still waiting for their check-out.
    public var openCheckins: Int { devices.values.reduce(0) { $0 + ($1.ride == nil ? 0 : 1) } }

    public mutating func handle(_ input: CheckoutInput) -> [TaxiCheckout] {
        switch input {
        case .checkin(let checkin):
            guard admit(checkin.seq), DeviceID.isValid(checkin.device), checkin.time.isSane else { return [] }
            return self.checkin(checkin)
        case .motion(let sample):
            guard admit(sample.seq), DeviceID.isValid(sample.device), sample.start.isSane else { return [] }
            return motion(sample)
        case .fix(let fix):
            guard admit(fix.seq), DeviceID.isValid(fix.device), fix.time.isSane,
                  fix.lat.isFinite, fix.lon.isFinite, abs(fix.lat) <= 90, abs(fix.lon) <= 180
            else { return [] }
            return self.fix(fix)
        case .tick(let now):
            guard now.isSane else { return [] }
            return tick(now)
        }
    }

    /// Records `seq` and says whether the input is new. Inputs without a seq (tests, local tools)
    /// are always taken.
    private mutating func admit(_ seq: UInt64?) -> Bool {
        guard let seq else { return true }
        guard seq > lastSeq else { return false }
        lastSeq = seq
        return true
    }

    private mutating func checkin(_ checkin: TaxiCheckin) -> [TaxiCheckout] {
        var state = devices[checkin.device] ?? DeviceState()
        var out: [TaxiCheckout] = []
        // A new check-in replaces an open one. The new check-in's time is a clock the data itself
        // provides, so the old ride is decided by it as a tick would; if that decides nothing, the
        // old ride ends without a check-out.
        if let old = state.ride, let checkout = old.expire(at: checkin.time, clock: true, configuration) {
            out.append(checkout)
        }
        state.ride = Ride(checkin: checkin, lastMotion: state.lastMotion, configuration)
        devices[checkin.device] = state
        return out
    }

    private mutating func motion(_ sample: MotionSample) -> [TaxiCheckout] {
        var state = devices[sample.device] ?? DeviceState()
        let activity = Activity(sample)
        // Samples are taken in time order: one no newer than the last is stale, but it still
        // shows that the device sends motion.
        let isNew = state.lastMotion.map { activity.start > $0.start } ?? true
        if isNew { state.lastMotion = activity }
        var out: [TaxiCheckout] = []
        if var ride = state.ride {
            if let checkout = ride.motion(activity, isNew: isNew, configuration) {
                out.append(checkout)
                state.ride = nil
            } else {
                state.ride = ride
            }
        }
        devices[sample.device] = state
        return out
    }

    private mutating func fix(_ fix: Fix) -> [TaxiCheckout] {
        // Fixes matter only during a ride; nothing is kept for devices without one.
        guard var state = devices[fix.device], var ride = state.ride else { return [] }
        if let checkout = ride.fix(fix, configuration) {
            state.ride = nil
            devices[fix.device] = state.isEmpty ? nil : state
            return [checkout]
        }
        state.ride = ride
        devices[fix.device] = state
        return []
    }

    private mutating func tick(_ now: Date) -> [TaxiCheckout] {
        var out: [TaxiCheckout] = []
        // Sorted, so that one tick's check-outs come in the same order on every run.
        for device in devices.keys.sorted() {
            guard var state = devices[device], let ride = state.ride,
                  let checkout = ride.expire(at: now, clock: true, configuration)
            else { continue }
            out.append(checkout)
            state.ride = nil
            devices[device] = state.isEmpty ? nil : state
        }
        return out
    }
}

extension TaxiCheckout {
    /// Deterministic, so a replay re-derives the same id and stores deduplicate:
    /// `taxi.checkout-<device>-<checkin seq>` (the check-in time in epoch ms, after a `t`, for a
    /// check-in that has no seq).
    public var eventID: String {
        if let checkinSeq { return "taxi.checkout-\(device)-\(checkinSeq)" }
        return "taxi.checkout-\(device)-t\(Int64((checkinTime.timeIntervalSince1970 * 1000).rounded()))"
    }
}

// MARK: - State

/// A motion sample, trimmed to what the rule needs.
struct Activity: Codable, Sendable, Equatable {
    var start: Date
    var activity: MotionSample.Activity
    var confidence: MotionSample.Confidence

    init(_ sample: MotionSample) {
        start = sample.start
        activity = sample.activity
        confidence = sample.confidence
    }

    func isWalk(_ configuration: CheckoutConfiguration) -> Bool {
        (activity == .walking || activity == .running) && confidence >= configuration.minConfidence
    }
}

struct DeviceState: Codable, Sendable, Equatable {
    /// The device's newest motion sample, kept between rides: it tells whether the device sends
    /// motion, and it is the activity in progress when a check-in arrives.
    var lastMotion: Activity?
    var ride: Ride?

    var isEmpty: Bool { lastMotion == nil && ride == nil }
}

/// One open check-in and its progress.
struct Ride: Codable, Sendable, Equatable {
    var checkin: TaxiCheckin
    /// Decided by the motion rule only (the fixes rule is off).
    var motionDevice: Bool
    /// The walk in progress: consecutive walking/running samples at or above `min_confidence`,
    /// with the start, activity and confidence of the first of them.
    var walk: Activity?
    var track = Track()

    init(checkin: TaxiCheckin, lastMotion: Activity?, _ configuration: CheckoutConfiguration) {
        self.checkin = checkin
        motionDevice = lastMotion.map { $0.start >= checkin.time - configuration.motionMemoryS } ?? false
        // A walk under way at check-in (to the taxi) carries on, and never counts.
        walk = lastMotion.flatMap { $0.isWalk(configuration) ? $0 : nil }
    }

    func deadline(_ configuration: CheckoutConfiguration) -> Date { checkin.time + configuration.maxRideS }

    /// A walk counts only if it started after the grace period, and before `max_ride` ended the ride.
    func counts(_ walk: Activity, _ configuration: CheckoutConfiguration) -> Bool {
        walk.start >= checkin.time + configuration.gracePeriodS && walk.start < deadline(configuration)
    }

    mutating func motion(_ sample: Activity, isNew: Bool, _ configuration: CheckoutConfiguration) -> TaxiCheckout? {
        motionDevice = true
        track.walkStart = nil
        guard isNew else { return nil }
        // The new sample's start proves how long the walk in progress has lasted.
        if let walk, counts(walk, configuration), sample.start >= walk.start + configuration.leadTimeS {
            return checkout(walk, configuration)
        }
        if sample.isWalk(configuration) {
            if walk == nil { walk = sample }
        } else {
            walk = nil
        }
        return expire(at: sample.start, clock: false, configuration)
    }

    mutating func fix(_ fix: Fix, _ configuration: CheckoutConfiguration) -> TaxiCheckout? {
        guard fix.time >= checkin.time else { return nil }
        if let last = track.last, fix.time <= last.time { return nil }
        if (fix.accuracyM ?? 0) <= configuration.maxAccuracyM,
           let start = track.add(fix, fixesRule: !motionDevice, configuration),
           start.time < deadline(configuration) {
            return TaxiCheckout(
                device: checkin.device, checkinSeq: checkin.seq, checkinTime: checkin.time,
                checkoutTime: start.time, reason: .fixes, confidence: nil,
                rideS: Self.milliseconds(start.time.timeIntervalSince(checkin.time)),
                rideDistanceM: Self.decimetres(start.distanceM))
        }
        return expire(at: fix.time, clock: false, configuration)
    }

    /// Decides what the time `now` alone decides. A clock (a tick, or a later check-in) proves that
    /// the newest sample has lasted until `now`; the time of data (a fix, a sample) only ends the
    /// ride at `max_ride_s`. A candidate that started before the deadline is waited for.
    func expire(at now: Date, clock: Bool, _ configuration: CheckoutConfiguration) -> TaxiCheckout? {
        if clock, let walk, counts(walk, configuration), now >= walk.start + configuration.leadTimeS {
            return checkout(walk, configuration)
        }
        let deadline = deadline(configuration)
        guard now >= deadline else { return nil }
        if let walk, counts(walk, configuration) { return nil }
        if let start = track.walkStart, start.time < deadline, now < start.time + configuration.leadTimeS { return nil }
        return TaxiCheckout(
            device: checkin.device, checkinSeq: checkin.seq, checkinTime: checkin.time,
            checkoutTime: deadline, reason: .maxRide, confidence: nil,
            rideS: Self.milliseconds(configuration.maxRideS),
            rideDistanceM: track.distance(at: deadline).map(Self.decimetres))
    }

    private func checkout(_ walk: Activity, _ configuration: CheckoutConfiguration) -> TaxiCheckout {
        TaxiCheckout(
            device: checkin.device, checkinSeq: checkin.seq, checkinTime: checkin.time,
            checkoutTime: walk.start, reason: walk.activity == .running ? .running : .walking,
            confidence: walk.confidence,
            rideS: Self.milliseconds(walk.start.timeIntervalSince(checkin.time)),
            rideDistanceM: track.distance(at: walk.start).map(Self.decimetres))
    }

    // Rounded, so that payloads do not carry binary noise (times are whole milliseconds).
    static func milliseconds(_ seconds: Double) -> Double { (seconds * 1000).rounded() / 1000 }
    static func decimetres(_ metres: Double) -> Double { (metres * 10).rounded() / 10 }
}

/// The ride's fixes: distance travelled, and the fixes rule's progress.
struct Track: Codable, Sendable, Equatable {
    struct Point: Codable, Sendable, Equatable {
        var time: Date
        var lat: Double
        var lon: Double
        /// Distance along the fixes from the ride's first fix.
        var distanceM: Double
        var coordinate: Coordinate { Coordinate(lat: lat, lon: lon) }
    }

    struct Mark: Codable, Sendable, Equatable {
        var time: Date
        var distanceM: Double
    }

    /// One mark per `markIntervalS` of fixes, so the distance at a past moment (a walk's start
    /// that a later sample reveals) can be interpolated without keeping every fix.
    static let markIntervalS = 10.0

    var last: Point?
    var marks: [Mark] = []
    /// A fix at riding speed has been seen.
    var ridden = false
    /// Where the ride stopped: the first fix below riding speed after the last one at it.
    var stop: Coordinate?
    /// The first fix of the current run at walking pace.
    var walkStart: Mark?

    /// Adds a fix newer than `last`. With `fixesRule`, returns the first walking fix once walking
    /// pace has lasted `lead_time_s`.
    mutating func add(_ fix: Fix, fixesRule: Bool, _ configuration: CheckoutConfiguration) -> Mark? {
        let here = Coordinate(lat: fix.lat, lon: fix.lon)
        let previous = last
        var distanceM = 0.0
        var derivedSpeed: Double?
        if let previous {
            let step = Geo.distance(previous.coordinate, here)
            distanceM = previous.distanceM + step
            derivedSpeed = step / fix.time.timeIntervalSince(previous.time)
        }
        last = Point(time: fix.time, lat: fix.lat, lon: fix.lon, distanceM: distanceM)
        if marks.last.map({ fix.time >= $0.time + Self.markIntervalS }) ?? true {
            marks.append(Mark(time: fix.time, distanceM: distanceM))
        }
        guard fixesRule else { return nil }

        // The phone's own speed when it has one, else the speed from the previous fix.
        let reported = fix.speedMps.flatMap { $0.isFinite && $0 >= 0 ? $0 : nil }
        guard let speed = reported ?? derivedSpeed, speed.isFinite else { return nil }
        if speed >= configuration.ridingSpeedMps {
            ridden = true
            stop = nil
            walkStart = nil
            return nil
        }
        guard ridden else { return nil }
        let minimum = configuration.walkingSpeedMinMps, maximum = configuration.walkingSpeedMaxMps
        var walking = speed >= minimum && speed <= maximum
        if let stop, let previous {
            // Moving slowly away from where the ride stopped counts too: phones report a speed of
            // 0 or none at walking pace often enough.
            if !walking, speed <= maximum {
                let away = (Geo.distance(stop, here) - Geo.distance(stop, previous.coordinate))
                    / fix.time.timeIntervalSince(previous.time)
                walking = away >= minimum && away <= maximum
            }
        } else if stop == nil {
            stop = here
        }
        guard walking else {
            walkStart = nil
            return nil
        }
        let start = walkStart ?? Mark(time: fix.time, distanceM: distanceM)
        walkStart = start
        return fix.time >= start.time + configuration.leadTimeS ? start : nil
    }

    /// Distance along the fixes up to `time`, interpolated between marks; nil when no fix came
    /// before it.
    func distance(at time: Date) -> Double? {
        guard let last else { return nil }
        if time >= last.time { return last.distanceM }
        let index = marks.partitioningIndex { $0.time > time }
        guard index > 0 else { return nil }
        let before = marks[index - 1]
        let after = index < marks.count ? marks[index] : Mark(time: last.time, distanceM: last.distanceM)
        let span = after.time.timeIntervalSince(before.time)
        guard span > 0 else { return before.distanceM }
        return before.distanceM + (after.distanceM - before.distanceM) * time.timeIntervalSince(before.time) / span
    }
}

extension Array {
    /// The first index whose element satisfies `belongsInSecondPartition`, for an array already
    /// partitioned by it (binary search).
    fileprivate func partitioningIndex(where belongsInSecondPartition: (Element) -> Bool) -> Int {
        var low = startIndex, high = endIndex
        while low < high {
            let middle = low + (high - low) / 2
            if belongsInSecondPartition(self[middle]) { high = middle } else { low = middle + 1 }
        }
        return low
    }
}

extension Date {
    /// Finite and within a few thousand years, so that arithmetic and formatting stay safe.
    fileprivate var isSane: Bool {
        let seconds = timeIntervalSince1970
        return seconds.isFinite && abs(seconds) < 100_000_000_000
    }
}
