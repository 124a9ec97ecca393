import Foundation

/// A latitude/longitude box. `minLon…maxLon` is one continuous interval that may run past 180°,
/// so a box across the antimeridian is `179.9…180.1`, not the whole world.
public struct GeoBox: Sendable, Equatable {
    public let minLat: Double
    public let maxLat: Double
    /// In -180..<180.
    public let minLon: Double
    /// `minLon` plus the box's width, so up to 540; `minLon + 360` or more is every longitude.
    public let maxLon: Double

    /// A box of no points: never contains anything and is never indexed.
    public static let empty = GeoBox(minLat: .nan, maxLat: .nan, minLon: .nan, maxLon: .nan)

    public init(minLat: Double, maxLat: Double, minLon: Double, maxLon: Double) {
        guard minLat.isFinite, maxLat.isFinite, minLon.isFinite, maxLon.isFinite, minLat <= maxLat, minLon <= maxLon,
              maxLat >= -90, minLat <= 90
        else {
            (self.minLat, self.maxLat, self.minLon, self.maxLon) = (.nan, .nan, .nan, .nan)
            return
        }
        self.minLat = max(-90, minLat)
        self.maxLat = min(90, maxLat)
        let width = maxLon - minLon
        if width >= 360 {
            (self.minLon, self.maxLon) = (-180, 180)
        } else {
            var start = minLon.truncatingRemainder(dividingBy: 360)
            if start < -180 { start += 360 } else if start >= 180 { start -= 360 }
            (self.minLon, self.maxLon) = (start, start + width)
        }
    }

    /// Every point within `radiusM` (great circle, as `Geo.distance` measures) of `center`.
    public init(around center: Coordinate, radiusM: Double) {
        guard center.lat.isFinite, center.lon.isFinite, abs(center.lat) <= 90, radiusM.isFinite, radiusM >= 0 else {
            self.init(minLat: .nan, maxLat: .nan, minLon: .nan, maxLon: .nan)
            return
        }
        let angle = radiusM / Geo.earthRadiusM  // radians
        let latDelta = angle * 180 / .pi + Self.slackDegrees
        let minLat = center.lat - latDelta, maxLat = center.lat + latDelta
        // A circle that reaches a pole, or is wider than its parallel, spans every longitude.
        let ratio = sin(min(angle, .pi / 2)) / cos(center.lat * .pi / 180)
        if angle >= .pi / 2 || minLat <= -90 || maxLat >= 90 || !(ratio < 1) {
            self.init(minLat: minLat, maxLat: maxLat, minLon: -180, maxLon: 180)
        } else {
            let lonDelta = asin(ratio) * 180 / .pi + Self.slackDegrees
            self.init(minLat: minLat, maxLat: maxLat, minLon: center.lon - lonDelta, maxLon: center.lon + lonDelta)
        }
    }

    /// Every point that `polygon.contains`, grown by `marginM` in the polygon's own projection.
    public init(around polygon: GeoPolygon, marginM: Double = 0) {
        let projection = polygon.projection
        var minX = Double.infinity, maxX = -Double.infinity, minY = Double.infinity, maxY = -Double.infinity
        for vertex in polygon.vertices {
            let (x, y) = projection.project(vertex)
            minX = min(minX, x); maxX = max(maxX, x)
            minY = min(minY, y); maxY = max(maxY, y)
        }
        let margin = marginM.isFinite ? max(0, marginM) : 0
        let origin = projection.origin
        let minLat = origin.lat + (minY - margin) / projection.latScale - Self.slackDegrees
        let maxLat = origin.lat + (maxY + margin) / projection.latScale + Self.slackDegrees
        // The inverse of the projection's x, without folding, so the interval stays continuous.
        guard projection.lonScale > 1e-6 else {
            self.init(minLat: minLat, maxLat: maxLat, minLon: -180, maxLon: 180)
            return
        }
        self.init(
            minLat: minLat, maxLat: maxLat,
            minLon: origin.lon + (minX - margin) / projection.lonScale - Self.slackDegrees,
            maxLon: origin.lon + (maxX + margin) / projection.lonScale + Self.slackDegrees)
    }

