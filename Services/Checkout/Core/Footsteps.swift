import DrivebusGeo
import DrivebusSchema
import Foundation

/// The fixes rule: a rider on foot, found in location fixes alone (see `docs/checkout.md`).
///
/// Phone fixes at 1–10 s are too noisy to judge one step at a time: a walker's fix-to-fix speed
/// leaves walking pace every few samples. So speeds are taken over a window of
/// `SpeedWindow.seconds`, with the fixes' accuracy taken off the distance, and a walk is judged
/// on where the rider ends up: once the taxi has stopped, the fixes must show nothing faster than
/// walking for `walk_confirm_s` and have taken the rider `walk_min_distance_m` away from the
/// stop, or `walk_aside_m` off the road the taxi came along (sideways or back: where no car in
/// traffic goes). A stop in traffic either moves on faster than walking (a crawl, the ride
/// resuming), creeps ahead along its road, or stays where it is (the GPS drifting), so it does
/// not confirm. The check-out time is found after the fact: when the rider left the stop.
struct Footsteps: Codable, Sendable, Equatable {
    struct Sample: Codable, Sendable, Equatable {
        var time: Date
        var lat: Double
        var lon: Double
        var accuracyM: Double
        var coordinate: Coordinate { Coordinate(lat: lat, lon: lon) }
    }

    struct Walk: Equatable {
        /// When the rider left the stop: the last fix still there.
        var start: Date
        /// When the taxi stopped.
        var stoppedAt: Date
        /// How far the rider got from the stop, beyond the fixes' accuracy, when it was decided;
        /// when only aside, how far off the road at most.
        var walkedM: Double
        /// Whether the rider got `walk_min_distance_m` away, not only `walk_aside_m` aside.
        var far: Bool
    }

    /// The direction the taxi came along to its stop, as a unit vector (east, north).
    struct Course: Codable, Sendable, Equatable {
        var east: Double
        var north: Double
    }

    enum SpeedWindow {
        /// Speeds are measured over at least this long: GPS position noise at 1 Hz is metres per
        /// second, at 5 s a fifth of that.
        static let seconds = 5.0
        /// What position noise can add to a distance over the window, at most. A phone's error
        /// drifts slowly, so two fixes seconds apart are closer in error than their accuracy
        /// says; the full accuracy is taken off only when judging where the rider ends up.
        static let noiseM = 3.0
    }

    /// Assumed for a fix that does not say how accurate it is.
    static let assumedAccuracyM = 10.0
    /// A fix that no car or walker could reach from the previous one is an outlier.
    static let plausibleSpeedMps = 70.0
    /// Fixes older than this are forgotten; the window needs far fewer.
    static let historyS = 60.0
    /// The taxi's course at the stop is taken over at least this much of its last path: over
    /// less, GPS noise turns it.
    static let courseBaseM = 20.0

    /// The last fixes, oldest first, within `historyS`: the window's start.
    private(set) var recent: [Sample] = []
    /// The time of the last fix at riding speed; nil until the ride has moved.
    private(set) var ridingAt: Date?
    /// Where and when the taxi stopped, while everything since is no faster than walking.
    private var stop: Sample?
    /// The last fix still at the stop (within the fixes' accuracy): the walk began after it.
    private var lastAtStop: Date?
    /// The way the taxi came to the stop; nil when its last path was too short to tell.
    private var course: Course?
    /// The farthest the rider has been off the taxi's road since the stop (`clearAside`, on two
    /// fixes in a row), and the last fix at the stop before that point: when the rider left. A
    /// courier walks to a door and back; a passenger need not stay away to have left. Optional,
    /// so checkpoints written before they existed still decode.
    private var asideM: Double?
    private var leftAt: Date?
    /// Seconds since the stop that fixes vouch for: a silence counts only its first
    /// `evidenceGapS`. One fix after a minute of silence proves nothing about that minute.
    private var heardS: Double?
    /// The start of the phone's newest motion sample, when that says automotive or cycling.
    private var vehicleAt: Date?

