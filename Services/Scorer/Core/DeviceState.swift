import DequeModule
import DrivebusRoadLimits
import DrivebusSchema
import Foundation

/// One device's scorer: a smoothing window over its recent fixes, four episode detectors, running
/// totals remembered by seq (so a trip announced late is still measured exactly), and its open
/// trip and session.
struct DeviceState: Sendable, Codable {
    let device: String

    // The current segment: fixes with no gap longer than `max_gap_s` between them.
    private var window = Deque<Sample>()
    /// Index in `window` of the first fix not yet evaluated (its window is not complete yet).
    private var nextCentre = 0
    private var headingRaw: Double?
    private var headingUnwrapped = 0.0
    /// The direction of travel from positions alone, to check the phone's course against.
    private var trackRaw: Double?
    private var trackUnwrapped: Double?
    private var lastEvaluatedTime: Double?

    /// The last fix kept, for speed, bearing and distance from positions.
    private var lastFix: Position?
    /// The segment's recent positions, the first at least `derivedSpeedBaseS` old: speeds from
    /// positions alone are taken over that base (optional: older checkpoints lack it).
    private var recentPositions: Deque<Position>?
    /// The last speed and course that passed the plausibility checks (optional: checkpoints from
    /// before the checks decode without them).
    private var plausible: Plausible?
    private(set) var newestSeq: UInt64 = 0

    /// Totals over every evaluated fix so far, and their values after each recent fix.
    private var totals = Totals()
    private var history = Deque<HistoryRecord>()
    /// The newest record dropped from `history`.
    private var evicted: HistoryRecord?

    private var brake = Episode()
    private var accel = Episode()
    private var corner = Episode()
    private var speeding = Episode()
    /// Which road the drive is on, when the roads' limits are known (optional: checkpoints from
    /// before them decode without it).
    private var roadMatcher: RoadMatcher?

    /// Events published and not yet part of a scored trip.
    private var events: [DriveEvent] = []
    private var trip: OpenTrip?
    private var session: DriveSession?
    /// Recently scored trip ids, so a repeated `trip.ended` is ignored.
    private var scored: [String] = []

    static let maxEvents = 1024
    static let maxBacktrackS = 3600.0
    static let maxAbsTime = 1e11  // about the year 5100
    static let maxScored = 64

    init(device: String) { self.device = device }

    // MARK: Fixes

