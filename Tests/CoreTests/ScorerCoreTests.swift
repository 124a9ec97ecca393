import DrivebusGeo
import DrivebusSchema
import DrivebusTestbed
import DrivebusTestSupport
import Foundation
import ScorerCore
import TripsCore
import Testing


/// A synthetic drive: speed and heading integrated finely, one fix per 1/hz seconds.
struct ScorerDrive {
    static let start = Date(timeIntervalSince1970: 1_763_700_000)
    static let projection = LocalProjection(origin: Coordinate(lat: 48.2, lon: 16.37))

    var device = "car"
    var seq: UInt64 = 1000
    var hz = 1.0
    var reportSpeed = true
    var reportCourse = true
    /// Adds ±0.5 m/s to reported speed and ±2° to reported course.
    var noise: SplitMix64?
    private(set) var step = 0
    private(set) var x = 0.0, y = 0.0
    var heading = 90.0
    private(set) var speed = 0.0
    private(set) var fixes: [Fix] = []
    /// Seconds after `start` of the first fix.
    let offset: Double

    init(device: String = "car", seq: UInt64 = 1000, speed: Double = 0, hz: Double = 1, offset: Double = 0) {
        self.device = device
        self.seq = seq
        self.speed = speed
        self.hz = hz
        self.offset = offset
    }

    var time: Date { Self.start.addingTimeInterval(offset + Double(step) / hz) }

    /// Records a fix of the current state.
    mutating func fix() {
        seq += 1
        var reportedSpeed = speed
        var course = heading
        if var random = noise {
            reportedSpeed = max(0, speed + random.uniform(0.5))
            course += random.uniform(2)
            noise = random
        }
        course = course.truncatingRemainder(dividingBy: 360)
        if course < 0 { course += 360 }
        let position = Self.projection.unproject(x: x, y: y)
        fixes.append(Fix(
            seq: seq, device: device, time: time, lat: position.lat, lon: position.lon, accuracyM: 5,
            speedMps: reportSpeed ? reportedSpeed : nil,
            courseDeg: reportCourse && speed >= 0.5 ? course : nil, source: .api))
    }

    /// Drives `seconds` with a constant acceleration (m/s²) and yaw rate (°/s).
    mutating func run(_ seconds: Double, accel: Double = 0, yaw: Double = 0) {
        let substeps = 20
        let h = 1 / hz / Double(substeps)
        for _ in 0..<Int((seconds * hz).rounded()) {
            for _ in 0..<substeps {
                let before = speed
                speed = max(0, speed + accel * h)
                let v = (before + speed) / 2
                let mid = (heading + yaw * h / 2) * .pi / 180
                x += v * h * sin(mid)
                y += v * h * cos(mid)
                heading += yaw * h
            }
            step += 1
            fix()
        }
    }

    /// Yaw rate in °/s for a turn of `radius` metres at the current speed.
    func yaw(radius: Double) -> Double { speed / radius * 180 / .pi }

    func trip(_ id: String = "trip-1", ended: Bool = true) -> ScorerTrip {
        ScorerTrip(
            tripID: id, device: device, startTime: fixes.first?.time ?? Self.start,
            endTime: ended ? fixes.last?.time : nil, firstSeq: fixes.first?.seq ?? 0,
            lastSeq: ended ? fixes.last?.seq : nil)
    }
}

func scorerRun(_ scorer: inout DriveScorer, _ inputs: [ScorerInput]) -> [ScorerOutput] {
    inputs.flatMap { scorer.handle($0) }
}

func scorerRun(_ fixes: [Fix], configuration: ScorerConfiguration = ScorerConfiguration()) -> [ScorerOutput] {
    var scorer = DriveScorer(configuration: configuration)
    return scorerRun(&scorer, fixes.map(ScorerInput.fix))
}

func scorerEvents(_ outputs: [ScorerOutput]) -> [DriveEvent] {
    outputs.compactMap { if case .event(let event) = $0 { event } else { nil } }
}

func scorerScored(_ outputs: [ScorerOutput]) -> [DriveScored] {
    outputs.compactMap { if case .scored(let scored) = $0 { scored } else { nil } }
}

