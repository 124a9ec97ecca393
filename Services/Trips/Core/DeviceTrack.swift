import DrivebusGeo
import DrivebusSchema
import Foundation

/// One accepted fix as the segmenter keeps it: numbers only, so the hot path allocates nothing.
struct TrackPoint: Sendable, Equatable {
    var lat: Double
    var lon: Double
    /// `Date.timeIntervalSinceReferenceDate`, Date's own storage, so times round-trip exactly.
    var t: Double
    /// The journal seq, 0 when the fix had none (journal seqs start at 1).
    var seq: UInt64
    /// The device's running distance over accepted fixes (in steps of at least
    /// `distance_noise_m`): a trip's distance is a difference of two.
    var cum: Double
    /// The speed implied from the previous accepted fix; -1 when the fix does not connect to it
    /// (a jump after a run of speed outliers).
    var stepMps: Double
    /// The speed the device reported, NaN when none.
    var speedMps: Double
    /// NaN when none.
    var altitudeM: Double

    var date: Date { Date(timeIntervalSinceReferenceDate: t) }
    var position: TripPoint { TripPoint(lat: lat, lon: lon) }
}

extension TrackPoint: Codable {
    // A compact array per point: `[lat, lon, t, seq, cum, step, speed|null, altitude|null]`.
    init(from decoder: any Decoder) throws {
        var c = try decoder.unkeyedContainer()
        lat = try c.decode(Double.self)
        lon = try c.decode(Double.self)
        t = try c.decode(Double.self)
        seq = try c.decode(UInt64.self)
        cum = try c.decode(Double.self)
        stepMps = try c.decode(Double.self)
        speedMps = try c.decodeIfPresent(Double.self) ?? .nan
        altitudeM = try c.decodeIfPresent(Double.self) ?? .nan
    }

    func encode(to encoder: any Encoder) throws {
        var c = encoder.unkeyedContainer()
        try c.encode(lat)
        try c.encode(lon)
        try c.encode(t)
        try c.encode(seq)
        try c.encode(cum)
        try c.encode(stepMps)
        if speedMps.isNaN { try c.encodeNil() } else { try c.encode(speedMps) }
        if altitudeM.isNaN { try c.encodeNil() } else { try c.encode(altitudeM) }
    }
}

enum FixVerdict {
    case accepted, outOfOrder, outlier
}

/// The state of one device.
///
/// At rest, `track` holds the departure (the last fix at rest near the centre) and the fixes since;
/// in a trip, all of the trip's fixes. Either way it is bounded: at rest by `min_duration_s` of
/// fixes, in a trip by the trip.
struct DeviceTrack: Sendable, Codable {
    let device: String
    /// When (wall clock, reference-date seconds) the device's last fix reached the segmenter, if
    /// the caller says. Silence is measured from the later of this and the fix's own time, so an
    /// import of old fixes is not closed by the clock while it is still arriving.
    var arrivedAt: Double?
    /// Whether the last accepted fix came from `drivebus import` (nil: live), and whether the
    /// fix on which the open or last trip was found to start was one: what its events say as
    /// `imported`.
    var lastImported: Bool?
    var tripImported: Bool?
    /// The last accepted fix.
    var last: TrackPoint?
    /// Where the running distance was last counted to.
    var odometerLat = 0.0
    var odometerLon = 0.0
    /// The time of the last fix the state machine stepped over; re-fed fixes move it back.
    var stepT: Double?
    /// The latest speed outlier and how many agreeing ones came in a row.
    var rejected: TrackPoint?
    var rejectedRun = 0
    var silentNotified = false

    var activity: MotionSample.Activity?
    var confidence: MotionSample.Confidence = .low
    /// When the current activity began (kept across walking and running, both on foot).
    var activityT: Double?

