import CLibZ
import DrivebusSchema
import Foundation
import Glibc
import Synchronization

/// The ingest journal: the source of truth. An append-only file of records, each
/// `[u32 length][u32 crc32][topic "\n" payload JSON]`, little-endian.
///
/// One writer thread owns the file. Callers hand it batches and wait; it takes everything that is
/// waiting, writes it with one `write` and one `fdatasync` (group commit), and only then answers
/// them and publishes the records, in `seq` order. A torn record at the tail (a crash mid-write)
/// is cut off when the journal is opened; everything before it was acknowledged and stays.
public final class Journal: Sendable {
    public struct Options: Sendable {
        /// Records waiting for the disk beyond which new batches are refused (503) so clients retry.
        public var maxPendingRecords = 200_000
        /// How much of the journal is read at a time at start.
        public var scanChunkBytes = 8 << 20
        public init() {}
    }

    public enum Failure: Error, Sendable, Equatable, CustomStringConvertible {
        case overloaded
        case io(String)
        case corrupt(String)
        case closed

        public var code: String {
            switch self {
            case .overloaded: "ingest.journal_overloaded"
            case .io: "ingest.journal_io"
            case .corrupt: "ingest.journal_corrupt"
            case .closed: "ingest.journal_closed"
            }
        }

        public var description: String {
            switch self {
            case .overloaded: "the journal cannot keep up; retry shortly"
            case .io(let why): "journal write failed: \(why)"
            case .corrupt(let why): "journal is corrupt: \(why)"
            case .closed: "the journal is closed"
            }
        }
    }

    /// What happened to one record of a batch.
    public enum Outcome: Sendable, Equatable {
        case journaled(seq: UInt64)
        /// Already in the journal (same device, time and position): acknowledged, not re-published.
        case duplicate
    }

    /// One journaled message, as replay returns it.
    public struct Entry: Sendable, Equatable {
        public let seq: UInt64
        public let topic: String
        public let payload: [UInt8]
    }

    /// Called on the writer thread after each commit, once per new record, in `seq` order.
    public typealias Publish = @Sendable (_ entry: Entry, _ record: JournalRecord) -> Void

    private struct Pending {
        let records: [PreparedRecord]
        let reply: @Sendable (Result<[Outcome], Failure>) -> Void
    }

    /// A record with what does not depend on its seq worked out by the caller, so the writer
    /// thread, which every append waits on, only numbers, writes and publishes.
    fileprivate struct PreparedRecord: Sendable {
        let record: JournalRecord
        let topic: String
        let key: DedupKey?
        /// The payload encoded with a placeholder seq, and where the placeholder's digits are;
        /// nil for the few kinds whose payload depends on the seq otherwise.
        let template: (bytes: [UInt8], seqDigits: Range<Int>)?

        init(_ record: JournalRecord) {
            self.record = record
            topic = record.topic
            key = record.dedupKey
            template = record.payloadTemplate()
        }

        func payload(seq: UInt64) -> [UInt8] {
            guard let (bytes, digits) = template else { return record.payload(seq: seq) }
            var payload = [UInt8]()
            payload.reserveCapacity(bytes.count)
            payload.append(contentsOf: bytes[..<digits.lowerBound])
            payload.appendDecimal(seq)
            payload.append(contentsOf: bytes[digits.upperBound...])
            return payload
        }
    }

    private struct Queue {
        var batches: [Pending] = []
        var records = 0
        var closed = false
    }

    /// State the writer thread changes and replay reads.
    private struct Index {
        var offsets: [Int64] = []  // offsets[seq - 1] is where record `seq` starts
        var end: Int64 = 0
        var lastSeq: UInt64 { UInt64(offsets.count) }
    }

