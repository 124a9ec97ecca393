import Synchronization
import DrivebusConfiguration
import DrivebusKit
import Foundation

/// A fresh directory under /tmp with a short path, so ipc socket paths stay under 107 bytes.
public final class TempDir {
    public let path: String

    public init() {
        var template = Array("/tmp/dbt-XXXXXX".utf8CString)
        path = template.withUnsafeMutableBufferPointer { String(cString: mkdtemp($0.baseAddress!)!) }
    }

    public func file(_ name: String, _ contents: String) -> String {
        let full = path + "/" + name
        _ = FileManager.default.createFile(atPath: full, contents: Data(contents.utf8))
        return full
    }

    deinit { try? FileManager.default.removeItem(atPath: path) }
}

/// Where the built executables are: `$DRIVEBUS_BIN_DIR`, or beside the test bundle, which is
/// where `swift build` puts them.
public let binDirectory: String = {
    if let dir = ProcessInfo.processInfo.environment["DRIVEBUS_BIN_DIR"] { return dir }
    let exe = (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")) ?? CommandLine.arguments[0]
    var url = URL(fileURLWithPath: exe).deletingLastPathComponent()
    // The bundle may be a directory (macOS-style) or the executable itself (Linux).
    while !FileManager.default.isExecutableFile(atPath: url.appendingPathComponent("drivebus").path) && url.path != "/" {
        url.deleteLastPathComponent()
    }
    return url.path
}()

/// A child process with captured output.
public final class Child: @unchecked Sendable {
    public let process = Process()
    private let out = Pipe()
    private let err = Pipe()
    private let lock = NSLock()
    private var stdoutData = Data()
    private var stderrData = Data()
    /// Streams that have reached end of file: once both have, every byte the child wrote is here.
    private var closedStreams = 0

    public init(_ executable: String, _ arguments: [String], cwd: String? = nil, environment: [String: String]? = nil) throws {
        process.executableURL = URL(fileURLWithPath: executable.hasPrefix("/") ? executable : binDirectory + "/" + executable)
        process.arguments = arguments
        if let cwd { process.currentDirectoryURL = URL(fileURLWithPath: cwd) }
        if let environment { process.environment = environment }
        process.standardOutput = out
        process.standardError = err
        try process.run()
        // A thread per stream, reading until end of file. Not readability handlers: their
        // dispatch sources outlive the pipe when a child is replaced, and libdispatch then
        // crashed the test process on an fd number that a new pipe had taken.
        for (handle, buffer) in [(out.fileHandleForReading, \Child.stdoutData), (err.fileHandleForReading, \Child.stderrData)] {
            // Weakly: a child dropped without being stopped is killed by `deinit`, which ends the streams.
            Thread { [weak self] in
                while true {
                    let data = handle.availableData
                    guard let self else { return }
                    let ended = lock.withLock {
                        if data.isEmpty { closedStreams += 1 } else { self[keyPath: buffer].append(data) }
                        return data.isEmpty
                    }
                    if ended { return }
                }
            }.start()
        }
    }

    public var pid: Int32 { process.processIdentifier }
    public var stdout: String { lock.withLock { String(decoding: stdoutData, as: UTF8.self) } }
    public var stderr: String { lock.withLock { String(decoding: stderrData, as: UTF8.self) } }

    public func signal(_ signal: Int32) { kill(process.processIdentifier, signal) }

    /// Waits for the process to exit, polling so no thread is blocked.
    public func exitStatus(within timeout: Duration = .seconds(30)) async throws -> Int32 {
        let deadline = ContinuousClock.now + timeout
        while process.isRunning {
            guard ContinuousClock.now < deadline else {
                signal(SIGKILL)
                throw Timeout(description: "\(process.executableURL!.lastPathComponent) did not exit within \(timeout); stderr:\n\(stderr)")
            }
            try await Task.sleep(for: .milliseconds(20))
        }
        // The last bytes may still be in the pipes: wait until both report end of file. A
        // grandchild that kept a pipe open would hold it for ever, so that wait has a limit.
        let drained = ContinuousClock.now + .seconds(5)
        while lock.withLock({ closedStreams < 2 }), ContinuousClock.now < drained {
            try await Task.sleep(for: .milliseconds(5))
        }
        return process.terminationStatus
    }

    deinit {
        if process.isRunning { kill(process.processIdentifier, SIGKILL) }
    }
}

/// Runs a command to completion.
public func run(_ executable: String, _ arguments: [String], cwd: String? = nil, environment: [String: String]? = nil) async throws -> (status: Int32, stdout: String, stderr: String) {
    let child = try Child(executable, arguments, cwd: cwd, environment: environment)
    let status = try await child.exitStatus()
    return (status, child.stdout, child.stderr)
}

/// True while `pid` is a live process (a zombie left for a reaper counts as gone).
public func isAlive(_ pid: Int32) -> Bool {
    guard let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8) else { return false }
    // The state is the field after the parenthesised command name.
    guard let close = stat.lastIndex(of: ")") else { return false }
    let state = stat[stat.index(close, offsetBy: 2)]
    return state != "Z" && state != "X"
}