/// Cruise, one constant-acceleration phase, cruise: the phase's acceleration is exact.
func scorerPhase(accel: Double, from speed: Double, seconds: Double) -> [Fix] {
    var drive = ScorerDrive(speed: speed)
    drive.fix()
    drive.run(10)
    drive.run(seconds, accel: accel)
    drive.run(10)
    return drive.fixes
}

/// The default weight for speed variation: 6 points per 0.1 m/s² above 0.25.
/// (The payload's variation is rounded to 0.001 and the score to 0.1: the two agree within 0.1.)
func speedVariationPoints(_ scored: DriveScored) -> Double {
    max(scored.speedVariation - 0.25, 0) / 0.1 * 6
}

@Suite struct ScorerCoreTests {
    // MARK: Thresholds

    // The thresholds are for speeds fitted from a phone's fixes (docs/scoring.md): −1.8 and 1.8.
    @Test(arguments: [(-1.7, 0), (-1.9, 1), (-2.3, 1)])
    func harshBrakeThreshold(decel: Double, expected: Int) {
        let events = scorerEvents(scorerRun(scorerPhase(accel: decel, from: 25, seconds: 5)))
        #expect(events.count == expected)
        if let event = events.first {
            #expect(event.type == .harshBrake)
            #expect(abs(event.peakMps2! - decel) < 1e-6)
            #expect(event.overKmh == nil)
            // Fixes 1012…1016 are 1 s into the braking to its end. The centred slope is full
            // from the second braking fix to the one before the end (half at the edges, under the
            // release level), so the episode is 1012…1015 and ends at 1016.
            #expect(event.firstSeq == 1012)
            #expect(event.durationS == 4)
        }
    }

    @Test(arguments: [(1.7, 0), (1.9, 1), (2.3, 1)])
    func harshAccelThreshold(accel: Double, expected: Int) {
        let events = scorerEvents(scorerRun(scorerPhase(accel: accel, from: 5, seconds: 5)))
        #expect(events.count == expected)
        if let event = events.first {
            #expect(event.type == .harshAccel)
            #expect(abs(event.peakMps2! - accel) < 1e-6)
        }
    }

    @Test func everyEpisodeIsOneEvent() {
        var drive = ScorerDrive(speed: 25)
        drive.fix()
        drive.run(10)
        // Two hard brakes 13 s apart: two events.
        drive.run(3, accel: -2.4)
        drive.run(6, accel: 1.2)
        drive.run(3, accel: -2.4)
        drive.run(6, accel: 1.2)
        // One brake interrupted by 1 s of easing off (under the release level): still one.
        drive.run(3, accel: -2.4)
        drive.run(1, accel: -0.5)
        drive.run(3, accel: -2.4)
        drive.run(10)
        let events = scorerEvents(scorerRun(drive.fixes))
        #expect(events.map(\.type) == [.harshBrake, .harshBrake, .harshBrake])
        // Full slope on the 2 inner fixes of each 3 s brake; the merged one spans both.
        #expect(events.map(\.durationS) == [2, 2, 6])
    }

    @Test func cornerFromAConstantRadiusTurn() {
        func turn(speed: Double, radius: Double, positionsOnly: Bool = false) -> [DriveEvent] {
            var drive = ScorerDrive(speed: speed)
            drive.reportSpeed = !positionsOnly
            drive.reportCourse = !positionsOnly
            drive.fix()
            drive.run(10)
            drive.run(8, yaw: drive.yaw(radius: radius))
            drive.run(10)
            return scorerEvents(scorerRun(drive.fixes))
        }
        // 15 m/s on 50 m: v²/r = 4.5 m/s².
        let fast = turn(speed: 15, radius: 50)
        #expect(fast.map(\.type) == [.harshCorner])
        #expect(abs(fast[0].peakMps2! - 4.5) < 0.01)
        #expect(fast[0].durationS >= 6)
        // The same from positions alone (chord speed and bearings).
        let derived = turn(speed: 15, radius: 50, positionsOnly: true)
        #expect(derived.map(\.type) == [.harshCorner])
        // Speeds from positions are taken over 5 s: the chord of the arc, a little short.
        #expect(abs(derived[0].peakMps2! - 4.5) < 0.2)
        // 10 m/s on 50 m: 2 m/s².
        #expect(turn(speed: 10, radius: 50).isEmpty)
        // 7 m/s on 10 m is 4.9 m/s², but below corner_min_speed: manoeuvring.
        #expect(turn(speed: 7, radius: 10).isEmpty)
    }

