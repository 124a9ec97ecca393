import Foundation
import Glibc

/// The index file of a sealed journal segment (`<first seq>.idx` beside `<first seq>.seg`).
/// Written once, when the segment is sealed, so that start-up reads a few kilobytes of each
/// segment instead of its records, and dedup and replay by device find records on disk.
///
/// Little-endian, a 128-byte header, then five tables:
///
///     offsets  u64 × count                 where each record starts in the segment
///     keys     (u64, u64) × keyCount       the dedup digests of its records, sorted
///     fences   (u64, u64) × ⌈keyCount/256⌉ every 256th digest: which block of keys to read
///     devices  (u64 hash, u32 first, u32 n) the devices, sorted by hash, with their entries
///     entries  (i64 ms, u32 record, u32 0) the keyed records of each device, by time
///
/// The header holds the counts, the segment's size, the range of its records' times (of all, and
/// of the live ones), and CRC-32s of the header and of the fences (what start-up reads) and of
/// the other tables.
struct SegmentIndex: Sendable {
    static let magic: UInt32 = 0x584A_4244  // "DBJX"
    /// 2 added the live records' time range; a version 1 file is read with its keys' range
    /// in its place (the same until records are removed).
    static let version: UInt32 = 2
    static let headerBytes = 128
    /// Keys per block: a lookup reads one block of 4 KiB.
    static let fenceSpacing = 256

    struct Header: Sendable, Equatable {
        var firstSeq: UInt64
        var count: Int
        var segmentBytes: Int64
        var keyCount: Int
        var deviceCount: Int
        var entryCount: Int
        /// The times of the keyed records, in ms (stand-ins of removed records included: their
        /// keys stay); meaningless when there are none.
        var minMilliseconds: Int64
        var maxMilliseconds: Int64
        /// The times of the records in the index by device and time: the live ones, without
        /// stand-ins. What a removal looks at, so that expired segments are not read again.
        var liveMinMilliseconds: Int64 = 0
        var liveMaxMilliseconds: Int64 = 0

        var fenceCount: Int { (keyCount + SegmentIndex.fenceSpacing - 1) / SegmentIndex.fenceSpacing }
        var offsetsAt: Int { SegmentIndex.headerBytes }
        var keysAt: Int { offsetsAt + 8 * count }
        var fencesAt: Int { keysAt + 16 * keyCount }
        var devicesAt: Int { fencesAt + 16 * fenceCount }
        var entriesAt: Int { devicesAt + 16 * deviceCount }
        var fileBytes: Int { entriesAt + 16 * entryCount }

        func holds(milliseconds: Int64) -> Bool { keyCount > 0 && minMilliseconds <= milliseconds && milliseconds <= maxMilliseconds }
        /// Whether any of its live records' times can fall in `low ... high`.
        func overlaps(_ low: Int64, _ high: Int64) -> Bool { entryCount > 0 && low <= liveMaxMilliseconds && liveMinMilliseconds <= high }
        /// Whether any of its keyed records' times, stand-ins' included, can fall in `low ... high`.
        func keysOverlap(_ low: Int64, _ high: Int64) -> Bool { keyCount > 0 && low <= maxMilliseconds && minMilliseconds <= high }
    }

    /// One record of a device in the index by device and time.
    struct DeviceEntry: Sendable {
        var deviceHash: UInt64
        var milliseconds: Int64
        var record: UInt32
    }

    /// What an index is made of, gathered record by record as a segment is read or written.
    struct Contents {
        var offsets: [Int64] = []
        var keys: [DedupKey] = []
        var entries: [DeviceEntry] = []

        /// The next record: where it starts, and what `Journal.indexing` made of it.
        mutating func add(at offset: Int64, _ indexed: (DedupKey, DeviceEntry?)?) {
            if let (key, entry) = indexed {
                keys.append(key)
                if let entry { entries.append(entry) }
            }
            offsets.append(offset)
        }

        mutating func add(at offset: Int64, topic: String, payload: [UInt8]) {
            add(at: offset, Journal.indexing(topic: topic, payload: payload, record: offsets.count))
        }
    }

    /// Where the index is (set when a rewritten index is moved in place of the old one).
    var path: String
    let header: Header
    /// The file these were read from: a rewritten index (records removed) is another file at
    /// the same path.
    let inode: UInt64
    /// Every `fenceSpacing`th digest, from the file: in memory for every sealed segment.
    let fences: [DedupKey.Digest]

    // MARK: Writing

