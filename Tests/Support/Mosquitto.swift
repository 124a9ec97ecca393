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

    public init(in directory: String, port: Int = freePort()) async throws {
        self.port = port
        self.directory = directory
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
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
        """
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
