import DrivebusKit
import DrivebusSchema
import Foundation
import Synchronization

/// The one HTTP client of the tests and benchmarks: a blocking HTTP/1.1 keep-alive connection to
/// 127.0.0.1, small enough to load a server from dedicated threads.
public final class HTTPConnection {
    private let fd: Int32

    public init(port: Int) throws {
        // The descriptor is stored only once connected: an init that throws after storing it
        // would close it twice (here and in deinit), and the second close can hit a descriptor
        // number libzmq has reused meanwhile, which aborts the process.
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { throw POSIXError(.EMFILE) }
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
        self.fd = fd
    }

    deinit { close(fd) }

    /// Sends one request and reads the whole response (`Content-Length` framed).
    public func exchange(method: String, path: String, headers: [(String, String)], body: [UInt8]) throws -> (status: Int, body: [UInt8]) {
        // A `Host` among `headers` replaces this machine's (a test of what another name gets).
        let host = headers.first { $0.0.lowercased() == "host" }?.1 ?? "127.0.0.1"
        var head = "\(method) \(path) HTTP/1.1\r\nHost: \(host)\r\nContent-Length: \(body.count)\r\n"
        for (name, value) in headers where name.lowercased() != "host" { head += "\(name): \(value)\r\n" }
        let request = Array((head + "\r\n").utf8) + body
        var sent = 0
        while sent < request.count {
            let n = request.withUnsafeBytes { Glibc.send(fd, $0.baseAddress! + sent, $0.count - sent, Int32(MSG_NOSIGNAL)) }
            guard n > 0 else { throw POSIXError(.EPIPE) }
            sent += n
        }
        var response: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 16_384)
        var closed = false
        func readMore() throws {
            let n = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            guard n >= 0 else { throw POSIXError(.ECONNRESET) }
            if n == 0 { closed = true } else { response += buffer[0..<n] }
        }
        while true {
            guard let end = response.firstRange(of: Array("\r\n\r\n".utf8)) else {
                guard !closed else { throw POSIXError(.ECONNRESET) }
                try readMore()
                continue
            }
            let headText = String(decoding: response[..<end.lowerBound], as: UTF8.self).lowercased()
            let status = headText.split(separator: " ").dropFirst().first.flatMap { Int($0) } ?? 0
            let fields = headText.split(separator: "\r\n")
            if fields.contains(where: { $0.hasPrefix("transfer-encoding:") && $0.contains("chunked") }) {
                // Chunked: read until the last, empty chunk has arrived.
                var body: [UInt8] = []
                var at = end.upperBound
                while true {
                    guard let lineEnd = response[at...].firstRange(of: Array("\r\n".utf8)),
                          let size = Int(String(decoding: response[at..<lineEnd.lowerBound], as: UTF8.self).split(separator: ";")[0], radix: 16),
                          response.count >= lineEnd.upperBound + size + 2 else {
                        guard !closed else { throw POSIXError(.ECONNRESET) }
                        try readMore()
                        continue
                    }
                    if size == 0 { return (status, body) }
                    body += response[lineEnd.upperBound..<(lineEnd.upperBound + size)]
                    at = lineEnd.upperBound + size + 2
                }
            }
            let length = fields.first { $0.hasPrefix("content-length:") }
                .flatMap { Int($0.dropFirst("content-length:".count).trimmingCharacters(in: .whitespaces)) }
            if let length, response.count - end.upperBound >= length {
                return (status, Array(response[end.upperBound..<(end.upperBound + length)]))
            }
            // Without a length the body ends when the server closes the connection.
            if length == nil, closed { return (status, Array(response[end.upperBound...])) }
            guard !closed else { throw POSIXError(.ECONNRESET) }
            try readMore()
        }
    }

    /// Sends one request; returns its status.
    public func send(method: String, path: String, headers: [(String, String)], body: [UInt8]) throws -> Int {
        try exchange(method: method, path: path, headers: headers, body: body).status
    }

    /// Posts every body, spread over `connections` threads; returns the seconds it took. Fails if
    /// any answer is not 200.
    public static func load(port: Int, connections: Int, bodies: [[UInt8]], path: String, headers: [(String, String)]) throws -> Double {
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
        let elapsed = started.duration(to: .now).inSeconds
        guard failures.load(ordering: .relaxed) == 0 else { throw POSIXError(.EIO) }
        return elapsed
    }
}

/// One request to `url` (`http://127.0.0.1:PORT/path?query`) on a connection of its own, made on
/// a thread of its own so that no test blocks the cooperative pool.
public func http(
    _ method: String, _ url: String, token: String? = nil, body: Data? = nil, contentType: String = "application/json", headers extra: [(String, String)] = []
) async throws -> (status: Int, body: String) {
    guard let parsed = URLComponents(string: url), parsed.host == "127.0.0.1", let port = parsed.port else {
        throw POSIXError(.EINVAL)
    }
    let path = (parsed.percentEncodedPath.isEmpty ? "/" : parsed.percentEncodedPath) + (parsed.percentEncodedQuery.map { "?" + $0 } ?? "")
    let headers = [("Content-Type", contentType), ("Connection", "close")] + (token.map { [("Authorization", "Bearer \($0)")] } ?? []) + extra
    let bytes = body.map(Array.init) ?? []
    return try await withCheckedThrowingContinuation { continuation in
        Thread {
            do {
                let answer = try HTTPConnection(port: port).exchange(method: method, path: path, headers: headers, body: bytes)
                continuation.resume(returning: (answer.status, String(decoding: answer.body, as: UTF8.self)))
            } catch {
                continuation.resume(throwing: error)
            }
        }.start()
    }
}

/// The repository's `Tests/Fixtures`: real tracks and client payloads.
public let fixtures = URL(fileURLWithPath: #filePath).deletingLastPathComponent().appendingPathComponent("../Fixtures").standardized

public func fixture(_ name: String) throws -> Data { try Data(contentsOf: fixtures.appendingPathComponent(name)) }

/// A date from RFC 3339 text the test wrote itself.
public func date(_ text: String) -> Date { RFC3339.parse(text)! }
