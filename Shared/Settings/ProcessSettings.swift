import Foundation
import Logging
import Yams

/// What every drivebus process needs, whichever service it runs: where its state lives, how it
/// logs, how often it reports, where the bus is and how `drivebus up` restarts it. The services'
/// own sections live with the services (`DrivebusConfig`); this knows none of them.
public struct ProcessSettings: Sendable, Equatable {
    /// Absolute; relative paths in the file are taken from the working directory.
    public var stateDir: String
    public var logLevel: Logger.Level = .info
    public var heartbeatIntervalS = 2.0
    public var bus = Bus()
    public var supervisor = Supervisor()
    /// `retention.derived_events_days`: how long a service's event journal keeps an event after
    /// what it describes ended (docs/data.md). Nil: for ever.
    public var derivedEventsDays: Double?

    /// The defaults: state under `./var`.
    public init(workingDirectory: String = FileManager.default.currentDirectoryPath) {
        stateDir = Self.absolute("var", from: workingDirectory)
    }

    public var layout: StateLayout { StateLayout(stateDir: stateDir) }

    public struct Bus: Sendable, Equatable {
        /// Where publishers connect; `nil` means `ipc://STATE/run/bus.in`.
        public var inEndpoint: String?
        /// Where subscribers connect; `nil` means `ipc://STATE/run/bus.out`.
        public var outEndpoint: String?
        /// Required when either endpoint is `tcp://`.
        public var curve: Curve?

        public struct Curve: Sendable, Equatable {
            public var serverPublicKey: String
            /// Only the machine that runs `drivebus-bus` needs it.
            public var serverSecretKey: String?
            public var clientPublicKey: String
            public var clientSecretKey: String
        }
    }

    /// How `drivebus up` restarts a child that died.
    public struct Supervisor: Sendable, Equatable {
        public var restartInitialS = 0.5
        public var restartMaxS = 30.0
        /// A child that ran this long before dying is restarted at the initial delay again.
        public var stableAfterS = 60.0
        /// How long children get to exit after SIGTERM before SIGKILL.
        public var stopTimeoutS = 10.0
    }

    /// Reads `state_dir`, `log_level`, `heartbeat_interval_s`, `bus` and `supervisor` from the top
    /// mapping of the config file.
    package static func parse(_ top: ConfigMapping, workingDirectory: String) throws(ConfigError) -> ProcessSettings {
        var settings = ProcessSettings(workingDirectory: workingDirectory)
        if let stateDir = try top.string("state_dir") {
            guard !stateDir.isEmpty else { throw ConfigError(path: "state_dir", reason: "must not be empty") }
            settings.stateDir = absolute(stateDir, from: workingDirectory)
        }
        if let level = try top.string("log_level") {
            guard let parsed = Logger.Level(rawValue: level.lowercased()) else {
                throw ConfigError(path: "log_level", reason: "expected one of trace, debug, info, notice, warning, error, critical, got \"\(level)\"")
            }
            settings.logLevel = parsed
        }
        settings.heartbeatIntervalS = try top.double("heartbeat_interval_s", default: 2, in: 0.1...60)
        settings.bus = try parseBus(top.mapping("bus", allowed: ["in", "out", "curve"]))
        let supervisor = try top.mapping("supervisor", allowed: ["restart_initial_s", "restart_max_s", "stable_after_s", "stop_timeout_s"])
        settings.supervisor.restartInitialS = try supervisor.double("restart_initial_s", default: 0.5, in: 0.01...60)
        settings.supervisor.restartMaxS = try supervisor.double("restart_max_s", default: 30, in: settings.supervisor.restartInitialS...3600)
        settings.supervisor.stableAfterS = try supervisor.double("stable_after_s", default: 60, in: 0...86_400)
        settings.supervisor.stopTimeoutS = try supervisor.double("stop_timeout_s", default: 10, in: 0.1...300)
        return settings
    }

