import CDrivebusSupport
import CLibZ
import DrivebusSchema
import Foundation
import Glibc
import Synchronization

/// The ingest journal: the source of truth. A directory of segments, `<first seq>.seg`, each an
/// append-only file of records `[u32 length][u32 crc32][topic "\n" payload JSON]`, little-endian.
///
/// One writer thread owns the newest (active) segment. Callers hand it batches and wait; it takes
/// everything that is waiting, writes it with one `write` and one `fdatasync` (group commit), and
/// only then answers them and publishes the records, in `seq` order. A torn record at the tail
/// (a crash mid-write) is cut off when the journal is opened; everything before it was
/// acknowledged and stays.
///
/// When the active segment passes `Options.segmentBytes` it is sealed: its index file
/// (`SegmentIndex`: record offsets, sorted dedup digests, records by device and time) is written
/// beside it and a new segment begins. Start-up reads only the indexes' headers and fences and
/// the active segment, so its time and memory follow one segment, not the years before it.
public final class Journal: Sendable {
    public struct Options: Sendable {
        /// Records waiting for the disk beyond which new batches are refused (503) so clients retry.
        public var maxPendingRecords = 200_000
        /// How much of the active segment is read at a time at start.
        public var scanChunkBytes = 8 << 20
        /// The size past which the active segment is sealed and a new one begun: start-up reads
        /// at most about this much, and holds the dedup keys of this much in memory.
        public var segmentBytes: Int64 = 32 << 20
        /// For crash tests only: how long a rewrite (records removed) waits with its new files
        /// written and synced, before putting them in place.
        public var rewritePause: Duration = .zero
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

    /// Called on the writer thread after each commit with the records it added, in `seq` order
    /// (never empty): a commit's records can go out together.
    public typealias Publish = @Sendable (_ committed: [(entry: Entry, record: JournalRecord)]) -> Void

    private struct Pending {
        let records: [PreparedRecord]
        /// Seal the active segment after this batch, however small it is (before records are removed).
        var sealAfter = false
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

    /// A sealed segment, as much of it as stays in memory.
    struct Sealed: Sendable {
        let path: String
        let index: SegmentIndex
        var firstSeq: UInt64 { index.header.firstSeq }
        var endSeq: UInt64 { firstSeq + UInt64(index.header.count) }
    }

    /// The segment being written.
    struct Active: Sendable {
        var path: String
        var firstSeq: UInt64
        var offsets: [Int64] = []  // offsets[seq - firstSeq] is where record `seq` starts
        var end: Int64 = 0
        var entries: [SegmentIndex.DeviceEntry] = []  // its keyed records, for replay by device
        var endSeq: UInt64 { firstSeq + UInt64(offsets.count) }
    }

    /// State the writer thread changes and replay reads.
    struct Segments {
        var sealed: [Sealed] {
            didSet { keyTimes = Self.keyTimes(of: sealed) }
        }
        var active: Active
        /// Each sealed segment's range of record times (empty when it has no keyed record), and
        /// the latest of them: dedup looks at these for every record, so they are kept apart
        /// from the segments (which hold strings and arrays).
        private(set) var keyTimes: (ranges: [(low: Int64, high: Int64)], latest: Int64)

        init(sealed: [Sealed], active: Active) {
            self.sealed = sealed
            self.active = active
            keyTimes = Self.keyTimes(of: sealed)
        }

        private static func keyTimes(of sealed: [Sealed]) -> (ranges: [(low: Int64, high: Int64)], latest: Int64) {
            let ranges = sealed.map { $0.index.header.keyCount > 0 ? ($0.index.header.minMilliseconds, $0.index.header.maxMilliseconds) : (Int64.max, Int64.min) }
            return (ranges, ranges.map(\.1).max() ?? .min)
        }

        var lastSeq: UInt64 { active.endSeq - 1 }
    }

    /// State only the writer thread touches after `init`.
    private final class WriterState: @unchecked Sendable {
        var fd: Int32
        /// The dedup keys of the active segment; sealed segments' are on disk.
        var keys: Set<DedupKey>
        /// Open index files of sealed segments, for dedup lookups, with the file each is.
        var indexFiles: [String: (fd: Int32, inode: UInt64)] = [:]
        /// Set when a failed write could not be cut back off the file: the file then holds bytes
        /// the writer does not account for, and the next records would be numbered over them.
        /// Every later append is refused; the scan at the next start finds what the file holds.
        var unsound: Failure?

