import DrivebusGeo
import Foundation

/// The interactive map's level of detail: a trip's track cut into Web Mercator tiles (the
/// `z/x/y` grid every web map uses), simplified for each zoom to half a pixel. Computed once when
/// a trip ends, so that a tile request only reads what is stored: the browser never gets more
/// points than its screen can show, however many trips there are.
///
/// Coordinates inside a tile are integers from 0 to `extent` across its 256 pixels (16 steps a
/// pixel, as vector tiles do), with `buffer` beyond each edge so that lines join across tiles.
public enum MapTiles {
    /// Units across one tile.
    public static let extent = 4096
    /// Units kept beyond a tile's edges: a line's width and round cap, with room to spare.
    public static let buffer = 64
    /// The deepest stored zoom (4.9 km a tile at the equator, 1.2 m a unit; half a pixel is 9.5 m
    /// there, 6.4 m at 48°). Deeper tiles are cut from it on request: the trips' own tracks are
    /// simplified at 5 m already, so a deeper level would add rows and no detail.
    public static let maxStoredZoom = 13
    /// The deepest zoom served.
    public static let maxZoom = 20
    /// Douglas-Peucker tolerance at every zoom, in that zoom's pixels.
    public static let tolerancePixels = 0.5

    public struct TileID: Hashable, Sendable, Comparable {
        public var z: Int
        public var x: Int
        public var y: Int

        public init(z: Int, x: Int, y: Int) {
            self.z = z
            self.x = x
            self.y = y
        }

        /// Whether `z/x/y` names a tile of the grid.
        public var isValid: Bool { (0...MapTiles.maxZoom).contains(z) && (0..<(1 << z)).contains(x) && (0..<(1 << z)).contains(y) }

        /// The stored tile holding this one: itself up to `maxStoredZoom`.
        public var stored: TileID { ancestor(at: min(z, MapTiles.maxStoredZoom)) }

        /// The tile at a zoom no deeper than this one's that holds it.
        public func ancestor(at zoom: Int) -> TileID {
            let shift = max(0, z - zoom)
            return TileID(z: z - shift, x: x >> shift, y: y >> shift)
        }

        public static func < (a: TileID, b: TileID) -> Bool { (a.z, a.x, a.y) < (b.z, b.x, b.y) }
    }

    /// A trip's lines inside one tile: each line is `[x0, y0, x1, y1, …]` in tile units.
    public struct Piece: Sendable, Equatable {
        public var tile: TileID
        public var lines: [[Int32]]

        public init(tile: TileID, lines: [[Int32]]) {
            self.tile = tile
            self.lines = lines
        }
    }

    /// Every tile of every stored zoom (0 to `maxStoredZoom`) that the track passes through.
    /// Tracks crossing the antimeridian are drawn the long way round (see docs/map.md).
    public static func pieces(of track: [Coordinate]) -> [Piece] {
        guard !track.isEmpty else { return [] }
        let worldUnits = Double(extent) * Double(1 << maxStoredZoom)
        var xs: [Double] = [], ys: [Double] = []
        xs.reserveCapacity(track.count)
        ys.reserveCapacity(track.count)
        for point in track {
            let (x, y) = project(point, worldUnits: worldUnits)
            xs.append(x)
            ys.append(y)
        }
        if track.count == 1 {
            xs.append(xs[0])
            ys.append(ys[0])
        }
        var pieces: [Piece] = []
        // Coarser zooms simplify the finer zoom's result: each step halves the detail, and a
        // track is walked in full only once.
        for z in stride(from: maxStoredZoom, through: 0, by: -1) {
            let scale = Double(1 << (maxStoredZoom - z))
            let kept = DouglasPeucker.simplify(xs: xs, ys: ys, epsilon: tolerancePixels * Double(extent) / 256 * scale)
            if kept.count < xs.count {
                xs = kept.map { xs[$0] }
                ys = kept.map { ys[$0] }
            }
            pieces += cut(zip(xs, ys).map { (x: $0 / scale, y: $1 / scale) }, zoom: z)
        }
        return pieces.sorted { $0.tile < $1.tile }
    }

