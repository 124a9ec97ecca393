import DrivebusConfiguration
import DrivebusKit
import DrivebusTestSupport
import Foundation
import Testing
import ZIPFoundation

/// `drivebus device` against a running ingest: a phone added, its token rotated and removed,
/// each taking effect within a second without a restart; an import into a new device.
@Suite struct DeviceSystemTests {
    @Test func addedRotatedAndRemovedTokensTakeEffectWithoutARestart() async throws {
        let dir = TempDir()
        let port = freePort()
        let path = dir.file("drivebus.yaml", """
            state_dir: \(dir.path)/state
            heartbeat_interval_s: 0.2
            ingest: {listen: "127.0.0.1:\(port)"}
            """)
        let config = try DrivebusConfig.parse(yaml: try String(contentsOfFile: path, encoding: .utf8))
        let base = "http://127.0.0.1:\(port)"
        let bus = try Child("drivebus-bus", ["--config", path])
        let ingest = try Child("drivebus-ingest", ["--config", path])
        #expect(await eventually(within: .seconds(20)) { (try? await http("GET", base + "/healthz").status) == 200 })
        let registry = DeviceRegistry(layout: config.layout)
        func post(_ token: String, second: Int) async throws -> Int {
            let body = #"{"fixes":[{"time":"2026-11-25T10:00:\#(String(format: "%02d", second))Z","lat":48.2,"lon":16.37}]}"#
            return try await http("POST", base + "/api/v1/fixes", token: token, body: Data(body.utf8)).status
        }

        // Added: its setup text names the endpoint, and ingest takes the token within a second.
        let added = try await run("drivebus", ["device", "add", "phone", "--app", "overland", "--url", "https://drive.example.net", "--config", path])
        #expect(added.status == 0, "\(added.stderr)")
        #expect(added.stdout.contains("overland://setup?url=https%3A%2F%2Fdrive.example.net%2Foverland&token="))
        #expect(added.stdout.contains("█"))
        // The token is in the setup text (and only its hash in the registry).
        let token = try #require(Self.token(in: added.stdout))
        #expect(try registry.load().first?.tokenSHA256 == TokenDigest.hex(token))
        #expect(await eventually(within: .seconds(3)) { (try? await post(token, second: 1)) == 200 })

        // Rotated: the old token is refused, the new one taken.
        let rotation = try await run("drivebus", ["device", "rotate-token", "phone", "--config", path])
        #expect(rotation.status == 0)
        let rotated = try #require(Self.token(in: rotation.stdout))
        #expect(rotated != token)
        #expect(await eventually(within: .seconds(3)) { (try? await post(token, second: 2)) == 401 })
        #expect(try await post(rotated, second: 3) == 200)

        // Listed, then removed: refused from then on; a second remove says there is none.
        let listed = try await run("drivebus", ["device", "list", "--config", path])
        #expect(listed.stdout.contains("phone") && listed.stdout.contains("overland") && !listed.stdout.contains(rotated))
        #expect(try await run("drivebus", ["device", "remove", "phone", "--config", path]).status == 0)
        #expect(await eventually(within: .seconds(3)) { (try? await post(rotated, second: 4)) == 401 })
        let removedTwice = try await run("drivebus", ["device", "remove", "phone", "--config", path])
        #expect(removedTwice.status != 0 && removedTwice.stderr.contains("no device \"phone\""))

        // An import into a device that does not exist creates it, and says so.
        let csv = dir.file("drive.csv", "time,lat,lon\n2026-11-25T09:00:00Z,48.2,16.37\n2026-11-25T09:00:01Z,48.2001,16.37\n")
        let imported = try await run("drivebus", ["import", "--device", "newcar", csv, "--config", path])
        #expect(imported.status == 0, "\(imported.stdout)\(imported.stderr)")
        #expect(imported.stdout.contains("created device \"newcar\""))
        #expect(imported.stdout.contains("2 imported"), "\(imported.stdout)")
        #expect(try registry.load().map(\.id) == ["newcar"])

        // A Takeout Records.json, recognised by its content whatever its name: imported once.
        let records = dir.file("Records.json", """
            {"locations": [
              {"latitudeE7": 482000000, "longitudeE7": 163700000, "accuracy": 10, "timestamp": "2019-05-01T10:00:00Z"},
              {"latitudeE7": 482001000, "longitudeE7": 163700000, "timestampMs": "1556704801000", "velocity": 1},
              {"timestamp": "2019-05-01T10:00:02Z", "activity": [{"activity": [{"type": "STILL", "confidence": 90}]}]}
            ]}
            """)
        let history = try await run("drivebus", ["import", "--device", "newcar", records, "--config", path])
        // Its activity goes in as a motion sample.
        #expect(history.stdout == """
            \(records): 2 points, 2 imported, 0 already there, 0 refused, 0 without a time
              1 activities as motion samples: 1 imported, 0 already there or unchanged, 0 refused

            """, "\(history.stderr)")
        let again = try await run("drivebus", ["import", "--device", "newcar", records, "--config", path])
        #expect(again.stdout == """
            \(records): 2 points, 0 imported, 2 already there, 0 refused, 0 without a time
              1 activities as motion samples: 0 imported, 1 already there or unchanged, 0 refused

            """)

        // A point ingest would refuse (dated 1999) is left out before it is sent, and named; the
        // points around it go in, in the file's order, with their batches.
        let lines = (0..<30).map { second in
            let time = second == 3 ? "1999-05-01T10:00:03Z" : "2019-05-02T10:00:\(String(format: "%02d", second))Z"
            return "\(time),48.2\(String(format: "%02d", second)),16.37"
        }
        let drive = dir.file("drive.csv", "time,lat,lon\n" + lines.joined(separator: "\n") + "\n")
        let bad = try await run("drivebus", ["import", "--device", "newcar", "--batch", "10", drive, "--config", path])
        #expect(bad.stdout == """
            \(drive): 30 points, 29 imported, 0 already there, 1 refused, 0 without a time
              refused line 5: time: time 1999-05-01T10:00:03.000Z is before 2000

            """, "\(bad.stderr)")
        // In the journal in the file's order: none sent again one by one after a later batch.
        let reader = BusClient(settings: config.process, name: "test")
        let page = try await ReplayPage.fetch(from: 1, limit: 1000, bus: reader)
        await reader.shutdown()
        let times = page.messages.compactMap { message -> Date? in
            guard message.topic == "fix.newcar", let fix = try? BusJSON.decode(Fix.self, from: message.payload) else { return nil }
            return RFC3339.format(fix.time).hasPrefix("2019-05-02") ? fix.time : nil
        }
        #expect(times.count == 29 && times == times.sorted(), "\(times.map(RFC3339.format))")

        // A Takeout download as it comes, zipped: its history is found inside, the rest skipped.
        let zip = dir.path + "/takeout.zip"
        let archive = try Archive(url: URL(fileURLWithPath: zip), accessMode: .create)
        func add(_ entry: String, _ text: String) throws {
            let data = Data(text.utf8)
            try archive.addEntry(with: entry, type: .file, uncompressedSize: Int64(data.count)) { position, size in
                data.subdata(in: Int(position)..<Int(position) + size)
            }
        }
        try add("Takeout/archive_browser.html", "<html></html>")
        try add("Takeout/Location History (Timeline)/Settings.json", #"{"createdTime": "2024-01-01T00:00:00Z", "deviceSettings": []}"#)
        try add("Takeout/Location History (Timeline)/Records.json", #"{"locations": [{"latitudeE7": 482100000, "longitudeE7": 163700000, "timestamp": "2020-01-01T10:00:00Z"}]}"#)
        let unzipped = try await run("drivebus", ["import", "--device", "newcar", zip, "--config", path])
        #expect(unzipped.status == 0, "\(unzipped.stdout)\(unzipped.stderr)")
        #expect(unzipped.stdout == "\(zip)!Takeout/Location History (Timeline)/Records.json: 1 points, 1 imported, 0 already there, 0 refused, 0 without a time\n")

        #expect(!(try String(contentsOfFile: registry.path, encoding: .utf8)).contains(rotated))
        ingest.signal(SIGTERM)
        bus.signal(SIGTERM)
        #expect(try await ingest.exitStatus() == 0)
        #expect(try await bus.exitStatus() == 0)

        // Interrupted while ingest is away: the history extracted from the archive goes too.
        // Several times, the interrupt sent as soon as the folder is there: the moments right
        // after the handlers are made are where it went wrong (the default action before
        // Dispatch's handler was in; a handler run twice that never ended the process).
        let temporary = dir.path + "/tmp"
        try FileManager.default.createDirectory(atPath: temporary, withIntermediateDirectories: true)
        var environment = ProcessInfo.processInfo.environment
        environment["TMPDIR"] = temporary
        func extracted() -> [String] { ((try? FileManager.default.contentsOfDirectory(atPath: temporary)) ?? []).filter { $0.hasPrefix("drivebus-import-") } }
        for signalNumber in [SIGINT, SIGTERM, SIGINT, SIGTERM, SIGINT] {
            let interrupted = try Child("drivebus", ["import", "--device", "newcar", zip, "--config", path], environment: environment)
            #expect(await eventually(within: .seconds(20), every: .milliseconds(1)) { !extracted().isEmpty })
            interrupted.signal(signalNumber)
            _ = try await interrupted.exitStatus(within: .seconds(10))  // ended by the interrupt, not left waiting
            #expect(extracted().isEmpty, "signal \(signalNumber): \(interrupted.stdout)\(interrupted.stderr)")
            // A failure stays one: what it left would make the next round signal too early.
            for leftover in extracted() { try? FileManager.default.removeItem(atPath: temporary + "/" + leftover) }
        }
    }

    @Test func theDashboardShowsBatteryAndMakesANewSetupCode() async throws {
        let dir = TempDir()
        let (port, statsPort) = (freePort(), freePort())
        func yaml(publicURL: String?) -> String {
            """
            state_dir: \(dir.path)/state
            heartbeat_interval_s: 0.2
            devices: [{id: car, token: car-token-0123456789}]
            ingest: {listen: "127.0.0.1:\(port)"\(publicURL.map { ", public_url: \"\($0)\"" } ?? "")}
            stats: {listen: "127.0.0.1:\(statsPort)"}
            """
        }
        let path = dir.file("drivebus.yaml", yaml(publicURL: nil))
        let config = try DrivebusConfig.parse(yaml: try String(contentsOfFile: path, encoding: .utf8))
        let (base, stats) = ("http://127.0.0.1:\(port)", "http://127.0.0.1:\(statsPort)")
        var processes = try [ServiceName.bus, .ingest, .stats].map { try Child($0.executable, ["--config", path]) }
        try await waitUntilLive(.stats, config: config)
        let added = try await run("drivebus", ["device", "add", "phone", "--app", "overland", "--config", path])
        let token = try #require(Self.token(in: added.stdout))
        func post(_ token: String, second: Int) async throws -> Int {
            let body = #"{"fixes":[{"time":"2026-11-25T10:00:\#(String(format: "%02d", second))Z","lat":48.2,"lon":16.37,"battery":0.8}]}"#
            return try await http("POST", base + "/api/v1/fixes", token: token, body: Data(body.utf8)).status
        }
        #expect(await eventually(within: .seconds(3)) { (try? await post(token, second: 1)) == 200 })

        // The devices table: the battery of the latest fix, and a setup button for added devices only.
        #expect(await eventually(within: .seconds(10)) { (try? await http("GET", stats + "/"))?.body.contains("<td class=\"num\">80 %</td>") == true })
        let page = try await http("GET", stats + "/").body
        #expect(page.contains(#"data-setup="phone""#) && !page.contains(#"data-setup="car""#))

        // Without the header a form cannot send, nothing changes; nor while ingest is on loopback
        // with no public URL, where a phone could not use the code and would lose its token.
        let setupURL = stats + "/api/v1/devices/phone/setup"
        let action = [("X-Drivebus-Action", "setup")]
        #expect(try await http("POST", setupURL).status == 403)
        let unreachable = try await http("POST", setupURL, headers: action)
        #expect(unreachable.status == 409 && unreachable.body.contains("stats.no_public_url"), "\(unreachable.body)")
        #expect(try await post(token, second: 2) == 200)

        // With ingest's public URL: a new token and its code, the old token refused.
        _ = dir.file("drivebus.yaml", yaml(publicURL: "https://drive.example.net/dbus"))
        processes[2].signal(SIGTERM)
        #expect(try await processes[2].exitStatus() == 0)
        processes[2] = try Child("drivebus-stats", ["--config", path])
        try await waitUntilLive(.stats, config: config)
        let answer = try await http("POST", setupURL, headers: action)
        #expect(answer.status == 200, "\(answer.body)")
        let setup = try #require(try JSONSerialization.jsonObject(with: Data(answer.body.utf8)) as? [String: String])
        #expect(setup["app"] == "overland" && setup["svg"]?.hasPrefix("<svg") == true)
        let code = try #require(setup["code"])
        #expect(code.hasPrefix("overland://setup?url=https%3A%2F%2Fdrive.example.net%2Fdbus%2Foverland&token="), "\(code)")
        let rotated = try #require(Self.token(in: code).flatMap { $0.removingPercentEncoding })
        #expect(rotated != token)
        #expect(await eventually(within: .seconds(3)) { (try? await post(token, second: 3)) == 401 })
        #expect(try await post(rotated, second: 4) == 200)
        #expect(try await http("POST", stats + "/api/v1/devices/car/setup", headers: action).status == 409)
        #expect(try await http("POST", stats + "/api/v1/devices/nobody/setup", headers: action).status == 404)
        for child in processes { child.signal(SIGTERM) }
        for child in processes { #expect(try await child.exitStatus() == 0) }
    }

    @Test func aHistorysVisitsAreImportedOnceAndListedByStats() async throws {
        let dir = TempDir()
        let (port, statsPort) = (freePort(), freePort())
        let path = dir.file("drivebus.yaml", """
            state_dir: \(dir.path)/state
            heartbeat_interval_s: 0.2
            ingest: {listen: "127.0.0.1:\(port)"}
            stats: {listen: "127.0.0.1:\(statsPort)"}
            """)
        let config = try DrivebusConfig.parse(yaml: try String(contentsOfFile: path, encoding: .utf8))
        let processes = try [ServiceName.bus, .ingest, .stats].map { try Child($0.executable, ["--config", path]) }
        try await waitUntilLive(.stats, config: config, child: processes[2])
        let history = dir.file("2019_MAY.json", """
            {"timelineObjects": [
              {"activitySegment": {"activityType": "IN_PASSENGER_VEHICLE", "duration": {"startTimestamp": "2019-05-01T09:30:00Z", "endTimestamp": "2019-05-01T10:00:00Z"},
                "simplifiedRawPath": {"points": [{"latE7": 481000000, "lngE7": 163000000, "timestamp": "2019-05-01T09:30:00Z"}]}}},
              {"placeVisit": {"location": {"latitudeE7": 482084900, "longitudeE7": 163730800, "placeId": "ChIJplace1", "name": "Café Central",
                 "address": "Herrengasse 14, 1010 Wien", "semanticType": "TYPE_SEARCHED_ADDRESS"},
               "duration": {"startTimestamp": "2019-05-01T10:00:00Z", "endTimestamp": "2019-05-01T11:30:00Z"}}},
              {"placeVisit": {"location": {"latitudeE7": 482000000, "longitudeE7": 163000000},
               "duration": {"startTimestamp": "2019-05-01T13:00:00Z", "endTimestamp": "2019-05-01T12:00:00Z"}}}
            ]}
            """)
        let imported = try await run("drivebus", ["import", "--device", "jan", history, "--config", path])
        #expect(imported.stdout.hasSuffix("""
            \(history): 1 points, 1 imported, 0 already there, 0 refused, 0 without a time
              1 activities as motion samples: 1 imported, 0 already there or unchanged, 0 refused
              2 visits: 1 imported, 0 already there, 1 refused
              refused timelineObjects[2].placeVisit: end: is before start

            """), "\(imported.stdout)\(imported.stderr)")
        let again = try await run("drivebus", ["import", "--device", "jan", history, "--config", path])
        #expect(again.stdout.contains("  2 visits: 0 imported, 1 already there, 1 refused\n"), "\(again.stdout)")
        let url = "http://127.0.0.1:\(statsPort)/api/v1/visits?device=jan"
        let expected = #"{"visits":[{"address":"Herrengasse 14, 1010 Wien","device":"jan","duration_s":5400,"end":"2019-05-01T11:30:00.000Z","lat":48.20849,"lon":16.37308,"name":"Café Central","place_id":"ChIJplace1","semantic_type":"TYPE_SEARCHED_ADDRESS","start":"2019-05-01T10:00:00.000Z"}]}"#
        #expect(await eventually(within: .seconds(10)) { (try? await http("GET", url))?.body == expected })
        for child in processes { child.signal(SIGTERM) }
        for child in processes { #expect(try await child.exitStatus() == 0) }
    }

    /// The token in Overland's setup link.
    static func token(in text: String) -> String? {
        guard let range = text.range(of: "&token=") else { return nil }
        return String(text[range.upperBound...].prefix { $0 != "&" })
    }
}
