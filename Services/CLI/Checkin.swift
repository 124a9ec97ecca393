import ArgumentParser
import DrivebusConfiguration
import DrivebusKit
import Foundation

struct Checkin: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Check a rider into a taxi: drivebus-checkout then watches for the moment they get out.")

    @OptionGroup var options: ConfigOption

    @Option(help: "The rider's device.")
    var device: String

    @Option(help: "When they boarded (RFC 3339); default: now.")
    var at: String?

    func run() async throws {
        let config = try loadConfig(options)
        var time: Date?
        if let at {
            guard let parsed = RFC3339.parse(at) else {
                FileHandle.standardError.write(Data("drivebus checkin: --at: expected an RFC 3339 time such as 2026-11-21T18:30:00Z, got \"\(at)\"\n".utf8))
                throw ExitCode(2)
            }
            time = parsed
        }
        let bus = BusClient(settings: config.process, name: "checkin")
        do {
            let reply = try await bus.call(.ingest, IngestRPCMessages.Checkin(device: device, time: time), as: PublishReply.self)
            print("checked in \(device) at \(RFC3339.format(time ?? Date())) (journal seq \(reply.lastSeq))")
            await bus.shutdown()
        } catch {
            await bus.shutdown()
            FileHandle.standardError.write(Data("drivebus checkin: \(error)\n".utf8))
            throw ExitCode(1)
        }
    }
}