        init(fd: Int32, keys: Set<DedupKey>) {
            self.fd = fd
            self.keys = keys
        }

        deinit {
            close(fd)
            indexFiles.values.forEach { close($0.fd) }
        }
    }

    /// The journal's directory.
    public let path: String
    let options: Options
    private let queue = Mutex(Queue())
    /// Signalled whenever a batch is queued or the journal closes.
    private let wake = DispatchSemaphore(value: 0)
    let segments: Mutex<Segments>
    private let writer: WriterState
    private let publish: Publish
    private let stopped = DispatchSemaphore(value: 0)
    /// Ends of the writer's commits, for a rewrite in the background to sync between them.
    let commitEnds = CommitEnds()

    /// Opens (or creates) the journal in the directory `path`: reads the sealed segments'
    /// indexes (rebuilding any that is missing or damaged) and the active segment, and cuts off
    /// a torn tail.
    public init(path: String, options: Options = Options(), publish: @escaping Publish) throws(Failure) {
        self.path = path
        self.options = options
        self.publish = publish
        if mkdir(path, 0o700) != 0 && errno != EEXIST { throw .io("cannot create \(path): \(String(cString: strerror(errno)))") }
        Self.removeLeftovers(in: path)
        var names = try Self.segmentNames(in: path)
        if names.isEmpty { names = [Self.segmentName(firstSeq: 1)] }

        var sealed: [Sealed] = []
        var expected: UInt64 = 1
        for (position, name) in names.enumerated() {
            let segmentPath = path + "/" + name
            let isLast = position == names.count - 1
            if isLast, !FileManager.default.fileExists(atPath: Self.indexPath(of: segmentPath)) { break }
            let index = try Self.openIndex(of: segmentPath, allowTornTail: isLast)
            guard index.header.firstSeq == expected else {
                throw .corrupt("\(segmentPath) starts at seq \(index.header.firstSeq), but the segments before it end at \(expected - 1)")
            }
            sealed.append(Sealed(path: segmentPath, index: index))
            expected += UInt64(index.header.count)
        }
        // The active segment: the last one, unless it was sealed just before a crash.
        let activePath = sealed.count == names.count ? path + "/" + Self.segmentName(firstSeq: expected) : path + "/" + names.last!
        let fd = open(activePath, O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw .io("cannot open \(activePath): \(String(cString: strerror(errno)))") }
        syncDirectory(of: activePath)
        var active = Active(path: activePath, firstSeq: expected)
        var contents = SegmentIndex.Contents()
        do {
            try RecordFormat.scan(fd: fd, chunkBytes: options.scanChunkBytes) { offset, entry in
                contents.add(at: offset, topic: entry.topic, payload: entry.payload)
            } end: { active.end = $0 }
        } catch {
            close(fd)
            throw error
        }
        (active.offsets, active.entries) = (contents.offsets, contents.entries)
        let keys = Set(contents.keys)
        if ftruncate(fd, off_t(active.end)) != 0 || fsync(fd) != 0 {
            close(fd)
            throw .io("cannot truncate the torn tail of \(activePath): \(String(cString: strerror(errno)))")
        }
        self.segments = Mutex(Segments(sealed: sealed, active: active))
        self.writer = WriterState(fd: fd, keys: keys)
        // A journal of one file from before segments, or a bigger segment size before: seal now.
        sealIfFull()
        let thread = Thread { [self] in
            _ = drivebus_thread_name("journal-writer")
            writerLoop()
        }
        thread.start()
    }

