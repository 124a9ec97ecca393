import DrivebusGeo
import DrivebusSchema
import DrivebusTestbed
import DrivebusTestSupport
import Foundation
@_spi(Testing) import GeofenceCore
import Testing

/// Times in these tests are seconds after this.
let geofenceT0 = RFC3339.parse("2026-11-21T18:00:00.000Z")!

/// Metres east (`x`) and north (`y`) of central Riga.
let geofenceRiga = LocalProjection(origin: Coordinate(lat: 56.95, lon: 24.10))

func geofencePoint(_ x: Double, _ y: Double = 0) -> Coordinate { geofenceRiga.unproject(x: x, y: y) }

func geofenceCircle(_ id: String, x: Double = 0, y: Double = 0, radiusM: Double = 100) -> Zone {
    Zone(id: id, shape: .circle(center: geofencePoint(x, y), radiusM: radiusM))
}

/// A square polygon of side `side` metres centred on (x, y).
func geofenceSquare(_ id: String, x: Double = 0, y: Double = 0, side: Double = 200) -> Zone {
    let h = side / 2
    return Zone(id: id, shape: .polygon([geofencePoint(x - h, y - h), geofencePoint(x + h, y - h), geofencePoint(x + h, y + h), geofencePoint(x - h, y + h)]))
}

func geofenceGate(
    zone: String = "gate", devices: [String]? = ["car"], on: Gate.Trigger = .enter, minSpeedMps: Double? = nil,
    motion: MotionSample.Activity? = nil, cooldownS: Double = 300, body: String = #"{"gate":"{{gate}}","device":"{{device}}","time":"{{time}}"}"#,
    headers: [String: String] = ["X-Api-Key": "key-123456"]
) -> Gate {
    Gate(
        id: "main-gate", zone: zone, devices: devices, on: on, minSpeedMps: minSpeedMps, motion: motion, cooldownS: cooldownS,
        webhook: Webhook(url: "http://gate-controller.lan/open", headers: headers, body: body, secret: "s3cret-hmac-key"))
}

/// Builds inputs with journal seqs counting up from 1, as ingest numbers them; each input is
/// handled at `now` = its time plus `lag`.
struct GeofenceFeed {
    var seq: UInt64 = 0
    var inputs: [(input: GeofenceInput, now: Date)] = []

    mutating func fix(_ t: Double, _ point: Coordinate, device: String = "car", accuracyM: Double? = nil, speedMps: Double? = nil, live: Bool = true, lag: Double = 1) {
        seq += 1
        let fix = Fix(seq: seq, device: device, time: geofenceT0 + t, lat: point.lat, lon: point.lon, accuracyM: accuracyM, speedMps: speedMps, source: .overland)
        inputs.append((.fix(fix, live: live), geofenceT0 + t + lag))
    }

    mutating func fix(_ t: Double, x: Double, y: Double = 0, device: String = "car", accuracyM: Double? = nil, speedMps: Double? = nil, live: Bool = true, lag: Double = 1) {
        fix(t, geofencePoint(x, y), device: device, accuracyM: accuracyM, speedMps: speedMps, live: live, lag: lag)
    }

    mutating func motion(_ t: Double, _ activity: MotionSample.Activity, device: String = "car") {
        seq += 1
        inputs.append((.motion(MotionSample(seq: seq, device: device, start: geofenceT0 + t, activity: activity, confidence: .high, source: .api)), geofenceT0 + t))
    }

    mutating func tick(_ t: Double) {
        inputs.append((.tick(now: geofenceT0 + t), geofenceT0 + t))
    }

    /// A drive along y = `y` from x = `from` to `to` at `speed` m/s, one fix a second.
    mutating func drive(from: Double, to: Double, start t: Double, speed: Double = 10, y: Double = 0, device: String = "car", reportSpeed: Bool = true, live: Bool = true, lag: Double = 1) -> Double {
        let steps = Int((abs(to - from) / speed).rounded())
        for step in 0...steps {
            let x = from + (to - from) * Double(step) / Double(max(steps, 1))
            fix(t + Double(step), x: x, y: y, device: device, speedMps: reportSpeed ? speed : nil, live: live, lag: lag)
        }
        return t + Double(steps)
    }
}

func geofenceRun(_ feed: GeofenceFeed, _ engine: inout GeofenceEngine) -> [GeofenceOutput] {
    feed.inputs.flatMap { engine.handle($0.input, now: $0.now) }
}

func geofenceRun(_ feed: GeofenceFeed, _ configuration: GeofenceConfiguration) -> [GeofenceOutput] {
    var engine = GeofenceEngine(configuration: configuration)
    return geofenceRun(feed, &engine)
}

func geofenceTransitions(_ outputs: [GeofenceOutput]) -> [GeofenceTransition] {
    outputs.compactMap { if case .transition(let t) = $0 { t } else { nil } }
}

func geofenceEvents(_ outputs: [GeofenceOutput]) -> [String] {
    geofenceTransitions(outputs).map { "\($0.event.rawValue) \($0.zone)" }
}

func geofenceCalls(_ outputs: [GeofenceOutput]) -> [GateCall] {
    outputs.compactMap { if case .gate(let call) = $0 { call } else { nil } }
}

