import DrivebusConfiguration
import DrivebusKit
import DrivebusTestSupport
import Foundation
import GRDB
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
#if canImport(FoundationXML)
import FoundationXML
#endif
import Testing

/// Ingest and stats for real: a GPX drive goes in through `drivebus import`, comes out of the API.
@Suite(.serialized) struct StatsSystemTests {
    /// Reads `<trkpt lat lon><time>` back from a GPX export.
    final class GPXPoints: NSObject, XMLParserDelegate {
        var points: [(lat: Double, lon: Double, time: String)] = []
        private var current: (lat: Double, lon: Double)?
        private var text = ""
        func parser(_ parser: XMLParser, didStartElement name: String, namespaceURI: String?, qualifiedName: String?, attributes: [String: String] = [:]) {
            text = ""
            if name == "trkpt" { current = (Double(attributes["lat"]!)!, Double(attributes["lon"]!)!) }
        }
        func parser(_ parser: XMLParser, foundCharacters string: String) { text += string }
        func parser(_ parser: XMLParser, didEndElement name: String, namespaceURI: String?, qualifiedName: String?) {
            if name == "time", let point = current { points.append((point.lat, point.lon, text)) }
            if name == "trkpt" { current = nil }
        }
    }

    @Test func anImportedDriveIsListedExportedAndCountedOnce() async throws {
        let dir = TempDir()
        let ports = freePorts(2)
        let (ingestPort, statsPort) = (ports[0], ports[1])
        let yaml = """
            state_dir: \(dir.path)/state
            heartbeat_interval_s: 0.2
            zones: [{id: home, circle: {lat: 48.1230487, lon: 16.6098346, radius_m: 200}}]
            devices: [{id: car, token: car-token-0123456789, home: home}]
            ingest: {listen: "127.0.0.1:\(ingestPort)"}
            stats: {listen: "127.0.0.1:\(statsPort)"}
            """
        let path = dir.file("drivebus.yaml", yaml)
        let config = try DrivebusConfig.parse(yaml: yaml)
        let api = "http://127.0.0.1:\(statsPort)/api/v1"
        let bus = try Child("drivebus-bus", ["--config", path])
        let ingest = try Child("drivebus-ingest", ["--config", path])
        var stats = try Child("drivebus-stats", ["--config", path])
        #expect(await eventually(within: .seconds(20)) { (try? await http("GET", "http://127.0.0.1:\(ingestPort)/healthz").status) == 200 })
        try await waitUntilLive(.stats, config: config, child: stats)

        let gpx = fixtures.appendingPathComponent("car_vienna_osm_1hz.gpx").path
        let imported = try await run("drivebus", ["import", "--config", path, "--device", "car", gpx])
        #expect(imported.status == 0, "\(imported.stderr)")

        var trips: [[String: Any]] = []
        #expect(await eventually(within: .seconds(20)) {
            let body = (try? await http("GET", api + "/trips?device=car"))?.body ?? ""
            trips = ((try? JSONSerialization.jsonObject(with: Data(body.utf8))) as? [String: Any])?["trips"] as? [[String: Any]] ?? []
            return trips.count == 1
        })
        let distance = try #require(trips.first?["distance_m"] as? Double)
        #expect(abs(distance - 22_300) <= 22_300 * 0.03)

        // GPX export: every point, exactly.
        let exported = try await http("GET", api + "/export/fixes.gpx?device=car")
        #expect(exported.status == 200)
        let reader = GPXPoints()
        let parser = XMLParser(data: Data(exported.body.utf8))
        parser.delegate = reader
        #expect(parser.parse())
        #expect(reader.points.count == 1525)
        #expect(reader.points.first.map { $0.lat == 48.1230487 && $0.lon == 16.6098346 && $0.time.hasPrefix("2021-11-03T16:19:50") } == true)

        // Daily figures match the trip.
        let daily = try await http("GET", api + "/stats/daily?device=car&from=2021-11-03&to=2021-11-04")
        let days = ((try JSONSerialization.jsonObject(with: Data(daily.body.utf8))) as? [String: Any])?["days"] as? [[String: Any]] ?? []
        let day = days.first { ($0["date"] as? String) == "2021-11-03" }
        #expect(day?["drives"] as? Int == 1)
        #expect((day?["distance_m"] as? Double).map { abs($0 - distance) < 1 } == true, "\(daily.body)")
        #expect(day?["fixes"] as? Int == 1525)

        // Bad parameters are named.
        let bad = try await http("GET", api + "/trips?from=yesterday")
        #expect(bad.status == 400 && bad.body.contains(#""field":"from""#))

        // The CLI export streams the same data to a file.
        let csvPath = dir.path + "/car.csv"
        let csv = try await run("drivebus", ["export", "--config", path, "--device", "car", "--format", "csv", "-o", csvPath])
        #expect(csv.status == 0, "\(csv.stderr)")
        let lines = try String(contentsOfFile: csvPath, encoding: .utf8).split(separator: "\n")
        #expect(lines.first == "time,lat,lon,accuracy_m,altitude_m,speed_mps,course_deg,is_home,distance_from_home_m")
        #expect(lines.count == 1526)

        // A killed and restarted stats replays what it had not committed and counts nothing twice.
        stats.signal(SIGKILL)
        _ = try await stats.exitStatus()
        stats = try Child("drivebus-stats", ["--config", path])
        try await waitUntilLive(.stats, config: config, child: stats)
        // Live means the journal's follower has caught up and the HTTP listener is bound (its rows
        // are stored up to 50 ms later; these were stored before the kill).
        var again: (status: Int, body: String)?
        #expect(await eventually(within: .seconds(20)) {
            again = try? await http("GET", api + "/stats/daily?device=car&from=2021-11-03&to=2021-11-04")
            return again?.status == 200
        })
        #expect(again?.body == daily.body)

        // Restarted without its saved derivations (a state an older build wrote does not decode),
        // stats derives again from the journal's start, and stores nothing it stored before: a
        // fix taken out of its database meanwhile (as its own expiry takes one) is not brought
        // back, and its cursor does not go back either.
        stats.signal(SIGTERM)
        #expect(try await stats.exitStatus() == 0, "\(stats.stderr)")
        let database = try DatabaseQueue(path: config.layout.dataDir + "/drivebus.sqlite")
        let journalCursor = try await database.write { db in
            try db.execute(sql: "DELETE FROM cursors WHERE name = 'derivations'")
            try db.execute(sql: "DELETE FROM fixes WHERE time_ms < (SELECT time_ms FROM fixes ORDER BY time_ms LIMIT 1 OFFSET 100)")
            return try Int64.fetchOne(db, sql: "SELECT value FROM cursors WHERE name = 'journal'")
        }
        #expect(journalCursor == 1526)
        stats = try Child("drivebus-stats", ["--config", path])
        try await waitUntilLive(.stats, config: config, child: stats)
        try await waitUntilCaughtUp(.stats, config: config)
        #expect(await eventually(within: .seconds(20)) {
            let body = (try? await http("GET", api + "/trips?device=car"))?.body ?? ""
            return (((try? JSONSerialization.jsonObject(with: Data(body.utf8))) as? [String: Any])?["trips"] as? [[String: Any]])?.count == 1
        })
        let replayed = try await database.read { db in
            (fixes: try Int.fetchOne(db, sql: "SELECT count(*) FROM fixes"),
             cursor: try Int64.fetchOne(db, sql: "SELECT value FROM cursors WHERE name = 'journal'"),
             fixRows: try Int.fetchOne(db, sql: "SELECT count(*) FROM events WHERE type = 'fix'"))
        }
        #expect(replayed.fixes == 1425 && replayed.cursor == 1526 && replayed.fixRows == 0, "\(replayed)")
        try database.close()

        let metrics = try await http("GET", "http://127.0.0.1:\(statsPort)/metrics")
        #expect(metrics.status == 200 && metrics.body.contains("drivebus_service_up"))

        for child in [stats, ingest, bus] { child.signal(SIGTERM) }
        for child in [stats, ingest, bus] { #expect(try await child.exitStatus() == 0, "\(child.stderr)") }
    }
}