    /// Turns a journal of one file (before segments: `journal.log`) into segments of
    /// `segmentBytes` in `directory`, the same records with the same seqs, each sealed segment
    /// with its index. They are written into `<directory>.adopting` first; once all of it is
    /// synced, a marker says so, the old file goes, and the directory is renamed into place. A
    /// crash before the marker leaves the old file, and the next start does it again; after it,
    /// the next start finishes the job. It needs the old file's size again in free disk, once.
    public static func adopt(singleFile: String, into directory: String, segmentBytes: Int64 = Options().segmentBytes) throws(Failure) {
        let staging = directory + ".adopting", marker = staging + "/ADOPTED"
        let fileExists = FileManager.default.fileExists(atPath: singleFile)
        if FileManager.default.fileExists(atPath: marker) {
            // Written in full before a crash: finish.
            if fileExists { unlink(singleFile) }
            try putInPlace(staging, as: directory, marker: marker)
            return
        }
        try? FileManager.default.removeItem(atPath: staging)
        guard fileExists else { return }
        if FileManager.default.fileExists(atPath: directory), try !segmentNames(in: directory).isEmpty {
            throw .corrupt("both \(singleFile) and segments in \(directory): move one of them away")
        }
        guard mkdir(staging, 0o700) == 0 else { throw .io("cannot create \(staging): \(String(cString: strerror(errno)))") }
        let fd = open(singleFile, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { throw .io("cannot open \(singleFile): \(String(cString: strerror(errno)))") }
        defer { close(fd) }

        var firstSeq: UInt64 = 1, seq: UInt64 = 1
        var bytes: [UInt8] = [], contents = SegmentIndex.Contents()
        func writeSegment(sealed: Bool) throws(Failure) {
            let path = staging + "/" + segmentName(firstSeq: firstSeq)
            try writeSynced(bytes, to: path)
            if sealed {
                try SegmentIndex.write(path: indexPath(of: path), firstSeq: firstSeq, segmentBytes: Int64(bytes.count), contents: contents)
            }
            (firstSeq, bytes, contents) = (seq, [], SegmentIndex.Contents())
        }
        // A torn tail is left out, as opening the file would cut it; damage before good records
        // stops the adoption, and ingest with it, naming the byte.
        try RecordFormat.scan(fd: fd, chunkBytes: 8 << 20) { _, record throws(Failure) in
            contents.add(at: Int64(bytes.count), topic: record.topic, payload: record.payload)
            _ = RecordFormat.append(Entry(seq: seq, topic: record.topic, payload: record.payload), to: &bytes)
            seq += 1
            if Int64(bytes.count) >= segmentBytes { try writeSegment(sealed: true) }
        } end: { _ in }
        try writeSegment(sealed: false)
        try writeSynced([], to: marker)
        syncDirectory(of: marker)
        unlink(singleFile)
        syncDirectory(of: singleFile)
        try putInPlace(staging, as: directory, marker: marker)
    }

    private static func putInPlace(_ staging: String, as directory: String, marker: String) throws(Failure) {
        // An empty directory left by an earlier start without segments gives way.
        if FileManager.default.fileExists(atPath: directory) {
            guard try segmentNames(in: directory).isEmpty, (try? FileManager.default.removeItem(atPath: directory)) != nil else {
                throw .corrupt("\(directory) holds segments, and \(staging) holds the journal adopted from one file: move one of them away")
            }
        }
        guard rename(staging, directory) == 0 else { throw .io("cannot rename \(staging) to \(directory): \(String(cString: strerror(errno)))") }
        syncDirectory(of: directory)
        unlink(directory + "/ADOPTED")
        syncDirectory(of: directory + "/")
    }

    public var lastSeq: UInt64 { segments.withLock { $0.lastSeq } }

    /// How the journal is laid out now, for status and benchmarks.
    public struct Layout: Sendable, Equatable {
        public var sealedSegments: Int
        public var activeRecords: Int
        public var activeBytes: Int64
    }

    public var layout: Layout {
        segments.withLock { Layout(sealedSegments: $0.sealed.count, activeRecords: $0.active.offsets.count, activeBytes: $0.active.end) }
    }

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

    /// Seals the active segment now, if it holds any record: after everything appended before.
    func sealActive() async throws(Failure) {
        let result: Result<[Outcome], Failure> = await withCheckedContinuation { continuation in
            let refused = queue.withLock { queue -> Failure? in
                if queue.closed { return .closed }
                queue.batches.append(Pending(records: [], sealAfter: true, reply: { continuation.resume(returning: $0) }))
                return nil
            }
            if let refused { continuation.resume(returning: .failure(refused)) } else { wake.signal() }
        }
        _ = try result.get()
    }

    /// Up to `limit` entries from `fromSeq` on, in order, across segments.
    public func replay(fromSeq: UInt64, limit: Int) throws(Failure) -> [Entry] {
        var entries: [Entry] = []
        var next = max(fromSeq, 1)
        while entries.count < limit {
            let count = limit - entries.count
            let located = try segments.withLock { segments throws(Failure) -> (OpenSegment, [Int64]?, UInt64)? in
                guard let (segment, offsets) = try Self.locate(next, count: count, in: segments) else { return nil }
                return (segment, offsets, segments.lastSeq)
            }
            guard let (segment, known, lastSeq) = located else { break }
            let offsets: [Int64]
            if let known { offsets = known } else { offsets = try segment.index!.offsets(first: Int(next - segment.firstSeq), count: count, fd: segment.indexFD) }
            let bytes = try SegmentIndex.read(segment.segmentFD, at: Int(offsets.first!), count: Int(offsets.last! - offsets.first!), path: segment.path)
            var seq = next
            try RecordFormat.parse(bytes[...], baseOffset: offsets.first!, atEnd: true) { _, entry in
                entries.append(Entry(seq: seq, topic: entry.topic, payload: entry.payload))
                seq += 1
            }
            // Every record the offsets name must parse: a short page would read as the end.
            guard seq - next == UInt64(offsets.count - 1) else {
                throw .corrupt("\(segment.path): the record of seq \(seq) at byte \(offsets[Int(seq - next)]) fails its checksum")
            }
            guard seq > next, seq <= lastSeq else { break }
            next = seq
        }
        return entries
    }

    /// The fixes, motion samples, transitions and stays of one device whose times fall in
    /// `from ... to`, in seq order: sealed segments are searched by their index by device and
    /// time, without reading other records.
    public func replay(device: String, from: Date, to: Date) throws(Failure) -> [Entry] {
        let hash = DedupKey.deviceHash(device)
        let (low, high) = (DedupKey.milliseconds(from), DedupKey.milliseconds(to))
        let (sealed, active) = try segments.withLock { segments throws(Failure) -> ([OpenSegment], (OpenSegment, Active)) in
            let sealed = try segments.sealed.filter { $0.index.header.overlaps(low, high) }.map { segment throws(Failure) in try OpenSegment(segment) }
            return (sealed, (try OpenSegment(segments.active), segments.active))
        }
        // The segments side by side, on every core: a day is usually a few of them.
        let found = Mutex([Int: Result<[Entry], Failure>]())
        DispatchQueue.concurrentPerform(iterations: sealed.count) { position in
            let segment = sealed[position]
            let result = Result { () throws(Failure) -> [Entry] in
                let records = try segment.index!.records(deviceHash: hash, from: low, to: high, fd: segment.indexFD)
                guard let first = records.first, let last = records.last else { return [] }
                let offsets = try segment.index!.offsets(first: first, count: last - first + 1, fd: segment.indexFD)
                var entries: [Entry] = []
                try Self.collect(records, first: first, offsets: offsets, from: segment, into: &entries)
                return entries
            }
            found.withLock { $0[position] = result }
        }
        var entries: [Entry] = []
        for position in sealed.indices { entries += try found.withLock { $0[position]! }.get() }
        let records = active.1.entries.filter { $0.deviceHash == hash && low <= $0.milliseconds && $0.milliseconds <= high }.map { Int($0.record) }.sorted()
        if let first = records.first, let last = records.last {
            let offsets = Array(active.1.offsets[first...last]) + [last + 1 < active.1.offsets.count ? active.1.offsets[last + 1] : active.1.end]
            try Self.collect(records, first: first, offsets: offsets, from: active.0, into: &entries)
        }
        // The hash picks the device; the topic makes sure.
        let suffix = Array(("." + device).utf8)
        return entries.filter { $0.topic.utf8.count > suffix.count && $0.topic.utf8.suffix(suffix.count).elementsEqual(suffix) }
    }

    /// Stops the writer after it has committed everything already handed to it.
    public func shutdown() {
        queue.withLock { $0.closed = true }
        wake.signal()
        stopped.wait()
    }

    // MARK: Reading segments

    /// A segment's files, opened while the segment list is locked: a sealed segment rewritten
    /// meanwhile (records removed) has its files replaced by rename, and these still read the
    /// ones that match the index in hand.
    final class OpenSegment: Sendable {
        let path: String
        let firstSeq: UInt64
        let segmentFD: Int32
        /// The index, and its file; nil and -1 for the active segment.
        let index: SegmentIndex?
        let indexFD: Int32

        init(_ sealed: Sealed) throws(Failure) {
            (path, firstSeq, index) = (sealed.path, sealed.firstSeq, sealed.index)
            segmentFD = try Self.open(sealed.path)
            do { indexFD = try Self.open(sealed.index.path) } catch {
                Glibc.close(segmentFD)
                throw error
            }
        }

        init(_ active: Active) throws(Failure) {
            (path, firstSeq, index, indexFD) = (active.path, active.firstSeq, nil, -1)
            segmentFD = try Self.open(active.path)
        }

        deinit {
            Glibc.close(segmentFD)
            if indexFD >= 0 { Glibc.close(indexFD) }
        }

        private static func open(_ path: String) throws(Failure) -> Int32 {
            let fd = Glibc.open(path, O_RDONLY | O_CLOEXEC)
            guard fd >= 0 else { throw .io("cannot open \(path): \(String(cString: strerror(errno)))") }
            return fd
        }
    }

    /// The segment that holds `seq`, opened, with the offsets of up to `count` records from it
    /// when they are in memory (the active segment's); nil past the end.
    private static func locate(_ seq: UInt64, count: Int, in segments: Segments) throws(Failure) -> (OpenSegment, [Int64]?)? {
        let active = segments.active
        if seq >= active.firstSeq {
            guard seq < active.endSeq else { return nil }
            let first = Int(seq - active.firstSeq)
            let last = min(active.offsets.count, first + count)
            return (try OpenSegment(active), Array(active.offsets[first..<last]) + [last < active.offsets.count ? active.offsets[last] : active.end])
        }
        var low = 0, high = segments.sealed.count
        while low < high {
            let middle = (low + high) / 2
            if segments.sealed[middle].endSeq <= seq { low = middle + 1 } else { high = middle }
        }
        guard low < segments.sealed.count, seq >= segments.sealed[low].firstSeq else { return nil }
        return (try OpenSegment(segments.sealed[low]), nil)
    }

    /// Reads records `records` (sorted numbers in one segment), given the offsets of
    /// `first ... last + 1`, from the segment mapped into memory: only the wanted records are
    /// touched, however many other devices' records lie between them.
    private static func collect(_ records: [Int], first: Int, offsets: [Int64], from segment: OpenSegment, into entries: inout [Entry]) throws(Failure) {
        // Only up to the end of the last wanted record: all of it was written and synced before
        // its offset was published.
        // From the page of the first wanted record, populated at once: nearly every page in
        // between holds one of them, and one call maps them faster than a fault each.
        let mapStart = Int(offsets[records[0] - first]) / Int(sysconf(Int32(_SC_PAGESIZE))) * Int(sysconf(Int32(_SC_PAGESIZE)))
        let length = Int(offsets.last!) - mapStart
        guard let base = mmap(nil, length, PROT_READ, MAP_SHARED | MAP_POPULATE, segment.segmentFD, off_t(mapStart)), base != MAP_FAILED else {
            throw .io("cannot map \(segment.path): \(String(cString: strerror(errno)))")
        }
        defer { munmap(base, length) }
        let bytes = UnsafeRawBufferPointer(start: base, count: length)
        entries.reserveCapacity(entries.count + records.count)
        for record in records {
            let start = Int(offsets[record - first]) - mapStart, end = Int(offsets[record - first + 1]) - mapStart
            guard let found = RecordFormat.record(UnsafeRawBufferPointer(rebasing: bytes[start..<end])) else {
                throw .corrupt("\(segment.path): the record at byte \(start + mapStart) fails its checksum")
            }
            entries.append(Entry(seq: segment.firstSeq + UInt64(record), topic: found.topic, payload: found.payload))
        }
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
            if !batches.isEmpty {
                commit(batches)
                commitEnds.signal()
            }
            if closed && batches.isEmpty { break }
        }
        stopped.signal()
    }