func geofenceEncode(_ engine: GeofenceEngine) throws -> Data {
    let encoder = JSONEncoder()
    encoder.outputFormatting = .sortedKeys
    return try encoder.encode(engine)
}

func geofenceRestore(_ data: Data, _ configuration: GeofenceConfiguration) throws -> GeofenceEngine {
    let decoder = JSONDecoder()
    decoder.userInfo = CheckpointConfiguration.userInfo(configuration)
    return try decoder.decode(GeofenceEngine.self, from: data)
}

@Suite struct GeofenceZoneTests {
    @Test func circleAndPolygonContainment() {
        let configuration = GeofenceConfiguration(zones: [
            geofenceCircle("home", radiusM: 100),
            // A triangle, as in the issue's example, 2 km east.
            Zone(id: "parking", shape: .polygon([geofencePoint(2000, 0), geofencePoint(2300, 0), geofencePoint(2300, 300)])),
        ])
        var feed = GeofenceFeed()
        feed.fix(0, x: 300)  // outside both
        feed.fix(10, x: 90, y: 20)  // 92 m from home's centre
        feed.fix(20, x: 2250, y: 100)  // inside the triangle
        feed.fix(30, x: 2100, y: 250)  // the triangle's empty half: beyond the hysteresis
        #expect(geofenceEvents(geofenceRun(feed, configuration)) == ["enter home", "exit home", "enter parking", "exit parking"])
    }

    @Test func zonesAcrossTheAntimeridian() {
        // The square from the Geo tests, about 2.1 by 2.2 km, straddling 180° in Fiji.
        let square = Zone(id: "fiji", shape: .polygon([
            Coordinate(lat: -16.99, lon: 179.99), Coordinate(lat: -16.99, lon: -179.99),
            Coordinate(lat: -17.01, lon: -179.99), Coordinate(lat: -17.01, lon: 179.99),
        ]))
        let circle = Zone(id: "dateline", shape: .circle(center: Coordinate(lat: -16.9, lon: 179.9995), radiusM: 200))
        for lon in [180, -179.995, 179.995, -180] {
            var feed = GeofenceFeed()
            feed.fix(0, Coordinate(lat: -17, lon: lon))
            #expect(geofenceEvents(geofenceRun(feed, GeofenceConfiguration(zones: [square, circle]))) == ["enter fiji"], "lon \(lon)")
        }
        var feed = GeofenceFeed()
        feed.fix(0, Coordinate(lat: -17, lon: 179.98))  // 1 km west of the square
        feed.fix(10, Coordinate(lat: -16.9, lon: -179.9995))  // 106 m east of the circle's centre, across 180°
        feed.fix(20, Coordinate(lat: -16.9, lon: 179.9980))  // 160 m west of it
        feed.fix(30, Coordinate(lat: -16.9, lon: -179.996))  // 450 m east: out
        #expect(geofenceEvents(geofenceRun(feed, GeofenceConfiguration(zones: [square, circle]))) == ["enter dateline", "exit dateline"])
    }

    @Test func jitterAcrossTheBoundaryDoesNotFlap() {
        var feed = GeofenceFeed()
        feed.fix(0, x: 300)
        feed.fix(1, x: 95)  // seq 2: in
        // Ten minutes of GPS jitter across the edge (x = 100), up to 18 m outside.
        for second in 2...600 { feed.fix(Double(second), x: 82 + Double((second * 7) % 37)) }
        feed.fix(601, x: 119)  // within the hysteresis: still in
        feed.fix(602, x: 121)  // seq 603: more than 20 m outside, so out
        feed.fix(603, x: 110)  // outside, but not inside either: no enter
        feed.fix(604, x: 99)  // seq 605: in again
        let transitions = geofenceTransitions(geofenceRun(feed, GeofenceConfiguration(zones: [geofenceCircle("home")], minDwellS: 3600)))
        #expect(transitions.map { "\($0.event.rawValue) \($0.seq ?? 0)" } == ["enter 2", "exit 603", "enter 605"])
    }

    @Test func polygonHysteresisUsesTheDistanceToTheEdge() {
        var feed = GeofenceFeed()
        feed.fix(0, x: 0)
        // The square's east edge is at x = 100: jitter up to 19 m beyond it for five minutes.
        for second in 1...300 { feed.fix(Double(second), x: 100 + Double(second % 39) - 19) }
        feed.fix(301, x: 125)
        let events = geofenceEvents(geofenceRun(feed, GeofenceConfiguration(zones: [geofenceSquare("yard")], minDwellS: 3600)))
        #expect(events == ["enter yard", "exit yard"])
    }

