import ArgumentParser
import DrivebusGeo
import DrivebusSchema
import Foundation
import IngestCore
import ScorerCore

/// `drivebus-bench accuracy --data DIR`: labelled drives through the real scorer core.
///
/// DIR holds one drive per pair of files (`Benchmarks/datasets/README.md`): `NAME.csv` (`time,
/// lat,lon,speed,course,accuracy`) and `NAME.label.json` (`driver`, `road`, `behaviour`,
/// `reference_score`). Each drive is one trip. Prints a line per drive (score, components,
/// events by type, the scorer's distance against the track's) and a summary: per pair (one
/// driver, one road, `normal` against `aggressive`) whether the calm drive scored higher, and
/// the rank correlation of the scores with the data set's own reference score.
/// `--interval` thins the fixes to one every so many seconds, `--no-speed` drops the Doppler
/// speed and course: how phones that record sparsely, or positions alone, fare.
struct AccuracyBench: ParsableCommand {
    static let configuration = CommandConfiguration(commandName: "accuracy", abstract: "Driving scores on labelled drives.")

    @Option(help: "The folder of labelled drives.")
    var data: String

    @Option(help: "Keep one fix every this many seconds (0: all).")
    var interval = 0.0

    @Flag(help: "Drop the phone's speed and course: positions only.")
    var noSpeed = false

    @Option(help: "Override scorer.harsh_brake_mps2 (negative), to sweep thresholds.")
    var harshBrake: Double?

    @Option(help: "Override scorer.harsh_accel_mps2, to sweep thresholds.")
    var harshAccel: Double?

    @Option(help: "Override scorer.corner_margin, to sweep thresholds.")
    var cornerMargin: Double?

    struct Label: Decodable {
        var driver: String
        var road: String
        var behaviour: String
        var referenceScore: Double?

        enum CodingKeys: String, CodingKey {
            case driver, road, behaviour
            case referenceScore = "reference_score"
        }
    }

    struct Result {
        var name: String
        var label: Label
        var scored: DriveScored
    }