    /// Writes the index of a segment: to a `.partial` file, synced, then renamed over `path`.
    /// `pacing`: see `Journal.writeSynced`.
    static func write(path: String, firstSeq: UInt64, segmentBytes: Int64, contents: Contents, pacing: Journal.Pacing? = nil) throws(Journal.Failure) {
        try write(path: path, firstSeq: firstSeq, segmentBytes: segmentBytes, offsets: contents.offsets, keys: contents.keys, entries: contents.entries, pacing: pacing)
    }

    /// The same from the parts, `keys` in any order: the active segment's seal passes its key
    /// set as it is. Ingest seals while a flood goes on, so no table is copied more than it
    /// must be (the whole index was built twice over: 40 MB at a seal of 180,000 records).
    static func write(
        path: String, firstSeq: UInt64, segmentBytes: Int64, offsets: [Int64], keys: some Collection<DedupKey>,
        entries: [DeviceEntry], pacing: Journal.Pacing? = nil
    ) throws(Journal.Failure) {
        var digests = keys.map(\.digest)
        digests.sort()
        var times = (low: Int64.max, high: Int64.min), liveTimes = (low: Int64.max, high: Int64.min)
        for key in keys { times = (min(times.low, key.milliseconds), max(times.high, key.milliseconds)) }
        for entry in entries { liveTimes = (min(liveTimes.low, entry.milliseconds), max(liveTimes.high, entry.milliseconds)) }
        var sortedEntries = entries
        sortedEntries.sort { ($0.deviceHash, $0.milliseconds, $0.record) < ($1.deviceHash, $1.milliseconds, $1.record) }
        var devices: [(hash: UInt64, first: Int, count: Int)] = []
        for (position, entry) in sortedEntries.enumerated() {
            if let last = devices.last, last.hash == entry.deviceHash {
                devices[devices.count - 1].count += 1
            } else {
                devices.append((entry.deviceHash, position, 1))
            }
        }
        let header = Header(
            firstSeq: firstSeq, count: offsets.count, segmentBytes: segmentBytes, keyCount: digests.count, deviceCount: devices.count,
            entryCount: sortedEntries.count, minMilliseconds: digests.isEmpty ? 0 : times.low, maxMilliseconds: digests.isEmpty ? 0 : times.high,
            liveMinMilliseconds: entries.isEmpty ? 0 : liveTimes.low, liveMaxMilliseconds: entries.isEmpty ? 0 : liveTimes.high)

        // The body after room for the header, which is filled in once the checksums are known.
        var bytes = [UInt8](repeating: 0, count: headerBytes)
        bytes.reserveCapacity(header.fileBytes)
        for offset in offsets { bytes.appendLittleEndian(UInt64(offset)) }
        for digest in digests { bytes.appendLittleEndian(digest.high); bytes.appendLittleEndian(digest.low) }
        let fencesStart = bytes.count
        for position in stride(from: 0, to: digests.count, by: fenceSpacing) {
            bytes.appendLittleEndian(digests[position].high)
            bytes.appendLittleEndian(digests[position].low)
        }
        let fencesEnd = bytes.count
        for device in devices {
            bytes.appendLittleEndian(device.hash)
            bytes.appendLittleEndian(UInt32(device.first))
            bytes.appendLittleEndian(UInt32(device.count))
        }
        for entry in sortedEntries {
            bytes.appendLittleEndian(UInt64(bitPattern: entry.milliseconds))
            bytes.appendLittleEndian(entry.record)
            bytes.appendLittleEndian(UInt32(0))
        }
        let fencesCRC = CRC32.checksum(bytes[fencesStart..<fencesEnd])
        let restCRC = CRC32.checksum(bytes[headerBytes..<fencesStart]) ^ CRC32.checksum(bytes[fencesEnd...])
        bytes.replaceSubrange(0..<headerBytes, with: encode(header, fencesCRC: fencesCRC, restCRC: restCRC))

        let partial = path + ".partial"
        try Journal.writeSynced(bytes, to: partial, pacing: pacing)
        guard rename(partial, path) == 0 else { throw .io("cannot put \(path) in place: \(String(cString: strerror(errno)))") }
        pacing?.awaitTurn()
        syncDirectory(of: path)
    }