    public let path: String
    private let options: Options
    private let fd: Int32
    private let queue = Mutex(Queue())
    /// Signalled whenever a batch is queued or the journal closes.
    private let wake = DispatchSemaphore(value: 0)
    private let index: Mutex<Index>
    // Only the writer thread touches the dedup keys after `init`.
    private nonisolated(unsafe) var keys: Set<DedupKey>
    private let publish: Publish
    private let stopped = DispatchSemaphore(value: 0)

    /// Opens (or creates) the journal at `path`, reads it to rebuild the index and the dedup keys,
    /// and cuts off a torn tail.
    public init(path: String, options: Options = Options(), publish: @escaping Publish) throws(Failure) {
        self.path = path
        self.options = options
        self.publish = publish
        let fd = open(path, O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw .io("cannot open \(path): \(String(cString: strerror(errno)))") }
        self.fd = fd
        var index = Index()
        var keys = Set<DedupKey>()
        do {
            try Self.scan(fd: fd, chunkBytes: options.scanChunkBytes) { offset, entry in
                index.offsets.append(offset)
                if let key = DedupKey(topic: entry.topic, payload: entry.payload) { keys.insert(key) }
            } end: { index.end = $0 }
        } catch {
            close(fd)
            throw error
        }
        if ftruncate(fd, off_t(index.end)) != 0 || fsync(fd) != 0 {
            close(fd)
            throw .io("cannot truncate the torn tail of \(path): \(String(cString: strerror(errno)))")
        }
        self.index = Mutex(index)
        self.keys = keys
        let thread = Thread { [self] in writerLoop() }
        thread.name = "journal-writer"
        thread.start()
    }

    deinit { close(fd) }

    public var lastSeq: UInt64 { index.withLock { $0.lastSeq } }

    /// Journals `records` and returns once they are on disk. Each fix or motion sample already in
    /// the journal comes back as `.duplicate` and is neither written nor published again.
    ///
    /// `queued` is called once the records have their place in the writer's queue (or were
    /// refused), before they are on disk: what is appended after that call is written after them.
    public func append(_ records: [JournalRecord], queued: @Sendable () -> Void = {}) async throws(Failure) -> [Outcome] {
        try await append(prepare(records), queued: queued)
    }

    /// Records made ready for `append`: see `prepare`.
    public struct Prepared: Sendable {
        fileprivate let records: [PreparedRecord]
    }

    /// Works out what of `records` does not depend on their seqs (topics, dedup keys, encoded
    /// payloads), on the caller's thread: callers that must append in some order can do this
    /// part concurrently, before their turn.
    public func prepare(_ records: [JournalRecord]) -> Prepared {
        Prepared(records: records.map(PreparedRecord.init))
    }

    public func append(_ prepared: Prepared, queued: @Sendable () -> Void = {}) async throws(Failure) -> [Outcome] {
        let records = prepared.records
        let result: Result<[Outcome], Failure> = await withCheckedContinuation { continuation in
            let accepted = queue.withLock { queue -> Failure? in
                if queue.closed { return .closed }
                if queue.records + records.count > options.maxPendingRecords && queue.records > 0 { return .overloaded }
                queue.batches.append(Pending(records: records, reply: { continuation.resume(returning: $0) }))
                queue.records += records.count
                return nil
            }
            queued()
            if let refused = accepted {
                continuation.resume(returning: .failure(refused))
            } else {
                wake.signal()
            }
        }
        return try result.get()
    }

    /// Up to `limit` entries from `fromSeq` on, in order.
    public func replay(fromSeq: UInt64, limit: Int) throws(Failure) -> [Entry] {
        let (start, stop, end) = index.withLock { index -> (Int64, Int, Int64)? in
            guard fromSeq >= 1, fromSeq <= index.lastSeq else { return nil }
            let first = Int(fromSeq - 1)
            let last = min(index.offsets.count, first + limit)
            let stopOffset = last < index.offsets.count ? index.offsets[last] : index.end
            return (index.offsets[first], last - first, stopOffset)
        } ?? (0, 0, 0)
        guard stop > 0 else { return [] }
        var buffer = [UInt8](repeating: 0, count: Int(end - start))
        let read = buffer.withUnsafeMutableBytes { pread(fd, $0.baseAddress, $0.count, off_t(start)) }
        guard read == buffer.count else { throw .io("short read from \(path)") }
        var entries: [Entry] = []
        entries.reserveCapacity(stop)
        var seq = fromSeq
        try Self.parse(buffer[...], baseOffset: start, atEnd: true) { _, entry in
            entries.append(Entry(seq: seq, topic: entry.topic, payload: entry.payload))
            seq += 1
        }
        return entries
    }

