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
    /// The previous tick's wall-clock time.
    private var clock: Date?

    public init(configuration: CheckoutConfiguration = CheckoutConfiguration()) {
        self.configuration = configuration
    }

    /// The configuration is not in the checkpoint: see `CheckpointConfiguration`.
    enum CodingKeys: String, CodingKey {
        case lastSeq = "last_seq"
        case devices, clock
    }

    public init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        configuration = try CheckpointConfiguration.read(CheckoutConfiguration.self, from: decoder)
        lastSeq = try container.decode(UInt64.self, forKey: .lastSeq)
        devices = try container.decode([String: DeviceState].self, forKey: .devices)
        clock = try container.decodeIfPresent(Date.self, forKey: .clock)
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(lastSeq, forKey: .lastSeq)
        try container.encode(devices, forKey: .devices)
        try container.encodeIfPresent(clock, forKey: .clock)
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
        // A tick proves silence only since the previous one, and a few seconds at most: a gap
        // between ticks is the service being down or catching up, when data may have been waiting.
        let step = clock.map { min(max(now.timeIntervalSince($0), 0), Self.maxTickStepS) } ?? 0
        clock = now
        var out: [TaxiCheckout] = []
        // Sorted, so that one tick's check-outs come in the same order on every run.
        for device in devices.keys.sorted() {
            guard var state = devices[device], var ride = state.ride else { continue }
            ride.silentS += step
            if let checkout = ride.expire(at: ride.provenTime, clock: true, configuration) {
                out.append(checkout)
                state.ride = nil
            } else {
                state.ride = ride
            }
            devices[device] = state.isEmpty ? nil : state
        }
        return out
    }

    /// The most one tick can add to a ride's observed silence.
    static let maxTickStepS = 5.0
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

    func isVehicle(_ configuration: CheckoutConfiguration) -> Bool {
        (activity == .automotive || activity == .cycling) && confidence >= configuration.minConfidence
    }
}

struct DeviceState: Codable, Sendable, Equatable {
    /// The device's newest motion sample, kept between rides: it is the activity in progress when
    /// a check-in arrives.
    var lastMotion: Activity?
    var ride: Ride?

    var isEmpty: Bool { lastMotion == nil && ride == nil }
}

/// One open check-in and its progress.
struct Ride: Codable, Sendable, Equatable {
    var checkin: TaxiCheckin
    /// The walk in progress: consecutive walking/running samples at or above `min_confidence`,
    /// with the start, activity and confidence of the first of them.
    var walk: Activity?
    var track = Track()
    var footsteps = Footsteps()
    /// The ride's own clock: the newest time of its data (fix time, sample start), from the
    /// check-in on. `silentS` of observed wall-clock silence extends it.
    var dataTime: Date
    /// Seconds of ticks since the device's last input. Only ticks the running service saw
    /// count, a few seconds each at most, so downtime and catch-up never pass for silence.
    var silentS = 0.0
    /// When the ride was first seen moving: a fix at riding speed, or the phone saying it is in
    /// a vehicle. A motion walk before it is the rider still on the way to the taxi.
    var movedAt: Date?

    enum CodingKeys: String, CodingKey { case checkin, walk, track, footsteps, dataTime, silentS, movedAt }

    init(checkin: TaxiCheckin, lastMotion: Activity?, _ configuration: CheckoutConfiguration) {
        self.checkin = checkin
        dataTime = checkin.time
        // A walk under way at check-in (to the taxi) carries on, and never counts.
        walk = lastMotion.flatMap { $0.isWalk(configuration) ? $0 : nil }
        if let lastMotion {
            footsteps.motion(lastMotion, configuration)
            if lastMotion.isVehicle(configuration) { movedAt = checkin.time }
        }
    }

