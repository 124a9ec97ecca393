import CLibZ
import Foundation

#if canImport(Glibc)
import Glibc
#endif

public enum RoadIndexError: Error, Equatable, CustomStringConvertible {
    /// The file could not be opened, read or written.
    case io(path: String, reason: String)
    /// The file is not an index, is of another version, or is damaged; `field` names what.
    case invalid(path: String, field: String)
    /// More road points than the index can address.
    case tooLarge(points: Int)

    public var description: String {
        switch self {
        case .io(let path, let reason): "\(path): \(reason)"
        case .invalid(let path, let field): "\(path): not a valid speed-limit index (\(field))"
        case .tooLarge(let points): "\(points) road points is more than an index holds (\(RoadIndexFormat.maxPoints))"
        }
    }
}

/// The file layout, little-endian, every section 8-byte aligned after a 128-byte header:
/// way starts (u32 × ways+1), way records (u64 × ways: limits, class, one-way), points (i32
/// latitude, i32 longitude, ×1e7), cell keys (u64, sorted), cell starts (u32 × cells+1) and
/// segment entries (u32, the index of a segment's first point). A segment is listed in every
/// Web Mercator cell at zoom 17 (about 300 m × cos latitude) its bounding box touches.
enum RoadIndexFormat {
    static let magic: [UInt8] = Array("DBRL".utf8)
    static let version: UInt32 = 1
    static let headerSize = 128
    static let sourceBytes = 64
    static let cellZoom = 17
    static let segmentBits: UInt64 = 30
    static let maxPoints = 1 << 30

    static func aligned(_ n: Int) -> Int { (n + 7) & ~7 }

    /// The 128-byte header as read back: one reading for opening an index and for `status`.
    struct Header {
        var ways, points, cells, entries, taggedWays: Int
        var checksum: UInt32
        var source: String

        /// The header, or the field that is wrong.
        static func read(_ bytes: UnsafeRawBufferPointer) -> Result<Header, Failure> {
            guard bytes.count >= headerSize, Array(bytes.prefix(4)) == magic else { return .failure(Failure(field: "magic")) }
            func value<T: FixedWidthInteger>(_: T.Type, at offset: Int) -> T {
                T(littleEndian: bytes.loadUnaligned(fromByteOffset: offset, as: T.self))
            }
            guard value(UInt32.self, at: 4) == version else { return .failure(Failure(field: "version")) }
            let counts = (0..<5).map { Int(clamping: value(UInt64.self, at: 8 + 8 * $0)) }
            guard counts.allSatisfy({ $0 < 1 << 40 }), counts[1] < maxPoints else { return .failure(Failure(field: "counts")) }
            return .success(Header(
                ways: counts[0], points: counts[1], cells: counts[2], entries: counts[3], taggedWays: counts[4],
                checksum: value(UInt32.self, at: 48),
                source: String(decoding: bytes[56..<(56 + sourceBytes)].prefix { $0 != 0 }, as: UTF8.self)))
        }

        struct Failure: Error { var field: String }
    }

    /// Cell coordinates (fractional) at `cellZoom` of a position.
    @inline(__always)
    static func cell(latE7: Int32, lonE7: Int32) -> (x: Double, y: Double) {
        cell(lat: Double(latE7) / 1e7, lon: Double(lonE7) / 1e7)
    }

    @inline(__always)
    static func cell(lat: Double, lon: Double) -> (x: Double, y: Double) {
        let n = Double(1 << cellZoom)
        let phi = min(max(lat, -85.05), 85.05) * .pi / 180
        let x = (min(max(lon, -180), 180) + 180) / 360 * n
        let y = (1 - log(tan(phi) + 1 / cos(phi)) / .pi) / 2 * n
        return (min(max(x, 0), n - 1), min(max(y, 0), n - 1))
    }

    @inline(__always)
    static func key(x: Int, y: Int) -> UInt64 { UInt64(x) << UInt64(cellZoom) | UInt64(y) }

    /// No road has a straight segment this long (about 300 km at the equator): one that does is
    /// damage, and is not listed, rather than listed in every cell across a continent.
    static let maxCellsPerSegment = 1000

