import ArgumentParser
import DrivebusFuzz
import Foundation

/// `drivebus-bench fuzz --cases N`: long seeded fuzz runs of every parser, one JSON line per
/// target. Exits non-zero if any target answered 5xx or stored from a refused request; a crash
/// ends the run (and shows in the exit status).
struct FuzzBench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "fuzz", abstract: "Seeded fuzzing of ingest, stats, track files and bus decoders.")

    @Option(help: "Cases per target.")
    var cases = 100_000

    @Option(help: "The seed; the same seed gives the same cases.")
    var seed: UInt64 = 1

    @Option(help: "Targets to run: ingest, stats, files, bus.")
    var targets = ["ingest", "stats", "files", "bus"]

    func run() async throws {
        var clean = true
        for target in targets {
            let result: FuzzReport
            switch target {
            case "ingest": result = try await Fuzz.ingest(cases: cases, seed: seed)
            case "stats": result = try await Fuzz.stats(cases: cases, seed: seed)
            case "files": result = try Fuzz.files(cases: cases, seed: seed)
            case "bus": result = Fuzz.bus(cases: cases, seed: seed)
            default: throw ValidationError("unknown target \(target)")
            }
            clean = clean && result.isClean
            report([
                "name": "fuzz.\(target)", "cases": result.cases, "seconds": (result.seconds * 10).rounded() / 10, "server_errors": result.serverErrors,
                "stored_from_rejected": result.storedFromRejected, "crashes": 0, "problems": result.problems,
                "statuses": Dictionary(uniqueKeysWithValues: result.statuses.map { (String($0.key), $0.value) }),
            ])
        }
        if !clean { throw ExitCode(1) }
    }
}
