import DrivebusConfiguration
import DrivebusTestSupport
import Foundation
import Testing

/// The interactive map in a real browser (issue 20): real bus, ingest and stats, two drives
/// imported, and headless Chromium driven by Tests/Browser/map_check.py through chromedriver.
@Suite(.serialized) struct MapBrowserTests {
    @Test func theMapDrawsEveryTripPicksOneOnClickAndFilters() async throws {
        let dir = TempDir()
        let ports = freePorts(2)
        let (ingestPort, statsPort) = (ports[0], ports[1])
        let yaml = """
            state_dir: \(dir.path)/state
            heartbeat_interval_s: 0.2
            ingest: {listen: "127.0.0.1:\(ingestPort)"}
            stats: {listen: "127.0.0.1:\(statsPort)"}
            scorer: {speed_limit_kmh: 50}
            """
        let path = dir.file("drivebus.yaml", yaml)
        let config = try DrivebusConfig.parse(yaml: yaml)
        let base = "http://127.0.0.1:\(statsPort)"
        let bus = try Child("drivebus-bus", ["--config", path])
        let ingest = try Child("drivebus-ingest", ["--config", path])
        let stats = try Child("drivebus-stats", ["--config", path])
        defer { for child in [stats, ingest, bus] { child.signal(SIGKILL) } }
        try await waitUntilLive(.stats, config: config, child: stats)

        for (device, file) in [("car", "car_vienna_osm_1hz.gpx"), ("bus", "bus_liverpool_route14.csv")] {
            let imported = try await run("drivebus", ["import", "--config", path, "--device", device, fixtures.appendingPathComponent(file).path])
            #expect(imported.status == 0, "\(imported.stderr)")
        }
        try await waitUntilCaughtUp(.stats, config: config)
        let listed = try await http("GET", base + "/api/v1/trips")
        let trips = ((try JSONSerialization.jsonObject(with: Data(listed.body.utf8))) as? [String: Any])?["trips"] as? [[String: Any]] ?? []
        #expect(Set(trips.compactMap { $0["device"] as? String }) == ["car", "bus"])
        // Stats cuts trips into the map's tiles within a second of storing them.
        #expect(await eventually(within: .seconds(10)) {
            let body = (try? await http("GET", base + "/api/v1/map/bounds"))?.body ?? ""
            return ((try? JSONSerialization.jsonObject(with: Data(body.utf8))) as? [String: Any])?["trips"] as? Int == trips.count
        })
        let car = try #require(trips.first { $0["device"] as? String == "car" })
        let carID = try #require(car["trip_id"] as? String)
        let detail = try await http("GET", base + "/api/v1/trips/" + carID)
        let track = ((try JSONSerialization.jsonObject(with: Data(detail.body.utf8))) as? [String: Any])?["track"] as? [[Double]] ?? []
        let middle = try #require(track.count > 10 ? track[track.count / 2] : nil)

        // The page and Leaflet come from stats itself: no internet needed.
        let page = try await http("GET", base + "/map")
        #expect(page.status == 200 && page.body.contains("static/leaflet/leaflet.js"))
        #expect(try await http("GET", base + "/static/leaflet/leaflet.js").status == 200)
        let bad = try await http("GET", base + "/api/v1/map/tiles/3/9/1.bin")
        #expect(bad.status == 400 && bad.body.contains(#""field":"x""#))
        let unnamed = try await http("GET", base + "/api/v1/map/pick?z=3&x=1&y=1&unit_x=5")
        #expect(unnamed.status == 400 && unnamed.body.contains(#""field":"unit_y""#))

        // DRIVEBUS_MAP_SCREENSHOT keeps the picture (docs/map.md's was taken so).
        let screenshot = ProcessInfo.processInfo.environment["DRIVEBUS_MAP_SCREENSHOT"] ?? dir.path + "/map.png"
        let browser = try await run("/usr/bin/python3", [
            fixtures.appendingPathComponent("../Browser/map_check.py").standardized.path, "--url", base,
            "--click", "\(middle[0]),\(middle[1])", "--device", "car", "--screenshot", screenshot,
        ])
        #expect(browser.status == 0, "\(browser.stderr)")
        let seen = try #require(try JSONSerialization.jsonObject(with: Data(browser.stdout.utf8)) as? [String: Any], "\(browser.stdout)")
        #expect(seen["error"] is NSNull, "\(seen)")
        #expect((seen["console"] as? [Any])?.isEmpty == true, "\(seen)")
        #expect(seen["trips"] as? Int == trips.count)
        // Both drives on the first view (Vienna to Liverpool), drawn as pixels, not only fetched.
        #expect((seen["painted"] as? Int ?? 0) > 20, "\(seen)")
        #expect((seen["lines"] as? Int ?? 0) >= 2, "\(seen)")
        let steps = seen["steps"] as? [[String: Any]] ?? []
        #expect(steps.count == 8 && steps.allSatisfy { $0["ms"] is Double })
        // A click on the drive's track picks it and shows its details.
        let selected = seen["selected"] as? [String: Any]
        #expect(selected?["id"] as? String == carID, "\(seen)")
        #expect((seen["popup"] as? String)?.contains("car") == true, "\(seen)")
        // Its stretches above 50 km/h × 1.1 (the Vienna drive has some) in red, listed in the popup.
        let speeding = ((try JSONSerialization.jsonObject(with: Data(detail.body.utf8))) as? [String: Any])?["speeding"] as? [[String: Any]] ?? []
        #expect(!speeding.isEmpty && speeding.allSatisfy { $0["limit_source"] as? String == "global" && $0["limit_kmh"] as? Double == 50 })
        #expect(seen["speeding_paths"] as? Int == speeding.count, "\(seen)")
        #expect((seen["popup"] as? String)?.contains("Over the limit") == true, "\(seen)")
        // Filtered to the car, the Vienna drive alone.
        let filtered = seen["filtered"] as? [String: Any]
        #expect(filtered?["trips"] as? Int == trips.filter { $0["device"] as? String == "car" }.count, "\(seen)")
        #expect((filtered?["painted"] as? Int ?? 0) > 1000, "\(seen)")
        #expect((try? Data(contentsOf: URL(fileURLWithPath: screenshot)).count) ?? 0 > 10_000)

        // A link with filters in it (the dashboard's, for one device) opens the map filtered.
        let linked = try await run("/usr/bin/python3", [
            fixtures.appendingPathComponent("../Browser/map_check.py").standardized.path, "--url", base, "--query", "device=bus", "--steps", "",
        ])
        #expect(linked.status == 0, "\(linked.stderr)")
        let busView = try JSONSerialization.jsonObject(with: Data(linked.stdout.utf8)) as? [String: Any]
        #expect(busView?["trips"] as? Int == trips.filter { $0["device"] as? String == "bus" }.count, "\(busView ?? [:])")
        #expect(busView?["error"] is NSNull && (busView?["painted"] as? Int ?? 0) > 20, "\(busView ?? [:])")
    }
}