    /// The lines of a stored tile as they fall into a deeper tile inside it.
    public static func descend(_ lines: [[Int32]], from parent: TileID, to child: TileID) -> [[Int32]] {
        let shift = child.z - parent.z
        guard shift > 0 else { return lines }
        let factor = Double(1 << shift)
        let offsetX = Double((child.x - (parent.x << shift)) * extent)
        let offsetY = Double((child.y - (parent.y << shift)) * extent)
        var out: [[Int32]] = []
        for line in lines {
            var points: [(x: Double, y: Double)] = []
            points.reserveCapacity(line.count / 2)
            var index = 0
            while index + 1 < line.count {
                points.append((Double(line[index]) * factor - offsetX, Double(line[index + 1]) * factor - offsetY))
                index += 2
            }
            if points.count == 1 { points.append(points[0]) }
            out += clip(points)
        }
        return out
    }

    // MARK: - Serving

    /// What of a tile is already painted, in cells of `cellUnits` (2 pixels of a 512-pixel
    /// canvas). Trips are taken newest first; a segment whose every cell is painted already adds
    /// nothing a person could see, and is not sent. So a tile never carries more than its cells
    /// can show, however many trips cross it.
    public struct Coverage: Sendable {
        public static let cellUnits = 16
        static let side = MapTiles.extent / cellUnits
        private var bits = [UInt64](repeating: 0, count: side * side / 64)

        public init() {}

        /// Marks the cells of a segment (a DDA walk, in integers); true when any was free.
        @inline(__always)
        mutating func paint(_ ax: Int32, _ ay: Int32, _ bx: Int32, _ by: Int32) -> Bool {
            let last = Self.side - 1
            @inline(__always) func cell(_ value: Int32) -> Int { max(0, min(last, Int(value) >> 4)) }
            let x0 = cell(ax), y0 = cell(ay), x1 = cell(bx), y1 = cell(by)
            let dx = x1 - x0, dy = y1 - y0
            let steps = max(abs(dx), abs(dy))
            var fresh = false
            for step in 0...steps {
                // Rounded division keeps the walk on the line, as a pixel line is drawn.
                let x = steps == 0 ? x0 : x0 + (2 * dx * step + (dx >= 0 ? steps : -steps)) / (2 * steps)
                let y = steps == 0 ? y0 : y0 + (2 * dy * step + (dy >= 0 ? steps : -steps)) / (2 * steps)
                let index = y &* Self.side &+ x
                let mask = UInt64(1) << UInt64(index & 63)
                if bits[index >> 6] & mask == 0 {
                    bits[index >> 6] |= mask
                    fresh = true
                }
            }
            return fresh
        }

        /// The same as `visible` on lines as stored (`encode`), written as stored to `out`: the
        /// hot path of a busy tile, with no array per line. Returns how many values it wrote.
        public mutating func appendVisible(encoded bytes: UnsafeRawBufferPointer, to out: inout [UInt8]) -> Int {
            @inline(__always) func value(_ at: Int) -> Int32 { MapTiles.int16(bytes, at: at) }
            @inline(__always) func put(_ value: Int32) { MapTiles.appendInt16(value, to: &out) }
            var written = 0
            var offset = 0
            while offset + 2 <= bytes.count {
                let count = Int(value(offset))
                offset += 2
                guard count > 0, offset + count * 4 <= bytes.count else { break }
                var countAt = -1, run = 0  // the open line's count slot in `out`, and its points
                var ax = value(offset), ay = value(offset + 2)
                for index in 1..<count {
                    let bx = value(offset + index * 4), by = value(offset + index * 4 + 2)
                    if paint(ax, ay, bx, by) {
                        if countAt < 0 {
                            countAt = out.count
                            put(0)
                            put(ax); put(ay)
                            run = 1
                            written += 3
                        }
                        put(bx); put(by)
                        run += 1
                        written += 2
                    } else if countAt >= 0 {
                        out[countAt] = UInt8(truncatingIfNeeded: run); out[countAt + 1] = UInt8(truncatingIfNeeded: run >> 8)
                        countAt = -1
                    }
                    ax = bx; ay = by
                }
                if countAt >= 0 { out[countAt] = UInt8(truncatingIfNeeded: run); out[countAt + 1] = UInt8(truncatingIfNeeded: run >> 8) }
                offset += count * 4
            }
            return written
        }

        /// The parts of `lines` that paint a free cell, as lines again: the plain form of
        /// `appendVisible`, which the tests hold it to.
        public mutating func visible(_ lines: [[Int32]]) -> [[Int32]] {
            var out: [[Int32]] = []
            for line in lines {
                guard line.count >= 4 else { continue }
                var open = false
                var index = 0
                while index + 3 < line.count {
                    let (ax, ay, bx, by) = (line[index], line[index + 1], line[index + 2], line[index + 3])
                    if paint(ax, ay, bx, by) {
                        if open {
                            out[out.count - 1].append(bx)
                            out[out.count - 1].append(by)
                        } else {
                            out.append([ax, ay, bx, by])
                        }
                        open = true
                    } else {
                        open = false
                    }
                    index += 2
                }
            }
            return out
        }
    }

