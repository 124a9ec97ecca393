import CDrivebusSupport
import DrivebusSchema
import Foundation
import Glibc
import Synchronization

/// What stands in a rewritten segment for a removed record: a record of the same seq, so that
/// seqs stay gapless and every consumer's position stays valid. Topic `removed.<device>`,
/// payload `{"seq":N,"removed":"fix","time_ms":T,"key":"<32 hex digits>"}`. The key keeps the
/// removed record's dedup digest, so an old client's resend is not taken again by accident;
/// without it (the user said so) the record can be sent again. Consumers skip the type.
enum RemovedRecord {
    static let type = "removed"

    static func isRemoved(topic: String) -> Bool { topic.hasPrefix(type + ".") }

    static func payload(seq: UInt64, removedType: String, key: DedupKey, keepKey: Bool) -> [UInt8] {
        var json = #"{"seq":\#(seq),"removed":"\#(removedType)","time_ms":\#(key.milliseconds)"#
        if keepKey { json += #","key":"\#(hex(key.digest.high))\#(hex(key.digest.low))""# }
        return Array((json + "}").utf8)
    }

    /// The dedup key a stand-in keeps; nil when it keeps none.
    static func key(topic: String, payload: [UInt8]) -> DedupKey? {
        guard let object = try? JSONSerialization.jsonObject(with: Data(payload)) as? [String: Any],
              let hexKey = object["key"] as? String, hexKey.count == 32,
              let high = UInt64(hexKey.prefix(16), radix: 16), let low = UInt64(hexKey.suffix(16), radix: 16),
              let milliseconds = (object["time_ms"] as? NSNumber)?.int64Value
        else { return nil }
        let device = String(topic.dropFirst(type.count + 1))
        return DedupKey(digest: .init(high: high, low: low), deviceHash: DedupKey.deviceHash(device), milliseconds: milliseconds)
    }

    /// The type of record a stand-in took the place of.
    static func removedType(payload: [UInt8]) -> String? {
        (try? JSONSerialization.jsonObject(with: Data(payload)) as? [String: Any])?["removed"] as? String
    }

    private static func hex(_ value: UInt64) -> String {
        let digits = String(value, radix: 16)
        return String(repeating: "0", count: 16 - digits.count) + digits
    }
}

extension Journal {
    /// Which records `remove` takes out: those of these types, of this device (or every
    /// device), whose time (a fix's, a sample's or a stay's start) is in `from ... to`.
    public struct Removal: Sendable, Equatable {
        /// Record types that have a device and a time: `fix`, `motion`, `client.transition`, `visit`.
        public static let removableTypes: Set<String> = ["fix", "motion", "client.transition", "visit"]

        public var types: Set<String>
        public var device: String?
        public var from: Date
        public var to: Date
        /// Whether a removed record sent again is taken again (its dedup key is forgotten).
        /// By default it is not: an old client's resend must not bring purged data back.
        public var forgetKeys: Bool

        public init(types: Set<String>, device: String?, from: Date, to: Date, forgetKeys: Bool = false) {
            self.types = types.intersection(Self.removableTypes)
            self.device = device
            self.from = from
            self.to = to
            self.forgetKeys = forgetKeys
        }
    }

    /// What `remove` did.
    public struct RemovalReport: Sendable, Equatable {
        public var records = 0
        public var segments = 0
        public var bytesBefore: Int64 = 0
        public var bytesAfter: Int64 = 0
        public init() {}
    }

    /// Replaces every record that `removal` names with a stand-in of the same seq
    /// (`RemovedRecord`), rewriting each sealed segment that holds one. The active segment is
    /// sealed first when it may hold one. Ingest goes on appending meanwhile: a sealed segment
    /// is never appended to, and its rewritten files take its place by rename. Runs on a thread
    /// of its own, never on the caller's.
    public func remove(_ removal: Removal) async throws(Failure) -> RemovalReport {
        let (low, high) = (DedupKey.milliseconds(removal.from), DedupKey.milliseconds(removal.to))
        let deviceHash = removal.device.map(DedupKey.deviceHash)
        let activeMayHold = segments.withLock { segments in
            segments.active.entries.contains { (deviceHash == nil || $0.deviceHash == deviceHash) && low <= $0.milliseconds && $0.milliseconds <= high }
        }
        if activeMayHold { try await sealActive() }
        let result: Result<RemovalReport, Failure> = await withCheckedContinuation { continuation in
            // A thread of its own, off Swift's cooperative pool (it reads and writes whole
            // segments), at the lowest priority for the CPU and the disk. Both settings stay
            // with the thread, which ends with the removal.
            let thread = Thread { [self] in
                _ = drivebus_thread_name("journal-compact")
                // Should the system refuse (a seccomp profile), the rewrite still runs, paced.
                _ = drivebus_thread_in_background()
                Self.oneRemovalAtATime.withLock { _ in
                    continuation.resume(returning: Result { () throws(Failure) -> RemovalReport in try self.rewriteSealed(removal) })
                }
            }
            thread.start()
        }
        return try result.get()
    }

