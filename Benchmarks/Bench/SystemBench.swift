import ArgumentParser
import DrivebusKit
import DrivebusSchema
import DrivebusTestSupport
import Foundation
import Synchronization

/// `drivebus-bench system`: the whole system as `drivebus up` runs it (the release bus and all
/// six services) on a temporary state directory, loaded over loopback HTTP from threads of this
/// process, and timed until every service has processed the last fix, not only until ingest
/// answered.
/// - `system owntracks`: single-fix OwnTracks POSTs over keep-alive connections (ingest answers
///   once the fix is synced to the journal). CPU per fix is summed over every drivebus process
///   from `/proc`, load start to the last service done.
/// - `system otrecorder`: with `--otrecorder PATH`, the same requests to the OwnTracks Recorder
///   (`ot-recorder`, built by the user; never part of this repository) on its own temporary store,
///   in the same run, alternating with drivebus round by round.
/// - `system overland`: Overland batches, end to end through every service; the peak memory of
///   the processes, summed.
struct SystemBench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "system", abstract: "Measure the whole system, optionally against the OwnTracks Recorder.")

    @Option(help: "Single-fix OwnTracks requests per round.")
    var requests = 20_000

    @Option(help: "Connections posting them.")
    var connections = 16

    @Option(help: "Fixes in the batched case.")
    var fixes = 200_000

    @Option(help: "Fixes per Overland batch.")
    var batchSize = 100

    @Option(help: "Connections posting batches.")
    var batchConnections = 8

    @Option(help: "Rounds; the OwnTracks cases alternate with the recorder's.")
    var rounds = 3

    @Option(help: "Path of an OwnTracks Recorder executable (ot-recorder) to load the same way.")
    var otrecorder: String?

    func validate() throws {
        guard requests >= 1, connections >= 1, fixes >= 1, batchSize >= 1, batchConnections >= 1, rounds >= 1 else {
            throw ValidationError("every count must be at least 1")
        }
    }

    func run() async throws {
        let token = "bench-token-0123456789"
        let system = try await BenchSystem(services: ServiceName.standard, extraConfig: """
            devices: [{id: car, token: \(token)}]
            stats: {listen: "127.0.0.1:\(freePort())"}
            """)
        defer { system.stop() }
        let recorder = try otrecorder.map { try OwnTracksRecorder(executable: $0) }
        defer { recorder?.stop() }
        let bus = BusClient(settings: system.config.process, name: "bench")
        let drive = BenchDrive(start: 1_763_000_000)
        let auth = [("Authorization", "Bearer \(token)"), ("Content-Type", "application/json")]
        let port = system.port
        var next = 0

        for round in 1...rounds {
            // One drive carries on across rounds and cases: every fix is new to the dedup.
            let bodies = (next..<next + requests).map { Array(drive.ownTracks($0).utf8) }
            next += requests
            let run = try await system.measure(bus: bus, fixes: requests) { [connections] in
                try HTTPConnection.load(port: port, connections: connections, bodies: bodies, path: "/owntracks", headers: auth)
            }
            report(["name": "system owntracks", "round": round, "requests": requests, "connections": connections,
                    "requests_per_s": Int(Double(requests) / run.answered), "all_done_fixes_per_s": Int(Double(requests) / run.done),
                    "cpu_ms_per_fix": run.cpuMillisecondsPerFix, "cpu_s": run.cpuByProcess])

            if let recorder {
                let peer = try await recorder.measure(requests: bodies, connections: connections)
                report(["name": "system otrecorder", "round": round, "requests": requests, "connections": connections,
                        "requests_per_s": Int(Double(requests) / peer.seconds), "cpu_ms_per_fix": peer.cpuMillisecondsPerFix,
                        "drivebus_ratio": (peer.seconds / run.answered * 100).rounded() / 100])
            }
        }

        // Overland batches through everything.
        let batches: [[UInt8]] = stride(from: next, to: next + fixes, by: batchSize).map { first in
            let features = (first..<min(first + batchSize, next + fixes)).map { drive.overland($0) }
            return Array(#"{"locations":["#.utf8) + Array(features.joined(separator: ",").utf8) + Array("]}".utf8)
        }
        let run = try await system.measure(bus: bus, fixes: fixes) { [batchConnections] in
            try HTTPConnection.load(port: port, connections: batchConnections, bodies: batches, path: "/overland", headers: auth)
        }
        let peaks = system.peakRSSMegabytes()
        report(["name": "system overland", "fixes": fixes, "batch": batchSize, "connections": batchConnections,
                "acked_fixes_per_s": Int(Double(fixes) / run.answered), "all_done_fixes_per_s": Int(Double(fixes) / run.done),
                "cpu_ms_per_fix": run.cpuMillisecondsPerFix, "cpu_s": run.cpuByProcess,
                "peak_rss_mb": peaks, "peak_rss_mb_sum": (peaks.values.reduce(0, +) * 10).rounded() / 10,
                "peak_summed_pss_mb": run.peakSummed.pssMegabytes, "peak_summed_rss_mb": run.peakSummed.rssMegabytes])
        await bus.shutdown()
    }
}

