import DrivebusTestSupport
import Foundation
import Testing

/// The target graph, read from `swift package dump-package`, keeps its layers pointing one way.
@Suite struct LayeringTests {
    struct Target {
        let name: String
        let path: String
        let dependencies: [String]
    }

    /// Every target of the package, with the names of the targets and products it depends on.
    static func targets() async throws -> [String: Target] {
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent().path
        // A scratch path of its own: the test run holds the lock on the package's `.build`. One
        // per call: the suite's two tests run concurrently, and with one shared path a call that
        // finished removed it under the other, whose JSON then ended early (seen twice on CI).
        let scratch = NSTemporaryDirectory() + "drivebus-dump-" + UUID().uuidString
        defer { try? FileManager.default.removeItem(atPath: scratch) }
        // Into a file: whole once the command has exited, whatever the pipes do.
        let output = scratch + ".json"
        defer { try? FileManager.default.removeItem(atPath: output) }
        // SwiftPM leaves a lock file for the scratch path in TMPDIR: a folder of ours, removed.
        let temporary = TempDir()
        let result = try await run(
            "/bin/sh", ["-c", #"exec swift package --scratch-path "$1" dump-package > "$2""#, "sh", scratch, output], cwd: root,
            environment: ProcessInfo.processInfo.environment.merging(["TMPDIR": temporary.path]) { $1 })
        try #require(result.status == 0, "dump-package failed: \(result.stderr)")
        let manifest = try #require(try JSONSerialization.jsonObject(with: Data(contentsOf: URL(fileURLWithPath: output))) as? [String: Any])
        let entries = try #require(manifest["targets"] as? [[String: Any]])
        var targets: [String: Target] = [:]
        for entry in entries {
            let name = try #require(entry["name"] as? String)
            let dependencies = (entry["dependencies"] as? [[String: Any]] ?? []).compactMap { dependency -> String? in
                // {"byName": [name, nil]}, {"target": [name, nil]} or {"product": [name, package, …]}
                (dependency.values.first as? [Any])?.first as? String
            }
            targets[name] = Target(name: name, path: entry["path"] as? String ?? "", dependencies: dependencies)
        }
        return targets
    }

    /// Everything `name` depends on, directly or through other targets of the package.
    static func closure(of name: String, in targets: [String: Target]) -> Set<String> {
        var seen = Set<String>()
        var stack = targets[name]?.dependencies ?? []
        while let next = stack.popLast() {
            guard seen.insert(next).inserted else { continue }
            stack += targets[next]?.dependencies ?? []
        }
        return seen
    }

    @Test func sharedDependsOnNoServiceAndCoresOnNoIOLibrary() async throws {
        let targets = try await Self.targets()
        #expect(targets.count > 20, "the manifest was not read")
        let services = Set(targets.values.filter { $0.path.hasPrefix("Services/") }.map(\.name))
        for target in targets.values where target.path.hasPrefix("Shared/") {
            let reached = Self.closure(of: target.name, in: targets).intersection(services)
            #expect(reached.isEmpty, "\(target.name) (Shared) depends on service targets \(reached.sorted())")
        }
        let io = ["GRDB", "GRDBSQLite", "Hummingbird", "HummingbirdTesting", "AsyncHTTPClient", "Crypto"]
        let cores = targets.values.filter { $0.name.hasSuffix("Core") }
        #expect(cores.count >= 6)
        for core in cores {
            let reached = Self.closure(of: core.name, in: targets)
            let bad = reached.filter { io.contains($0) || $0.hasPrefix("NIO") || $0 == "DrivebusKit" || $0 == "DrivebusZMQ" }
            #expect(bad.isEmpty, "\(core.name) depends on \(bad.sorted())")
        }
    }

    @Test func theModelsDependOnNothingOfOursAndTheBusWrapperOnLibzmqOnly() async throws {
        let targets = try await Self.targets()
        #expect(targets["DrivebusSchema"]?.dependencies == [])
        #expect(targets["DrivebusGeo"]?.dependencies == [])
        let zmq = Set(targets["DrivebusZMQ"]?.dependencies ?? ["missing"])
        // Beside libzmq and our C helpers, only a data structure (the loop's timer heap).
        #expect(zmq.isSubset(of: ["CZMQ", "CDrivebusSupport", "HeapModule"]))
    }
}
