import ArgumentParser
import DrivebusKit
import DrivebusSchema
import DrivebusTestSupport
import DrivebusTrackFormats
import Foundation
import IngestCore

/// `drivebus-bench import --megabytes N`: writes a Google Takeout `Records.json` of about N MB
/// (synthetic, 1 Hz drives in the published shape: E7 integers, both timestamp forms, activity
/// arrays) to a temporary file, then reads it back through the streaming reader that
/// `drivebus import` uses, and reports points/s and the process's peak RSS. The reader alone,
/// in-core. With `--system`, the file is then imported for real: `drivebus import` into release
/// `drivebus-bus` and `drivebus-ingest` in a temporary state directory, timed from the command's
/// start to its exit, with each process's CPU and peak memory. With `--running`, it is imported
/// into the whole release system as `drivebus up` runs it (bus and all six services), timed until
/// every service has processed the last point, with the peak of the seven's summed memory.
struct ImportBench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "import", abstract: "Read a generated Takeout Records.json.")

    @Option(help: "The size of the generated file, in MB.")
    var megabytes = 200

    @Option(help: "Where to write it (default: a temporary file, removed afterwards).")
    var file: String?

    @Flag(help: "Also import the file with `drivebus import` into release drivebus-bus and drivebus-ingest.")
    var system = false

    @Flag(help: "Also import the file with `drivebus import` into the whole release system, until every service is done.")
    var running = false

    func run() async throws {
        let path = file ?? NSTemporaryDirectory() + "drivebus-records-\(ProcessInfo.processInfo.processIdentifier).json"
        defer { if file == nil { try? FileManager.default.removeItem(atPath: path) } }
        let written = try Self.generate(path: path, bytes: megabytes << 20)
        let clock = ContinuousClock()
        let start = clock.now
        let reader = TrackFiles.Reader(format: try TrackFiles.format(ofFile: path), source: try FileByteSource(path: path))
        var points = 0
        while try reader.next() != nil { points += 1 }
        let elapsed = seconds(clock.now - start)
        report([
            "name": "import.records_json", "bytes": written.bytes, "points": points, "generated_points": written.points,
            "points_per_s": Int(Double(points) / elapsed), "mb_per_s": (Double(written.bytes) / 1_048_576 / elapsed * 10).rounded() / 10,
            "peak_rss_mb": Self.peakRSSMegabytes() ?? -1,
        ])
        if system { report(try await Self.importThroughIngest(path: path, generatedPoints: written.points)) }
        if running { report(try await Self.importIntoRunningSystem(path: path, generatedPoints: written.points)) }
    }

    /// Runs `drivebus import` of the file and waits for it; fails unless every point was
    /// imported. It blocks its thread for the whole import: the bench runs it in a detached
    /// task, as it does its HTTP loads, and has nothing else on the pool meanwhile.
    static func importFile(_ path: String, config: String, generatedPoints: Int) throws {
        let cli = Process()
        cli.executableURL = URL(fileURLWithPath: BenchSystem.binDirectory + "/drivebus")
        cli.arguments = ["import", "--config", config, "--device", "bench", path]
        let output = Pipe()
        cli.standardOutput = output
        try cli.run()
        let printed = String(decoding: output.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        cli.waitUntilExit()
        guard cli.terminationStatus == 0, printed.contains(" \(generatedPoints) imported") else {
            throw ValidationError("drivebus import did not import all \(generatedPoints) points:\n\(printed)")
        }
    }

    /// `drivebus import` into the whole release system: how long the import took, how long
    /// until every consumer had processed it, CPU by process, and memory.
    static func importIntoRunningSystem(path: String, generatedPoints: Int) async throws -> [String: Any] {
        let system = try await BenchSystem(services: ServiceName.standard, extraConfig: "stats: {listen: \"127.0.0.1:\(freePort())\"}")
        defer { system.stop() }
        let bus = BusClient(settings: system.config.process, name: "bench")
        let config = system.configPath
        let run = try await system.measure(bus: bus, fixes: generatedPoints) {
            let started = ContinuousClock.now
            try importFile(path, config: config, generatedPoints: generatedPoints)
            return seconds(started.duration(to: .now))
        }
        await bus.shutdown()
        let peaks = system.peakRSSMegabytes()
        return [
            "name": "import.running", "points": generatedPoints, "import_s": (run.answered * 100).rounded() / 100,
            "all_done_s": (run.done * 100).rounded() / 100, "points_per_s": Int(Double(generatedPoints) / run.answered),
            "cpu_s": run.cpuByProcess, "peak_rss_mb": peaks, "peak_rss_mb_sum": (peaks.values.reduce(0, +) * 10).rounded() / 10,
            "peak_summed_pss_mb": run.peakSummed.pssMegabytes, "peak_summed_rss_mb": run.peakSummed.rssMegabytes,
        ]
    }

    /// `drivebus import` of a generated file into release bus and ingest: the result line.
    static func importThroughIngest(path: String, generatedPoints: Int) async throws -> [String: Any] {
        let bench = try await BenchSystem(services: [.bus, .ingest], extraConfig: "")
        defer { bench.stop() }
        let cpuBefore = bench.cpuSeconds()
        let started = ContinuousClock.now
        let config = bench.configPath
        try await Task.detached { try importFile(path, config: config, generatedPoints: generatedPoints) }.value
        let elapsed = seconds(started.duration(to: .now))
        // The only child waited for so far (`run` measures this before `--running`):
        // RUSAGE_CHILDREN's peak is the importer's.
        var usage = rusage()
        getrusage(__rusage_who_t(RUSAGE_CHILDREN.rawValue), &usage)
        let cpuAfter = bench.cpuSeconds()
        return [
            "name": "import.system", "points": generatedPoints, "elapsed_s": (elapsed * 100).rounded() / 100,
            "points_per_s": Int(Double(generatedPoints) / elapsed),
            "cpu_s": cpuAfter.reduce(into: ["drivebus": (Double(usage.ru_utime.tv_sec) + Double(usage.ru_stime.tv_sec)
                                                         + Double(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6)]) {
                $0[$1.key] = (($1.value - (cpuBefore[$1.key] ?? 0)) * 100).rounded() / 100
            },
            "peak_rss_mb": bench.peakRSSMegabytes().merging(["drivebus": (Double(usage.ru_maxrss) / 1024 * 10).rounded() / 10]) { a, _ in a },
        ]
    }

    /// Writes locations until the file reaches `bytes`; a tenth carry an activity array, a
    /// third use `timestampMs`.
    static func generate(path: String, bytes: Int) throws -> (bytes: Int, points: Int) {
        guard FileManager.default.createFile(atPath: path, contents: nil) else { throw ValidationError("cannot write \(path)") }
        let handle = try FileHandle(forWritingTo: URL(fileURLWithPath: path))
        defer { try? handle.close() }
        var chunk = "{\n  \"locations\": ["
        var total = 0, points = 0
        var lat = 482_000_000, lon = 163_700_000
        var time = 1_556_700_000_000
        while total + chunk.utf8.count < bytes {
            lat += 12 - points % 25
            lon += 9 + points % 7
            time += 1000
            let stamp = points % 3 == 0 ? "\"timestampMs\": \"\(time)\"" : "\"timestamp\": \"\(RFC3339Stamp.format(time))\""
            let activity = points % 10 == 0 ? ", \"activity\": [{\"activity\": [{\"type\": \"IN_VEHICLE\", \"confidence\": 80}], \"timestamp\": \"\(RFC3339Stamp.format(time))\"}]" : ""
            chunk += (points == 0 ? "" : ",") + "{\n    \"latitudeE7\": \(lat),\n    \"longitudeE7\": \(lon),\n    \"accuracy\": \(5 + points % 20),\n    \"velocity\": \(points % 30),\n    \"heading\": \(points % 360),\n    \"altitude\": \(180 + points % 40),\n    \"source\": \"GPS\",\n    \(stamp)\(activity)\n  }"
            points += 1
            if chunk.utf8.count > 1 << 20 {
                total += chunk.utf8.count
                handle.write(Data(chunk.utf8))
                chunk = ""
            }
        }
        chunk += "]\n}\n"
        total += chunk.utf8.count
        handle.write(Data(chunk.utf8))
        return (total, points)
    }

    /// VmHWM from /proc/self/status (or another process's).
    static func peakRSSMegabytes(status path: String = "/proc/self/status") -> Double? { statusMegabytes("VmHWM", status: path) }

    /// A memory line of `/proc/<pid>/status` (`VmHWM`, `VmRSS`…) or `smaps_rollup`, in MB.
    static func statusMegabytes(_ field: String, status path: String = "/proc/self/status") -> Double? {
        memoryMegabytes(path)?[field].map { ($0 * 10).rounded() / 10 }
    }

    /// Every `kB` line of a `/proc` memory file (`status`, `smaps_rollup`), in MB by field name,
    /// from one read: the kernel walks the process's mappings for each read of `smaps_rollup`.
    static func memoryMegabytes(_ path: String) -> [String: Double]? {
        guard let text = try? String(contentsOfFile: path, encoding: .utf8) else { return nil }
        var fields: [String: Double] = [:]
        for line in text.split(separator: "\n") {
            let parts = line.split(separator: ":", maxSplits: 1)
            guard parts.count == 2, parts[1].hasSuffix(" kB"),
                  let kilobytes = Double(parts[1].dropLast(3).trimmingCharacters(in: .whitespaces))
            else { continue }
            fields[String(parts[0])] = kilobytes / 1024
        }
        return fields
    }
}

/// Milliseconds since 1970 as RFC 3339 with milliseconds, quickly (no formatter per point).
enum RFC3339Stamp {
    static func format(_ milliseconds: Int) -> String {
        let date = Date(timeIntervalSince1970: Double(milliseconds) / 1000)
        var calendar = Calendar(identifier: .gregorian)
        calendar.timeZone = TimeZone(identifier: "UTC")!
        let c = calendar.dateComponents([.year, .month, .day, .hour, .minute, .second], from: date)
        return String(format: "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", c.year!, c.month!, c.day!, c.hour!, c.minute!, c.second!, milliseconds % 1000)
    }
}