    func run() throws {
        let names = try FileManager.default.contentsOfDirectory(atPath: data)
            .filter { $0.hasSuffix(".label.json") }.map { String($0.dropLast(".label.json".count)) }.sorted()
        guard !names.isEmpty else { throw ValidationError("\(data) holds no NAME.label.json files") }
        var configuration = ScorerConfiguration()
        if let harshBrake { configuration.harshBrakeMps2 = harshBrake }
        if let harshAccel { configuration.harshAccelMps2 = harshAccel }
        if let cornerMargin { configuration.cornerMargin = cornerMargin }
        try configuration.validate()
        var results: [Result] = []
        for name in names {
            let base = (data as NSString).appendingPathComponent(name)
            let label = try JSONDecoder().decode(Label.self, from: Data(contentsOf: URL(fileURLWithPath: base + ".label.json")))
            let points = try TrackFiles.read(Data(contentsOf: URL(fileURLWithPath: base + ".csv")), name: name + ".csv")
            var fixes: [Fix] = []
            for point in points {
                // The scorer leaves out fixes it finds too inaccurate; so does the track to compare with.
                guard let time = point.time, (point.accuracyM ?? 0) <= configuration.maxAccuracyM else { continue }
                // Nor does either count a fix older than the one before (a clock that jumped back).
                if let last = fixes.last, time <= last.time { continue }
                if interval > 0, let last = fixes.last, time.timeIntervalSince(last.time) < interval - 0.001 { continue }
                fixes.append(Fix(
                    seq: UInt64(fixes.count + 1), device: "car", time: time, lat: point.lat, lon: point.lon,
                    accuracyM: point.accuracyM, speedMps: noSpeed ? nil : point.speedMps,
                    courseDeg: noSpeed ? nil : point.courseDeg, source: .import))
            }
            guard let first = fixes.first, let last = fixes.last else { continue }
            var scorer = DriveScorer(configuration: configuration)
            let trip = ScorerTrip(tripID: name, device: "car", startTime: first.time, endTime: last.time, firstSeq: 1, lastSeq: last.seq)
            var outputs = scorer.handle(.tripStarted(trip))
            for fix in fixes { outputs += scorer.handle(.fix(fix)) }
            outputs += scorer.handle(.tripEnded(trip))
            guard let scored = outputs.lazy.compactMap({ if case .scored(let scored) = $0 { scored } else { nil } }).first else { continue }
            let track = zip(fixes, fixes.dropFirst()).reduce(0.0) {
                $0 + Geo.distance(Coordinate(lat: $1.0.lat, lon: $1.0.lon), Coordinate(lat: $1.1.lat, lon: $1.1.lon))
            }
            results.append(Result(name: name, label: label, scored: scored))
            var line: [String: Any] = [
                "name": "accuracy.drive", "drive": name, "driver": label.driver, "road": label.road,
                "behaviour": label.behaviour, "score": scored.score, "fixes": fixes.count,
                "distance_m": scored.distanceM, "track_m": (track * 10).rounded() / 10,
                "distance_error_pct": track > 0 ? ((scored.distanceM - track) / track * 10_000).rounded() / 100 : 0,
                "counts": scored.counts, "speed_variation": scored.speedVariation,
                "components": (scored.components ?? []).map { ["name": $0.name, "value": $0.value, "unit": $0.unit, "points": $0.points] },
            ]
            if let reference = label.referenceScore { line["reference_score"] = reference }
            report(line)
        }

        // Pairs: one driver on one road, calm against aggressive.
        var agree = 0, ties = 0, reversed = 0
        // Every normal drive against every aggressive one of the same driver on the same road.
        var byKey: [String: [String: [Double]]] = [:]
        for result in results { byKey["\(result.label.driver)/\(result.label.road)", default: [:]][result.label.behaviour, default: []].append(result.scored.score) }
        for (_, scores) in byKey {
            for calm in scores["normal"] ?? [] {
                for aggressive in scores["aggressive"] ?? [] {
                    if calm > aggressive { agree += 1 } else if calm == aggressive { ties += 1 } else { reversed += 1 }
                }
            }
        }
        let referenced = results.filter { $0.label.referenceScore != nil }
        var eventsByBehaviour: [String: [Int]] = [:]
        for result in results {
            let harsh = result.scored.counts.filter { $0.key != DriveEventType.speeding.rawValue }.values.reduce(0, +)
            eventsByBehaviour[result.label.behaviour, default: []].append(harsh)
        }
        report([
            "name": "accuracy.summary", "drives": results.count, "pairs": agree + ties + reversed,
            "calm_higher": agree, "ties": ties, "aggressive_higher": reversed,
            "spearman_vs_reference": Self.spearman(referenced.map(\.scored.score), referenced.map { $0.label.referenceScore! }) as Any,
            "harsh_events_per_drive": eventsByBehaviour.mapValues { Double($0.reduce(0, +)) / Double(max($0.count, 1)) },
            "interval_s": interval, "positions_only": noSpeed,
        ])
    }

    /// Spearman's rank correlation, ties given their mean rank; nil under three pairs.
    static func spearman(_ a: [Double], _ b: [Double]) -> Double? {
        guard a.count == b.count, a.count >= 3 else { return nil }
        func ranks(_ values: [Double]) -> [Double] {
            let order = values.indices.sorted { values[$0] < values[$1] }
            var ranks = [Double](repeating: 0, count: values.count)
            var start = 0
            while start < order.count {
                var end = start
                while end + 1 < order.count, values[order[end + 1]] == values[order[start]] { end += 1 }
                for index in start...end { ranks[order[index]] = Double(start + end) / 2 + 1 }
                start = end + 1
            }
            return ranks
        }
        let ra = ranks(a), rb = ranks(b)
        let meanA = ra.reduce(0, +) / Double(ra.count), meanB = rb.reduce(0, +) / Double(rb.count)
        var covariance = 0.0, varianceA = 0.0, varianceB = 0.0
        for index in ra.indices {
            covariance += (ra[index] - meanA) * (rb[index] - meanB)
            varianceA += (ra[index] - meanA) * (ra[index] - meanA)
            varianceB += (rb[index] - meanB) * (rb[index] - meanB)
        }
        guard varianceA > 0, varianceB > 0 else { return nil }
        return ((covariance / (varianceA * varianceB).squareRoot()) * 1000).rounded() / 1000
    }
}
