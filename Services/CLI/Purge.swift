import ArgumentParser
import DrivebusConfiguration
import DrivebusKit
import Foundation
import StatsStore

struct Purge: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Delete a device's data between two times: from the journal, the services' events and stats (docs/data.md).",
        discussion: """
            The system must be running: the journal is ingest's. Purged fixes become stand-ins in the journal \
            (their seqs stay, so every service's position stays valid), so do the events the services derived \
            from them (trips, scores, zone crossings, gate calls, check-outs), and stats deletes the fixes, trips, \
            scores, map tiles, stays, zone crossings, gate calls and check-outs of the range. A purged fix that \
            an old client sends again is a duplicate and is not stored, unless --resend-ok.
            """)

    @OptionGroup var options: ConfigOption

    @Option(help: "The device whose data goes.")
    var device: String

    @Option(help: "From this time (RFC 3339) or day (YYYY-MM-DD, from its start, UTC).")
    var from: String

    @Option(help: "To this time (RFC 3339) or day (YYYY-MM-DD, to its end, UTC).")
    var to: String

    @Flag(help: "Let the purged data be sent again (by default a client's resend of it is refused as a duplicate).")
    var resendOK = false

    func run() async throws {
        let config = try loadConfig(options)
        guard let start = Self.time(from, endOfDay: false) else { throw Self.refusal("--from: expected an RFC 3339 time or a day YYYY-MM-DD, got \"\(from)\"", code: 2) }
        guard let end = Self.time(to, endOfDay: true) else { throw Self.refusal("--to: expected an RFC 3339 time or a day YYYY-MM-DD, got \"\(to)\"", code: 2) }
        guard start <= end else { throw Self.refusal("--from is after --to", code: 2) }
        print("drivebus purge: \(device) from \(RFC3339.format(start)) to \(RFC3339.format(end))")

        let bus = BusClient(settings: config.process, name: "purge")
        let outcome: SystemPurge.Outcome
        do {
            outcome = try await SystemPurge.run(device: device, from: start, to: end, resendOK: resendOK, bus: bus)
            await bus.shutdown()
        } catch {
            await bus.shutdown()
            throw Self.refusal("\(error). Is the system running? The same command again is safe: what was purged stays purged, and the rest is done.", code: 1)
        }
        let journal = outcome.journal
        let megabytes = { (bytes: Int64) in String(format: "%.1f MB", Double(bytes) / 1_000_000) }
        if journal.records == 0 {
            print("  journal: nothing of \(device) in that range (or it was purged before)")
        } else {
            print("  journal: \(journal.records) records in \(journal.segments) segment\(journal.segments == 1 ? "" : "s") (\(megabytes(journal.bytesBefore)) → \(megabytes(journal.bytesAfter)))"
                + (resendOK ? "; a client may send them again" : "; a client's resend of them stays a duplicate"))
        }
        for (service, purged) in outcome.events {
            let elsewhere = purged.rows.sorted { $0.key < $1.key }.map { ", \($0.key) \($0.value)" }.joined()
            print("  \(service.rawValue).events: \(purged.events) event\(purged.events == 1 ? "" : "s")\(elsewhere)")
        }
        for (service, reason) in outcome.unreached { print("  \(service.rawValue).events: not purged (\(reason))") }

        let database = config.layout.dataDir + "/drivebus.sqlite"
        if FileManager.default.fileExists(atPath: database) {
            do {
                // Opening runs SQLite's migrations, which block: on a thread of its own.
                let store = try await withCheckedThrowingContinuation { continuation in
                    Thread { continuation.resume(with: Result { try StatsStore(.init(path: database)) }) }.start()
                }
                let purged = try await store.purge(device: device, from: start, to: end)
                print("  stats: " + purged.map { "\($0.table) \($0.rows)" }.joined(separator: ", "))
            } catch {
                throw Self.refusal("stats was not purged (\(error)): run the same command again", code: 1)
            }
        } else {
            print("  stats: no database yet")
        }
        guard outcome.unreached.isEmpty else {
            throw Self.refusal("\(outcome.unreached.map(\.service.rawValue).joined(separator: ", ")) did not answer: run the same command again once it runs", code: 1)
        }
    }

    /// An RFC 3339 time, or a day: its first millisecond, or its last.
    static func time(_ text: String, endOfDay: Bool) -> Date? {
        if let time = RFC3339.parse(text) { return time }
        guard text.count == 10, let day = RFC3339.parse(text + "T00:00:00Z") else { return nil }
        return endOfDay ? day.addingTimeInterval(86_400 - 0.001) : day
    }

    static func refusal(_ message: String, code: Int32) -> ExitCode {
        FileHandle.standardError.write(Data("drivebus purge: \(message)\n".utf8))
        return ExitCode(code)
    }
}