    @Test func aFixLessAccurateThanTheZoneChangesNothing() {
        let configuration = GeofenceConfiguration(zones: [geofenceCircle("home", radiusM: 100), geofenceSquare("yard", x: 5000, side: 200)])
        var feed = GeofenceFeed()
        feed.fix(0, x: 0, accuracyM: 150)  // inside, but the fix could be anywhere in 150 m
        feed.fix(10, x: 0, accuracyM: 100)  // exactly the radius: counts
        feed.fix(20, x: 3000, accuracyM: 500)  // far out, but too vague to exit
        feed.fix(30, x: 3000, accuracyM: 20)
        feed.fix(40, x: 5000, accuracyM: 120)  // the square's inradius is 100 m
        feed.fix(50, x: 5000, accuracyM: 80)
        feed.fix(60, x: 5000, accuracyM: .nan)  // unknown accuracy is no reason to skip
        let events = geofenceTransitions(geofenceRun(feed, configuration)).map { "\($0.event.rawValue) \($0.zone) \($0.seq!)" }
        #expect(events == ["enter home 2", "exit home 4", "enter yard 6"])
    }

    @Test func dwellFiresOncePerVisitAtEntryPlusMinDwell() throws {
        let configuration = GeofenceConfiguration(zones: [geofenceCircle("home")], minDwellS: 300)
        var feed = GeofenceFeed()
        for step in 0...12 { feed.fix(Double(step) * 70, x: 10) }  // 0, 70, …, 840 s
        feed.fix(900, x: 500)
        feed.fix(1000, x: 0)
        feed.fix(1200, x: 0)
        feed.fix(1400, x: 0)
        let transitions = geofenceTransitions(geofenceRun(feed, configuration))
        #expect(transitions.map(\.event) == [.enter, .dwell, .exit, .enter, .dwell])
        let dwell = transitions[1]
        // Decided by the fix at 350 s; reported at 300 s with the fix at 280 s (seq 5).
        #expect(dwell.time == geofenceT0 + 300 && dwell.dwellS == 300 && dwell.seq == 5)
        #expect(transitions[4].time == geofenceT0 + 1300 && transitions[4].seq == 16)
        let json = String(decoding: try BusJSON.encode(dwell), as: UTF8.self)
        #expect(json.contains(#""dwell_s":300"#) && json.contains(#""event":"dwell""#))
        #expect(!String(decoding: try BusJSON.encode(transitions[0]), as: UTF8.self).contains("dwell_s"))
    }

    @Test func aSilentDeviceGetsTheSameDwellFromTheClock() throws {
        let configuration = GeofenceConfiguration(zones: [geofenceCircle("home")], minDwellS: 300)
        var silent = GeofenceFeed()
        silent.fix(0, x: 500)
        silent.fix(100, x: 0)
        silent.fix(160, x: 5)  // then nothing: the phone sleeps at home
        silent.tick(200)
        silent.tick(160 + 1 + 299)  // 299 s since the last fix was handled
        let before = geofenceRun(silent, configuration)
        #expect(geofenceEvents(before) == ["enter home"])
        silent.tick(160 + 1 + 300)
        silent.tick(2000)
        var engine = GeofenceEngine(configuration: configuration)
        let outputs = geofenceRun(silent, &engine)
        #expect(geofenceEvents(outputs) == ["enter home", "dwell home"])

        // A device that kept reporting gets its dwell from a fix instead: the same event.
        var reporting = GeofenceFeed()
        reporting.fix(0, x: 500)
        reporting.fix(100, x: 0)
        reporting.fix(160, x: 5)
        reporting.fix(450, x: 5)
        let fromFix = geofenceRun(reporting, configuration).filter { $0.type == "geofence.dwell" }
        let fromClock = outputs.filter { $0.type == "geofence.dwell" }
        #expect(fromFix == fromClock)
        #expect(fromClock.first?.eventID == "geofence.dwell:car:home:3")

        // A later fix does not repeat it.
        var later = GeofenceFeed()
        later.seq = 3
        later.fix(3000, x: 0)
        #expect(geofenceRun(later, &engine).isEmpty)
    }

