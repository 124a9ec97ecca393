import CDrivebusSupport
@testable import DrivebusJournal
import DrivebusSchema
import DrivebusTestSupport
import Foundation
import Synchronization
import Testing

/// The journal in segments: sealed ones are known by their index files, the active one is read
/// at start, and dedup, replay and replay by device work across them all.
@Suite struct JournalSegmentTests {
    static let start = 1_700_000_000.0

    func fix(_ index: Int, device: String = "car", lat: Double = 48) -> JournalRecord {
        JournalRecord(.fix(Fix(device: device, time: Date(timeIntervalSince1970: Self.start + Double(index)), lat: lat + Double(index) * 1e-5, lon: 16, source: .api)))
    }

    /// Segments of about 4 KiB: some 25 fixes each.
    func smallSegments() -> Journal.Options {
        var options = Journal.Options()
        options.segmentBytes = 4096
        return options
    }

    func files(_ path: String, _ suffix: String) throws -> [String] {
        try FileManager.default.contentsOfDirectory(atPath: path).filter { $0.hasSuffix(suffix) }.sorted()
    }

    @Test func sipHashGivesThePapersTestVector() {
        // SipHash-2-4, key 00 01 … 0f, message 00 01 … 0e (the paper's appendix A).
        let key: SipHash24.Key = (0x0706_0504_0302_0100, 0x0f0e_0d0c_0b0a_0908)
        #expect(SipHash24.hash(Array(0..<15), key: key) == 0xa129_ca61_49be_45e5)
        #expect(SipHash24.hash([], key: key) == 0x726f_db47_dd0e_0e31)
    }

    /// Sealed segments keep these digests on disk: the key laid out on the stack must hash the
    /// same bytes as the arrays it was built in before (the device's length and bytes, the time
    /// in milliseconds, latitude and longitude, each little-endian).
    @Test func dedupKeysHashTheBytesTheyAlwaysHashed() {
        for device in ["car", "", "a-device-name-longer-than-sixteen-bytes", "Käfer"] {
            let fix = Fix(device: device, time: Date(timeIntervalSince1970: 1_700_000_000.123), lat: 48.2, lon: -0.0, source: .overland)
            var fields: [UInt8] = []
            fields.appendLittleEndian(UInt64(device.utf8.count))
            fields += device.utf8
            fields.appendLittleEndian(UInt64(bitPattern: 1_700_000_000_123))
            fields.appendLittleEndian((48.2).bitPattern)
            fields.appendLittleEndian(UInt64(0))  // -0.0 keys as 0
            let key = DedupKey(fix)
            #expect(key.digest == .init(high: SipHash24.hash(fields, key: SipHash24.digestHigh), low: SipHash24.hash(fields, key: SipHash24.digestLow)), "\(device)")
            #expect(key.deviceHash == SipHash24.hash(Array(device.utf8), key: SipHash24.device), "\(device)")
            #expect(key.deviceHash == DedupKey.deviceHash(device))
        }
    }

    @Test func segmentsAreSealedAndEverythingSurvivesARestartExactly() async throws {
        let dir = TempDir()
        let path = dir.path + "/journal"
        let published = Published()
        let journal = try Journal(path: path, options: smallSegments()) { published.add($0) }
        for batch in 0..<20 {
            _ = try await journal.append((0..<25).map { fix(batch * 25 + $0) })
        }
        #expect(journal.lastSeq == 500)
        let layout = journal.layout
        #expect(layout.sealedSegments >= 8)
        #expect(layout.activeRecords < 50)
        // Every sealed segment has its index; the active one has none.
        let segments = try files(path, ".seg"), indexes = try files(path, ".idx")
        #expect(segments.count == layout.sealedSegments + 1)
        #expect(indexes == segments.dropLast().map { $0.replacingOccurrences(of: ".seg", with: ".idx") })
        #expect(segments.first == "00000000000000000001.seg")
        // Re-sent across segments, sealed and active: all duplicates, before and after a restart.
        #expect(try await journal.append([fix(3), fix(250), fix(499)]) == [.duplicate, .duplicate, .duplicate])
        journal.shutdown()

        let reopened = try Journal(path: path, options: smallSegments()) { published.add($0) }
        #expect(reopened.lastSeq == 500)
        #expect(reopened.layout == layout)
        #expect(try reopened.replay(fromSeq: 1, limit: 1000) == published.all)
        // A replay that starts inside a sealed segment and crosses into the next ones.
        #expect(try reopened.replay(fromSeq: 37, limit: 100).map(\.seq) == Array(37...136))
        #expect(try reopened.replay(fromSeq: 490, limit: 100).map(\.seq) == Array(490...500))
        #expect(try reopened.replay(fromSeq: 501, limit: 10).isEmpty)
        let resent = try await reopened.append((0..<500).map { fix($0) })
        #expect(resent.allSatisfy { $0 == .duplicate })
        // Same times, other places: new fixes, not duplicates.
        let moved = try await reopened.append((0..<500).map { fix($0, lat: 50) })
        #expect(moved == (501...1000).map { .journaled(seq: UInt64($0)) })
        reopened.shutdown()
    }

