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
        let created: Bool
        do {
            created = try registry.update { entries in
                guard !config.devices(with: entries).contains(where: { $0.id == device }) else { return false }
                entries.append(DeviceRegistry.Entry(id: device, tokenSHA256: TokenDigest.hex(DeviceRegistry.newToken()), app: nil, addedAt: Date()))
                return true
            }
        } catch {
            FileHandle.standardError.write(Data("drivebus import: \(error)\n".utf8))
            throw ExitCode(2)
        }
        guard created else { return }
        print("drivebus import: created device \"\(device)\" (`drivebus device rotate-token \(device)` connects a phone to it)")
    }

    /// Returns whether any file could not be read.
    ///
    /// Each file is read once, a point at a time, so that a file of any size takes bounded
    /// memory. Two batches are in flight while the next is read: they go over one connection,
    /// and ingest journals a local tool's batches in the order they arrived, so fixes reach the
    /// journal in the file's order. Not on errors: the good fixes of a refused batch are sent
    /// again one by one after the batch that followed it, and an import stopped by ingest (a
    /// timeout, a full journal) may have journaled that following batch; running it again adds
    /// the rest, after it. A file with
    /// an error stops where the error is: what came before it is imported and stays (importing
    /// the mended file again adds only the rest).
    private func importAll(_ inputs: [TakeoutArchives.Input], bus: BusClient) async throws -> Bool {
        // Batches of fixes go over one connection, so that they arrive in the order sent.
        let channel = PipelinedRequester(loop: bus.loop, endpoint: ZMQEndpoint(bus.settings.layout.rpcEndpoint(.ingest)))
        defer { channel.close() }
        var failed = false
        for input in inputs {
            let (file, shown) = (input.path, input.name)
            let name = URL(fileURLWithPath: shown).lastPathComponent
            var total = (points: 0, timed: 0, activities: 0, visits: 0)
            var reasons: [String] = []
            let size: Int?
            let reader: TrackFiles.Reader
            do {
                (reader, size) = try open(file)
            } catch {
                print("\(shown): \(error)")
                failed = true
                continue
            }
            let progress = Progress(totalBytes: size, label: name)
            var fixes = InFlight<TrackPoint>(
                depth: Self.batchesInFlight, field: "fixes", retrySingly: { $0.code.hasPrefix("ingest.invalid") }, location: \.location
            ) { [device] in Self.fixesBody($0, device: device) }
            // A location history's activities go in as motion samples, and its visits as visits,
            // in batches of their own.
            var motion = InFlight<TrackReader.Activity>(
                depth: 1, field: "samples", retrySingly: { $0.code.hasPrefix("ingest.invalid") }, location: \.location
            ) { [device] in Self.motionBody($0, device: device) }
            var stays = InFlight<TrackReader.Visit>(
                depth: 1, field: "visits", retrySingly: { $0.code.hasPrefix("ingest.invalid") || $0.code == "ingest.too_long" },
                location: \.location
            ) { [device] in Self.visitsBody($0, device: device) }
            var activities: [TrackReader.Activity] = []
            var visits: [TrackReader.Visit] = []
            func send(_ points: [TrackPoint]) async throws {
                try await fixes.send(points, over: channel, reasons: &reasons)
                progress.advance(bytes: reader.bytesRead, points: total.timed)
            }
            var batch: [TrackPoint] = []
            batch.reserveCapacity(max(1, self.batch))
            var stoppedBy: TrackFileError?
            do {
                while let item = try reader.nextItem() {
                    switch item {
                    case .point(let point):
                        total.points += 1
                        guard let time = point.time else { continue }
                        total.timed += 1
                        // Left out here rather than refused with its batch (see `Normalizer.refusal`).
                        if let (field, message) = Normalizer.refusal(time: time, lat: point.lat, lon: point.lon, now: Date()) {
                            fixes.refuse(point, "\(field): \(message)", reasons: &reasons)
                            continue
                        }
                        batch.append(point)
                        if batch.count >= max(1, self.batch) {
                            try await send(batch)
                            batch.removeAll(keepingCapacity: true)
                        }
                    case .activity(let activity):
                        total.activities += 1
                        activities.append(activity)
                        if activities.count >= max(1, self.batch) {
                            try await motion.send(activities, over: channel, reasons: &reasons)
                            activities.removeAll(keepingCapacity: true)
                        }
                    case .visit(let visit):
                        total.visits += 1
                        visits.append(visit)
                        if visits.count >= max(1, self.batch) {
                            try await stays.send(visits, over: channel, reasons: &reasons)
                            visits.removeAll(keepingCapacity: true)
                        }
                    }
                }
            } catch let error as TrackFileError {
                stoppedBy = error
            }
            if !batch.isEmpty { try await send(batch) }
            if !activities.isEmpty { try await motion.send(activities, over: channel, reasons: &reasons) }
            if !visits.isEmpty { try await stays.send(visits, over: channel, reasons: &reasons) }
            try await fixes.finish(over: channel, reasons: &reasons)
            try await motion.finish(over: channel, reasons: &reasons)
            try await stays.finish(over: channel, reasons: &reasons)
            let (counts, motionCounts, stayCounts) = (fixes.tally, motion.tally, stays.tally)
            progress.finish()
            if let stoppedBy {
                print("\(shown): \(stoppedBy)")
                print("  stopped there: \(total.points) points before it, \(counts.accepted) imported, \(counts.duplicates) already there, \(counts.refused) refused; they stay")
                failed = true
            } else {
                _ = try await bus.call(.ingest, IngestRPCMessages.ImportFinished(device: device, file: name, fixes: counts.accepted), as: PublishReply.self)
                print("\(shown): \(total.points) points, \(counts.accepted) imported, \(counts.duplicates) already there, \(counts.refused) refused, \(total.points - total.timed) without a time")
            }
            if total.activities > 0 {
                print("  \(total.activities) activities as motion samples: \(motionCounts.accepted) imported, \(motionCounts.duplicates) already there or unchanged, \(motionCounts.refused) refused")
            }
            if total.visits > 0 {
                print("  \(total.visits) visits: \(stayCounts.accepted) imported, \(stayCounts.duplicates) already there, \(stayCounts.refused) refused")
            }
            for reason in reasons { print("  refused \(reason)") }
        }
        return failed
    }

    /// Two: ingest parses one while it journals the other.
    static let batchesInFlight = 2

    struct Tally {
        var accepted = 0, duplicates = 0, refused = 0
    }

    /// One kind's batches sent to ingest and not yet counted, oldest first, at most `depth` of
    /// them: the next is read while ingest journals these. When one bad item refuses a whole
    /// batch (`retrySingly`), its items are sent again one by one to keep the good ones, and the
    /// first five reasons are kept.
    struct InFlight<Item> {
        let depth: Int
        let field: String
        let retrySingly: (RPCErrorBody) -> Bool
        let location: (Item) -> String
        let body: ([Item]) -> [UInt8]
        private(set) var tally = Tally()
        private var pending: [(items: [Item], answer: PipelinedRequester.Answer)] = []

        init(
            depth: Int, field: String, retrySingly: @escaping (RPCErrorBody) -> Bool, location: @escaping (Item) -> String,
            body: @escaping ([Item]) -> [UInt8]
        ) {
            (self.depth, self.field, self.retrySingly, self.location, self.body) = (depth, field, retrySingly, location, body)
        }

        mutating func send(_ items: [Item], over channel: PipelinedRequester, reasons: inout [String]) async throws {
            if pending.count == depth { try await settleOldest(over: channel, reasons: &reasons) }
            // Queued here, not in a task, so that batches leave in the order they were read.
            pending.append((items, channel.send(body(items), timeout: .seconds(30))))
        }

        /// An item refused: by ingest, or left out before it is sent for a reason ingest would
        /// refuse it for. The first five reasons are kept.
        mutating func refuse(_ item: Item, _ reason: String, reasons: inout [String]) {
            tally.refused += 1
            if reasons.count < 5 { reasons.append("\(location(item)): \(reason)") }
        }

        mutating func finish(over channel: PipelinedRequester, reasons: inout [String]) async throws {
            while !pending.isEmpty { try await settleOldest(over: channel, reasons: &reasons) }
        }

        private mutating func settleOldest(over channel: PipelinedRequester, reasons: inout [String]) async throws {
            let (items, answer) = pending.removeFirst()
            do {
                count(try Import.reply(try await answer.value))
            } catch let error as RPCErrorBody where retrySingly(error) {
                for item in items {
                    do {
                        count(try Import.reply(try await channel.request(body([item]), timeout: .seconds(30))))
                    } catch let error as RPCErrorBody where retrySingly(error) {
                        // Only the item's own fault counts as refused; ingest overloaded or
                        // restarting stops the import, which says so and exits non-zero, and
                        // running it again finishes the job.
                        refuse(item, error.message.replacingOccurrences(of: "\(field)[0].", with: ""), reasons: &reasons)
                    }
                }
            }
        }

        private mutating func count(_ reply: PublishReply) {
            tally.accepted += reply.accepted
            tally.duplicates += reply.duplicates
        }
    }

    static func reply(_ bytes: [UInt8]) throws -> PublishReply { try BusJSON.decode(RPCReply<PublishReply>.self, from: bytes).get() }

    private func open(_ file: String) throws(TrackFileError) -> (TrackFiles.Reader, size: Int?) {
        let format = try TrackFiles.format(ofFile: file)
        do {
            let source = try FileByteSource(path: file)
            return (TrackFiles.Reader(format: format, source: source), source.size)
        } catch {
            throw TrackFileError(location: file, message: error.message)
        }
    }

    /// `{"op":…,"device":…,"<field>":[…]}`, each item written by `write`.
    private static func batchBody<Item>(
        op: String, device: String, field: StaticString, _ items: [Item], write: (inout JSONWriter, Item) -> Void
    ) -> [UInt8] {
        var body = JSONWriter(capacity: 64 + items.count * 160)
        body.beginObject()
        body.key("op"); body.string(op)
        body.key("device"); body.string(device)
        body.key(field)
        body.beginArray()
        for item in items {
            body.beginObject()
            write(&body, item)
            body.endObject()
        }
        body.endArray()
        body.endObject()
        return body.bytes
    }

    private static func visitsBody(_ visits: [TrackReader.Visit], device: String) -> [UInt8] {
        batchBody(op: "publish_visits", device: device, field: "visits", visits) { body, visit in
            body.key("start"); body.date(visit.start)
            body.key("end"); body.date(visit.end)
            body.key("lat"); body.number(visit.lat)
            body.key("lon"); body.number(visit.lon)
            if let name = visit.name { body.key("name"); body.string(name) }
            if let address = visit.address { body.key("address"); body.string(address) }
            if let placeID = visit.placeID { body.key("place_id"); body.string(placeID) }
            if let semanticType = visit.semanticType { body.key("semantic_type"); body.string(semanticType) }
        }
    }

    private static func motionBody(_ activities: [TrackReader.Activity], device: String) -> [UInt8] {
        batchBody(op: "publish_motion", device: device, field: "samples", activities) { body, activity in
            body.key("start"); body.date(activity.time)
            body.key("activity"); body.string(activity.activity.rawValue)
            body.key("confidence"); body.string(activity.confidence.rawValue)
        }
    }

    private static func fixesBody(_ points: [TrackPoint], device: String) -> [UInt8] {
        // Only timed points are batched (the rest are counted and left out as they are read).
        PackedFixes.encode(device: device, fixes: points.map { point in
            PackedFixes.Fix(time: point.time!, lat: point.lat, lon: point.lon, accuracyM: point.accuracyM, altitudeM: point.altitudeM,
                            speedMps: point.speedMps, courseDeg: point.courseDeg)
        })
    }
}

