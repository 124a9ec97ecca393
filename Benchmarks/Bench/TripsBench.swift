import ArgumentParser
import DrivebusKit
import DrivebusTestbed
import Foundation
import TripsCore

/// `drivebus-bench trips`: segmentation throughput in the core, and Douglas-Peucker on one
/// user's whole drive history.
struct TripsBench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "trips", abstract: "Measure trip segmentation and track simplification.")

    @Option(help: "Days of synthetic data per device.")
    var days = 30

    @Option(help: "Devices, interleaved in batches as the journal would hold them.")
    var devices = 4

    @Option(help: "Points in the Douglas-Peucker case.")
    var points = 480_000

    @Option(help: "Douglas-Peucker tolerance, in metres.")
    var epsilon = 5.0

    func run() throws {
        let fixes = TripsBenchData.stream(days: days, devices: devices)
        // One warm-up pass, then the measured one, each on a fresh segmenter.
        var best = Double.infinity
        var trips = 0
        for _ in 0..<2 {
            var segmenter = TripSegmenter(configuration: TripsConfiguration())
            var ended = 0
            let started = ContinuousClock.now
            for fix in fixes {
                for output in segmenter.handle(.fix(fix)) {
                    if case .ended = output { ended += 1 }
                }
            }
            best = min(best, seconds(started.duration(to: .now)))
            trips = ended
        }
        report([
            "name": "trips segment", "fixes": fixes.count, "devices": devices, "days": days, "trips": trips,
            "fixes_per_s": Int(Double(fixes.count) / best),
        ])

        let history = TripsBenchData.history(points: points)
        var kept = 0
        var bestMs = Double.infinity
        for _ in 0..<3 {
            let started = ContinuousClock.now
            kept = DouglasPeucker.simplify(history, epsilonM: epsilon).count
            bestMs = min(bestMs, seconds(started.duration(to: .now)) * 1000)
        }
        report([
            "name": "trips douglas-peucker", "points": history.count, "ms": (bestMs * 10).rounded() / 10, "kept": kept,
            "epsilon_m": epsilon,
        ])
    }
}

/// Synthetic but plausible data: each device parks at home overnight and at work by day, with a
/// parked phone's scatter, and drives between them at 1 Hz with turns and red lights.
enum TripsBenchData {
    /// One device's days as positions in metres around home, with times in seconds.
    struct Walker {
        var random: SplitMix64
        var x = 0.0, y = 0.0, t = 0.0
        var out: [(x: Double, y: Double, t: Double)] = []

        mutating func park(_ duration: Double, every: Double) {
            let end = t + duration
            while t + every < end {
                t += every
                out.append((x + 8 * random.signed(), y + 8 * random.signed(), t))
            }
            t = end
        }

        /// Drives to (tx, ty) at 1 Hz, weaving, with a stop every few minutes.
        mutating func drive(toX tx: Double, y ty: Double) {
            var speed = 0.0
            var sinceStop = 0.0
            while true {
                let dx = tx - x, dy = ty - y
                let remaining = (dx * dx + dy * dy).squareRoot()
                if remaining < 20 { break }
                let heading = atan2(dy, dx) + 0.6 * sin(t / 40)
                speed = min(speed + 2, 8 + 20 * random.unit())
                sinceStop += 1
                if sinceStop > 120 + 200 * random.unit() {
                    // A red light: 30 to 90 s at rest.
                    let wait = 30 + 60 * random.unit()
                    park(wait, every: 1)
                    speed = 0
                    sinceStop = 0
                    continue
                }
                let step = min(speed, remaining)
                x += step * cos(heading)
                y += step * sin(heading)
                t += 1
                out.append((x, y, t))
            }
        }
    }

    static func stream(days: Int, devices: Int) -> [Fix] {
        var perDevice: [[Fix]] = []
        let start = Date(timeIntervalSince1970: 1_763_700_000)
        for device in 0..<devices {
            let name = "car\(device)"
            var walker = Walker(random: SplitMix64(seed: UInt64(device + 1)))
            let projection = LocalProjection(origin: Coordinate(lat: 48.2 + 0.05 * Double(device), lon: 16.37))
            for day in 0..<days {
                let workX = 9000 + 2000 * walker.random.signed(), workY = 6000 + 2000 * walker.random.signed()
                walker.t = Double(day) * 86_400
                walker.park(7.5 * 3600, every: 30)
                walker.drive(toX: workX, y: workY)
                walker.park(8 * 3600, every: 30)
                walker.drive(toX: 1500, y: -2500)  // shopping
                walker.park(40 * 60, every: 10)
                walker.drive(toX: 0, y: 0)
                walker.park(max(0, Double(day + 1) * 86_400 - walker.t), every: 60)
            }
            perDevice.append(walker.out.map { point in
                let position = projection.unproject(x: point.x, y: point.y)
                return Fix(device: name, time: start.addingTimeInterval(point.t), lat: position.lat, lon: position.lon, accuracyM: 8, source: .overland)
            })
        }
        // Interleave in batches of 50 by time, the way several phones' uploads land in the journal.
        var merged: [Fix] = []
        merged.reserveCapacity(perDevice.reduce(0) { $0 + $1.count })
        var cursors = Array(repeating: 0, count: perDevice.count)
        while true {
            var next: Int?
            for device in perDevice.indices where cursors[device] < perDevice[device].count {
                if let best = next, perDevice[best][cursors[best]].time <= perDevice[device][cursors[device]].time { continue }
                next = device
            }
            guard let device = next else { break }
            let end = min(cursors[device] + 50, perDevice[device].count)
            for index in cursors[device]..<end {
                var fix = perDevice[device][index]
                fix.seq = UInt64(merged.count + 1)
                merged.append(fix)
            }
            cursors[device] = end
        }
        return merged
    }

    /// A history of drives from and back to home, end to end, as one polyline.
    static func history(points: Int) -> [Coordinate] {
        var walker = Walker(random: SplitMix64(seed: 99))
        while walker.out.count < points {
            let x = 30_000 * walker.random.signed(), y = 30_000 * walker.random.signed()
            walker.drive(toX: x, y: y)
        }
        let projection = LocalProjection(origin: Coordinate(lat: 48.2, lon: 16.37))
        return walker.out.prefix(points).map { projection.unproject(x: $0.x, y: $0.y) }
    }
}