    @Test func replayByDeviceAndTimeFindsExactlyThatDevicesRecords() async throws {
        let dir = TempDir()
        let path = dir.path + "/journal"
        let journal = try Journal(path: path, options: smallSegments()) { _ in }
        // Two devices interleaved, then one device's day resent late: imported history.
        for batch in 0..<10 {
            _ = try await journal.append((0..<20).flatMap { [fix(batch * 20 + $0), fix(batch * 20 + $0, device: "bike")] })
        }
        _ = try await journal.append([fix(1000, device: "bike")])
        #expect(journal.layout.sealedSegments > 5)
        let from = Date(timeIntervalSince1970: Self.start + 50), to = Date(timeIntervalSince1970: Self.start + 149)
        let car = try journal.replay(device: "car", from: from, to: to)
        #expect(car.count == 100)
        #expect(car.allSatisfy { $0.topic == "fix.car" })
        let carTimes = try car.map { try BusJSON.decode(Fix.self, from: $0.payload).time.timeIntervalSince1970 - Self.start }
        #expect(carTimes == (50...149).map(Double.init))
        #expect(car.map(\.seq) == car.map(\.seq).sorted())
        let bike = try journal.replay(device: "bike", from: from, to: Date(timeIntervalSince1970: Self.start + 2000))
        #expect(bike.count == 151)
        #expect(try journal.replay(device: "bus", from: from, to: to).isEmpty)
        // Each entry is the record at its seq.
        for entry in car.prefix(5) + bike.suffix(3) {
            #expect(try journal.replay(fromSeq: entry.seq, limit: 1) == [entry])
        }
        journal.shutdown()
    }

    @Test func aDamagedOrMissingIndexIsRebuiltFromItsSegment() async throws {
        let dir = TempDir()
        let path = dir.path + "/journal"
        let journal = try Journal(path: path, options: smallSegments()) { _ in }
        for batch in 0..<8 { _ = try await journal.append((0..<25).map { fix(batch * 25 + $0) }) }
        let written = try journal.replay(fromSeq: 1, limit: 1000)
        journal.shutdown()
        let indexes = try files(path, ".idx")
        let first = path + "/" + indexes[0]
        let original = try Data(contentsOf: URL(fileURLWithPath: first))
        // A flipped byte in the first index's header, and the second index gone.
        var damaged = original
        damaged[20] ^= 0x01
        try damaged.write(to: URL(fileURLWithPath: first))
        try FileManager.default.removeItem(atPath: path + "/" + indexes[1])

        let reopened = try Journal(path: path, options: smallSegments()) { _ in }
        #expect(try Data(contentsOf: URL(fileURLWithPath: first)) == original)
        #expect(try files(path, ".idx") == indexes)
        #expect(try reopened.replay(fromSeq: 1, limit: 1000) == written)
        #expect(try await reopened.append([fix(5), fix(40), fix(200)]) == [.duplicate, .duplicate, .journaled(seq: 201)])
        reopened.shutdown()
    }

    @Test func aCrashBetweenSealingAndTheNextSegmentLosesNothing() async throws {
        let dir = TempDir()
        let path = dir.path + "/journal"
        let journal = try Journal(path: path, options: smallSegments()) { _ in }
        _ = try await journal.append((0..<100).map { fix($0) })
        journal.shutdown()
        // One batch past the segment size: sealed, and an empty segment begun. Without that
        // empty segment, it is as if the crash came between the two.
        let segments = try files(path, ".seg")
        #expect(segments.count == 2)
        #expect(try FileManager.default.attributesOfItem(atPath: path + "/" + segments[1])[.size] as! Int == 0)
        try FileManager.default.removeItem(atPath: path + "/" + segments[1])
        let reopened = try Journal(path: path, options: smallSegments()) { _ in }
        #expect(reopened.lastSeq == 100)
        #expect(try files(path, ".seg") == segments)
        #expect(try await reopened.append([fix(0), fix(100)]) == [.duplicate, .journaled(seq: 101)])
        reopened.shutdown()
    }

