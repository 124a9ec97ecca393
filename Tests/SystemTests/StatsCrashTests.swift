import DrivebusConfiguration
import DrivebusKit
import DrivebusTestbed
import DrivebusTestSupport
import Foundation
import GRDB
import Testing

/// Stats killed with SIGKILL at seeded random moments while fixes, zone crossings, a gate call, a
/// check-out and scored trips flow ends with exactly the rows of an undisturbed run: the same
/// history stored by a stats that starts from an empty database after everything happened.
@Suite(.serialized) struct StatsCrashTests {
    /// Every table stats fills, as sorted text rows. Columns that hold the wall-clock time a
    /// row was stored at, or which of two services delivered an identical event first, are left
    /// out: they differ between any two runs.
    static func snapshot(_ path: String) throws -> [String: [String]] {
        let queue = try readOnly(path)
        defer { try? queue.close() }
        let tables: [String: String] = [
            "events": "id, type, device, hex(payload)",
            "fixes": "*", "devices": "*", "trips": "*", "scores": "*", "sessions": "*",
            "geofence_transitions": "*", "gate_calls": "*", "checkouts": "*",
        ]
        return try queue.read { db in
            var rows: [String: [String]] = [:]
            for (table, columns) in tables {
                rows[table] = try Row.fetchAll(db, sql: "SELECT \(columns) FROM \(table)").map { row in
                    row.databaseValues.map { $0.description }.joined(separator: "|")
                }.sorted()
            }
            return rows
        }
    }

    /// Opens stats' database beside the running stats, never creating it.
    static func readOnly(_ path: String) throws -> DatabaseQueue {
        var configuration = Configuration()
        configuration.readonly = true
        return try DatabaseQueue(path: path, configuration: configuration)
    }

    /// The last seq stats has stored from the stream `name` (`events.trips`…).
    static func cursor(_ name: String, in path: String) async -> UInt64 {
        guard let queue = try? readOnly(path) else { return 0 }
        defer { try? queue.close() }
        return (try? await queue.read { db in try Int64.fetchOne(db, sql: "SELECT value FROM cursors WHERE name = ?", arguments: [name]) }).flatMap { $0 }.map(UInt64.init) ?? 0
    }

    /// The last journal seq stats has stored.
    static func storedJournal(_ path: String) async -> UInt64 {
        guard let queue = try? readOnly(path) else { return 0 }
        defer { try? queue.close() }
        return (try? await queue.read { db in try Int64.fetchOne(db, sql: "SELECT value FROM cursors WHERE name = 'journal'") }).flatMap { $0 }.map(UInt64.init) ?? 0
    }

    /// Whether stats has stored everything its sources hold: the journal and each event journal.
    static func caughtUp(_ path: String, client: BusClient) async -> Bool {
        var expected: [String: UInt64] = [:]
        for service in [ServiceName.ingest, .trips, .scorer, .geofence, .checkout] {
            guard let health = try? await client.call(service, RPCRequestHead(op: "health"), as: HealthReply.self, timeout: .milliseconds(500)) else {
                return false
            }
            if service == .ingest {
                expected["journal"] = health.lastSeq["journal"] ?? 0
            } else {
                expected["events.\(service.rawValue)"] = health.lastSeq["events"] ?? 0
            }
        }
        guard let queue = try? readOnly(path) else { return false }
        defer { try? queue.close() }
        let cursors = (try? await queue.read { db in
            Dictionary(uniqueKeysWithValues: try Row.fetchAll(db, sql: "SELECT name, value FROM cursors").map { ($0["name"] as String, UInt64($0["value"] as Int64)) })
        }) ?? [:]
        return expected.allSatisfy { name, seq in seq == 0 || cursors[name] == seq }
    }

