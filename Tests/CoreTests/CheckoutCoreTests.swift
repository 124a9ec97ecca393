import CheckoutCore
import DrivebusGeo
import DrivebusSchema
import DrivebusTestSupport
import DrivebusTestbed
import Foundation
import Testing

/// Times in these tests are seconds after the first check-in.
let checkoutT0 = RFC3339.parse("2026-11-21T18:30:00.000Z")!

func checkoutAt(_ seconds: Double) -> Date { checkoutT0 + seconds }

/// Positions along a street running east, `x` metres from its start.
let checkoutStreet = LocalProjection(origin: Coordinate(lat: 48.2, lon: 16.37))

func checkoutPosition(_ x: Double) -> Coordinate { checkoutStreet.unproject(x: x, y: 0) }

/// Builds an input sequence with journal seqs counting up from 1, as ingest would number it.
struct CheckoutFeed {
    var seq: UInt64 = 0
    var inputs: [CheckoutInput] = []

    mutating func nextSeq() -> UInt64 {
        seq += 1
        return seq
    }

    mutating func checkin(_ t: Double, device: String = "rider") {
        inputs.append(.checkin(TaxiCheckin(seq: nextSeq(), device: device, time: checkoutAt(t))))
    }

    mutating func motion(_ t: Double, _ activity: MotionSample.Activity, _ confidence: MotionSample.Confidence = .high, device: String = "rider") {
        inputs.append(.motion(MotionSample(seq: nextSeq(), device: device, start: checkoutAt(t), activity: activity, confidence: confidence, source: .api)))
    }

    /// A fix `x` metres along the street and `y` metres north of it, 5 m accurate.
    mutating func fix(_ t: Double, x: Double, y: Double = 0, speed: Double?, device: String = "rider") {
        let position = checkoutStreet.unproject(x: x, y: y)
        inputs.append(.fix(Fix(seq: nextSeq(), device: device, time: checkoutAt(t), lat: position.lat, lon: position.lon, accuracyM: 5, speedMps: speed, source: .api)))
    }

    mutating func tick(_ t: Double) { inputs.append(.tick(now: checkoutAt(t))) }

    /// A running service's ticks, one every `every` seconds from `from` through `through`.
    mutating func ticks(from: Double, through: Double, every: Double = 1) {
        for t in stride(from: from, through: through, by: every) { tick(t) }
    }

    /// A taxi ride by fixes every 10 s: riding east at 10 m/s from `start` to `stop`, standing for
    /// 50 s (paying), then walking on at 1.4 m/s until `end`. `speeds` says what the phone reports.
    mutating func checkoutRide(from start: Double, stop: Double, end: Double, speeds: CheckoutSpeeds, device: String = "rider") {
        var x = 0.0
        for t in stride(from: start, through: stop, by: 10) {
            x = (t - start) * 10
            fix(t, x: x, speed: speeds.report(10), device: device)
        }
        for t in stride(from: stop + 10, through: stop + 50, by: 10) { fix(t, x: x, speed: speeds.report(0), device: device) }
        for t in stride(from: stop + 60, through: end, by: 10) {
            x += 14
            fix(t, x: x, speed: speeds.report(1.4), device: device)
        }
    }
}

enum CheckoutSpeeds: CaseIterable {
    /// The phone reports its speed.
    case reported
    /// No speed: it comes from the positions.
    case none
    /// The phone says 0 while walking (it often does at walking pace); only standing and riding are right.
    case zeroWhileWalking

    func report(_ speed: Double) -> Double? {
        switch self {
        case .reported: speed
        case .none: nil
        case .zeroWhileWalking: speed < 5 ? 0 : speed
        }
    }
}

func checkoutRun(_ inputs: [CheckoutInput], _ detector: inout CheckoutDetector) -> [TaxiCheckout] {
    inputs.flatMap { detector.handle($0) }
}

func checkoutRun(_ inputs: [CheckoutInput], configuration: CheckoutConfiguration = CheckoutConfiguration()) -> [TaxiCheckout] {
    var detector = CheckoutDetector(configuration: configuration)
    return checkoutRun(inputs, &detector)
}

/// The distance along the fixes of `inputs` up to `time`, as the detector should compute it.
func checkoutDistance(_ inputs: [CheckoutInput], until time: Date) -> Double {
    let points = inputs.compactMap { input -> Coordinate? in
        guard case .fix(let fix) = input, fix.time <= time else { return nil }
        return Coordinate(lat: fix.lat, lon: fix.lon)
    }
    return zip(points, points.dropFirst()).reduce(0) { $0 + Geo.distance($1.0, $1.1) }
}

@Suite struct CheckoutCoreTests {
    // MARK: Motion rule

    @Test func walkingInsideTheGracePeriodIsIgnored() {
        var feed = CheckoutFeed()
        feed.checkin(0)
        feed.motion(10, .walking)  // still walking to the taxi, for 90 s
        feed.motion(100, .automotive)
        feed.motion(1500, .walking)
        feed.motion(1600, .stationary)
        let out = checkoutRun(feed.inputs)
        #expect(out.count == 1)
        #expect(out.first?.checkoutTime == checkoutAt(1500))
        #expect(out.first?.rideS == 1500)
        #expect(out.first?.reason == .walking)
    }

    @Test func aWalkThatBeganInTheGracePeriodNeverCounts() {
        // Walking to the taxi and then on past the grace period: a second sample (the confidence
        // changed) does not start a new walk.
        var feed = CheckoutFeed()
        feed.motion(-120, .walking, .medium)
        feed.checkin(0)
        feed.motion(70, .walking, .high)
        feed.motion(200, .automotive)
        feed.tick(300)
        #expect(checkoutRun(feed.inputs).isEmpty)
    }

