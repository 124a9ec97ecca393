import DrivebusGeo
import DrivebusSchema
import DrivebusTestbed
import DrivebusTestSupport
import Foundation
import Testing
import TripsCore

// Helpers here are prefixed `trips` so that they cannot clash with other test files' helpers.

let tripsFixtureURL = URL(fileURLWithPath: #filePath).deletingLastPathComponent().appendingPathComponent("../Fixtures")
let tripsOrigin = Date(timeIntervalSince1970: 1_763_700_000)

func tripsDate(_ seconds: Double) -> Date { tripsOrigin.addingTimeInterval(seconds) }

/// The Vienna drive as fixes, in file order, with journal seqs 1, 2, …
func tripsViennaFixes(device: String = "car") throws -> [Fix] {
    let text = try String(contentsOf: tripsFixtureURL.appendingPathComponent("car_vienna_osm_1hz.gpx"), encoding: .utf8)
    var fixes: [Fix] = []
    for chunk in text.components(separatedBy: "<trkpt ").dropFirst() {
        func between(_ open: String, _ close: String) -> String? {
            guard let start = chunk.range(of: open), let end = chunk.range(of: close, range: start.upperBound..<chunk.endIndex)
            else { return nil }
            return String(chunk[start.upperBound..<end.lowerBound])
        }
        guard let lat = between("lat=\"", "\"").flatMap(Double.init), let lon = between("lon=\"", "\"").flatMap(Double.init),
            let time = between("<time>", "</time>").flatMap(RFC3339.parse)
        else { continue }
        fixes.append(Fix(seq: UInt64(fixes.count + 1), device: device, time: time, lat: lat, lon: lon, source: .import))
    }
    return fixes
}


/// Builds an input stream for one device along straight lines in a local metric frame.
struct TripsScript {
    let projection = LocalProjection(origin: Coordinate(lat: 48.2, lon: 16.37))
    var device = "car"
    var seq: UInt64 = 0
    /// Seconds since `tripsOrigin`.
    var t = 0.0
    var x = 0.0
    var y = 0.0
    var inputs: [TripsInput] = []
    var random = SplitMix64(seed: 7)
    /// As a file brings them: `importFinished()` closes only an imported trip.
    var source = FixSource.import

    init(device: String = "car", seqStart: UInt64 = 0) {
        self.device = device
        seq = seqStart
    }

    mutating func nextSeq() -> UInt64 {
        seq += 1
        return seq
    }

    mutating func fix(atX x: Double, y: Double, accuracy: Double? = nil, altitude: Double? = nil, speed: Double? = nil) {
        let position = projection.unproject(x: x, y: y)
        inputs.append(.fix(Fix(
            seq: nextSeq(), device: device, time: tripsDate(t), lat: position.lat, lon: position.lon,
            accuracyM: accuracy, altitudeM: altitude, speedMps: speed, source: source)))
    }

    /// Drives in a straight line to (x, y) at `speed`, a fix about every `every` seconds.
    mutating func drive(toX targetX: Double, y targetY: Double, speed: Double, every: Double = 1, altitude: ((Double) -> Double)? = nil) {
        let dx = targetX - x, dy = targetY - y
        let length = (dx * dx + dy * dy).squareRoot()
        let steps = max(1, Int((length / (speed * every)).rounded(.up)))
        let startX = x, startY = y
        for step in 1...steps {
            let fraction = Double(step) / Double(steps)
            t += length / speed / Double(steps)
            x = startX + dx * fraction
            y = startY + dy * fraction
            fix(atX: x, y: y, altitude: altitude?(t))
        }
    }

    /// Stays at the current place for `duration`, a fix every `every` seconds, scattered by up to
    /// `jitter` metres east and north.
    mutating func park(for duration: Double, every: Double, jitter: Double = 0) {
        for _ in 0..<Int(duration / every) {
            t += every
            fix(atX: x + jitter * random.signed(), y: y + jitter * random.signed())
        }
    }

    mutating func wait(_ seconds: Double) { t += seconds }

    mutating func motion(_ activity: MotionSample.Activity, _ confidence: MotionSample.Confidence = .high) {
        inputs.append(.motion(MotionSample(
            seq: nextSeq(), device: device, start: tripsDate(t), activity: activity, confidence: confidence, source: .api)))
    }

    /// A clock tick `after` seconds from now, without moving the script's time.
    mutating func tick(after: Double) { inputs.append(.tick(now: tripsDate(t + after))) }

    mutating func importFinished() {
        inputs.append(.importFinished(ImportFinished(seq: nextSeq(), device: device, file: "drive.gpx", fixes: 0)))
    }
}

func tripsRun(_ inputs: [TripsInput], _ configuration: TripsConfiguration = TripsConfiguration()) -> (outputs: [TripsOutput], segmenter: TripSegmenter) {
    var segmenter = TripSegmenter(configuration: configuration)
    var outputs: [TripsOutput] = []
    for input in inputs { outputs += segmenter.handle(input) }
    return (outputs, segmenter)
}

func tripsEnded(_ outputs: [TripsOutput]) -> [TripEnded] {
    outputs.compactMap { if case .ended(let trip) = $0 { trip } else { nil } }
}

func tripsStarted(_ outputs: [TripsOutput]) -> [TripStarted] {
    outputs.compactMap { if case .started(let trip) = $0 { trip } else { nil } }
}

/// The index of the input that produced the first output of `type`.
func tripsFirstIndex(of type: String, _ inputs: [TripsInput], _ configuration: TripsConfiguration = TripsConfiguration()) -> Int? {
    var segmenter = TripSegmenter(configuration: configuration)
    for (index, input) in inputs.enumerated() where segmenter.handle(input).contains(where: { $0.type == type }) {
        return index
    }
    return nil
}

func tripsPathDistance(_ fixes: [Fix]) -> Double {
    zip(fixes, fixes.dropFirst()).reduce(0) { sum, pair in
        sum + Geo.distance(Coordinate(lat: pair.0.lat, lon: pair.0.lon), Coordinate(lat: pair.1.lat, lon: pair.1.lon))
    }
}

@Suite struct TripsCoreTests {
    // MARK: Real data

    @Test func viennaDriveIsOneTripOf22Km() throws {
        let fixes = try tripsViennaFixes()
        #expect(fixes.count == 1525)
        let (outputs, segmenter) = tripsRun(fixes.map { .fix($0) } + [.importFinished(ImportFinished(seq: 1526, device: "car", file: "vienna.gpx", fixes: 1525))])
        let started = tripsStarted(outputs), ended = tripsEnded(outputs)
        // Neither the 74 s fuel stop, the 61 s border stop, the gaps of up to 53 s nor eight
        // minutes of circling the old town at walking pace split it.
        try #require(started.count == 1 && ended.count == 1)
        let trip = ended[0]
        #expect(abs(trip.distanceM - 22_300) <= 22_300 * 0.03, "distance \(trip.distanceM)")
        // It starts at the first fix: the car was already moving.
        #expect(trip.firstSeq == 1 && trip.startTime == fixes[0].time)
        #expect(trip.tripID == "car-1" && started[0].tripID == "car-1")
        // The GPX came in with `drivebus import`: a trip in a history, and both events say so.
        #expect(started[0].imported == true && trip.imported == true)
        #expect(String(decoding: try BusJSON.encode(trip), as: UTF8.self).contains(#""imported":true"#))
        #expect(abs(trip.durationS - 28.9 * 60) < 60)
        #expect(trip.ascentM == nil && trip.descentM == nil, "the fixture has no elevation")
        #expect(trip.track.count > 20 && trip.track.count < trip.fixCount / 2)
        #expect(segmenter.outOfOrderCount == 0)
        #expect(segmenter.lastSeq == 1526)
    }

    @Test func viennaOutlierAddsNoDistance() throws {
        let fixes = try tripsViennaFixes()
        // The 242 km/h fix: 67 m in one second after its predecessor in file order.
        let before = try #require(fixes.indices.dropLast().first { index in
            let a = fixes[index], b = fixes[index + 1]
            let dt = b.time.timeIntervalSince(a.time)
            return dt > 0 && Geo.distance(Coordinate(lat: a.lat, lon: a.lon), Coordinate(lat: b.lat, lon: b.lon)) / dt > 240 / 3.6
        })
        // The fix before that step is the wrong one: it repeats its predecessor's time, a car
        // length behind.
        let outlier = before
        let withOutlier = tripsPathDistance(fixes)
        let (outputs, segmenter) = tripsRun(fixes.map { .fix($0) } + [.importFinished(ImportFinished(device: "car", file: "vienna.gpx", fixes: 1525))])
        let trip = try #require(tripsEnded(outputs).first)
        // Its zig-zag (out and back) would add about 66 m; none of it is in the trip.
        let around = Array(fixes[(outlier - 1)...(outlier + 1)])
        let excess = tripsPathDistance(around) - tripsPathDistance([around[0], around[2]])
        #expect(excess > 60)
        #expect(trip.distanceM < withOutlier - excess, "trip \(trip.distanceM) vs \(withOutlier) with the outlier")
        // The highway is 130 km/h; misplaced fixes in the old town must not set a top speed.
        #expect(trip.maxSpeedMps > 30 && trip.maxSpeedMps < 40, "max speed \(trip.maxSpeedMps)")
        #expect(segmenter.outlierCount > 0)
    }

    // MARK: Synthetic rules

    @Test func driveParkFifteenMinutesDriveIsTwoTrips() throws {
        var script = TripsScript()
        script.park(for: 120, every: 10, jitter: 3)
        script.drive(toX: 3000, y: 0, speed: 15)
        let arrived = script.t
        script.park(for: 15 * 60, every: 10, jitter: 3)
        let departed = script.t
        script.drive(toX: 3000, y: 3000, speed: 15)
        script.park(for: 300, every: 10, jitter: 3)
        let (outputs, _) = tripsRun(script.inputs)
        let ended = tripsEnded(outputs)
        try #require(ended.count == 2 && tripsStarted(outputs).count == 2)
        // The first ends where it arrived, not when the stop was confirmed; the second starts
        // where it left, not 200 m later.
        #expect(abs(ended[0].endTime.timeIntervalSince(tripsDate(arrived))) < 10)
        #expect(abs(ended[1].startTime.timeIntervalSince(tripsDate(departed))) <= 10)
        #expect(abs(ended[0].distanceM - 3000) < 60 && abs(ended[1].distanceM - 3000) < 60)
        #expect(abs(ended[0].avgSpeedMps - 15) < 1)
        #expect(abs(ended[0].maxSpeedMps - 15) < 0.7, "max speed \(ended[0].maxSpeedMps)")
        #expect(ended[0].tripID != ended[1].tripID)
    }

    @Test func parkedJitterForAnHourMakesNoTrip() {
        for every in [10.0, 1.0] {
            var script = TripsScript()
            for _ in 0..<6 {
                script.park(for: 600, every: every, jitter: 25)
                script.tick(after: 1)
            }
            let (outputs, segmenter) = tripsRun(script.inputs)
            #expect(outputs.isEmpty, "fix every \(every) s: \(outputs.map(\.eventID))")
            #expect(segmenter.lastSeq == script.seq)
        }
    }

    @Test func jitteryParkingDoesNotPadTheNextTrip() throws {
        for every in [10.0, 1.0] {
            var script = TripsScript()
            script.park(for: 1800, every: every, jitter: 25)
            let departed = script.t
            script.drive(toX: 3000, y: 0, speed: 15)
            script.park(for: 300, every: every)
            let trip = try #require(tripsEnded(tripsRun(script.inputs).outputs).first)
            #expect(abs(trip.startTime.timeIntervalSince(tripsDate(departed))) <= 3 * every, "fix every \(every) s")
            #expect(abs(trip.distanceM - 3000) < 100, "fix every \(every) s: \(trip.distanceM)")
        }
    }

    @Test func shortStopsDoNotSplitATrip() {
        var script = TripsScript()
        script.drive(toX: 2000, y: 0, speed: 14)
        script.park(for: 150, every: 1, jitter: 2)  // a red light or a queue, under 180 s
        script.drive(toX: 4000, y: 0, speed: 14)
        script.importFinished()
        let ended = tripsEnded(tripsRun(script.inputs).outputs)
        #expect(ended.count == 1)
        #expect(abs((ended.first?.distanceM ?? 0) - 4000) < 80)
    }

    /// A segmenter restored from a checkpoint takes today's config: with a shorter stop, the
    /// red light that did not split the trip above now does.
    @Test func aRestoredSegmenterRunsWithTodaysConfig() throws {
        var script = TripsScript()
        script.drive(toX: 2000, y: 0, speed: 14)
        let restartAt = script.inputs.count
        script.park(for: 150, every: 1, jitter: 2)
        script.drive(toX: 4000, y: 0, speed: 14)
        script.importFinished()
        var segmenter = TripSegmenter(configuration: TripsConfiguration())
        var outputs = script.inputs[..<restartAt].flatMap { segmenter.handle($0) }
        var restored = try checkpointDecoder(TripsConfiguration()).decode(TripSegmenter.self, from: JSONEncoder().encode(segmenter))
        var shorterStops = TripsConfiguration()
        shorterStops.minDurationS = 120
        restored.configuration = shorterStops
        outputs += script.inputs[restartAt...].flatMap { restored.handle($0) }
        #expect(tripsEnded(outputs).count == 2)
        #expect(tripsEnded(tripsRun(script.inputs).outputs).count == 1)
    }

    @Test func outliersAddNoDistanceAndMoveNoState() throws {
        var script = TripsScript()
        script.drive(toX: 1000, y: 0, speed: 10)
        script.t += 1
        script.fix(atX: 6000, y: 0)  // 5 km in a second
        script.t += 1
        script.fix(atX: 1020, y: 400, accuracy: 500)  // far off, and says so
        script.drive(toX: 2000, y: 0, speed: 10)
        script.importFinished()
        let (outputs, segmenter) = tripsRun(script.inputs)
        let trip = try #require(tripsEnded(outputs).first)
        #expect(abs(trip.distanceM - 2000) < 25, "distance \(trip.distanceM)")
        #expect(segmenter.outlierCount == 2)
        #expect(trip.maxSpeedMps < 20)

        // At rest, neither kind starts a trip.
        var parked = TripsScript()
        parked.park(for: 300, every: 10)
        parked.t += 10
        parked.fix(atX: 0, y: 900, accuracy: 250)
        parked.t += 1
        parked.fix(atX: 2000, y: 0)
        parked.park(for: 300, every: 10)
        let (restOutputs, restSegmenter) = tripsRun(parked.inputs)
        #expect(restOutputs.isEmpty)
        #expect(restSegmenter.outlierCount == 2)
    }

    @Test func agreeingFastFixesAreAJumpNotOutliersForever() throws {
        // The first fix is wrong by 50 km; the device is really elsewhere and drives off.
        var script = TripsScript()
        script.fix(atX: 50_000, y: 0)
        script.park(for: 60, every: 1)
        script.drive(toX: 2000, y: 0, speed: 15)
        script.importFinished()
        let (outputs, segmenter) = tripsRun(script.inputs)
        #expect(segmenter.outlierCount == 2)
        let trip = try #require(tripsEnded(outputs).first)
        #expect(abs(trip.distanceM - 2000) < 40)
    }

    @Test func automotiveMotionStartsATripEarly() {
        func script(automotive: MotionSample.Confidence?) -> [TripsInput] {
            var script = TripsScript()
            script.park(for: 300, every: 10)
            if let automotive { script.motion(.automotive, automotive) }
            script.drive(toX: 150, y: 0, speed: 8)  // a short hop, under min_distance_m
            script.park(for: 400, every: 10)
            script.motion(.stationary)
            script.drive(toX: 2150, y: 0, speed: 15)
            return script.inputs
        }
        let plain = tripsRun(script(automotive: nil)).outputs
        let early = tripsRun(script(automotive: .high)).outputs
        let doubtful = tripsRun(script(automotive: .low)).outputs
        #expect(tripsEnded(plain).isEmpty && tripsStarted(plain).count == 1)
        #expect(tripsEnded(early).count == 1 && tripsStarted(early).count == 2)
        #expect(abs((tripsEnded(early).first?.distanceM ?? 0) - 150) < 20)
        #expect(tripsEnded(doubtful).isEmpty)

        // On a long drive, trip.started comes sooner.
        var long = TripsScript()
        long.park(for: 300, every: 10)
        long.motion(.automotive, .medium)
        long.drive(toX: 3000, y: 0, speed: 10)
        let withMotion = long.inputs
        let withoutMotion = withMotion.filter { if case .motion = $0 { false } else { true } }
        let soon = tripsFirstIndex(of: "trip.started", withMotion), late = tripsFirstIndex(of: "trip.started", withoutMotion)
        #expect(soon != nil && late != nil)
        if let soon, let late { #expect(soon < late - 5) }  // ~10 fixes (100 m at 10 m/s) earlier
    }

    @Test func sustainedWalkingEndsATripEarly() throws {
        var script = TripsScript()
        script.park(for: 120, every: 10)
        script.motion(.automotive)
        script.drive(toX: 3000, y: 0, speed: 15)
        let arrived = script.t
        script.park(for: 20, every: 1)
        script.motion(.walking, .high)
        let walkStarted = script.t
        script.drive(toX: 3000, y: 400, speed: 1.4)  // walks 400 m away: no drive
        script.park(for: 600, every: 10)
        let inputs = script.inputs
        let (outputs, _) = tripsRun(inputs)
        let ended = tripsEnded(outputs)
        try #require(ended.count == 1)
        #expect(tripsStarted(outputs).count == 1)
        #expect(abs(ended[0].endTime.timeIntervalSince(tripsDate(arrived))) < 5)
        #expect(abs(ended[0].distanceM - 3000) < 60)
        // Published once the walk had lasted walking_end_s, before a stay could be confirmed.
        let index = try #require(tripsFirstIndex(of: "trip.ended", inputs))
        guard case .fix(let fix) = inputs[index] else { Issue.record("ended on a non-fix input"); return }
        let sinceWalk = fix.time.timeIntervalSince(tripsDate(walkStarted))
        #expect(sinceWalk >= 60 && sinceWalk < 62)
    }

    @Test func briefWalkingDoesNotEndATrip() {
        var script = TripsScript()
        script.drive(toX: 2000, y: 0, speed: 15)
        script.motion(.walking, .medium)  // a misreading for half a minute
        script.drive(toX: 2400, y: 0, speed: 15)
        script.motion(.automotive)
        script.drive(toX: 4000, y: 0, speed: 15)
        script.importFinished()
        let ended = tripsEnded(tripsRun(script.inputs).outputs)
        #expect(ended.count == 1)
        #expect(abs((ended.first?.distanceM ?? 0) - 4000) < 80)
    }

    @Test func importFinishedClosesAtOnce() throws {
        // Still moving at the end: closes at the last fix.
        var moving = TripsScript()
        moving.drive(toX: 2000, y: 0, speed: 15)
        let lastFix = moving.t
        moving.importFinished()
        let (outputs, segmenter) = tripsRun(moving.inputs)
        #expect(outputs.last?.type == "trip.ended")
        let trip = try #require(tripsEnded(outputs).first)
        #expect(trip.endTime == tripsDate(lastFix))
        #expect(trip.imported == true && tripsStarted(outputs).first?.imported == true)
        #expect(trip.lastSeq == moving.seq - 1)

        // Parked for a minute at the end: closes where it arrived.
        var parked = TripsScript()
        parked.drive(toX: 2000, y: 0, speed: 15)
        let arrived = parked.t
        parked.park(for: 60, every: 1, jitter: 2)
        parked.importFinished()
        let parkedTrip = try #require(tripsEnded(tripsRun(parked.inputs).outputs).first)
        #expect(abs(parkedTrip.endTime.timeIntervalSince(tripsDate(arrived))) < 5)

        // Nothing open: nothing to close, and another device's import closes nothing here.
        var next = segmenter
        #expect(next.handle(.importFinished(ImportFinished(device: "car", file: "x.gpx", fixes: 0))).isEmpty)
        #expect(next.handle(.importFinished(ImportFinished(device: "other", file: "x.gpx", fixes: 0))).isEmpty)

        // A live trip goes on when an import (of older fixes, skipped) finishes: the phone is
        // still driving. Its events carry no `imported`.
        var live = TripsScript()
        live.source = .api
        live.drive(toX: 2000, y: 0, speed: 15)
        live.importFinished()
        let liveOutputs = tripsRun(live.inputs).outputs
        #expect(tripsStarted(liveOutputs).count == 1 && tripsEnded(liveOutputs).isEmpty)
        #expect(tripsStarted(liveOutputs).first?.imported == nil)
        live.wait(3600)
        live.tick(after: 0)
        let closed = try #require(tripsEnded(tripsRun(live.inputs).outputs).first)
        #expect(closed.imported == nil)
        #expect(try !String(decoding: BusJSON.encode(closed), as: UTF8.self).contains("imported"))
    }

    @Test func outOfOrderFixesAreCountedAndSkipped() throws {
        var script = TripsScript()
        script.drive(toX: 1000, y: 0, speed: 10)
        let now = script.t
        for back in [30.0, 20.0, 10.0] {
            script.t = now - back
            script.fix(atX: 5000, y: 5000)
        }
        script.t = now
        script.drive(toX: 2000, y: 0, speed: 10)
        script.importFinished()
        let (outputs, segmenter) = tripsRun(script.inputs)
        #expect(segmenter.outOfOrderCount == 3)
        let trip = try #require(tripsEnded(outputs).first)
        #expect(abs(trip.distanceM - 2000) < 25)
    }

    @Test func gapLongerThanStopGapEndsTheTripAtTheLastFixBeforeIt() throws {
        var configuration = TripsConfiguration()
        configuration.idleCloseS = 7200  // so that stop_gap_s is the rule that acts
        var script = TripsScript()
        script.drive(toX: 2000, y: 0, speed: 15)
        let beforeGap = script.t
        script.wait(3700)
        script.drive(toX: 5000, y: 0, speed: 15)
        script.importFinished()
        let ended = tripsEnded(tripsRun(script.inputs, configuration).outputs)
        try #require(ended.count == 2)
        #expect(ended[0].endTime == tripsDate(beforeGap))
        // The trip after the gap starts at its first fix: no trip spans a gap.
        #expect(ended[1].startTime > tripsDate(beforeGap + 3700))
    }

    @Test func silenceIsReportedOnceAfterSilentAfter() throws {
        var segmenter = TripSegmenter(configuration: TripsConfiguration())
        var script = TripsScript()
        script.park(for: 60, every: 10)
        for input in script.inputs { _ = segmenter.handle(input) }
        let last = script.t
        #expect(segmenter.handle(.tick(now: tripsDate(last + 21_599))).isEmpty)
        let silent = segmenter.handle(.tick(now: tripsDate(last + 21_600)))
        try #require(silent.count == 1)
        #expect(silent[0].eventID == "device.silent-car-\(script.seq)")
        guard case .silent(let event) = silent[0] else { Issue.record("not a silence"); return }
        #expect(event.lastTime == tripsDate(last) && event.silentS == 21_600 && event.lastSeq == script.seq)
        #expect(segmenter.handle(.tick(now: tripsDate(last + 30_000))).isEmpty)
        #expect(segmenter.handle(.tick(now: tripsDate(last + 90_000))).isEmpty)
        // Reporting again ends the silence; the next one is a new event.
        script.wait(90_000)
        script.inputs = []
        script.park(for: 20, every: 10)
        for input in script.inputs { _ = segmenter.handle(input) }
        let again = segmenter.handle(.tick(now: tripsDate(script.t + 25_000)))
        #expect(again.map(\.eventID) == ["device.silent-car-\(script.seq)"])
    }

    @Test func tickClosesAQuietTripExactlyAsTheNextFixWould() throws {
        func script(tickAfter: Double?, again: Bool = true) -> [TripsInput] {
            var script = TripsScript()
            script.park(for: 60, every: 10)
            script.drive(toX: 3000, y: 0, speed: 15)
            script.park(for: 50, every: 5)  // iOS sends a few fixes after parking, then nothing
            if let tickAfter {
                script.tick(after: tickAfter)
                if again { script.tick(after: tickAfter + 60) }  // firing again changes nothing
            }
            script.wait(2 * 3600)
            script.drive(toX: 3000, y: 3000, speed: 15)
            script.importFinished()
            return script.inputs
        }
        let replay = tripsRun(script(tickAfter: nil)).outputs
        let live = tripsRun(script(tickAfter: 601)).outputs
        let early = script(tickAfter: 599, again: false)
        #expect(tripsEnded(replay).count == 2)
        #expect(live == replay)
        #expect(tripsRun(early).outputs == replay)
        // The live run published the end at the tick.
        let index = try #require(tripsFirstIndex(of: "trip.ended", script(tickAfter: 601)))
        guard case .tick = script(tickAfter: 601)[index] else { Issue.record("not ended by the tick"); return }
        let tooSoon = try #require(tripsFirstIndex(of: "trip.ended", early))
        if case .tick = early[tooSoon] { Issue.record("closed before idle_close_s") }
    }

    @Test func ascentAndDescentUseTheHysteresis() throws {
        var script = TripsScript()
        // Climbs 60 m over 3 km with ±2 m of noise, then descends 20 m.
        var noise = SplitMix64(seed: 3)
        script.drive(toX: 3000, y: 0, speed: 15) { t in 100 + 60 * min(t, 200) / 200 + 2 * noise.signed() }
        let top = script.t
        script.drive(toX: 4000, y: 0, speed: 15) { t in 160 - 20 * min(t - top, 66) / 66 + 2 * noise.signed() }
        script.importFinished()
        let trip = try #require(tripsEnded(tripsRun(script.inputs).outputs).first)
        let ascent = try #require(trip.ascentM), descent = try #require(trip.descentM)
        #expect(abs(ascent - 60) < 8, "ascent \(ascent)")
        #expect(abs(descent - 20) < 8, "descent \(descent)")
    }

    @Test func trackIsSimplifiedAndPayloadIsSnakeCase() throws {
        var script = TripsScript()
        script.fix(atX: 0, y: 0)
        script.drive(toX: 2000, y: 0, speed: 15)
        script.drive(toX: 2000, y: 2000, speed: 15)
        script.importFinished()
        let outputs = tripsRun(script.inputs).outputs
        let trip = try #require(tripsEnded(outputs).first)
        #expect(trip.track.count == 3, "an L keeps its corner: \(trip.track)")
        #expect(trip.track.first == [trip.start.lat, trip.start.lon] && trip.track.last == [trip.end.lat, trip.end.lon])
        #expect(trip.fixCount == Int(script.seq) - 1 && trip.firstSeq == 1 && trip.lastSeq == script.seq - 1)

        let json = try #require(String(data: BusJSON.encoder().encode(trip), encoding: .utf8))
        for key in ["trip_id", "device", "start_time", "end_time", "duration_s", "distance_m", "max_speed_mps", "avg_speed_mps",
            "start", "end", "fix_count", "first_seq", "last_seq", "track"]
        {
            #expect(json.contains("\"\(key)\":"), "missing \(key)")
        }
        #expect(json.contains("\"start_time\":\"2025-11-21T04:40:00.000Z\""))
        #expect(json.contains("\"track\":[["))
        // Times go out with milliseconds, so compare what a consumer would re-publish.
        let decoded = try BusJSON.decoder().decode(TripEnded.self, from: Data(json.utf8))
        #expect(try BusJSON.encoder().encode(decoded) == BusJSON.encoder().encode(trip))
        let started = try #require(tripsStarted(outputs).first)
        let startedJSON = try #require(String(data: BusJSON.encoder().encode(started), encoding: .utf8))
        #expect(startedJSON == #"{"device":"car","first_seq":1,"imported":true,"start":{"lat":48.2,"lon":16.37},"start_time":"2025-11-21T04:40:00.000Z","trip_id":"car-1"}"#)
        for output in outputs {
            #expect(output.eventID.utf8.allSatisfy { (0x21...0x7E).contains($0) && $0 != UInt8(ascii: "\"") })
            #expect(output.device == "car")
        }
        #expect(outputs.map(\.eventID) == ["trip.started-car-1", "trip.ended-car-1"])
    }

    @Test func devicesAreSegmentedIndependently() {
        var car = TripsScript(device: "car")
        car.drive(toX: 3000, y: 0, speed: 15)
        car.park(for: 400, every: 10)
        var bike = TripsScript(device: "bike", seqStart: 100_000)
        bike.park(for: 100, every: 5)
        bike.drive(toX: 0, y: 2000, speed: 5)
        bike.park(for: 400, every: 10)
        let alone = tripsRun(car.inputs).outputs + tripsRun(bike.inputs).outputs
        // Interleave by time, as the journal would.
        let merged = (car.inputs + bike.inputs).sorted { a, b in
            guard case .fix(let x) = a, case .fix(let y) = b else { return false }
            return x.time < y.time || (x.time == y.time && x.device < y.device)
        }
        var sequenced: [TripsInput] = []
        for (index, input) in merged.enumerated() {
            guard case .fix(var fix) = input else { continue }
            fix.seq = UInt64(index + 1)
            sequenced.append(.fix(fix))
        }
        let together = tripsRun(sequenced).outputs
        #expect(tripsEnded(together).count == 2)
        #expect(Set(tripsEnded(together).map(\.distanceM)) == Set(tripsEnded(alone).map(\.distanceM)))
        #expect(Set(together.map(\.device)) == ["car", "bike"])
    }

    // MARK: Replay and restart

    @Test func replayedInputsAreIgnored() {
        var script = TripsScript()
        script.drive(toX: 3000, y: 0, speed: 15)
        script.park(for: 400, every: 10)
        var segmenter = TripSegmenter(configuration: TripsConfiguration())
        var first: [TripsOutput] = []
        for input in script.inputs { first += segmenter.handle(input) }
        #expect(tripsEnded(first).count == 1)
        var again: [TripsOutput] = []
        for input in script.inputs { again += segmenter.handle(input) }
        #expect(again.isEmpty)
        #expect(segmenter.lastSeq == script.seq)
    }

    @Test func restoringASnapshotAnywhereGivesTheSameEvents() async throws {
        try await offThePool {
            // Vienna, then a second device's day with stops, walking, an outlier and a tick (which
            // also closes Vienna and reports that car silent).
            var script = TripsScript(device: "van", seqStart: 2000)
            script.t = 3 * 86400
            script.park(for: 300, every: 10, jitter: 10)
            script.motion(.automotive)
            script.drive(toX: 2500, y: 0, speed: 14)
            script.park(for: 240, every: 5, jitter: 4)
            script.drive(toX: 2500, y: 2500, speed: 14)
            script.t += 1
            script.fix(atX: 9000, y: 0)
            script.motion(.walking)
            script.drive(toX: 2500, y: 2700, speed: 1.4)
            script.tick(after: 700)
            script.wait(4000)
            script.motion(.automotive, .medium)
            script.drive(toX: 0, y: 0, speed: 15)
            script.park(for: 100, every: 10)
            script.importFinished()
            let inputs = try tripsViennaFixes().map { TripsInput.fix($0) } + script.inputs
            let (expected, whole) = tripsRun(inputs)
            #expect(tripsEnded(expected).count >= 4)
            #expect(expected.contains { $0.type == "device.silent" })
            #expect(Set(expected.map(\.device)) == ["car", "van"])

            let encoder = JSONEncoder(), decoder = checkpointDecoder(TripsConfiguration())
            for every in [7, 97, 250, 1000] {
                var segmenter = TripSegmenter(configuration: TripsConfiguration())
                var outputs: [TripsOutput] = []
                for (index, input) in inputs.enumerated() {
                    outputs += segmenter.handle(input)
                    if (index + 1) % every == 0 {
                        segmenter = try decoder.decode(TripSegmenter.self, from: encoder.encode(segmenter))
                    }
                }
                #expect(outputs == expected, "snapshot every \(every) inputs")
                #expect(segmenter.lastSeq == whole.lastSeq && segmenter.outlierCount == whole.outlierCount)
            }

            // A crash after publishing but before the checkpoint: the same events again, same ids.
            var segmenter = TripSegmenter(configuration: TripsConfiguration())
            var checkpoint = try encoder.encode(segmenter)
            var published: [TripsOutput] = []
            for (index, input) in inputs.enumerated() {
                published += segmenter.handle(input)
                if index % 400 == 0 { checkpoint = try encoder.encode(segmenter) }
            }
            var restarted = try decoder.decode(TripSegmenter.self, from: checkpoint)
            var replayed: [TripsOutput] = []
            for input in inputs { replayed += restarted.handle(input) }  // ingest replays from the start
            let replayedIDs = Set(replayed.map(\.eventID))
            #expect(replayedIDs.isSubset(of: Set(published.map(\.eventID))))
            #expect(replayed == Array(expected.suffix(replayed.count)))
        }
    }

    @Test func aDamagedCheckpointIsRefusedNotTrusted() throws {
        var script = TripsScript()
        script.drive(toX: 1000, y: 0, speed: 15)
        let segmenter = tripsRun(script.inputs).segmenter
        var json = try #require(String(data: JSONEncoder().encode(segmenter), encoding: .utf8))
        json = json.replacingOccurrences(of: "\"stayIndex\":", with: "\"stayIndex\":9999")
        #expect(throws: DecodingError.self) { try checkpointDecoder(TripsConfiguration()).decode(TripSegmenter.self, from: Data(json.utf8)) }
    }

    @Test func theCheckpointHoldsStateAndNoConfiguration() throws {
        var script = TripsScript()
        script.drive(toX: 1000, y: 0, speed: 15)
        var configuration = TripsConfiguration()
        configuration.minDurationS = 77
        var segmenter = TripSegmenter(configuration: configuration)
        for input in script.inputs { _ = segmenter.handle(input) }
        let data = try JSONEncoder().encode(segmenter)
        let keys = try #require(try JSONSerialization.jsonObject(with: data) as? [String: Any]).keys
        #expect(Set(keys) == ["devices", "last_seq", "out_of_order", "outliers"])
        // Decoded with today's configuration, which wins; without one, decoding fails.
        let restored = try checkpointDecoder(TripsConfiguration()).decode(TripSegmenter.self, from: data)
        #expect(restored.configuration == TripsConfiguration())
        #expect(restored.lastSeq == segmenter.lastSeq)
        #expect(throws: DecodingError.self) { try JSONDecoder().decode(TripSegmenter.self, from: data) }
    }

    // MARK: Configuration

    @Test func configurationUsesSnakeCaseKeysAndDefaults() throws {
        let configuration = try JSONDecoder().decode(TripsConfiguration.self, from: Data(#"{"min_distance_m": 300, "walking_end_s": 90}"#.utf8))
        #expect(configuration.minDistanceM == 300 && configuration.walkingEndS == 90)
        #expect(configuration.minDurationS == 180 && configuration.stopGapS == 3600 && configuration.idleCloseS == 600)
        #expect(configuration.silentAfterS == 21600 && configuration.maxSpeedMps == 70 && configuration.maxAccuracyM == 100)
        #expect(configuration.simplifyEpsilonM == 5 && configuration.ascentHysteresisM == 5)
        try configuration.validate()
        var bad = configuration
        bad.minDurationS = 0
        #expect(throws: TripsConfiguration.Invalid(key: "min_duration_s", reason: "must be a finite number above 0, got 0.0")) {
            try bad.validate()
        }
    }
}

/// Ticks measure silence from when a fix arrived, not only from its own time: an import of old
/// history must not be chopped into trips by the clock while it is still coming in.
@Test func ticksDoNotCloseAnImportThatIsStillArriving() {
    let projection = LocalProjection(origin: Coordinate(lat: 48.2, lon: 16.37))
    let start = Date(timeIntervalSince1970: 1_600_000_000)  // 2020: long before the wall clock
    let wall = Date(timeIntervalSince1970: 1_763_700_000)
    var segmenter = TripSegmenter(configuration: TripsConfiguration())
    var outputs: [TripsOutput] = []
    for second in 0..<600 {
        let point = projection.unproject(x: Double(second) * 10, y: 0)
        let fix = Fix(seq: UInt64(second + 1), device: "car", time: start.addingTimeInterval(Double(second)), lat: point.lat, lon: point.lon, source: .import)
        let arrived = wall.addingTimeInterval(Double(second) / 100)
        outputs += segmenter.handle(.fix(fix), arrivedAt: arrived)
        // The service ticks every second while the import streams in.
        if second % 100 == 99 { outputs += segmenter.handle(.tick(now: arrived.addingTimeInterval(1))) }
    }
    #expect(!outputs.contains { if case .ended = $0 { true } else { false } })
    // Ten quiet minutes of wall clock later, the open trip is closed.
    outputs += segmenter.handle(.tick(now: wall.addingTimeInterval(6 + 601)))
    #expect(outputs.filter { if case .ended = $0 { true } else { false } }.count == 1)
}
