import ArgumentParser
import DrivebusKit
import Foundation

/// `drivebus-bench codec`: the JSON work in one envelope, piece by piece, on one thread.
struct CodecBench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "codec", abstract: "Measure envelope and Fix encoding and decoding.")

    @Option(help: "Iterations per case.")
    var iterations = 200_000

    func run() throws {
        let fix = Fix(
            seq: 1, device: "car", time: Date(timeIntervalSince1970: 1_763_700_000.25), lat: 48.208_2, lon: 16.373_8,
            accuracyM: 5, altitudeM: 180.5, speedMps: 13.4, courseDeg: 271, battery: 0.82, source: .overland)
        let header = EnvelopeHeader(type: "fix", source: "ingest", seq: 1, epoch: UUID().uuidString.lowercased(), time: Date())
        let fixJSON = try BusJSON.encode(fix)
        let frames = [Array("fix.car".utf8), header.encoded(), fixJSON]

        func time(_ name: String, _ body: () throws -> Void) rethrows {
            let started = ContinuousClock.now
            for _ in 0..<iterations { try body() }
            report(["name": "codec \(name)", "ops_per_s": Int(Double(iterations) / seconds(started.duration(to: .now)))])
        }
        try time("encode fix") { _ = try BusJSON.encode(fix) }
        time("encode header") { _ = header.encoded() }
        time("uuid (Foundation)") { _ = UUID().uuidString.lowercased() }
        time("event id") { _ = EventID.make(run: 0x1234_5678_9abc_def0, seq: 42) }
        try time("decode envelope") { _ = try BusMessage(frames: frames) }
        try time("decode fix") { _ = try BusJSON.decode(Fix.self, from: fixJSON) }
    }
}
