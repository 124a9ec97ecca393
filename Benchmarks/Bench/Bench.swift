import ArgumentParser
import Foundation

@main
struct Bench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "drivebus-bench",
        abstract: "drivebus benchmarks. Build with -c release; each prints one JSON line per case.",
        subcommands: [BusBench.self, SystemBench.self, RestBench.self, CodecBench.self, IngestBench.self, TripsBench.self, GeofenceBench.self, ScorerBench.self, AccuracyBench.self, CheckoutBench.self, ImportBench.self, MQTTBench.self, StatsBench.self, MapBench.self, LimitsBench.self, JournalBench.self, FuzzBench.self]
    )

    /// A reader that goes away early (`| head -1`) must not kill the benchmark before it has
    /// stopped the services it started: they would run on, unwatched. Its lines are then lost.
    static func main() async {
        signal(SIGPIPE, SIG_IGN)
        await main(nil)
    }
}

/// One result line: `{"name": …, "msgs_per_s": …, …}`.
func report(_ fields: [String: Any]) {
    let data = try! JSONSerialization.data(withJSONObject: fields, options: [.sortedKeys])
    try? FileHandle.standardOutput.write(contentsOf: data + Data("\n".utf8))
}

func seconds(_ duration: Duration) -> Double { duration.inSeconds }