    @Test func spatialIndexAgreesWithALinearScan() async {
        await offThePool {
            var random = SplitMix64(seed: 42)
            var zones: [Zone] = []
            for index in 0..<400 {
                // Clustered around Riga, plus some on the antimeridian and one very large circle.
                let nearDateline = index % 10 == 0
                let center = nearDateline
                    ? Coordinate(lat: random.next(in: -17.2 ... -16.8), lon: random.next(in: 179.8...180.2) > 180 ? random.next(in: -180 ... -179.8) : random.next(in: 179.8...180))
                    : geofencePoint(random.next(in: -20_000...20_000), random.next(in: -20_000...20_000))
                if index % 3 == 0 {
                    let projection = LocalProjection(origin: center)
                    let size = random.next(in: 50...800)
                    let vertices = (0..<Int(random.next(in: 3...9))).map { k -> Coordinate in
                        let angle = Double(k) / 9 * 2 * .pi + random.next(in: 0...0.5)
                        return projection.unproject(x: cos(angle) * size * random.next(in: 0.5...1), y: sin(angle) * size * random.next(in: 0.5...1))
                    }
                    zones.append(Zone(id: "p\(index)", shape: .polygon(vertices)))
                } else {
                    zones.append(Zone(id: "c\(index)", shape: .circle(center: center, radiusM: index == 1 ? 50_000 : random.next(in: 20...1500))))
                }
            }
            let boxes = zones.map { zone -> GeoBox in
                switch zone.shape {
                case .circle(let center, let radiusM): GeoBox(around: center, radiusM: radiusM)
                case .polygon(let vertices): GeoBox(around: GeoPolygon(vertices))
                }
            }
            let polygons = zones.map { zone -> GeoPolygon? in
                if case .polygon(let vertices) = zone.shape { GeoPolygon(vertices) } else { nil }
            }
            let index = ZoneIndex(boxes: boxes)
            var candidates: [Int32] = []
            for _ in 0..<5_000 {
                let point = random.next(in: 0...1) < 0.2
                    ? Coordinate(lat: random.next(in: -17.3 ... -16.7), lon: random.next(in: 0...1) < 0.5 ? random.next(in: 179.7...180) : random.next(in: -180 ... -179.7))
                    : geofencePoint(random.next(in: -22_000...22_000), random.next(in: -22_000...22_000))
                candidates.removeAll()
                index.candidates(at: point, into: &candidates)
                let linear = boxes.indices.filter { boxes[$0].contains(point) }
                #expect(candidates.map(Int.init).sorted() == linear)
                // The boxes really cover their zones.
                for zone in zones.indices where !candidates.contains(Int32(zone)) {
                    let inside = switch zones[zone].shape {
                    case .circle(let center, let radiusM): Geo.distance(center, point) <= radiusM
                    case .polygon: polygons[zone]!.contains(point)
                    }
                    #expect(!inside, "\(zones[zone].id) contains \(point) but its box does not")
                }
            }

            // The engine gives the same outputs either way, for several devices wandering about.
            let configuration = GeofenceConfiguration(zones: zones, minDwellS: 120)
            var indexed = GeofenceEngine(configuration: configuration)
            var linear = GeofenceEngine(configuration: configuration, spatialIndex: false)
            var positions = [(0.0, 0.0), (5000.0, 5000.0), (-8000.0, 3000.0)]
            var seq: UInt64 = 0
            var transitions = 0
            for second in 0..<3000 {
                for (device, position) in positions.enumerated() {
                    seq += 1
                    let moved = (position.0 + random.next(in: -150...150), position.1 + random.next(in: -150...150))
                    positions[device] = moved
                    let point = geofencePoint(moved.0, moved.1)
                    let fix = Fix(seq: seq, device: "d\(device)", time: geofenceT0 + Double(second * 10), lat: point.lat, lon: point.lon,
                                  accuracyM: random.next(in: 0...60), source: .api)
                    let a = indexed.handle(.fix(fix, live: true), now: fix.time)
                    let b = linear.handle(.fix(fix, live: true), now: fix.time)
                    #expect(a == b)
                    transitions += a.count
                }
            }
            #expect(transitions > 100)
        }
    }
}

@Suite struct GeofenceGateTests {
    let configuration = GeofenceConfiguration(zones: [geofenceCircle("gate", radiusM: 30)], gates: [geofenceGate(minSpeedMps: 2)])

    @Test func aDriveThroughOpensTheGateOnce() throws {
        var feed = GeofenceFeed()
        _ = feed.drive(from: -305, to: 295, start: 0)
        let outputs = geofenceRun(feed, configuration)
        #expect(outputs.map(\.type) == ["geofence.enter", "gate.call", "geofence.exit"])
        let calls = geofenceCalls(outputs)
        try #require(calls.count == 1)
        let call = calls[0]
        // x = -305 + 10 * 28 = -25: the first fix inside, seq 29.
        #expect(call.fixSeq == 29 && call.idempotencyKey == "main-gate:car:29" && outputs[1].eventID == "main-gate:car:29")
        #expect(call.body == #"{"gate":"main-gate","device":"car","time":"2026-11-21T18:00:28.000Z"}"#)
        #expect(call.method == "POST" && call.url == "http://gate-controller.lan/open")
        #expect(call.headers == ["X-Api-Key": "key-123456", "Content-Type": "application/json"])
        #expect(call.gate == "main-gate" && call.device == "car" && call.zone == "gate" && call.time == geofenceT0 + 28)
        #expect(outputs[0].eventID == "geofence.enter:car:gate:29")
        // The secret is the executable's business; header values stay out of descriptions.
        #expect(!"\(call)".contains("key-123456") && !String(reflecting: call).contains("key-123456"))
    }

    @Test func theSameFixNeverOpensTheGateTwice() {
        var feed = GeofenceFeed()
        _ = feed.drive(from: -105, to: -5, start: 0)
        var engine = GeofenceEngine(configuration: configuration)
        #expect(geofenceCalls(geofenceRun(feed, &engine)).count == 1)
        // The bus and a replay deliver the same fixes again: nothing.
        #expect(geofenceRun(feed, &engine).isEmpty)
        #expect(engine.lastSeq == feed.seq)
    }

    @Test func theCooldownSuppressesTheSecondPass() {
        var feed = GeofenceFeed()
        var t = feed.drive(from: -305, to: 295, start: 0)  // through, 60 s
        t = feed.drive(from: 295, to: -305, start: t + 60)  // back 2 minutes after the first call
        t = feed.drive(from: -305, to: 295, start: t + 200)  // once more, well after 300 s
        let outputs = geofenceRun(feed, configuration)
        #expect(geofenceEvents(outputs).filter { $0.hasPrefix("enter") }.count == 3)
        let calls = geofenceCalls(outputs)
        #expect(calls.count == 2)
        #expect(calls.count == 2 && calls[1].time.timeIntervalSince(calls[0].time) >= 300)
    }