    /// The cells a segment passes through (fractional cell coordinates), walking the grid along
    /// it, so that a long diagonal is listed in its cells only, not in its bounding box's.
    static func forEachCell(from a: (x: Double, y: Double), to b: (x: Double, y: Double), _ body: (Int, Int) -> Void) {
        var x = Int(a.x), y = Int(a.y)
        let endX = Int(b.x), endY = Int(b.y)
        guard abs(endX - x) + abs(endY - y) <= maxCellsPerSegment else { return }
        let dx = b.x - a.x, dy = b.y - a.y
        let stepX = dx > 0 ? 1 : -1, stepY = dy > 0 ? 1 : -1
        // How far along the segment (0…1) the next vertical and horizontal cell borders are.
        var nextX = dx != 0 ? ((dx > 0 ? Double(x + 1) : Double(x)) - a.x) / dx : .infinity
        var nextY = dy != 0 ? ((dy > 0 ? Double(y + 1) : Double(y)) - a.y) / dy : .infinity
        let deltaX = dx != 0 ? 1 / abs(dx) : .infinity, deltaY = dy != 0 ? 1 / abs(dy) : .infinity
        body(x, y)
        var steps = 0
        while (x != endX || y != endY) && steps <= 2 * maxCellsPerSegment {
            if x != endX && (nextX < nextY || y == endY) {
                x += stepX
                nextX += deltaX
            } else {
                y += stepY
                nextY += deltaY
            }
            body(x, y)
            steps += 1
        }
    }
}

/// Collects roads and writes an index file. Memory: 8 bytes per point, 12 per road, and 8 per
/// cell entry while writing.
public struct RoadIndexBuilder: Sendable {
    private var wayStarts: [UInt32] = [0]
    private var wayRecords: [UInt64] = []
    /// Latitude, longitude pairs ×1e7.
    private var points: [Int32] = []
    public private(set) var taggedWays = 0

    public init() {}

    public var wayCount: Int { wayRecords.count }

    /// Room for this many points and roads at once, so that a large import never holds its
    /// points twice while an array grows.
    public mutating func reserveCapacity(points count: Int, ways: Int) {
        points.reserveCapacity(2 * count)
        wayStarts.reserveCapacity(ways + 1)
        wayRecords.reserveCapacity(ways)
    }
    public var pointCount: Int { points.count / 2 }

    /// Adds a road of at least two points. A one-way road is given in its direction of travel.
    public mutating func add(_ way: RoadWay, latE7: [Int32], lonE7: [Int32]) throws(RoadIndexError) {
        precondition(latE7.count == lonE7.count)
        guard latE7.count >= 2 else { return }
        guard pointCount + latE7.count < RoadIndexFormat.maxPoints else { throw .tooLarge(points: pointCount + latE7.count) }
        for i in latE7.indices {
            points.append(latE7[i])
            points.append(lonE7[i])
        }
        wayStarts.append(UInt32(pointCount))
        wayRecords.append(way.packed)
        if way.isTagged { taggedWays += 1 }
    }