    /// One removal at a time in the process: two would only compete for the same disk.
    private static let oneRemovalAtATime = Mutex<Void>(())

    /// Runs `work`, which takes the segment list's lock, on a thread of normal priority while
    /// the idle-priority rewrite waits: preempted while holding the lock, the rewrite could
    /// keep ingest's writer waiting for as long as other work keeps the cores busy.
    private static func atNormalPriority<T>(_ work: () -> T) -> T {
        DispatchQueue.global(qos: .userInitiated).sync(execute: work)
    }

    private func rewriteSealed(_ removal: Removal) throws(Failure) -> RemovalReport {
        let (low, high) = (DedupKey.milliseconds(removal.from), DedupKey.milliseconds(removal.to))
        let deviceHash = removal.device.map(DedupKey.deviceHash)
        var report = RemovalReport()
        let pacing = Pacing(commitEnds: commitEnds)
        // Kept from segment to segment: allocating and freeing 64 MB for each kept a core
        // busy for milliseconds in the kernel (see `Pacing`).
        var buffers = (input: [UInt8](), output: [UInt8]())
        // A removal that forgets keys looks at stand-ins too (`--resend-ok` after a purge).
        let candidates = Self.atNormalPriority {
            segments.withLock { segments in
                segments.sealed.filter { removal.forgetKeys ? $0.index.header.keysOverlap(low, high) : $0.index.header.overlaps(low, high) }.map(\.firstSeq)
            }
        }
        for firstSeq in candidates {
            let opened = Self.atNormalPriority {
                Result { () throws(Failure) -> OpenSegment? in
                    try segments.withLock { segments throws(Failure) -> OpenSegment? in
                        try segments.sealed.first { $0.firstSeq == firstSeq }.map { sealed throws(Failure) in try OpenSegment(sealed) }
                    }
                }
            }
            guard let segment = try opened.get(), let index = segment.index else { continue }
            // Stand-ins have no place in the index by device and time: a removal that forgets keys
            // (`--resend-ok` after a purge) reads every segment whose range holds the times.
            if let deviceHash, !removal.forgetKeys, try index.records(deviceHash: deviceHash, from: low, to: high, fd: segment.indexFD).isEmpty { continue }
            if let removed = try rewrite(segment, index: index, removal: removal, pacing: pacing, buffers: &buffers) {
                report.records += removed.records
                report.segments += 1
                report.bytesBefore += index.header.segmentBytes
                report.bytesAfter += removed.bytes
            }
        }
        return report
    }