    @Test func aCurveIsHarshOnlyWhenTakenFasterThanItWasBuiltFor() {
        func curve(speed: Double, radius: Double) -> [DriveEvent] {
            var drive = ScorerDrive(speed: speed)
            drive.noise = SplitMix64(seed: 7)
            drive.fix()
            drive.run(10)
            drive.run(10, yaw: drive.yaw(radius: radius))
            drive.run(10)
            return scorerEvents(scorerRun(drive.fixes))
        }
        // A motorway exit ramp of 60 m radius at 40 km/h (2.0 m/s²): what it was built for.
        #expect(curve(speed: 11, radius: 60).isEmpty)
        // The same ramp at 58 km/h: 4.3 m/s² against 3.35 allowed at that speed.
        #expect(curve(speed: 16, radius: 60).map(\.type) == [.harshCorner])
        // A motorway bend of 700 m at 120 km/h (1.6 m/s²), and one of 400 m at the same speed
        // (2.7 m/s², beyond the 2.1 allowed there).
        #expect(curve(speed: 33, radius: 700).isEmpty)
        #expect(curve(speed: 33, radius: 400).map(\.type) == [.harshCorner])
    }

    @Test func oneImplausibleSpeedOrCourseMakesNoEvent() {
        var drive = ScorerDrive(speed: 25)
        drive.fix()
        drive.run(30)
        var fixes = drive.fixes
        // A reading of 0 between readings of 25 m/s, and a course 90° off for one fix.
        fixes[10].speedMps = 0
        fixes[20].courseDeg = 180
        let outputs = scorerRun(fixes)
        #expect(scorerEvents(outputs).isEmpty)
    }

    @Test(arguments: [1.0, 0.2])
    func aHardStopIsOneEventAtOneHertzAndEveryFiveSeconds(hz: Double) {
        // 0.4 g from 50 km/h to a standstill: 3.5 s of braking.
        var drive = ScorerDrive(speed: 50 / 3.6, hz: hz)
        drive.fix()
        drive.run(20)
        drive.run(50 / 3.6 / 3.92, accel: -3.92)
        drive.run(20)
        let events = scorerEvents(scorerRun(drive.fixes))
        #expect(events.map(\.type) == [.harshBrake])
        // Every five seconds the stop lies inside one interval: the least deceleration its two
        // speeds and the distance allow, still beyond the threshold.
        #expect(events.first.map { $0.peakMps2! <= -1.8 && $0.peakMps2! >= -3.92 - 1e-6 } == true)
    }

    @Test func fiveHertzGivesTheSameAnswer() {
        var drive = ScorerDrive(speed: 25, hz: 5)
        drive.fix()
        drive.run(10)
        drive.run(4, accel: -4.5)
        drive.run(10)
        let events = scorerEvents(scorerRun(drive.fixes))
        #expect(events.count == 1)
        #expect(abs(events[0].peakMps2! + 4.5) < 1e-6)
    }

    // MARK: Speeding

    @Test func speedingSecondsAndOneEventPerEpisode() {
        var configuration = ScorerConfiguration()
        configuration.speedLimitKmh = 50
        var drive = ScorerDrive(speed: 42 / 3.6)
        drive.fix()
        for _ in 0..<2 {
            drive.run(20)
            drive.run(8, accel: 28 / 3.6 / 8)  // 42 → 70 km/h, 3.5 km/h a second
            drive.run(20)
            drive.run(8, accel: -28 / 3.6 / 8)  // back to 42, under the limit from 49 km/h
        }
        drive.run(20)
        var scorer = DriveScorer(configuration: configuration)
        let outputs = scorerRun(&scorer, drive.fixes.map(ScorerInput.fix) + [.tripEnded(drive.trip())])
        let events = scorerEvents(outputs)
        #expect(events.map(\.type) == [.speeding, .speeding])
        #expect(events.map(\.overKmh) == [20, 20])
        #expect(events.map(\.limitKmh) == [50, 50])
        let scored = scorerScored(outputs)[0]
        // Fixes above 55 km/h: 56…70 on the ramp up (5), the hold (20), 66.5…56 down (4); each
        // counts the second since the fix before it: 29 s an episode.
        #expect(scored.speedingS == 58)
        // From the first fix over 55 to the first at or under 50: 4 + 20 + 6 s.
        #expect(events.map(\.durationS) == [30, 30])
        #expect(scored.counts["speeding"] == 2)
        #expect(scored.eventsPer100km == 0)
        // 58 s over the 10 min floor (the drive is 2.2 min): 58 × 6 × 0.05 = 17.4 points, and
        // the speed changes cost their variation.
        #expect(scored.components?.first { $0.name == "speeding" }?.points == 17.4)
        #expect(abs(scored.score - (100 - 17.4 - speedVariationPoints(scored))) <= 0.1)
    }