    /// How far a point is from the nearest of `lines`, in tile units.
    public static func distance(from x: Double, _ y: Double, to lines: [[Int32]]) -> Double {
        var best = Double.infinity
        for line in lines where line.count >= 2 {
            var index = 0
            repeat {
                let ax = Double(line[index]), ay = Double(line[index + 1])
                let bx = index + 3 < line.count ? Double(line[index + 2]) : ax, by = index + 3 < line.count ? Double(line[index + 3]) : ay
                let dx = bx - ax, dy = by - ay, length = dx * dx + dy * dy
                let t = length == 0 ? 0 : max(0, min(1, ((x - ax) * dx + (y - ay) * dy) / length))
                let ex = x - ax - t * dx, ey = y - ay - t * dy
                best = min(best, (ex * ex + ey * ey).squareRoot())
                index += 2
            } while index + 3 < line.count
        }
        return best
    }

    // MARK: - Storage

    /// Appends a value as the little-endian Int16 the stored and served forms hold.
    @inline(__always)
    static func appendInt16(_ value: Int32, to out: inout [UInt8]) {
        let bits = UInt16(bitPattern: Int16(clamping: value))
        out.append(UInt8(truncatingIfNeeded: bits))
        out.append(UInt8(truncatingIfNeeded: bits >> 8))
    }

    /// The little-endian Int16 at `offset` (the caller checks that two bytes are there).
    @inline(__always)
    static func int16<Bytes: RandomAccessCollection<UInt8>>(_ bytes: Bytes, at offset: Bytes.Index) -> Int32 {
        Int32(Int16(bitPattern: UInt16(bytes[offset]) | UInt16(bytes[bytes.index(after: offset)]) << 8))
    }

    /// Lines as stored: little-endian Int16 values, each line its point count and then its pairs.
    /// Every value lies within the tile and its buffer, so 16 bits hold it.
    public static func encode(_ lines: [[Int32]]) -> [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(lines.reduce(0) { $0 + 2 + $1.count * 2 })
        // A count is 16 bits too: a longer line goes as several, each starting where the last ended.
        let longest = Int(Int16.max)
        for line in lines where line.count >= 2 {
            let points = line.count / 2
            var first = 0
            repeat {
                let count = min(longest, points - first)
                appendInt16(Int32(count), to: &out)
                for value in line[(first * 2)..<((first + count) * 2)] { appendInt16(value, to: &out) }
                first += count - 1
            } while first < points - 1
        }
        return out
    }

    /// The inverse of `encode`; a damaged blob yields the whole lines before the damage.
    public static func decode(_ bytes: [UInt8]) -> [[Int32]] {
        var lines: [[Int32]] = []
        var index = 0
        func next() -> Int32? {
            guard index + 1 < bytes.count else { return nil }
            defer { index += 2 }
            return int16(bytes, at: index)
        }
        while let count = next(), count > 0 {
            var line: [Int32] = []
            line.reserveCapacity(Int(count) * 2)
            for _ in 0..<(Int(count) * 2) {
                guard let value = next() else { return lines }
                line.append(value)
            }
            lines.append(line)
        }
        return lines
    }

    // MARK: - Geometry

    /// Web Mercator in units of the deepest stored zoom; latitudes beyond ±85.05° (the square
    /// map's edge) are held at it.
    static func project(_ point: Coordinate, worldUnits: Double) -> (x: Double, y: Double) {
        let lat = max(-85.051_128_78, min(85.051_128_78, point.lat)) * .pi / 180
        let x = (point.lon + 180) / 360 * worldUnits
        let y = (1 - log(tan(lat) + 1 / cos(lat)) / .pi) / 2 * worldUnits
        return (x, y)
    }