    private func commit(_ batches: [Pending]) {
        if let unsound = writer.unsound {
            for batch in batches { batch.reply(.failure(unsound)) }
            return
        }
        // Only the numbers and the sealed list: a copy of the active offsets would keep them
        // alive, and the append below would then copy them all.
        let (before, sealed, keyTimes) = segments.withLock {
            ((lastSeq: $0.lastSeq, end: $0.active.end, records: $0.active.offsets.count), $0.sealed, $0.keyTimes)
        }
        var next = before.lastSeq + 1
        var offset = before.end
        var bytes: [UInt8] = []
        var newOffsets: [Int64] = []
        var newEntries: [SegmentIndex.DeviceEntry] = []
        var newKeys: [DedupKey] = []
        var written: [(entry: Entry, record: JournalRecord)] = []
        var outcomes: [[Outcome]] = []

        for batch in batches {
            var batchOutcomes: [Outcome] = []
            batchOutcomes.reserveCapacity(batch.records.count)
            for prepared in batch.records {
                // Inserted at once, so a duplicate within this group is caught too; taken back
                // below if the write fails.
                if let key = prepared.key {
                    guard !isSealed(key, in: sealed, keyTimes: keyTimes), writer.keys.insert(key).inserted else {
                        batchOutcomes.append(.duplicate)
                        continue
                    }
                    newKeys.append(key)
                    newEntries.append(.init(deviceHash: key.deviceHash, milliseconds: key.milliseconds, record: UInt32(before.records + newOffsets.count)))
                }
                let entry = Entry(seq: next, topic: prepared.topic, payload: prepared.payload(seq: next))
                newOffsets.append(offset)
                offset += Int64(RecordFormat.append(entry, to: &bytes))
                written.append((entry, prepared.record))
                batchOutcomes.append(.journaled(seq: next))
                next += 1
            }
            outcomes.append(batchOutcomes)
        }

        if !bytes.isEmpty, let failure = writeAndSync(bytes) {
            // Nothing of this group was acknowledged: cut the file back and refuse it all.
            if ftruncate(writer.fd, off_t(before.end)) != 0 {
                writer.unsound = .io("a failed write could not be cut back (\(String(cString: strerror(errno)))): restart ingest")
            }
            for key in newKeys { writer.keys.remove(key) }
            for batch in batches { batch.reply(.failure(failure)) }
            return
        }
        segments.withLock { segments in
            segments.active.offsets.append(contentsOf: newOffsets)
            segments.active.entries.append(contentsOf: newEntries)
            segments.active.end = offset
        }
        if !written.isEmpty { publish(written) }
        // Before the answers, so that what a caller sees next is the journal after the seal.
        let sealFailure = sealIfFull(force: batches.contains { $0.sealAfter })
        for (batch, batchOutcomes) in zip(batches, outcomes) {
            // A seal that was asked for and failed is that caller's failure (records stay).
            if batch.sealAfter, let sealFailure { batch.reply(.failure(sealFailure)) } else { batch.reply(.success(batchOutcomes)) }
        }
    }