    /// Stops the writer after it has committed everything already handed to it.
    public func shutdown() {
        queue.withLock { $0.closed = true }
        wake.signal()
        stopped.wait()
    }

    // MARK: The writer thread

    private func writerLoop() {
        while true {
            let taken = queue.withLock { queue -> ([Pending], Bool)? in
                guard !queue.batches.isEmpty || queue.closed else { return nil }
                defer { queue.batches = []; queue.records = 0 }
                return (queue.batches, queue.closed)
            }
            guard let (batches, closed) = taken else {
                wake.wait()
                continue
            }
            if !batches.isEmpty { commit(batches) }
            if closed && batches.isEmpty { break }
        }
        stopped.signal()
    }

    private func commit(_ batches: [Pending]) {
        // Only the two numbers: a copy of the index would keep its offsets alive, and the
        // append below would then copy them all.
        let before = index.withLock { (lastSeq: $0.lastSeq, end: $0.end) }
        var next = before.lastSeq + 1
        var offset = before.end
        var bytes: [UInt8] = []
        var newOffsets: [Int64] = []
        var newKeys: [DedupKey] = []
        var written: [(Entry, JournalRecord)] = []
        var outcomes: [[Outcome]] = []

        for batch in batches {
            var batchOutcomes: [Outcome] = []
            batchOutcomes.reserveCapacity(batch.records.count)
            for prepared in batch.records {
                // Inserted at once, so a duplicate within this group is caught too; taken back
                // below if the write fails.
                if let key = prepared.key {
                    guard keys.insert(key).inserted else {
                        batchOutcomes.append(.duplicate)
                        continue
                    }
                    newKeys.append(key)
                }
                let entry = Entry(seq: next, topic: prepared.topic, payload: prepared.payload(seq: next))
                newOffsets.append(offset)
                offset += Int64(Self.append(entry, to: &bytes))
                written.append((entry, prepared.record))
                batchOutcomes.append(.journaled(seq: next))
                next += 1
            }
            outcomes.append(batchOutcomes)
        }

        if !bytes.isEmpty, let failure = writeAndSync(bytes) {
            // Nothing of this group was acknowledged: cut the file back and refuse it all.
            _ = ftruncate(fd, off_t(before.end))
            for key in newKeys { keys.remove(key) }
            for batch in batches { batch.reply(.failure(failure)) }
            return
        }
        index.withLock { index in
            index.offsets.append(contentsOf: newOffsets)
            index.end = offset
        }
        for (entry, record) in written { publish(entry, record) }
        for (batch, batchOutcomes) in zip(batches, outcomes) { batch.reply(.success(batchOutcomes)) }
    }

    private func writeAndSync(_ bytes: [UInt8]) -> Failure? {
        var done = 0
        while done < bytes.count {
            let n = bytes.withUnsafeBytes { write(fd, $0.baseAddress! + done, $0.count - done) }
            if n < 0 {
                if errno == EINTR { continue }
                return .io(String(cString: strerror(errno)))
            }
            done += n
        }
        guard fdatasync(fd) == 0 else { return .io("fdatasync: \(String(cString: strerror(errno)))") }
        return nil
    }

    // MARK: Format