/// Polls `condition`, `every` so often, until it holds or `timeout` passes.
public func eventually(within timeout: Duration = .seconds(10), every interval: Duration = .milliseconds(50), _ condition: () async throws -> Bool) async rethrows -> Bool {
    let deadline = ContinuousClock.now + timeout
    while ContinuousClock.now < deadline {
        if try await condition() { return true }
        try? await Task.sleep(for: interval)
    }
    return try await condition()
}

/// A real HTTP server on 127.0.0.1 that records what it receives and answers as scripted:
/// each request takes the next status from `statuses` (the last one repeats); `nil` means hang
/// without answering until the receiver stops.
public final class WebhookReceiver: @unchecked Sendable {
    public struct Received: Sendable {
        public let method: String
        public let path: String
        public let headers: [String: String]
        public let body: String
        public let at: Date
        /// When it arrived, for latencies.
        public let instant: ContinuousClock.Instant
    }

    public let port: Int
    private let listener: Int32
    private let lock = NSLock()
    private var requests: [Received] = []
    private var statuses: [Int?]
    private var stopped = false

    /// - Parameter port: 0 for any free port; a given port lets a test bring a receiver back
    ///   where the old one was.
    public init(statuses: [Int?] = [200], port fixedPort: Int = 0) throws {
        self.statuses = statuses
        let listener = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        self.listener = listener
        var one: Int32 = 1
        setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size))
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        address.sin_port = UInt16(fixedPort).bigEndian
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafeMutablePointer(to: &address) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(listener, $0, length) } }
        guard bound == 0 else {
            close(listener)
            throw POSIXError(.EADDRINUSE)
        }
        _ = withUnsafeMutablePointer(to: &address) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(listener, $0, &length) } }
        port = Int(UInt16(bigEndian: address.sin_port))
        listen(listener, 64)
        Thread { [self] in serve() }.start()
    }

    public var url: String { "http://127.0.0.1:\(port)/open" }
    public var received: [Received] { lock.withLock { requests } }

    public func script(_ statuses: [Int?]) { lock.withLock { self.statuses = statuses } }

    /// Wakes the accepting thread, which closes the socket itself: closing it here could hand
    /// its descriptor number to the next receiver while the old thread still accepts on it.
    public func stop() {
        let first = lock.withLock { () -> Bool in
            defer { stopped = true }
            return !stopped
        }
        if first { shutdown(listener, Int32(SHUT_RDWR)) }
    }

    deinit { stop() }

    private func serve() {
        while true {
            let connection = accept(listener, nil, nil)
            if lock.withLock({ stopped }) {
                if connection >= 0 { close(connection) }
                close(listener)
                return
            }
            guard connection >= 0 else { continue }
            Thread { [self] in handle(connection) }.start()
        }
    }

    private func handle(_ connection: Int32) {
        defer { close(connection) }
        var data: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 65_536)
        while true {
            let n = buffer.withUnsafeMutableBytes { recv(connection, $0.baseAddress, $0.count, 0) }
            guard n > 0 else { return }
            data += buffer[0..<n]
            guard let end = data.firstRange(of: Array("\r\n\r\n".utf8)) else { continue }
            let head = String(decoding: data[..<end.lowerBound], as: UTF8.self).components(separatedBy: "\r\n")
            var headers: [String: String] = [:]
            for line in head.dropFirst() {
                guard let colon = line.firstIndex(of: ":") else { continue }
                headers[line[..<colon].lowercased()] = line[line.index(after: colon)...].trimmingCharacters(in: .whitespaces)
            }
            let length = Int(headers["content-length"] ?? "0") ?? 0
            guard data.count - end.upperBound >= length else { continue }
            let parts = head[0].split(separator: " ")
            let request = Received(
                method: String(parts[0]), path: parts.count > 1 ? String(parts[1]) : "", headers: headers,
                body: String(decoding: data[end.upperBound..<(end.upperBound + length)], as: UTF8.self), at: Date(), instant: .now)
            let status: Int? = lock.withLock {
                requests.append(request)
                return statuses.count > 1 ? statuses.removeFirst() : statuses.first ?? 200
            }
            guard let status else {
                // Hang: hold the connection open until the receiver stops.
                while !lock.withLock({ stopped }) { usleep(20_000) }
                return
            }
            let reply = "HTTP/1.1 \(status) Status\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            _ = reply.withCString { send(connection, $0, strlen($0), 0) }
            return
        }
    }
}