    /// Whether a sealed segment already holds the key: only segments whose records' times
    /// cover the key's are read, so live fixes (newer than every sealed segment) read nothing.
    /// A segment that cannot be read counts as not holding it: the record is kept, not lost.
    private func isSealed(_ key: DedupKey, in sealed: [Sealed], keyTimes: (ranges: [(low: Int64, high: Int64)], latest: Int64)) -> Bool {
        guard key.milliseconds <= keyTimes.latest else { return false }
        for position in keyTimes.ranges.indices.reversed() where keyTimes.ranges[position].low <= key.milliseconds && key.milliseconds <= keyTimes.ranges[position].high {
            var segment = sealed[position]
            // An index rewritten since `sealed` was taken (records removed) is another file at
            // the same path: its fences and counts are then the current segment's, looked up again.
            for _ in 0..<2 {
                guard let fd = indexFile(segment.index) else { break }
                if fd.inode == segment.index.inode {
                    if (try? segment.index.contains(key.digest, fd: fd.fd)) == true { return true }
                    break
                }
                guard let current = segments.withLock({ segments in segments.sealed.first { $0.firstSeq == segment.firstSeq } }) else { break }
                segment = current
            }
        }
        return false
    }

    /// A sealed segment's index file, open for dedup lookups (kept open, up to 64), and which
    /// file it is: the one `index` was read from when the cached one is, else the file now at
    /// the path (a rewrite renames another over it).
    private func indexFile(_ index: SegmentIndex) -> (fd: Int32, inode: UInt64)? {
        if let cached = writer.indexFiles[index.path] {
            if cached.inode == index.inode { return cached }
            close(cached.fd)
            writer.indexFiles[index.path] = nil
        }
        if writer.indexFiles.count >= 64 { writer.indexFiles.values.forEach { close($0.fd) }; writer.indexFiles = [:] }
        let fd = open(index.path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return nil }
        var status = stat()
        guard fstat(fd, &status) == 0 else { close(fd); return nil }
        writer.indexFiles[index.path] = (fd, UInt64(status.st_ino))
        return (fd, UInt64(status.st_ino))
    }