    var inTrip = false
    var track: [TrackPoint] = []
    /// In a trip: the fix that set it off, and the first fix of the stay being timed.
    var triggerIndex = 0
    var stayIndex = 0
    /// cos(latitude) of the stay (in a trip) or of the seed (at rest), for flat distances.
    var cosLat = 1.0
    /// At rest: the mean of the resting fixes since the seed, kept as offsets from the seed.
    var seedLat = 0.0
    var seedLon = 0.0
    var sumDLat = 0.0
    var sumDLon = 0.0
    var restCount = 0.0
    var centreLat = 0.0
    var centreLon = 0.0

    init(device: String) {
        self.device = device
    }

    var isConsistent: Bool {
        inTrip
            ? !track.isEmpty && (0..<track.count).contains(triggerIndex) && (0..<track.count).contains(stayIndex)
            : true
    }

    // MARK: Inputs

    mutating func fix(_ fix: Fix, _ s: Settings, _ out: inout [TripsOutput]) -> FixVerdict {
        let t = fix.time.timeIntervalSinceReferenceDate
        guard t.isFinite, fix.lat.isFinite, fix.lon.isFinite, abs(fix.lat) <= 90, abs(fix.lon) <= 180 else {
            return .outlier
        }
        if let last {
            if t < last.t { return .outOfOrder }
            // Same time, other place: no speed can be implied, and one of them is wrong.
            if t == last.t { return .outlier }
        }
        if let accuracy = fix.accuracyM, accuracy > s.config.maxAccuracyM { return .outlier }
        var speed = Double.nan
        if let reported = fix.speedMps, reported.isFinite, reported >= 0, reported <= s.config.maxSpeedMps { speed = reported }
        var point = TrackPoint(
            lat: fix.lat, lon: fix.lon, t: t, seq: fix.seq ?? 0, cum: 0, stepMps: 0, speedMps: speed,
            altitudeM: fix.altitudeM.flatMap { $0.isFinite ? $0 : nil } ?? .nan)
        if let last {
            let distance = Geo.distance(Coordinate(lat: last.lat, lon: last.lon), Coordinate(lat: fix.lat, lon: fix.lon))
            let implied = distance / (t - last.t)
            if implied > s.config.maxSpeedMps {
                if let previous = rejected, t > previous.t,
                    Geo.distance(Coordinate(lat: previous.lat, lon: previous.lon), Coordinate(lat: fix.lat, lon: fix.lon))
                        / (t - previous.t) <= s.config.maxSpeedMps
                {
                    rejectedRun += 1
                } else {
                    rejectedRun = 1
                }
                rejected = point
                guard rejectedRun >= 3 else { return .outlier }
                point.cum = last.cum
                point.stepMps = -1
                odometerLat = fix.lat
                odometerLon = fix.lon
            } else {
                point.stepMps = implied
                point.cum = last.cum
                // Usually the odometer is at `last` (the previous step counted) and `distance` is it.
                let counted = odometerLat == last.lat && odometerLon == last.lon
                    ? distance
                    : Geo.distance(Coordinate(lat: odometerLat, lon: odometerLon), Coordinate(lat: fix.lat, lon: fix.lon))
                if counted >= s.config.distanceNoiseM {
                    point.cum += counted
                    odometerLat = fix.lat
                    odometerLon = fix.lon
                }
            }
        } else {
            odometerLat = fix.lat
            odometerLon = fix.lon
        }
        rejected = nil
        rejectedRun = 0
        last = point
        lastImported = fix.source == .import ? true : nil
        silentNotified = false
        feed(point, s, &out)
        return .accepted
    }

    mutating func motion(_ sample: MotionSample, _ s: Settings, _ out: inout [TripsOutput]) {
        let start = sample.start.timeIntervalSinceReferenceDate
        guard start.isFinite else { return }
        if let activityT, start < activityT { return }
        let walkingSince = onFootSince
        // The walk lasted until this sample at least.
        if let walkingSince, inTrip, walkingSince > track[0].t, start - walkingSince >= s.config.walkingEndS {
            drain(closeForWalk(since: walkingSince, s, &out), s, &out)
        }
        let onFoot = Self.isOnFoot(sample.activity, sample.confidence)
        if !(onFoot && walkingSince != nil) { activityT = start }
        activity = sample.activity
        confidence = sample.confidence
    }

