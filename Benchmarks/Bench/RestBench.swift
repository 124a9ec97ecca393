import ArgumentParser
import DrivebusKit
import DrivebusTestSupport
import Foundation

/// `drivebus-bench rest`: each service's memory at rest. The seven release executables start
/// together on one config (loopback listeners, one device) and an empty state directory; once all
/// are live and `--settle` seconds have passed, `Rss` and `Pss` come from
/// `/proc/PID/smaps_rollup`. `Pss` shares the pages that several processes map (the Swift runtime
/// and Foundation, about 28 MB of each `Rss`) among them. Beside it, what each wrote to storage
/// while at rest (`write_bytes` of `/proc/PID/io`, over the second half of `--settle`): a home
/// server idles most of its life, on an SSD or an SD card that wears with every write.
struct RestBench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "rest", abstract: "Memory of each service at rest.")

    @Option(help: "Seconds to wait once every service is live, as a running system would have.")
    var settle = 20.0

    @Option(help: "The aim for each service's Rss, in MB.")
    var aim = 40.0

    @Option(help: "Fixes of drives (one phone, one a second, Overland batches of 100) posted before settling; 0 leaves the state empty.")
    var driveFixes = 0

    @Flag(help: "Post the drive as one trip without a stop (a long journey) instead of half-hour drives between stops.")
    var oneTrip = false

    @Option(help: "Seconds of the phone driving on after the drive, a fix a second: each service's CPU and writes meanwhile.")
    var liveSeconds = 0

    func run() async throws {
        let token = "bench-token-0123456789"
        let system = try await BenchSystem(services: ServiceName.standard, extraConfig: "devices: [{id: car, token: \(token)}]\nstats: {listen: \"127.0.0.1:\(freePort())\"}")
        defer { system.stop() }
        // Timed so that the live phase's fixes are the phone's latest, a few seconds old as sent.
        let now = Int(Date().timeIntervalSince1970)
        let span = oneTrip ? driveFixes : BenchDrive(start: 0).seconds(to: driveFixes)
        let drive = BenchDrive(start: now - span - 2)
        let fix = oneTrip ? drive.overlandOneTrip : drive.overland
        func post(_ fixes: Range<Int>) throws {
            let batches: [[UInt8]] = stride(from: fixes.lowerBound, to: fixes.upperBound, by: 100).map { first in
                let features = (first..<min(first + 100, fixes.upperBound)).map(fix)
                return Array(#"{"locations":["#.utf8) + Array(features.joined(separator: ",").utf8) + Array("]}".utf8)
            }
            _ = try HTTPConnection.load(port: system.port, connections: 1, bodies: batches, path: "/overland", headers: [("Authorization", "Bearer \(token)")])
        }
        try post(0..<driveFixes)
        let bus = BusClient(settings: system.config.process, name: "bench")
        defer { Task { await bus.shutdown() } }
        try await system.waitUntilEveryServiceIsDone(bus: bus, deadline: .now + .seconds(600))
        if liveSeconds > 0 {
            let cpuBefore = system.cpuSeconds()
            let writtenBefore = Self.writtenBytes(of: system)
            let started = ContinuousClock.now
            for second in 0..<liveSeconds {
                try post(driveFixes + second..<driveFixes + second + 1)
                try await Task.sleep(until: started + .seconds(second + 1))
            }
            let cpuAfter = system.cpuSeconds()
            for (name, id) in system.processIDs {
                var line: [String: Any] = [
                    "name": "rest.live", "service": name, "drive_fixes": driveFixes, "one_trip": oneTrip, "live_s": liveSeconds,
                    "cpu_percent": ((cpuAfter[name, default: 0] - cpuBefore[name, default: 0]) / Double(liveSeconds) * 1000).rounded() / 10,
                ]
                line["written_kb_per_min"] = Self.kilobytesPerMinute(from: writtenBefore[name] ?? nil, to: Self.writtenBytes(id), seconds: Double(liveSeconds))
                report(line)
            }
        }
        try await Task.sleep(for: .seconds(settle / 2))
        let writtenBefore = Self.writtenBytes(of: system)
        try await Task.sleep(for: .seconds(settle / 2))
        let writtenAfter = Self.writtenBytes(of: system)
        var rssSum = 0.0, pssSum = 0.0
        var over: [String] = []
        for (name, id) in system.processIDs {
            let rollup = "/proc/\(id)/smaps_rollup"
            guard let rss = ImportBench.statusMegabytes("Rss", status: rollup),
                  let pss = ImportBench.statusMegabytes("Pss", status: rollup)
            else { throw RestError(description: "\(name) (pid \(id)) exited while settling, or \(rollup) is not readable") }
            rssSum += rss
            pssSum += pss
            if rss > aim { over.append(name) }
            var line: [String: Any] = ["name": "rest.service", "service": name, "rss_mb": rss, "pss_mb": pss, "settle_s": settle, "drive_fixes": driveFixes]
            line["written_kb_per_min"] = Self.kilobytesPerMinute(from: writtenBefore[name] ?? nil, to: writtenAfter[name] ?? nil, seconds: settle / 2)
            report(line)
        }
        report([
            "name": "rest.summary", "rss_sum_mb": (rssSum * 10).rounded() / 10, "pss_sum_mb": (pssSum * 10).rounded() / 10,
            "aim_mb": aim, "over_aim": over, "settle_s": settle,
        ])
    }
}

extension RestBench {
    /// KiB a minute between two readings of `write_bytes`; nil (left out of the report, not 0)
    /// when either could not be read.
    static func kilobytesPerMinute(from before: Int?, to after: Int?, seconds: Double) -> Double? {
        guard let before, let after else { return nil }
        return (Double(after - before) / 1024 / seconds * 60 * 10).rounded() / 10
    }

    /// `writtenBytes` of each of the system's processes, by executable name.
    static func writtenBytes(of system: BenchSystem) -> [String: Int?] {
        Dictionary(uniqueKeysWithValues: system.processIDs.map { ($0.name, writtenBytes($0.id)) })
    }

    /// Bytes the process has caused to be written to storage (`write_bytes` in `/proc/PID/io`).
    /// Writes to a tmpfs are not counted there: the state directory must be on a disk (it is
    /// under `/tmp`, on this machine the root disk).
    static func writtenBytes(_ id: Int32) -> Int? {
        guard let text = try? String(contentsOfFile: "/proc/\(id)/io", encoding: .utf8) else { return nil }
        return text.split(separator: "\n").first { $0.hasPrefix("write_bytes:") }.flatMap { Int($0.split(separator: " ").last ?? "") }
    }
}

struct RestError: Error, CustomStringConvertible {
    var description: String
}
