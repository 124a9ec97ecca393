import ArgumentParser
import CheckoutCore
import DrivebusSchema
import Foundation
import IngestCore

/// `drivebus-bench checkout --data DIR`: labelled rides through the real check-out core.
///
/// DIR holds one ride per pair of files (`Benchmarks/datasets/README.md`):
/// - `NAME.csv`: the rider's fixes, a header `time,lat,lon` and optionally `speed` (m/s) and
///   `accuracy` (m), as `drivebus import` reads CSV;
/// - `NAME.motion.csv`, optional: the phone's motion samples, a header `start,activity,confidence`
///   (RFC 3339; `MotionSample`'s activity and confidence names), fed in time order with the fixes;
/// - `NAME.label.json`: `{"checkin": RFC 3339, "change": RFC 3339 or null}`, the check-in and
///   the labelled moment the rider got out (null: a ride that must not check out). With
///   `"change_is": "stop"` the label marks when the vehicle stopped (GOAL labels it so), and is
///   compared with the check-out's `stopped_at`; by default it marks when the walk began, and is
///   compared with `checkout_time`.
///
/// Each ride is fed three ways: replayed (fixes only, as a catch-up does), live (a tick every
/// second of the ride's time) and in late batches (60 fixes at a time, a tick 30 s after each).
/// Prints one line per ride (`delay_s`: check-out time minus the label; `decided_after_s`: when
/// it was known, minus the label) and a summary. A check-out more than `--tolerance` before the
/// change, or in a ride without one, is false.
struct CheckoutBench: ParsableCommand {
    static let configuration = CommandConfiguration(commandName: "checkout", abstract: "Check-out delays on labelled rides.")

    @Option(help: "The folder of labelled rides.")
    var data: String

    @Option(help: "Seconds from the labelled change that still count as right.")
    var tolerance = 30.0

    @Option(help: "Override checkout.walk_confirm_s, to sweep it.")
    var walkConfirm: Double?

    @Option(help: "Override checkout.walk_min_distance_m, to sweep it.")
    var walkMinDistance: Double?

    @Option(help: "Override checkout.walk_aside_m, to sweep it.")
    var walkAside: Double?

    @Flag(help: "Leave out the rides' motion samples, to see what they add.")
    var withoutMotion = false

    struct Label: Decodable {
        var checkin: String
        var change: String?
        /// What `change` marks: `walk` (the default) or `stop`.
        var changeIs: String?

        enum CodingKeys: String, CodingKey {
            case checkin, change
            case changeIs = "change_is"
        }
    }