typealias PublishReply = IngestRPCMessages.Stored

/// An import's progress: a bar with the bytes read, the points sent, their rate and the time left
/// on a terminal; on anything else (a log, a pipe) a plain line every 10 s.
final class Progress {
    let totalBytes: Int?
    let label: String
    private let terminal = isatty(STDERR_FILENO) == 1
    private let started = ContinuousClock.now
    private var lastLine = ContinuousClock.now

    init(totalBytes: Int?, label: String) {
        self.totalBytes = totalBytes
        self.label = label
    }

    func advance(bytes: Int, points: Int) {
        guard let totalBytes, totalBytes > 0 else { return }
        let elapsed = started.duration(to: .now).inSeconds
        let rate = elapsed > 0 ? Double(points) / elapsed : 0
        let byteRate = elapsed > 0 ? Double(bytes) / elapsed : 0
        let left = byteRate > 0 ? Int(Double(totalBytes - bytes) / byteRate) : nil
        let figures = "\(bytes >> 20)/\(totalBytes >> 20) MB, \(points) points, \(Int(rate))/s, "
            + "\(left.map { "\($0 / 60)m\(String(format: "%02d", $0 % 60))s left" } ?? "…")"
        if terminal {
            let width = 30
            let filled = min(width, width * bytes / totalBytes)
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