    @Test func aWalkBeforeTheRideMovedDoesNotCount() {
        // Checked in early, then walking about for 85 s past the grace period before the taxi
        // came (MobilityNet had this: a phone that said walking minutes before the car left).
        var feed = CheckoutFeed()
        feed.checkin(0)
        feed.motion(100, .walking)
        feed.motion(185, .stationary)
        feed.motion(300, .automotive)
        feed.motion(1500, .walking)
        feed.motion(1600, .stationary)
        let out = checkoutRun(feed.inputs)
        #expect(out.map(\.checkoutTime) == [checkoutAt(1500)])

        // A fix at riding speed shows the ride moving as well as the phone saying automotive.
        var byFixes = CheckoutFeed()
        byFixes.checkin(0)
        byFixes.fix(80, x: 0, speed: 10)
        byFixes.fix(90, x: 100, speed: 10)
        byFixes.motion(100, .walking)
        byFixes.motion(185, .stationary)
        #expect(checkoutRun(byFixes.inputs).map(\.checkoutTime) == [checkoutAt(100)])

        // And a phone already in the car when it checks in has moved, whether its sample came
        // before the check-in or was uploaded after it.
        var inCar = CheckoutFeed()
        inCar.motion(-30, .automotive)
        inCar.checkin(0)
        inCar.motion(100, .walking)
        inCar.motion(185, .stationary)
        #expect(checkoutRun(inCar.inputs).map(\.checkoutTime) == [checkoutAt(100)])
        var uploadedLate = CheckoutFeed()
        uploadedLate.checkin(0)
        uploadedLate.motion(-30, .automotive)
        uploadedLate.motion(100, .walking)
        uploadedLate.motion(185, .stationary)
        #expect(checkoutRun(uploadedLate.inputs).map(\.checkoutTime) == [checkoutAt(100)])
    }

    @Test func theRideMustHaveMovedBeforeTheWalkBegan() {
        // Riding fixes that come after the walk began show it was no walk off the taxi.
        var feed = CheckoutFeed()
        feed.checkin(0)
        feed.motion(100, .walking)
        feed.fix(120, x: 0, speed: 10)
        feed.fix(130, x: 100, speed: 10)
        feed.motion(185, .stationary)
        #expect(checkoutRun(feed.inputs).isEmpty)

        // A vehicle sample below min_confidence does not show the ride moving.
        var unsure = CheckoutFeed()
        unsure.checkin(0)
        unsure.motion(30, .automotive, .low)
        unsure.motion(100, .walking)
        unsure.motion(185, .stationary)
        #expect(checkoutRun(unsure.inputs).isEmpty)
    }

