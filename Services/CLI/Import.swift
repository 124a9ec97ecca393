import ArgumentParser
import DrivebusConfiguration
import DrivebusKit
import Foundation
import IngestCore

struct Import: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Import GPX, GeoJSON or CSV tracks for a device, through ingest (which must be running).")

    @OptionGroup var options: ConfigOption

    @Option(help: "The device the tracks belong to.")
    var device: String

    @Option(help: "Fixes per request to ingest.")
    var batch = 1000

    @Argument(help: "Files: .gpx, .geojson/.json or .csv.")
    var files: [String]

    func run() async throws {
        let config = try loadConfig(options)
        let bus = BusClient(settings: config.process, name: "import")
        let failed: Bool
        do {
            failed = try await importAll(bus: bus)
        } catch {
            await bus.shutdown()
            throw error
        }
        await bus.shutdown()
        if failed { throw ExitCode(1) }
    }

    /// Returns whether any file could not be read.
    private func importAll(bus: BusClient) async throws -> Bool {
        var failed = false
        for file in files {
            let points: [TrackPoint]
            do {
                guard let data = FileManager.default.contents(atPath: file) else { throw TrackFileError(location: file, message: "cannot read the file") }
                points = try TrackFiles.read(data, name: file)
            } catch {
                print("\(file): \(error)")
                failed = true
                continue
            }
            let timed = points.filter { $0.time != nil }
            var counts = (accepted: 0, duplicates: 0, refused: 0)
            var reasons: [String] = []
            let progress = Progress(total: timed.count, label: URL(fileURLWithPath: file).lastPathComponent)
            for start in stride(from: 0, to: timed.count, by: max(1, batch)) {
                let slice = Array(timed[start..<min(start + batch, timed.count)])
                do {
                    let reply = try await publish(slice, bus: bus)
                    counts.accepted += reply.accepted
                    counts.duplicates += reply.duplicates
                } catch let error as RPCErrorBody where error.code.hasPrefix("ingest.invalid") || error.code == "ingest.forbidden" {
                    // One bad point refuses its batch: send them singly to keep the good ones.
                    for point in slice {
                        do {
                            let reply = try await publish([point], bus: bus)
                            counts.accepted += reply.accepted
                            counts.duplicates += reply.duplicates
                        } catch let error as RPCErrorBody {
                            counts.refused += 1
                            if reasons.count < 5 { reasons.append("\(point.location): \(error.message.replacingOccurrences(of: "fixes[0].", with: ""))") }
                        }
                    }
                }
                progress.advance(to: min(start + batch, timed.count))
            }
            progress.finish()
            _ = try await bus.call(.ingest, IngestRPCMessages.ImportFinished(device: device, file: URL(fileURLWithPath: file).lastPathComponent, fixes: counts.accepted), as: PublishReply.self)
            print("\(file): \(points.count) points, \(counts.accepted) imported, \(counts.duplicates) already there, \(counts.refused) refused, \(points.count - timed.count) without a time")
            for reason in reasons { print("  refused \(reason)") }
        }
        return failed
    }

    private func publish(_ points: [TrackPoint], bus: BusClient) async throws -> PublishReply {
        let body = JSONValue.object(["op": .string("publish"), "device": .string(device), "fixes": .array(points.map(\.nativeJSON))])
        let reply = try await bus.loop.request(ZMQEndpoint(bus.settings.layout.rpcEndpoint(.ingest)), body: body.encoded, timeout: .seconds(30))
        return try BusJSON.decode(RPCReply<PublishReply>.self, from: reply).get()
    }
}

typealias PublishReply = IngestRPCMessages.Stored

/// A progress bar on standard error, drawn only when it is a terminal.
struct Progress {
    let total: Int
    let label: String
    private let enabled = isatty(STDERR_FILENO) == 1

    init(total: Int, label: String) {
        self.total = total
        self.label = label
    }

    func advance(to done: Int) {
        guard enabled, total > 0 else { return }
        let width = 30
        let filled = width * done / total
        let bar = String(repeating: "#", count: filled) + String(repeating: " ", count: width - filled)
        FileHandle.standardError.write(Data("\r\(label) [\(bar)] \(done)/\(total)".utf8))
    }

    func finish() {
        if enabled { FileHandle.standardError.write(Data("\n".utf8)) }
    }
}