    /// Writes the record in place: the body first, then its length and checksum into the header
    /// left for them.
    private static func append(_ entry: Entry, to bytes: inout [UInt8]) -> Int {
        let header = bytes.count
        bytes.append(contentsOf: repeatElement(0, count: 8))
        bytes.append(contentsOf: entry.topic.utf8)
        bytes.append(0x0A)
        bytes.append(contentsOf: entry.payload)
        let bodyCount = bytes.count - header - 8
        let crc = CRC32.checksum(bytes[(header + 8)...])
        bytes.withUnsafeMutableBytes { raw in
            raw.storeBytes(of: UInt32(bodyCount).littleEndian, toByteOffset: header, as: UInt32.self)
            raw.storeBytes(of: crc.littleEndian, toByteOffset: header + 4, as: UInt32.self)
        }
        return 8 + bodyCount
    }

    /// Reads the journal in pieces of `chunkBytes`, so that starting needs memory for a piece,
    /// not for the whole file (years of fixes). A record that straddles two pieces is completed
    /// from the next; a record that is complete but fails its checksum is judged, as `parse`
    /// does, against everything after it, so the rest of the file is read for that rare case.
    private static func scan(
        fd: Int32, chunkBytes: Int, _ each: (Int64, (topic: String, payload: [UInt8])) throws(Failure) -> Void,
        end: (Int64) -> Void
    ) throws(Failure) {
        var stat = stat()
        guard fstat(fd, &stat) == 0 else { throw .io("fstat: \(String(cString: strerror(errno)))") }
        let size = Int64(stat.st_size)
        var bufferOffset: Int64 = 0  // where `buffer` starts in the file
        var readOffset: Int64 = 0
        var buffer: [UInt8] = []
        while true {
            try readMore(fd: fd, from: &readOffset, count: Int(min(Int64(max(chunkBytes, 1)), size - readOffset)), into: &buffer)
            let atEnd = readOffset == size
            let parsedTo = try parse(buffer[...], baseOffset: bufferOffset, atEnd: atEnd, each)
            if atEnd {
                end(parsedTo)
                return
            }
            buffer.removeSubrange(0..<Int(parsedTo - bufferOffset))
            bufferOffset = parsedTo
            if isCompleteRecord(buffer[...]) {
                // parse stopped at a whole record: it failed its checksum. Decide with the rest.
                try readMore(fd: fd, from: &readOffset, count: Int(size - readOffset), into: &buffer)
            }
        }
    }

    private static func readMore(fd: Int32, from offset: inout Int64, count: Int, into buffer: inout [UInt8]) throws(Failure) {
        let start = buffer.count
        buffer.append(contentsOf: repeatElement(0, count: count))
        var done = 0
        while done < count {
            let n = buffer.withUnsafeMutableBytes { pread(fd, $0.baseAddress! + start + done, count - done, off_t(offset) + off_t(done)) }
            guard n > 0 else { throw .io("cannot read the journal: \(String(cString: strerror(errno)))") }
            done += n
        }
        offset += Int64(count)
    }

    /// Whether `bytes` starts with a whole record (length and checksum header, and its body).
    private static func isCompleteRecord(_ bytes: ArraySlice<UInt8>) -> Bool {
        guard bytes.count >= 8 else { return false }
        return bytes.count - 8 >= recordHeader(bytes, at: bytes.startIndex).length
    }