    func run() throws {
        let names = try FileManager.default.contentsOfDirectory(atPath: data)
            .filter { $0.hasSuffix(".label.json") }.map { String($0.dropLast(".label.json".count)) }.sorted()
        guard !names.isEmpty else { throw ValidationError("\(data) holds no NAME.label.json files") }
        var configuration = CheckoutConfiguration()
        if let walkConfirm { configuration.walkConfirmS = walkConfirm }
        if let walkMinDistance { configuration.walkMinDistanceM = walkMinDistance }
        if let walkAside { configuration.walkAsideM = walkAside }
        var delays: [Double] = [], decided: [Double] = []
        var within = 0, late = 0, missed = 0, falseCheckouts = 0, rides = 0, rideOnly = 0, modesDiffer = 0
        // Both times against every label, whatever it marks: which one real labels sit closer to.
        var checkoutWithin = 0, stoppedWithin = 0
        for name in names {
            let base = (data as NSString).appendingPathComponent(name)
            let label = try JSONDecoder().decode(Label.self, from: Data(contentsOf: URL(fileURLWithPath: base + ".label.json")))
            guard let checkin = RFC3339.parse(label.checkin) else { throw ValidationError("\(name): checkin is not an RFC 3339 time") }
            let change = try label.change.map { text -> Date in
                guard let time = RFC3339.parse(text) else { throw ValidationError("\(name): change is not an RFC 3339 time") }
                return time
            }
            guard label.changeIs == nil || label.changeIs == "walk" || label.changeIs == "stop" else {
                throw ValidationError("\(name): change_is is neither \"walk\" nor \"stop\"")
            }
            let points = try TrackFiles.read(Data(contentsOf: URL(fileURLWithPath: base + ".csv")), name: name + ".csv")
            let fixes = points.compactMap { point -> Fix? in
                guard let time = point.time else { return nil }
                return Fix(device: "rider", time: time, lat: point.lat, lon: point.lon, accuracyM: point.accuracyM,
                           speedMps: point.speedMps, source: .import)
            }
            let motionPath = base + ".motion.csv"
            let motion = withoutMotion || !FileManager.default.fileExists(atPath: motionPath)
                ? [] : try Self.readMotion(Data(contentsOf: URL(fileURLWithPath: motionPath)), name: name + ".motion.csv")
            let samples = Self.merge(fixes: fixes, motion: motion)
            let replayed = Self.replay(configuration, checkin: checkin, samples: samples, ticks: .none)
            let live = Self.replay(configuration, checkin: checkin, samples: samples, ticks: .everySecond)
            let batched = Self.replay(configuration, checkin: checkin, samples: samples, ticks: .batches(of: 60))
            // What was decided, not when it became known (a tick may bring that forward).
            func outcome(_ checkouts: [TaxiCheckout]) -> [String] {
                checkouts.map { "\($0.reason) \($0.checkoutTime) \($0.stoppedAt.map { "\($0)" } ?? "-")" }
            }
            let differ = outcome(replayed) != outcome(live) || outcome(replayed) != outcome(batched)
            if differ { modesDiffer += 1 }

            var line: [String: Any] = ["name": "checkout.ride", "ride": name, "fixes": fixes.count, "motion_samples": motion.count, "modes_agree": !differ]
            if differ {
                for (mode, result) in [("replayed", replayed), ("live", live), ("batched", batched)] {
                    line[mode] = result.map { "\($0.reason.rawValue) \(RFC3339.format($0.checkoutTime))" }
                }
            }
            let checkout = replayed.first { $0.reason != .maxRide }
            if let checkout {
                line["reason"] = checkout.reason.rawValue
                line["checkout"] = RFC3339.format(checkout.checkoutTime)
                if let walked = checkout.walkedM { line["walked_m"] = walked }
                if let stoppedAt = checkout.stoppedAt { line["stopped_at"] = RFC3339.format(stoppedAt) }
                if let confidence = checkout.confidence { line["confidence"] = confidence.rawValue }
            }
            if let change {
                rides += 1
                line["change"] = RFC3339.format(change)
                if let checkout {
                    // A label of the stop is compared with when the taxi stopped; a motion walk
                    // has no stop, and its start is the best the detector knows.
                    let walkDelay = checkout.checkoutTime.timeIntervalSince(change)
                    let stopDelay = (checkout.stoppedAt ?? checkout.checkoutTime).timeIntervalSince(change)
                    let delay = label.changeIs == "stop" ? stopDelay : walkDelay
                    line["delay_s"] = delay
                    if label.changeIs == "stop" { line["checkout_delay_s"] = walkDelay }
                    if abs(walkDelay) <= tolerance { checkoutWithin += 1 }
                    if abs(stopDelay) <= tolerance { stoppedWithin += 1 }
                    delays.append(delay)
                    if let decidedAt = checkout.decidedAt {
                        line["decided_after_s"] = decidedAt.timeIntervalSince(change)
                        decided.append(decidedAt.timeIntervalSince(change))
                    }
                    if abs(delay) <= tolerance { within += 1 } else if delay < -tolerance { falseCheckouts += 1 } else { late += 1 }
                } else {
                    missed += 1
                }
            } else {
                rideOnly += 1
                if checkout != nil { falseCheckouts += 1 }
            }
            report(line)
        }
        report([
            "name": "checkout.summary", "rides_with_change": rides, "rides_without": rideOnly,
            "within_tolerance": within, "checkout_time_within": checkoutWithin, "stopped_at_within": stoppedWithin, "late": late, "missed": missed, "false_checkouts": falseCheckouts,
            "share_within": rides == 0 ? 0 : Double(within) / Double(rides), "tolerance_s": tolerance,
            "median_abs_delay_s": Self.median(delays.map(abs)), "median_decided_after_s": Self.median(decided),
            "modes_differ": modesDiffer,
        ])
    }