    @Test func zoneLimitReplacesTheGlobalOne() {
        var drive = ScorerDrive(speed: 50 / 3.6)
        drive.fix()
        drive.run(120)  // 1.67 km east at 50 km/h
        var configuration = ScorerConfiguration()
        configuration.speedLimitKmh = 100
        // A 30 zone 300 m around the point 800 m along.
        let center = ScorerDrive.projection.unproject(x: 800, y: 0)
        configuration.zoneSpeedLimits = [Zone(id: "school", shape: .circle(center: center, radiusM: 300), speedLimitKmh: 30)]
        let events = scorerEvents(scorerRun(drive.fixes, configuration: configuration))
        #expect(events.count == 1)
        #expect(events.first?.type == .speeding)
        #expect(abs((events.first?.overKmh ?? 0) - 20) < 0.05)
        #expect(events.first?.limitKmh == 30)
        #expect(abs((events.first?.durationS ?? 0) - 44) <= 1)  // 600 m at 13.9 m/s
        // Without the zone, 50 in a 100 is fine.
        configuration.zoneSpeedLimits = []
        #expect(scorerEvents(scorerRun(drive.fixes, configuration: configuration)).isEmpty)
    }

    // MARK: Noise and the score

    /// Ten minutes of ordinary driving: gentle starts and stops, curves, 1 Hz, ±0.5 m/s speed and
    /// ±2° course noise.
    static func smoothDrive(seed: UInt64) -> ScorerDrive {
        var drive = ScorerDrive()
        drive.noise = SplitMix64(seed: seed)
        drive.fix()
        for _ in 0..<4 {
            drive.run(10)
            drive.run(10, accel: 1.4)  // 0 → 14 m/s
            drive.run(30)
            drive.run(12, yaw: drive.yaw(radius: 150))  // 1.3 m/s² lateral
            drive.run(30)
            drive.run(12, yaw: -drive.yaw(radius: 200))
            drive.run(20)
            drive.run(10, accel: -1.4)
            drive.run(5)
        }
        return drive
    }

    @Test(arguments: [1, 2, 3, 42, 2026] as [UInt64])
    func noisySmoothDriveHasNoEventsAndScoresHigh(seed: UInt64) {
        let drive = Self.smoothDrive(seed: seed)
        var scorer = DriveScorer(configuration: ScorerConfiguration())
        let outputs = scorerRun(&scorer, drive.fixes.map(ScorerInput.fix) + [.tripEnded(drive.trip())])
        #expect(scorerEvents(outputs).isEmpty)
        let scored = scorerScored(outputs)
        #expect(scored.count == 1)
        // Four stops in 6.4 km at 1.4 m/s² each way: a speed variation of 0.51 m/s² by
        // construction, the only cost (6 points per 0.1 above 0.25), about 16 points.
        #expect(scored[0].speedVariation > 0.45 && scored[0].speedVariation < 0.56)
        #expect(abs(scored[0].score - (100 - speedVariationPoints(scored[0]))) <= 0.1)
        #expect(scored[0].score > 80)
        #expect(abs(scored[0].distanceM - 4 * 1596) < 30)
    }

