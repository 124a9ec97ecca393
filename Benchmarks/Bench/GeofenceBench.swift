import ArgumentParser
import DrivebusGeo
import DrivebusKit
import DrivebusSchema
import DrivebusTestbed
import DrivebusTestSupport
import Foundation
@_spi(Testing) import GeofenceCore
import Synchronization

/// `drivebus-bench geofence`: fixes per second through the geofence core with 1,000 zones (circles
/// and polygons scattered over a city), using the spatial index, then scanning every zone, in the
/// same run, on one thread.
struct GeofenceBench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "geofence", abstract: "Measure the geofence core, indexed and linear.")

    @Option(help: "Zones.")
    var zones = 1000

    @Option(help: "Fixes per pass through the indexed engine (the linear scan gets 1 %).")
    var fixes = 400_000

    @Option(help: "Passes; the fastest is reported.")
    var passes = 3

    @Option(help: "Gate openings timed end to end (0 to skip).")
    var openings = 200

    func run() async throws {
        var random = SplitMix64(seed: 7)
        let configuration = Self.city(zones: zones, random: &random)
        let track = Self.track(fixes: max(1000, fixes), random: &random)

        func measure(_ inputs: ArraySlice<(GeofenceInput, Date)>, spatialIndex: Bool) -> (rate: Double, outputs: Int) {
            var best = 0.0
            var outputs = 0
            for _ in 0..<max(1, passes) {
                var engine = GeofenceEngine(configuration: configuration, spatialIndex: spatialIndex)
                outputs = 0
                let started = ContinuousClock.now
                for (input, now) in inputs { outputs += engine.handle(input, now: now).count }
                best = max(best, Double(inputs.count) / seconds(started.duration(to: .now)))
            }
            return (best, outputs)
        }

        let indexed = measure(track[...], spatialIndex: true)
        let linear = measure(track.prefix(max(1000, track.count / 100)), spatialIndex: false)
        report(["name": "geofence zones", "zones": zones, "fixes_per_s": Int(indexed.rate), "outputs": indexed.outputs])
        report(["name": "geofence zones linear", "zones": zones, "fixes_per_s": Int(linear.rate)])
        report(["name": "geofence zones index speedup", "zones": zones, "ratio": (indexed.rate / linear.rate * 10).rounded() / 10])
        if openings > 0 { try await gateLatency() }
    }

    /// From the POST of the fix that enters the gate zone to the webhook's arrival at a local
    /// receiver, through the real ingest, bus and geofence (release builds).
    private func gateLatency() async throws {
        let receiver = try WebhookReceiver()
        let token = "bench-token-0123456789"
        let system = try await BenchSystem(services: [.bus, .ingest, .geofence], extraConfig: """
            devices: [{id: car, token: \(token)}]
            zones: [{id: gate, circle: {lat: 48.2, lon: 16.37, radius_m: 40}}]
            gates: [{id: g, zone: gate, cooldown_s: 0, max_age_s: 60, webhook: {url: "http://127.0.0.1:\(receiver.port)/open", retries: 0}}]
            """)
        defer { system.stop() }
        let connection = try HTTPConnection(port: system.port)
        let headers = [("Authorization", "Bearer \(token)"), ("Content-Type", "application/json")]
        func post(lat: Double) throws {
            let body = #"{"fixes":[{"time":"\#(RFC3339.format(Date()))","lat":\#(lat),"lon":16.37}]}"#
            guard try connection.send(method: "POST", path: "/api/v1/fixes", headers: headers, body: Array(body.utf8)) == 200 else { throw POSIXError(.EIO) }
        }
        var latencies: [Double] = []
        for index in 0..<openings {
            try post(lat: 48.201)  // 111 m north: outside the zone and its hysteresis
            try await Task.sleep(for: .milliseconds(5))
            let started = ContinuousClock.now
            try post(lat: 48.2)
            while receiver.received.count <= index {
                guard started.duration(to: .now) < .seconds(10) else { throw POSIXError(.ETIMEDOUT) }
                try await Task.sleep(for: .microseconds(200))
            }
            latencies.append(seconds(started.duration(to: receiver.received[index].instant)) * 1000)
        }
        latencies.sort()
        func percentile(_ p: Double) -> Double { (latencies[min(latencies.count - 1, Int(Double(latencies.count) * p))] * 10).rounded() / 10 }
        report(["name": "geofence gate latency", "openings": openings, "p50_ms": percentile(0.5), "p99_ms": percentile(0.99), "max_ms": (latencies.last! * 10).rounded() / 10])
        receiver.stop()
    }

    /// `count` zones within 15 km of central Riga: four in five circles of 30–300 m, the rest
    /// polygons of 4–8 vertices and 50–400 m, with a gate on every hundredth.
    static func city(zones count: Int, random: inout SplitMix64) -> GeofenceConfiguration {
        let city = LocalProjection(origin: Coordinate(lat: 56.95, lon: 24.10))
        var zones: [Zone] = []
        var gates: [Gate] = []
        for index in 0..<count {
            let center = city.unproject(x: random.next(in: -15_000...15_000), y: random.next(in: -15_000...15_000))
            if index % 5 == 4 {
                let local = LocalProjection(origin: center)
                let size = random.next(in: 50...400)
                let corners = Int(random.next(in: 4...8.99))
                let vertices = (0..<corners).map { k -> Coordinate in
                    let angle = (Double(k) + random.next(in: 0...0.5)) / Double(corners) * 2 * .pi
                    let reach = size * random.next(in: 0.6...1)
                    return local.unproject(x: cos(angle) * reach, y: sin(angle) * reach)
                }
                zones.append(Zone(id: "p\(index)", shape: .polygon(vertices)))
            } else {
                zones.append(Zone(id: "c\(index)", shape: .circle(center: center, radiusM: random.next(in: 30...300))))
            }
            if index % 100 == 0 {
                gates.append(Gate(
                    id: "gate\(index)", zone: zones[index].id, minSpeedMps: 2,
                    webhook: Webhook(url: "http://127.0.0.1:9/open", headers: ["X-Api-Key": "bench"])))
            }
        }
        return GeofenceConfiguration(zones: zones, gates: gates)
    }

    /// Eight cars driving at 10–25 m/s between random points of the city, one fix a second each,
    /// interleaved as the journal would number them; all live and fresh.
    static func track(fixes count: Int, random: inout SplitMix64) -> [(GeofenceInput, Date)] {
        let city = LocalProjection(origin: Coordinate(lat: 56.95, lon: 24.10))
        let start = Date(timeIntervalSince1970: 1_763_700_000)
        let devices = (0..<8).map { "car\($0)" }
        var positions = devices.map { _ in (x: random.next(in: -15_000...15_000), y: random.next(in: -15_000...15_000)) }
        var targets = positions
        var speeds = devices.map { _ in random.next(in: 10...25) }
        var inputs: [(GeofenceInput, Date)] = []
        inputs.reserveCapacity(count)
        var seq: UInt64 = 0
        var second = 0.0
        while inputs.count < count {
            for device in devices.indices where inputs.count < count {
                var (x, y) = positions[device]
                let dx = targets[device].x - x, dy = targets[device].y - y
                let distance = (dx * dx + dy * dy).squareRoot()
                if distance < speeds[device] {
                    targets[device] = (random.next(in: -15_000...15_000), random.next(in: -15_000...15_000))
                    speeds[device] = random.next(in: 10...25)
                } else {
                    x += dx / distance * speeds[device]
                    y += dy / distance * speeds[device]
                }
                positions[device] = (x, y)
                seq += 1
                let point = city.unproject(x: x, y: y)
                let time = start + second
                let fix = Fix(
                    seq: seq, device: devices[device], time: time, lat: point.lat, lon: point.lon, accuracyM: 8,
                    speedMps: speeds[device], source: .overland)
                inputs.append((.fix(fix, live: true), time + 0.5))
            }
            second += 1
        }
        return inputs
    }
}