    enum Ticks { case none, everySecond, batches(of: Int) }

    /// A fix or a motion sample, as the check-out core takes them.
    enum Sample {
        case fix(Fix)
        case motion(MotionSample)

        var time: Date {
            switch self {
            case .fix(let fix): fix.time
            case .motion(let sample): sample.start
            }
        }
    }

    /// Fixes (in file order, which the converters keep in time order) with each motion sample
    /// before the first fix later than it; at the same instant the fix comes first.
    static func merge(fixes: [Fix], motion: [MotionSample]) -> [Sample] {
        var merged: [Sample] = []
        merged.reserveCapacity(fixes.count + motion.count)
        var next = 0
        for fix in fixes {
            while next < motion.count, motion[next].start < fix.time {
                merged.append(.motion(motion[next]))
                next += 1
            }
            merged.append(.fix(fix))
        }
        merged += motion[next...].map(Sample.motion)
        return merged
    }

    /// `start,activity,confidence` rows, sorted by start (in file order at the same start).
    static func readMotion(_ data: Data, name: String) throws -> [MotionSample] {
        let lines = String(decoding: data, as: UTF8.self).split(omittingEmptySubsequences: false, whereSeparator: \.isNewline)
        guard lines.first?.trimmingCharacters(in: .whitespaces) == "start,activity,confidence" else {
            throw ValidationError("\(name): the header is not start,activity,confidence")
        }
        var samples: [(line: Int, sample: MotionSample)] = []
        for (index, line) in lines.enumerated().dropFirst() where !line.allSatisfy(\.isWhitespace) {
            let fields = line.split(separator: ",", omittingEmptySubsequences: false).map { $0.trimmingCharacters(in: .whitespaces) }
            guard fields.count == 3, let start = RFC3339.parse(fields[0]),
                let activity = MotionSample.Activity(rawValue: fields[1]), let confidence = MotionSample.Confidence(rawValue: fields[2])
            else { throw ValidationError("\(name): line \(index + 1) is not an RFC 3339 time, an activity and a confidence") }
            samples.append((index, MotionSample(device: "rider", start: start, activity: activity, confidence: confidence, source: .import)))
        }
        return samples.sorted { ($0.sample.start, $0.line) < ($1.sample.start, $1.line) }.map(\.sample)
    }

    /// The check-outs of one ride fed with its samples numbered from seq 2, the check-in being
    /// seq 1; motion samples from before the check-in (the activity in progress) come first,
    /// unnumbered.
    static func replay(_ configuration: CheckoutConfiguration, checkin: Date, samples: [Sample], ticks: Ticks) -> [TaxiCheckout] {
        var detector = CheckoutDetector(configuration: configuration)
        // What the phone sent before the check-in (the activity in progress) comes before it.
        let earlier = samples.prefix { $0.time < checkin }
        for case .motion(let motion) in earlier { _ = detector.handle(.motion(motion)) }
        var out = detector.handle(.checkin(TaxiCheckin(seq: 1, device: "rider", time: checkin)))
        var clock = checkin
        for (index, sample) in samples.enumerated().dropFirst(earlier.count) {
            if case .everySecond = ticks {
                while clock + 1 <= sample.time {
                    clock += 1
                    out += detector.handle(.tick(now: clock))
                }
            }
            switch sample {
            case .fix(var fix):
                fix.seq = UInt64(index + 2)
                out += detector.handle(.fix(fix))
            case .motion(var motion):
                motion.seq = UInt64(index + 2)
                out += detector.handle(.motion(motion))
            }
            if case .batches(let size) = ticks, (index + 1) % size == 0 || index == samples.count - 1 {
                for second in 1...30 { out += detector.handle(.tick(now: sample.time + Double(second))) }
            }
        }
        return out
    }

    static func median(_ values: [Double]) -> Double? {
        guard !values.isEmpty else { return nil }
        let sorted = values.sorted()
        return sorted.count % 2 == 1 ? sorted[sorted.count / 2] : (sorted[sorted.count / 2 - 1] + sorted[sorted.count / 2]) / 2
    }
}
