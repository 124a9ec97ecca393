import Foundation
import Glibc

/// The processes drivebus runs, by their names on the bus.
public enum ServiceName: String, CaseIterable, Sendable {
    case bus, ingest, trips, geofence, checkout, scorer, stats, mqtt

    /// The executable that runs it.
    public var executable: String { "drivebus-\(rawValue)" }

    /// Runs only when its config section is there (`mqtt:`).
    public var isOptional: Bool { self == .mqtt }

    /// The processes that always run.
    public static let standard = allCases.filter { !$0.isOptional }
}

/// `state_dir` and what lives in it:
/// - `run/` (mode 0700): the ipc sockets and the instance locks;
/// - `data/`: journal, database, checkpoints, webhook outbox.
public struct StateLayout: Sendable, Equatable {
    /// `sockaddr_un.sun_path` holds 108 bytes including the terminating NUL.
    public static let maxSocketPathBytes = 107

    public let stateDir: String
    public var runDir: String { stateDir + "/run" }
    public var dataDir: String { stateDir + "/data" }

    public init(stateDir: String) { self.stateDir = stateDir }

    /// The posted speed limits of the roads, written by `drivebus limits import` and read by the
    /// scorer (docs/speed-limits.md).
    public var roadLimitsIndex: String { dataDir + "/road-limits.dbrl" }

    public func socketPath(_ name: String) -> String { "\(runDir)/\(name)" }

    public func rpcEndpoint(_ service: ServiceName) -> String { "ipc://" + socketPath("\(service.rawValue).rpc") }

    /// Every ipc socket path drivebus binds.
    public var socketPaths: [String] {
        ["bus.in", "bus.out"].map(socketPath) + ServiceName.allCases.map { socketPath("\($0.rawValue).rpc") }
    }

    /// Creates `run/` and `data/`, and makes `run/` private whatever it was before.
    public func prepare() throws(ConfigError) {
        for (dir, mode) in [(stateDir, mode_t(0o755)), (runDir, mode_t(0o700)), (dataDir, mode_t(0o700))] {
            do {
                try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
            } catch {
                throw ConfigError(path: "state_dir", reason: "cannot create \(dir): \(error.localizedDescription)")
            }
            if dir != stateDir, chmod(dir, mode) != 0 {
                throw ConfigError(path: "state_dir", reason: "cannot set mode \(String(mode, radix: 8)) on \(dir): \(String(cString: strerror(errno)))")
            }
        }
    }
}