/// Drives of half an hour at 48 km/h, out along a parallel and back, one fix a second, parked
/// ten minutes between them: every fix unique, and trips and scorer given trips that end, as a
/// phone's would, rather than one drive of days.
struct BenchDrive {
    let start: Int
    static let driveSeconds = 1_800
    static let parkedSeconds = 600

    private func place(_ index: Int) -> (lat: Double, lon: Double, time: Int) {
        let (drive, second) = index.quotientAndRemainder(dividingBy: Self.driveSeconds)
        let along = drive.isMultiple(of: 2) ? second : Self.driveSeconds - second
        return (48.2, 16.3 + Double(along) * 0.00018, start + drive * (Self.driveSeconds + Self.parkedSeconds) + second)
    }

    /// Seconds from `start` to fix `index` of these drives (parks included).
    func seconds(to index: Int) -> Int { place(index).time - start }

    func ownTracks(_ index: Int) -> String {
        let fix = place(index)
        return #"{"_type":"location","lat":\#(fix.lat),"lon":\#(fix.lon),"tst":\#(fix.time),"acc":5,"vel":48,"batt":80,"tid":"cr"}"#
    }

    /// One drive without a stop, a fix a second eastwards at 47 km/h: a long journey's open trip.
    func overlandOneTrip(_ index: Int) -> String {
        let time = RFC3339.format(Date(timeIntervalSince1970: Double(start + index)))
        return #"{"type":"Feature","geometry":{"type":"Point","coordinates":[\#(16.0 + Double(index) * 0.00018),48.2]},"properties":{"timestamp":"\#(time)","speed":13,"horizontal_accuracy":5}}"#
    }

    func overland(_ index: Int) -> String {
        let fix = place(index)
        let time = RFC3339.format(Date(timeIntervalSince1970: Double(fix.time)))
        return #"{"type":"Feature","geometry":{"type":"Point","coordinates":[\#(fix.lon),\#(fix.lat)]},"properties":{"timestamp":"\#(time)","speed":13.4,"horizontal_accuracy":5,"altitude":180,"battery_level":0.8,"motion":["driving"]}}"#
    }
}

extension BenchSystem {
    struct Run {
        /// Seconds from the first request to the last answer.
        var answered: Double
        /// Seconds from the first request until every service had processed the last fix.
        var done: Double
        var cpuByProcess: [String: Double]
        var fixes: Int
        /// The highest sum over the processes, sampled every 500 ms, of `Pss` (what the system
        /// costs the machine: pages shared by several processes, such as the Swift runtime, are
        /// divided among them) and of `Rss` (which counts those pages once in every process).
        var peakSummed: MemorySampler.Peak

        var cpuMillisecondsPerFix: Double { (cpuByProcess.values.reduce(0, +) * 1000 / Double(fixes) * 1000).rounded() / 1000 }
    }

    /// Runs `load` (blocking, so on a thread of its own), then waits until every journal consumer
    /// has reached ingest's last seq. CPU is what every process used in between.
    func measure(bus: BusClient, fixes: Int, load: @escaping @Sendable () throws -> Double) async throws -> Run {
        let before = cpuSeconds()
        let sampler = MemorySampler(processIDs: processIDs.map(\.id))
        defer { sampler.stop() }
        let started = ContinuousClock.now
        let answered = try await Task.detached(operation: load).value
        try await waitUntilEveryServiceIsDone(bus: bus, deadline: started + .seconds(600))
        let done = seconds(started.duration(to: .now))
        let after = cpuSeconds()
        let used = after.reduce(into: [String: Double]()) { used, process in
            used[process.key] = ((process.value - (before[process.key] ?? 0)) * 1000).rounded() / 1000
        }
        return Run(answered: answered, done: done, cpuByProcess: used, fixes: fixes, peakSummed: sampler.stop())
    }

    /// Waits until every consumer's `health` has reached ingest's last journal seq.
    func waitUntilEveryServiceIsDone(bus: BusClient, deadline: ContinuousClock.Instant) async throws {
        let head = try await bus.call(.ingest, RPCRequestHead(op: "health"), as: HealthReply.self).lastSeq["journal"] ?? 0
        let consumers = ServiceName.standard.filter { $0 != .bus && $0 != .ingest }
        for service in consumers {
            while (try await bus.call(service, RPCRequestHead(op: "health"), as: HealthReply.self).lastSeq["journal"] ?? 0) < head {
                guard ContinuousClock.now < deadline else { throw ValidationError("\(service.executable) did not reach seq \(head)") }
                try await Task.sleep(for: .milliseconds(20))
            }
        }
    }
}

/// Samples the summed `Pss` and `Rss` of a set of processes from `/proc/PID/smaps_rollup`, on a
/// thread of its own (the reads block), and keeps the highest sums seen.
final class MemorySampler: Sendable {
    struct Peak: Sendable {
        var pssMegabytes = 0.0
        var rssMegabytes = 0.0
    }