    /// Checkpoints written before the fixes rule was rewritten lack the newer fields; the ride
    /// goes on from them with an empty fixes history.
    init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        checkin = try container.decode(TaxiCheckin.self, forKey: .checkin)
        walk = try container.decodeIfPresent(Activity.self, forKey: .walk)
        track = try container.decodeIfPresent(Track.self, forKey: .track) ?? Track()
        footsteps = try container.decodeIfPresent(Footsteps.self, forKey: .footsteps) ?? Footsteps()
        dataTime = try container.decodeIfPresent(Date.self, forKey: .dataTime) ?? checkin.time
        silentS = try container.decodeIfPresent(Double.self, forKey: .silentS) ?? 0
        // A ride from before `movedAt` existed goes on as it was judged then, as if it had moved.
        movedAt = container.contains(.movedAt) ? try container.decodeIfPresent(Date.self, forKey: .movedAt) : checkin.time
    }

    /// Written out in full: a ride not yet seen moving says so (`null`), which a missing key
    /// does not.
    func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(checkin, forKey: .checkin)
        try container.encodeIfPresent(walk, forKey: .walk)
        try container.encode(track, forKey: .track)
        try container.encode(footsteps, forKey: .footsteps)
        try container.encode(dataTime, forKey: .dataTime)
        try container.encode(silentS, forKey: .silentS)
        try container.encode(movedAt, forKey: .movedAt)
    }

    func deadline(_ configuration: CheckoutConfiguration) -> Date { checkin.time + configuration.maxRideS }

    /// The ride's time as far as the wall clock proves it: its newest data plus observed silence.
    var provenTime: Date { dataTime + silentS }

    /// A walk counts only if it started after the grace period, and before `max_ride` ended the ride.
    func counts(_ start: Date, _ configuration: CheckoutConfiguration) -> Bool {
        start >= checkin.time + configuration.gracePeriodS && start < deadline(configuration)
    }

    /// A motion walk counts, moreover, only once the ride has been seen moving before it began.
    func motionWalkCounts(_ walk: Activity, _ configuration: CheckoutConfiguration) -> Bool {
        counts(walk.start, configuration) && movedAt.map { $0 <= walk.start } ?? false
    }

    mutating func heard(at time: Date) {
        silentS = 0
        dataTime = max(dataTime, time)
    }

    mutating func motion(_ sample: Activity, isNew: Bool, _ configuration: CheckoutConfiguration) -> TaxiCheckout? {
        heard(at: sample.start)
        guard isNew else { return nil }
        // A vehicle sample that began before the check-in, journalled after it (phones upload
        // motion in batches), counts from the check-in, as it would had it come first.
        if movedAt == nil, sample.isVehicle(configuration) { movedAt = max(sample.start, checkin.time) }
        // The new sample's start proves how long the walk in progress has lasted.
        if let walk, motionWalkCounts(walk, configuration), sample.start >= walk.start + configuration.leadTimeS {
            return checkout(walk, decidedAt: sample.start, configuration)
        }
        footsteps.motion(sample, configuration)
        if sample.isWalk(configuration) {
            if walk == nil { walk = sample }
        } else {
            walk = nil
        }
        return expire(at: sample.start, clock: false, configuration)
    }

    mutating func fix(_ fix: Fix, _ configuration: CheckoutConfiguration) -> TaxiCheckout? {
        heard(at: fix.time)
        guard fix.time >= checkin.time else { return nil }
        if let last = track.last, fix.time <= last.time { return nil }
        if (fix.accuracyM ?? 0) <= configuration.maxAccuracyM {
            track.add(fix)
            let found = footsteps.add(fix, configuration)
            if movedAt == nil { movedAt = footsteps.ridingAt }
            if let found, counts(found.start, configuration) {
                let walked = found.walkedM
                return TaxiCheckout(
                    device: checkin.device, checkinSeq: checkin.seq, checkinTime: checkin.time,
                    checkoutTime: found.start, reason: .fixes,
                    confidence: !found.far ? .low : walked >= 2 * configuration.walkMinDistanceM ? .high : .medium,
                    rideS: Self.milliseconds(found.start.timeIntervalSince(checkin.time)),
                    rideDistanceM: track.distance(at: found.start).map(Self.decimetres),
                    walkedM: Self.decimetres(walked), decidedAt: fix.time, stoppedAt: found.stoppedAt)
            }
        }
        return expire(at: fix.time, clock: false, configuration)
    }

    /// Decides what the time `now` alone decides. A clock (observed silence, or a later
    /// check-in) proves that the newest sample has lasted until `now`; the time of data (a fix, a
    /// sample) only ends the ride at `max_ride_s`. A candidate that started before the deadline
    /// is waited for.
    func expire(at now: Date, clock: Bool, _ configuration: CheckoutConfiguration) -> TaxiCheckout? {
        if clock, let walk, motionWalkCounts(walk, configuration), now >= walk.start + configuration.leadTimeS {
            return checkout(walk, decidedAt: now, configuration)
        }
        let deadline = deadline(configuration)
        guard now >= deadline else { return nil }
        if let walk, motionWalkCounts(walk, configuration) { return nil }
        if let start = footsteps.candidate, start < deadline, now < start + configuration.walkConfirmS { return nil }
        return TaxiCheckout(
            device: checkin.device, checkinSeq: checkin.seq, checkinTime: checkin.time,
            checkoutTime: deadline, reason: .maxRide, confidence: nil,
            rideS: Self.milliseconds(configuration.maxRideS),
            rideDistanceM: track.distance(at: deadline).map(Self.decimetres),
            walkedM: nil, decidedAt: now)
    }

    private func checkout(_ walk: Activity, decidedAt: Date, _ configuration: CheckoutConfiguration) -> TaxiCheckout {
        let before = track.distance(at: walk.start)
        let walked = track.distance(at: decidedAt).map { $0 - (before ?? 0) }
        return TaxiCheckout(
            device: checkin.device, checkinSeq: checkin.seq, checkinTime: checkin.time,
            checkoutTime: walk.start, reason: walk.activity == .running ? .running : .walking,
            confidence: walk.confidence,
            rideS: Self.milliseconds(walk.start.timeIntervalSince(checkin.time)),
            rideDistanceM: before.map(Self.decimetres),
            walkedM: walked.map(Self.decimetres), decidedAt: decidedAt)
    }

    // Rounded, so that payloads do not carry binary noise (times are whole milliseconds).
    static func milliseconds(_ seconds: Double) -> Double { (seconds * 1000).rounded() / 1000 }
    static func decimetres(_ metres: Double) -> Double { (metres * 10).rounded() / 10 }
}

