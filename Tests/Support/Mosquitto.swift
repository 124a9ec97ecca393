import CDrivebusSupport
import Foundation

/// A real Mosquitto broker (Debian's `mosquitto`) on a free loopback port, with authentication on
/// and persistence in a temporary directory, for the MQTT tests and benchmarks.
public final class Mosquitto: @unchecked Sendable {
    public static let executable = "/usr/sbin/mosquitto"
    public let port: Int
    public let username = "drivebus"
    public let password = "broker-secret-0123"
    public let directory: String
    public private(set) var pid: pid_t?

    /// With `tls`, the listener takes TLS only and requires a client certificate, both signed by
    /// a CA made here (`ca.pem`; the client's `client.pem` and `client.key`).
    public let tls: Bool

    public init(in directory: String, port: Int = freePort(), tls: Bool = false) async throws {
        self.port = port
        self.directory = directory
        self.tls = tls
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        if tls { try await makeCertificates() }
        let made = try await run("/usr/bin/mosquitto_passwd", ["-b", "-c", directory + "/passwd", username, password])
        guard made.status == 0 else { throw Timeout(description: "mosquitto_passwd failed: \(made.stderr)") }
        // As root, Mosquitto would switch to its own user, who cannot read the temporary directory.
        let config = """
            listener \(port) 127.0.0.1
            allow_anonymous false
            password_file \(directory)/passwd
            persistence true
            persistence_location \(directory)/
            max_queued_messages 1000000
            \(tls ? "cafile \(directory)/ca.pem\ncertfile \(directory)/server.pem\nkeyfile \(directory)/server.key\nrequire_certificate true" : "")
            log_dest file \(directory)/mosquitto.log
            \(getuid() == 0 ? "user root" : "")

            """
        try config.write(toFile: directory + "/mosquitto.conf", atomically: true, encoding: .utf8)
        try await start()
    }

    /// Starts the broker and waits until it takes connections. Spawned with the signal mask
    /// cleared: Mosquitto unblocks only the mask it inherited, and a test thread's may block
    /// SIGTERM, which it needs to stop cleanly.
    public func start() async throws {
        let arguments: [String] = [Self.executable, "-c", directory + "/mosquitto.conf"]
        let argv = arguments.map { strdup($0) } + [nil]
        defer { argv.forEach { free($0) } }
        let pid = drivebus_spawn(Self.executable, argv)
        guard pid > 0 else { throw Timeout(description: "cannot start mosquitto: \(String(cString: strerror(errno)))") }
        self.pid = pid
        let port = port
        guard await eventually(within: .seconds(10), { Self.accepts(port) }) else {
            throw Timeout(description: "mosquitto did not listen on \(port): \(log)")
        }
    }

    /// Stops it cleanly (it saves what it holds) and waits for it to exit.
    public func stop() async throws {
        guard let pid else { return }
        kill(pid, SIGTERM)
        var status: Int32 = 0
        let exited = await eventually(within: .seconds(20)) { waitpid(pid, &status, WNOHANG) == pid }
        self.pid = nil
        guard exited else {
            kill(pid, SIGKILL)
            throw Timeout(description: "mosquitto did not stop on SIGTERM: \(log)")
        }
    }

    public var log: String { (try? String(contentsOfFile: directory + "/mosquitto.log", encoding: .utf8)) ?? "" }

    /// The YAML of an `mqtt:` section that reaches this broker.
    public var configSection: String {
        """
        mqtt:
          broker: "127.0.0.1:\(port)"
          username: \(username)
          password: \(password)
        """ + (tls ? "\n  tls: {ca_file: \(directory)/ca.pem, cert_file: \(directory)/client.pem, key_file: \(directory)/client.key}" : "")
    }

    /// A CA, a server certificate for 127.0.0.1 and a client certificate, with P-256 keys.
    private func makeCertificates() async throws {
        let key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
        let steps: [[String]] = [
            ["req", "-x509"] + key + ["-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=drivebus test CA"],
            ["req"] + key + ["-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=127.0.0.1"],
            ["x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-out", "server.pem", "-days", "2", "-extfile", "san.ext"],
            ["req"] + key + ["-keyout", "client.key", "-out", "client.csr", "-subj", "/CN=drivebus"],
            ["x509", "-req", "-in", "client.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-out", "client.pem", "-days", "2"],
        ]
        try "subjectAltName=IP:127.0.0.1\n".write(toFile: directory + "/san.ext", atomically: true, encoding: .utf8)
        for step in steps {
            let result = try await run("/usr/bin/openssl", step, cwd: directory)
            guard result.status == 0 else { throw Timeout(description: "openssl \(step[0]) failed: \(result.stderr)") }
        }
    }

    static func accepts(_ port: Int) -> Bool {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { return false }
        defer { close(fd) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = in_port_t(UInt16(port).bigEndian)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        return withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) == 0 }
        }
    }

    deinit {
        if let pid {
            kill(pid, SIGKILL)
            waitpid(pid, nil, 0)
        }
    }
}