    private let state = Mutex((peak: Peak(), stopped: false))
    private let finished = DispatchSemaphore(value: 0)
    /// Signalled by `stop`, so that the sampler does not sleep out its interval first.
    private let stopping = DispatchSemaphore(value: 0)

    /// Every 500 ms: the kernel walks every page table of a process for each read of its
    /// `smaps_rollup`, and at 100 ms the sampler took half the load generator's CPU, 3 % of the
    /// two cores the system was being measured on. Each process's own peak is exact anyway
    /// (`VmHWM`, `BenchSystem.peakRSSMegabytes`).
    init(processIDs: [Int32], interval: TimeInterval = 0.5) {
        Thread.detachNewThread { [self] in
            while !state.withLock({ $0.stopped }) {
                var sum = Peak()
                var whole = true
                for id in processIDs {
                    // A process that cannot be read (it died) makes the sample partial: not counted.
                    guard let rollup = ImportBench.memoryMegabytes("/proc/\(id)/smaps_rollup"), let pss = rollup["Pss"], let rss = rollup["Rss"]
                    else { whole = false; break }
                    sum.pssMegabytes += pss
                    sum.rssMegabytes += rss
                }
                if whole {
                    state.withLock {
                        $0.peak.pssMegabytes = max($0.peak.pssMegabytes, sum.pssMegabytes)
                        $0.peak.rssMegabytes = max($0.peak.rssMegabytes, sum.rssMegabytes)
                    }
                }
                _ = stopping.wait(timeout: .now() + interval)
            }
            finished.signal()
        }
    }

    /// Stops sampling (once; later calls only read) and returns the peaks, rounded to 0.1 MB.
    @discardableResult
    func stop() -> Peak {
        let first = state.withLock { state in
            defer { state.stopped = true }
            return !state.stopped
        }
        if first {
            stopping.signal()
            finished.wait()
        }
        let peak = state.withLock { $0.peak }
        return Peak(pssMegabytes: (peak.pssMegabytes * 10).rounded() / 10, rssMegabytes: (peak.rssMegabytes * 10).rounded() / 10)
    }
}

/// The OwnTracks Recorder on a temporary store, HTTP only (`--port 0` turns MQTT off), without
/// reverse geocoding, on a loopback port.
final class OwnTracksRecorder {
    private let process: Process
    private let store: String
    let port: Int

    init(executable: String) throws {
        var template = Array("/tmp/dbb-otr-XXXXXX".utf8CString)
        store = template.withUnsafeMutableBufferPointer { String(cString: mkdtemp($0.baseAddress!)!) }
        let initialize = try Process.run(URL(fileURLWithPath: executable), arguments: ["--storage", store, "--initialize"])
        initialize.waitUntilExit()
        guard initialize.terminationStatus == 0 else {
            try? FileManager.default.removeItem(atPath: store)
            throw ValidationError("\(executable) --initialize exited with status \(initialize.terminationStatus)")
        }
        port = freePort()
        process = Process()
        process.executableURL = URL(fileURLWithPath: executable)
        // Its default document root is a system folder it exits without; the store serves instead.
        process.arguments = [
            "--storage", store, "--norevgeo", "--quiet", "--port", "0", "--http-host", "127.0.0.1", "--http-port", String(port), "--doc-root", store,
        ]
        process.standardOutput = FileHandle.nullDevice
        process.standardError = FileHandle.nullDevice
        do { try process.run() } catch {
            try? FileManager.default.removeItem(atPath: store)
            throw error
        }
        let started = ContinuousClock.now
        while (try? HTTPConnection(port: port)) == nil {
            guard process.isRunning, ContinuousClock.now < started + .seconds(10) else {
                stop()
                throw ValidationError("ot-recorder did not listen on port \(port)")
            }
            Thread.sleep(forTimeInterval: 0.02)
        }
    }

    /// The same bodies to `/pub`, as the OwnTracks app in HTTP mode sends them. The recorder has
    /// stored a fix when it answers.
    func measure(requests bodies: [[UInt8]], connections: Int) async throws -> (seconds: Double, cpuMillisecondsPerFix: Double) {
        let before = cpuSecondsOf(process.processIdentifier)
        let headers = [("Content-Type", "application/json"), ("X-Limit-U", "bench"), ("X-Limit-D", "car")]
        let elapsed = try await Task.detached { [port] in
            try HTTPConnection.load(port: port, connections: connections, bodies: bodies, path: "/pub", headers: headers)
        }.value
        let cpu = cpuSecondsOf(process.processIdentifier) - before
        return (elapsed, (cpu * 1000 / Double(bodies.count) * 1000).rounded() / 1000)
    }

    /// SIGTERM, then SIGKILL after 5 s: after a load, the recorder does not always leave its loop.
    func stop() {
        if process.isRunning {
            process.terminate()
            let deadline = ContinuousClock.now + .seconds(5)
            while process.isRunning, ContinuousClock.now < deadline { Thread.sleep(forTimeInterval: 0.02) }
            if process.isRunning { kill(process.processIdentifier, SIGKILL) }
            process.waitUntilExit()
        }
        try? FileManager.default.removeItem(atPath: store)
    }
}
