import ArgumentParser
import DrivebusConfiguration
import DrivebusKit
import DrivebusSchema
import DrivebusTrackFormats
import Foundation
import IngestCore

struct Import: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Import tracks and location histories for a device, through ingest (which must be running).",
        discussion: "GPX, GeoJSON, CSV, Google location history (Takeout Records.json, Semantic Location History, the phone's Timeline.json) and OwnTracks Recorder .rec files, recognised by their content.")

    @OptionGroup var options: ConfigOption

    @Option(help: "The device the tracks belong to.")
    var device: String

    @Option(help: "Fixes per request to ingest (at most 10000).")
    var batch = 5000

    @Argument(help: "Files: GPX, GeoJSON, CSV, Google location history JSON, OwnTracks Recorder .rec.")
    var files: [String]

    func validate() throws {
        guard (1...10_000).contains(batch) else { throw ValidationError("--batch must be from 1 to 10000") }
    }

    func run() async throws {
        let config = try loadConfig(options)
        try createDeviceIfMissing(config)
        let unpacked = try TakeoutArchives(files)
        defer { unpacked.remove() }
        let bus = BusClient(settings: config.process, name: "import")
        let failed: Bool
        do {
            failed = try await importAll(unpacked.inputs, bus: bus) || unpacked.failed
        } catch {
            await bus.shutdown()
            throw error
        }
        await bus.shutdown()
        if failed { throw ExitCode(1) }
    }

    /// Import is local and trusted: a device it names that does not exist is added to the
    /// registry (with a token, for when a phone joins it later), and ingest finds it on the first
    /// batch.
    private func createDeviceIfMissing(_ config: DrivebusConfig) throws {
        guard DeviceID.isValid(device) else { throw ValidationError("--device must match [A-Za-z0-9_-]{1,64}") }
        let registry = DeviceRegistry(layout: config.layout)
        do {
            var entries = try registry.load()
            guard !config.devices(with: entries).contains(where: { $0.id == device }) else { return }
            entries.append(DeviceRegistry.Entry(id: device, tokenSHA256: TokenDigest.hex(DeviceRegistry.newToken()), app: nil, addedAt: Date()))
            try registry.save(entries)
        } catch {
            FileHandle.standardError.write(Data("drivebus import: \(error)\n".utf8))
            throw ExitCode(2)
        }
        print("drivebus import: created device \"\(device)\" (`drivebus device rotate-token \(device)` connects a phone to it)")
    }

    /// Returns whether any file could not be read.
    ///
    /// Each file is read twice, a point at a time, so that a file of any size takes bounded
    /// memory: once to check all of it (a file with an error is not imported at all), then to send
    /// it in batches.
    private func importAll(_ inputs: [TakeoutArchives.Input], bus: BusClient) async throws -> Bool {
        var failed = false
        for input in inputs {
            let (file, shown) = (input.path, input.name)
            let name = URL(fileURLWithPath: shown).lastPathComponent
            let total: (points: Int, timed: Int, activities: Int)
            do {
                total = try count(file)
            } catch {
                print("\(shown): \(error)")
                failed = true
                continue
            }
            var counts = Tally()
            var reasons: [String] = []
            var sent = 0
            let progress = Progress(total: total.timed, label: name)
            func send(_ slice: [TrackPoint]) async throws {
                try await deliver(
                    slice, into: &counts, reasons: &reasons, field: "fixes",
                    retrySingly: { $0.code.hasPrefix("ingest.invalid") || $0.code == "ingest.forbidden" },
                    location: \.location) { try await publish($0, bus: bus) }
                sent += slice.count
                progress.advance(to: sent)
            }
            // A location history's activities go in as motion samples, in batches of their own.
            var motion = Tally()
            var activities: [TrackReader.Activity] = []
            func sendActivities() async throws {
                try await deliver(
                    activities, into: &motion, reasons: &reasons, field: "samples",
                    retrySingly: { $0.code.hasPrefix("ingest.invalid") }, location: \.location) { try await publishMotion($0, bus: bus) }
                activities.removeAll(keepingCapacity: true)
            }
            let reader = try open(file)
            var batch: [TrackPoint] = []
            batch.reserveCapacity(max(1, self.batch))
            while let item = try reader.nextItem() {
                switch item {
                case .point(let point):
                    guard point.time != nil else { continue }
                    batch.append(point)
                    if batch.count >= max(1, self.batch) {
                        try await send(batch)
                        batch.removeAll(keepingCapacity: true)
                    }
                case .activity(let activity):
                    activities.append(activity)
                    if activities.count >= max(1, self.batch) { try await sendActivities() }
                }
            }
            if !batch.isEmpty { try await send(batch) }
            if !activities.isEmpty { try await sendActivities() }
            progress.finish()
            _ = try await bus.call(.ingest, IngestRPCMessages.ImportFinished(device: device, file: name, fixes: counts.accepted), as: PublishReply.self)
            print("\(shown): \(total.points) points, \(counts.accepted) imported, \(counts.duplicates) already there, \(counts.refused) refused, \(total.points - total.timed) without a time")
            if total.activities > 0 {
                print("  \(total.activities) activities as motion samples: \(motion.accepted) imported, \(motion.duplicates) already there or unchanged, \(motion.refused) refused")
            }
            for reason in reasons { print("  refused \(reason)") }
        }
        return failed
    }

    struct Tally {
        var accepted = 0, duplicates = 0, refused = 0
    }

    /// Sends a batch; when one bad item refuses all of it (`retrySingly`), sends them singly to
    /// keep the good ones, and keeps the first five reasons.
    private func deliver<Item>(
        _ items: [Item], into tally: inout Tally, reasons: inout [String], field: String, retrySingly: (RPCErrorBody) -> Bool,
        location: (Item) -> String, publish: ([Item]) async throws -> PublishReply
    ) async throws {
        do {
            let reply = try await publish(items)
            tally.accepted += reply.accepted
            tally.duplicates += reply.duplicates
        } catch let error as RPCErrorBody where retrySingly(error) {
            for item in items {
                do {
                    let reply = try await publish([item])
                    tally.accepted += reply.accepted
                    tally.duplicates += reply.duplicates
                } catch let error as RPCErrorBody {
                    tally.refused += 1
                    if reasons.count < 5 { reasons.append("\(location(item)): \(error.message.replacingOccurrences(of: "\(field)[0].", with: ""))") }
                }
            }
        }
    }

    private func open(_ file: String) throws(TrackFileError) -> TrackFiles.Reader {
        let format = try TrackFiles.format(ofFile: file)
        do {
            return TrackFiles.Reader(format: format, source: try FileByteSource(path: file))
        } catch {
            throw TrackFileError(location: file, message: error.message)
        }
    }

    /// Reads the whole file once: its points, those with a time, and its activities.
    private func count(_ file: String) throws(TrackFileError) -> (points: Int, timed: Int, activities: Int) {
        let reader = try open(file)
        var counts = (points: 0, timed: 0, activities: 0)
        while let item = try reader.nextItem() {
            switch item {
            case .point(let point):
                counts.points += 1
                if point.time != nil { counts.timed += 1 }
            case .activity:
                counts.activities += 1
            }
        }
        return counts
    }

    private func publishMotion(_ activities: [TrackReader.Activity], bus: BusClient) async throws -> PublishReply {
        let samples = activities.map { activity in
            JSONValue.object([
                "start": .string(RFC3339.format(activity.time)), "activity": .string(activity.activity.rawValue),
                "confidence": .string(activity.confidence.rawValue),
            ])
        }
        let body = JSONValue.object(["op": .string("publish_motion"), "device": .string(device), "samples": .array(samples)])
        let reply = try await bus.loop.request(ZMQEndpoint(bus.settings.layout.rpcEndpoint(.ingest)), body: body.encoded, timeout: .seconds(30))
        return try BusJSON.decode(RPCReply<PublishReply>.self, from: reply).get()
    }

    private func publish(_ points: [TrackPoint], bus: BusClient) async throws -> PublishReply {
        let body = JSONValue.object(["op": .string("publish"), "device": .string(device), "fixes": .array(points.map(\.nativeJSON))])
        let reply = try await bus.loop.request(ZMQEndpoint(bus.settings.layout.rpcEndpoint(.ingest)), body: body.encoded, timeout: .seconds(30))
        return try BusJSON.decode(RPCReply<PublishReply>.self, from: reply).get()
    }
}