    /// Writes the segment again with the named records replaced, and its index, then puts both
    /// in place. Nil when no record matched.
    private func rewrite(
        _ segment: OpenSegment, index: SegmentIndex, removal: Removal, pacing: Pacing, buffers: inout (input: [UInt8], output: [UInt8])
    ) throws(Failure) -> (records: Int, bytes: Int64)? {
        let (low, high) = (DedupKey.milliseconds(removal.from), DedupKey.milliseconds(removal.to))
        let header = index.header
        let offsets = try index.offsets(first: 0, count: header.count, fd: segment.indexFD)
        try SegmentIndex.read(segment.segmentFD, at: 0, count: Int(header.segmentBytes), path: segment.path, into: &buffers.input, pacing: pacing)
        let bytes = buffers.input
        var output = buffers.output
        buffers.output = []
        defer { buffers.output = output }
        output.removeAll(keepingCapacity: true)
        output.reserveCapacity(bytes.count)
        var contents = SegmentIndex.Contents()
        contents.offsets.reserveCapacity(header.count)
        var removed = 0
        for record in 0..<header.count {
            if record % 64 == 0 { pacing.breathe() }
            let found = bytes.withUnsafeBytes { raw in RecordFormat.record(UnsafeRawBufferPointer(rebasing: raw[Int(offsets[record])..<Int(offsets[record + 1])])) }
            guard var (topic, payload) = found else { throw .corrupt("\(segment.path): the record at byte \(offsets[record]) fails its checksum") }
            let seq = header.firstSeq + UInt64(record)
            // Each record is decoded once: a stand-in's index part follows from the record's
            // (its key, kept unless forgotten, and no place in the index by device and time).
            var indexed = Self.indexing(topic: topic, payload: payload, record: record)
            if let (key, _) = indexed, !RemovedRecord.isRemoved(topic: topic),
               let (type, device) = Self.typeAndDevice(topic), removal.types.contains(type),
               removal.device == nil || removal.device == device, low <= key.milliseconds, key.milliseconds <= high {
                topic = RemovedRecord.type + "." + device
                payload = RemovedRecord.payload(seq: seq, removedType: type, key: key, keepKey: !removal.forgetKeys)
                indexed = removal.forgetKeys ? nil : (key, nil)
                removed += 1
            } else if removal.forgetKeys, let (key, _) = indexed, RemovedRecord.isRemoved(topic: topic),
                      removal.device == nil || removal.device == String(topic.dropFirst(RemovedRecord.type.count + 1)),
                      let type = RemovedRecord.removedType(payload: payload), removal.types.contains(type),
                      low <= key.milliseconds, key.milliseconds <= high {
                // Removed before with its key kept: the user now wants the phone's copy back.
                payload = RemovedRecord.payload(seq: seq, removedType: type, key: key, keepKey: false)
                indexed = nil
                removed += 1
            }
            contents.add(at: Int64(output.count), indexed)
            _ = RecordFormat.append(Entry(seq: seq, topic: topic, payload: payload), to: &output)
        }
        guard removed > 0 else { return nil }

        let rewrittenSegment = segment.path + ".rewrite", rewrittenIndex = index.path + ".rewrite"
        try Self.writeSynced(output, to: rewrittenSegment, pacing: pacing)
        try SegmentIndex.write(path: rewrittenIndex, firstSeq: header.firstSeq, segmentBytes: Int64(output.count), contents: contents, pacing: pacing)
        // Both renames and the new index under the lock: a reader opens a segment's files under
        // it too, so it reads either the old pair or the new one.
        var newIndex = try SegmentIndex(path: rewrittenIndex)
        newIndex.path = index.path
        if options.rewritePause > .zero { Thread.sleep(forTimeInterval: options.rewritePause.inSeconds) }
        // Segment first, then index: a crash between the two leaves `X.idx.rewrite` alone, and
        // start-up completes the job with it (`removeLeftovers`).
        try Self.atNormalPriority {
            Result { () throws(Failure) in
                try segments.withLock { segments throws(Failure) in
                    guard rename(rewrittenSegment, segment.path) == 0, rename(rewrittenIndex, index.path) == 0 else {
                        throw .io("cannot put the rewritten \(segment.path) in place: \(String(cString: strerror(errno)))")
                    }
                    if let position = segments.sealed.firstIndex(where: { $0.firstSeq == header.firstSeq }) {
                        segments.sealed[position] = Sealed(path: segment.path, index: newIndex)
                    }
                }
            }
        }.get()
        pacing.awaitTurn()
        syncDirectory(of: segment.path)
        return (removed, Int64(output.count))
    }

    /// `fix` and `car` from `fix.car`: the type is one of the journal's, the rest the device.
    static func typeAndDevice(_ topic: String) -> (String, String)? {
        for (type, prefix) in zip(JournalTopics.types, JournalTopics.prefixes) where topic.hasPrefix(prefix) {
            return (type, String(topic.dropFirst(prefix.count)))
        }
        return nil
    }

    /// How a rewrite in the background shares the machine with ingest. It works in slices of
    /// `slice`, each followed by `restPerWork` times as long idle, so that it never keeps both
    /// cores of a small machine busy: on this 2-core VM, with both busy (even at SCHED_IDLE),
    /// the hypervisor served the disk late and ingest's syncs took 2–4 ms instead of 0.4. It
    /// writes files in pieces, each synced just after one of the writer's commits (at once when
    /// the writer has had nothing to commit for `patience`): each sync flushes the disk's cache,
    /// ingest's syncs wait behind any flush under way, and timed into the gap between two
    /// commits the rewrite's flush is usually done before the next commit needs the disk.
    final class Pacing {
        let commitEnds: CommitEnds
        let syncBytes = 512 << 10
        let writeBytes = 64 << 10
        let patience: Duration = .milliseconds(20)
        let slice: Duration = .microseconds(500)
        let restPerWork = 3
        private var sliceStarted = Pacing.cpuTime()

        init(commitEnds: CommitEnds) { self.commitEnds = commitEnds }