/// Waits until `service` answers `health` with `ok`: started and caught up with the journal, so
/// that what is sent from now on reaches it live. The deadline is generous because CI starts every
/// suite's processes at once on two cores; a timeout says what the service last answered.
/// `child`, when given, is the service's process: a timeout then quotes the end of its log.
public func waitUntilLive(_ service: ServiceName, config: DrivebusConfig, within timeout: Duration = .seconds(60), child: Child? = nil) async throws {
    let client = BusClient(settings: config.process, name: "test-wait")
    let last = Mutex("no answer yet")
    let live = await eventually(within: timeout) {
        do {
            let reply = try await client.call(service, RPCRequestHead(op: "health"), as: HealthReply.self, timeout: .seconds(1))
            last.withLock { $0 = "status \(reply.status), last_seq \(reply.lastSeq)" }
            return reply.status == "ok"
        } catch {
            last.withLock { $0 = "\(error)" }
            return false
        }
    }
    await client.shutdown()
    guard live else {
        let log = child.map { "; its log ends: " + String($0.stderr.suffix(2000)) } ?? ""
        throw Timeout(description: "\(service) did not become live within \(timeout): \(last.withLock { $0 })\(log)")
    }
}

/// Waits until `service` has processed everything in ingest's journal so far.
public func waitUntilCaughtUp(_ service: ServiceName, config: DrivebusConfig, within timeout: Duration = .seconds(30)) async throws {
    let client = BusClient(settings: config.process, name: "test-caught-up")
    defer { Task { await client.shutdown() } }
    let journal = try await client.call(.ingest, RPCRequestHead(op: "health"), as: HealthReply.self).lastSeq["journal"] ?? 0
    let caughtUp = await eventually(within: timeout) {
        ((try? await client.call(service, RPCRequestHead(op: "health"), as: HealthReply.self, timeout: .milliseconds(300)))?.lastSeq["journal"] ?? 0) >= journal
    }
    guard caughtUp else { throw Timeout(description: "\(service) did not reach journal seq \(journal)") }
}

/// A port nobody listens on right now.
public func freePort() -> Int { freePorts(1)[0] }

/// `count` distinct loopback ports for servers a test is about to start.
///
/// Not the kernel's choice of a free port: that comes from the ephemeral range, which every
/// outgoing connection of the tests running in parallel draws from too, so one could take the
/// port between this pick and the server's bind (and the server fail to start). These come
/// from outside that range, are checked free, and are never handed out twice in one process.
public func freePorts(_ count: Int) -> [Int] {
    var ports: [Int] = []
    var attempts = 0
    while ports.count < count {
        attempts += 1
        precondition(attempts <= 10_000, "no free loopback port in \(TestPorts.range)")
        let port = Int.random(in: TestPorts.range)
        guard TestPorts.handedOut.withLock({ $0.insert(port).inserted }), TestPorts.canBind(port) else { continue }
        ports.append(port)
    }
    return ports
}

private enum TestPorts {
    static let handedOut = Mutex<Set<Int>>([])

    /// Up to 12,000 ports in the wider of the gaps below and above the ephemeral range
    /// (`ip_local_port_range`, 32768–60999 by default), above the privileged ports.
    static let range: Range<Int> = {
        let text = (try? String(contentsOfFile: "/proc/sys/net/ipv4/ip_local_port_range", encoding: .utf8)) ?? ""
        let bounds = text.split(whereSeparator: \.isWhitespace).compactMap { Int($0) }
        let (low, high) = bounds.count == 2 ? (bounds[0], bounds[1]) : (32_768, 60_999)
        let below = 1_024..<max(low, 1_024), above = min(high + 1, 65_536)..<65_536
        let wider = below.count >= above.count ? below : above
        precondition(wider.count >= 1_000, "the ephemeral range \(low)–\(high) leaves too few ports for the tests' servers")
        return wider.count > 12_000 ? (wider.upperBound - 12_000)..<wider.upperBound : wider
    }()

    /// Whether a server could bind the port now; a port that fails is never tried again.
    static func canBind(_ port: Int) -> Bool {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        precondition(fd >= 0, "socket() failed: errno \(errno)")
        defer { close(fd) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        address.sin_port = UInt16(port).bigEndian
        let length = socklen_t(MemoryLayout<sockaddr_in>.size)
        return withUnsafePointer(to: &address) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, length) } } == 0
    }
}