    @Test func aFixDatedADayAheadDoesNotKeepTheGateShut() {
        // A phone sends a pass dated 22 hours ahead of the service's clock (ingest takes up to a
        // day ahead): it enters, and it opens the gate, as a live arrival does.
        var feed = GeofenceFeed()
        _ = feed.drive(from: -105, to: -5, start: 80_000, lag: -79_999)
        // Then correctly dated fixes: out of the zone and back in, ten minutes apart.
        let back = feed.drive(from: -5, to: 295, start: 60) + 600
        let end = feed.drive(from: 295, to: -5, start: back)
        let outputs = geofenceRun(feed, configuration)
        // They are not stragglers behind the wrong time, and its firing holds no cooldown.
        #expect(geofenceEvents(outputs) == ["enter gate", "exit gate", "enter gate"])
        let times = geofenceCalls(outputs).map(\.time)
        #expect(times.count == 2)
        #expect(times.first.map { $0 > geofenceT0 + 80_000 && $0 <= geofenceT0 + 80_010 } == true)
        #expect(times.last.map { $0 > geofenceT0 + back && $0 <= geofenceT0 + end } == true)
    }

    @Test func aPhoneWhoseClockIsAlwaysAheadKeepsItsCooldownAndItsStragglers() {
        // Every fix two hours ahead (local time sent as UTC): through the zone twice within the
        // cooldown opens the gate once, and a straggler is dropped as before.
        var feed = GeofenceFeed()
        var t = feed.drive(from: -305, to: 295, start: 7200, lag: -7199)
        t = feed.drive(from: 295, to: -305, start: t + 30, lag: -7199)
        feed.fix(7200 + 5, x: 0, lag: -7199)  // a straggler from the first pass
        let outputs = geofenceRun(feed, configuration)
        #expect(geofenceEvents(outputs) == ["enter gate", "exit gate", "enter gate", "exit gate"])
        #expect(geofenceCalls(outputs).count == 1)
    }

    @Test func replayedAndStalePassesChangeStateButCallNobody() {
        var replayed = GeofenceFeed()
        _ = replayed.drive(from: -105, to: -5, start: 0, live: false)
        replayed.fix(20, x: 0)  // live, but already inside: no enter, so no call
        var engine = GeofenceEngine(configuration: configuration)
        let outputs = geofenceRun(replayed, &engine)
        #expect(geofenceEvents(outputs) == ["enter gate"] && geofenceCalls(outputs).isEmpty)

        var stale = GeofenceFeed()
        _ = stale.drive(from: -105, to: 95, start: 0, lag: 121)  // a late batch: 121 s old
        _ = stale.drive(from: 95, to: -105, start: 400, lag: 120)  // exactly max_age_s: still fires
        let staleOutputs = geofenceRun(stale, configuration)
        #expect(geofenceEvents(staleOutputs) == ["enter gate", "exit gate", "enter gate", "exit gate"])
        #expect(geofenceCalls(staleOutputs).map(\.time) == [geofenceT0 + 400 + 7])
    }