    mutating func add(_ fix: Fix, seq: UInt64, _ tuning: Tuning, _ out: inout [ScorerOutput]) {
        let t = fix.time.timeIntervalSince1970
        // Times far outside any plausible clock are refused: they could not even be printed.
        guard abs(t) < Self.maxAbsTime, fix.lat.isFinite, fix.lon.isFinite, abs(fix.lat) <= 90, abs(fix.lon) <= 180 else { return }
        if let accuracy = fix.accuracyM, !(accuracy <= tuning.maxAccuracy) { return }
        newestSeq = seq
        var dt = Double.infinity
        var offset = (x: 0.0, y: 0.0)
        if let last = lastFix {
            if t > last.t {
                dt = t - last.t
                offset = Kinematics.offset(fromLat: last.lat, lon: last.lon, toLat: fix.lat, lon: fix.lon)
            } else if last.t - t <= Self.maxBacktrackS {
                // No newer than the last one: a re-send or out of order, nothing to differentiate.
                return
            }
            // Far in the past: the last fix's clock was wrong, or old fixes arrive late. Either
            // way a new segment, so one bad time cannot block the device.
        }
        lastFix = Position(t: t, lat: fix.lat, lon: fix.lon)
        let distance = (offset.x * offset.x + offset.y * offset.y).squareRoot()
        let continuous = dt <= tuning.maxGap
        if !continuous, window.count > 0 { endSegment(tuning, &out) }

        var sample = Sample(seq: seq, t: t, lat: fix.lat, lon: fix.lon, distance: distance)
        sample.accuracy = fix.accuracyM
        if !continuous { plausible = nil }
        var checks = plausible ?? Plausible()
        if let speed = fix.speedMps, speed >= 0, speed < Tuning.maxSpeed {
            if checks.admitSpeed(speed, at: t) {
                sample.speed = speed
                sample.flags = Sample.hasSpeed | Sample.reportedSpeed
            }
        } else if continuous, let derived = derivedSpeed(t: t, lat: fix.lat, lon: fix.lon) ?? Optional(distance / dt),
                  derived < Tuning.maxSpeed, checks.admitSpeed(derived, at: t) {
            sample.speed = derived
            sample.flags = Sample.hasSpeed
        }
        if !continuous { recentPositions = nil }
        var recent = recentPositions ?? Deque()
        recent.append(Position(t: t, lat: fix.lat, lon: fix.lon))
        while recent.count > 1, t - recent[1].t >= Tuning.derivedSpeedBaseS { recent.removeFirst() }
        recentPositions = recent
        if sample.flags != 0, sample.speed >= Tuning.minHeadingSpeed {
            var raw: Double?
            if let course = fix.courseDeg, course >= 0, course <= 360 {
                raw = course
            } else if continuous, distance >= 0.5 {
                raw = atan2(offset.x, offset.y) * 180 / .pi
            }
            if let raw, checks.admitCourse(raw, speed: sample.speed, at: t) {
                // Unwrap so a turn through north is continuous: 350°, 10° → 350, 370.
                if let previous = headingRaw {
                    headingUnwrapped += Self.turn(from: previous, to: raw)
                } else {
                    headingUnwrapped = raw
                }
                headingRaw = raw
                sample.heading = headingUnwrapped
                sample.flags |= Sample.hasHeading
            }
        }
        plausible = checks
        // The direction between positions far enough apart that their noise does not swamp it.
        if continuous, distance >= Tuning.minTrackStepM {
            let raw = atan2(offset.x, offset.y) * 180 / .pi
            let unwrapped = trackUnwrapped.map { $0 + Self.turn(from: trackRaw ?? raw, to: raw) } ?? raw
            (trackRaw, trackUnwrapped) = (raw, unwrapped)
            sample.track = unwrapped
            sample.flags |= Sample.hasTrack
        }

        if window.count >= Tuning.maxWindowSamples {
            // More fixes than a window should hold: thin the oldest, evaluated first.
            if nextCentre == 0 { evaluate(0, tuning, &out) }
            if window.count >= Tuning.maxWindowSamples {
                window.removeFirst(1)
                nextCentre = max(nextCentre - 1, 0)
            }
        }
        window.append(sample)
        // Every fix whose window is now complete, in order.
        while nextCentre < window.count, t - window[nextCentre].t > tuning.halfWindow {
            evaluate(nextCentre, tuning, &out)
        }
    }

    /// The speed from positions alone: the straight distance from the newest recent position at
    /// least `derivedSpeedBaseS` old (or the oldest there is) over the time between. One step at
    /// 1 Hz turns a 3 m position error into 3 m/s; five steps into 0.6 m/s.
    private func derivedSpeed(t: Double, lat: Double, lon: Double) -> Double? {
        guard let base = recentPositions?.first, t > base.t else { return nil }
        let offset = Kinematics.offset(fromLat: base.lat, lon: base.lon, toLat: lat, lon: lon)
        return (offset.x * offset.x + offset.y * offset.y).squareRoot() / (t - base.t)
    }

    /// The signed turn from one direction to another, −180…180 degrees.
    static func turn(from a: Double, to b: Double) -> Double {
        var step = (b - a).truncatingRemainder(dividingBy: 360)
        if step > 180 { step -= 360 } else if step < -180 { step += 360 }
        return step
    }

