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

private final class Ended: Sendable {
    let flag = Atomic<Bool>(false)
}