    /// Writes the index to `path` through a temporary file and a rename, so a reader sees the old
    /// index or the new one, never a part. `source` (the extract's name) is kept for `status`.
    public func write(to path: String, source: String) throws(RoadIndexError) {
        var keys: [UInt64] = []
        var starts: [UInt32] = []
        var segments: [UInt32] = []
        do {
            let entries = cellEntries()
            segments.reserveCapacity(entries.count)
            var previous = UInt64.max
            for entry in entries {
                let key = entry >> RoadIndexFormat.segmentBits
                if key != previous {
                    keys.append(key)
                    starts.append(UInt32(segments.count))
                    previous = key
                }
                segments.append(UInt32(truncatingIfNeeded: entry & ((1 << RoadIndexFormat.segmentBits) - 1)))
            }
            starts.append(UInt32(segments.count))
        }

        let temporary = path + ".partial"
        let fd = open(temporary, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o644)
        guard fd >= 0 else { throw .io(path: temporary, reason: String(cString: strerror(errno))) }
        var failure: String?
        var crc: UInt = 0
        var written = 0
        func emit(_ raw: UnsafeRawBufferPointer, checksummed: Bool = true) {
            guard failure == nil, let start = raw.baseAddress else { return }
            if checksummed { crc = crc32_z(crc, start.assumingMemoryBound(to: Bytef.self), raw.count) }
            var offset = 0
            while offset < raw.count {
                let n = Glibc.write(fd, start + offset, raw.count - offset)
                if n < 0 {
                    if errno == EINTR { continue }
                    failure = String(cString: strerror(errno))
                    return
                }
                offset += n
            }
            written += raw.count
        }
        func section<T>(_ array: [T]) {
            array.withUnsafeBytes { emit($0) }
            let padding = [UInt8](repeating: 0, count: RoadIndexFormat.aligned(written) - written)
            padding.withUnsafeBytes { emit($0) }
        }
        // The header is written last, with the checksum of what follows it.
        [UInt8](repeating: 0, count: RoadIndexFormat.headerSize).withUnsafeBytes { emit($0, checksummed: false) }
        section(wayStarts)
        section(wayRecords)
        section(points)
        section(keys)
        section(starts)
        section(segments)

        var header = RoadIndexFormat.magic
        func put<T: FixedWidthInteger>(_ value: T) { withUnsafeBytes(of: value.littleEndian) { header.append(contentsOf: $0) } }
        put(RoadIndexFormat.version)
        for count in [wayCount, pointCount, keys.count, segments.count, taggedWays] { put(UInt64(count)) }
        put(UInt32(truncatingIfNeeded: crc))
        put(UInt32(0))
        let name = Array(source.utf8.prefix(RoadIndexFormat.sourceBytes))
        header += name + [UInt8](repeating: 0, count: RoadIndexFormat.headerSize - header.count - name.count)
        if failure == nil, header.withUnsafeBytes({ pwrite(fd, $0.baseAddress, $0.count, 0) }) != header.count {
            failure = String(cString: strerror(errno))
        }
        if failure == nil, fsync(fd) != 0 { failure = String(cString: strerror(errno)) }
        close(fd)
        if failure == nil, rename(temporary, path) != 0 { failure = String(cString: strerror(errno)) }
        if let failure {
            unlink(temporary)
            throw .io(path: path, reason: failure)
        }
    }

    /// (cell key << 30 | segment) for every cell each segment's bounding box touches, sorted.
    private func cellEntries() -> [UInt64] {
        var entries: [UInt64] = []
        entries.reserveCapacity(pointCount + pointCount / 4)
        points.withUnsafeBufferPointer { p in
            for w in 0..<wayCount {
                var a = RoadIndexFormat.cell(latE7: p[2 * Int(wayStarts[w])], lonE7: p[2 * Int(wayStarts[w]) + 1])
                for i in Int(wayStarts[w]) + 1..<Int(wayStarts[w + 1]) {
                    let b = RoadIndexFormat.cell(latE7: p[2 * i], lonE7: p[2 * i + 1])
                    let segment = UInt64(i - 1)
                    RoadIndexFormat.forEachCell(from: a, to: b) { x, y in
                        entries.append(RoadIndexFormat.key(x: x, y: y) << RoadIndexFormat.segmentBits | segment)
                    }
                    a = b
                }
            }
        }
        entries.sort()
        return entries
    }
}

/// A speed-limit index, read-only and memory-mapped: opening one costs a checksum over the file,
/// and the pages a lookup touches are read as needed. Safe to share between tasks.
public final class RoadLimitIndex: @unchecked Sendable {
    public struct Summary: Sendable, Equatable {
        public var ways: Int
        public var taggedWays: Int
        public var points: Int
        public var bytes: Int
        public var source: String
        /// CRC-32 of the index: tells one import from another.
        public var checksum: UInt32

        init(_ header: RoadIndexFormat.Header, bytes: Int) {
            (ways, taggedWays, points, self.bytes) = (header.ways, header.taggedWays, header.points, bytes)
            (source, checksum) = (header.source, header.checksum)
        }
    }

    public let summary: Summary
    public let path: String
    // Immutable after init; unmapped in deinit.
    private let base: UnsafeRawPointer
    private let length: Int
    private let wayStarts: UnsafeBufferPointer<UInt32>
    private let wayRecords: UnsafeBufferPointer<UInt64>
    private let points: UnsafeBufferPointer<Int32>
    private let cellKeys: UnsafeBufferPointer<UInt64>
    private let cellStarts: UnsafeBufferPointer<UInt32>
    private let segments: UnsafeBufferPointer<UInt32>

