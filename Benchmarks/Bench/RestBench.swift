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
        let system = try await BenchSystem(services: ServiceName.standard, extraConfig: "devices: [{id: car, token: \(token)}]")
        defer { system.stop() }
        let drive = BenchDrive(start: Int(Date().timeIntervalSince1970) - driveFixes - liveSeconds - 3_600)
        let fix = oneTrip ? drive.overlandOneTrip : drive.overland
        func post(_ fixes: Range<Int>) throws {
            let batches: [[UInt8]] = stride(from: fixes.lowerBound, to: fixes.upperBound, by: 100).map { first in
                let features = (first..<min(first + 100, fixes.upperBound)).map(fix)
                return Array(#"{"locations":["#.utf8) + Array(features.joined(separator: ",").utf8) + Array("]}".utf8)
            }
            _ = try HTTPConnection.load(port: system.port, connections: 1, bodies: batches, path: "/overland", headers: [("Authorization", "Bearer \(token)")])
        }
        try post(0..<driveFixes)
        if liveSeconds > 0 {
            try await Task.sleep(for: .seconds(5))  // the drive has been taken in
            let cpuBefore = system.cpuSeconds()
            let writtenBefore = Dictionary(uniqueKeysWithValues: system.processIDs.map { ($0.name, Self.writtenBytes($0.id)) })
            let started = ContinuousClock.now
            for second in 0..<liveSeconds {
                try post(driveFixes + second..<driveFixes + second + 1)
                try await Task.sleep(until: started + .seconds(second + 1))
            }
            let cpuAfter = system.cpuSeconds()
            for (name, id) in system.processIDs {
                let written = (Self.writtenBytes(id) ?? 0) - (writtenBefore[name].flatMap { $0 } ?? 0)
                report(["name": "rest.live", "service": name, "drive_fixes": driveFixes, "one_trip": oneTrip, "live_s": liveSeconds,
                        "cpu_percent": ((cpuAfter[name, default: 0] - cpuBefore[name, default: 0]) / Double(liveSeconds) * 1000).rounded() / 10,
                        "written_kb_per_min": (Double(written) / 1024 / Double(liveSeconds) * 60 * 10).rounded() / 10])
            }
        }
        try await Task.sleep(for: .seconds(settle / 2))
        let writtenBefore = Dictionary(uniqueKeysWithValues: system.processIDs.map { ($0.name, Self.writtenBytes($0.id)) })
        try await Task.sleep(for: .seconds(settle / 2))
        let writtenAfter = Dictionary(uniqueKeysWithValues: system.processIDs.map { ($0.name, Self.writtenBytes($0.id)) })
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
            let written = (writtenAfter[name].flatMap { $0 } ?? 0) - (writtenBefore[name].flatMap { $0 } ?? 0)
            let kilobytesPerMinute = (Double(written) / 1024 / (settle / 2) * 60 * 10).rounded() / 10
            report(["name": "rest.service", "service": name, "rss_mb": rss, "pss_mb": pss, "settle_s": settle,
                    "written_kb_per_min": kilobytesPerMinute, "drive_fixes": driveFixes])
        }
        report([
            "name": "rest.summary", "rss_sum_mb": (rssSum * 10).rounded() / 10, "pss_sum_mb": (pssSum * 10).rounded() / 10,
            "aim_mb": aim, "over_aim": over, "settle_s": settle,
        ])
    }
}

extension RestBench {
    /// Bytes the process has caused to be written to storage (`write_bytes` in `/proc/PID/io`).
    static func writtenBytes(_ id: Int32) -> Int? {
        guard let text = try? String(contentsOfFile: "/proc/\(id)/io", encoding: .utf8) else { return nil }
        return text.split(separator: "\n").first { $0.hasPrefix("write_bytes:") }.flatMap { Int($0.split(separator: " ").last ?? "") }
    }
}

struct RestError: Error, CustomStringConvertible {
    var description: String
}