typealias PublishReply = IngestRPCMessages.Stored

/// The second pass's progress: a bar with the points sent, their rate and the time left on a
/// terminal; on anything else (a log, a pipe) a plain line every 10 s.
final class Progress {
    let total: Int
    let label: String
    private let terminal = isatty(STDERR_FILENO) == 1
    private let started = ContinuousClock.now
    private var lastLine = ContinuousClock.now

    init(total: Int, label: String) {
        self.total = total
        self.label = label
    }

    func advance(to done: Int) {
        guard total > 0 else { return }
        let elapsed = started.duration(to: .now).inSeconds
        let rate = elapsed > 0 ? Double(done) / elapsed : 0
        let left = rate > 0 ? Int(Double(total - done) / rate) : nil
        let figures = "\(done)/\(total) points, \(Int(rate))/s, \(left.map { "\($0 / 60)m\(String(format: "%02d", $0 % 60))s left" } ?? "…")"
        if terminal {
            let width = 30
            let filled = width * done / total
            let bar = String(repeating: "#", count: filled) + String(repeating: " ", count: width - filled)
            FileHandle.standardError.write(Data("\r\(label) [\(bar)] \(figures)   ".utf8))
        } else if lastLine.duration(to: .now) >= .seconds(10) {
            lastLine = .now
            FileHandle.standardError.write(Data("\(label): \(figures)\n".utf8))
        }
    }

    func finish() {
        if terminal { FileHandle.standardError.write(Data("\n".utf8)) }
    }
}