    @Test func aTornSegmentBeforeOthersIsRefused() async throws {
        let dir = TempDir()
        let path = dir.path + "/journal"
        let journal = try Journal(path: path, options: smallSegments()) { _ in }
        _ = try await journal.append((0..<100).map { fix($0) })
        journal.shutdown()
        let first = try files(path, ".seg")[0]
        try FileManager.default.removeItem(atPath: path + "/" + first.replacingOccurrences(of: ".seg", with: ".idx"))
        let handle = try FileHandle(forWritingTo: URL(fileURLWithPath: path + "/" + first))
        try handle.truncate(atOffset: try handle.seekToEnd() - 5)
        try handle.close()
        #expect(throws: Journal.Failure.self) { try Journal(path: path, options: smallSegments()) { _ in } }
    }

    /// A journal of one file, from before segments, becomes the first segment and is sealed.
    @Test func aSingleFileJournalIsAdoptedAsTheFirstSegment() async throws {
        let dir = TempDir()
        let old = try Journal(path: dir.path + "/old") { _ in }
        _ = try await old.append((0..<300).map { fix($0) })
        let written = try old.replay(fromSeq: 1, limit: 1000)
        old.shutdown()
        try FileManager.default.moveItem(atPath: dir.path + "/old/00000000000000000001.seg", toPath: dir.path + "/journal.log")

        try Journal.adopt(singleFile: dir.path + "/journal.log", into: dir.path + "/journal")
        #expect(!FileManager.default.fileExists(atPath: dir.path + "/journal.log"))
        let journal = try Journal(path: dir.path + "/journal", options: smallSegments()) { _ in }
        #expect(journal.layout.sealedSegments == 1)
        #expect(journal.layout.activeRecords == 0)
        #expect(try journal.replay(fromSeq: 1, limit: 1000) == written)
        #expect(try await journal.append([fix(17), fix(300)]) == [.duplicate, .journaled(seq: 301)])
        journal.shutdown()
        // Adopting again finds nothing to adopt.
        try Journal.adopt(singleFile: dir.path + "/journal.log", into: dir.path + "/journal")
    }

    /// A big single file is cut into segments of the size asked for, each sealed with its index;
    /// a crash part way leaves the old file and is done again, a crash after the marker is finished.
    @Test func aSingleFileJournalIsCutIntoSegmentsAndACrashPartWayIsRecovered() async throws {
        let dir = TempDir()
        let old = try Journal(path: dir.path + "/old") { _ in }
        _ = try await old.append((0..<300).map { fix($0) })
        let written = try old.replay(fromSeq: 1, limit: 1000)
        old.shutdown()
        let single = dir.path + "/journal.log", directory = dir.path + "/journal"
        try FileManager.default.copyItem(atPath: dir.path + "/old/00000000000000000001.seg", toPath: single)
        let original = try Data(contentsOf: URL(fileURLWithPath: single))

        // A crash part way: a staging directory without its marker, and the old file whole.
        try FileManager.default.createDirectory(atPath: directory + ".adopting", withIntermediateDirectories: false)
        try Data("half".utf8).write(to: URL(fileURLWithPath: directory + ".adopting/00000000000000000001.seg"))
        try Journal.adopt(singleFile: single, into: directory, segmentBytes: 4096)
        #expect(!FileManager.default.fileExists(atPath: single))
        #expect(!FileManager.default.fileExists(atPath: directory + ".adopting"))
        let segments = try files(directory, ".seg")
        #expect(segments.count > 5)
        #expect(try files(directory, ".idx").count == segments.count - 1)
        #expect(try files(directory, ".seg").map { try Data(contentsOf: URL(fileURLWithPath: directory + "/" + $0)) }.reduce(Data(), +) == original)
        let journal = try Journal(path: directory, options: smallSegments()) { _ in }
        #expect(journal.lastSeq == 300)
        #expect(try journal.replay(fromSeq: 1, limit: 1000) == written)
        #expect(try await journal.append([fix(17), fix(299), fix(300)]) == [.duplicate, .duplicate, .journaled(seq: 301)])
        journal.shutdown()

        // A crash after the marker, before the rename: finished without the old file.
        try FileManager.default.moveItem(atPath: directory, toPath: directory + ".adopting")
        try Data().write(to: URL(fileURLWithPath: directory + ".adopting/ADOPTED"))
        try Journal.adopt(singleFile: single, into: directory, segmentBytes: 4096)
        #expect(try files(directory, ".seg") == segments)
        #expect(!FileManager.default.fileExists(atPath: directory + "/ADOPTED"))
        let finished = try Journal(path: directory, options: smallSegments()) { _ in }
        #expect(finished.lastSeq == 301)
        finished.shutdown()
    }
}