/// The distance along the ride's fixes.
struct Track: Codable, Sendable, Equatable {
    struct Mark: Codable, Sendable, Equatable {
        var time: Date
        var distanceM: Double
    }

    /// One mark per `markIntervalS` of fixes, so the distance at a past moment (a walk's start
    /// that a later sample reveals) can be interpolated without keeping every fix.
    static let markIntervalS = 10.0

    var last: Mark?
    var lastPosition: Coordinate?
    var marks: [Mark] = []

    init() {}

    enum CodingKeys: String, CodingKey { case last, lastPosition, marks }

    /// Older checkpoints kept `last` with its position (extra keys decode as a `Mark`).
    init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        last = try container.decodeIfPresent(Mark.self, forKey: .last)
        lastPosition = try container.decodeIfPresent(Coordinate.self, forKey: .lastPosition)
        marks = try container.decodeIfPresent([Mark].self, forKey: .marks) ?? []
    }

    /// Adds a fix newer than `last`.
    mutating func add(_ fix: Fix) {
        let here = Coordinate(lat: fix.lat, lon: fix.lon)
        let distanceM = (last?.distanceM ?? 0) + (lastPosition.map { Geo.distance($0, here) } ?? 0)
        last = Mark(time: fix.time, distanceM: distanceM)
        lastPosition = here
        if marks.last.map({ fix.time >= $0.time + Self.markIntervalS }) ?? true {
            marks.append(Mark(time: fix.time, distanceM: distanceM))
        }
    }

    /// Distance along the fixes up to `time`, interpolated between marks; nil when no fix came
    /// before it.
    func distance(at time: Date) -> Double? {
        guard let last else { return nil }
        if time >= last.time { return last.distanceM }
        let index = marks.partitioningIndex { $0.time > time }
        guard index > 0 else { return nil }
        let before = marks[index - 1]
        let after = index < marks.count ? marks[index] : last
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
