import ArgumentParser
import DrivebusConfiguration
import DrivebusKit
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

    init(services: [ServiceName], extraConfig: String) async throws {
        var template = Array("/tmp/dbb-XXXXXX".utf8CString)
        directory = template.withUnsafeMutableBufferPointer { String(cString: mkdtemp($0.baseAddress!)!) }
        port = Int.random(in: 30_000..<50_000)
        let yaml = """
            state_dir: \(directory)/state
            log_level: warning
            ingest: {listen: "127.0.0.1:\(port)"}
            \(extraConfig)
            """
        let path = directory + "/drivebus.yaml"
        try yaml.write(toFile: path, atomically: true, encoding: .utf8)
        config = try DrivebusConfig.parse(yaml: yaml)
        let binDirectory = URL(fileURLWithPath: (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")) ?? CommandLine.arguments[0]).deletingLastPathComponent().path
        for service in services {
            processes.append(try Process.run(URL(fileURLWithPath: binDirectory + "/" + service.executable), arguments: ["--config", path]))
        }
        while (try? HTTPConnection(port: port).send(method: "GET", path: "/healthz", headers: [], body: [])) != 200 {
            try await Task.sleep(for: .milliseconds(50))
        }
        // Wait until every journal consumer is live.
        let client = BusClient(settings: config.process, name: "bench-wait")
        for service in services where service != .bus && service != .ingest {
            while (try? await client.call(service, RPCRequestHead(op: "health"), as: HealthReply.self, timeout: .milliseconds(500)))?.status != "ok" {
                try await Task.sleep(for: .milliseconds(50))
            }
        }
        await client.shutdown()
    }

    func stop() {
        for process in processes.reversed() { process.terminate() }
        for process in processes { process.waitUntilExit() }
        try? FileManager.default.removeItem(atPath: directory)
    }
}

/// A blocking HTTP/1.1 keep-alive connection, enough to load a server from dedicated threads.
final class HTTPConnection {
    private let fd: Int32

    init(port: Int) throws {
        fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = UInt16(port).bigEndian
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        var one: Int32 = 1
        setsockopt(fd, Int32(IPPROTO_TCP), TCP_NODELAY, &one, socklen_t(MemoryLayout<Int32>.size))
        let rc = withUnsafePointer(to: &address) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) } }
        guard rc == 0 else {
            close(fd)
            throw POSIXError(.ECONNREFUSED)
        }
    }

    deinit { close(fd) }

    /// Sends one request and reads the whole response; returns its status.
    func send(method: String, path: String, headers: [(String, String)], body: [UInt8]) throws -> Int {
        var head = "\(method) \(path) HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: \(body.count)\r\n"
        for (name, value) in headers { head += "\(name): \(value)\r\n" }
        let request = Array((head + "\r\n").utf8) + body
        var sent = 0
        while sent < request.count {
            let n = request.withUnsafeBytes { Glibc.send(fd, $0.baseAddress! + sent, $0.count - sent, 0) }
            guard n > 0 else { throw POSIXError(.EPIPE) }
            sent += n
        }
        var response: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 16_384)
        while true {
            let n = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            guard n > 0 else { throw POSIXError(.ECONNRESET) }
            response += buffer[0..<n]
            guard let end = response.firstRange(of: Array("\r\n\r\n".utf8)) else { continue }
            let headText = String(decoding: response[..<end.lowerBound], as: UTF8.self).lowercased()
            let length = headText.split(separator: "\r\n").first { $0.hasPrefix("content-length:") }
                .flatMap { Int($0.dropFirst("content-length:".count).trimmingCharacters(in: .whitespaces)) } ?? 0
            if response.count - end.upperBound >= length {
                return Int(headText.split(separator: " ")[1])!
            }
        }
    }

    /// Posts every body, spread over `connections` threads; returns the seconds it took. Fails if
    /// any answer is not 200.
    static func load(port: Int, connections: Int, bodies: [[UInt8]], path: String, headers: [(String, String)]) throws -> Double {
        let next = Atomic<Int>(0)
        let failures = Atomic<Int>(0)
        let group = DispatchGroup()
        let started = ContinuousClock.now
        for _ in 0..<connections {
            group.enter()
            Thread {
                defer { group.leave() }
                guard let connection = try? HTTPConnection(port: port) else { failures.add(1, ordering: .relaxed); return }
                while true {
                    let index = next.add(1, ordering: .relaxed).oldValue
                    guard index < bodies.count else { return }
                    if (try? connection.send(method: "POST", path: path, headers: headers, body: bodies[index])) != 200 {
                        failures.add(1, ordering: .relaxed)
                    }
                }
            }.start()
        }
        group.wait()
        let elapsed = seconds(started.duration(to: .now))
        guard failures.load(ordering: .relaxed) == 0 else { throw POSIXError(.EIO) }
        return elapsed
    }
}