    private static func encode(_ header: Header, fencesCRC: UInt32, restCRC: UInt32) -> [UInt8] {
        var bytes = [UInt8]()
        bytes.appendLittleEndian(magic)
        bytes.appendLittleEndian(version)
        for word in [
            header.firstSeq, UInt64(header.count), UInt64(header.segmentBytes), UInt64(header.keyCount), UInt64(header.deviceCount),
            UInt64(header.entryCount), UInt64(bitPattern: header.minMilliseconds), UInt64(bitPattern: header.maxMilliseconds),
        ] { bytes.appendLittleEndian(word) }
        bytes.appendLittleEndian(fencesCRC)
        bytes.appendLittleEndian(restCRC)
        bytes.appendLittleEndian(UInt64(bitPattern: header.liveMinMilliseconds))
        bytes.appendLittleEndian(UInt64(bitPattern: header.liveMaxMilliseconds))
        bytes.append(contentsOf: repeatElement(0, count: headerBytes - 4 - bytes.count))
        bytes.appendLittleEndian(CRC32.checksum(bytes))
        return bytes
    }

    // MARK: Reading

    /// Reads the header and the fences, and checks them: a damaged or cut index is refused
    /// (and then rebuilt from its segment).
    init(path: String) throws(Journal.Failure) {
        self.path = path
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { throw .io("cannot open \(path): \(String(cString: strerror(errno)))") }
        defer { close(fd) }
        let raw = try Self.read(fd, at: 0, count: Self.headerBytes, path: path)
        func word(_ at: Int) -> UInt64 { raw.withUnsafeBytes { UInt64(littleEndian: $0.loadUnaligned(fromByteOffset: at, as: UInt64.self)) } }
        func half(_ at: Int) -> UInt32 { raw.withUnsafeBytes { UInt32(littleEndian: $0.loadUnaligned(fromByteOffset: at, as: UInt32.self)) } }
        guard half(0) == Self.magic, half(4) == Self.version || half(4) == 1 else { throw .corrupt("\(path) is not a journal index of version \(Self.version)") }
        guard CRC32.checksum(raw[..<(Self.headerBytes - 4)]) == half(Self.headerBytes - 4) else { throw .corrupt("\(path): the header fails its checksum") }
        let counts = (1...6).map { word(8 * $0) }
        guard counts.allSatisfy({ $0 < 1 << 40 }) else { throw .corrupt("\(path): a count is out of range") }
        header = Header(
            firstSeq: counts[0], count: Int(counts[1]), segmentBytes: Int64(counts[2]), keyCount: Int(counts[3]), deviceCount: Int(counts[4]),
            entryCount: Int(counts[5]), minMilliseconds: Int64(bitPattern: word(56)), maxMilliseconds: Int64(bitPattern: word(64)),
            liveMinMilliseconds: Int64(bitPattern: word(half(4) == 1 ? 56 : 80)), liveMaxMilliseconds: Int64(bitPattern: word(half(4) == 1 ? 64 : 88)))
        var status = stat()
        guard fstat(fd, &status) == 0, Int(status.st_size) == header.fileBytes else { throw .corrupt("\(path) is not as long as its header says") }
        inode = UInt64(status.st_ino)
        let fenceBytes = try Self.read(fd, at: header.fencesAt, count: 16 * header.fenceCount, path: path)
        guard CRC32.checksum(fenceBytes) == half(72) else { throw .corrupt("\(path): the fences fail their checksum") }
        fences = Self.digests(fenceBytes)
    }

    /// Whether the segment holds a record with this digest: one read of a block of keys.
    func contains(_ digest: DedupKey.Digest, fd: Int32) throws(Journal.Failure) -> Bool {
        // The last fence at or below the digest starts its block.
        var low = 0, high = fences.count
        while low < high {
            let middle = (low + high) / 2
            if fences[middle] <= digest { low = middle + 1 } else { high = middle }
        }
        guard low > 0 else { return false }
        let first = (low - 1) * Self.fenceSpacing
        let count = min(Self.fenceSpacing, header.keyCount - first)
        let block = Self.digests(try Self.read(fd, at: header.keysAt + 16 * first, count: 16 * count, path: path))
        var lower = 0, upper = block.count
        while lower < upper {
            let middle = (lower + upper) / 2
            if block[middle] < digest { lower = middle + 1 } else { upper = middle }
        }
        return lower < block.count && block[lower] == digest
    }

    /// Where records `first ..< first + count` start, and where the one after them does.
    func offsets(first: Int, count: Int, fd: Int32) throws(Journal.Failure) -> [Int64] {
        let available = min(count, header.count - first)
        guard available > 0 else { return [] }
        let bytes = try Self.read(fd, at: header.offsetsAt + 8 * first, count: 8 * available, path: path)
        var offsets = bytes.withUnsafeBytes { raw in (0..<available).map { Int64(UInt64(littleEndian: raw.loadUnaligned(fromByteOffset: 8 * $0, as: UInt64.self))) } }
        offsets.append(first + available < header.count
            ? try Self.read(fd, at: header.offsetsAt + 8 * (first + available), count: 8, path: path).withUnsafeBytes { Int64(UInt64(littleEndian: $0.loadUnaligned(as: UInt64.self))) }
            : header.segmentBytes)
        return offsets
    }