    /// Parses whole records from `buffer`; returns the offset after the last good one.
    @discardableResult
    private static func parse(
        _ buffer: ArraySlice<UInt8>, baseOffset: Int64, atEnd: Bool, _ each: (Int64, (topic: String, payload: [UInt8])) throws(Failure) -> Void
    ) throws(Failure) -> Int64 {
        var position = buffer.startIndex
        while buffer.endIndex - position >= 8 {
            let (length, crc) = recordHeader(buffer, at: position)
            let bodyStart = position + 8
            // A record cut short, or one whose checksum fails, is where a crash interrupted a
            // write that was never acknowledged: the torn tail. A bad record with good ones after
            // it is damage, not a tail: refuse it rather than cut acknowledged records away.
            guard buffer.endIndex - bodyStart >= length else {
                // Short of the file's end, the rest of the record is still to be read. At the end,
                // a damaged length field looks like a cut-off record: valid records after it
                // give it away.
                if atEnd, hasValidRecord(buffer[bodyStart...]) {
                    throw .corrupt("record at byte \(baseOffset + Int64(position - buffer.startIndex)) has a length past the end, and valid records follow it")
                }
                break
            }
            let body = buffer[bodyStart..<(bodyStart + length)]
            guard CRC32.checksum(body) == crc, let newline = body.firstIndex(of: 0x0A) else {
                if hasValidRecord(buffer[(bodyStart + length)...]) {
                    throw .corrupt("record at byte \(baseOffset + Int64(position - buffer.startIndex)) fails its checksum, and valid records follow it")
                }
                break
            }
            try each(baseOffset + Int64(position - buffer.startIndex), (String(decoding: body[..<newline], as: UTF8.self), Array(body[(newline + 1)...])))
            position = bodyStart + length
        }
        return baseOffset + Int64(position - buffer.startIndex)
    }
}

/// Whether a valid record starts anywhere in `bytes` (checked only after a bad one was found).
/// The 8-byte header at `position`: the body's length and its CRC-32, both little-endian.
private func recordHeader(_ bytes: ArraySlice<UInt8>, at position: Int) -> (length: Int, crc: UInt32) {
    func word(_ at: Int) -> UInt32 { UInt32(littleEndian: bytes[at..<(at + 4)].withUnsafeBytes { $0.loadUnaligned(as: UInt32.self) }) }
    return (Int(word(position)), word(position + 4))
}

private func hasValidRecord(_ bytes: ArraySlice<UInt8>) -> Bool {
    var position = bytes.startIndex
    while bytes.endIndex - position >= 8 {
        let (length, crc) = recordHeader(bytes, at: position)
        if length > 0, bytes.endIndex - (position + 8) >= length {
            let body = bytes[(position + 8)..<(position + 8 + length)]
            if CRC32.checksum(body) == crc, body.contains(0x0A) { return true }
        }
        position += 1
    }
    return false
}

/// What the journal stores: one bus message's topic and payload, with `seq` filled in on commit.
public struct JournalRecord: Sendable {
    public typealias Kind = JournalPayload

    public let kind: Kind

    public init(_ kind: Kind) { self.kind = kind }

    public var device: String {
        switch kind {
        case .fix(let fix): fix.device
        case .motion(let sample): sample.device
        case .transition(let transition): transition.device
        case .checkin(let checkin): checkin.device
        case .importFinished(let finished): finished.device
        case .sessionStarted(let session): session.device
        case .sessionStopped(let session): session.device
        case .visit(let visit): visit.device
        }
    }

    /// The event type, which with the device makes the topic.
    public var type: String {
        switch kind {
        case .fix: "fix"
        case .motion: "motion"
        case .transition: "client.transition"
        case .checkin: "taxi.checkin"
        case .importFinished: "import.finished"
        case .sessionStarted: "session.started"
        case .sessionStopped: "session.stopped"
        case .visit: "visit"
        }
    }

    public var topic: String { Topic.make(type, device: device) }

    /// The same record for `device`: parsers work before authentication has named the device.
    public func assigned(to device: String) -> JournalRecord {
        switch kind {
        case .fix(var fix): fix.device = device; return JournalRecord(.fix(fix))
        case .motion(var sample): sample.device = device; return JournalRecord(.motion(sample))
        case .transition(var transition): transition.device = device; return JournalRecord(.transition(transition))
        case .checkin(var checkin): checkin.device = device; return JournalRecord(.checkin(checkin))
        case .importFinished(var finished): finished.device = device; return JournalRecord(.importFinished(finished))
        case .sessionStarted(var session): session.device = device; return JournalRecord(.sessionStarted(session))
        case .sessionStopped(var session): session.device = device; return JournalRecord(.sessionStopped(session))
        case .visit(var visit): visit.device = device; return JournalRecord(.visit(visit))
        }
    }

