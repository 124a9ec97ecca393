import ArgumentParser
import DrivebusKit
import DrivebusTestbed
import Foundation
import ScorerCore

/// `drivebus-bench scorer`: the scorer core alone on one thread, no bus. Synthetic 1 Hz drives
/// for several devices interleaved by seq (noisy speed, gentle and harsh phases, turns, a speed
/// limit and a zone, a trip every five minutes), fed through fresh scorers pass after pass.
/// Prints fixes/s with reported speed and course, from positions alone, and the ratio to decoding
/// the same fixes' JSON measured in the same run.
struct ScorerBench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "scorer", abstract: "Measure the scorer core in fixes per second.")

    @Option(help: "Fixes per pass.")
    var fixes = 250_000

    @Option(help: "Passes, each through a fresh scorer.")
    var passes = 8

    @Option(help: "Devices, interleaved.")
    var devices = 8

    func run() throws {
        var configuration = ScorerConfiguration()
        configuration.speedLimitKmh = 50
        configuration.zoneSpeedLimits = [
            Zone(id: "school", shape: .circle(center: Coordinate(lat: 48.2, lon: 16.37), radiusM: 500), speedLimitKmh: 30),
        ]
        let reported = Self.inputs(fixes: fixes, devices: max(devices, 1), reportMotion: true)
        let positions = Self.inputs(fixes: fixes, devices: max(devices, 1), reportMotion: false)

        func measure(_ inputs: [ScorerInput]) -> (fixesPerS: Double, events: Int, scored: Int) {
            var events = 0, scored = 0
            var elapsed = Duration.zero
            for _ in 0..<max(passes, 1) {
                var scorer = DriveScorer(configuration: configuration)
                let started = ContinuousClock.now
                for input in inputs {
                    for output in scorer.handle(input) {
                        if case .event = output { events += 1 } else { scored += 1 }
                    }
                }
                elapsed += started.duration(to: .now)
            }
            let passes = max(passes, 1)
            return (Double(fixes * passes) / seconds(elapsed), events / passes, scored / passes)
        }
        let withMotion = measure(reported)
        let fromPositions = measure(positions)

        // The same fixes as bus JSON, decoded: the work every subscriber does anyway.
        let sample = reported.prefix(100_000).compactMap { input -> [UInt8]? in
            if case .fix(let fix) = input { try? BusJSON.encode(fix) } else { nil }
        }
        let started = ContinuousClock.now
        var decoded = 0
        for json in sample where (try? BusJSON.decode(Fix.self, from: json)) != nil { decoded += 1 }
        let decodePerS = Double(decoded) / seconds(started.duration(to: .now))

        report([
            "name": "scorer",
            "fixes_per_s": Int(withMotion.fixesPerS),
            "positions_only_fixes_per_s": Int(fromPositions.fixesPerS),
            "decode_fix_per_s": Int(decodePerS),
            "vs_decode": (withMotion.fixesPerS / decodePerS * 100).rounded() / 100,
            "fixes": fixes * max(passes, 1),
            "devices": max(devices, 1),
            "events_per_pass": withMotion.events,
            "scored_per_pass": withMotion.scored,
        ])
    }

    /// `fixes` fixes over `devices` devices, one per device per second, in seq order, with
    /// `trip.started` / `trip.ended` every 300 s per device.
    static func inputs(fixes: Int, devices: Int, reportMotion: Bool) -> [ScorerInput] {
        var random = SplitMix64(seed: 0x5EED)
        func uniform(_ amplitude: Double) -> Double { random.uniform(amplitude) }
        struct Car {
            var x = 0.0, y = 0.0, heading = 0.0, speed = 0.0
            var tripFirstSeq: UInt64 = 0
            var tripStart = Date()
        }
        let projection = LocalProjection(origin: Coordinate(lat: 48.2, lon: 16.37))
        let start = Date(timeIntervalSince1970: 1_763_700_000)
        let names = (0..<devices).map { "car\($0)" }
        var cars = (0..<devices).map { index in Car(x: Double(index) * 50, heading: Double(index) * 40) }
        var inputs: [ScorerInput] = []
        inputs.reserveCapacity(fixes + fixes / 100)
        var seq: UInt64 = 0
        var second = 0
        while seq < UInt64(fixes) {
            let phase = second % 300
            // Accelerate, cruise with a turn, a harsh brake every other trip, stop.
            let (accel, yaw): (Double, Double) = switch phase {
            case 0..<20: (0, 0)
            case 20..<30: (1.5, 0)
            case 30..<40: (0.3, 0)
            case 100..<110: (0, 9)
            case 200..<204 where second / 300 % 2 == 0: (-4.2, 0)
            case 260..<280: (-1, 0)
            default: (0, 0)
            }
            let time = start.addingTimeInterval(Double(second))
            for index in 0..<devices where seq < UInt64(fixes) {
                var car = cars[index]
                car.speed = max(0, min(car.speed + accel, 30))
                car.heading += yaw
                let radians = car.heading * .pi / 180
                car.x += car.speed * sin(radians)
                car.y += car.speed * cos(radians)
                seq += 1
                let position = projection.unproject(x: car.x, y: car.y)
                var course = car.heading.truncatingRemainder(dividingBy: 360)
                if course < 0 { course += 360 }
                let fix = Fix(
                    seq: seq, device: names[index], time: time, lat: position.lat, lon: position.lon, accuracyM: 5,
                    speedMps: reportMotion ? max(0, car.speed + uniform(0.5)) : nil,
                    courseDeg: reportMotion && car.speed > 1 ? course : nil, source: .overland)
                if phase == 20 {
                    car.tripFirstSeq = seq
                    car.tripStart = time
                }
                inputs.append(.fix(fix))
                let trip = ScorerTrip(tripID: "\(names[index])-\(car.tripFirstSeq)", device: names[index], startTime: car.tripStart, firstSeq: car.tripFirstSeq)
                if phase == 50 { inputs.append(.tripStarted(trip)) }
                if phase == 299 {
                    var ended = trip
                    ended.endTime = time
                    ended.lastSeq = seq
                    inputs.append(.tripEnded(ended))
                }
                cars[index] = car
            }
            second += 1
        }
        return inputs
    }
}