    /// Smooths around fix `k` (least-squares slopes of speed and heading over ±half a window),
    /// adds it to the totals and feeds the episode detectors.
    private mutating func evaluate(_ k: Int, _ tuning: Tuning, _ out: inout [ScorerOutput]) {
        let centre = window[k]
        let tc = centre.t
        var low = k
        while low > 0, tc - window[low - 1].t <= tuning.halfWindow { low -= 1 }
        var high = k
        while high + 1 < window.count, window[high + 1].t - tc <= tuning.halfWindow { high += 1 }

        var n = 0.0, sumT = 0.0, sumV = 0.0, sumTT = 0.0, sumTV = 0.0
        var allReported = true
        var nHeading = 0.0, sumH = 0.0, sumTH = 0.0
        var nTrack = 0.0, sumTk = 0.0, sumTTk = 0.0, sumK = 0.0, sumTK = 0.0
        var trackReference: Double?
        var firstT = Double.infinity, lastT = -Double.infinity
        let reference = centre.heading
        for index in low...high {
            let sample = window[index]
            let dt = sample.t - tc
            if sample.flags & Sample.hasTrack != 0 {
                let reference = trackReference ?? sample.track
                trackReference = reference
                nTrack += 1
                sumTk += dt
                sumTTk += dt * dt
                sumK += sample.track - reference
                sumTK += dt * (sample.track - reference)
            }
            guard sample.flags & Sample.hasSpeed != 0 else { continue }
            if sample.flags & Sample.reportedSpeed == 0 { allReported = false }
            n += 1
            sumT += dt
            sumV += sample.speed
            sumTT += dt * dt
            sumTV += dt * sample.speed
            firstT = min(firstT, dt)
            lastT = max(lastT, dt)
            if sample.flags & Sample.hasHeading != 0 {
                let dh = sample.heading - reference
                nHeading += 1
                sumH += dh
                sumTH += dt * dh
            }
        }
        var acceleration: Double?
        var lateral: Double?
        var meanSpeed: Double? = n > 0 ? sumV / n : nil
        /// The time the estimate stands for: a fit's spacing between fixes, or a sparse interval.
        var support = 0.0
        // Fixes a few milliseconds apart would turn noise into huge slopes.
        if n >= 2, lastT - firstT >= 0.5 {
            let denominator = n * sumTT - sumT * sumT
            // Speeds from positions alone are too noisy to differentiate: on real 1 Hz drives
            // they gave calm drivers 9–11 harsh events each (docs/scoring.md). They still give
            // the speed for speeding and cornering.
            if allReported { acceleration = (n * sumTV - sumT * sumV) / denominator }
            support = (lastT - firstT) / (n - 1)
            if nHeading == n, let speed = meanSpeed, speed >= tuning.cornerMinSpeed {
                var yawDegreesPerSecond = abs((n * sumTH - sumT * sumH) / denominator)
                // The phone's course lags and jumps at interchanges; where the positions show a
                // gentler turn, the turn was gentler. Both must see it.
                let trackDenominator = nTrack * sumTTk - sumTk * sumTk
                if nTrack >= 3, trackDenominator > 0 {
                    yawDegreesPerSecond = min(yawDegreesPerSecond, abs((nTrack * sumTK - sumTk * sumK) / trackDenominator))
                }
                lateral = speed * yawDegreesPerSecond * .pi / 180
            }
        } else if k > 0, let sparse = Self.sparseAcceleration(from: window[k - 1], to: centre) {
            // Too few fixes for a fit (a phone recording every few seconds): the interval to the
            // previous fix, with both Doppler speeds and the distance between them.
            acceleration = sparse
            support = centre.t - window[k - 1].t
            meanSpeed = (centre.speed + window[k - 1].speed) / 2
        }

        totals.distanceM += centre.distance
        if let a = acceleration {
            totals.accelerationSum += a
            totals.accelerationSquares += a * a
            totals.accelerationCount += 1
        }
        let inForce = tuning.hasLimits ? limitInForce(at: centre, tuning) : nil
        var limit: Double?
        var speedKmh = 0.0
        if let speed = meanSpeed {
            limit = inForce?.kmh
            speedKmh = speed * 3.6
        }
        let over = limit.map { speedKmh > $0 * tuning.tolerance } ?? false
        if over, let previous = lastEvaluatedTime { totals.speedingS += tc - previous }
        if limit != nil { totals.limitKnownM += centre.distance }
        if over { totals.speedingM += centre.distance }
        lastEvaluatedTime = tc
        history.append(HistoryRecord(seq: centre.seq, totals: totals))
        if history.count > tuning.historyCapacity {
            evicted = history[0]
            history.removeFirst(1)
        }
        nextCentre = k + 1

        // Each detector sees a magnitude (braking as −a) against its threshold and release level.
        let at = (t: tc, seq: centre.seq, lat: centre.lat, lon: centre.lon)
        let release = tuning.release, gap = tuning.episodeGap
        let braking = acceleration.map { -$0 }
        if let done = brake.step(
            at, beyond: braking.map { $0 >= tuning.brake } ?? false,
            holding: braking.map { $0 >= tuning.brake * release } ?? false, value: braking ?? 0, support: support, gap: gap)
        {
            emit(done, .harshBrake, tuning, &out)
        }
        if let done = accel.step(
            at, beyond: acceleration.map { $0 >= tuning.accel } ?? false,
            holding: acceleration.map { $0 >= tuning.accel * release } ?? false, value: acceleration ?? 0, support: support, gap: gap)
        {
            emit(done, .harshAccel, tuning, &out)
        }
        let cornerThreshold = tuning.cornerThreshold(speed: meanSpeed ?? 0)
        if let done = corner.step(
            at, beyond: lateral.map { $0 >= cornerThreshold } ?? false,
            holding: lateral.map { $0 >= cornerThreshold * release } ?? false, value: lateral ?? 0, support: support, gap: gap)
        {
            emit(done, .harshCorner, tuning, &out)
        }
        // Speeding starts above limit × tolerance and lasts until the speed is back at the limit.
        let excess = limit.map { speedKmh - $0 }
        if let done = speeding.step(
            at, beyond: over, holding: excess.map { $0 > 0 } ?? false, value: excess ?? 0, limit: limit ?? 0,
            source: inForce?.source, gap: gap)
        {
            emit(done, .speeding, tuning, &out)
        }

        // Drop fixes that no later window can reach.
        let reach = (nextCentre < window.count ? window[nextCentre].t : window[window.count - 1].t) - tuning.halfWindow
        var drop = 0
        // The fix before the next centre stays: a sparse interval needs it.
        while drop < nextCentre - 1, window[drop].t < reach { drop += 1 }
        if drop > 0 {
            window.removeFirst(drop)
            nextCentre -= drop
        }
    }