    @Test func crossingsAtImportedFixesSaySo() throws {
        // An imported visit: enter, and a dwell the clock decides (its anchor an imported fix);
        // then a live fix outside: its exit is live. Then an imported pass whose dwell a later
        // imported fix decides.
        var feed = GeofenceFeed()
        let t = feed.drive(from: -205, to: -5, start: 0, live: false)
        feed.tick(t + 400)
        feed.fix(t + 500, x: 300)
        _ = feed.drive(from: 300, to: 0, start: t + 600, live: false)
        feed.fix(t + 1000, x: 0, live: false)
        let transitions = geofenceTransitions(geofenceRun(feed, GeofenceConfiguration(zones: [geofenceCircle("home")], minDwellS: 300)))
        #expect(transitions.map { "\($0.event.rawValue) \($0.imported.map(String.init) ?? "live")" } == [
            "enter true", "dwell true", "exit live", "enter true", "dwell true",
        ])
        let exit = transitions[2]
        #expect(!String(decoding: try BusJSON.encode(exit), as: UTF8.self).contains("imported"))
        #expect(String(decoding: try BusJSON.encode(transitions[0]), as: UTF8.self).contains(#""imported":true"#))
    }

    @Test func minimumSpeedUsesTheReportedOrTheDerivedSpeed() {
        var walk = GeofenceFeed()
        _ = walk.drive(from: -50, to: 0, start: 0, speed: 1)  // walking through the zone
        #expect(geofenceCalls(geofenceRun(walk, configuration)).isEmpty)

        var unreported = GeofenceFeed()
        _ = unreported.drive(from: -100, to: 0, start: 0, speed: 10, reportSpeed: false)
        let calls = geofenceCalls(geofenceRun(unreported, GeofenceConfiguration(
            zones: configuration.zones, gates: [geofenceGate(minSpeedMps: 2, body: "speed={{speed_mps}}")])))
        #expect(calls.map(\.body) == ["speed=10"])

        var slowUnreported = GeofenceFeed()
        _ = slowUnreported.drive(from: -50, to: 0, start: 0, speed: 1.5, reportSpeed: false)
        #expect(geofenceCalls(geofenceRun(slowUnreported, configuration)).isEmpty)

        var first = GeofenceFeed()  // the first fix of a device is inside: no speed to go by
        first.fix(0, x: 0)
        #expect(geofenceCalls(geofenceRun(first, configuration)).isEmpty)
    }

    @Test func motionMustBeAutomotiveWhenRequired() {
        let configuration = GeofenceConfiguration(zones: self.configuration.zones, gates: [geofenceGate(motion: .automotive)])
        var walking = GeofenceFeed()
        walking.motion(-600, .automotive)
        walking.motion(-10, .walking)
        walking.motion(50, .automotive)  // starts after the enter: not in effect then
        _ = walking.drive(from: -100, to: 0, start: 0)
        #expect(geofenceCalls(geofenceRun(walking, configuration)).isEmpty)

        var driving = GeofenceFeed()
        driving.motion(-600, .walking)
        driving.motion(-60, .automotive)
        _ = driving.drive(from: -100, to: 0, start: 0)
        #expect(geofenceCalls(geofenceRun(driving, configuration)).count == 1)
    }

    @Test func onlyTheListedDevicesAndTheConfiguredEvent() {
        var feed = GeofenceFeed()
        _ = feed.drive(from: -305, to: 295, start: 0, device: "bike")
        _ = feed.drive(from: -305, to: 295, start: 0, y: 500, device: "car")  // passes beside the zone
        #expect(geofenceCalls(geofenceRun(feed, configuration)).isEmpty)

        var exit = GeofenceFeed()
        _ = exit.drive(from: 5, to: 305, start: 0, device: "van")
        let onExit = GeofenceConfiguration(zones: configuration.zones, gates: [geofenceGate(devices: nil, on: .exit)])
        let outputs = geofenceRun(exit, onExit)
        #expect(outputs.map(\.type) == ["geofence.enter", "geofence.exit", "gate.call"])
        #expect(geofenceCalls(outputs).first?.fixSeq == 6)  // x = 50: more than 30 + 20 m out
    }

    @Test func templateValuesAreEscapedForTheirContext() throws {
        // Ids are validated in practice; the engine escapes whatever it is given.
        let zone = Zone(id: "a\"b\\c\nd", shape: .circle(center: geofencePoint(0), radiusM: 30))
        let json = Gate(
            id: "g1", zone: zone.id, webhook: Webhook(
                url: "http://gate.lan/open?zone={{zone}}&lat={{lat}}",
                body: #"{"zone":"{{zone}}","lat":{{lat}},"lon":{{lon}},"speed":{{speed_mps}},"x":"{{unknown}}"}"#))
        let form = Gate(
            id: "g2", zone: zone.id, webhook: Webhook(
                url: "https://gate.lan/open", headers: ["content-type": "application/x-www-form-urlencoded"],
                body: "zone={{ zone }}&time={{time}}"))
        let get = Gate(id: "g3", zone: zone.id, webhook: Webhook(url: "http://gate.lan/open", method: "get"))
        var feed = GeofenceFeed()
        feed.fix(0, x: 0)
        let calls = geofenceCalls(geofenceRun(feed, GeofenceConfiguration(zones: [zone], gates: [json, form, get])))
        try #require(calls.count == 3)
        let object = try #require(try JSONSerialization.jsonObject(with: Data(calls[0].body.utf8)) as? [String: Any])
        #expect(object["zone"] as? String == zone.id)
        #expect(object["lat"] as? Double == geofencePoint(0).lat && object["speed"] is NSNull && object["x"] as? String == "{{unknown}}")
        #expect(calls[0].url == "http://gate.lan/open?zone=a%22b%5Cc%0Ad&lat=\(geofencePoint(0).lat)")
        #expect(calls[1].body == "zone=a%22b%5Cc%0Ad&time=2026-11-21T18%3A00%3A00.000Z")
        #expect(calls[1].headers == ["content-type": "application/x-www-form-urlencoded"])
        #expect(calls[2].method == "GET" && calls[2].body.isEmpty && calls[2].headers.isEmpty)
    }
}

@Suite struct GeofenceCheckpointTests {
    static let configuration = GeofenceConfiguration(
        zones: [geofenceCircle("gate", radiusM: 30), geofenceCircle("home", x: 2000, radiusM: 150), geofenceSquare("yard", x: -3000)],
        gates: [geofenceGate(minSpeedMps: 2, motion: .automotive), geofenceGate(zone: "home", devices: nil, on: .exit)].enumerated().map { index, gate in
            var gate = gate
            gate.id = "gate\(index)"
            return gate
        },
        minDwellS: 120)

    static func script() -> GeofenceFeed {
        var feed = GeofenceFeed()
        feed.motion(-100, .automotive)
        var t = feed.drive(from: -500, to: 2000, start: 0)
        for step in 1...20 { feed.fix(t + Double(step) * 30, x: 2000 + Double(step % 5), accuracyM: step == 7 ? 400 : 5) }
        t += 700
        feed.tick(t)
        t = feed.drive(from: 2000, to: -3000, start: t + 10, speed: 20, device: "car")
        _ = feed.drive(from: 0, to: -3000, start: 100, speed: 15, device: "van", live: false)
        feed.fix(t + 5, x: -3000)  // back to the yard, then silent
        feed.tick(t + 5 + 1 + 120)
        t = feed.drive(from: -3000, to: 100, start: t + 400, speed: 25)
        _ = feed.drive(from: 100, to: -100, start: t + 10)  // inside the gate's cooldown
        return feed
    }

    @Test func aRestoredEngineContinuesExactlyLikeAnUninterruptedOne() async throws {
        try await offThePool {
            let feed = Self.script()
            var uninterrupted = GeofenceEngine(configuration: Self.configuration)
            let expected = feed.inputs.map { uninterrupted.handle($0.input, now: $0.now) }
            #expect(expected.joined().count > 10)
            #expect(geofenceCalls(Array(expected.joined())).count == 4)
            let finalState = try geofenceEncode(uninterrupted)
            for split in stride(from: 0, through: feed.inputs.count, by: 7) {
                var engine = GeofenceEngine(configuration: Self.configuration)
                var outputs = feed.inputs[..<split].map { engine.handle($0.input, now: $0.now) }
                engine = try geofenceRestore(try geofenceEncode(engine), Self.configuration)
                outputs += feed.inputs[split...].map { engine.handle($0.input, now: $0.now) }
                #expect(outputs == expected, "restored after \(split) inputs")
                #expect(try geofenceEncode(engine) == finalState)
            }
        }
    }

    @Test func aCheckpointNeedsTheConfigurationAndDropsWhatIsGone() throws {
        var feed = GeofenceFeed()
        feed.fix(0, x: 2000)
        feed.fix(10, x: -3000, device: "van")
        var engine = GeofenceEngine(configuration: Self.configuration)
        _ = geofenceRun(feed, &engine)
        let data = try geofenceEncode(engine)
        #expect(throws: DecodingError.self) { try JSONDecoder().decode(GeofenceEngine.self, from: data) }
        // The checkpoint holds no part of the configuration, so no secret.
        #expect(!String(decoding: data, as: UTF8.self).contains("s3cret") && !String(decoding: data, as: UTF8.self).contains("key-123456"))

        var smaller = Self.configuration
        smaller.zones.removeAll { $0.id == "home" }
        smaller.gates.removeAll { $0.zone == "home" }
        var restored = try geofenceRestore(data, smaller)
        #expect(restored.lastSeq == 2)
        var next = GeofenceFeed()
        next.seq = 2
        next.fix(20, x: 9000)
        next.fix(30, x: 9000, device: "van")
        #expect(geofenceEvents(geofenceRun(next, &restored)) == ["exit yard"])
    }
}

@Suite struct GeofenceConfigurationTests {
    @Test func decodesTheYAMLShapesWithDefaults() throws {
        let json = #"""
        {"zones": [{"id": "home", "circle": {"lat": 56.95, "lon": 24.10, "radius_m": 100}},
                   {"id": "parking", "polygon": [[56.90, 24.00], [56.91, 24.00], [56.91, 24.02]], "speed_limit_kmh": 20}],
         "gates": [{"id": "main-gate", "zone": "home", "devices": ["car"], "min_speed_mps": 2, "motion": "automotive",
                    "webhook": {"url": "http://gate-controller.lan/open", "headers": {"X-Api-Key": "k"}, "secret": "s"}}],
         "min_dwell_s": 600}
        """#
        let configuration = try JSONDecoder().decode(GeofenceConfiguration.self, from: Data(json.utf8))
        #expect(configuration.hysteresisM == 20 && configuration.minDwellS == 600)
        #expect(configuration.zones[0].shape == .circle(center: Coordinate(lat: 56.95, lon: 24.10), radiusM: 100))
        #expect(configuration.zones[1].speedLimitKmh == 20)
        let gate = configuration.gates[0]
        #expect(gate.on == .enter && gate.cooldownS == 300 && gate.maxAgeS == 120 && gate.motion == .automotive)
        #expect(gate.webhook.method == "POST" && gate.webhook.timeoutS == 5 && gate.webhook.retries == 100 && gate.webhook.body == Webhook.defaultBody)
        try configuration.validate()
        let again = try JSONDecoder().decode(GeofenceConfiguration.self, from: try JSONEncoder().encode(configuration))
        #expect(again == configuration)
    }

    @Test func secretsStayOutOfDescriptions() {
        let gate = geofenceGate()
        let configuration = GeofenceConfiguration(zones: [geofenceCircle("gate")], gates: [gate])
        var dumped = ""
        dump(configuration, to: &dumped)
        for text in [String(describing: gate.webhook), String(reflecting: gate.webhook), String(describing: gate), String(reflecting: configuration), dumped] {
            #expect(!text.contains("s3cret-hmac-key") && !text.contains("key-123456"), "\(text)")
        }
        #expect(String(describing: gate.webhook).contains("http://gate-controller.lan/…"))
    }

    @Test(arguments: [
        (GeofenceConfiguration(zones: [geofenceCircle("home"), geofenceCircle("home")]), "zones[1].id"),
        (GeofenceConfiguration(zones: [geofenceCircle("a b")]), "zones[0].id"),
        (GeofenceConfiguration(zones: [geofenceCircle("home", radiusM: 0)]), "zones[0].circle.radius_m"),
        (GeofenceConfiguration(zones: [Zone(id: "p", shape: .polygon([geofencePoint(0), geofencePoint(10)]))]), "zones[0].polygon"),
        (GeofenceConfiguration(zones: [Zone(id: "p", shape: .polygon([geofencePoint(0), geofencePoint(10), geofencePoint(20)]))]), "zones[0].polygon"),
        (GeofenceConfiguration(zones: [Zone(id: "p", shape: .polygon([geofencePoint(0), Coordinate(lat: 91, lon: 0), geofencePoint(20)]))]), "zones[0].polygon[1]"),
        (GeofenceConfiguration(hysteresisM: -1), "geofence.hysteresis_m"),
        (GeofenceConfiguration(minDwellS: .nan), "geofence.min_dwell_s"),
        (GeofenceConfiguration(zones: [geofenceCircle("gate")], gates: [geofenceGate(zone: "nowhere")]), "gates[0].zone"),
        (GeofenceConfiguration(zones: [geofenceCircle("gate")], gates: [geofenceGate(devices: [])]), "gates[0].devices"),
        (GeofenceConfiguration(zones: [geofenceCircle("gate")], gates: [geofenceGate(cooldownS: -5)]), "gates[0].cooldown_s"),
        (GeofenceConfiguration(zones: [geofenceCircle("gate")], gates: [geofenceGate(body: "{{plate}}")]), "gates[0].webhook.body"),
        (GeofenceConfiguration(zones: [geofenceCircle("gate")], gates: [geofenceGate(headers: ["X-Key": "a\r\nInjected: 1"])]), "gates[0].webhook.headers"),
        (GeofenceConfiguration(zones: [geofenceCircle("gate")], gates: [geofenceGate(headers: ["Idempotency-Key": "x"])]), "gates[0].webhook.headers"),
    ])
    func refusesWithTheKeyPath(_ configuration: GeofenceConfiguration, _ path: String) {
        #expect(throws: GeofenceConfigurationError.self) { try configuration.validate() }
        do {
            try configuration.validate()
        } catch {
            #expect(error.path == path, "\(error)")
            #expect(!error.description.contains("a\r\nInjected"))
        }
    }

    @Test func refusesBadWebhookURLsWithoutEchoingThem() {
        var gate = geofenceGate()
        gate.webhook.url = "ftp://secret-token@host/x"
        do {
            try GeofenceConfiguration(zones: [geofenceCircle("gate")], gates: [gate]).validate()
            Issue.record("accepted an ftp URL")
        } catch {
            #expect(error.path == "gates[0].webhook.url" && !error.description.contains("secret-token"))
        }
    }

    @Test func nothingCrashesTheEngine() {
        // None of this passes validation; the engine must survive it anyway.
        let configuration = GeofenceConfiguration(
            zones: [
                Zone(id: "two", shape: .polygon([geofencePoint(0), geofencePoint(10)])),
                Zone(id: "nan", shape: .circle(center: Coordinate(lat: .nan, lon: 0), radiusM: 100)),
                Zone(id: "negative", shape: .circle(center: geofencePoint(0), radiusM: -5)),
                Zone(id: "pole", shape: .circle(center: Coordinate(lat: 90, lon: 0), radiusM: 1e9)),
                Zone(id: "ok", shape: .circle(center: geofencePoint(0), radiusM: 50)),
            ],
            gates: [geofenceGate(zone: "missing"), geofenceGate(zone: "ok", cooldownS: .nan)],
            hysteresisM: .nan, minDwellS: -.infinity)
        var engine = GeofenceEngine(configuration: configuration)
        let now = geofenceT0
        let points: [(Double, Double)] = [(.nan, 0), (0, .infinity), (91, 0), (0, 181), (90, 0), (-90, 180), (56.95, 24.10), (0, 0)]
        var seq: UInt64 = 0
        for (lat, lon) in points {
            for time in [geofenceT0, Date(timeIntervalSince1970: 1e300), Date(timeIntervalSince1970: -.infinity)] {
                for accuracy in [nil, -1, .nan, .infinity, 1e308] as [Double?] {
                    seq += 1
                    let fix = Fix(seq: seq, device: "car", time: time, lat: lat, lon: lon, accuracyM: accuracy, speedMps: .nan, source: .api)
                    _ = engine.handle(.fix(fix, live: true), now: now)
                    _ = engine.handle(.fix(Fix(device: "", time: time, lat: lat, lon: lon, source: .api), live: true), now: Date(timeIntervalSince1970: .nan))
                }
            }
        }
        _ = engine.handle(.motion(MotionSample(device: "car", start: Date(timeIntervalSince1970: .infinity), activity: .automotive, confidence: .low, source: .api)), now: now)
        _ = engine.handle(.tick(now: Date(timeIntervalSince1970: .nan)), now: now)
        _ = engine.handle(.tick(now: now + 1e6), now: now)
        #expect(engine.lastSeq == seq)
    }
}

