import ArgumentParser
import DrivebusKit
import DrivebusTestbed
import DrivebusTestSupport
import Foundation
import StatsCore
import StatsStore

/// `drivebus-bench stats`: the stats store on its own, in a temporary directory.
/// - `stats store fixes`: `fix` events stored in batches, one transaction each (as the bus
///   subscriber hands them over), with `synchronous=FULL` and `NORMAL`; fixes/s.
/// - `stats map`: `map.geojson` and `map.svg` for 533 trips whose `trip.ended` tracks hold
///   480,000 points in all (unsimplified, the worst case); milliseconds each.
/// - `stats store live` and `stats catch-up`: the real bus, ingest and stats (below).
struct StatsBench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "stats", abstract: "Measure storing fixes and drawing the map of all drives.")

    @Option(help: "Fixes to store per durability.")
    var fixes = 300_000

    @Option(help: "Fixes per transaction.")
    var batchSize = 1000

    @Option(help: "Track points in all trips, for the map.")
    var points = 480_000

    @Option(help: "Trips for the map.")
    var trips = 533

    @Option(help: "Fixes posted to a live ingest while stats stores them, then to one that stats joins afterwards (0 to skip).")
    var live = 100_000

    func run() async throws {
        try await inCore()
        if live > 0 {
            try await whileIngesting()
            try await catchingUp()
        }
    }

    /// `stats store live`: the real ingest and stats (release), Overland batches of 200 posted
    /// over 8 connections; fixes/s from the first POST until stats has committed the last one.
    private func whileIngesting() async throws {
        let system = try await BenchSystem(services: [.bus, .ingest, .stats], extraConfig: Self.config)
        defer { system.stop() }
        let (port, bodies) = (system.port, overlandBodies())
        let client = BusClient(settings: system.config.process, name: "bench-stats")
        let started = ContinuousClock.now
        let posting = Task.detached {
            try HTTPConnection.load(port: port, connections: 8, bodies: bodies, path: "/overland", headers: [("Authorization", "Bearer \(Self.token)")])
        }
        try await Self.waitUntilStatsHasStored(live, client: client)
        let elapsed = seconds(started.duration(to: .now))
        _ = try await posting.value
        await client.shutdown()
        report(["name": "stats store live", "fixes": live, "fixes_per_s": Int(Double(live) / elapsed)])
    }

    /// `stats catch-up`: the same fixes, already in ingest's journal when stats starts (stats
    /// down while a phone uploaded, or added to a running system); fixes/s from stats' launch
    /// until it has committed the last one.
    private func catchingUp() async throws {
        let system = try await BenchSystem(services: [.bus, .ingest], extraConfig: Self.config)
        defer { system.stop() }
        _ = try HTTPConnection.load(port: system.port, connections: 8, bodies: overlandBodies(), path: "/overland", headers: [("Authorization", "Bearer \(Self.token)")])
        let client = BusClient(settings: system.config.process, name: "bench-stats")
        let started = ContinuousClock.now
        try system.launch(.stats)
        try await Self.waitUntilStatsHasStored(live, client: client)
        let elapsed = seconds(started.duration(to: .now))
        await client.shutdown()
        report(["name": "stats catch-up", "fixes": live, "fixes_per_s": Int(Double(live) / elapsed)])
    }

    static let token = "bench-token-0123456789"
    static var config: String {
        """
        devices: [{id: car, token: \(token)}]
        stats: {listen: "127.0.0.1:\(freePort())"}
        """
    }

    /// `live` fixes of one car, one a second, in Overland batches of 200.
    private func overlandBodies() -> [[UInt8]] {
        let start = 1_763_000_000.0
        return stride(from: 0, to: live, by: 200).map { first in
            let features = (first..<min(first + 200, live)).map { index in
                let time = RFC3339.format(Date(timeIntervalSince1970: start + Double(index)))
                return #"{"type":"Feature","geometry":{"type":"Point","coordinates":[\#(16.3 + Double(index % 5000) * 1e-5),48.2]},"properties":{"timestamp":"\#(time)","speed":13.4,"horizontal_accuracy":5}}"#
            }
            return Array(#"{"locations":["#.utf8) + Array(features.joined(separator: ",").utf8) + Array("]}".utf8)
        }
    }

    private static func waitUntilStatsHasStored(_ count: Int, client: BusClient) async throws {
        let deadline = ContinuousClock.now + .seconds(600)
        while (try? await client.call(.stats, RPCRequestHead(op: "health"), as: HealthReply.self))?.lastSeq["journal"] ?? 0 < UInt64(count) {
            guard ContinuousClock.now < deadline else { throw ValidationError("stats had not stored \(count) fixes after 600 s") }
            try await Task.sleep(for: .milliseconds(20))
        }
    }

    private func inCore() async throws {
        var template = Array("/tmp/dbs-XXXXXX".utf8CString)
        let dir = template.withUnsafeMutableBufferPointer { String(cString: mkdtemp($0.baseAddress!)!) }
        defer { try? FileManager.default.removeItem(atPath: dir) }

        // Payloads are encoded before the clock starts: encoding is the publisher's work.
        let run = UInt64.random(in: 1...UInt64.max >> 4)
        let start = Date(timeIntervalSince1970: 1_735_689_600)
        let events: [StoredEvent] = (0..<fixes).map { index in
            let fix = Fix(
                seq: UInt64(index + 1), device: "car", time: start.addingTimeInterval(Double(index)),
                lat: 48.2 + Double(index % 5000) * 1e-5, lon: 16.37 + Double(index % 7000) * 1e-5,
                accuracyM: 5, altitudeM: 180 + Double(index % 50), speedMps: 13.4, courseDeg: Double(index % 360), battery: 0.8, source: .overland)
            var writer = JSONWriter()
            fix.writeJSON(to: &writer)
            return StoredEvent(id: EventID.make(run: run, seq: UInt64(index + 1)), type: "fix", device: "car", source: "ingest", time: fix.time, payload: writer.bytes)
        }
        for durability in [StatsStore.Configuration.Durability.full, .normal] {
            let store = try StatsStore(.init(path: "\(dir)/\(durability.rawValue)/drivebus.sqlite", durability: durability))
            let started = ContinuousClock.now
            let cpuStarted = processCPUSeconds()
            var offset = 0
            while offset < events.count {
                let end = min(events.count, offset + batchSize)
                try await store.store(Array(events[offset..<end]))
                offset = end
            }
            let elapsed = seconds(started.duration(to: .now))
            let cpu = processCPUSeconds() - cpuStarted
            let stored = try await store.counts()["fixes"] ?? 0
            guard stored == fixes else { throw ValidationError("stored \(stored) of \(fixes) fixes") }
            try store.close()
            // What a fix costs on disk: the database once closed (its log checkpointed into it).
            let bytes = (try? FileManager.default.attributesOfItem(atPath: "\(dir)/\(durability.rawValue)/drivebus.sqlite")[.size] as? Int) ?? 0
            report([
                "name": "stats store fixes", "durability": durability.rawValue, "batch": batchSize, "fixes": fixes,
                "fixes_per_s": Int(Double(fixes) / elapsed), "fixes_per_cpu_s": Int(Double(fixes) / cpu), "db_bytes_per_fix": bytes / fixes,
            ])
        }

        // 533 drives around Vienna: 1 Hz random walks at 14 m/s with gently wandering headings.
        let store = try StatsStore(.init(path: "\(dir)/map/drivebus.sqlite", durability: .normal))
        var random = SplitMix64(seed: 8091)
        let center = Coordinate(lat: 48.2082, lon: 16.3738)
        let projection = LocalProjection(origin: center)
        var tripEvents: [StoredEvent] = []
        var made = 0
        for trip in 0..<trips {
            let count = points / trips + (trip < points % trips ? 1 : 0)
            var x = random.unit() * 20_000 - 10_000, y = random.unit() * 20_000 - 10_000
            var heading = random.unit() * 2 * Double.pi
            var track: [[Double]] = []
            track.reserveCapacity(count)
            for _ in 0..<count {
                let point = projection.unproject(x: x, y: y)
                track.append([point.lat, point.lon])
                heading += (random.unit() - 0.5) * 0.3
                x += 14 * cos(heading)
                y += 14 * sin(heading)
            }
            made += count
            let tripStart = start.addingTimeInterval(Double(trip) * 86_400 / 1.5)
            let payload: [String: Any] = [
                "trip_id": "car-\(trip)", "device": "car", "start_time": RFC3339.format(tripStart),
                "end_time": RFC3339.format(tripStart.addingTimeInterval(Double(count))), "duration_s": count,
                "distance_m": 14 * count, "fix_count": count, "track": track,
            ]
            tripEvents.append(StoredEvent(
                id: "trip-\(trip)", type: "trip.ended", device: "car", source: "trips", time: tripStart,
                payload: Array(try JSONSerialization.data(withJSONObject: payload))))
        }
        try await store.store(tripEvents)

        let geoStarted = ContinuousClock.now
        var geoBytes = 0
        try store.export(.map, StatsQuery()) { geoBytes += $0.count }
        let geoJSON = seconds(geoStarted.duration(to: .now))
        let svgStarted = ContinuousClock.now
        let svg = try await store.mapSVG(StatsQuery())
        let svgTime = seconds(svgStarted.duration(to: .now))
        let polylines = String(decoding: svg, as: UTF8.self).components(separatedBy: "<polyline").count - 1
        guard polylines == trips else { throw ValidationError("the SVG has \(polylines) polylines for \(trips) trips") }
        report([
            "name": "stats map", "points": made, "trips": trips,
            "geojson_ms": Int(geoJSON * 1000), "geojson_bytes": geoBytes,
            "svg_ms": Int(svgTime * 1000), "svg_bytes": svg.count,
        ])
        try store.close()
    }
}

/// CPU time of the whole process: on a busy machine, wall time alone says little.
private func processCPUSeconds() -> Double {
    var time = timespec()
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &time)
    return Double(time.tv_sec) + Double(time.tv_nsec) / 1e9
}

