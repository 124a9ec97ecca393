import CDrivebusSupport
import DrivebusSettings
import Foundation
import Glibc
import Logging

/// `drivebus up`: starts the bus, then every service, restarts any that dies (with backoff), and on
/// SIGTERM or SIGINT stops them all, services first and the bus last.
///
/// It runs on the main thread without Swift concurrency: children are started with
/// PR_SET_PDEATHSIG bound to the thread that forks them, and the main thread lives as long as the
/// process, so if `up` itself is killed its children get SIGTERM and nothing is orphaned.
public final class Supervisor {
    public struct Child {
        public let service: ServiceName
        let path: String
        let arguments: [String]
        var pid: pid_t?
        var startedAt = ContinuousClock.now
        var nextStart = ContinuousClock.now
        var failures = 0
    }

    private var children: [Child]
    private let settings: ProcessSettings.Supervisor
    private let layout: StateLayout
    private let logger: Logger

    /// - Parameters:
    ///   - binDirectory: where the `drivebus-*` executables are.
    ///   - arguments: passed to every child, e.g. `["--config", path]`.
    public init(
        settings process: ProcessSettings, services: [ServiceName] = ServiceName.standard, binDirectory: String, arguments: [String], logger: Logger
    ) throws {
        settings = process.supervisor
        layout = process.layout
        self.logger = logger
        children = try services.map { service in
            let path = binDirectory + "/" + service.executable
            guard access(path, X_OK) == 0 else {
                throw ConfigError(path: "", reason: "\(path) is missing or not executable; build with `swift build` first")
            }
            return Child(service: service, path: path, arguments: arguments)
        }
    }

    /// Runs until SIGTERM or SIGINT; returns once every child has exited.
    public func run() {
        SignalFlag.install()
        for index in children.indices {
            start(index)
            // Services connect to the bus's sockets, so let it bind first.
            if children[index].service == .bus { waitForBusSockets() }
        }
        while !SignalFlag.isSet {
            reapExited()
            let now = ContinuousClock.now
            for index in children.indices where children[index].pid == nil && children[index].nextStart <= now {
                start(index)
            }
            usleep(50_000)
        }
        stopAll()
    }

    private func start(_ index: Int) {
        let child = children[index]
        let argv = ([child.path] + child.arguments).map { strdup($0) } + [nil]
        defer { argv.forEach { free($0) } }
        let pid = drivebus_spawn(child.path, argv)
        guard pid > 0 else {
            logger.error("cannot start \(child.service.executable): \(String(cString: strerror(errno)))")
            children[index].nextStart = .now + backoff(failures: children[index].failures + 1)
            children[index].failures += 1
            return
        }
        children[index].pid = pid
        children[index].startedAt = .now
        logger.info("started \(child.service.executable)", metadata: ["pid": "\(pid)"])
    }

    private func waitForBusSockets() {
        let deadline = ContinuousClock.now + .seconds(10)
        let paths = [layout.socketPath("bus.in"), layout.socketPath("bus.out")]
        while ContinuousClock.now < deadline && !SignalFlag.isSet {
            if paths.allSatisfy({ FileManager.default.fileExists(atPath: $0) }) { return }
            usleep(20_000)
        }
    }

    private func reapExited() {
        var status: Int32 = 0
        while true {
            let pid = waitpid(-1, &status, WNOHANG)
            if pid < 0, errno == ECHILD {
                // No child at all, not even a zombie, yet some are believed running: they were
                // reaped elsewhere in this process (seen once under load, cause unknown). ECHILD
                // proves they are gone (a pid may already be someone else's): restart them.
                for index in children.indices where children[index].pid != nil { markExited(index, status: nil) }
                return
            }
            guard pid > 0 else { return }
            guard let index = children.firstIndex(where: { $0.pid == pid }) else { continue }
            markExited(index, status: status)
        }
    }

    private func markExited(_ index: Int, status: Int32?) {
        let pid = children[index].pid ?? 0
        let lived = children[index].startedAt.duration(to: .now)
        if lived >= .milliseconds(Int(settings.stableAfterS * 1000)) { children[index].failures = 0 }
        children[index].failures += 1
        let delay = backoff(failures: children[index].failures)
        children[index].pid = nil
        children[index].nextStart = .now + delay
        logger.warning("\(children[index].service.executable) \(status.map(Self.describe) ?? "vanished") after \(lived.formatted(.units(allowed: [.seconds], fractionalPart: .show(length: 1)))); restarting in \(delay.formatted(.units(allowed: [.seconds], fractionalPart: .show(length: 1))))", metadata: ["pid": "\(pid)"])
    }

    private func backoff(failures: Int) -> Duration {
        let seconds = min(settings.restartInitialS * pow(2, Double(max(0, failures - 1))), settings.restartMaxS)
        return .milliseconds(Int(seconds * 1000))
    }

    private func stopAll() {
        logger.info("stopping")
        // Services first, so their last messages still reach the bus; the bus last.
        let order = children.indices.filter { children[$0].service != .bus } + children.indices.filter { children[$0].service == .bus }
        for group in [Array(order.dropLast()), Array(order.suffix(1))] {
            for index in group { if let pid = children[index].pid { kill(pid, SIGTERM) } }
            let deadline = ContinuousClock.now + .milliseconds(Int(settings.stopTimeoutS * 1000))
            var killed = false
            while group.contains(where: { children[$0].pid != nil }) {
                var status: Int32 = 0
                let pid = waitpid(-1, &status, WNOHANG)
                if pid > 0, let index = children.firstIndex(where: { $0.pid == pid }) {
                    children[index].pid = nil
                    if status != 0 { logger.warning("\(children[index].service.executable) \(Self.describe(status)) while stopping") }
                    continue
                }
                if pid < 0, errno == ECHILD {
                    // Nothing left to wait for: they are gone (see reapExited).
                    for index in group { children[index].pid = nil }
                    break
                }
                if !killed && ContinuousClock.now >= deadline {
                    killed = true
                    for index in group {
                        guard let pid = children[index].pid else { continue }
                        logger.error("\(children[index].service.executable) did not stop in time; killing it")
                        kill(pid, SIGKILL)
                    }
                }
                usleep(20_000)
            }
        }
        logger.info("stopped")
    }

    static func describe(_ status: Int32) -> String {
        let signal = status & 0x7f
        if signal == 0 { return "exited with status \((status >> 8) & 0xff)" }
        return "was killed by signal \(signal)"
    }
}

/// SIGTERM and SIGINT set a flag that the supervisor's loop checks.
enum SignalFlag {
    nonisolated(unsafe) private static var flag: sig_atomic_t = 0

    static var isSet: Bool { flag != 0 }

    static func install() {
        let handler: @convention(c) (Int32) -> Void = { _ in SignalFlag.flag = 1 }
        signal(SIGTERM, handler)
        signal(SIGINT, handler)
    }
}