/// Removing records (purge, retention): each becomes a stand-in of the same seq, in sealed
/// segments rewritten while the journal stays open.
@Suite struct JournalRemovalTests {
    let records = JournalSegmentTests()

    func time(_ second: Double) -> Date { Date(timeIntervalSince1970: JournalSegmentTests.start + second) }

    /// 200 seconds of two phones, in batches of 20 (sealed every few batches).
    func twoPhones(_ path: String, options: Journal.Options? = nil) async throws -> Journal {
        let journal = try Journal(path: path, options: options ?? records.smallSegments()) { _ in }
        for batch in 0..<10 {
            _ = try await journal.append((0..<20).flatMap { [records.fix(batch * 20 + $0), records.fix(batch * 20 + $0, device: "bike")] })
        }
        return journal
    }

    @Test func aDayOfOneDeviceIsRemovedAndNothingElse() async throws {
        let dir = TempDir()
        let path = dir.path + "/journal"
        let journal = try await twoPhones(path)
        let before = try journal.replay(fromSeq: 1, limit: 1000)
        let sealedBefore = journal.layout.sealedSegments
        let report = try await journal.remove(.init(types: ["fix"], device: "car", from: time(50), to: time(149)))
        #expect(report.records == 100)
        #expect(report.segments >= 3)
        #expect(report.bytesAfter < report.bytesBefore)
        #expect(journal.lastSeq == 400)

        let after = try journal.replay(fromSeq: 1, limit: 1000)
        #expect(after.map(\.seq) == Array(1...400))
        let removedSeqs = Set(before.filter { entry in
            entry.topic == "fix.car" && (try? BusJSON.decode(Fix.self, from: entry.payload)).map { (50...149).contains($0.time.timeIntervalSince1970 - JournalSegmentTests.start) } == true
        }.map(\.seq))
        #expect(removedSeqs.count == 100)
        for (old, new) in zip(before, after) {
            if removedSeqs.contains(old.seq) {
                #expect(new.topic == "removed.car")
                #expect(String(decoding: new.payload, as: UTF8.self).hasPrefix(#"{"seq":\#(old.seq),"removed":"fix","time_ms":"#))
            } else {
                #expect(new == old)
            }
        }
        #expect(try journal.replay(device: "car", from: time(0), to: time(199)).count == 100)
        #expect(try journal.replay(device: "car", from: time(50), to: time(149)).isEmpty)
        #expect(try journal.replay(device: "bike", from: time(0), to: time(199)).count == 200)
        // An old client's resend of a removed fix is not taken again, before and after a restart.
        #expect(try await journal.append([records.fix(60), records.fix(200)]) == [.duplicate, .journaled(seq: 401)])
        journal.shutdown()
        let reopened = try Journal(path: path, options: records.smallSegments()) { _ in }
        #expect(reopened.layout.sealedSegments >= sealedBefore)
        #expect(try await reopened.append([records.fix(61)]) == [.duplicate])
        // Rebuilt from the segment, the index still keeps the removed fixes' keys.
        let indexes = try records.files(path, ".idx")
        for name in indexes { try FileManager.default.removeItem(atPath: path + "/" + name) }
        reopened.shutdown()
        let rebuilt = try Journal(path: path, options: records.smallSegments()) { _ in }
        #expect(try records.files(path, ".idx") == indexes)
        #expect(try await rebuilt.append([records.fix(62), records.fix(149)]) == [.duplicate, .duplicate])
        #expect(try rebuilt.replay(device: "car", from: time(50), to: time(149)).isEmpty)
        rebuilt.shutdown()
    }