    /// The limit in force at an evaluated fix, and where it comes from: a zone the user drew
    /// (it wins: the user knows the place), else the road the drive is matched to (its
    /// `maxspeed`; none on a road signed without a limit; the configured limit of its class
    /// where nothing is tagged), else the global limit. Matching runs on every evaluated fix, so
    /// that the drive's road is followed even while there is no speed to judge.
    private mutating func limitInForce(at centre: Sample, _ tuning: Tuning) -> (kmh: Double, source: String)? {
        var road: RoadMatcher.Match?
        if let index = tuning.roads {
            var matcher = roadMatcher ?? RoadMatcher()
            let heading = centre.flags & Sample.hasHeading != 0 ? centre.heading : centre.flags & Sample.hasTrack != 0 ? centre.track : nil
            let speed = centre.flags & Sample.hasSpeed != 0 ? centre.speed : nil
            road = matcher.match(lat: centre.lat, lon: centre.lon, accuracyM: centre.accuracy, headingDeg: heading, speedMps: speed, in: index)
            roadMatcher = matcher
        }
        if let zone = tuning.zoneLimit(lat: centre.lat, lon: centre.lon) { return (zone, "zone") }
        if let road {
            switch road.limit {
            case .kmh(let kmh): return (kmh, "osm")
            case .unlimited: return nil
            case nil: if let kmh = tuning.roadClassLimits[road.roadClass] { return (kmh, "road_class") }
            }
        }
        return tuning.globalLimit.map { ($0, "global") }
    }

    /// The least acceleration consistent with two fixes `dt` apart with Doppler speeds `v0`, `v1`
    /// and distance `d`, if the speed changed in one phase of constant acceleration (cruising
    /// before and after it as the distance says). With `P` and `Q` the phase's half-length plus the
    /// time at the end and at the start speed, `d − v0·dt = Δv·P` and `v1·dt − d = Δv·Q`, so the
    /// phase lasts at most `2·min(P, Q)`. The distance's error (`sparseDistanceNoiseM`) is taken in
    /// the direction that makes the phase longer: the estimate never overstates. It is never less
    /// than the mean `Δv/dt`. Nil when either speed was not reported, the gap is too long, or the
    /// least acceleration is beyond any car's.
    static func sparseAcceleration(from a: Sample, to b: Sample) -> Double? {
        let dt = b.t - a.t
        guard a.flags & Sample.reportedSpeed != 0, b.flags & Sample.reportedSpeed != 0,
              dt > 0, dt <= Tuning.maxSparseIntervalS
        else { return nil }
        let dv = b.speed - a.speed
        guard abs(dv) > 0.01 else { return 0 }
        let p = (b.distance - a.speed * dt) / dv
        let q = (b.speed * dt - b.distance) / dv
        // A distance the model cannot produce is noise: then only the mean is sure.
        guard min(p, q) >= 0 else { return dv / dt }
        let half = min(dt / 2, min(p, q) + Tuning.sparseDistanceNoiseM / abs(dv))
        let bound = dv / (2 * half)
        // Beyond what a car can do: one of the two speeds is a glitch (a 0 at cruising speed
        // every 10 s passes the plausibility check), so the interval says nothing.
        return abs(bound) <= Plausible.maxAccelerationMps2 ? bound : nil
    }

