import DrivebusConfiguration
import DrivebusKit
import DrivebusTestSupport
import Foundation
import Logging
import Synchronization
import Testing

@Suite struct StreamFollowerTests {
    /// A follower is cancelled when a task beside it fails, so that its service exits and is
    /// restarted. With its source down, every request and pause then ends at once: it must end
    /// too, not retry for ever on a core (two orphaned stats processes did, at 100 % each).
    @Test func aCancelledFollowerWhoseSourceIsDownEnds() async throws {
        let dir = TempDir()
        let config = try DrivebusConfig.parse(yaml: "state_dir: \(dir.path)/state")
        try FileManager.default.createDirectory(atPath: config.layout.runDir, withIntermediateDirectories: true)
        let bus = BusClient(settings: config.process, name: "test")
        let ended = Ended()
        let following = Task {
            defer { ended.flag.store(true, ordering: .releasing) }
            try await StreamFollower(source: .journal, bus: bus, logger: Logger(label: "test")).run(from: 0) { _, _ in }
        }
        following.cancel()
        let endedInTime = await eventually(within: .seconds(20)) { ended.flag.load(ordering: .acquiring) }
        #expect(endedInTime, "the cancelled follower was still retrying after 20 s")
        await bus.shutdown()
    }
}

extension StreamFollowerTests {
    /// The catch-up at start is held like any replay: a consumer's wall-clock ticks wait until
    /// the backlog is applied, rather than judge a ride's silence between its records.
    @Test func theCatchUpIsHeldLikeAnyReplay() async throws {
        let dir = TempDir()
        let (path, config, ingestPort, _) = try testSystem(dir, "state")
        let children = try ["drivebus-bus", "drivebus-ingest"].map { try Child($0, ["--config", path]) }
        defer { for child in children { child.signal(SIGKILL) } }
        try await waitUntilLive(.ingest, config: config)
        let fixes = (0..<50).map { #"{"time":"\#(RFC3339.format(Date(timeIntervalSince1970: 1_763_000_000 + Double($0))))","lat":48.2,"lon":\#(16.3 + Double($0) * 1e-4)}"# }
        let posted = try await http("POST", "http://127.0.0.1:\(ingestPort)/api/v1/fixes", token: "car-token-0123456789", body: Data(#"{"fixes":[\#(fixes.joined(separator: ","))]}"#.utf8))
        #expect(posted.status == 200, "\(posted.body)")

        let steps = Mutex<[String]>([])
        let bus = BusClient(settings: config.process, name: "test")
        let following = Task {
            try await StreamFollower(source: .journal, bus: bus, logger: Logger(label: "test")).run(
                from: 0, hold: { held in steps.withLock { $0.append(held ? "hold" : "release") } }
            ) { records, live in steps.withLock { $0.append("\(live ? "live" : "replayed") \(records.count)") } }
        }
        #expect(await eventually(within: .seconds(20)) { steps.withLock { $0.contains("release") } })
        following.cancel()
        _ = try? await following.value
        await bus.shutdown()
        // Held before the backlog's first record, released after its last.
        let seen = steps.withLock { $0 }
        #expect(seen.first == "hold", "\(seen)")
        let released = try #require(seen.firstIndex(of: "release"))
        let replayed = seen[..<released].compactMap { $0.hasPrefix("replayed ") ? Int($0.dropFirst(9)) : nil }
        #expect(replayed.reduce(0, +) == 50, "\(seen)")
    }
}

private final class Ended: Sendable {
    let flag = Atomic<Bool>(false)
}