    private func writeAndSync(_ bytes: [UInt8]) -> Failure? {
        if let error = bytes.withUnsafeBytes({ writeFully(writer.fd, $0) }) { return .io(String(cString: strerror(error))) }
        guard fdatasync(writer.fd) == 0 else { return .io("fdatasync: \(String(cString: strerror(errno)))") }
        return nil
    }

    /// Seals the active segment once it is full: writes its index, begins the next segment.
    /// On the writer thread (or in `init`, before it starts). A failure leaves the segment
    /// active, to be sealed after a later commit: nothing is lost, the segment only grows.
    @discardableResult
    private func sealIfFull(force: Bool = false) -> Failure? {
        let active = segments.withLock { $0.active.end >= options.segmentBytes || force ? $0.active : nil }
        guard let active, !active.offsets.isEmpty else { return nil }
        let indexPath = Self.indexPath(of: active.path)
        do {
            try SegmentIndex.write(
                path: indexPath, firstSeq: active.firstSeq, segmentBytes: active.end, offsets: active.offsets, keys: writer.keys,
                entries: active.entries)
            let index = try SegmentIndex(path: indexPath)
            let nextPath = path + "/" + Self.segmentName(firstSeq: active.endSeq)
            let fd = open(nextPath, O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0o600)
            guard fd >= 0 else { throw Failure.io("cannot create \(nextPath): \(String(cString: strerror(errno)))") }
            syncDirectory(of: nextPath)
            close(writer.fd)
            writer.fd = fd
            // Room for as many records as the segment just sealed: grown by doubling, the tables
            // were copied at every step and held up to twice their size (pages untouched until
            // records arrive, so a quiet journal does not grow for it).
            writer.keys = Set(minimumCapacity: writer.keys.count)
            var next = Active(path: nextPath, firstSeq: active.endSeq)
            next.offsets.reserveCapacity(active.offsets.count)
            next.entries.reserveCapacity(active.entries.count)
            segments.withLock { segments in
                segments.sealed.append(Sealed(path: active.path, index: index))
                segments.active = next
            }
            return nil
        } catch {
            unlink(indexPath)
            return error as? Failure ?? .io(String(describing: error))
        }
    }

