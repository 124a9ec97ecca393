import DrivebusConfiguration
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
        let ports = freePorts(2)
        let yaml = """
            state_dir: \(dir.path)/\(name)
            heartbeat_interval_s: 0.2
            devices: [{id: car, token: car-token-0123456789}]
            ingest: {listen: "127.0.0.1:\(ports[0])"}
            stats: {listen: "127.0.0.1:\(ports[1])"}
            """
        return (dir.file("\(name).yaml", yaml), try DrivebusConfig.parse(yaml: yaml), ports[0], ports[1])
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
        try await waitUntilLive(.stats, config: original.config)
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

/// The records of a journal: its segments' bytes, in seq order.
private func segmentBytes(_ directory: String) throws -> Data {
    let names = try FileManager.default.contentsOfDirectory(atPath: directory).filter { $0.hasSuffix(".seg") }.sorted()
    return try names.reduce(into: Data()) { $0 += try Data(contentsOf: URL(fileURLWithPath: directory + "/" + $1)) }
}