    /// Covers rounding in the conversions (about 0.1 mm).
    static let slackDegrees = 1e-9

    public var isEmpty: Bool { minLat.isNaN }

    @inlinable
    public func contains(_ point: Coordinate) -> Bool {
        guard point.lat >= minLat, point.lat <= maxLat else { return false }  // false for NaN too
        let lon = Self.folded(point.lon)
        return (lon >= minLon && lon <= maxLon) || lon + 360 <= maxLon
    }

    /// A longitude in -180..<180.
    @inlinable
    static func folded(_ lon: Double) -> Double {
        if lon >= -180 && lon < 180 { return lon }
        var folded = lon.truncatingRemainder(dividingBy: 360)
        if folded < -180 { folded += 360 } else if folded >= 180 { folded -= 360 }
        return folded
    }
}

/// Which of many boxes contain a point, without testing them all: a hierarchy of uniform
/// latitude/longitude grids whose cells list the boxes that touch them.
///
/// Each box goes on the finest level where it touches at most 16 cells, so a few large zones do
/// not force coarse cells on the many small ones, and a query costs one hash lookup per level in
/// use. Longitude cells wrap at ±180°, so boxes across the antimeridian are found from both sides.
public struct ZoneIndex: Sendable {
    public let boxes: [GeoBox]
    private var levels: [Level] = []
    /// Box indices, grouped by cell; a level's table points into it.
    private var entries: [Int32] = []

    private struct Level: Sendable {
        /// Longitude cells around the globe; the cell size is 360° / `lonCells`, so they wrap exactly.
        let lonCells: Int
        let latCells: Int
        let cellDegrees: Double
        /// Cell key → `start << 32 | count` in `entries`.
        var table = CellTable()

        init(lonCells: Int) {
            self.lonCells = lonCells
            cellDegrees = 360 / Double(lonCells)
            latCells = max(1, Int((180 / cellDegrees).rounded(.up)))
        }

        func latCell(_ lat: Double) -> Int { min(max(0, Int((lat + 90) / cellDegrees)), latCells - 1) }
        /// `lon` must be in -180..<180.
        func lonCell(_ lon: Double) -> Int { min(max(0, Int((lon + 180) / cellDegrees)), lonCells - 1) }

        /// The cell keys `box` touches, or `nil` when there are more than `limit`.
        func keys(of box: GeoBox, limit: Int) -> [Int]? {
            let lat0 = latCell(box.minLat), lat1 = latCell(box.maxLat)
            // A box across the antimeridian is two runs of cells: up to 180, and on from -180.
            var lonRanges: [ClosedRange<Int>]
            if box.maxLon - box.minLon >= 360 {
                lonRanges = [0...(lonCells - 1)]
            } else if box.maxLon >= 180 {
                lonRanges = [lonCell(box.minLon)...(lonCells - 1), 0...lonCell(min(box.maxLon - 360 + GeoBox.slackDegrees, 179.999_999_999))]
                if lonRanges[1].upperBound >= lonRanges[0].lowerBound { lonRanges = [0...(lonCells - 1)] }
            } else {
                lonRanges = [lonCell(box.minLon)...lonCell(box.maxLon)]
            }
            let count = (lat1 - lat0 + 1) * lonRanges.reduce(0) { $0 + $1.count }
            guard count <= limit else { return nil }
            var keys: [Int] = []
            keys.reserveCapacity(count)
            for i in lat0...lat1 {
                for range in lonRanges {
                    for j in range { keys.append(i * lonCells + j) }
                }
            }
            return keys
        }
    }

    /// At most this many cells per box on its level.
    private static let cellsPerBox = 16