    /// Evaluates what is left of the segment with the fixes there are, and closes every episode.
    private mutating func endSegment(_ tuning: Tuning, _ out: inout [ScorerOutput]) {
        while nextCentre < window.count { evaluate(nextCentre, tuning, &out) }
        closeEpisodes(through: .max, tuning, &out)
        window.removeAll()
        nextCentre = 0
        headingRaw = nil
        (trackRaw, trackUnwrapped) = (nil, nil)
        lastEvaluatedTime = nil
    }

    private mutating func closeEpisodes(through seq: UInt64, _ tuning: Tuning, _ out: inout [ScorerOutput]) {
        if brake.isOpen, brake.firstSeq <= seq, let done = brake.close() { emit(done, .harshBrake, tuning, &out) }
        if accel.isOpen, accel.firstSeq <= seq, let done = accel.close() { emit(done, .harshAccel, tuning, &out) }
        if corner.isOpen, corner.firstSeq <= seq, let done = corner.close() { emit(done, .harshCorner, tuning, &out) }
        if speeding.isOpen, speeding.firstSeq <= seq, let done = speeding.close() { emit(done, .speeding, tuning, &out) }
    }

    private mutating func emit(_ episode: Episode, _ type: DriveEventType, _ tuning: Tuning, _ out: inout [ScorerOutput]) {
        let duration = episode.endT - episode.startT
        if type == .speeding, duration < tuning.speedingMinDuration { return }
        if type != .speeding, (episode.support ?? .infinity) < Tuning.minEpisodeSupportS { return }
        let tripID = trip.flatMap { episode.firstSeq >= $0.trip.firstSeq ? $0.trip.tripID : nil }
        let event = DriveEvent(
            device: device, tripID: tripID, type: type, time: Date(timeIntervalSince1970: episode.startT),
            lat: episode.lat, lon: episode.lon,
            peakMps2: type == .speeding ? nil : rounded(type == .harshBrake ? -episode.peak : episode.peak, 3),
            overKmh: type == .speeding ? rounded(episode.peak, 1) : nil,
            limitKmh: type == .speeding ? episode.limit : nil,
            limitSource: type == .speeding ? episode.source : nil,
            durationS: rounded(duration, 3), firstSeq: episode.firstSeq)
        if events.count >= Self.maxEvents { events.removeFirst() }
        events.append(event)
        out.append(.event(event))
    }

    // MARK: Trips and sessions

    mutating func tripStarted(_ started: ScorerTrip) {
        guard !scored.contains(started.tripID), trip?.trip.tripID != started.tripID else { return }
        trip = OpenTrip(trip: started, session: session, baseline: totals(before: started.firstSeq).totals)
    }