    /// Closes the trip that is open: the clock's silence, or (`importedOnly`) `import.finished`,
    /// after which nothing more is coming for that file. A live trip goes on when a file ends:
    /// the phone is still driving, whatever the file held.
    mutating func closeOpenTrip(importedOnly: Bool = false, _ s: Settings, _ out: inout [TripsOutput]) {
        while inTrip, !importedOnly || tripImported == true {
            drain(closeAtRest(s, &out), s, &out)
        }
    }

    mutating func tick(now: Double, _ s: Settings, _ out: inout [TripsOutput]) {
        guard let last else { return }
        let silence = now - max(last.t, arrivedAt ?? -.infinity)
        // Strictly longer, like the gap rule, so a replay closes exactly the trips ticks closed.
        if inTrip, silence > s.config.idleCloseS {
            closeOpenTrip(s, &out)
        }
        if !silentNotified, silence >= s.config.silentAfterS {
            silentNotified = true
            out.append(.silent(DeviceSilent(
                device: device, lastTime: last.date, lastSeq: last.seq > 0 ? last.seq : nil, silentS: silence,
                time: Date(timeIntervalSinceReferenceDate: now))))
        }
    }

    // MARK: The state machine

    /// One accepted fix through the state machine, then whatever a closed trip hands back.
    private mutating func feed(_ point: TrackPoint, _ s: Settings, _ out: inout [TripsOutput]) {
        if let back = step(point, s, &out) { drain(back, s, &out) }
    }

    /// Steps over fixes in order; a trip closed on the way hands back its tail, which is stepped
    /// again before the rest. Terminates: every trip consumes its trigger fix, and a new trip's
    /// trigger comes after the previous trip's end.
    private mutating func drain(_ points: [TrackPoint], _ s: Settings, _ out: inout [TripsOutput]) {
        var queue = points
        var next = 0
        while next < queue.count {
            let point = queue[next]
            next += 1
            if let back = step(point, s, &out) {
                queue = back + queue[next...]
                next = 0
            }
        }
    }

    /// Returns the fixes to step again when a trip closed: its tail after the end, then `point`
    /// if it was not taken in.
    private mutating func step(_ point: TrackPoint, _ s: Settings, _ out: inout [TripsOutput]) -> [TrackPoint]? {
        let gap = point.stepMps < 0 || stepT.map { point.t - $0 > s.config.gapCloseS } ?? true
        if inTrip {
            if gap {
                var back = closeAtRest(s, &out)
                back.append(point)
                return back
            }
            return tripStep(point, s, &out)
        }
        if gap || track.isEmpty {
            seed(point)
        } else {
            restStep(point, s, &out)
        }
        return nil
    }