    public init(boxes: [GeoBox]) {
        self.boxes = boxes
        let usable = boxes.indices.filter { !boxes[$0].isEmpty }
        guard !usable.isEmpty, boxes.count < Int(Int32.max) else { return }
        // The finest level's cells are about as tall as the median box, within 1e-4° (11 m) … 360°.
        let heights = usable.map { boxes[$0].maxLat - boxes[$0].minLat }.sorted()
        let median = min(360, max(1e-4, heights[heights.count / 2]))
        var lonCells = max(1, Int(360 / median))
        var candidateLevels: [Level] = []
        while true {
            candidateLevels.append(Level(lonCells: lonCells))
            if lonCells == 1 { break }
            lonCells /= 2
        }
        var pairs: [[(key: Int, box: Int32)]] = Array(repeating: [], count: candidateLevels.count)
        for index in usable {
            for (levelIndex, level) in candidateLevels.enumerated() {
                // The coarsest level has one cell, so every box finds a level.
                guard let keys = level.keys(of: boxes[index], limit: Self.cellsPerBox) else { continue }
                pairs[levelIndex].append(contentsOf: keys.map { ($0, Int32(index)) })
                break
            }
        }
        for (levelIndex, var level) in candidateLevels.enumerated() where !pairs[levelIndex].isEmpty {
            let sorted = pairs[levelIndex].sorted { ($0.key, $0.box) < ($1.key, $1.box) }
            var runs: [(key: Int, value: UInt64)] = []
            var start = 0
            while start < sorted.count {
                var end = start
                while end < sorted.count && sorted[end].key == sorted[start].key { end += 1 }
                runs.append((sorted[start].key, UInt64(entries.count) << 32 | UInt64(end - start)))
                entries.append(contentsOf: sorted[start..<end].map(\.box))
                start = end
            }
            level.table = CellTable(runs)
            levels.append(level)
        }
    }

    /// Appends the indices of the boxes that contain `point`, each once, in no particular order.
    public func candidates(at point: Coordinate, into result: inout [Int32]) {
        guard point.lat.isFinite, point.lon.isFinite, abs(point.lat) <= 90 else { return }
        let lon = GeoBox.folded(point.lon)
        levels.withUnsafeBufferPointer { levels in
            for level in levels.indices {
                let key = levels[level].latCell(point.lat) * levels[level].lonCells + levels[level].lonCell(lon)
                guard let packed = levels[level].table[key] else { continue }
                let start = Int(packed >> 32), end = start + Int(packed & 0xFFFF_FFFF)
                for position in start..<end {
                    let box = entries[position]
                    if boxes[Int(box)].contains(point) { result.append(box) }
                }
            }
        }
    }
}

/// An open-addressing hash table from cell key to a packed range: cheaper than `Dictionary`'s
/// seeded SipHash on the per-fix path, and built once.
private struct CellTable: Sendable {
    private var keys: [Int] = [-1]
    private var values: [UInt64] = [0]
    private var mask = 0

    init() {}

    /// `runs` has distinct, non-negative keys.
    init(_ runs: [(key: Int, value: UInt64)]) {
        var capacity = 1
        while capacity < runs.count * 2 { capacity <<= 1 }
        keys = Array(repeating: -1, count: capacity)
        values = Array(repeating: 0, count: capacity)
        mask = capacity - 1
        for (key, value) in runs {
            var slot = Self.hash(key) & mask
            while keys[slot] != -1 { slot = (slot + 1) & mask }
            keys[slot] = key
            values[slot] = value
        }
    }

    private static func hash(_ key: Int) -> Int {
        let mixed = UInt64(truncatingIfNeeded: key) &* 0x9E37_79B9_7F4A_7C15
        return Int(truncatingIfNeeded: mixed ^ (mixed >> 29))
    }

    subscript(key: Int) -> UInt64? {
        var slot = Self.hash(key) & mask
        while true {
            let found = keys[slot]
            if found == key { return values[slot] }
            if found == -1 { return nil }
            slot = (slot + 1) & mask
        }
    }
}