    mutating func tripEnded(_ ended: ScorerTrip, _ tuning: Tuning, _ out: inout [ScorerOutput]) {
        guard !scored.contains(ended.tripID) else { return }
        let open = trip?.trip.tripID == ended.tripID ? trip : nil
        // Journal seqs start at 1: 0 means the trips service did not say.
        let first = ended.firstSeq == 0 ? (open?.trip.firstSeq ?? 0) : ended.firstSeq
        let last = max(ended.lastSeq ?? newestSeq, first)

        // The trip's fixes are all in: finish them now rather than waiting for later fixes.
        while nextCentre < window.count, window[nextCentre].seq <= last { evaluate(nextCentre, tuning, &out) }
        closeEpisodes(through: last, tuning, &out)

        let before = totals(before: first)
        let baseline = before.exact ? before.totals : (open?.baseline ?? before.totals)
        let end = totals(through: last).totals
        let tripEvents = events.filter { (first...last).contains($0.firstSeq) }.map { event in
            var event = event
            event.tripID = ended.tripID
            return event
        }
        events.removeAll { $0.firstSeq <= last }

        var distance = end.distanceM - baseline.distanceM
        if let reported = ended.distanceM, reported.isFinite, reported >= 0 { distance = reported }
        let samples = end.accelerationCount - baseline.accelerationCount
        var variation = 0.0
        if samples > 0 {
            let mean = (end.accelerationSum - baseline.accelerationSum) / samples
            let variance = (end.accelerationSquares - baseline.accelerationSquares) / samples - mean * mean
            variation = max(variance, 0).squareRoot()
        }
        let speedingS = max(end.speedingS - baseline.speedingS, 0)
        let speedingM = max(end.speedingM - baseline.speedingM, 0)
        let limitKnownM = max(end.limitKnownM - baseline.limitKnownM, 0)
        let endTime = ended.endTime ?? lastFix.map { Date(timeIntervalSince1970: $0.t) }
        let duration = endTime.map { $0.timeIntervalSince(ended.startTime) } ?? 0

        let score = Score(
            events: tripEvents, distanceM: distance, durationS: duration, speedingS: speedingS,
            speedVariation: variation, tuning: tuning)
        let result = DriveScored(
            tripID: ended.tripID, device: device, startTime: ended.startTime, endTime: endTime,
            score: score.score, distanceM: rounded(max(distance, 0), 1), events: tripEvents, counts: score.counts,
            eventsPer100km: score.eventsPer100km, speedingS: rounded(speedingS, 1),
            speedingM: tuning.hasLimits ? rounded(speedingM, 1) : nil, limitKnownM: tuning.hasLimits ? rounded(limitKnownM, 1) : nil,
            worstSpeeding: tuning.hasLimits
                ? Array(tripEvents.filter { $0.type == .speeding }.sorted { ($0.overKmh ?? 0, $1.time) > ($1.overKmh ?? 0, $0.time) }.prefix(3)) : nil,
            speedVariation: rounded(variation, 3), components: score.components, session: open?.session ?? session, imported: ended.imported)
        scored.append(ended.tripID)
        if scored.count > Self.maxScored { scored.removeFirst() }
        if open != nil { trip = nil }
        out.append(.scored(result))
    }

    mutating func sessionStarted(_ started: SessionStarted) {
        let new = DriveSession(id: started.sessionID, candidate: started.candidate)
        session = new
        // A session started just after the car moved off still owns that trip.
        if trip != nil, trip?.session == nil { trip?.session = new }
    }

    mutating func sessionStopped(_ stopped: SessionStopped) {
        // A stop that names no session (ingest restarted since the start) closes the open one.
        if stopped.sessionID.isEmpty || session?.id == stopped.sessionID { session = nil }
    }

    // MARK: Totals by seq

    /// The totals after the last evaluated fix with seq ≤ `seq`; `exact` is false when that fix
    /// has already left the history (then the oldest remembered totals are the best guess).
    private func totals(through seq: UInt64) -> (totals: Totals, exact: Bool) {
        var low = 0, high = history.count
        while low < high {
            let middle = (low + high) / 2
            if history[middle].seq <= seq { low = middle + 1 } else { high = middle }
        }
        if low > 0 { return (history[low - 1].totals, true) }
        guard let evicted else { return (Totals(), true) }
        return (evicted.totals, evicted.seq <= seq)
    }

    private func totals(before seq: UInt64) -> (totals: Totals, exact: Bool) {
        seq == 0 ? (Totals(), evicted == nil) : totals(through: seq - 1)
    }
}

/// Rounded for the payload: results are stable to print and to compare.
func rounded(_ value: Double, _ places: Int) -> Double {
    guard value.isFinite else { return 0 }
    let scale = [1.0, 10, 100, 1000, 10_000][min(max(places, 0), 4)]
    return (value * scale).rounded() / scale
}

struct Position: Sendable, Codable {
    var t: Double
    var lat: Double
    var lon: Double
}

struct OpenTrip: Sendable, Codable {
    var trip: ScorerTrip
    var session: DriveSession?
    /// The totals just before the trip's first fix, in case that leaves the history before the end.
    var baseline: Totals
}

/// Running sums over evaluated fixes, differenced between two seqs to measure a trip.
struct Totals: Sendable, Codable, Equatable {
    var distanceM = 0.0
    var speedingS = 0.0
    /// Metres driven above limit × tolerance, and metres where a limit was known.
    var speedingM = 0.0
    var limitKnownM = 0.0
    var accelerationSum = 0.0
    var accelerationSquares = 0.0
    var accelerationCount = 0.0

    init(
        distanceM: Double = 0, speedingS: Double = 0, speedingM: Double = 0, limitKnownM: Double = 0,
        accelerationSum: Double = 0, accelerationSquares: Double = 0, accelerationCount: Double = 0
    ) {
        (self.distanceM, self.speedingS, self.speedingM, self.limitKnownM) = (distanceM, speedingS, speedingM, limitKnownM)
        (self.accelerationSum, self.accelerationSquares, self.accelerationCount) = (accelerationSum, accelerationSquares, accelerationCount)
    }

