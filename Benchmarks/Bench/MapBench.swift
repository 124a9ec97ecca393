import ArgumentParser
import DrivebusConfiguration
import DrivebusGeo
import DrivebusKit
import DrivebusTestbed
import DrivebusTestSupport
import Foundation
import StatsCore
import StatsStore

/// `drivebus-bench map`: the interactive map at scale (issue 20).
/// - `map.lod`: trips around one city (`--points` fixes in `--trips` trips, 1 Hz drives on
///   road-like paths, simplified at 5 m as the trips service does) stored as `trip.ended` into the
///   stats database, which cuts each into its tiles, and into one without tiles; the difference,
///   the rows, and that cost against ingest's own time for the same number of fixes (a generated
///   history imported through the real ingest, in the same run).
/// - `map.tiles`: the real drivebus-stats over that database, tiles requested over HTTP at every
///   zoom around the trips; server time per tile (p50, p99, max) and sizes.
/// - `map.browser` (`--browser`): the page in headless Chromium (Tests/Browser/map_check.py): the
///   first view, each zoom and pan until drawn, and the JS heap.
struct MapBench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "map", abstract: "Measure the interactive map: tiles made, tiles served, the page in a browser.")

    @Option(help: "Trips to store.")
    var trips = 10_000

    @Option(help: "Fixes in all trips (1 Hz).")
    var points = 10_000_000

    @Flag(help: "Give stats every fix as the trip's track instead of the trips service's simplified one.")
    var unsimplified = false

    @Option(help: "Devices the trips are spread over.")
    var devices = 4

    @Option(help: "Tiles requested for the server timings.")
    var tiles = 3000

    @Option(help: "MB of generated history imported through ingest for the comparison (0 to skip).")
    var ingestMegabytes = 40

    @Flag(help: "Also load the page in headless Chromium.")
    var browser = false

    @Option(help: "A PNG of the browser's first view.")
    var screenshot: String?

    @Option(help: "Copy the stats database here before the services start, to look at it afterwards.")
    var keepDatabase: String?

    func run() async throws {
        var generated: [[Coordinate]] = []  // a sample of tracks, for where to request tiles
        var lod: [String: Any] = [:]
        let system = try await BenchSystem(
            services: [.bus, .ingest, .stats], extraConfig: "stats: {listen: \"127.0.0.1:\(freePort())\"}"
        ) { config in
            (lod, generated) = try await storeTrips(path: config.layout.dataDir + "/drivebus.sqlite")
            if let keepDatabase {
                for suffix in ["", "-wal", "-shm"] where FileManager.default.fileExists(atPath: config.layout.dataDir + "/drivebus.sqlite" + suffix) {
                    try? FileManager.default.removeItem(atPath: keepDatabase + suffix)
                    try FileManager.default.copyItem(atPath: config.layout.dataDir + "/drivebus.sqlite" + suffix, toPath: keepDatabase + suffix)
                }
            }
        }
        defer { system.stop() }
        if ingestMegabytes > 0 {
            let path = NSTemporaryDirectory() + "drivebus-map-ingest-\(ProcessInfo.processInfo.processIdentifier).json"
            defer { try? FileManager.default.removeItem(atPath: path) }
            let written = try ImportBench.generate(path: path, bytes: ingestMegabytes << 20)
            let imported = try await ImportBench.importThroughIngest(path: path, generatedPoints: written.points)
            let ingestRate = Double(imported["points_per_s"] as? Int ?? 0)
            // What keeping the tiles current costs against ingest's throughput: the extra time
            // to store the trips with their tiles, against the time ingest takes for their fixes.
            lod["ingest_points_per_s"] = Int(ingestRate)
            lod["tiles_vs_ingest_pct"] = (((lod["tiles_s"] as? Double ?? 0) / (Double(points) / ingestRate)) * 1000).rounded() / 10
        }
        report(lod)

        let port = system.config.stats.listen.port
        report(try await serveTiles(port: port, tracks: generated))
        if browser { report(try await loadPage(port: port)) }
    }

    /// Writes the trips in batches, as the bus would hand them over.
    private func storeTrips(path: String) async throws -> ([String: Any], [[Coordinate]]) {
        let store = try StatsStore(.init(path: path, durability: .normal))
        defer { try? store.close() }
        // The same trips into a database without the tiles: the difference is what they cost.
        let plainPath = (path as NSString).deletingLastPathComponent + "/without-tiles.sqlite"
        let plain = try StatsStore(.init(path: plainPath, durability: .normal, mapTiles: false))
        defer {
            try? plain.close()
            for suffix in ["", "-wal", "-shm"] { try? FileManager.default.removeItem(atPath: plainPath + suffix) }
        }
        var random = SplitMix64(seed: 20)
        let center = Coordinate(lat: 48.2082, lon: 16.3738)
        let projection = LocalProjection(origin: center)
        let start = Date(timeIntervalSince1970: 1_700_000_000)
        var sample: [[Coordinate]] = []
        var storeSeconds = 0.0, plainSeconds = 0.0, tilesSeconds = 0.0, made = 0, trackPoints = 0, payloadBytes = 0
        var batch: [StoredEvent] = []
        for trip in 0..<trips {
            let count = points / trips + (trip < points % trips ? 1 : 0)
            // A drive is `count` fixes, 1 s apart, starting anywhere in a 40 km square: roads are
            // straight for 10 s to 2 min, then turn; speeds vary, GPS wanders by a few metres. The
            // trips service keeps the track simplified at 5 m, so stats gets that (`--unsimplified`:
            // every fix, the worst case).
            var x = random.unit() * 40_000 - 20_000, y = random.unit() * 40_000 - 20_000
            var heading = random.unit() * 2 * Double.pi
            var straight = 0, speed = 14.0
            var fixes: [Coordinate] = []
            fixes.reserveCapacity(count)
            for _ in 0..<count {
                fixes.append(projection.unproject(x: x + (random.unit() - 0.5) * 4, y: y + (random.unit() - 0.5) * 4))
                if straight <= 0 {
                    heading += (random.unit() < 0.5 ? -1 : 1) * (Double.pi / 2 + (random.unit() - 0.5) * 0.7)
                    straight = 10 + Int(random.unit() * 110)
                    speed = 6 + random.unit() * 22
                }
                straight -= 1
                heading += (random.unit() - 0.5) * 0.02
                x += speed * cos(heading)
                y += speed * sin(heading)
            }
            let track = unsimplified ? fixes : DouglasPeucker.simplified(fixes, epsilonM: 5)
            // For the colours: most trips are drives, some slower.
            let averageSpeed = random.unit() < 0.8 ? 8 + random.unit() * 20 : 1 + random.unit() * 6
            trackPoints += track.count
            made += count
            if trip % max(1, trips / 200) == 0 { sample.append(track) }
            // The tiles alone, timed apart, to say how much of the storing they are.
            let tilesStarted = ContinuousClock.now
            let pieces = MapTiles.pieces(of: track)
            var bytes = 0
            for piece in pieces { bytes += MapTiles.encode(piece.lines).count }
            tilesSeconds += seconds(tilesStarted.duration(to: .now))
            precondition(bytes > 0)

            let device = "car\(trip % devices)"
            let tripStart = start.addingTimeInterval(Double(trip) * 32_000)  // ten years of 10,000 trips
            var payload = Array("{\"trip_id\":\"\(device)-\(trip)\",\"device\":\"\(device)\",\"start_time\":\"\(RFC3339.format(tripStart))\",\"end_time\":\"\(RFC3339.format(tripStart.addingTimeInterval(Double(count))))\",\"duration_s\":\(count),\"distance_m\":\(14 * count),\"avg_speed_mps\":\(Decimal64.text(averageSpeed, places: 1)),\"max_speed_mps\":\(Decimal64.text(averageSpeed * 1.8, places: 1)),\"fix_count\":\(count),\"track\":[".utf8)
            for (index, point) in track.enumerated() {
                if index > 0 { payload.append(UInt8(ascii: ",")) }
                payload += Array("[\(Decimal64.text(point.lat, places: 7)),\(Decimal64.text(point.lon, places: 7))]".utf8)
            }
            payload += Array("]}".utf8)
            payloadBytes += payload.count
            batch.append(StoredEvent(id: "trip-\(trip)", type: "trip.ended", device: device, source: "trips", time: tripStart, payload: payload))
            if batch.count == 20 || trip == trips - 1 {
                let started = ContinuousClock.now
                try await store.store(batch)
                // As the stats service does once a second, here once per 500 trips stored.
                if (trip + 1) % 500 < batch.count || trip == trips - 1 {
                    while try await store.updateMap(limit: 500) > 0 {}
                }
                storeSeconds += seconds(started.duration(to: .now))
                let plainStarted = ContinuousClock.now
                try await plain.store(batch)
                plainSeconds += seconds(plainStarted.duration(to: .now))
                batch.removeAll(keepingCapacity: true)
            }
        }
        let counts = try await store.mapTileStorage()
        let fileBytes = (try? FileManager.default.attributesOfItem(atPath: path)[.size] as? Int) ?? 0
        return ([
            "name": "map.lod", "trips": trips, "points": made, "track_points": trackPoints, "unsimplified": unsimplified, "store_s": (storeSeconds * 100).rounded() / 100,
            "store_without_tiles_s": (plainSeconds * 100).rounded() / 100, "tiles_s": ((storeSeconds - plainSeconds) * 100).rounded() / 100,
            "cut_s": (tilesSeconds * 100).rounded() / 100, "cut_us_per_fix": (tilesSeconds / Double(made) * 1e7).rounded() / 10,
            "tile_rows": counts.rows, "tile_line_mb": Double(counts.lineBytes / 1000) / 1000, "database_mb": Double(fileBytes / 1000) / 1000,
            "trip_payload_mb": Double(payloadBytes / 1000) / 1000,
        ], sample)
    }

    /// Tiles at every zoom around the trips, as a person looking at the map asks for them.
    private func serveTiles(port: Int, tracks: [[Coordinate]]) async throws -> [String: Any] {
        let wanted: [MapTiles.TileID] = {
            var random = SplitMix64(seed: 7)
            return (0..<tiles).map { index in
                let track = tracks[Int(random.unit() * Double(tracks.count)) % tracks.count]
                let point = track[Int(random.unit() * Double(track.count)) % track.count]
                let z = 3 + index % 16  // 3 to 18
                let world = Double(1 << z)
                let lat = point.lat * .pi / 180
                let x = Int((point.lon + 180) / 360 * world)
                let y = Int((1 - log(tan(lat) + 1 / cos(lat)) / .pi) / 2 * world)
                return MapTiles.TileID(z: z, x: x, y: y)
            }
        }()
        let (times, sizes, total) = try await Task.detached {
            let connection = try HTTPConnection(port: port)
            var times: [Double] = [], sizes: [Int: Int] = [:], total = 0
            for tile in wanted {
                let started = ContinuousClock.now
                let answer = try connection.exchange(method: "GET", path: "/api/v1/map/tiles/\(tile.z)/\(tile.x)/\(tile.y).bin", headers: [], body: [])
                times.append(seconds(started.duration(to: .now)) * 1000)
                guard answer.status == 200 else { throw ValidationError("tile \(tile): HTTP \(answer.status)") }
                sizes[tile.z] = max(sizes[tile.z] ?? 0, answer.body.count)
                total += answer.body.count
            }
            return (times.sorted(), sizes, total)
        }.value
        func percentile(_ p: Double) -> Double { (times[min(times.count - 1, Int(Double(times.count) * p))] * 100).rounded() / 100 }
        return [
            "name": "map.tiles", "tiles": times.count, "p50_ms": percentile(0.5), "p99_ms": percentile(0.99), "max_ms": percentile(1),
            "mean_kb": total / max(1, times.count) / 1000,
            "largest_kb_by_zoom": Dictionary(uniqueKeysWithValues: sizes.map { ("\($0.key)", $0.value / 1000) }),
        ]
    }

    /// Tests/Browser/map_check.py against the running stats.
    private func loadPage(port: Int) async throws -> [String: Any] {
        var directory = URL(fileURLWithPath: BenchSystem.binDirectory)
        while !FileManager.default.fileExists(atPath: directory.appendingPathComponent("Tests/Browser/map_check.py").path), directory.path != "/" {
            directory.deleteLastPathComponent()
        }
        var arguments = [directory.appendingPathComponent("Tests/Browser/map_check.py").path, "--url", "http://127.0.0.1:\(port)"]
        arguments += ["--steps", "zoomIn,zoomIn,zoomIn,panRight,panDown,zoomIn,zoomIn,panLeft,zoomOut,zoomOut,zoomOut,zoomOut,panRight"]
        if let screenshot { arguments += ["--screenshot", screenshot] }
        let result = try await DrivebusTestSupport.run("/usr/bin/python3", arguments)
        guard result.status == 0, let seen = try JSONSerialization.jsonObject(with: Data(result.stdout.utf8)) as? [String: Any] else {
            throw ValidationError("map_check.py failed: \(result.stderr)")
        }
        let steps = (seen["steps"] as? [[String: Any]] ?? []).compactMap { $0["ms"] as? Double }
        return [
            "name": "map.browser", "trips": seen["trips"] ?? NSNull(), "first_view_ms": ((seen["first_view_ms"] as? Double ?? -1) * 10).rounded() / 10,
            "steps": steps.count, "slowest_step_ms": ((steps.max() ?? -1) * 10).rounded() / 10,
            "step_ms": steps.map { ($0 * 10).rounded() / 10 },
            "js_heap_mb": Double((seen["js_heap_bytes"] as? Int ?? 0) / 100_000) / 10, "error": seen["error"] ?? NSNull(),
        ]
    }
}