    /// The phone said it was in a vehicle after the taxi last moved: slow fixes are traffic,
    /// until the taxi moves again or the phone says otherwise.
    var inTraffic: Bool {
        guard let vehicleAt else { return false }
        return ridingAt.map { vehicleAt >= $0 } ?? true
    }

    /// When the taxi stopped, while the fixes since may still become a walk.
    var candidate: Date? { stop?.time }

    /// Adds a fix newer than the previous one; returns the walk once the fixes confirm it.
    mutating func add(_ fix: Fix, _ configuration: CheckoutConfiguration) -> Walk? {
        let sample = Sample(time: fix.time, lat: fix.lat, lon: fix.lon, accuracyM: fix.accuracyM ?? Self.assumedAccuracyM)
        if let previous = recent.last,
           Geo.distance(previous.coordinate, sample.coordinate) > Self.plausibleSpeedMps * sample.time.timeIntervalSince(previous.time) {
            return nil
        }
        let windowStart = recent.last { $0.time <= sample.time - SpeedWindow.seconds } ?? recent.first
        let previous = recent.last
        recent.append(sample)
        // Kept from `historyS` before the previous fix: after a silence, the taxi's course is
        // still known where it was last heard.
        let keptFrom = (previous?.time ?? sample.time) - Self.historyS
        recent.removeFirst(recent.prefix { $0.time < keptFrom }.count)
        guard let windowStart else { return nil }

        let reported = fix.speedMps.flatMap { $0.isFinite && $0 >= 0 ? $0 : nil }
        func speed(since start: Sample) -> Double {
            Self.clearDistance(start, sample, noiseM: SpeedWindow.noiseM) / sample.time.timeIntervalSince(start.time)
        }
        let windowSpeed = speed(since: windowStart)
        if stop != nil, let previous, sample.time.timeIntervalSince(previous.time) > Self.lostS {
            // Silent this long at the stop: what the rider did meanwhile is unknown (a fix hours
            // later must not confirm a walk that a running clock would have given up on). Judged
            // afresh from here.
            (stop, lastAtStop, heardS, course, asideM, leftAt) = (sample, sample.time, 0, nil, nil, nil)
            return nil
        }
        if let current = stop {
            // Stopped: faster than walking again is the taxi moving on (a crawl in traffic).
            let moving = reported ?? windowSpeed
            if moving > configuration.walkingSpeedMaxMps {
                if moving >= configuration.ridingSpeedMps { ridingAt = sample.time }
                (stop, lastAtStop, heardS, course, asideM, leftAt) = (nil, nil, nil, nil, nil, nil)
                return nil
            }
            if Self.clearDistance(current, sample) == 0 { lastAtStop = sample.time }
            // Held over two fixes in a row: one fix can drift off the road; a rider stays there.
            // (Held over 5 s instead, which is more fixes at 1 Hz, checked out fewer real rides
            // on both data sets and no fewer jams.)
            let aside = min(Self.clearAside(current, sample, course: course), previous.map { Self.clearAside(current, $0, course: course) } ?? 0)
            if aside > asideM ?? 0 { (asideM, leftAt) = (aside, lastAtStop) }
            if let previous { heardS = (heardS ?? 0) + min(sample.time.timeIntervalSince(previous.time), Self.evidenceGapS) }
        } else {
            // The phone's Doppler speed, when it has one, says whether the taxi is moving;
            // positions alone need the whole window to say it.
            if (reported ?? windowSpeed) >= configuration.ridingSpeedMps {
                ridingAt = sample.time
                return nil
            }
            guard let ridingAt else { return nil }
            // Still slowing down, or crawling in traffic.
            if windowSpeed > configuration.walkingSpeedMaxMps || (reported ?? 0) > configuration.walkingSpeedMaxMps { return nil }
            let stopped: Sample
            if let previous, previous.time == ridingAt, sample.time.timeIntervalSince(previous.time) > Self.silentStopS {
                // The phone fell silent as the taxi stopped and was heard again on foot: the
                // taxi stopped where it was last heard, and that is the best date for the walk
                // too (on GeoLife's labelled rides, dating it by walking pace from there was
                // later than the labels).
                stopped = previous
            } else {
                stopped = sample
            }
            (stop, lastAtStop, heardS, asideM, leftAt) = (stopped, stopped.time, 0, nil, nil)
            course = Self.course(to: stopped, along: recent)
            return nil
        }
        guard let stop, (heardS ?? 0) >= configuration.walkConfirmS, !inTraffic else { return nil }
        let walkedM = Self.clearDistance(stop, sample)
        // Straight ahead along the taxi's road is where a queue crawls: a walk that way must go
        // half as far again.
        let far = walkedM >= configuration.walkMinDistanceM * (Self.isAhead(stop, sample, course: course) ? Self.aheadFactor : 1)
        let farthestAside = asideM ?? 0
        guard far || farthestAside >= configuration.walkAsideM else { return nil }
        // The walk began when the rider left the stop, not when the taxi reached it (paying and
        // getting out take a minute or two); a courier back at the van left it before.
        let left = far ? lastAtStop : leftAt ?? lastAtStop
        return Walk(start: left ?? stop.time, stoppedAt: stop.time, walkedM: far ? walkedM : farthestAside, far: far)
    }