    @Test func hardStopAndLaunchScoreClearlyLower() {
        var drive = ScorerDrive()
        drive.fix()
        drive.run(5)
        drive.run(4, accel: 0.4 * 9.80665)  // launch to 15.7 m/s
        drive.run(60)
        drive.run(4, accel: -0.5 * 9.80665)  // stop
        drive.run(10)
        var scorer = DriveScorer(configuration: ScorerConfiguration())
        let outputs = scorerRun(&scorer, [.tripStarted(drive.trip(ended: false))] + drive.fixes.map(ScorerInput.fix) + [.tripEnded(drive.trip())])
        let events = scorerEvents(outputs)
        #expect(events.map(\.type) == [.harshAccel, .harshBrake])
        #expect(events.allSatisfy { $0.tripID == "trip-1" })
        let scored = scorerScored(outputs)[0]
        #expect(scored.events.map(\.type) == [.harshAccel, .harshBrake])
        #expect(scored.counts == ["harsh_brake": 1, "harsh_accel": 1, "harsh_corner": 0, "speeding": 0])
        // 1.1 km is under the 10 km floor: each event is 10 per 100 km, 10 points each; the
        // speed variation of a short drive that is mostly one launch and one stop costs the rest.
        #expect(scored.eventsPer100km == 20)
        #expect(scored.components?.filter { $0.name.hasPrefix("harsh_") }.map(\.points) == [10, 10, 0])
        #expect(abs(scored.score - max(100 - 20 - speedVariationPoints(scored), 0)) <= 0.1)
        #expect(scored.score < 50)
        #expect(abs(scored.distanceM - 1000) < 50)
        #expect(abs(scored.events[0].peakMps2! - 3.923) < 0.01)
        #expect(scored.events[1].peakMps2! < -4.5)
    }

    // MARK: Trips and sessions

    @Test func tripAnnouncedLateStillGetsItsEvents() {
        var drive = ScorerDrive(speed: 20)
        drive.fix()
        drive.run(10)
        drive.run(3, accel: -4)
        drive.run(10)
        var scorer = DriveScorer(configuration: ScorerConfiguration())
        // Fixes from before the trip's first fix must not count.
        var before = ScorerDrive(seq: 900, speed: 0, offset: -60)
        before.fix()
        _ = scorerRun(&scorer, before.fixes.map(ScorerInput.fix))
        let live = scorerRun(&scorer, drive.fixes.map(ScorerInput.fix))
        #expect(scorerEvents(live).map(\.tripID) == [nil])
        // trip.started arrives after the fact, then trip.ended.
        #expect(scorer.handle(.tripStarted(drive.trip(ended: false))).isEmpty)
        let scored = scorerScored(scorer.handle(.tripEnded(drive.trip())))
        #expect(scored.count == 1)
        #expect(scored[0].events.map(\.tripID) == ["trip-1"])
        #expect(scored[0].counts["harsh_brake"] == 1)
        #expect(abs(scored[0].distanceM - (20 * 10 + 14 * 3 + 8 * 10)) < 1)
    }

    @Test func tripEndedBeforeItsFixesWaitsForThem() {
        var drive = ScorerDrive(speed: 20)
        drive.fix()
        drive.run(10)
        drive.run(3, accel: -4)
        drive.run(10)
        var scorer = DriveScorer(configuration: ScorerConfiguration())
        #expect(scorer.handle(.tripEnded(drive.trip())).isEmpty)
        let outputs = scorerRun(&scorer, drive.fixes.map(ScorerInput.fix))
        #expect(outputs.map(\.type) == ["drive.event", "drive.scored"])
        #expect(scorerScored(outputs).first?.events.count == 1)
    }

    @Test func aTripOfImportedFixesIsScoredAsImported() throws {
        // Derived as the scorer service and stats derive them: the Vienna GPX came in with
        // `drivebus import`, so its trip and its score say so; the same drive live does not.
        for source in [FixSource.import, .api] {
            var derivations = DriveDerivations(trips: TripsConfiguration(), scorer: ScorerConfiguration())
            var scores: [DerivedEvent] = []
            var fixes = try tripsViennaFixes()
            for index in fixes.indices { fixes[index].source = source }
            for fix in fixes { scores += derivations.handle(.fix(fix), arrivedAt: ScorerDrive.start).scores }
            scores += derivations.tick(ScorerDrive.start.addingTimeInterval(3600)).scores  // the silence closes it
            let scored = try #require(scores.first { $0.type == "drive.scored" })
            #expect(scores.filter { $0.type == "drive.scored" }.count == 1)
            #expect(try BusJSON.decode(DriveScored.self, from: scored.payload).imported == (source == .import ? true : nil))
        }
    }

