import DrivebusConfiguration
import DrivebusKit
import DrivebusSchema
import DrivebusTestSupport
import Foundation
import Testing

/// `drivebus backup` of a system that is taking fixes, and `drivebus restore` into another state
/// directory (issue 21): the restored system holds exactly a prefix of what the original had, and
/// its stats answer as the original's did for that prefix.
@Suite(.serialized) struct BackupSystemTests {
    final class Posted: @unchecked Sendable {
        private let lock = NSLock()
        private var value = 0
        var count: Int { lock.withLock { value } }
        func add() { lock.withLock { value += 1 } }
    }

    /// An Overland batch of `count` fixes, one a second from `first`, along a line in Vienna.
    func batch(_ first: Int, _ count: Int) -> Data {
        let locations: [[String: Any]] = (first..<(first + count)).map { index in
            [
                "type": "Feature",
                "geometry": ["type": "Point", "coordinates": [16.30 + Double(index) * 0.0001, 48.20]],
                "properties": ["timestamp": stamp(1_763_000_000 + index), "speed": 10, "horizontal_accuracy": 5],
            ]
        }
        return try! JSONSerialization.data(withJSONObject: ["locations": locations])
    }

    func stamp(_ seconds: Int) -> String {
        let formatter = ISO8601DateFormatter()
        return formatter.string(from: Date(timeIntervalSince1970: Double(seconds)))
    }

    func system(_ dir: TempDir, _ name: String) throws -> (path: String, config: DrivebusConfig, ingest: Int, stats: Int) {
        try testSystem(dir, name)
    }

    func csv(_ port: Int) async throws -> [Substring] {
        let export = try await http("GET", "http://127.0.0.1:\(port)/api/v1/export/fixes.csv?device=car")
        #expect(export.status == 200)
        return export.body.split(separator: "\n")
    }