        /// Rests when the current slice of work is used up: this thread's CPU time, so waits
        /// for the disk or for a turn do not count as work.
        func breathe() {
            let worked = Pacing.cpuTime() - sliceStarted
            guard worked >= slice else { return }
            Thread.sleep(forTimeInterval: (worked * restPerWork).inSeconds)
            sliceStarted = Pacing.cpuTime()
        }

        private static func cpuTime() -> Duration {
            var time = timespec()
            clock_gettime(CLOCK_THREAD_CPUTIME_ID, &time)
            return .seconds(time.tv_sec) + .nanoseconds(time.tv_nsec)
        }

        func awaitTurn() { commitEnds.awaitNext(patience: patience) }
    }

    /// Writes and syncs a file: at once, or `pacing` it (for rewrites in the background, never
    /// on the writer thread).
    static func writeSynced(_ bytes: [UInt8], to path: String, pacing: Pacing? = nil) throws(Failure) {
        let fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw .io("cannot create \(path): \(String(cString: strerror(errno)))") }
        defer { close(fd) }
        // Paced, each write() is short too: the kernel copies it without yielding the CPU.
        let piece = pacing?.writeBytes ?? max(bytes.count, 1)
        var unsynced = 0
        for start in stride(from: 0, to: bytes.count, by: piece) {
            let end = min(start + piece, bytes.count)
            if let error = bytes.withUnsafeBytes({ writeFully(fd, UnsafeRawBufferPointer(rebasing: $0[start..<end])) }) {
                throw .io("cannot write \(path): \(String(cString: strerror(error)))")
            }
            guard let pacing, end < bytes.count else { continue }
            unsynced += end - start
            if unsynced >= pacing.syncBytes {
                pacing.awaitTurn()
                guard fdatasync(fd) == 0 else { throw .io("cannot sync \(path): \(String(cString: strerror(errno)))") }
                unsynced = 0
            }
            pacing.breathe()
        }
        pacing?.awaitTurn()
        guard fsync(fd) == 0 else { throw .io("cannot sync \(path): \(String(cString: strerror(errno)))") }
    }

    /// Files of a rewrite or a seal that a crash interrupted. A rewritten index whose segment
    /// was already renamed into place (no `X.seg.rewrite` left) is the crash between the two
    /// renames: it is put in place, completing the rewrite. Anything else is removed: the pair
    /// it was to replace is still whole.
    static func removeLeftovers(in directory: String) {
        guard let names = try? FileManager.default.contentsOfDirectory(atPath: directory) else { return }
        let present = Set(names)
        for name in names where name.hasSuffix(".idx.rewrite") {
            let stem = String(name.dropLast(".idx.rewrite".count))
            if !present.contains(stem + ".seg.rewrite") {
                rename(directory + "/" + name, directory + "/" + stem + ".idx")
            }
        }
        for name in (try? FileManager.default.contentsOfDirectory(atPath: directory)) ?? [] where name.hasSuffix(".rewrite") || name.hasSuffix(".partial") {
            unlink(directory + "/" + name)
        }
        syncDirectory(of: directory + "/")
    }
}

/// The ends of the journal writer's commits, for a thread that wants the disk between them.
/// The writer only stores two numbers (it must never wait on the idle-priority thread that
/// watches them); the watcher polls.
final class CommitEnds: Sendable {
    private static let never = Int64.min
    private let count = Atomic<UInt64>(0)
    /// When the last commit ended (monotonic ns). Not 0: the clock counts from boot, and a machine
    /// up for less than the patience would take 0 for a commit that just ended.
    private let lastEnd = Atomic<Int64>(CommitEnds.never)

    /// The writer has finished a commit (written, synced and answered).
    func signal() {
        lastEnd.store(Self.now(), ordering: .relaxed)
        count.add(1, ordering: .releasing)
    }

    /// Returns when the writer next finishes a commit, or after `patience` if it does not. At
    /// once when no commit ended within `patience`: the writer is idle, and no commit is due.
    func awaitNext(patience: Duration) {
        let seen = count.load(ordering: .acquiring)
        let patienceNanoseconds = Int64(patience.inSeconds * 1e9)
        let started = Self.now()
        let last = lastEnd.load(ordering: .relaxed)
        guard last != Self.never, started - last < patienceNanoseconds else { return }
        while count.load(ordering: .acquiring) == seen && Self.now() - started < patienceNanoseconds {
            usleep(200)
        }
    }

    private static func now() -> Int64 {
        var time = timespec()
        clock_gettime(CLOCK_MONOTONIC, &time)
        return Int64(time.tv_sec) * 1_000_000_000 + Int64(time.tv_nsec)
    }
}
