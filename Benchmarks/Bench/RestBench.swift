import ArgumentParser
import DrivebusKit
import Foundation

/// `drivebus-bench rest`: each service's memory at rest. The seven release executables start
/// together on one config (loopback listeners, one device) and an empty state directory; once all
/// are live and `--settle` seconds have passed, `Rss` and `Pss` come from
/// `/proc/PID/smaps_rollup`. `Pss` shares the pages that several processes map (the Swift runtime
/// and Foundation, about 28 MB of each `Rss`) among them.
struct RestBench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "rest", abstract: "Memory of each service at rest.")

    @Option(help: "Seconds to wait once every service is live, as a running system would have.")
    var settle = 20.0

    @Option(help: "The aim for each service's Rss, in MB.")
    var aim = 40.0

    func run() async throws {
        let system = try await BenchSystem(services: ServiceName.standard, extraConfig: "devices: [{id: car, token: bench-token-0123456789}]")
        defer { system.stop() }
        try await Task.sleep(for: .seconds(settle))
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
            report(["name": "rest.service", "service": name, "rss_mb": rss, "pss_mb": pss, "settle_s": settle])
        }
        report([
            "name": "rest.summary", "rss_sum_mb": (rssSum * 10).rounded() / 10, "pss_sum_mb": (pssSum * 10).rounded() / 10,
            "aim_mb": aim, "over_aim": over, "settle_s": settle,
        ])
    }
}

struct RestError: Error, CustomStringConvertible {
    var description: String
}