    @Test func statsKilledAtRandomMomentsEndsWithTheRowsOfAnUndisturbedRun() async throws {
        let dir = TempDir()
        let receiver = try WebhookReceiver()
        let ports = freePorts(2)
        let (carToken, riderToken) = ("car-token-0123456789", "rider-token-0123456789")
        let yaml = """
            state_dir: \(dir.path)/state
            heartbeat_interval_s: 0.2
            zones:
              - {id: home, circle: {lat: 48.1230487, lon: 16.6098346, radius_m: 200}}
              - {id: gate, circle: {lat: 48.2, lon: 16.37, radius_m: 40}}
            devices: [{id: car, token: \(carToken), home: home}, {id: rider, token: \(riderToken)}]
            gates: [{id: main-gate, zone: gate, devices: [car], webhook: {url: "\(receiver.url)"}}]
            ingest: {listen: "127.0.0.1:\(ports[0])"}
            stats: {listen: "127.0.0.1:\(ports[1])"}
            """
        let path = dir.file("drivebus.yaml", yaml)
        let config = try DrivebusConfig.parse(yaml: yaml)
        let database = config.layout.dataDir + "/drivebus.sqlite"
        let base = "http://127.0.0.1:\(ports[0])"
        let others = try ["bus", "ingest", "trips", "geofence", "checkout", "scorer"].map { try Child("drivebus-\($0)", ["--config", path]) }
        var stats = try Child("drivebus-stats", ["--config", path])
        #expect(await eventually(within: .seconds(20)) { (try? await http("GET", base + "/healthz").status) == 200 })
        for service in [ServiceName.geofence, .checkout, .trips, .scorer, .stats] { try await waitUntilLive(service, config: config) }

        // The killer: SIGKILL at seeded random points of the import (when stats has stored so
        // many journal records), a restart right after each.
        var random = SplitMix64(seed: 13)
        let killPoints = (0..<6).map { _ in UInt64(1 + random.unit() * 1500) }.sorted()
        let killer = Task { [stats] in
            var current = stats
            for point in killPoints {
                _ = await eventually(within: .seconds(30)) { await Self.storedJournal(database) >= point }
                current.signal(SIGKILL)
                _ = try await current.exitStatus()
                current = try Child("drivebus-stats", ["--config", path])
            }
            return current
        }

        // A real drive from home, imported: a trip, its score, the exit from home.
        let gpx = fixtures.appendingPathComponent("car_vienna_osm_1hz.gpx").path
        let imported = try await run("drivebus", ["import", "--config", path, "--device", "car", gpx])
        #expect(imported.status == 0, "\(imported.stderr)")
        stats = try await killer.value
        let client = BusClient(settings: config.process, name: "test-crash")
        // Then stats is down for good while the car passes the gate and the rider gets out, so
        // that every one of those events reaches it only through a replay.
        stats.signal(SIGKILL)
        _ = try await stats.exitStatus()
        // The car drives through the gate zone now: enter, exit, and one gate call.
        let now = (Date().timeIntervalSince1970).rounded(.down)
        let gateFixes = (0...16).map { index -> String in
            let north = -80 + Double(index) * 10
            return #"{"time":"\#(RFC3339.format(Date(timeIntervalSince1970: now - Double(16 - index))))","lat":\#(48.2 + north / 111_195),"lon":16.37,"speed_mps":10}"#
        }
        #expect(try await http("POST", base + "/api/v1/fixes", token: carToken, body: Data(#"{"fixes":[\#(gateFixes.joined(separator: ","))]}"#.utf8)).status == 200)
        // A taxi ride and the walk away, an hour ago: one check-out, decided by the second walking
        // sample (it proves the walk lasted the lead time) rather than by wall-clock silence.
        let checkin = Date(timeIntervalSince1970: (now / 60).rounded(.down) * 60 - 3600)
        func at(_ seconds: Double) -> String { RFC3339.format(checkin.addingTimeInterval(seconds)) }
        #expect(try await http("POST", base + "/api/v1/taxi/checkin", token: riderToken, body: Data(#"{"time":"\#(at(0))"}"#.utf8)).status == 200)
        let rideFixes = (0..<10).map { #"{"time":"\#(at(Double($0) * 100))","lat":\#(48.3 + Double($0) * 0.005),"lon":16.5,"speed_mps":12}"# }
        #expect(try await http("POST", base + "/api/v1/fixes", token: riderToken, body: Data(#"{"fixes":[\#(rideFixes.joined(separator: ","))]}"#.utf8)).status == 200)
        let motion = #"{"samples":[{"start":"\#(at(20))","activity":"automotive","confidence":"high"},{"start":"\#(at(900))","activity":"walking","confidence":"high"},{"start":"\#(at(1000))","activity":"walking","confidence":"high"}]}"#
        #expect(try await http("POST", base + "/api/v1/motion", token: riderToken, body: Data(motion.utf8)).status == 200)

        func events(of service: ServiceName) async -> UInt64 {
            (try? await client.call(service, RPCRequestHead(op: "health"), as: HealthReply.self, timeout: .milliseconds(500)))?.lastSeq["events"] ?? 0
        }
        #expect(await eventually(within: .seconds(20)) {
            let (checkouts, geofence) = (await events(of: .checkout), await events(of: .geofence))
            return receiver.received.count == 1 && checkouts == 1 && geofence >= 3
        }, "the gate call and the check-out did not happen while stats was down")
        stats = try Child("drivebus-stats", ["--config", path])
        // Its signal handlers are installed once it answers.
        try await waitUntilLive(.stats, config: config)
        // Everything the flow causes has happened, and stats has stored all of it.
        #expect(await eventually(within: .seconds(30)) {
            guard receiver.received.count == 1, await Self.caughtUp(database, client: client),
                  let rows = try? Self.snapshot(database) else { return false }
            return rows["trips"]?.isEmpty == false && rows["scores"]?.isEmpty == false && rows["gate_calls"]?.count == 1
                && rows["checkouts"]?.count == 1 && (rows["geofence_transitions"]?.count ?? 0) >= 3
        }, "stats did not store the whole flow")
        stats.signal(SIGTERM)
        #expect(try await stats.exitStatus() == 0, "\(stats.stderr)")
        let killed = try Self.snapshot(database)
        #expect(killed["fixes"]?.count == 1525 + gateFixes.count + rideFixes.count)

        // The undisturbed run: the same history into an empty database.
        for suffix in ["", "-wal", "-shm"] { try? FileManager.default.removeItem(atPath: database + suffix) }
        let fresh = try Child("drivebus-stats", ["--config", path])
        #expect(await eventually(within: .seconds(30)) { await Self.caughtUp(database, client: client) })
        fresh.signal(SIGTERM)
        #expect(try await fresh.exitStatus() == 0, "\(fresh.stderr)")
        let undisturbed = try Self.snapshot(database)
        for table in undisturbed.keys.sorted() {
            let (a, b) = (killed[table] ?? [], undisturbed[table] ?? [])
            #expect(a == b, "\(table): \(a.count) rows after the kills, \(b.count) undisturbed; differing: \(Set(a).symmetricDifference(b).prefix(4))")
        }
        #expect(receiver.received.count == 1, "the gate was called \(receiver.received.count) times")

        await client.shutdown()
        for child in others.reversed() { child.signal(SIGTERM) }
        for child in others.reversed() { #expect(try await child.exitStatus() == 0, "\(child.stderr)") }
    }
}