    @Test func repeatedTripEndedIsIgnored() {
        let drive = Self.smoothDrive(seed: 7)
        var scorer = DriveScorer(configuration: ScorerConfiguration())
        let first = scorerRun(&scorer, drive.fixes.map(ScorerInput.fix) + [.tripEnded(drive.trip())])
        #expect(scorerScored(first).count == 1)
        #expect(scorer.handle(.tripEnded(drive.trip())).isEmpty)
        #expect(scorer.handle(.tripStarted(drive.trip(ended: false))).isEmpty)
        #expect(scorer.handle(.tripEnded(drive.trip())).isEmpty)
        // A replayed fix changes nothing either.
        #expect(scorer.handle(.fix(drive.fixes[3])).isEmpty)
        #expect(scorer.lastSeq == drive.fixes.last?.seq)
    }

    @Test func sessionsAttachToTheirTrips() {
        let time = ScorerDrive.start
        var scorer = DriveScorer(configuration: ScorerConfiguration())
        func trip(_ id: String, seq: UInt64) -> (ScorerTrip, [ScorerInput]) {
            var drive = ScorerDrive(seq: seq, speed: 10, offset: Double(seq) * 10)
            drive.fix()
            drive.run(20)
            return (drive.trip(id), drive.fixes.map(ScorerInput.fix))
        }
        let started = SessionStarted(sessionID: "s1", device: "car", candidate: "Alex", instructor: "Kim", time: time)
        // A trip inside the session.
        let (a, aFixes) = trip("a", seq: 100)
        var outputs = scorerRun(&scorer, [.sessionStarted(started), .tripStarted(a)] + aFixes + [.tripEnded(a)])
        #expect(scorerScored(outputs).first?.session == DriveSession(id: "s1", candidate: "Alex"))
        // A session started after the car moved off still owns that trip.
        let (b, bFixes) = trip("b", seq: 200)
        outputs = scorerRun(&scorer, [.sessionStopped(SessionStopped(sessionID: "s1", device: "car", time: time)), .tripStarted(b)] + bFixes)
        let later = SessionStarted(sessionID: "s2", device: "car", candidate: "Sam", time: time)
        outputs = scorerRun(&scorer, [.sessionStarted(later), .tripEnded(b)])
        #expect(scorerScored(outputs).first?.session == DriveSession(id: "s2", candidate: "Sam"))
        // After the stop, none; a stop for another session id changes nothing.
        let (c, cFixes) = trip("c", seq: 300)
        outputs = scorerRun(&scorer, [.sessionStopped(SessionStopped(sessionID: "s1", device: "car", time: time))])
        outputs = scorerRun(&scorer, [.tripStarted(c)] + cFixes + [.tripEnded(c)])
        #expect(scorerScored(outputs).first?.session == DriveSession(id: "s2", candidate: "Sam"))
        let (d, dFixes) = trip("d", seq: 400)
        outputs = scorerRun(&scorer, [.sessionStopped(SessionStopped(sessionID: "s2", device: "car", time: time)), .tripStarted(d)] + dFixes + [.tripEnded(d)])
        #expect(scorerScored(outputs).count == 1)
        #expect(scorerScored(outputs).first?.session == nil)
        // Another device's session is its own.
        var other = ScorerDrive(device: "van", seq: 500, speed: 10)
        other.fix()
        other.run(20)
        outputs = scorerRun(&scorer, [.sessionStarted(SessionStarted(sessionID: "s3", device: "bus", candidate: "Jo", time: time)), .tripStarted(other.trip("e"))] + other.fixes.map(ScorerInput.fix) + [.tripEnded(other.trip("e"))])
        #expect(scorerScored(outputs).first?.session == nil)
    }

    // MARK: Determinism and checkpoints