    @Test func aBackupTakenUnderLoadRestoresToAPrefixOfTheOriginal() async throws {
        let dir = TempDir()
        let original = try system(dir, "original")
        var children = try ["drivebus-bus", "drivebus-ingest", "drivebus-stats"].map { try Child($0, ["--config", original.path]) }
        defer { for child in children { child.signal(SIGKILL) } }
        try await waitUntilLive(.stats, config: original.config, child: children[2])
        let ingest = "http://127.0.0.1:\(original.ingest)/overland"
        for first in stride(from: 0, to: 2000, by: 200) {
            #expect(try await http("POST", ingest, token: "car-token-0123456789", body: batch(first, 200)).status == 200)
        }
        try await waitUntilCaughtUp(.stats, config: original.config)

        // More fixes arrive while the backup is taken: it starts once ten more batches are in.
        let posted = Posted()
        let load = Task {
            for first in stride(from: 2000, to: 6000, by: 100) {
                _ = try await http("POST", ingest, token: "car-token-0123456789", body: batch(first, 100))
                posted.add()
            }
        }
        #expect(await eventually(within: .seconds(30)) { posted.count >= 10 })
        let backup = try await run("drivebus", ["backup", "--config", original.path, dir.path + "/backup"])
        #expect(backup.status == 0, "\(backup.stderr)")
        #expect(backup.stdout.contains("journal:"), "\(backup.stdout)")
        try await load.value
        try await waitUntilCaughtUp(.stats, config: original.config)
        let originalRows = try await csv(original.stats)
        #expect(originalRows.count == 6001)
        for child in children { child.signal(SIGTERM) }
        for child in children { _ = try await child.exitStatus() }

        // Restored elsewhere, with other ports: a prefix of the original's journal, byte for byte.
        let restored = try system(dir, "restored")
        let restore = try await run("drivebus", ["restore", "--config", restored.path, dir.path + "/backup"])
        #expect(restore.status == 0, "\(restore.stderr)")
        let originalJournal = try segmentBytes(original.config.layout.dataDir + "/journal")
        let restoredJournal = try segmentBytes(restored.config.layout.dataDir + "/journal")
        #expect(restoredJournal.count >= 100_000 && restoredJournal.count <= originalJournal.count)
        #expect(originalJournal.prefix(restoredJournal.count) == restoredJournal)

        children = try ["drivebus-bus", "drivebus-ingest", "drivebus-stats"].map { try Child($0, ["--config", restored.path]) }
        try await waitUntilLive(.stats, config: restored.config)
        try await waitUntilCaughtUp(.stats, config: restored.config)
        // Stats answers as the original did for those fixes: every one of them, in order, and no other.
        let restoredRows = try await csv(restored.stats)
        #expect(restoredRows.count >= 3001 && restoredRows.count <= originalRows.count, "\(restoredRows.count)")
        #expect(Array(originalRows.prefix(restoredRows.count)) == restoredRows)

        // A restore never lands on state that is already there.
        let again = try await run("drivebus", ["restore", "--config", restored.path, dir.path + "/backup"])
        #expect(again.status == 1 && again.stderr.contains("restore only into an empty state directory"), "\(again.stderr)")
        for child in children { child.signal(SIGTERM) }
        for child in children { #expect(try await child.exitStatus() == 0, "\(child.stderr)") }
    }
}

/// A config for ingest and stats on free loopback ports, with state in `dir/name`, the devices
/// given (each with the token `<id>-token-0123456789`) and `extra` lines; written to `name.yaml`.
func testSystem(_ dir: TempDir, _ name: String, devices: [String] = ["car"], extra: String = "") throws
    -> (path: String, config: DrivebusConfig, ingest: Int, stats: Int)
{
    let ports = freePorts(2)
    let yaml = """
        state_dir: \(dir.path)/\(name)
        heartbeat_interval_s: 0.2
        devices: [\(devices.map { "{id: \($0), token: \($0)-token-0123456789}" }.joined(separator: ", "))]
        ingest: {listen: "127.0.0.1:\(ports[0])"}
        stats: {listen: "127.0.0.1:\(ports[1])"}
        \(extra)
        """
    return (dir.file("\(name).yaml", yaml), try DrivebusConfig.parse(yaml: yaml), ports[0], ports[1])
}

/// The records of a journal: its segments' bytes, in seq order.
private func segmentBytes(_ directory: String) throws -> Data {
    let names = try FileManager.default.contentsOfDirectory(atPath: directory).filter { $0.hasSuffix(".seg") }.sorted()
    return try names.reduce(into: Data()) { $0 += try Data(contentsOf: URL(fileURLWithPath: directory + "/" + $1)) }
}

/// `drivebus purge` on the whole running system (issue 21): a day of one device goes from the
/// journal, the services' event journals and stats, and nothing else does; the day re-sent is not
/// stored again; the stats API purges another day; a stats database rebuilt afterwards holds
/// none of it.
@Suite(.serialized) struct PurgeSystemTests {
    let fixtures = BackupSystemTests()

    func batch(_ first: Int, _ count: Int) -> Data { fixtures.batch(first, count) }

    func csv(_ port: Int, device: String) async throws -> [Substring] {
        let export = try await http("GET", "http://127.0.0.1:\(port)/api/v1/export/fixes.csv?device=\(device)")
        #expect(export.status == 200)
        return export.body.split(separator: "\n").dropFirst().map { $0 }
    }