    /// The direction from the newest earlier fix at least `courseBaseM` back to the stop.
    static func course(to stop: Sample, along samples: [Sample]) -> Course? {
        guard let from = samples.last(where: { $0.time < stop.time && Geo.distance($0.coordinate, stop.coordinate) >= courseBaseM })
        else { return nil }
        let offset = LocalProjection(origin: from.coordinate).project(stop.coordinate)
        let length = (offset.x * offset.x + offset.y * offset.y).squareRoot()
        return Course(east: offset.x / length, north: offset.y / length)
    }

    /// How much farther than `walk_min_distance_m` a walk straight ahead must go. On the labelled
    /// rides, 1.5 left GeoLife's jams checked out 25 → 22 and its early check-outs 90 → 80, for
    /// one GOAL ride; 2 cost more real rides than it saved.
    static let aheadFactor = 1.5

    /// Whether `sample` lies straight ahead of the stop along the taxi's course (within about
    /// 27°: twice as far ahead as across).
    static func isAhead(_ stop: Sample, _ sample: Sample, course: Course?) -> Bool {
        guard let course else { return false }
        let here = Self.offset(stop, sample, course)
        return here.ahead > 2 * here.across
    }

    /// How far `sample` is off the taxi's road at the stop: across the course, plus any way back
    /// against it, less half the fixes' accuracy. A car in traffic only creeps ahead; a rider
    /// on foot steps to the pavement and to a door. Zero without a course.
    static func clearAside(_ stop: Sample, _ sample: Sample, course: Course?) -> Double {
        guard let course else { return 0 }
        let here = Self.offset(stop, sample, course)
        return max(0, here.across + max(0, -here.ahead) - (stop.accuracyM + sample.accuracyM) / 4)
    }

    /// Where `sample` is from the stop, in metres along the taxi's course (negative: behind it)
    /// and across it (either side).
    static func offset(_ stop: Sample, _ sample: Sample, _ course: Course) -> (ahead: Double, across: Double) {
        let offset = LocalProjection(origin: stop.coordinate).project(sample.coordinate)
        return (offset.x * course.east + offset.y * course.north, abs(offset.x * course.north - offset.y * course.east))
    }

    /// A silence at the stop longer than this starts the judgement again.
    static let lostS = 120.0
    /// The most of a silence between two fixes that counts as heard.
    static let evidenceGapS = 15.0

    /// A silence longer than this between the last riding fix and the first slow one: the
    /// phone lost its fix as the taxi stopped (it often does in the car).
    static let silentStopS = 10.0

    /// The phone's newest motion sample.
    mutating func motion(_ activity: Activity, _ configuration: CheckoutConfiguration) {
        vehicleAt = activity.isVehicle(configuration) ? activity.start : nil
    }

    /// The distance between two fixes beyond what their accuracy (or `noiseM`, if less) explains.
    static func clearDistance(_ a: Sample, _ b: Sample, noiseM: Double = .infinity) -> Double {
        max(0, Geo.distance(a.coordinate, b.coordinate) - min((a.accuracyM + b.accuracyM) / 2, noiseM))
    }
}