    private mutating func restStep(_ point: TrackPoint, _ s: Settings, _ out: inout [TripsOutput]) {
        stepT = point.t
        let distanceSquared = flatDistanceSquared(lat: centreLat, lon: centreLon, point, cosLat: cosLat)
        let fresh = activityT.map { point.t - $0 <= s.config.stopGapS } ?? false
        let automotive = fresh && activity == .automotive && confidence >= .medium
        if distanceSquared >= (automotive ? s.automotiveStartSquared : s.startSquared) {
            if fresh, onFootSince != nil {
                // Walking away from the car is no drive: rest here instead.
                seed(point)
                return
            }
            track.append(point)
            inTrip = true
            triggerIndex = track.count - 1
            stayIndex = triggerIndex
            cosLat = cosine(ofLatitude: point.lat)
            let first = track[0]
            tripImported = lastImported
            out.append(.started(TripStarted(
                tripID: tripID, device: device, startTime: first.date, start: first.position,
                firstSeq: first.seq > 0 ? first.seq : nil, imported: tripImported)))
            return
        }
        // Near the centre the device rests, unless it is heading out fast: then this may be the
        // start of a drive (a stream that begins in motion starts at its first fix).
        if distanceSquared <= s.restSquared,
            point.stepMps < s.movingSpeed
                || distanceSquared <= flatDistanceSquared(lat: centreLat, lon: centreLon, track[track.count - 1], cosLat: cosLat)
        {
            // The departure moves here and the centre towards it.
            restCount += 1
            sumDLat += point.lat - seedLat
            sumDLon += Self.longitudeDelta(point.lon - seedLon)
            centreLat = seedLat + sumDLat / restCount
            centreLon = seedLon + Self.longitudeDelta(sumDLon / restCount)
            if centreLon > 180 { centreLon -= 360 } else if centreLon < -180 { centreLon += 360 }
            track.removeAll(keepingCapacity: true)
            track.append(point)
        } else {
            track.append(point)
            // Lingering away from the centre for a whole stay: it rests somewhere new.
            if point.t - track[0].t > s.config.minDurationS { seed(point) }
        }
    }

    private mutating func tripStep(_ point: TrackPoint, _ s: Settings, _ out: inout [TripsOutput]) -> [TrackPoint]? {
        stepT = point.t
        track.append(point)
        let index = track.count - 1
        if let walkingSince = onFootSince, walkingSince > track[0].t, point.t - walkingSince >= s.config.walkingEndS {
            return closeForWalk(since: walkingSince, s, &out)
        }
        let stay = track[stayIndex]
        if flatDistanceSquared(stay, point, cosLat: cosLat) >= s.staySquared {
            stayIndex = index
            cosLat = cosine(ofLatitude: point.lat)
        } else if point.t - stay.t >= s.config.minDurationS {
            return close(at: restStart(from: index, requireRest: false, s), s, &out)
        }
        return nil
    }

    /// Seeds a new rest at `point`: it is the departure and the centre.
    private mutating func seed(_ point: TrackPoint) {
        inTrip = false
        if track.capacity > 1 << 14 { track = [] } else { track.removeAll(keepingCapacity: true) }
        track.append(point)
        stepT = point.t
        seedLat = point.lat
        seedLon = point.lon
        sumDLat = 0
        sumDLon = 0
        restCount = 1
        centreLat = point.lat
        centreLon = point.lon
        cosLat = cosine(ofLatitude: point.lat)
        triggerIndex = 0
        stayIndex = 0
    }

    /// Where the device came to rest before `index`: from the earliest fix within the rest radius
    /// of it (looking back no further than a fix `min_distance_m` away, nor before the trigger), on
    /// to the first fix after which it no longer moved at moving speed. With `requireRest`, only if
    /// it then stayed for `min_duration_s / 4` (longer than crossing the rest radius at moving
    /// speed takes); otherwise `index` itself.
    private func restStart(from index: Int, requireRest: Bool, _ s: Settings) -> Int {
        let reference = track[index]
        let cosLat = cosine(ofLatitude: reference.lat)
        var earliest = index
        var i = index
        while i > triggerIndex {
            i -= 1
            let distanceSquared = flatDistanceSquared(track[i], reference, cosLat: cosLat)
            if distanceSquared > s.startSquared { break }
            if distanceSquared <= s.restSquared { earliest = i }
        }
        // Then on to where it stopped: the fix after which it no longer moved at moving speed.
        var end = earliest
        while end < index, track[end + 1].stepMps >= s.movingSpeed { end += 1 }
        if requireRest, reference.t - track[end].t < s.restMinS { return index }
        return end
    }

    /// Closes the trip at the first fix of its final rest, or its last fix.
    private mutating func closeAtRest(_ s: Settings, _ out: inout [TripsOutput]) -> [TrackPoint] {
        close(at: restStart(from: track.count - 1, requireRest: true, s), s, &out)
    }