    @Test func aRideFromACheckpointWithoutMovedAtGoesOnAsBefore() throws {
        var feed = CheckoutFeed()
        feed.checkin(0)
        feed.motion(100, .walking)
        var first = CheckoutDetector()
        #expect(checkoutRun(feed.inputs, &first).isEmpty)
        var json = String(decoding: try JSONEncoder().encode(first), as: UTF8.self)
        #expect(json.contains(#""movedAt":null"#))
        json = json.replacingOccurrences(of: #","movedAt":null"#, with: "").replacingOccurrences(of: #""movedAt":null,"#, with: "")
        var restored = try checkpointDecoder(CheckoutConfiguration()).decode(CheckoutDetector.self, from: Data(json.utf8))
        var rest = CheckoutFeed()
        rest.seq = feed.seq
        rest.motion(185, .stationary)
        // Written before the rule, the ride counts as moving: its walk checks out, as it would have.
        #expect(checkoutRun(rest.inputs, &restored).map(\.checkoutTime) == [checkoutAt(100)])
        // With the rule, the same ride waits for the taxi to move.
        var kept = try checkpointDecoder(CheckoutConfiguration()).decode(CheckoutDetector.self, from: try JSONEncoder().encode(first))
        #expect(checkoutRun(rest.inputs, &kept).isEmpty)
    }

    @Test func aShortWalkDoesNotCount() {
        var feed = CheckoutFeed()
        feed.checkin(0)
        feed.motion(30, .automotive)
        feed.motion(300, .walking)  // the phone jiggles at a light for 59.9 s
        feed.motion(359.9, .automotive)
        feed.motion(900, .walking)
        feed.motion(960, .stationary)  // exactly the lead time
        let out = checkoutRun(feed.inputs)
        #expect(out == [TaxiCheckout(
            device: "rider", checkinSeq: 1, checkinTime: checkoutAt(0), checkoutTime: checkoutAt(900),
            reason: .walking, confidence: .high, rideS: 900, rideDistanceM: nil, decidedAt: checkoutAt(960))])
    }

    @Test func aLowConfidenceWalkDoesNotCount() {
        var feed = CheckoutFeed()
        feed.checkin(0)
        feed.motion(30, .automotive)
        feed.motion(300, .walking, .low)
        feed.motion(500, .stationary)
        feed.motion(600, .walking, .medium)
        feed.motion(700, .stationary)
        let out = checkoutRun(feed.inputs)
        #expect(out.count == 1)
        #expect(out.first?.checkoutTime == checkoutAt(600))
        #expect(out.first?.confidence == .medium)
        #expect(out.first?.rideS == 600)

        var strict = CheckoutConfiguration()
        strict.minConfidence = .high
        #expect(checkoutRun(feed.inputs, configuration: strict).isEmpty)
    }

    @Test func runningChecksOut() {
        var feed = CheckoutFeed()
        feed.checkin(0)
        feed.motion(30, .automotive)
        feed.motion(1200, .running)
        feed.motion(1230, .walking, .medium)  // one walk with the running sample before it
        feed.motion(1290, .stationary)
        let out = checkoutRun(feed.inputs)
        #expect(out.count == 1)
        #expect(out.first?.reason == .running)
        #expect(out.first?.confidence == .high)
        #expect(out.first?.checkoutTime == checkoutAt(1200))
        #expect(out.first?.rideS == 1200)
    }

    @Test func theLastSampleLastsWhileTheDeviceIsSilent() {
        var feed = CheckoutFeed()
        feed.checkin(0)
        feed.motion(30, .automotive)
        feed.motion(900, .walking)
        feed.ticks(from: 900, through: 959)
        #expect(checkoutRun(feed.inputs).isEmpty)
        feed.tick(960)  // 60 s of ticks since the walk's sample: silence proves it lasted
        let out = checkoutRun(feed.inputs)
        #expect(out.count == 1)
        #expect(out.first?.checkoutTime == checkoutAt(900))
        #expect(out.first?.decidedAt == checkoutAt(960))
        #expect(out.first?.rideS == 900)

        // A replay without the ticks: the next sample decides the same check-out, same id.
        var replay = CheckoutFeed()
        replay.checkin(0)
        replay.motion(30, .automotive)
        replay.motion(900, .walking)
        replay.motion(1100, .stationary)
        let replayed = checkoutRun(replay.inputs)
        #expect(replayed.map(\.checkoutTime) == out.map(\.checkoutTime))
        #expect(replayed.first?.eventID == "taxi.checkout-rider-1")

        // A fix's time proves nothing about the newest sample: Overland journals a batch's fixes
        // before its motion samples.
        var fixes = CheckoutFeed()
        fixes.checkin(0)
        fixes.motion(900, .walking)
        fixes.fix(2000, x: 0, speed: 1.4)
        #expect(checkoutRun(fixes.inputs).isEmpty)

        // Ticks far apart are the service down or catching up: a few seconds each, no more.
        var restarted = CheckoutFeed()
        restarted.checkin(0)
        restarted.motion(900, .walking)
        restarted.tick(901)
        restarted.tick(5000)
        restarted.tick(9000)
        #expect(checkoutRun(restarted.inputs).isEmpty)
    }

    // MARK: max_ride

    @Test func maxRideInTheRidesOwnTime() {
        // No data after the ride's start: the deadline passes only after that much silence.
        var feed = CheckoutFeed()
        feed.checkin(0)
        feed.motion(30, .automotive)
        feed.ticks(from: 30, through: 21_595, every: 5)
        #expect(checkoutRun(feed.inputs).isEmpty)
        feed.tick(21_600)
        feed.tick(21_605)
        let out = checkoutRun(feed.inputs)
        #expect(out == [TaxiCheckout(
            device: "rider", checkinSeq: 1, checkinTime: checkoutAt(0), checkoutTime: checkoutAt(21_600),
            reason: .maxRide, confidence: nil, rideS: 21_600, rideDistanceM: nil, decidedAt: checkoutAt(21_600))])

        // A check-in given a time in the past: the wall clock a day later does not end the ride
        // before its own fixes arrive.
        var late = CheckoutFeed()
        late.checkin(0)
        late.tick(86_400 * 3)
        late.tick(86_400 * 3 + 1)
        late.checkoutRide(from: 0, stop: 300, end: 480, speeds: .reported)
        late.tick(86_400 * 3 + 2)
        #expect(checkoutRun(late.inputs).map(\.reason) == [.fixes])
    }

    @Test func maxRideWaitsForAWalkThatStartedBeforeIt() {
        var feed = CheckoutFeed()
        feed.checkin(0)
        feed.motion(30, .automotive)
        feed.motion(21_590, .walking)
        feed.ticks(from: 21_590, through: 21_600)
        #expect(checkoutRun(feed.inputs).isEmpty)
        var proven = feed
        proven.ticks(from: 21_601, through: 21_650)
        #expect(checkoutRun(proven.inputs).map(\.checkoutTime) == [checkoutAt(21_590)])
        #expect(checkoutRun(proven.inputs).map(\.reason) == [.walking])

        var refuted = feed
        refuted.motion(21_620, .automotive)
        let out = checkoutRun(refuted.inputs)
        #expect(out.map(\.reason) == [.maxRide])
        #expect(out.map(\.checkoutTime) == [checkoutAt(21_600)])
    }

    @Test func maxRideFromDataAloneNeedsNoTick() {
        var feed = CheckoutFeed()
        feed.checkin(0)
        feed.fix(10, x: 0, speed: 0)
        feed.fix(20, x: 100, speed: 10)
        feed.fix(21_700, x: 200, speed: 10)
        let out = checkoutRun(feed.inputs)
        #expect(out.count == 1)
        #expect(out.first?.reason == .maxRide)
        #expect(out.first?.checkoutTime == checkoutAt(21_600))
        #expect(out.first?.rideS == 21_600)
        // Interpolated along the fixes: 100 m, then 100 m over 21,680 s.
        let expected = checkoutDistance(feed.inputs, until: checkoutAt(20))
            + Geo.distance(checkoutPosition(100), checkoutPosition(200)) * 21_580 / 21_680
        #expect(abs(out.first!.rideDistanceM! - expected) <= 0.051)
    }

    // MARK: Fixes rule

    @Test(arguments: CheckoutSpeeds.allCases)
    func fixesOnlyRule(speeds: CheckoutSpeeds) {
        var feed = CheckoutFeed()
        feed.checkin(0)
        feed.checkoutRide(from: 0, stop: 300, end: 480, speeds: speeds)
        var detector = CheckoutDetector()
        var out: [TaxiCheckout] = []
        for input in feed.inputs {
            out += detector.handle(input)
            // The taxi stands from 310; the rider walks on straight ahead along its road from
            // 360. At 380, 42 m from the stop, that would be far enough across or back (30 m
            // beyond the fixes' 5 m accuracy), but ahead is where a queue crawls: 45 m. At 390,
            // 56 m: decided then, and not before. The walk began after the last fix at the
            // stop, 350 (paying takes time).
            if case .fix(let fix) = input {
                #expect(out.isEmpty == (fix.time < checkoutAt(390)), "\(fix.time)")
            }
        }
        #expect(out.count == 1)
        #expect(out.first?.reason == .fixes)
        #expect(out.first?.confidence == .medium)
        #expect(out.first?.checkoutTime == checkoutAt(350))
        #expect(out.first?.decidedAt == checkoutAt(390))
        #expect(out.first?.rideS == 350)
        #expect(abs(out.first!.walkedM! - (Geo.distance(checkoutPosition(3000), checkoutPosition(3056)) - 5)) <= 0.051)
        let expected = checkoutDistance(feed.inputs, until: checkoutAt(350))
        #expect(abs(out.first!.rideDistanceM! - expected) <= 0.051)
        #expect(abs(expected - 3000) < 1)
        #expect(detector.openCheckins == 0)
    }

    /// 1 Hz fixes with a phone's error: a slowly drifting offset plus fresh noise, metres each.
    struct NoisyPhone {
        var random = SplitMix64(seed: 7)
        var drift = (x: 0.0, y: 0.0)

        mutating func noise(_ scale: Double) -> Double { random.uniform(scale) }

        mutating func fix(_ feed: inout CheckoutFeed, _ t: Double, x: Double, y: Double = 0, speed: Double?, accuracy: Double = 8) {
            drift.x = 0.9 * drift.x + noise(1.5)
            drift.y = 0.9 * drift.y + noise(1.5)
            let position = checkoutStreet.unproject(x: x + drift.x + noise(1), y: y + drift.y + noise(1))
            feed.inputs.append(.fix(Fix(
                seq: feed.nextSeq(), device: "rider", time: checkoutAt(t), lat: position.lat, lon: position.lon,
                accuracyM: accuracy, speedMps: speed, source: .api)))
        }
    }

    @Test(arguments: [true, false])
    func aWalkWithPausesAndJitterChecksOutWhenTheWalkBegan(reportsSpeed: Bool) {
        var phone = NoisyPhone()
        var feed = CheckoutFeed()
        feed.checkin(0)
        var x = 0.0
        for t in stride(from: 0.0, through: 299, by: 1) {  // riding at 12 m/s
            x += 12
            phone.fix(&feed, t, x: x, speed: reportsSpeed ? 12 : nil)
        }
        for t in stride(from: 300.0, through: 339, by: 1) {  // stopped, paying, for 40 s
            phone.fix(&feed, t, x: x, speed: reportsSpeed ? 0 : nil)
        }
        var y = 0.0
        for t in stride(from: 340.0, through: 600, by: 1) {  // walking off the road, with a wait
            let waiting = (400.0..<425).contains(t)
            if !waiting { y += 1.3 }
            // The phone says 0 at walking pace half the time.
            phone.fix(&feed, t, x: x, y: y, speed: reportsSpeed ? (Int(t) % 2 == 0 ? 0 : (waiting ? 0 : 1.3)) : nil)
        }
        let out = checkoutRun(feed.inputs)
        #expect(out.count == 1)
        #expect(out.first?.reason == .fixes)
        // The walk began at 340; the fixes' 8 m accuracy and drift put its start within seconds.
        let began = out.first.map { $0.checkoutTime.timeIntervalSince(checkoutAt(340)) } ?? .nan
        #expect(abs(began) <= 10, "checked out \(began) s after the walk began")
    }

    @Test func aTaxiInAJamWithDriftingGPSDoesNotCheckOut() {
        var phone = NoisyPhone()
        var feed = CheckoutFeed()
        feed.checkin(0)
        var x = 0.0
        var t = 0.0
        func drive(_ seconds: Double, _ speed: Double, accuracy: Double = 8) {
            for _ in 0..<Int(seconds) {
                t += 1
                x += speed
                phone.fix(&feed, t, x: x, speed: nil, accuracy: accuracy)
            }
        }
        drive(200, 12)
        for _ in 0..<10 {  // stop and go for 5 minutes: 24 s standing, 6 s at 4 m/s
            drive(24, 0)
            drive(6, 4)
        }
        drive(180, 0, accuracy: 25)  // three minutes at a light, the fixes wandering
        drive(300, 12)
        #expect(checkoutRun(feed.inputs).isEmpty)
    }

    @Test func aFixHoursAfterTheStopConfirmsNoWalk() {
        // The taxi stops and the phone stays 80 s at the stop, then falls silent; one fix 60 m
        // away three hours later. Live, the clock would have run on without a walk; replayed,
        // that one fix must not confirm a walk either: both end at max_ride, the same.
        var ride = CheckoutFeed()
        ride.checkin(0)
        for t in stride(from: 0.0, through: 300, by: 10) { ride.fix(t, x: t * 10, speed: 10) }
        for t in stride(from: 310.0, through: 390, by: 10) { ride.fix(t, x: 3000, speed: 0) }
        ride.fix(11_190, x: 3060, speed: 0)
        ride.fix(11_200, x: 3061, speed: 0)
        ride.fix(21_700, x: 3061, speed: 0)  // the next fix, past max_ride
        var live = CheckoutFeed()
        var clock = 390.0
        for input in ride.inputs {
            if case .fix(let fix) = input {
                let t = fix.time.timeIntervalSince(checkoutT0)
                if t > clock + 1 { live.ticks(from: clock + 1, through: t - 1) }
                clock = max(clock, t)
            }
            live.inputs.append(input)
        }
        let out = checkoutRun(ride.inputs)
        #expect(out.map(\.reason) == [.maxRide])
        #expect(out.map(\.checkoutTime) == [checkoutAt(21_600)])
        #expect(checkoutRun(live.inputs).map(\.checkoutTime) == out.map(\.checkoutTime))
    }

    @Test func aReplayedOldRideChecksOutAsLive() {
        var phone = NoisyPhone()
        var ride = CheckoutFeed()
        ride.checkin(0)
        var x = 0.0
        for t in stride(from: 0.0, through: 600, by: 5) {
            if t < 400 { x += 60 } else if t >= 430 { x += 7 }
            phone.fix(&ride, t, x: x, speed: nil)
        }
        // Live: the ticks of a running service in between, one a second.
        var live = CheckoutFeed()
        for input in ride.inputs {
            if case .fix(let fix) = input {
                let t = fix.time.timeIntervalSince(checkoutT0)
                live.ticks(from: t - 4, through: t)
            }
            live.inputs.append(input)
        }
        // Imported three days later: ticks of today's clock between batches of 20.
        var imported = CheckoutFeed()
        for (index, input) in ride.inputs.enumerated() {
            if index % 20 == 0 { imported.tick(3 * 86_400 + Double(index / 20)) }
            imported.inputs.append(input)
        }
        let replayed = checkoutRun(ride.inputs)
        #expect(replayed.count == 1)
        #expect(replayed.first?.reason == .fixes)
        // The taxi stops at 400; the rider walks off at 430.
        #expect(replayed.first?.checkoutTime == checkoutAt(430))
        #expect(checkoutRun(live.inputs) == replayed)
        #expect(checkoutRun(imported.inputs) == replayed)
    }

    enum StepAway: CaseIterable {
        case across, back, ahead
    }

    /// A courier's van (GOAL's riders): fixes every 5 s, no speed, driving east at 10 m/s until
    /// 300, standing 20 s, then the driver walks 26 m at 1.3 m/s (325–340), waits and walks back
    /// (from `back`). Across the road or back against the van's course is where no car in
    /// traffic goes; ahead along the road is where a queue creeps, so 26 m ahead (21 m beyond the
    /// fixes' accuracy, short of `walk_min_distance_m`) is not a walk.
    static func courier(_ direction: StepAway, back: Double = 385) -> CheckoutFeed {
        var feed = vanArriving()
        let step: (x: Double, y: Double) = switch direction {
        case .across: (0, 6.5)
        case .back: (-6.5, 0)
        case .ahead: (6.5, 0)
        }
        var offset = 0.0
        for t in stride(from: 305.0, through: 480, by: 5) {
            if (325.0...340).contains(t) { offset += 1 } else if (back...back + 15).contains(t) { offset -= 1 }
            feed.fix(t, x: 3000 + step.x * offset, y: step.y * offset, speed: nil)
        }
        return feed
    }

    /// Checked in at 0, a van's fixes every 5 s with no speed, driving east at 10 m/s until it
    /// stands at 3,000 m at 300.
    static func vanArriving() -> CheckoutFeed {
        var feed = CheckoutFeed()
        feed.checkin(0)
        for t in stride(from: 0.0, through: 300, by: 5) { feed.fix(t, x: t * 10, speed: nil) }
        return feed
    }

    @Test(arguments: StepAway.allCases)
    func aCourierWhoStepsOffTheRoadChecksOutWhereTheVanStopped(_ direction: StepAway) {
        let out = checkoutRun(Self.courier(direction).inputs)
        guard direction != .ahead else {
            #expect(out.isEmpty)
            return
        }
        #expect(out.count == 1)
        let checkout = out.first
        #expect(checkout?.reason == .fixes)
        // Only aside, not far: low confidence, and `walked_m` is how far aside beyond half
        // the accuracy (26 - 2.5 m).
        #expect(checkout?.confidence == .low)
        #expect(abs((checkout?.walkedM ?? 0) - 23.5) <= 0.051)
        // The first fix that shows the van standing, the last one still beside it, and 60 s
        // of fixes after the stop.
        #expect(checkout?.stoppedAt == checkoutAt(305))
        #expect(checkout?.checkoutTime == checkoutAt(320))
        #expect(checkout?.decidedAt == checkoutAt(365))
        #expect(checkout?.rideS == 320)
    }

    @Test func aCourierBackAtTheVanBeforeItIsDecidedLeftItWhenTheWalkBegan() {
        // Back beside the van at 360, before the 60 s since the stop are heard (365): the walk
        // still began after 320, not at the return.
        let out = checkoutRun(Self.courier(.across, back: 345).inputs)
        #expect(out.map(\.checkoutTime) == [checkoutAt(320)])
        #expect(out.map(\.confidence) == [.low])
        #expect(out.map(\.decidedAt) == [checkoutAt(365)])
    }

    @Test func oneFixThatDriftsOffTheRoadIsNotAWalk() {
        // The van stands from 305; its fixes drift 5, 10, 17, 10, 5 m across the road at a
        // walker's pace and come back. 17 m is 14.5 m aside, beyond walk_aside_m, on one fix only.
        var feed = Self.vanArriving()
        let drift: [Double: Double] = [325: 5, 330: 10, 335: 17, 340: 10, 345: 5]
        for t in stride(from: 305.0, through: 480, by: 5) { feed.fix(t, x: 3000, y: drift[t] ?? 0, speed: nil) }
        #expect(checkoutRun(feed.inputs).isEmpty)
        // The pair 10 m then 17 m is held 7.5 m aside: a lower walk_aside_m takes it.
        var lowerThreshold = CheckoutConfiguration()
        lowerThreshold.walkAsideM = 7
        #expect(checkoutRun(feed.inputs, configuration: lowerThreshold).count == 1)
    }

    @Test func aCheckpointFromBeforeTheAsideRuleStillLoads() throws {
        // Written mid-stop, then stripped of what this version added to it.
        let inputs = Self.courier(.across).inputs
        var whole = CheckoutDetector()
        let expected = checkoutRun(inputs, &whole)
        var first = CheckoutDetector()
        var out = checkoutRun(Array(inputs.prefix(66)), &first)
        let encoder = JSONEncoder()
        encoder.outputFormatting = .sortedKeys
        var json = String(decoding: try encoder.encode(first), as: UTF8.self)
        #expect(json.contains("\"course\""))
        for key in ["course", "asideM", "leftAt"] {
            json = json.replacingOccurrences(of: #""\#(key)":(\{[^}]*\}|[^,}]*),?"#, with: "", options: .regularExpression)
        }
        json = json.replacingOccurrences(of: ",}", with: "}")
        #expect(!json.contains("\"course\""))
        var restored = try checkpointDecoder(CheckoutConfiguration()).decode(CheckoutDetector.self, from: Data(json.utf8))
        out += checkoutRun(Array(inputs.dropFirst(66)), &restored)
        // Without the course, the rest of this stop is judged by distance alone: no check-out
        // from 26 m across; but it loads and runs on.
        #expect(expected.count == 1)
        #expect(out.isEmpty)
    }

    @Test func fixesNeedARideFirst() {
        // Walking pace all along, with no riding speed: nothing.
        var feed = CheckoutFeed()
        feed.checkin(0)
        for t in stride(from: 0.0, through: 600, by: 10) { feed.fix(t, x: t * 1.4, speed: 1.4) }
        #expect(checkoutRun(feed.inputs).isEmpty)
    }

    @Test func fixesAtWalkingPaceMustBeSustained() {
        // Riding, a 40 s crawl at walking pace, riding again, then the real walk.
        var feed = CheckoutFeed()
        feed.checkin(0)
        feed.fix(0, x: 0, speed: 10)
        feed.fix(10, x: 100, speed: 10)
        feed.fix(20, x: 114, speed: 1.4)
        feed.fix(30, x: 128, speed: 1.4)
        feed.fix(40, x: 142, speed: 1.4)
        feed.fix(50, x: 156, speed: 1.4)
        feed.fix(60, x: 170, speed: 1.4)
        feed.fix(70, x: 270, speed: 10)
        for t in stride(from: 80.0, through: 140, by: 10) { feed.fix(t, x: 270 + (t - 70) * 1.4, speed: 1.4) }
        let out = checkoutRun(feed.inputs)
        #expect(out.map(\.checkoutTime) == [checkoutAt(80)])
        #expect(out.map(\.rideS) == [80])
    }

    // MARK: Motion and fixes together

    @Test func aMotionDeviceIsNotDeafToItsFixes() {
        // An iPhone that sent motion, but no walking sample after the ride: the fixes decide.
        var feed = CheckoutFeed()
        feed.motion(-120, .walking)
        feed.checkin(0)
        feed.motion(30, .automotive)
        feed.checkoutRide(from: 0, stop: 300, end: 480, speeds: .reported)
        let out = checkoutRun(feed.inputs)
        #expect(out.map(\.reason) == [.fixes])
        #expect(out.map(\.checkoutTime) == [checkoutAt(350)])
    }

    @Test func aVehicleSampleDuringASlowStretchIsTraffic() {
        // Crawling at walking pace after the ride, while the phone says automotive: no check-out
        // from those fixes; the walk later is found by motion.
        var feed = CheckoutFeed()
        feed.checkin(0)
        feed.fix(0, x: 0, speed: 10)
        feed.fix(10, x: 100, speed: 10)
        for t in stride(from: 20.0, through: 70, by: 10) { feed.fix(t, x: 100 + (t - 10) * 1.2, speed: 1.2) }
        feed.motion(25, .automotive)
        for t in stride(from: 80.0, through: 150, by: 10) { feed.fix(t, x: 172 + (t - 70) * 1.2, speed: 1.2) }
        feed.motion(160, .walking)
        feed.motion(230, .stationary)
        let out = checkoutRun(feed.inputs)
        #expect(out.map(\.reason) == [.walking])
        #expect(out.map(\.checkoutTime) == [checkoutAt(160)])
    }

    @Test func whicheverEvidenceSufficesFirstDecides() {
        var feed = CheckoutFeed()
        feed.checkin(0)
        feed.fix(0, x: 0, speed: 10)
        feed.motion(5, .automotive)
        feed.fix(10, x: 100, speed: 10)
        feed.motion(15, .walking)  // a walk after a short ride, within the grace period: ignored
        feed.motion(100, .automotive)
        feed.fix(200, x: 1000, speed: 10)
        feed.motion(300, .walking)
        for t in stride(from: 310.0, through: 360, by: 10) { feed.fix(t, x: 1000 + (t - 300) * 1.4, speed: 1.4) }
        feed.motion(370, .stationary)  // the motion walk lasted 70 s: decided before the fixes
        for t in stride(from: 370.0, through: 500, by: 10) { feed.fix(t, x: 1000 + (t - 300) * 1.4, speed: 1.4) }
        let out = checkoutRun(feed.inputs)
        #expect(out.map(\.reason) == [.walking])
        #expect(out.map(\.checkoutTime) == [checkoutAt(300)])
        #expect(out.map(\.rideS) == [300])
        #expect(out.map(\.decidedAt) == [checkoutAt(370)])
        // Along the fixes from the walk's start to the newest fix (360, at x = 1084): the start is
        // interpolated between the fixes at 200 (x = 1000) and 310 (x = 1014).
        #expect(abs(out.first!.walkedM! - (84 - 14 * 100 / 110)) <= 0.06)
    }

    // MARK: Check-ins

    @Test func aSecondCheckinReplacesTheOpenOne() {
        var feed = CheckoutFeed()
        feed.checkin(0)  // seq 1
        feed.motion(30, .automotive)
        feed.motion(600, .walking)  // the newest sample when the next check-in comes
        feed.checkin(1000)  // seq 4: its time proves the walk lasted
        feed.motion(1030, .automotive)
        feed.motion(1700, .walking)
        feed.motion(1800, .stationary)
        var detector = CheckoutDetector()
        let first = checkoutRun(Array(feed.inputs.prefix(4)), &detector)
        #expect(first.map(\.checkoutTime) == [checkoutAt(600)])
        #expect(first.map(\.eventID) == ["taxi.checkout-rider-1"])
        #expect(detector.openCheckins == 1)
        let second = checkoutRun(Array(feed.inputs.dropFirst(4)), &detector)
        #expect(second == [TaxiCheckout(
            device: "rider", checkinSeq: 4, checkinTime: checkoutAt(1000), checkoutTime: checkoutAt(1700),
            reason: .walking, confidence: .high, rideS: 700, rideDistanceM: nil, decidedAt: checkoutAt(1800))])
        #expect(second.map(\.eventID) == ["taxi.checkout-rider-4"])
        #expect(detector.openCheckins == 0)

        // With nothing to decide it, the replaced check-in ends without a check-out.
        var undecided = CheckoutFeed()
        undecided.checkin(0)
        undecided.motion(30, .automotive)
        undecided.checkin(500)
        var other = CheckoutDetector()
        #expect(checkoutRun(undecided.inputs, &other).isEmpty)
        #expect(other.openCheckins == 1)
    }

    @Test func devicesAreIndependent() {
        var feed = CheckoutFeed()
        feed.checkin(0, device: "a")
        feed.checkin(5, device: "b")
        feed.motion(30, .automotive, device: "a")
        feed.motion(35, .automotive, device: "b")
        feed.motion(400, .walking, device: "b")
        feed.motion(500, .walking, device: "a")
        feed.ticks(from: 500, through: 560)
        let out = checkoutRun(feed.inputs)
        // One tick proves both walks: two check-outs, in device order.
        #expect(out.map(\.device) == ["a", "b"])
        #expect(out.map(\.checkoutTime) == [checkoutAt(500), checkoutAt(400)])
        #expect(out.map(\.rideS) == [500, 395])
    }

    // MARK: Replay and checkpoints

    /// Two riders, motion and fixes, ticks, a replaced check-in and a max_ride.
    static func checkoutScenario() -> [CheckoutInput] {
        var feed = CheckoutFeed()
        feed.motion(-300, .walking, device: "ios")
        feed.checkin(0, device: "ios")
        feed.checkin(0, device: "android")
        feed.motion(40, .automotive, device: "ios")
        feed.checkoutRide(from: 0, stop: 300, end: 500, speeds: .none, device: "android")
        feed.ticks(from: 500, through: 505)
        feed.motion(800, .walking, device: "ios")
        feed.motion(820, .stationary, device: "ios")
        feed.motion(900, .walking, device: "ios")
        feed.ticks(from: 900, through: 960)
        feed.checkin(1000, device: "android")
        feed.fix(1010, x: 0, speed: 12, device: "android")
        feed.ticks(from: 1011, through: 1019)
        feed.fix(1020, x: 120, speed: 12, device: "android")
        feed.checkin(2000, device: "ios")
        feed.fix(2005, x: 0, speed: nil, device: "ios")
        feed.fix(2015, x: 90, speed: nil, device: "ios")
        feed.ticks(from: 2016, through: 2030)
        feed.fix(22_700, x: 1000, speed: 12, device: "android")
        feed.fix(23_700, x: 1000, speed: 12, device: "ios")
        return feed.inputs
    }

    @Test func theScenarioChecksOutEveryCheckinOnce() {
        var detector = CheckoutDetector()
        let out = checkoutRun(Self.checkoutScenario(), &detector)
        #expect(out.map(\.eventID) == [
            "taxi.checkout-android-3", "taxi.checkout-ios-2", "taxi.checkout-android-59",
            "taxi.checkout-ios-62",
        ])
        #expect(out.map(\.reason) == [.fixes, .walking, .maxRide, .maxRide])
        #expect(out.map(\.checkoutTime) == [checkoutAt(350), checkoutAt(900), checkoutAt(22_600), checkoutAt(23_600)])
        #expect(detector.openCheckins == 0)
    }

    @Test func snapshotAndRestoreEqualAnUninterruptedRun() throws {
        let inputs = Self.checkoutScenario()
        var whole = CheckoutDetector()
        let expected = checkoutRun(inputs, &whole)
        for split in 0...inputs.count {
            var first = CheckoutDetector()
            var out = checkoutRun(Array(inputs.prefix(split)), &first)
            let data = try JSONEncoder().encode(first)
            var restored = try checkpointDecoder(CheckoutConfiguration()).decode(CheckoutDetector.self, from: data)
            #expect(restored == first)
            out += checkoutRun(Array(inputs.dropFirst(split)), &restored)
            #expect(out == expected, "split at \(split)")
            #expect(restored == whole, "split at \(split)")
        }
    }

    @Test func replayedInputsAreIgnored() {
        let inputs = Self.checkoutScenario()
        var detector = CheckoutDetector()
        _ = checkoutRun(Array(inputs.prefix(30)), &detector)
        let seqAfter30 = detector.lastSeq
        let before = detector
        // The journal replays from an older seq: everything seen is skipped, without output.
        #expect(checkoutRun(Array(inputs.prefix(30)).filter { if case .tick = $0 { false } else { true } }, &detector).isEmpty)
        #expect(detector == before)
        #expect(detector.lastSeq == seqAfter30)
        // And the rest continues as if nothing happened.
        var whole = CheckoutDetector()
        let expected = checkoutRun(inputs, &whole)
        let first = checkoutRun(Array(inputs.prefix(30)), configuration: CheckoutConfiguration())
        #expect(first + checkoutRun(Array(inputs.dropFirst(30)), &detector) == expected)
    }

    @Test func aReplayWithoutTicksDecidesTheSameCheckoutsFromData() {
        // Everything the data decides comes out the same without the live run's ticks.
        var feed = CheckoutFeed()
        feed.checkin(0)
        feed.motion(30, .automotive)
        feed.motion(900, .walking)
        feed.tick(970)
        feed.motion(1000, .stationary)
        feed.checkin(2000, device: "android")
        feed.checkoutRide(from: 2000, stop: 2300, end: 2500, speeds: .reported, device: "android")
        let live = checkoutRun(feed.inputs)
        let replay = checkoutRun(feed.inputs.filter { if case .tick = $0 { false } else { true } })
        #expect(live.count == 2)
        #expect(replay == live)
    }

    // MARK: Payload and robustness

    @Test func payloadJSON() throws {
        let checkout = TaxiCheckout(
            device: "rider", checkinSeq: 1260, checkinTime: checkoutAt(0), checkoutTime: checkoutAt(1500),
            reason: .maxRide, confidence: nil, rideS: 1500, rideDistanceM: nil)
        let json = String(decoding: try BusJSON.encode(checkout), as: UTF8.self)
        #expect(json == #"{"checkin_seq":1260,"checkin_time":"2026-11-21T18:30:00.000Z","checkout_time":"2026-11-21T18:55:00.000Z","confidence":null,"device":"rider","reason":"max_ride","ride_s":1500}"#)
        #expect(try BusJSON.decode(TaxiCheckout.self, from: Array(json.utf8)) == checkout)
        var walked = checkout
        walked.reason = .walking
        walked.confidence = .high
        walked.rideDistanceM = 4213.5
        #expect(try BusJSON.decode(TaxiCheckout.self, from: try BusJSON.encode(walked)) == walked)
        var stepped = checkout
        (stepped.reason, stepped.confidence, stepped.walkedM) = (.fixes, .low, 17.5)
        (stepped.stoppedAt, stepped.decidedAt) = (checkoutAt(1480), checkoutAt(1560))
        let steppedJSON = String(decoding: try BusJSON.encode(stepped), as: UTF8.self)
        #expect(steppedJSON.contains(#""reason":"fixes","ride_s":1500,"stopped_at":"2026-11-21T18:54:40.000Z","walked_m":17.5}"#))
        #expect(try BusJSON.decode(TaxiCheckout.self, from: Array(steppedJSON.utf8)) == stepped)
        let noSeq = TaxiCheckout(
            device: "rider", checkinSeq: nil, checkinTime: checkoutAt(0), checkoutTime: checkoutAt(1),
            reason: .fixes, confidence: nil, rideS: 1, rideDistanceM: 0)
        #expect(noSeq.eventID == "taxi.checkout-rider-t1795285800000")
    }

    @Test func configurationDecodesSnakeCaseWithDefaults() throws {
        let json = #"{"lead_time_s": 90, "min_confidence": "high", "walking_speed_max_mps": 2}"#
        let configuration = try JSONDecoder().decode(CheckoutConfiguration.self, from: Data(json.utf8))
        var expected = CheckoutConfiguration()
        expected.leadTimeS = 90
        expected.minConfidence = .high
        expected.walkingSpeedMaxMps = 2
        #expect(configuration == expected)
        #expect(try JSONDecoder().decode(CheckoutConfiguration.self, from: Data("{}".utf8)) == CheckoutConfiguration())
    }

    @Test func garbageNeverCrashesAndEachCheckinChecksOutAtMostOnce() {
        // A deterministic generator, so a failure can be replayed.
        var state: UInt64 = 0x9E37_79B9_7F4A_7C15
        func random(_ bound: Int) -> Int {
            state = state &* 6_364_136_223_846_793_005 &+ 1_442_695_040_888_963_407
            return Int((state >> 33) % UInt64(bound))
        }
        let odd: [Double] = [.nan, .infinity, -.infinity, 1e300, -5, 0, 1e-9]
        var configuration = CheckoutConfiguration()
        configuration.walkingSpeedMaxMps = 0.1  // nothing walks, nothing traps
        configuration.gracePeriodS = .nan
        for round in 0..<2 {
            var detector = CheckoutDetector(configuration: round == 0 ? CheckoutConfiguration() : configuration)
            var seen = Set<String>()
            var seq: UInt64 = 0
            for _ in 0..<5000 {
                seq += UInt64(random(3))  // repeats and gaps
                let device = ["a", "b", "", "bad device", String(repeating: "x", count: 65)][random(5)]
                let t = random(10) == 0 ? odd[random(odd.count)] : Double(random(40_000)) - 1000
                let input: CheckoutInput
                switch random(4) {
                case 0: input = .checkin(TaxiCheckin(seq: seq, device: device, time: checkoutAt(t)))
                case 1:
                    input = .motion(MotionSample(
                        seq: seq, device: device, start: checkoutAt(t),
                        activity: MotionSample.Activity.allCases[random(6)], confidence: MotionSample.Confidence.allCases[random(3)], source: .api))
                case 2:
                    let lat = random(10) == 0 ? odd[random(odd.count)] : 48 + Double(random(1000)) / 10000
                    let speed: Double? = random(3) == 0 ? nil : random(10) == 0 ? odd[random(odd.count)] : Double(random(150)) / 10
                    input = .fix(Fix(seq: seq, device: device, time: checkoutAt(t), lat: lat, lon: 16, accuracyM: random(5) == 0 ? .nan : 5, speedMps: speed, source: .api))
                default: input = .tick(now: checkoutAt(t))
                }
                for checkout in detector.handle(input) {
                    #expect(seen.insert(checkout.eventID).inserted, "\(checkout.eventID) twice")
                    #expect(checkout.rideS.isFinite)
                }
            }
            #expect(seen.count > 10, "the garbage should still check out now and then")
        }
    }
}
