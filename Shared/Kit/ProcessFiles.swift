import DrivebusSettings
import DrivebusZMQ
import Foundation
import Glibc

extension ProcessSettings {
    /// Where publishers connect and subscribers listen, with CURVE for `tcp://`.
    public func busEndpoints(asBroker: Bool = false) -> (in: ZMQEndpoint, out: ZMQEndpoint) {
        func endpoint(_ configured: String?, _ socket: String) -> ZMQEndpoint {
            let address = configured ?? "ipc://" + layout.socketPath(socket)
            guard address.hasPrefix("tcp://"), let curve = bus.curve else { return ZMQEndpoint(address) }
            if asBroker {
                let keys = CurveKeyPair(publicKey: curve.serverPublicKey, secretKey: curve.serverSecretKey ?? "")
                return ZMQEndpoint(address, curve: .server(keys))
            }
            let own = CurveKeyPair(publicKey: curve.clientPublicKey, secretKey: curve.clientSecretKey)
            return ZMQEndpoint(address, curve: .client(serverPublicKey: curve.serverPublicKey, own: own))
        }
        return (endpoint(bus.inEndpoint, "bus.in"), endpoint(bus.outEndpoint, "bus.out"))
    }
}

/// An exclusive lock on `run/<service>.lock`, held for the life of the process.
///
/// libzmq unlinks an existing ipc socket file when it binds, which would silently steal the
/// socket from a running instance. Taking this lock first makes a second instance fail loudly.
public final class InstanceLock: Sendable {
    public struct AlreadyRunning: Error, CustomStringConvertible {
        public let service: ServiceName
        public let lockPath: String
        public let holder: String
        public var description: String {
            "another \(service.executable) is already running on this state_dir (\(lockPath) is held by pid \(holder)); stop it first"
        }
    }

    private let fd: Int32

    public init(_ service: ServiceName, layout: StateLayout) throws {
        let path = layout.socketPath("\(service.rawValue).lock")
        let fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw ConfigError(path: "state_dir", reason: "cannot open \(path): \(String(cString: strerror(errno)))") }
        guard flock(fd, LOCK_EX | LOCK_NB) == 0 else {
            var buffer = [UInt8](repeating: 0, count: 32)
            let count = pread(fd, &buffer, buffer.count, 0)
            close(fd)
            let holder = String(decoding: buffer.prefix(max(0, count)), as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
            throw AlreadyRunning(service: service, lockPath: path, holder: holder.isEmpty ? "?" : holder)
        }
        let pid = Array("\(getpid())\n".utf8)
        _ = ftruncate(fd, 0)
        _ = pwrite(fd, pid, pid.count, 0)
        self.fd = fd
    }

    deinit { close(fd) }
}