    /// Maps and checks the index at `path`: its header, its checksum and the order of its tables,
    /// so that no lookup can leave the file, whatever it holds.
    public init(path: String) throws(RoadIndexError) {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { throw .io(path: path, reason: String(cString: strerror(errno))) }
        defer { close(fd) }
        var info = stat()
        guard fstat(fd, &info) == 0 else { throw .io(path: path, reason: String(cString: strerror(errno))) }
        let length = Int(info.st_size)
        guard length >= RoadIndexFormat.headerSize else { throw .invalid(path: path, field: "header") }
        guard let mapped = mmap(nil, length, PROT_READ, MAP_PRIVATE, fd, 0), mapped != MAP_FAILED else {
            throw .io(path: path, reason: String(cString: strerror(errno)))
        }
        let base = UnsafeRawPointer(mapped)
        do throws(RoadIndexError) {
            let header: RoadIndexFormat.Header
            switch RoadIndexFormat.Header.read(UnsafeRawBufferPointer(start: base, count: RoadIndexFormat.headerSize)) {
            case .success(let read): header = read
            case .failure(let failure): throw RoadIndexError.invalid(path: path, field: failure.field)
            }
            let (ways, pointCount, cells, entries) = (header.ways, header.points, header.cells, header.entries)
            var offset = RoadIndexFormat.headerSize
            func section<T>(_: T.Type, _ count: Int) throws(RoadIndexError) -> UnsafeBufferPointer<T> {
                let bytes = count * MemoryLayout<T>.stride
                guard offset + bytes <= length else { throw .invalid(path: path, field: "length") }
                let buffer = UnsafeBufferPointer(start: (base + offset).assumingMemoryBound(to: T.self), count: count)
                offset = RoadIndexFormat.aligned(offset + bytes)
                return buffer
            }
            wayStarts = try section(UInt32.self, ways + 1)
            wayRecords = try section(UInt64.self, ways)
            points = try section(Int32.self, 2 * pointCount)
            cellKeys = try section(UInt64.self, cells)
            cellStarts = try section(UInt32.self, cells + 1)
            segments = try section(UInt32.self, entries)
            guard offset == length else { throw RoadIndexError.invalid(path: path, field: "length") }
            let crc = UInt32(crc32_z(0, (base + RoadIndexFormat.headerSize).assumingMemoryBound(to: Bytef.self), length - RoadIndexFormat.headerSize))
            guard crc == header.checksum else { throw RoadIndexError.invalid(path: path, field: "checksum") }
            // Ordered tables keep every lookup inside them: a damaged file that passed the
            // checksum by chance still cannot send one out of bounds.
            guard wayStarts[0] == 0, Int(wayStarts[ways]) == pointCount else { throw RoadIndexError.invalid(path: path, field: "ways") }
            for w in 0..<ways where Int(wayStarts[w + 1]) - Int(wayStarts[w]) < 2 || RoadWay(packed: wayRecords[w]) == nil {
                throw RoadIndexError.invalid(path: path, field: "ways")
            }
            guard cellStarts[0] == 0, Int(cellStarts[cells]) == entries else { throw RoadIndexError.invalid(path: path, field: "cells") }
            for c in 0..<cells where cellStarts[c + 1] < cellStarts[c] || (c > 0 && cellKeys[c] <= cellKeys[c - 1]) {
                throw RoadIndexError.invalid(path: path, field: "cells")
            }
            for s in segments where Int(s) + 1 >= pointCount { throw RoadIndexError.invalid(path: path, field: "segments") }
            summary = Summary(header, bytes: length)
        } catch {
            munmap(mapped, length)
            throw error
        }
        self.base = base
        self.length = length
        self.path = path
    }

    deinit { munmap(UnsafeMutableRawPointer(mutating: base), length) }

    /// What an index file's header says, without reading the rest (nil when it is not one):
    /// cheap, for `drivebus status`. Only opening the index checks it whole.
    public static func header(path: String) -> Summary? {
        guard let handle = FileHandle(forReadingAtPath: path) else { return nil }
        defer { try? handle.close() }
        guard let bytes = try? handle.read(upToCount: RoadIndexFormat.headerSize) else { return nil }
        guard case .success(let header) = bytes.withUnsafeBytes({ RoadIndexFormat.Header.read($0) }) else { return nil }
        let fileSize = (try? FileManager.default.attributesOfItem(atPath: path)[.size] as? Int) ?? 0
        return Summary(header, bytes: fileSize)
    }

    public func way(_ index: Int) -> RoadWay { RoadWay(packed: wayRecords[index])! }