    /// Closes the trip where the device stopped before the walk began.
    private mutating func closeForWalk(since walkingSince: Double, _ s: Settings, _ out: inout [TripsOutput]) -> [TrackPoint] {
        var before = track.count - 1
        while before > triggerIndex, track[before].t > walkingSince { before -= 1 }
        return close(at: restStart(from: before, requireRest: false, s), s, &out)
    }

    /// Publishes the trip `track[0...end]`, rests at `track[end]`, and returns the fixes after it.
    private mutating func close(at end: Int, _ s: Settings, _ out: inout [TripsOutput]) -> [TrackPoint] {
        out.append(.ended(summary(through: end, s)))
        let tail = Array(track[(end + 1)...])
        seed(track[end])
        return tail
    }

    private func summary(through end: Int, _ s: Settings) -> TripEnded {
        let first = track[0], last = track[end]
        let duration = last.t - first.t
        let distance = last.cum - first.cum
        // Top speed: as reported, where the device reports it; else implied over spans of at
        // least `Self.speedSpanS`, so that one misplaced fix cannot set it.
        var reportedMax: Double?
        var impliedMax = duration > 0 ? distance / duration : 0
        var from = 0
        var ascent = AscentCounter(hysteresisM: s.config.ascentHysteresisM)
        var hasAltitude = false
        var coordinates: [Coordinate] = []
        coordinates.reserveCapacity(end + 1)
        for index in 0...end {
            let point = track[index]
            // The first fix's speed belongs to the way there.
            if index > 0 {
                if !point.speedMps.isNaN { reportedMax = max(reportedMax ?? 0, point.speedMps) }
                while from + 1 < index, point.t - track[from + 1].t >= Self.speedSpanS { from += 1 }
                let span = point.t - track[from].t
                if span >= Self.speedSpanS { impliedMax = max(impliedMax, (point.cum - track[from].cum) / span) }
            }
            if !point.altitudeM.isNaN {
                ascent.add(point.altitudeM)
                hasAltitude = true
            }
            coordinates.append(Coordinate(lat: point.lat, lon: point.lon))
        }
        let maxSpeed = reportedMax ?? impliedMax
        let kept = DouglasPeucker.simplify(coordinates, epsilonM: s.config.simplifyEpsilonM)
        return TripEnded(
            tripID: tripID, device: device, startTime: first.date, endTime: last.date, durationS: duration,
            distanceM: distance, maxSpeedMps: maxSpeed, avgSpeedMps: duration > 0 ? distance / duration : 0,
            ascentM: hasAltitude ? ascent.ascentM : nil, descentM: hasAltitude ? ascent.descentM : nil,
            start: first.position, end: last.position, fixCount: end + 1,
            firstSeq: first.seq > 0 ? first.seq : nil, lastSeq: last.seq > 0 ? last.seq : nil,
            track: kept.map { [coordinates[$0].lat, coordinates[$0].lon] }, imported: tripImported)
    }

    /// The shortest span a top speed is implied over.
    static let speedSpanS = 5.0

    private var tripID: String {
        let first = track[0]
        return Naming.key(device: device, seq: first.seq > 0 ? first.seq : nil, time: first.date)
    }

    /// When the device went on foot (walking or running, medium or high confidence), if it is.
    private var onFootSince: Double? {
        guard let activity, Self.isOnFoot(activity, confidence) else { return nil }
        return activityT
    }

    private static func isOnFoot(_ activity: MotionSample.Activity, _ confidence: MotionSample.Confidence) -> Bool {
        (activity == .walking || activity == .running) && confidence >= .medium
    }

    @inline(__always)
    private static func longitudeDelta(_ delta: Double) -> Double {
        delta > 180 ? delta - 360 : delta < -180 ? delta + 360 : delta
    }
}