    enum CodingKeys: String, CodingKey {
        case distanceM, speedingS, speedingM, limitKnownM, accelerationSum, accelerationSquares, accelerationCount
    }

    // The distances above and with a limit are absent in checkpoints from before them.
    init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        self.init(
            distanceM: try c.decode(Double.self, forKey: .distanceM), speedingS: try c.decode(Double.self, forKey: .speedingS),
            speedingM: try c.decodeIfPresent(Double.self, forKey: .speedingM) ?? 0,
            limitKnownM: try c.decodeIfPresent(Double.self, forKey: .limitKnownM) ?? 0,
            accelerationSum: try c.decode(Double.self, forKey: .accelerationSum),
            accelerationSquares: try c.decode(Double.self, forKey: .accelerationSquares),
            accelerationCount: try c.decode(Double.self, forKey: .accelerationCount))
    }
}

struct HistoryRecord: Sendable, Codable {
    var seq: UInt64
    var totals: Totals

    // Compact in the checkpoint: `[seq, distance, speeding, sum, squares, count]`.
    init(seq: UInt64, totals: Totals) {
        self.seq = seq
        self.totals = totals
    }

    init(from decoder: any Decoder) throws {
        var c = try decoder.unkeyedContainer()
        seq = try c.decode(UInt64.self)
        totals = Totals(
            distanceM: try c.decode(Double.self), speedingS: try c.decode(Double.self),
            accelerationSum: try c.decode(Double.self), accelerationSquares: try c.decode(Double.self),
            accelerationCount: try c.decode(Double.self))
        // Absent in checkpoints from before speed limits were matched to roads.
        if !c.isAtEnd {
            totals.speedingM = try c.decode(Double.self)
            totals.limitKnownM = try c.decode(Double.self)
        }
    }

    func encode(to encoder: any Encoder) throws {
        var c = encoder.unkeyedContainer()
        try c.encode(seq)
        try c.encode(totals.distanceM)
        try c.encode(totals.speedingS)
        try c.encode(totals.accelerationSum)
        try c.encode(totals.accelerationSquares)
        try c.encode(totals.accelerationCount)
        try c.encode(totals.speedingM)
        try c.encode(totals.limitKnownM)
    }
}

/// One kept fix in the smoothing window.
struct Sample: Sendable, Codable {
    static let hasSpeed: UInt8 = 1
    static let hasHeading: UInt8 = 2
    /// The speed is the phone's (Doppler), not derived from positions.
    static let reportedSpeed: UInt8 = 4
    /// `track` holds the direction from the previous fix's position.
    static let hasTrack: UInt8 = 8

    var seq: UInt64
    var t: Double
    var lat: Double
    var lon: Double
    /// Metres from the previous kept fix.
    var distance: Double
    var speed = 0.0
    /// Unwrapped, degrees.
    var heading = 0.0
    /// Unwrapped, degrees, from positions.
    var track = 0.0
    var flags: UInt8 = 0
    /// The fix's accuracy, metres, for matching it to a road.
    var accuracy: Double?

    init(seq: UInt64, t: Double, lat: Double, lon: Double, distance: Double) {
        self.seq = seq
        self.t = t
        self.lat = lat
        self.lon = lon
        self.distance = distance
    }

    // Compact in the checkpoint: `[seq, t, lat, lon, distance, speed, heading, flags, track]`
    // (`track` absent in checkpoints written before it).
    init(from decoder: any Decoder) throws {
        var c = try decoder.unkeyedContainer()
        seq = try c.decode(UInt64.self)
        t = try c.decode(Double.self)
        lat = try c.decode(Double.self)
        lon = try c.decode(Double.self)
        distance = try c.decode(Double.self)
        speed = try c.decode(Double.self)
        heading = try c.decode(Double.self)
        flags = try c.decode(UInt8.self)
        if !c.isAtEnd { track = try c.decode(Double.self) }
        if !c.isAtEnd { accuracy = try c.decode(Double.self) }
    }

    func encode(to encoder: any Encoder) throws {
        var c = encoder.unkeyedContainer()
        try c.encode(seq)
        try c.encode(t)
        try c.encode(lat)
        try c.encode(lon)
        try c.encode(distance)
        try c.encode(speed)
        try c.encode(heading)
        try c.encode(flags)
        try c.encode(track)
        if let accuracy { try c.encode(accuracy) }
    }
}

