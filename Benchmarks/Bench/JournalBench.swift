import ArgumentParser
import DrivebusConfiguration
import DrivebusJournal
import DrivebusKit
import Foundation
import Glibc
import Synchronization

/// `drivebus-bench journal`: the ingest journal at a size people keep for years.
///
/// A journal of `--fixes` fixes from `--devices` phones at 1 Hz each (generated once into
/// `--state`, and reused when it is already there), then:
/// - `journal open`: opening it in this process: time, and memory held afterwards;
/// - `journal ingest start`: the real `drivebus-ingest` (and bus) on it: time until it answers
///   `/healthz`, and its resident memory then;
/// - `journal append`: 16 appenders, batches of 100 new fixes, each commit synced: on an empty
///   journal and on the big one, and a raw `write` + `fdatasync` of the same bytes as the peer.
///   The "empty" journal is a new one whose active segment is first filled (untimed) to as many
///   bytes as the big one's, so that both seal as often: a segment holds about 200,600 of these
///   fixes, and a new journal would otherwise never seal within a run of 200,000 while the big
///   one seals once in each;
/// - `journal resend`: batches of fixes already in sealed segments (dedup read from disk);
/// - `journal replay day`: one device's day by the index by device and time;
/// - `journal replay seq`: 10,000 records from the middle by seq;
/// - `journal retention`: a year of fixes expired while 10,000 fixes/s arrive (below).
struct JournalBench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "journal", abstract: "Measure the segmented journal at scale.")

    @Option(help: "Fixes in the big journal.")
    var fixes = 100_000_000

    @Option(help: "Phones, each recording at 1 Hz, interleaved.")
    var devices = 10

    @Option(help: "Where the big journal is kept between runs (generated when missing or smaller).")
    var state = "/tmp/drivebus-journal-bench"

    @Option(help: "New fixes appended in the append cases.")
    var appends = 200_000

    @Option(help: "Rounds of the append cases (big, empty, empty, big or the mirror, then raw); medians are reported.")
    var rounds = 5

    @Option(help: "Days of the year that the retention case expires (two hours of 1 Hz driving each).")
    var yearDays = 365

    // Calm windows as long as the compacting one (about 33 s here), so that each is as likely to
    // hold the rare 40–100 ms waits (most likely seals: one every 32 MB, about every 20–25 s at
    // this rate): with 10 s ones the ratio swung 0.85–1.64 between runs of the same code.
    @Option(help: "Seconds of 10,000 fixes/s in the retention case before the compaction and after it, and at least this long during it.")
    var loadSeconds = 30

    static let start = 1_500_000_000.0

    func validate() throws {
        guard fixes >= 1, devices >= 1, appends >= 1, rounds >= 1, yearDays >= 1, loadSeconds >= 1 else {
            throw ValidationError("every count must be at least 1")
        }
    }

    func fix(_ index: Int) -> JournalRecord {
        let device = "phone\(index % devices)"
        let second = Double(index / devices)
        return JournalRecord(.fix(Fix(
            device: device, time: Date(timeIntervalSince1970: Self.start + second), lat: 48.2 + (second.truncatingRemainder(dividingBy: 3600)) * 1e-5,
            lon: 16.3 + Double(index % devices) * 1e-3, accuracyM: 5, speedMps: 12.5, source: .api)))
    }

    /// A fix of a phone of its own, from before everything the big journal holds: what fills an
    /// empty journal's active segment before it is timed.
    func filler(_ index: Int) -> JournalRecord {
        JournalRecord(.fix(Fix(
            device: "filler", time: Date(timeIntervalSince1970: Self.start - 1_000_000 + Double(index)), lat: 48.2, lon: 16.3,
            accuracyM: 5, speedMps: 12.5, source: .api)))
    }

    func run() async throws {
        let directory = state + "/journal"
        let have = try Self.count(directory)
        if have < fixes {
            try? FileManager.default.removeItem(atPath: state)
            try FileManager.default.createDirectory(atPath: state, withIntermediateDirectories: true)
            let started = ContinuousClock.now
            let journal = try Journal(path: directory) { _ in }
            let batch = 10_000
            try await withThrowingTaskGroup(of: Void.self) { group in
                for worker in 0..<2 {
                    group.addTask {
                        // Each worker its own interleaved share; seqs keep time order only per commit.
                        for first in stride(from: worker * batch, to: fixes, by: 2 * batch) {
                            _ = try await journal.append((first..<min(first + batch, fixes)).map(fix))
                        }
                    }
                }
                try await group.waitForAll()
            }
            journal.shutdown()
            let took = seconds(started.duration(to: .now))
            report(["name": "journal generate", "fixes": fixes, "seconds": took, "fixes_per_s": Int(Double(fixes) / took), "bytes": try Self.bytes(directory)])
        }
        let bytes = try Self.bytes(directory)

        // Opening in this process.
        let rssBefore = Self.residentMegabytes()
        let opening = ContinuousClock.now
        let big = try Journal(path: directory) { _ in }
        let openSeconds = seconds(opening.duration(to: .now))
        let layout = big.layout
        report(["name": "journal open", "records": big.lastSeq, "bytes": bytes, "sealed_segments": layout.sealedSegments,
                "active_records": layout.activeRecords, "seconds": openSeconds, "rss_added_mb": Self.residentMegabytes() - rssBefore])

        // Replay: one device's day (five days, then the same five again: the first pass reads
        // what is not in the page cache from the disk), and a stretch by seq.
        let days = Double(fixes / devices) / 86_400
        var dayTimes: [[Double]] = [[], []]
        var dayCount = 0
        for pass in 0..<2 {
            for run in 0..<5 {
                let day = (Double(run) + 0.5) * days / 5
                let from = Date(timeIntervalSince1970: Self.start + (day.rounded(.down)) * 86_400)
                let started = ContinuousClock.now
                let entries = try big.replay(device: "phone\(run % devices)", from: from, to: from.addingTimeInterval(86_399.999))
                dayTimes[pass].append(seconds(started.duration(to: .now)) * 1000)
                dayCount = entries.count
            }
        }
        report(["name": "journal replay day", "records_per_day": dayCount, "runs": 5,
                "first_ms_median": dayTimes[0].sorted()[2], "first_ms_max": dayTimes[0].max()!,
                "again_ms_median": dayTimes[1].sorted()[2], "again_ms_max": dayTimes[1].max()!])
        let middle = big.lastSeq / 2
        let seqStarted = ContinuousClock.now
        let stretch = try big.replay(fromSeq: middle, limit: 10_000)
        report(["name": "journal replay seq", "records": stretch.count, "ms": seconds(seqStarted.duration(to: .now)) * 1000])

        // Appends: new fixes onto the big journal, an empty one, and a raw file, in rounds (the
        // disk's sync time drifts); the median of the rounds' ratios reported.
        var onBig: [Double] = [], onEmpty: [Double] = [], raw: [Double] = [], ratios: [Double] = []
        var seals: (big: [Int], empty: [Int]) = ([], [])
        let emptyDirectory = state + "/empty"
        for round in 0..<rounds {
            // Big, empty, empty, big (or the mirror): what ran just before can weigh on the next
            // (going second once cost 10 % or so), so each journal runs once in each place.
            // Each empty run gets a new journal.
            var bigRates: [Double] = [], emptyRates: [Double] = []
            var fresh: [JournalRecord] = []
            for onTheBig in round % 2 == 0 ? [true, false, false, true] : [false, true, true, false] {
                // Past everything the big journal holds (an earlier run's appends too).
                fresh = (0..<appends).map { fix(Int(big.lastSeq) + $0) }
                if !onTheBig { try? FileManager.default.removeItem(atPath: emptyDirectory) }
                // Every run starts with nothing of the last one's still being written back.
                sync()
                if onTheBig {
                    let sealedBefore = big.layout.sealedSegments
                    bigRates.append(try await Self.appendRate(fresh, to: big))
                    seals.big.append(big.layout.sealedSegments - sealedBefore)
                } else {
                    let empty = try Journal(path: emptyDirectory) { _ in }
                    // As many bytes as the big journal's active segment holds now (segments seal
                    // by size), in ever smaller pieces so as not to pass it. Older than the run's
                    // fixes, so that they never send dedup to a sealed segment.
                    var filled = 0
                    while case let missing = big.layout.activeBytes - empty.layout.activeBytes, missing > 0 {
                        let count = Int(max(1, min(10_000, missing / 256)))
                        _ = try await Self.appendAll((filled..<filled + count).map(filler), to: empty)
                        filled += count
                    }
                    sync()
                    emptyRates.append(try await Self.appendRate(fresh, to: empty))
                    seals.empty.append(empty.layout.sealedSegments)
                    empty.shutdown()
                }
            }
            onBig += bigRates
            onEmpty += emptyRates
            ratios.append(bigRates.reduce(0, +) / emptyRates.reduce(0, +))
            raw.append(try Self.rawAppendRate(fresh, path: state + "/raw.log"))
        }
        try? FileManager.default.removeItem(atPath: emptyDirectory)
        let resent = (0..<appends / 10).map { fix($0 * 997 % fixes) }
        let resendStarted = ContinuousClock.now
        let resendOutcomes = try await Self.appendAll(resent, to: big)
        let resendSeconds = seconds(resendStarted.duration(to: .now))
        let lastSeq = big.lastSeq
        big.shutdown()
        func median(_ values: [Double]) -> Double { values.sorted()[values.count / 2] }
        report(["name": "journal append", "fixes": appends, "appenders": 16, "batch": 100, "rounds": rounds,
                "empty_fixes_per_s": Int(median(onEmpty)), "big_fixes_per_s": Int(median(onBig)), "big_vs_empty": (median(ratios) * 1000).rounded() / 1000,
                "big_vs_empty_by_round": ratios.map { ($0 * 1000).rounded() / 1000 },
                "seals_per_run_big": seals.big, "seals_per_run_empty": seals.empty,
                "raw_fdatasync_fixes_per_s": Int(median(raw)), "empty_vs_raw": (median(onEmpty) / median(raw) * 1000).rounded() / 1000])
        report(["name": "journal resend", "fixes": resent.count, "duplicates": resendOutcomes.filter { $0 == .duplicate }.count,
                "fixes_per_s": Int(Double(resent.count) / resendSeconds)])

        // The real ingest on the big journal (bus too: ingest publishes to it).
        let starting = ContinuousClock.now
        let system = try await BenchSystem(services: [.bus, .ingest], extraConfig: "") { config in
            try FileManager.default.createDirectory(atPath: config.layout.dataDir, withIntermediateDirectories: true)
            try FileManager.default.createSymbolicLink(atPath: config.layout.dataDir + "/journal", withDestinationPath: directory)
        }
        let startSeconds = seconds(starting.duration(to: .now))
        let resident = system.residentMegabytes()["drivebus-ingest"] ?? -1
        let peak = system.peakRSSMegabytes()["drivebus-ingest"] ?? -1
        system.stop()
        report(["name": "journal ingest start", "records": lastSeq, "seconds_to_healthz": startSeconds, "ingest_rss_mb": resident, "ingest_peak_rss_mb": peak])

        try await retentionUnderLoad()
    }

    /// `journal retention`: a year of one phone's driving (1 Hz, two hours a day: 2.6M fixes),
    /// all of it past the retention, expired at once while new fixes arrive at 10,000/s in
    /// batches of 100. Each batch's wait is timed from when it was due (so a stall is not hidden
    /// by the batches that could not start), for `loadSeconds` without the compaction, then for
    /// as long as it runs (at least `loadSeconds`), then for `loadSeconds` after it.
    func retentionUnderLoad() async throws {
        let directory = state + "/year"
        try? FileManager.default.removeItem(atPath: directory)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let journal = try Journal(path: directory) { _ in }
        defer { journal.shutdown() }
        let yearStart = Date().timeIntervalSince1970 - 3 * 365 * 86_400
        let perDay = yearDays == 365 ? 7200 : max(1, 7200 * yearDays / 365)
        for day in 0..<yearDays {
            let records = (0..<perDay).map { second in
                JournalRecord(.fix(Fix(
                    device: "driver", time: Date(timeIntervalSince1970: yearStart + Double(day) * 86_400 + 8 * 3600 + Double(second)),
                    lat: 48.2 + Double(second) * 1e-5, lon: 16.3 + Double(day) * 1e-4, accuracyM: 5, speedMps: 12, source: .api)))
            }
            _ = try await journal.append(records)
        }
        let expired = journal.lastSeq
        // The year just written is still being written back: the quiet run measures ingest, not that.
        sync()
        var next = 0
        func load(lasting minimumSeconds: Int, until done: @escaping @Sendable () -> Bool) async throws -> [Double] {
            let started = ContinuousClock.now
            return try await withThrowingTaskGroup(of: Double.self) { group in
                var batch = 0
                while batch < minimumSeconds * 100 || !done() {
                    let due = started + .milliseconds(10 * batch)
                    try await Task.sleep(until: due)
                    let records = (0..<100).map { index in
                        JournalRecord(.fix(Fix(
                            device: "live", time: Date(timeIntervalSince1970: yearStart + 3 * 365 * 86_400 + Double(next + index) * 1e-4),
                            lat: 48.2, lon: 16.3 + Double(next + index) * 1e-7, source: .api)))
                    }
                    next += 100
                    group.addTask {
                        _ = try await journal.append(records)
                        return seconds(due.duration(to: .now)) * 1000
                    }
                    batch += 1
                }
                return try await group.reduce(into: []) { $0.append($1) }.sorted()
            }
        }
        func percentile(_ sorted: [Double], _ p: Double) -> Double { (sorted[min(sorted.count - 1, Int(Double(sorted.count) * p))] * 100).rounded() / 100 }

        _ = try await load(lasting: min(loadSeconds, 10)) { true }  // warming up: the first seconds' tail is the harness's
        let quiet = try await load(lasting: loadSeconds) { true }
        let finished = Atomic<Bool>(false)
        let compactionStarted = ContinuousClock.now
        let compaction = Task {
            defer { finished.store(true, ordering: .relaxed) }
            let removed = try await journal.remove(.init(types: ["fix"], device: "driver", from: .distantPast, to: Date(timeIntervalSince1970: yearStart + 366 * 86_400)))
            return (removed, seconds(compactionStarted.duration(to: .now)))
        }
        let busy = try await load(lasting: loadSeconds) { finished.load(ordering: .relaxed) }
        let (removed, compactionSeconds) = try await compaction.value
        let after = try await load(lasting: loadSeconds) { true }
        let calm = (quiet + after).sorted()
        report(["name": "journal retention", "expired_fixes": expired, "removed": removed.records, "segments": removed.segments,
                "compaction_s": compactionSeconds, "compacting_batches": busy.count, "bytes_before": removed.bytesBefore, "bytes_after": removed.bytesAfter,
                "load_fixes_per_s": 10_000, "quiet_p50_ms": percentile(quiet, 0.5), "quiet_p99_ms": percentile(quiet, 0.99),
                "compacting_p50_ms": percentile(busy, 0.5), "compacting_p99_ms": percentile(busy, 0.99),
                "after_p50_ms": percentile(after, 0.5), "after_p99_ms": percentile(after, 0.99),
                "quiet_max_ms": percentile(quiet, 1), "compacting_max_ms": percentile(busy, 1), "after_max_ms": percentile(after, 1),
                "p99_ratio": (percentile(busy, 0.99) / percentile(quiet, 0.99) * 100).rounded() / 100,
                // The calm runs pooled: twice the batches, so a hiccup of the machine in one weighs half.
                "quiet_and_after_p99_ms": percentile(calm, 0.99), "p99_ratio_to_quiet_and_after": (percentile(busy, 0.99) / percentile(calm, 0.99) * 100).rounded() / 100])
    }

    /// Records in a journal directory (0 when there is none): opened, which also checks it.
    static func count(_ directory: String) throws -> Int {
        guard FileManager.default.fileExists(atPath: directory) else { return 0 }
        let journal = try Journal(path: directory) { _ in }
        defer { journal.shutdown() }
        return Int(journal.lastSeq)
    }

    static func bytes(_ directory: String) throws -> Int {
        try FileManager.default.contentsOfDirectory(atPath: directory).reduce(0) {
            $0 + ((try FileManager.default.attributesOfItem(atPath: directory + "/" + $1)[.size] as? Int) ?? 0)
        }
    }

    static func appendAll(_ records: [JournalRecord], to journal: Journal) async throws -> [Journal.Outcome] {
        try await withThrowingTaskGroup(of: [Journal.Outcome].self) { group in
            for appender in 0..<16 {
                group.addTask {
                    var outcomes: [Journal.Outcome] = []
                    for first in stride(from: appender * 100, to: records.count, by: 1600) {
                        outcomes += try await journal.append(Array(records[first..<min(first + 100, records.count)]))
                    }
                    return outcomes
                }
            }
            return try await group.reduce(into: []) { $0 += $1 }
        }
    }

    static func appendRate(_ records: [JournalRecord], to journal: Journal) async throws -> Double {
        let started = ContinuousClock.now
        let outcomes = try await appendAll(records, to: journal)
        guard outcomes.allSatisfy({ if case .journaled = $0 { true } else { false } }) else { throw ValidationError("an append case's fixes were not all new") }
        return Double(records.count) / seconds(started.duration(to: .now))
    }

    /// The peer: the same payloads written by one thread, batches of 1,600 (what 16 appenders of
    /// 100 hand the writer at once at best), each followed by `fdatasync`.
    static func rawAppendRate(_ records: [JournalRecord], path: String) throws -> Double {
        let payloads = records.map { record -> [UInt8] in
            guard case .fix(let fix) = record.kind else { return [] }
            return Array("fix.\(fix.device)\n".utf8) + BusJSON.encode(fix)
        }
        let fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw ValidationError("cannot create \(path)") }
        defer { close(fd); unlink(path) }
        let started = ContinuousClock.now
        for first in stride(from: 0, to: payloads.count, by: 1600) {
            var bytes: [UInt8] = []
            for payload in payloads[first..<min(first + 1600, payloads.count)] {
                bytes += [UInt8](repeating: 0, count: 8)
                bytes += payload
            }
            _ = bytes.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
            fdatasync(fd)
        }
        return Double(records.count) / seconds(started.duration(to: .now))
    }

    static func residentMegabytes(_ path: String = "/proc/self/status") -> Double { ImportBench.statusMegabytes("VmRSS", status: path) ?? -1 }
}

extension BenchSystem {
    /// Each process's resident memory now (VmRSS), in MB, by executable name.
    func residentMegabytes() -> [String: Double] {
        Dictionary(uniqueKeysWithValues: processIDs.map { ($0.name, JournalBench.residentMegabytes("/proc/\($0.id)/status")) })
    }
}