    static func parseBus(_ bus: ConfigMapping) throws(ConfigError) -> Bus {
        var result = Bus()
        for key in ["in", "out"] {
            guard let endpoint = try bus.string(key) else { continue }
            guard endpoint.hasPrefix("ipc://") || endpoint.hasPrefix("tcp://") else {
                throw ConfigError(path: bus.keyPath(key), reason: "expected an ipc:// or tcp:// endpoint, got \"\(endpoint)\"")
            }
            if key == "in" { result.inEndpoint = endpoint } else { result.outEndpoint = endpoint }
        }
        if bus.has("curve") {
            let curve = try bus.mapping("curve", allowed: ["server_public_key", "server_secret_key", "client_public_key", "client_secret_key"])
            func key(_ name: String, required: Bool) throws(ConfigError) -> String? {
                guard let value = try curve.string(name) else {
                    if required { throw ConfigError(path: curve.keyPath(name), reason: "is required for CURVE") }
                    return nil
                }
                guard value.utf8.count == 40 else {
                    throw ConfigError(path: curve.keyPath(name), reason: "expected a 40-character Z85 key (see `drivebus keygen`)")
                }
                return value
            }
            result.curve = Bus.Curve(
                serverPublicKey: try key("server_public_key", required: true)!,
                serverSecretKey: try key("server_secret_key", required: false),
                clientPublicKey: try key("client_public_key", required: true)!,
                clientSecretKey: try key("client_secret_key", required: true)!
            )
        }
        let usesTCP = [result.inEndpoint, result.outEndpoint].contains { $0?.hasPrefix("tcp://") == true }
        if usesTCP && result.curve == nil {
            throw ConfigError(path: bus.keyPath("curve"), reason: "is required when the bus uses tcp:// (traffic between machines is encrypted and authenticated)")
        }
        return result
    }

    public func validateSocketPaths() throws(ConfigError) {
        for path in layout.socketPaths where path.utf8.count > StateLayout.maxSocketPathBytes {
            throw ConfigError(
                path: "state_dir",
                reason: "socket path \(path) is \(path.utf8.count) bytes, over the \(StateLayout.maxSocketPathBytes) that Unix sockets allow; choose a shorter state_dir")
        }
    }

    public static func absolute(_ path: String, from directory: String) -> String {
        let expanded = NSString(string: path).expandingTildeInPath
        let joined = expanded.hasPrefix("/") ? expanded : directory + "/" + expanded
        return URL(fileURLWithPath: joined).standardizedFileURL.path
    }
}

/// Where the config came from, for the start-up log line.
public enum ConfigOrigin: Sendable, Equatable, CustomStringConvertible {
    case file(String)
    case builtInDefaults

    public var description: String {
        switch self {
        case .file(let path): path
        case .builtInDefaults: "built-in defaults"
        }
    }
}

/// The config file, found as every drivebus executable finds it.
public enum ConfigFile {
    /// `--config`, then `$DRIVEBUS_CONFIG`, then `./drivebus.yaml`; nil for none (the built-in
    /// defaults apply). A file named explicitly must exist.
    public static func locate(
        explicitPath: String?,
        environment: [String: String] = ProcessInfo.processInfo.environment,
        workingDirectory: String = FileManager.default.currentDirectoryPath
    ) throws(ConfigError) -> (path: String, text: String)? {
        let candidates: [(path: String, mustExist: Bool)] = [
            explicitPath.map { ($0, true) },
            environment["DRIVEBUS_CONFIG"].flatMap { $0.isEmpty ? nil : ($0, true) },
            ("drivebus.yaml", false),
        ].compactMap { $0 }
        for candidate in candidates {
            let path = ProcessSettings.absolute(candidate.path, from: workingDirectory)
            guard FileManager.default.fileExists(atPath: path) else {
                if candidate.mustExist { throw ConfigError(path: "", reason: "config file \(path) does not exist") }
                continue
            }
            guard let data = FileManager.default.contents(atPath: path) else {
                throw ConfigError(path: "", reason: "cannot read config file \(path)")
            }
            guard let text = String(data: data, encoding: .utf8) else {
                throw ConfigError(path: "", reason: "config file \(path) is not UTF-8")
            }
            return (path, text)
        }
        return nil
    }
}

/// A whole configuration as a service process loads it: the process settings plus whatever
/// sections the service reads. `ServiceRunner` is generic over it, so the kit knows no service.
public protocol ServiceConfiguration: Sendable {
    var process: ProcessSettings { get }
    static func load(explicitPath: String?) throws(ConfigError) -> (Self, ConfigOrigin)
}