    @Test func aDayOfOneDeviceIsPurgedFromTheJournalAndStatsAndNothingElse() async throws {
        let dir = TempDir()
        let (path, config, ingestPort, statsPort) = try testSystem(dir, "state", devices: ["car", "bike"])
        let ports = [ingestPort, statsPort]
        let children = try ServiceName.standard.map { try Child($0.executable, ["--config", path]) }
        defer { for child in children { child.signal(SIGKILL) } }
        for service in [ServiceName.trips, .scorer, .geofence, .checkout, .stats] { try await waitUntilLive(service, config: config) }
        let ingest = "http://127.0.0.1:\(ports[0])/overland"
        // 2025-11-13 from 02:13:20 UTC: the car's 300 fixes and the bike's 100; the next day, the car's 200.
        let dayOne = batch(0, 300), nextDay = batch(86_400, 200)
        #expect(try await http("POST", ingest, token: "car-token-0123456789", body: dayOne).status == 200)
        #expect(try await http("POST", ingest, token: "car-token-0123456789", body: nextDay).status == 200)
        #expect(try await http("POST", ingest, token: "bike-token-0123456789", body: batch(0, 100)).status == 200)
        try await waitUntilCaughtUp(.stats, config: config)
        #expect(try await csv(ports[1], device: "car").count == 500)
        let bikeBefore = try await csv(ports[1], device: "bike")
        #expect(bikeBefore.count == 100)

        let trips = "http://127.0.0.1:\(ports[1])/api/v1/trips?device=car"
        #expect(try await http("GET", trips).body.hasPrefix(#"{"count":1,"#))
        // The map's trips and its data version, which an open page names in its tile URLs.
        func map() async throws -> (trips: Int, version: Int) {
            let answer = try JSONSerialization.jsonObject(with: Data(try await http("GET", "http://127.0.0.1:\(ports[1])/api/v1/map/bounds").body.utf8))
            let object = try #require(answer as? [String: Any])
            return (try #require(object["trips"] as? Int), try #require(object["version"] as? Int))
        }
        #expect(await eventually(within: .seconds(30)) { (try? await map().trips) == 1 })
        let mapBefore = try await map()
        let purge = try await run("drivebus", ["purge", "--config", path, "--device", "car", "--from", "2025-11-13", "--to", "2025-11-13"])
        #expect(purge.status == 0, "\(purge.stderr)")
        #expect(purge.stdout.contains("journal: 300 records in 1 segment ("), "\(purge.stdout)")
        #expect(purge.stdout.contains("fixes 300,"), "\(purge.stdout)")
        // The trip left the map, and the map's version moved: a page draws again with new tiles.
        let mapAfter = try await map()
        #expect(mapAfter.trips == 0 && mapAfter.version > mapBefore.version, "\(mapBefore) → \(mapAfter)")
        // The day's trip (started and ended) and its score, from the services' event journals.
        #expect(purge.stdout.contains("""
              trips.events: 2 events
              scorer.events: 1 event
              geofence.events: 0 events, outbox 0
              checkout.events: 0 events

            """), "\(purge.stdout)")
        let tripEvents = try String(contentsOfFile: config.layout.dataDir + "/trips.events", encoding: .utf8).split(separator: "\n")
        #expect(tripEvents.compactMap { LoggedEvent(line: Array($0.utf8)[...]).map { "\($0.seq) \($0.type) \($0.device ?? "")" } }
            == ["1 removed car", "2 removed car", "3 trip.started car", "4 trip.started bike"])

        // Stats holds the car's next day only, and all of the bike; the car's first fix is now the next day's.
        func firstFix(_ device: String) async throws -> String? {
            let answer = try JSONSerialization.jsonObject(with: Data(try await http("GET", "http://127.0.0.1:\(ports[1])/api/v1/devices").body.utf8))
            let devices = try #require((answer as? [String: Any])?["devices"] as? [[String: Any]])
            return try #require(devices.first { $0["device"] as? String == device })["first_fix"] as? String
        }
        #expect(try await firstFix("car") == "2025-11-14T02:13:20.000Z")
        #expect(try await firstFix("bike") == "2025-11-13T02:13:20.000Z")
        let car = try await csv(ports[1], device: "car")
        #expect(car.count == 200)
        #expect(car.allSatisfy { $0.contains("2025-11-14T") }, "\(car.prefix(2))")
        #expect(try await csv(ports[1], device: "bike") == bikeBefore)
        // The journal keeps its seqs; the purged fixes are stand-ins, and their resend is a duplicate.
        let health = "http://127.0.0.1:\(ports[0])/healthz"
        let lastSeq = try await http("GET", health).body
        #expect(lastSeq.contains(#""last_seq":600"#), "\(lastSeq)")
        let fix = #"{"time":"2025-11-13T02:13:21Z","lat":48.2,"lon":\#(16.30 + 0.0001)}"#
        let resent = try await http("POST", "http://127.0.0.1:\(ports[0])/api/v1/fixes", token: "car-token-0123456789", body: Data(#"{"fixes":[\#(fix)]}"#.utf8))
        #expect(resent.status == 200 && resent.body.contains(#""duplicates":1"#), "\(resent.body)")
        #expect(try await http("POST", ingest, token: "car-token-0123456789", body: dayOne).status == 200)
        #expect(try await http("GET", health).body == lastSeq)
        try await waitUntilCaughtUp(.stats, config: config)
        #expect(try await csv(ports[1], device: "car").count == 200)

        // The same through the stats API, from this machine's dashboard: the bike's day.
        let bikeDay = "http://127.0.0.1:\(ports[1])/api/v1/devices/bike/purge?from=2025-11-13&to=2025-11-13"
        let action = [("X-Drivebus-Action", "purge")]
        #expect(try await http("POST", bikeDay).status == 403)
        let missing = try await http("POST", "http://127.0.0.1:\(ports[1])/api/v1/devices/bike/purge?from=2025-11-13", headers: action)
        #expect(missing.status == 400 && missing.body.contains(#""field":"to""#), "\(missing.body)")
        #expect(try await csv(ports[1], device: "bike").count == 100)
        let purged = try await http("POST", bikeDay, headers: action)
        #expect(purged.status == 200, "\(purged.body)")
        // Exact, but for the journal's byte counts, which depend on the records' encoding. Stats'
        // `events` has nothing to give: the fixes' rows there hold no payload to empty.
        var answer = try #require(try JSONSerialization.jsonObject(with: Data(purged.body.utf8)) as? [String: Any])
        var journal = try #require(answer.removeValue(forKey: "journal") as? [String: Int])
        #expect(journal.removeValue(forKey: "bytes_after")! < journal.removeValue(forKey: "bytes_before")!)
        #expect(journal == ["records": 100, "segments": 1])
        let rest = try JSONSerialization.data(withJSONObject: answer, options: [.sortedKeys])
        #expect(String(decoding: rest, as: UTF8.self) == #"""
            {"complete":true,"device":"bike","events":{"checkout":{"events":0,"rows":{}},"geofence":{"events":0,"rows":{"outbox":0}},\#
            "scorer":{"events":0,"rows":{}},"trips":{"events":1,"rows":{}}},"from":"2025-11-13T00:00:00.000Z","not_reached":{},\#
            "stats":{"checkouts":0,"devices":1,"events":0,"fix_days":0,"fixes":100,"gate_calls":0,"geofence_transitions":0,"map_pending":0,"map_tiles":0,\#
            "map_trips":0,"scores":0,"trips":0,"visits":0},"to":"2025-11-13T23:59:59.999Z"}
            """#)
        #expect(try await csv(ports[1], device: "bike").isEmpty)
        #expect(try await firstFix("bike") == nil)

        // Stats' database rebuilt from scratch, from the journal and the event journals: the
        // purged trip does not come back from `trips.events`.
        let stats = children[ServiceName.standard.firstIndex(of: .stats)!]
        stats.signal(SIGTERM)
        #expect(try await stats.exitStatus() == 0, "\(stats.stderr)")
        let database = config.layout.dataDir + "/drivebus.sqlite"
        for suffix in ["", "-wal", "-shm"] { try? FileManager.default.removeItem(atPath: database + suffix) }
        let rebuilt = try Child("drivebus-stats", ["--config", path])
        defer { rebuilt.signal(SIGKILL) }
        try await waitUntilCaughtUp(.stats, config: config)
        #expect(await eventually(within: .seconds(30)) { await StatsCrashTests.cursor("events.trips", in: database) == 4 })
        #expect(try await csv(ports[1], device: "car").count == 200)
        let rebuiltTrips = try await http("GET", trips).body
        #expect(rebuiltTrips == #"{"count":0,"trips":[]}"#, "\(rebuiltTrips)")
        for child in children + [rebuilt] where child !== stats { child.signal(SIGTERM) }
        for child in children + [rebuilt] where child !== stats { #expect(try await child.exitStatus() == 0, "\(child.stderr)") }
    }
}

/// `retention: {raw_fixes_days: 1, derived_events_days: 1}` (issue 21): at start, ingest and stats
/// let fixes older than a day go, exactly those, and keep the rest; the trips service lets the
/// events of the old drive go.
@Suite(.serialized) struct RetentionSystemTests {
    @Test func fixesOlderThanTheRetentionGoAtStartAndTheRestStay() async throws {
        let dir = TempDir()
        let (path, config, ingestPort, statsPort) = try testSystem(dir, "state", extra: "retention: {raw_fixes_days: 1, derived_events_days: 1}")
        let ports = [ingestPort, statsPort]
        func start(_ names: [String]) throws -> [Child] { try names.map { try Child($0, ["--config", path]) } }
        let bus = try start(["drivebus-bus"])
        var services = try start(["drivebus-ingest", "drivebus-trips", "drivebus-stats"])
        defer { for child in bus + services { child.signal(SIGKILL) } }
        try await waitUntilLive(.stats, config: config)
        // 120 fixes from three days ago, then 80 from an hour ago (with motion, which is kept).
        let now = Date().timeIntervalSince1970.rounded()
        func fixes(from start: Double, _ count: Int) -> Data {
            let fixes = (0..<count).map { #"{"time":"\#(RFC3339.format(Date(timeIntervalSince1970: start + Double($0))))","lat":48.2,"lon":\#(16.3 + Double($0) * 1e-4)}"# }
            return Data(#"{"fixes":[\#(fixes.joined(separator: ","))]}"#.utf8)
        }
        let api = "http://127.0.0.1:\(ports[0])/api/v1/"
        #expect(try await http("POST", api + "fixes", token: "car-token-0123456789", body: fixes(from: now - 3 * 86_400, 120)).status == 200)
        #expect(try await http("POST", api + "fixes", token: "car-token-0123456789", body: fixes(from: now - 3600, 80)).status == 200)
        try await waitUntilCaughtUp(.stats, config: config)
        let export = "http://127.0.0.1:\(ports[1])/api/v1/export/fixes.csv?device=car"
        #expect(try await http("GET", export).body.split(separator: "\n").count == 201)
        // The trips service derived the old drive (ended by the three days' silence) and began the new one.
        let tripEvents = config.layout.dataDir + "/trips.events"
        func tripEventTypes() -> [String] {
            ((try? String(contentsOfFile: tripEvents, encoding: .utf8)) ?? "").split(separator: "\n").compactMap { LoggedEvent(line: Array($0.utf8)[...])?.type }
        }
        #expect(await eventually(within: .seconds(30)) { tripEventTypes() == ["trip.started", "trip.ended", "trip.started"] }, "\(tripEventTypes())")

        // Restarted: retention runs at start.
        for child in services { child.signal(SIGTERM) }
        for child in services { #expect(try await child.exitStatus() == 0, "\(child.stderr)") }
        // As if the trips service had derived them two days ago: an event goes by the later of
        // its own end and when it was derived.
        var aged: [UInt8] = []
        for line in try String(contentsOfFile: tripEvents, encoding: .utf8).split(separator: "\n") {
            let event = try #require(LoggedEvent(line: Array(line.utf8)[...]))
            LoggedEvent(seq: event.seq, type: event.type, device: event.device, id: event.id, time: Date(timeIntervalSince1970: now - 2 * 86_400),
                        payload: event.payload).writeLine(to: &aged)
        }
        try Data(aged).write(to: URL(fileURLWithPath: tripEvents))
        services = try start(["drivebus-ingest", "drivebus-trips", "drivebus-stats"])
        try await waitUntilLive(.stats, config: config)
        #expect(await eventually(within: .seconds(30)) {
            (try? await http("GET", export).body.split(separator: "\n").count) == 81
        })
        let kept = try await http("GET", export).body.split(separator: "\n").dropFirst()
        let oldDay = String(RFC3339.format(Date(timeIntervalSince1970: now - 3 * 86_400)).prefix(10))
        #expect(!kept.contains { $0.contains(oldDay) }, "\(kept.prefix(2))")
        // In the journal: 120 stand-ins with their seqs, the 80 recent fixes as they were.
        #expect(await eventually(within: .seconds(30)) { (try? count("removed.car", in: config)) == 120 })
        #expect(try count("fix.car", in: config) == 80)
        // The old drive's events are stand-ins in the trips service's journal; the new one's stay.
        #expect(await eventually(within: .seconds(30)) { tripEventTypes() == ["removed", "removed", "trip.started"] }, "\(tripEventTypes())")
        for child in services { child.signal(SIGTERM) }
        for child in services { #expect(try await child.exitStatus() == 0, "\(child.stderr)") }
    }

    /// The journal's records by topic, from its segments' bytes (the records' binary headers
    /// are not text, so records are taken apart by their lengths).
    func journalRecords(_ config: DrivebusConfig) throws -> [(topic: String, payload: String)] {
        let directory = config.layout.dataDir + "/journal"
        let names = try FileManager.default.contentsOfDirectory(atPath: directory).filter { $0.hasSuffix(".seg") }.sorted()
        var records: [(topic: String, payload: String)] = []
        for name in names {
            let bytes = [UInt8](try Data(contentsOf: URL(fileURLWithPath: directory + "/" + name)))
            var at = 0
            while at + 8 <= bytes.count {
                let length = Int(bytes[at]) | Int(bytes[at + 1]) << 8 | Int(bytes[at + 2]) << 16 | Int(bytes[at + 3]) << 24
                guard at + 8 + length <= bytes.count, let newline = bytes[(at + 8)..<(at + 8 + length)].firstIndex(of: 0x0A) else { break }
                records.append((String(decoding: bytes[(at + 8)..<newline], as: UTF8.self), String(decoding: bytes[(newline + 1)..<(at + 8 + length)], as: UTF8.self)))
                at += 8 + length
            }
        }
        return records
    }

    func count(_ topic: String, in config: DrivebusConfig) throws -> Int { try journalRecords(config).filter { $0.topic == topic }.count }
}

/// kill -9 of ingest while retention rewrites the journal (issue 21): nothing acknowledged is
/// lost, the journal opens, and the retention finishes after the restart.
@Suite(.serialized) struct CompactionCrashTests {
    @Test func aKillDuringCompactionLosesNoAcknowledgedFix() async throws {
        let dir = TempDir()
        let ports = freePorts(1)
        let base = """
            state_dir: \(dir.path)/state
            heartbeat_interval_s: 0.2
            devices: [{id: car, token: car-token-0123456789}, {id: bike, token: bike-token-0123456789}]
            ingest: {listen: "127.0.0.1:\(ports[0])"}
            """
        let plain = dir.file("plain.yaml", base)
        let retaining = dir.file("retaining.yaml", base + "\nretention: {raw_fixes_days: 1}")
        let config = try DrivebusConfig.parse(yaml: base)
        let journal = config.layout.dataDir + "/journal"
        let bus = try Child("drivebus-bus", ["--config", plain])
        var ingest = try Child("drivebus-ingest", ["--config", plain])
        defer { bus.signal(SIGKILL); ingest.signal(SIGKILL) }
        let api = "http://127.0.0.1:\(ports[0])/api/v1/fixes"
        #expect(await eventually(within: .seconds(30)) { (try? await http("GET", "http://127.0.0.1:\(ports[0])/healthz").status) == 200 })
        // 40,000 fixes of the car from three days ago: what the retention will rewrite.
        let old = Date().timeIntervalSince1970.rounded() - 3 * 86_400
        func body(_ start: Double, _ count: Int, lon: (Int) -> Double) -> Data {
            let fixes = (0..<count).map { #"{"time":"\#(RFC3339.format(Date(timeIntervalSince1970: start + Double($0))))","lat":48.2,"lon":\#(lon($0))}"# }
            return Data(#"{"fixes":[\#(fixes.joined(separator: ","))]}"#.utf8)
        }
        for first in stride(from: 0, to: 40_000, by: 2000) {
            #expect(try await http("POST", api, token: "car-token-0123456789", body: body(old + Double(first), 2000) { 16 + Double(first + $0) * 1e-6 }).status == 200)
        }
        ingest.signal(SIGTERM)
        _ = try await ingest.exitStatus()

        // Restarted with a retention of a day: it rewrites at once, and (the test's hook) waits
        // 3 s with the rewritten files on disk before renaming them. The bike posts meanwhile,
        // and ingest is killed in that wait.
        var environment = ProcessInfo.processInfo.environment
        environment["DRIVEBUS_TEST_REWRITE_PAUSE_MS"] = "3000"
        ingest = try Child("drivebus-ingest", ["--config", retaining], environment: environment)
        final class Acknowledged: @unchecked Sendable {
            let lock = NSLock()
            var lons: [String] = []
            func add(_ lon: String) { lock.withLock { lons.append(lon) } }
            var all: [String] { lock.withLock { lons } }
        }
        let acknowledged = Acknowledged()
        let now = Date().timeIntervalSince1970.rounded() - 600
        let posting = Task {
            for index in 0..<100_000 {
                let lon = String(17 + Double(index) * 1e-6)
                let fix = Data(#"{"fixes":[{"time":"\#(RFC3339.format(Date(timeIntervalSince1970: now + Double(index) * 0.001)))","lat":48.2,"lon":\#(lon)}]}"#.utf8)
                guard let answer = try? await http("POST", api, token: "bike-token-0123456789", body: fix) else {
                    if Task.isCancelled { return }
                    continue
                }
                if answer.status == 200 { acknowledged.add(lon) }
                if Task.isCancelled { return }
            }
        }
        let caught = await eventually(within: .seconds(60)) {
            let names = (try? FileManager.default.contentsOfDirectory(atPath: journal)) ?? []
            return names.contains { $0.hasSuffix(".seg.rewrite") } && names.contains { $0.hasSuffix(".idx.rewrite") }
        }
        #expect(caught, "no rewrite was seen under way")
        ingest.signal(SIGKILL)
        _ = try await ingest.exitStatus()
        posting.cancel()
        _ = await posting.value
        let acked = acknowledged.all

        // Restarted: every acknowledged fix is there, and the retention completes.
        ingest = try Child("drivebus-ingest", ["--config", retaining])
        let reader = RetentionSystemTests()
        #expect(await eventually(within: .seconds(60)) { (try? reader.count("removed.car", in: config)) == 40_000 }, "\(ingest.stderr)")
        let records = try reader.journalRecords(config)
        #expect(records.filter { $0.topic == "fix.car" }.isEmpty)
        let journaled = Set(records.filter { $0.topic == "fix.bike" }.compactMap { record -> String? in
            guard let range = record.payload.range(of: #""lon":"#) else { return nil }
            return String(record.payload[range.upperBound...].prefix { $0 != "," && $0 != "}" })
        })
        #expect(!acked.isEmpty)
        #expect(acked.filter { !journaled.contains($0) }.isEmpty, "acknowledged but lost: \(acked.filter { !journaled.contains($0) }.prefix(5))")
        #expect(try FileManager.default.contentsOfDirectory(atPath: journal).allSatisfy { $0.hasSuffix(".seg") || $0.hasSuffix(".idx") })
        ingest.signal(SIGTERM)
        #expect(try await ingest.exitStatus() == 0, "\(ingest.stderr)")
    }
}