/// A wait on the bus that did not finish in time.
public struct Timeout: Error, CustomStringConvertible {
    public let description: String
    public init(description: String) { self.description = description }
}

/// Runs `body`, which reads `client`'s subscriptions, with a deadline, so a lost message fails
/// the test instead of hanging it: at the deadline the client is shut down, which ends its
/// streams (reads return nil); the client is unusable from then on, but the test has failed.
public func withDeadline<T>(_ timeout: Duration, on client: BusClient, _ body: () async -> T) async -> T {
    let timer = Task {
        try await Task.sleep(for: timeout)
        await client.shutdown()
    }
    defer { timer.cancel() }
    return await body()
}

/// The next message on `iterator` that matches `predicate` (others are skipped), or nil if none
/// comes within `timeout`.
public func next(
    _ iterator: inout BusSubscription.AsyncIterator, of client: BusClient, within timeout: Duration = .seconds(20),
    where predicate: (BusMessage) -> Bool = { _ in true }
) async -> BusMessage? {
    let found = await withDeadline(timeout, on: client) { () async -> BusMessage? in
        while let message = await iterator.next() {
            if predicate(message) { return message }
        }
        return nil
    }
    return found
}

/// Publishes `probe` on `publisher` until `iterator`, subscribed to `probe` too, yields a message:
/// a SUB receives only once its subscription has reached the PUB ("slow joiner").
public func awaitProbe(from publisher: Publisher, on iterator: inout BusSubscription.AsyncIterator) async {
    let probing = Task {
        while !Task.isCancelled {
            _ = try? publisher.publish("probe", payload: RPCEmpty())
            try? await Task.sleep(for: .milliseconds(10))
        }
    }
    _ = await iterator.next()
    probing.cancel()
    _ = await probing.value
}

/// Subscribes to `prefixes` and waits for a heartbeat from each of `services`, so that what they
/// publish from now on arrives. The heartbeat prefixes go last: once a heartbeat arrives, that
/// service's publisher has the earlier prefixes too (as long as nobody else subscribed to those
/// heartbeats first: the broker forwards only new subscriptions).
public func joinedSubscription(
    _ client: BusClient, _ prefixes: [String], heartbeatsFrom services: [ServiceName], within timeout: Duration = .seconds(20)
) async throws -> BusSubscription.AsyncIterator {
    let heartbeats = services.map { "svc.heartbeat.\($0.rawValue)" }
    var iterator = try await client.subscribe(prefixes + heartbeats).makeAsyncIterator()
    var missing = Set(heartbeats)
    await withDeadline(timeout, on: client) {
        while !missing.isEmpty, let message = await iterator.next() { missing.remove(message.topic) }
    }
    guard missing.isEmpty else { throw Timeout(description: "no heartbeat within \(timeout) on \(missing.sorted())") }
    return iterator
}

/// Reads `iterator` until `done` holds for what was read, skipping heartbeats (which
/// `joinedSubscription` subscribes to); throws if `timeout` passes first.
public func collect(
    from iterator: inout BusSubscription.AsyncIterator, of client: BusClient, within timeout: Duration = .seconds(30),
    until done: ([BusMessage]) -> Bool
) async throws -> [BusMessage] {
    var seen: [BusMessage] = []
    let finished = await withDeadline(timeout, on: client) { () async -> Bool in
        while let message = await iterator.next() {
            if message.topic.hasPrefix("svc.heartbeat.") { continue }
            seen.append(message)
            if done(seen) { return true }
        }
        return false
    }
    guard finished else { throw Timeout(description: "collecting did not finish within \(timeout); got \(seen.map(\.topic))") }
    return seen
}

/// A decoder for a core's checkpoint, given the configurations the checkpoint leaves out.
public func checkpointDecoder<each Configuration: Sendable>(_ configurations: repeat each Configuration) -> JSONDecoder {
    let decoder = JSONDecoder()
    decoder.userInfo = CheckpointConfiguration.userInfo(repeat each configurations)
    return decoder
}

/// The CPU a process has used so far, in seconds: utime + stime from /proc/PID/stat (fields 14
/// and 15, in clock ticks); 0 for a process that is gone.
public func cpuSecondsOf(_ pid: Int32) -> Double {
    guard let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8), let close = stat.lastIndex(of: ")") else { return 0 }
    let fields = stat[stat.index(after: close)...].split(separator: " ")
    guard fields.count > 13, let user = Double(fields[11]), let system = Double(fields[12]) else { return 0 }
    return (user + system) / Double(sysconf(Int32(_SC_CLK_TCK)))
}