    @Test func removedWithItsKeysForgottenARecordCanBeSentAgain() async throws {
        let dir = TempDir()
        let journal = try await twoPhones(dir.path + "/journal")
        let report = try await journal.remove(.init(types: ["fix"], device: "bike", from: time(0), to: time(9), forgetKeys: true))
        #expect(report.records == 10)
        #expect(try await journal.append([records.fix(3, device: "bike"), records.fix(3)]) == [.journaled(seq: 401), .duplicate])
        journal.shutdown()
    }

    /// Purged by mistake, then purged again with `--resend-ok`: the stand-ins forget their keys,
    /// and the phone's copy is taken again. Nothing else changes.
    @Test func aSecondRemovalForgettingKeysLetsEarlierRemovedRecordsBeSentAgain() async throws {
        let dir = TempDir()
        let journal = try await twoPhones(dir.path + "/journal")
        #expect(try await journal.remove(.init(types: ["fix"], device: "bike", from: time(0), to: time(9))).records == 10)
        #expect(try await journal.append([records.fix(3, device: "bike")]) == [.duplicate])
        let before = try journal.replay(fromSeq: 1, limit: 1000)
        // Another device's range, or another type, forgets nothing.
        #expect(try await journal.remove(.init(types: ["fix"], device: "car", from: time(0), to: time(9), forgetKeys: true)).records == 10)
        #expect(try await journal.remove(.init(types: ["motion"], device: "bike", from: time(0), to: time(9), forgetKeys: true)).records == 0)
        #expect(try await journal.append([records.fix(3, device: "bike")]) == [.duplicate])
        let report = try await journal.remove(.init(types: ["fix"], device: "bike", from: time(0), to: time(4), forgetKeys: true))
        #expect(report.records == 5)
        #expect(try await journal.append([records.fix(3, device: "bike"), records.fix(7, device: "bike")]) == [.journaled(seq: 401), .duplicate])
        // The stand-ins keep their seqs; only the five in the range lost their keys.
        let after = try journal.replay(fromSeq: 1, limit: 400)
        #expect(after.map(\.seq) == before.map(\.seq))
        #expect(after.filter { String(decoding: $0.payload, as: UTF8.self).contains(#""key":"#) }.count == 5)
        journal.shutdown()
    }

    /// The newest records are in the active segment: it is sealed first, then rewritten.
    @Test func recordsInTheActiveSegmentAreRemovedToo() async throws {
        let dir = TempDir()
        var options = Journal.Options()
        options.segmentBytes = 1 << 20
        let journal = try await twoPhones(dir.path + "/journal", options: options)
        #expect(journal.layout.sealedSegments == 0)
        let report = try await journal.remove(.init(types: ["fix", "motion"], device: nil, from: time(190), to: time(199)))
        #expect(report.records == 20)
        #expect(journal.layout.sealedSegments == 1)
        #expect(journal.layout.activeRecords == 0)
        let tail = try journal.replay(fromSeq: 381, limit: 100)
        #expect(tail.count == 20)
        #expect(tail.allSatisfy { $0.topic.hasPrefix("removed.") })
        #expect(try await journal.append([records.fix(300)]) == [.journaled(seq: 401)])
        journal.shutdown()
    }

    /// A crash between the segment's rename and its index's: the new segment is in place with
    /// the old index, and the new index waits as `X.idx.rewrite`. Start-up puts it in place.
    @Test func aCrashBetweenTheTwoRenamesIsCompletedAtStart() async throws {
        let dir = TempDir()
        let path = dir.path + "/journal"
        let journal = try await twoPhones(path)
        let first = try records.files(path, ".idx")[0]
        let oldIndex = try Data(contentsOf: URL(fileURLWithPath: path + "/" + first))
        let report = try await journal.remove(.init(types: ["fix"], device: "car", from: time(0), to: time(3)))
        #expect(report.records == 4)
        let after = try journal.replay(fromSeq: 1, limit: 1000)
        journal.shutdown()
        let newIndex = try Data(contentsOf: URL(fileURLWithPath: path + "/" + first))
        #expect(newIndex != oldIndex)
        try newIndex.write(to: URL(fileURLWithPath: path + "/" + first + ".rewrite"))
        try oldIndex.write(to: URL(fileURLWithPath: path + "/" + first))
        let waiting = try FileManager.default.attributesOfItem(atPath: path + "/" + first + ".rewrite")[.systemFileNumber] as! Int

        let reopened = try Journal(path: path, options: records.smallSegments()) { _ in }
        // The waiting file itself, put in place (not an index rebuilt from the segment).
        #expect(try FileManager.default.attributesOfItem(atPath: path + "/" + first)[.systemFileNumber] as! Int == waiting)
        #expect(try Data(contentsOf: URL(fileURLWithPath: path + "/" + first)) == newIndex)
        #expect(try reopened.replay(fromSeq: 1, limit: 1000) == after)
        #expect(try await reopened.append([records.fix(2)]) == [.duplicate])
        reopened.shutdown()
    }