    /// The record numbers of one device's records between two times, in record order.
    func records(deviceHash: UInt64, from: Int64, to: Int64, fd: Int32) throws(Journal.Failure) -> [Int] {
        guard header.deviceCount > 0, header.keyCount > 0, from <= header.maxMilliseconds, to >= header.minMilliseconds else { return [] }
        let devices = try Self.read(fd, at: header.devicesAt, count: 16 * header.deviceCount, path: path)
        let found: (first: Int, count: Int)? = devices.withUnsafeBytes { raw in
            var low = 0, high = header.deviceCount
            while low < high {
                let middle = (low + high) / 2
                let hash = UInt64(littleEndian: raw.loadUnaligned(fromByteOffset: 16 * middle, as: UInt64.self))
                if hash == deviceHash {
                    return (Int(UInt32(littleEndian: raw.loadUnaligned(fromByteOffset: 16 * middle + 8, as: UInt32.self))),
                            Int(UInt32(littleEndian: raw.loadUnaligned(fromByteOffset: 16 * middle + 12, as: UInt32.self))))
                }
                if hash < deviceHash { low = middle + 1 } else { high = middle }
            }
            return nil
        }
        guard let found, found.first + found.count <= header.entryCount else { return [] }
        let entries = try Self.read(fd, at: header.entriesAt + 16 * found.first, count: 16 * found.count, path: path)
        return entries.withUnsafeBytes { raw in
            (0..<found.count).compactMap { position -> Int? in
                let time = Int64(bitPattern: UInt64(littleEndian: raw.loadUnaligned(fromByteOffset: 16 * position, as: UInt64.self)))
                guard from <= time, time <= to else { return nil }
                return Int(UInt32(littleEndian: raw.loadUnaligned(fromByteOffset: 16 * position + 8, as: UInt32.self)))
            }.sorted()
        }
    }

    private static func digests(_ bytes: [UInt8]) -> [DedupKey.Digest] {
        bytes.withUnsafeBytes { raw in
            (0..<(raw.count / 16)).map {
                DedupKey.Digest(
                    high: UInt64(littleEndian: raw.loadUnaligned(fromByteOffset: 16 * $0, as: UInt64.self)),
                    low: UInt64(littleEndian: raw.loadUnaligned(fromByteOffset: 16 * $0 + 8, as: UInt64.self)))
            }
        }
    }

    static func read(_ fd: Int32, at offset: Int, count: Int, path: String) throws(Journal.Failure) -> [UInt8] {
        var bytes: [UInt8] = []
        try read(fd, at: offset, count: count, path: path, into: &bytes)
        return bytes
    }

    /// Reads into `bytes`, which it resizes to `count` (its storage is reused when large enough),
    /// resting between pieces as `pacing` says.
    static func read(_ fd: Int32, at offset: Int, count: Int, path: String, into bytes: inout [UInt8], pacing: Journal.Pacing? = nil) throws(Journal.Failure) {
        if bytes.capacity < count { bytes = [] }  // not copied into the larger storage
        if bytes.count > count { bytes.removeLast(bytes.count - count) } else { bytes.append(contentsOf: repeatElement(0, count: count - bytes.count)) }
        var done = 0
        while done < count {
            // At most 1 MB a call: this kernel copies from the page cache without yielding the
            // CPU, and a whole segment (2–3 ms) held back ingest's writer waiting for that core.
            let n = bytes.withUnsafeMutableBytes { pread(fd, $0.baseAddress! + done, min(count - done, 1 << 20), off_t(offset + done)) }
            if n < 0 && errno == EINTR { continue }
            guard n > 0 else { throw .io("cannot read \(path) at byte \(offset + done): \(n < 0 ? String(cString: strerror(errno)) : "it ends there")") }
            done += n
            pacing?.breathe()
        }
    }
}

/// Makes a rename or a new file in the directory durable.
func syncDirectory(of path: String) {
    let directory = (path as NSString).deletingLastPathComponent
    let fd = open(directory.isEmpty ? "." : directory, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
    guard fd >= 0 else { return }
    fsync(fd)
    close(fd)
}