/// Speeds and courses that no car can produce are dropped before anything is differentiated:
/// one GPS glitch (a 0 between two readings of 25 m/s) would otherwise be a 25 m/s² stop. A
/// reading is implausible when reaching it from the last plausible one takes more than
/// `maxAccelerationMps2` along the road, or more than `maxLateralMps2` across it. After two
/// implausible readings in a row the next is believed (the earlier reading was the odd one).
struct Plausible: Sendable, Codable, Equatable {
    /// About 1 g: beyond an emergency stop on dry asphalt.
    static let maxAccelerationMps2 = 10.0
    /// Speed noise allowed on top, m/s.
    static let speedSlackMps = 1.0
    static let maxLateralMps2 = 10.0
    static let maxRejected = 2

    var speedT: Double?
    var speed = 0.0
    var rejectedSpeeds = 0
    var courseT: Double?
    var course = 0.0
    var rejectedCourses = 0

    mutating func admitSpeed(_ value: Double, at t: Double) -> Bool {
        if let speedT, rejectedSpeeds < Self.maxRejected,
           abs(value - speed) > Self.maxAccelerationMps2 * (t - speedT) + Self.speedSlackMps {
            rejectedSpeeds += 1
            return false
        }
        (speedT, speed, rejectedSpeeds) = (t, value, 0)
        return true
    }

    mutating func admitCourse(_ value: Double, speed: Double, at t: Double) -> Bool {
        if let courseT, rejectedCourses < Self.maxRejected, t > courseT {
            var step = abs(value - course).truncatingRemainder(dividingBy: 360)
            if step > 180 { step = 360 - step }
            if speed * step * .pi / 180 / (t - courseT) > Self.maxLateralMps2 {
                rejectedCourses += 1
                return false
            }
        }
        (courseT, course, rejectedCourses) = (t, value, 0)
        return true
    }
}

/// One detector: idle → active (beyond the threshold) → released (back under threshold ×
/// release) → idle once `episode_gap_s` passes without it coming back. Resuming within the gap
/// continues the same episode, so one episode is one event.
struct Episode: Sendable, Codable, Equatable {
    enum Phase: UInt8, Sendable, Codable { case idle, active, released }

    var phase = Phase.idle
    var firstSeq: UInt64 = 0
    var startT = 0.0
    var lat = 0.0
    var lon = 0.0
    var peak = 0.0
    /// Speeding: the limit at the peak, and where it came from (optional: older checkpoints).
    var limit = 0.0
    var source: String?
    /// The last time the value was beyond the release level.
    var lastT = 0.0
    /// When it released.
    var endT = 0.0
    /// Seconds of estimates beyond the threshold (see `Tuning.minEpisodeSupportS`); optional so
    /// that checkpoints from before it decode.
    var support: Double?

    var isOpen: Bool { phase != .idle }

    /// Returns an episode that is now over, if any.
    mutating func step(
        _ at: (t: Double, seq: UInt64, lat: Double, lon: Double), beyond: Bool, holding: Bool, value: Double,
        limit: Double = 0, source: String? = nil, support: Double = 1, gap: Double
    ) -> Episode? {
        var finished: Episode?
        if phase == .released, at.t - endT > gap {
            finished = self
            phase = .idle
        }
        switch phase {
        case .idle:
            if beyond {
                self = Episode(
                    phase: .active, firstSeq: at.seq, startT: at.t, lat: at.lat, lon: at.lon, peak: value, limit: limit,
                    source: source, lastT: at.t, endT: at.t, support: support)
            }
        case .active:
            if beyond { self.support = (self.support ?? 0) + support }
            if holding {
                lastT = at.t
                if value > peak {
                    peak = value
                    self.limit = limit
                    self.source = source
                }
            } else {
                phase = .released
                endT = at.t
            }
        case .released:
            if beyond {
                phase = .active
                self.support = (self.support ?? 0) + support
                lastT = at.t
                if value > peak {
                    peak = value
                    self.limit = limit
                    self.source = source
                }
            }
        }
        return finished
    }

    /// Ends the episode now (the segment or the trip is over).
    mutating func close() -> Episode? {
        switch phase {
        case .idle:
            return nil
        case .active:
            endT = lastT
            fallthrough
        case .released:
            let done = self
            phase = .idle
            return done
        }
    }
}