    /// What a journaled record adds to its segment's index: its dedup key, and its place in the
    /// index by device and time (not for a removed record's stand-in, which only keeps the key).
    static func indexing(topic: String, payload: [UInt8], record: Int) -> (DedupKey, SegmentIndex.DeviceEntry?)? {
        guard let key = DedupKey(topic: topic, payload: payload) else { return nil }
        let entry = RemovedRecord.isRemoved(topic: topic) ? nil : SegmentIndex.DeviceEntry(deviceHash: key.deviceHash, milliseconds: key.milliseconds, record: UInt32(record))
        return (key, entry)
    }

    // MARK: Files

    static func segmentName(firstSeq: UInt64) -> String {
        let digits = String(firstSeq)
        return String(repeating: "0", count: max(0, 20 - digits.count)) + digits + ".seg"
    }

    static func indexPath(of segmentPath: String) -> String { String(segmentPath.dropLast(4)) + ".idx" }

    /// The segments' file names, in seq order.
    static func segmentNames(in directory: String) throws(Failure) -> [String] {
        let names: [String]
        do { names = try FileManager.default.contentsOfDirectory(atPath: directory) } catch {
            throw .io("cannot list \(directory): \(error.localizedDescription)")
        }
        return names.filter { $0.hasSuffix(".seg") && UInt64($0.dropLast(4)) != nil }.sorted { UInt64($0.dropLast(4))! < UInt64($1.dropLast(4))! }
    }