    func payload(seq: UInt64) -> [UInt8] {
        // Encoding these types cannot fail: their numbers were validated as finite.
        switch kind {
        case .fix(var fix):
            fix.seq = seq
            return BusJSON.encode(fix)
        case .motion(var sample):
            sample.seq = seq
            return try! BusJSON.encode(sample)
        case .transition(var transition):
            transition.seq = seq
            return try! BusJSON.encode(transition)
        case .checkin(var checkin):
            checkin.seq = seq
            return try! BusJSON.encode(checkin)
        case .importFinished(var finished):
            finished.seq = seq
            return try! BusJSON.encode(finished)
        case .sessionStarted(var session):
            // A session is known by the device and the journal seq that started it.
            if session.sessionID.isEmpty { session.sessionID = Self.sessionID(device: session.device, seq: seq) }
            return Self.withSeq(try! BusJSON.encode(session), seq)
        case .sessionStopped(let session):
            return Self.withSeq(try! BusJSON.encode(session), seq)
        case .visit(var visit):
            visit.seq = seq
            return try! BusJSON.encode(visit)
        }
    }

    /// The payload with `seq` written as a placeholder, and where its digits are: a fix or a
    /// motion sample is then numbered by splicing digits in, not encoded again.
    func payloadTemplate() -> (bytes: [UInt8], seqDigits: Range<Int>)? {
        let placeholder = UInt64.max
        let bytes: [UInt8]
        switch kind {
        case .fix(var fix):
            fix.seq = placeholder
            bytes = BusJSON.encode(fix)
        case .motion(var sample):
            sample.seq = placeholder
            bytes = try! BusJSON.encode(sample)
        default:
            return nil
        }
        // Strings are escaped, so `"seq":` followed by the placeholder occurs only as the field.
        let needle = Array(#""seq":\#(placeholder)"#.utf8)
        let start = bytes.withUnsafeBufferPointer { haystack -> Int? in
            needle.withUnsafeBufferPointer { needle -> Int? in
                guard haystack.count >= needle.count else { return nil }
                for start in 0...(haystack.count - needle.count) where haystack[start] == needle[0] {
                    if memcmp(haystack.baseAddress! + start, needle.baseAddress!, needle.count) == 0 { return start }
                }
                return nil
            }
        }
        guard let start else { return nil }
        return (bytes, (start + 6)..<(start + needle.count))
    }

    public static func sessionID(device: String, seq: UInt64) -> String { "\(device)-\(seq)" }

    /// Adds `"seq":N` to an encoded JSON object: every journaled payload carries its seq.
    static func withSeq(_ object: [UInt8], _ seq: UInt64) -> [UInt8] {
        guard object.count >= 2, object.first == UInt8(ascii: "{") else { return object }
        let rest = object.dropFirst()
        return Array(#"{"seq":\#(seq)"#.utf8) + (rest.first == UInt8(ascii: "}") ? [] : [UInt8(ascii: ",")]) + rest
    }

    var dedupKey: DedupKey? {
        switch kind {
        case .fix(let fix): DedupKey(fix)
        case .motion(let sample): DedupKey(sample)
        case .transition(let transition): DedupKey(transition)
        case .visit(let visit): DedupKey(visit)
        default: nil
        }
    }
}

/// What makes a fix (device, time, position) or a motion sample (device, start, activity) the
/// same as one already journaled: clients such as Overland re-send whole batches.
///
/// Kept as a 128-bit digest, because every record's key stays in memory for as long as ingest
/// runs: 16 bytes instead of a device string and three words. The digest is two SipHash values
/// of the same fields under different tags, seeded afresh by each process (the keys are rebuilt
/// from the journal at start). Two different records collide with odds of about n²/2¹²⁹:
/// 10⁻²³ for a hundred million records.
struct DedupKey: Hashable, Sendable {
    private let high: UInt64
    private let low: UInt64

    /// Half the key is already a keyed hash of the record: hashing it again whole only costs.
    func hash(into hasher: inout Hasher) { hasher.combine(high) }

    private init(device: String, milliseconds: Int64, a: UInt64, b: UInt64) {
        func digest(_ tag: UInt8) -> UInt64 {
            var hasher = Hasher()
            hasher.combine(tag)
            hasher.combine(device)
            hasher.combine(milliseconds)
            hasher.combine(a)
            hasher.combine(b)
            return UInt64(bitPattern: Int64(hasher.finalize()))
        }
        high = digest(1)
        low = digest(2)
    }

    init(_ fix: Fix) {
        self.init(
            device: fix.device, milliseconds: Int64((fix.time.timeIntervalSince1970 * 1000).rounded()),
            // -0.0 is journaled as 0 (JSON has one zero), so it must key as 0 too.
            a: (fix.lat == 0 ? 0 : fix.lat).bitPattern, b: (fix.lon == 0 ? 0 : fix.lon).bitPattern)
    }

    init(_ sample: MotionSample) {
        self.init(
            device: sample.device, milliseconds: Int64((sample.start.timeIntervalSince1970 * 1000).rounded()),
            a: UInt64(MotionSample.Activity.allCases.firstIndex(of: sample.activity)!) | (1 << 63),
            b: UInt64(MotionSample.Confidence.allCases.firstIndex(of: sample.confidence)!))
    }

    /// A phone's own transition: MQTT redelivers, and apps resend, what was not acknowledged.
    init(_ transition: ClientTransition) {
        var region = Hasher()
        region.combine(transition.region)
        self.init(
            device: transition.device, milliseconds: Int64((transition.time.timeIntervalSince1970 * 1000).rounded()),
            a: (transition.event == "enter" ? 1 : 2) | (1 << 62), b: UInt64(bitPattern: Int64(region.finalize())))
    }

    /// A stay: the same history imported twice is stored once.
    init(_ visit: Visit) {
        var place = Hasher()
        place.combine(visit.placeID)
        place.combine(visit.lat)
        place.combine(visit.lon)
        self.init(
            device: visit.device, milliseconds: Int64((visit.start.timeIntervalSince1970 * 1000).rounded()),
            a: UInt64(bitPattern: Int64(place.finalize())) | (1 << 61), b: UInt64(bitPattern: Int64((visit.end.timeIntervalSince1970 * 1000).rounded())))
    }

    /// Rebuilds the key of a journaled record.
    init?(topic: String, payload: [UInt8]) {
        if topic.hasPrefix("fix."), let fix = try? BusJSON.decode(Fix.self, from: payload) {
            self.init(fix)
        } else if topic.hasPrefix("motion."), let sample = try? BusJSON.decode(MotionSample.self, from: payload) {
            self.init(sample)
        } else if topic.hasPrefix("client.transition."), let transition = try? BusJSON.decode(ClientTransition.self, from: payload) {
            self.init(transition)
        } else if topic.hasPrefix("visit."), let visit = try? BusJSON.decode(Visit.self, from: payload) {
            self.init(visit)
        } else {
            return nil
        }
    }
}

/// CRC-32 (IEEE, as zip and PNG use it), to find torn records: zlib's, several times faster than
/// a byte-at-a-time table.
enum CRC32 {
    static func checksum(_ bytes: UnsafeRawBufferPointer) -> UInt32 {
        guard let base = bytes.baseAddress else { return 0 }
        return UInt32(crc32_z(0, base.assumingMemoryBound(to: Bytef.self), bytes.count))
    }

    static func checksum(_ bytes: ArraySlice<UInt8>) -> UInt32 { bytes.withUnsafeBytes { checksum($0) } }
}