    /// A segment of a road near a position.
    public struct Hit: Sendable {
        public var way: Int
        /// The index of the segment's first point in the index.
        public var segment: Int
        public var distanceM: Double
        /// The segment's direction in the road's stored order, degrees clockwise from north.
        public var bearing: Double
    }

    /// Calls `body` for every road segment within `radiusM` of a position (a segment that spans
    /// several cells may come more than once).
    public func forEachSegment(nearLat lat: Double, lon: Double, radiusM: Double, _ body: (Hit) -> Void) {
        let metresPerDegree = 111_195.08
        let kx = cos(lat * .pi / 180) * metresPerDegree / 1e7
        let ky = metresPerDegree / 1e7
        let dLat = radiusM / metresPerDegree
        let dLon = radiusM / max(metresPerDegree * cos(lat * .pi / 180), 1)
        let low = RoadIndexFormat.cell(lat: lat - dLat, lon: lon - dLon)
        let high = RoadIndexFormat.cell(lat: lat + dLat, lon: lon + dLon)
        let latE7 = lat * 1e7, lonE7 = lon * 1e7
        let radiusSquared = radiusM * radiusM
        for x in Int(min(low.x, high.x))...Int(max(low.x, high.x)) {
            for y in Int(min(low.y, high.y))...Int(max(low.y, high.y)) {
                guard let c = cellIndex(RoadIndexFormat.key(x: x, y: y)) else { continue }
                for e in Int(cellStarts[c])..<Int(cellStarts[c + 1]) {
                    let i = Int(segments[e])
                    let ax = (Double(points[2 * i + 1]) - lonE7) * kx, ay = (Double(points[2 * i]) - latE7) * ky
                    let bx = (Double(points[2 * i + 3]) - lonE7) * kx, by = (Double(points[2 * i + 2]) - latE7) * ky
                    let dx = bx - ax, dy = by - ay
                    let lengthSquared = dx * dx + dy * dy
                    let t = lengthSquared > 0 ? min(max(-(ax * dx + ay * dy) / lengthSquared, 0), 1) : 0
                    let px = ax + t * dx, py = ay + t * dy
                    let distanceSquared = px * px + py * py
                    guard distanceSquared <= radiusSquared else { continue }
                    let w = wayOf(point: i)
                    // The last point of a road starts no segment.
                    guard i + 1 < Int(wayStarts[w + 1]) else { continue }
                    var bearing = atan2(dx, dy) * 180 / .pi
                    if bearing < 0 { bearing += 360 }
                    body(Hit(way: w, segment: i, distanceM: distanceSquared.squareRoot(), bearing: bearing))
                }
            }
        }
    }

    private func cellIndex(_ key: UInt64) -> Int? {
        var low = 0, high = cellKeys.count
        while low < high {
            let mid = (low + high) / 2
            if cellKeys[mid] < key { low = mid + 1 } else { high = mid }
        }
        return low < cellKeys.count && cellKeys[low] == key ? low : nil
    }

    /// The road holding point `i`: the last road starting at or before it.
    private func wayOf(point i: Int) -> Int {
        var low = 0, high = wayRecords.count - 1
        while low < high {
            let mid = (low + high + 1) / 2
            if Int(wayStarts[mid]) <= i { low = mid } else { high = mid - 1 }
        }
        return low
    }

    /// Whether two roads meet: one's end is a point of the other (OSM roads share their junction
    /// nodes, so a turn from one onto the other passes through such a point).
    public func meet(_ a: Int, _ b: Int) -> Bool {
        func ends(_ way: Int, touch other: Int) -> Bool {
            let first = Int(wayStarts[way]), last = Int(wayStarts[way + 1]) - 1
            for end in [first, last] {
                for i in Int(wayStarts[other])..<Int(wayStarts[other + 1]) where points[2 * i] == points[2 * end] && points[2 * i + 1] == points[2 * end + 1] {
                    return true
                }
            }
            return false
        }
        return ends(a, touch: b) || ends(b, touch: a)
    }

    /// The points of road `way`, ×1e7 (tests and drawings).
    public func points(ofWay way: Int) -> [(latE7: Int32, lonE7: Int32)] {
        (Int(wayStarts[way])..<Int(wayStarts[way + 1])).map { (points[2 * $0], points[2 * $0 + 1]) }
    }
}