    /// Cuts a zoom's points (in that zoom's units) into its tiles.
    private static func cut(_ points: [(x: Double, y: Double)], zoom: Int) -> [Piece] {
        let tileUnits = Double(extent), margin = Double(buffer)
        let tiles = 1 << zoom
        var linesByTile: [TileID: [[(x: Double, y: Double)]]] = [:]
        // The segment index each tile's newest line ended with, to continue it.
        var lastSegment: [TileID: Int] = [:]
        for index in 0..<(points.count - 1) {
            let a = points[index], b = points[index + 1]
            let lowX = max(0, Int(((min(a.x, b.x) - margin) / tileUnits).rounded(.down)))
            let highX = min(tiles - 1, Int(((max(a.x, b.x) + margin) / tileUnits).rounded(.down)))
            let lowY = max(0, Int(((min(a.y, b.y) - margin) / tileUnits).rounded(.down)))
            let highY = min(tiles - 1, Int(((max(a.y, b.y) + margin) / tileUnits).rounded(.down)))
            guard lowX <= highX, lowY <= highY else { continue }
            for tx in lowX...highX {
                for ty in lowY...highY {
                    let originX = Double(tx) * tileUnits, originY = Double(ty) * tileUnits
                    guard let (start, end, whole) = clipSegment(
                        (a.x - originX, a.y - originY), (b.x - originX, b.y - originY)) else { continue }
                    let tile = TileID(z: zoom, x: tx, y: ty)
                    if whole.start, lastSegment[tile] == index - 1, !(linesByTile[tile]?.isEmpty ?? true) {
                        linesByTile[tile]![linesByTile[tile]!.count - 1].append(end)
                    } else {
                        linesByTile[tile, default: []].append([start, end])
                    }
                    lastSegment[tile] = whole.end ? index : -2
                }
            }
        }
        return linesByTile.map { tile, lines in Piece(tile: tile, lines: lines.map(quantize)) }
    }

    /// Clips each segment of a line to one tile (points relative to the tile's corner).
    private static func clip(_ points: [(x: Double, y: Double)]) -> [[Int32]] {
        var lines: [[(x: Double, y: Double)]] = []
        var joined = false
        for index in 0..<(points.count - 1) {
            guard let (start, end, whole) = clipSegment(points[index], points[index + 1]) else {
                joined = false
                continue
            }
            if joined && whole.start {
                lines[lines.count - 1].append(end)
            } else {
                lines.append([start, end])
            }
            joined = whole.end
        }
        return lines.map(quantize)
    }

    /// Liang–Barsky against the tile and its buffer; `whole` says which ends were kept as they were.
    private static func clipSegment(
        _ a: (x: Double, y: Double), _ b: (x: Double, y: Double)
    ) -> (start: (x: Double, y: Double), end: (x: Double, y: Double), whole: (start: Bool, end: Bool))? {
        let low = -Double(buffer), high = Double(extent + buffer)
        let dx = b.x - a.x, dy = b.y - a.y
        var t0 = 0.0, t1 = 1.0
        for (p, q) in [(-dx, a.x - low), (dx, high - a.x), (-dy, a.y - low), (dy, high - a.y)] {
            if p == 0 {
                if q < 0 { return nil }
            } else {
                let r = q / p
                if p < 0 { if r > t1 { return nil }; if r > t0 { t0 = r } }
                else { if r < t0 { return nil }; if r < t1 { t1 = r } }
            }
        }
        return ((a.x + t0 * dx, a.y + t0 * dy), (a.x + t1 * dx, a.y + t1 * dy), (t0 == 0, t1 == 1))
    }

    /// Rounds to whole units, dropping repeats; a line that shrinks to one point stays a dot.
    private static func quantize(_ line: [(x: Double, y: Double)]) -> [Int32] {
        var out: [Int32] = []
        out.reserveCapacity(line.count * 2)
        for point in line {
            let x = Int32(point.x.rounded()), y = Int32(point.y.rounded())
            if out.count >= 2, out[out.count - 2] == x, out[out.count - 1] == y { continue }
            out.append(x)
            out.append(y)
        }
        if out.count == 2 { out += out }
        return out
    }
}

/// What kind of trip it was, from its speeds: the map's filter. Walking tops out near 3 m/s and
/// cycling near 15 m/s on the flat; a car's trip averages more than either.
public enum TripKind: String, Sendable, CaseIterable {
    case walk, cycle, drive

    /// A trip without speeds counts as a drive: what most trips are.
    public init(avgSpeedMps: Double?, maxSpeedMps: Double?) {
        guard let average = avgSpeedMps else {
            self = .drive
            return
        }
        let top = maxSpeedMps ?? average
        if average <= 2.2 && top <= 4 {
            self = .walk
        } else if average <= 7 && top <= 14 {
            self = .cycle
        } else {
            self = .drive
        }
    }
}