    static func mixedInputs() -> [ScorerInput] {
        var inputs: [ScorerInput] = []
        var seq: UInt64 = 10
        for (index, device) in ["car", "van"].enumerated() {
            var drive = ScorerDrive(device: device, seq: seq, speed: 0)
            drive.noise = SplitMix64(seed: UInt64(index + 1))
            drive.fix()
            drive.run(5)
            drive.run(4, accel: 3.5)
            drive.run(20)
            drive.run(6, yaw: drive.yaw(radius: 40))
            drive.run(20, accel: 0.5)
            drive.run(4, accel: -4.2)
            drive.run(10)
            seq = drive.seq + 1000
            inputs.append(.sessionStarted(SessionStarted(sessionID: "s-\(device)", device: device, candidate: "c-\(device)", time: ScorerDrive.start)))
            let fixes = drive.fixes.map(ScorerInput.fix)
            inputs += fixes.prefix(30) + [.tripStarted(drive.trip(device, ended: false))] + fixes.dropFirst(30)
            inputs.append(.tripEnded(drive.trip(device)))
        }
        // Interleave the two devices' streams by seq order of their fixes is not needed: each
        // device's block is in order, and seqs rise across blocks.
        return inputs
    }

    @Test func snapshotRestoreEqualsAnUninterruptedRun() throws {
        var configuration = ScorerConfiguration()
        configuration.speedLimitKmh = 60
        let inputs = Self.mixedInputs()
        var whole = DriveScorer(configuration: configuration)
        let expected = scorerRun(&whole, inputs)
        #expect(scorerScored(expected).count == 2)
        #expect(scorerEvents(expected).count >= 6)
        let sorted = JSONEncoder()
        sorted.outputFormatting = .sortedKeys
        for cut in stride(from: 0, through: inputs.count, by: 7) {
            var first = DriveScorer(configuration: configuration)
            var outputs = scorerRun(&first, Array(inputs[..<cut]))
            let data = try JSONEncoder().encode(first)
            var restored = try checkpointDecoder(configuration).decode(DriveScorer.self, from: data)
            #expect(try sorted.encode(restored) == sorted.encode(first))
            outputs += scorerRun(&restored, Array(inputs[cut...]))
            #expect(outputs == expected, "cut at \(cut)")
            #expect(try sorted.encode(restored) == sorted.encode(whole))
        }
    }

    @Test func outputIDsAreDerivedFromInputs() {
        var scorer = DriveScorer(configuration: ScorerConfiguration())
        let outputs = scorerRun(&scorer, Self.mixedInputs())
        let ids = outputs.map(\.eventID)
        #expect(Set(ids).count == ids.count)
        #expect(ids.contains("drive.scored-car"))
        #expect(ids.contains { $0.hasPrefix("drive.event-car-") && $0.hasSuffix("-harsh_accel") })
        var again = DriveScorer(configuration: ScorerConfiguration())
        #expect(scorerRun(&again, Self.mixedInputs()).map(\.eventID) == ids)
    }

    // MARK: Bad input and configuration