    @Test func leftoversOfAnInterruptedRewriteAreRemovedAtStart() async throws {
        let dir = TempDir()
        let path = dir.path + "/journal"
        let journal = try await twoPhones(path)
        let written = try journal.replay(fromSeq: 1, limit: 1000)
        journal.shutdown()
        let first = try records.files(path, ".seg")[0]
        try Data("half a rewrite".utf8).write(to: URL(fileURLWithPath: path + "/" + first + ".rewrite"))
        try Data("half an index".utf8).write(to: URL(fileURLWithPath: path + "/" + first.replacingOccurrences(of: ".seg", with: ".idx") + ".rewrite.partial"))
        let reopened = try Journal(path: path, options: records.smallSegments()) { _ in }
        #expect(try reopened.replay(fromSeq: 1, limit: 1000) == written)
        #expect(try FileManager.default.contentsOfDirectory(atPath: path).allSatisfy { $0.hasSuffix(".seg") || $0.hasSuffix(".idx") })
        reopened.shutdown()
    }
}

/// How a removal's rewrite stays out of ingest's way (`Journal.Pacing`).
@Suite struct JournalPacingTests {
    /// Runs `body` on a thread of its own (it blocks) and returns what it returned.
    func onThread<T: Sendable>(_ body: @escaping @Sendable () -> T) async -> T {
        await withCheckedContinuation { continuation in Thread { continuation.resume(returning: body()) }.start() }
    }

    /// Waiting far longer than the test may run, only the end of a commit can let it go.
    @Test(.timeLimit(.minutes(1))) func aBackgroundSyncGoesRightAfterTheWritersNextCommit() async throws {
        let ends = CommitEnds()
        ends.signal()  // the writer is busy: a commit has just ended
        let waiting = Task { await onThread { ends.awaitNext(patience: .seconds(3600)) } }
        let returned = Atomic<Bool>(false)
        Task {
            await waiting.value
            returned.store(true, ordering: .relaxed)
        }
        // Signalled until the waiter is through: a signal before it began waiting does not count.
        let deadline = ContinuousClock.now + .seconds(30)
        while !returned.load(ordering: .relaxed) && ContinuousClock.now < deadline {
            ends.signal()
            try await Task.sleep(for: .milliseconds(5))
        }
        let wentAfterACommit = returned.load(ordering: .relaxed)
        #expect(wentAfterACommit)
    }

    /// The commit that just ended is not the next one: without another, the wait lasts its patience.
    @Test(.timeLimit(.minutes(1))) func aCommitBeforeTheWaitDoesNotCount() async {
        let ends = CommitEnds()
        let waited = await onThread { () -> Duration in
            ends.signal()
            let started = ContinuousClock.now
            ends.awaitNext(patience: .milliseconds(200))
            return started.duration(to: .now)
        }
        #expect(waited >= .milliseconds(200))
    }

    /// No commit for longer than the patience: the writer is idle, so the sync goes at once
    /// (were it to wait out the patience, the time limit would end the test).
    @Test(.timeLimit(.minutes(1))) func withTheWriterIdleTheSyncGoesAtOnce() async {
        let ends = CommitEnds()
        await onThread { ends.awaitNext(patience: .seconds(3600)) }
    }

    /// The rewrite's thread runs only when nothing else wants the CPU.
    @Test func aRewritesThreadRunsAtIdlePriority() async {
        let policies = await onThread { () -> (before: Int32, after: Int32) in
            let before = sched_getscheduler(0)
            _ = drivebus_thread_in_background()
            return (before, sched_getscheduler(0))
        }
        #expect(policies.before == SCHED_OTHER)
        #expect(policies.after == 5)  // SCHED_IDLE, which Glibc's module does not export
    }
}
