import ArgumentParser
import DrivebusConfiguration
import DrivebusKit
import DrivebusTestSupport
import Foundation
import Synchronization

/// `drivebus-bench ingest`: the real `drivebus-bus` and `drivebus-ingest` (release builds beside
/// this executable), a temporary state directory, and HTTP load from threads of this process.
/// - `ingest overland`: Overland batches of 200, end to end: POST, durable in the journal, and
///   received by a subscriber on the bus; fixes/s from the first POST to the last fix received.
/// - `ingest owntracks`: single-fix OwnTracks POSTs over 16 keep-alive connections; requests/s.
struct IngestBench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "ingest", abstract: "Measure ingest end to end over HTTP.")

    @Option(help: "Fixes in the Overland case.")
    var fixes = 100_000

    @Option(help: "Fixes per Overland batch.")
    var batchSize = 200

    @Option(help: "Connections posting Overland batches.")
    var overlandConnections = 8

    @Option(help: "Requests in the OwnTracks case.")
    var requests = 20_000

    @Option(help: "Connections posting OwnTracks fixes.")
    var connections = 16

    func run() async throws {
        let token = "bench-token-0123456789"
        let system = try await BenchSystem(services: [.bus, .ingest], extraConfig: "devices: [{id: car, token: \(token)}]")
        defer { system.stop() }
        let port = system.port
        let client = BusClient(settings: system.config.process, name: "bench")
        var messages = try await client.subscribe(["fix.", "svc.heartbeat.ingest"]).makeAsyncIterator()
        while let message = await messages.next(), message.topic != "svc.heartbeat.ingest" {}

        // Overland, end to end.
        let start = 1_763_000_000.0
        let bodies: [[UInt8]] = stride(from: 0, to: fixes, by: batchSize).map { first in
            let features = (first..<min(first + batchSize, fixes)).map { index in
                let time = RFC3339.format(Date(timeIntervalSince1970: start + Double(index)))
                return #"{"type":"Feature","geometry":{"type":"Point","coordinates":[\#(16.3 + Double(index) * 1e-6),48.2]},"properties":{"timestamp":"\#(time)","speed":13.4,"horizontal_accuracy":5,"altitude":180,"battery_level":0.8,"motion":["driving"]}}"#
            }
            return Array(#"{"locations":["#.utf8) + Array(features.joined(separator: ",").utf8) + Array("]}".utf8)
        }
        let auth = ("Authorization", "Bearer \(token)")
        let started = ContinuousClock.now
        let posting = Task.detached { [overlandConnections] in
            try HTTPConnection.load(port: port, connections: overlandConnections, bodies: bodies, path: "/overland", headers: [auth, ("Content-Type", "application/json")])
        }
        var received = 0
        while received < fixes, let message = await messages.next() {
            if message.topic == "fix.car" { received += 1 }
        }
        let endToEnd = seconds(started.duration(to: .now))
        let acknowledged = try await posting.value
        report(["name": "ingest overland", "fixes": fixes, "batch": batchSize, "connections": overlandConnections,
                "fixes_per_s": Int(Double(fixes) / endToEnd), "acked_fixes_per_s": Int(Double(fixes) / acknowledged)])

        // OwnTracks, one fix per request.
        let single: [[UInt8]] = (0..<requests).map { index in
            Array(#"{"_type":"location","lat":48.2,"lon":\#(16.3 + Double(index) * 1e-6),"tst":\#(Int(start) + fixes + index),"acc":5,"vel":48,"batt":80,"tid":"cr"}"#.utf8)
        }
        let owntracks = try await Task.detached { [connections] in
            try HTTPConnection.load(port: port, connections: connections, bodies: single, path: "/owntracks", headers: [auth, ("Content-Type", "application/json")])
        }.value
        report(["name": "ingest owntracks", "requests": requests, "connections": connections, "requests_per_s": Int(Double(requests) / owntracks)])
        await client.shutdown()
    }
}

/// The real executables (release builds beside this one) on a temporary state directory, with
/// ingest on a random loopback port.
final class BenchSystem {
    let directory: String
    let port: Int
    let config: DrivebusConfig
    private var processes: [Process] = []

    /// `prepare` runs after the config is written and before any process starts: to lay a state
    /// directory that the services then open.
    init(services: [ServiceName], extraConfig: String, prepare: ((DrivebusConfig) async throws -> Void)? = nil) async throws {
        var template = Array("/tmp/dbb-XXXXXX".utf8CString)
        directory = template.withUnsafeMutableBufferPointer { String(cString: mkdtemp($0.baseAddress!)!) }
        // Outside the ephemeral range, so that no connection of ours can hold it first.
        port = freePort()
        let yaml = """
            state_dir: \(directory)/state
            log_level: warning
            ingest: {listen: "127.0.0.1:\(port)"}
            \(extraConfig)
            """
        let path = directory + "/drivebus.yaml"
        try yaml.write(toFile: path, atomically: true, encoding: .utf8)
        config = try DrivebusConfig.parse(yaml: yaml)
        try await prepare?(config)
        for service in services { try launch(service) }
        // A service that exited (a port taken, a bad config), or never answers, would otherwise be
        // waited for forever.
        let started = ContinuousClock.now
        func giveUpIfStuck(_ waitingFor: String, within limit: Duration) throws {
            if let dead = processes.first(where: { !$0.isRunning }) {
                stop()
                throw ValidationError("\(dead.executableURL!.lastPathComponent) exited at start with status \(dead.terminationStatus)")
            }
            if ContinuousClock.now > started + limit {
                stop()
                throw ValidationError("\(waitingFor) within \(limit)")
            }
        }
        while (try? HTTPConnection(port: port).send(method: "GET", path: "/healthz", headers: [], body: [])) != 200 {
            try giveUpIfStuck("drivebus-ingest did not answer on port \(port)", within: .seconds(60))
            try await Task.sleep(for: .milliseconds(50))
        }
        // Wait until every journal consumer is live.
        let client = BusClient(settings: config.process, name: "bench-wait")
        do {
            for service in services where service != .bus && service != .ingest {
                while (try? await client.call(service, RPCRequestHead(op: "health"), as: HealthReply.self, timeout: .milliseconds(500)))?.status != "ok" {
                    try giveUpIfStuck("\(service.executable) was not live", within: .seconds(120))
                    try await Task.sleep(for: .milliseconds(50))
                }
            }
        } catch {
            await client.shutdown()
            throw error
        }
        await client.shutdown()
    }

    /// Starts one more service on the same config, without waiting for it.
    func launch(_ service: ServiceName) throws {
        processes.append(try Process.run(URL(fileURLWithPath: Self.binDirectory + "/" + service.executable), arguments: ["--config", configPath]))
    }

    /// Where drivebus-bench is, and the executables built with it.
    static var binDirectory: String {
        URL(fileURLWithPath: (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")) ?? CommandLine.arguments[0])
            .deletingLastPathComponent().path
    }

    var configPath: String { directory + "/drivebus.yaml" }

    /// Each process's peak resident memory so far (VmHWM), in MB, by executable name.
    func peakRSSMegabytes() -> [String: Double] {
        Dictionary(uniqueKeysWithValues: processes.map {
            ($0.executableURL!.lastPathComponent, ImportBench.peakRSSMegabytes(status: "/proc/\($0.processIdentifier)/status") ?? -1)
        })
    }

    /// The processes' executable names and ids.
    var processIDs: [(name: String, id: Int32)] { processes.map { ($0.executableURL!.lastPathComponent, $0.processIdentifier) } }

    /// CPU seconds (user + system) each process has used so far, by executable name.
    func cpuSeconds() -> [String: Double] {
        Dictionary(uniqueKeysWithValues: processes.map { ($0.executableURL!.lastPathComponent, cpuSecondsOf($0.processIdentifier)) })
    }

    func stop() {
        for process in processes.reversed() { process.terminate() }
        for process in processes { process.waitUntilExit() }
        try? FileManager.default.removeItem(atPath: directory)
    }
}