    @Test func garbageNeverCrashesOrFires() throws {
        let time = ScorerDrive.start
        var scorer = DriveScorer(configuration: ScorerConfiguration())
        var inputs: [ScorerInput] = []
        var seq: UInt64 = 1
        func add(_ t: Double, lat: Double = 48.2, lon: Double = 16.37, speed: Double? = nil, course: Double? = nil, accuracy: Double? = nil, hasSeq: Bool = true) {
            seq += 1
            inputs.append(.fix(Fix(seq: hasSeq ? seq : nil, device: "car", time: time.addingTimeInterval(t), lat: lat, lon: lon, accuracyM: accuracy, speedMps: speed, courseDeg: course, source: .api)))
        }
        add(0, speed: 10)
        add(1, lat: .nan, speed: 10)
        add(2, lon: .infinity, speed: 10)
        add(3, speed: .nan, course: .nan)
        add(4, speed: .infinity, course: -1)
        add(5, speed: 1e9, course: 1e9)
        add(5, speed: 40)  // same time again
        add(-100, speed: 40)  // back in time
        add(6, speed: 10, accuracy: .nan)
        add(7, speed: 10, accuracy: 5000)
        add(8, lat: 91, speed: 10)
        add(9, speed: 10, hasSeq: false)
        add(.greatestFiniteMagnitude, speed: 10)
        // Back from the absurd future: a new segment, across the antimeridian at 15 m/s.
        add(10, lat: 48.2, lon: 179.9999, speed: 15)
        add(11, lat: 48.2, lon: -179.9999)
        add(12, lat: 48.2, lon: -179.9997)
        inputs.append(.tripEnded(ScorerTrip(tripID: "x", device: "car", startTime: time, firstSeq: 99, lastSeq: 2)))
        inputs.append(.tripEnded(ScorerTrip(tripID: "y", device: "nobody", startTime: time, endTime: time.addingTimeInterval(-5), firstSeq: 0, lastSeq: nil, distanceM: .nan)))
        inputs.append(.sessionStopped(SessionStopped(sessionID: "none", device: "ghost", time: time)))
        let outputs = scorerRun(&scorer, inputs)
        #expect(scorerEvents(outputs).isEmpty)
        let scored = scorerScored(outputs)
        #expect(scored.count == 2)
        #expect(scored.allSatisfy { (0...100).contains($0.score) && $0.distanceM.isFinite && $0.speedVariation.isFinite })
        // The state still encodes (no NaN got in).
        _ = try JSONEncoder().encode(scorer)

        // A nonsense configuration is refused by validate() and survived by the scorer.
        var bad = ScorerConfiguration()
        bad.harshBrakeMps2 = 3
        bad.smoothingWindowS = .nan
        bad.historyFixes = -1
        bad.zoneSpeedLimits = [Zone(id: "z", shape: .polygon([Coordinate(lat: 1, lon: 1)]), speedLimitKmh: 30)]
        #expect(throws: ScorerConfigurationError(key: "harsh_brake_mps2", reason: "must be negative (a deceleration), above -50")) {
            try bad.validate()
        }
        var survivor = DriveScorer(configuration: bad)
        _ = scorerRun(&survivor, Self.smoothDrive(seed: 1).fixes.map(ScorerInput.fix))
    }

    @Test func configurationDecodesSnakeCaseWithDefaults() throws {
        let json = #"""
        {"harsh_brake_mps2": -4, "speed_limit_kmh": 80, "weights": {"harsh_brake": 2},
         "zone_speed_limits": [{"id": "school", "circle": {"lat": 48.2, "lon": 16.37, "radius_m": 200}, "speed_limit_kmh": 30}]}
        """#
        let configuration = try JSONDecoder().decode(ScorerConfiguration.self, from: Data(json.utf8))
        var expected = ScorerConfiguration()
        expected.harshBrakeMps2 = -4
        expected.speedLimitKmh = 80
        expected.weights.harshBrake = 2
        expected.zoneSpeedLimits = [Zone(id: "school", shape: .circle(center: Coordinate(lat: 48.2, lon: 16.37), radiusM: 200), speedLimitKmh: 30)]
        #expect(configuration == expected)
        try configuration.validate()
        try ScorerConfiguration().validate()
        var zoneless = ScorerConfiguration()
        zoneless.zoneSpeedLimits = [Zone(id: "z", shape: .polygon([]), speedLimitKmh: 30)]
        #expect(throws: ScorerConfigurationError.self) { try zoneless.validate() }
    }

    @Test func payloadsAreSnakeCase() throws {
        let event = DriveEvent(
            device: "car", tripID: "car-1", type: .harshBrake, time: ScorerDrive.start, lat: 48.2, lon: 16.37,
            peakMps2: -4.9, durationS: 2, firstSeq: 17)
        let encoder = JSONEncoder()
        encoder.outputFormatting = .sortedKeys
        encoder.dateEncodingStrategy = .iso8601
        let text = String(decoding: try encoder.encode(event), as: UTF8.self)
        #expect(text == #"{"device":"car","duration_s":2,"first_seq":17,"lat":48.2,"lon":16.37,"peak_mps2":-4.9,"time":"2025-11-21T04:40:00Z","trip_id":"car-1","type":"harsh_brake"}"#)
        let scored = DriveScored(
            tripID: "car-1", device: "car", startTime: ScorerDrive.start, score: 75, distanceM: 1000, events: [event],
            counts: ["harsh_brake": 1], eventsPer100km: 10, speedingS: 0, speedVariation: 0.8,
            session: DriveSession(id: "s1", candidate: "Alex"))
        let decoder = JSONDecoder()
        decoder.dateDecodingStrategy = .iso8601
        #expect(try decoder.decode(DriveScored.self, from: encoder.encode(scored)) == scored)
        let keys = try JSONSerialization.jsonObject(with: encoder.encode(scored)) as? [String: Any]
        #expect(Set(keys?.keys.map { $0 } ?? []) == ["trip_id", "device", "start_time", "score", "distance_m", "events", "counts", "events_per_100km", "speeding_s", "speed_variation", "session"])
    }
}