    /// A sealed segment's index; one that is missing or damaged is rebuilt from the segment
    /// (whose records must then all be whole: only the active segment may end torn, except
    /// one sealed just before a crash, whose index was written after its last record).
    private static func openIndex(of segmentPath: String, allowTornTail: Bool) throws(Failure) -> SegmentIndex {
        let indexPath = indexPath(of: segmentPath)
        var status = stat()
        guard stat(segmentPath, &status) == 0 else { throw .io("cannot read \(segmentPath): \(String(cString: strerror(errno)))") }
        if let index = try? SegmentIndex(path: indexPath), index.header.segmentBytes == Int64(status.st_size) {
            return index
        }
        // Rebuilt: every record is read again, once.
        let fd = open(segmentPath, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { throw .io("cannot open \(segmentPath): \(String(cString: strerror(errno)))") }
        defer { close(fd) }
        var contents = SegmentIndex.Contents()
        var end: Int64 = 0
        try RecordFormat.scan(fd: fd, chunkBytes: 8 << 20) { offset, entry in
            contents.add(at: offset, topic: entry.topic, payload: entry.payload)
        } end: { end = $0 }
        guard end == Int64(status.st_size) || allowTornTail else { throw .corrupt("\(segmentPath) ends in a torn record, but later segments follow it") }
        if end < Int64(status.st_size) {
            // Cut as the active segment's tail would be: once the next segment begins, this one is
            // no longer last, and a torn record in it would be damage.
            let writable = open(segmentPath, O_WRONLY | O_CLOEXEC)
            guard writable >= 0, ftruncate(writable, off_t(end)) == 0, fsync(writable) == 0 else {
                if writable >= 0 { close(writable) }
                throw .io("cannot cut the torn tail of \(segmentPath): \(String(cString: strerror(errno)))")
            }
            close(writable)
        }
        guard let firstSeq = UInt64(((segmentPath as NSString).lastPathComponent).dropLast(4)) else { throw .corrupt("\(segmentPath): not a segment name") }
        try SegmentIndex.write(path: indexPath, firstSeq: firstSeq, segmentBytes: end, contents: contents)
        return try SegmentIndex(path: indexPath)
    }

}

/// Writes all of `bytes` at the file's position (retrying short writes and interruptions);
/// the `errno` of a failure, nil on success.
func writeFully(_ fd: Int32, _ bytes: UnsafeRawBufferPointer) -> Int32? {
    var done = 0
    while done < bytes.count {
        let n = write(fd, bytes.baseAddress! + done, bytes.count - done)
        if n < 0 && errno == EINTR { continue }
        guard n > 0 else { return n < 0 ? errno : EIO }
        done += n
    }
    return nil
}

/// The records' format: `[u32 length][u32 crc32][topic "\n" payload JSON]`, little-endian.
enum RecordFormat {
    /// The one whole record that `bytes` holds, checked; nil when it is not one.
    static func record(_ bytes: UnsafeRawBufferPointer) -> (topic: String, payload: [UInt8])? {
        guard bytes.count >= 8 else { return nil }
        let length = Int(UInt32(littleEndian: bytes.loadUnaligned(as: UInt32.self)))
        let crc = UInt32(littleEndian: bytes.loadUnaligned(fromByteOffset: 4, as: UInt32.self))
        guard length == bytes.count - 8 else { return nil }
        let body = UnsafeRawBufferPointer(rebasing: bytes[8...])
        guard CRC32.checksum(body) == crc, let newline = memchr(body.baseAddress!, 0x0A, body.count) else { return nil }
        let topicBytes = body.baseAddress!.distance(to: UnsafeRawPointer(newline))
        let topic = String(decoding: UnsafeBufferPointer(start: body.baseAddress!.assumingMemoryBound(to: UInt8.self), count: topicBytes), as: UTF8.self)
        let payload = [UInt8](unsafeUninitializedCapacity: body.count - topicBytes - 1) { buffer, count in
            memcpy(buffer.baseAddress!, body.baseAddress! + topicBytes + 1, buffer.count)
            count = buffer.count
        }
        return (topic, payload)
    }

    /// Writes the record in place: the body first, then its length and checksum into the header
    /// left for them.
    static func append(_ entry: Journal.Entry, to bytes: inout [UInt8]) -> Int {
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
    static func scan(
        fd: Int32, chunkBytes: Int, _ each: (Int64, (topic: String, payload: [UInt8])) throws(Journal.Failure) -> Void,
        end: (Int64) -> Void
    ) throws(Journal.Failure) {
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

    static func readMore(fd: Int32, from offset: inout Int64, count: Int, into buffer: inout [UInt8]) throws(Journal.Failure) {
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
    static func isCompleteRecord(_ bytes: ArraySlice<UInt8>) -> Bool {
        guard bytes.count >= 8 else { return false }
        return bytes.count - 8 >= recordHeader(bytes, at: bytes.startIndex).length
    }

    /// Parses whole records from `buffer`; returns the offset after the last good one.
    @discardableResult
    static func parse(
        _ buffer: ArraySlice<UInt8>, baseOffset: Int64, atEnd: Bool, _ each: (Int64, (topic: String, payload: [UInt8])) throws(Journal.Failure) -> Void
    ) throws(Journal.Failure) -> Int64 {
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

