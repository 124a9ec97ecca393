import DrivebusSchema
import Foundation
import Glibc

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
            Self.removals.async {
                // Behind ingest's own work on the CPU: this thread at a lower priority (nice 10;
                // on Linux `who` 0 is the calling thread) while it rewrites, and back after (the
                // queue's threads are shared).
                setpriority(__priority_which_t(PRIO_PROCESS.rawValue), 0, 10)
                defer { setpriority(__priority_which_t(PRIO_PROCESS.rawValue), 0, 0) }
                continuation.resume(returning: Result { () throws(Failure) -> RemovalReport in try self.rewriteSealed(removal) })
            }
        }
        return try result.get()
    }

    /// One removal at a time, off Swift's cooperative pool: it reads and writes whole segments.
    private static let removals = DispatchQueue(label: "drivebus.journal.removal")

    private func rewriteSealed(_ removal: Removal) throws(Failure) -> RemovalReport {
        let (low, high) = (DedupKey.milliseconds(removal.from), DedupKey.milliseconds(removal.to))
        let deviceHash = removal.device.map(DedupKey.deviceHash)
        var report = RemovalReport()
        let candidates = segments.withLock { $0.sealed.filter { $0.index.header.overlaps(low, high) }.map(\.firstSeq) }
        for firstSeq in candidates {
            guard let segment = try segments.withLock({ segments throws(Failure) -> OpenSegment? in
                try segments.sealed.first { $0.firstSeq == firstSeq }.map { sealed throws(Failure) in try OpenSegment(sealed) }
            }), let index = segment.index else { continue }
            if let deviceHash, try index.records(deviceHash: deviceHash, from: low, to: high, fd: segment.indexFD).isEmpty { continue }
            if let removed = try rewrite(segment, index: index, removal: removal) {
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
    private func rewrite(_ segment: OpenSegment, index: SegmentIndex, removal: Removal) throws(Failure) -> (records: Int, bytes: Int64)? {
        let (low, high) = (DedupKey.milliseconds(removal.from), DedupKey.milliseconds(removal.to))
        let header = index.header
        let offsets = try index.offsets(first: 0, count: header.count, fd: segment.indexFD)
        let bytes = try SegmentIndex.read(segment.segmentFD, at: 0, count: Int(header.segmentBytes), path: segment.path)
        var output: [UInt8] = []
        output.reserveCapacity(bytes.count)
        var contents = SegmentIndex.Contents()
        contents.offsets.reserveCapacity(header.count)
        var removed = 0
        for record in 0..<header.count {
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
            }
            contents.add(at: Int64(output.count), indexed)
            _ = RecordFormat.append(Entry(seq: seq, topic: topic, payload: payload), to: &output)
        }
        guard removed > 0 else { return nil }

        let rewrittenSegment = segment.path + ".rewrite", rewrittenIndex = index.path + ".rewrite"
        try Self.writeSynced(output, to: rewrittenSegment, paced: true)
        try SegmentIndex.write(path: rewrittenIndex, firstSeq: header.firstSeq, segmentBytes: Int64(output.count), contents: contents, paced: true)
        // Both renames and the new index under the lock: a reader opens a segment's files under
        // it too, so it reads either the old pair or the new one.
        var newIndex = try SegmentIndex(path: rewrittenIndex)
        newIndex.path = index.path
        if options.rewritePause > .zero { Thread.sleep(forTimeInterval: Double(options.rewritePause.components.seconds) + Double(options.rewritePause.components.attoseconds) / 1e18) }
        // Segment first, then index: a crash between the two leaves `X.idx.rewrite` alone, and
        // start-up completes the job with it (`removeLeftovers`).
        try segments.withLock { segments throws(Failure) in
            guard rename(rewrittenSegment, segment.path) == 0, rename(rewrittenIndex, index.path) == 0 else {
                throw .io("cannot put the rewritten \(segment.path) in place: \(String(cString: strerror(errno)))")
            }
            if let position = segments.sealed.firstIndex(where: { $0.firstSeq == header.firstSeq }) {
                segments.sealed[position] = Sealed(path: segment.path, index: newIndex)
            }
        }
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

    /// Writes and syncs a file. `paced` (for rewrites in the background, never on the writer
    /// thread) writes it in pieces of 512 KB, each synced and followed by as long again idle:
    /// ingest's own syncs then wait behind half a megabyte, not a whole segment (append p99 while
    /// compacting 8.9–10.9 ms unpaced, 4.7–5.5 ms paced, in `drivebus-bench journal`).
    static func writeSynced(_ bytes: [UInt8], to path: String, paced: Bool = false) throws(Failure) {
        let fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw .io("cannot create \(path): \(String(cString: strerror(errno)))") }
        defer { close(fd) }
        let piece = paced ? 512 << 10 : max(bytes.count, 1)
        for start in stride(from: 0, to: bytes.count, by: piece) {
            let end = min(start + piece, bytes.count)
            if let error = bytes.withUnsafeBytes({ writeFully(fd, UnsafeRawBufferPointer(rebasing: $0[start..<end])) }) {
                throw .io("cannot write \(path): \(String(cString: strerror(error)))")
            }
            if paced && end < bytes.count {
                let started = ContinuousClock.now
                guard fdatasync(fd) == 0 else { throw .io("cannot sync \(path): \(String(cString: strerror(errno)))") }
                let took = started.duration(to: .now)
                Thread.sleep(forTimeInterval: Double(took.components.seconds) + Double(took.components.attoseconds) / 1e18)
            }
        }
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
