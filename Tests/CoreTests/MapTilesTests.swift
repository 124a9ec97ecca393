import DrivebusGeo
import DrivebusSchema
import Foundation
import StatsCore
import StatsStore
import Testing

/// The interactive map's level of detail (issue 20): tiles cut and simplified per zoom, stored
/// as trips end, read back with filters.
@Suite struct MapTilesTests {
    /// A tile unit back to a coordinate, the inverse of the Web Mercator projection.
    func coordinate(_ x: Int32, _ y: Int32, in tile: MapTiles.TileID) -> Coordinate {
        let world = Double(MapTiles.extent) * Double(1 << tile.z)
        let gx = Double(tile.x * MapTiles.extent) + Double(x), gy = Double(tile.y * MapTiles.extent) + Double(y)
        let lon = gx / world * 360 - 180
        let lat = atan(sinh(.pi * (1 - 2 * gy / world))) * 180 / .pi
        return Coordinate(lat: lat, lon: lon)
    }

    @Test func aShortTrackLiesInOneTileAtEveryZoomWhereItIs() {
        // 140 m in Vienna, inside tile 13/4468/2840.
        let track = [Coordinate(lat: 48.2070, lon: 16.3710), Coordinate(lat: 48.2080, lon: 16.3720)]
        let pieces = MapTiles.pieces(of: track)
        #expect(pieces.map(\.tile.z) == Array(0...13))
        #expect(pieces.last?.tile == MapTiles.TileID(z: 13, x: 4468, y: 2840))
        for piece in pieces {
            #expect(piece.tile == MapTiles.TileID(z: 13, x: 4468, y: 2840).ancestor(at: piece.tile.z))
        }
        // At zoom 13 a unit is 0.8 m here: the line's ends are the track's ends.
        let line = pieces.last!.lines
        #expect(line.count == 1 && line[0].count == 4)
        let start = coordinate(line[0][0], line[0][1], in: pieces.last!.tile)
        let end = coordinate(line[0][2], line[0][3], in: pieces.last!.tile)
        #expect(Geo.distance(start, track[0]) < 0.5)
        #expect(Geo.distance(end, track[1]) < 0.5)
        // At zoom 0 the whole trip is one dot.
        #expect(pieces[0].lines == [[2234, 1420, 2234, 1420]])
    }

    @Test func eachZoomKeepsHalfAPixelOfDetail() {
        // A 2 km zig-zag with 20 m teeth: a street-level zoom keeps every tooth, a city-level
        // zoom (a pixel is 76 m at zoom 11 here) keeps a straight line.
        let track = (0...100).map { index in
            Coordinate(lat: 48.2 + Double(index) * 0.00018, lon: 16.37 + (index % 2 == 0 ? 0 : 0.00027))
        }
        let pieces = MapTiles.pieces(of: track)
        let points13 = pieces.filter { $0.tile.z == 13 }.reduce(0) { $0 + $1.lines.reduce(0) { $0 + $1.count / 2 } }
        let points11 = pieces.filter { $0.tile.z == 11 }.reduce(0) { $0 + $1.lines.reduce(0) { $0 + $1.count / 2 } }
        #expect(points13 >= 101)
        #expect(points11 == 2)
    }

    @Test func aLongSegmentIsCutAtTileEdgesWithinTheBuffer() {
        // 25 km due east along a parallel: at zoom 13 (4.9 km × cos 48° a tile) about 8 tiles.
        let track = [Coordinate(lat: 48.2, lon: 16.0), Coordinate(lat: 48.2, lon: 16.335)]
        let deep = MapTiles.pieces(of: track).filter { $0.tile.z == 13 }
        let first = Int((16.0 + 180) / 360 * 8192), last = Int((16.335 + 180) / 360 * 8192)
        #expect(deep.map(\.tile.x) == Array(first...last))
        for piece in deep {
            #expect(piece.lines.count == 1)
            for value in piece.lines[0] { #expect((-MapTiles.buffer...(MapTiles.extent + MapTiles.buffer)).contains(Int(value))) }
        }
        // Inner tiles are crossed edge to edge, past the buffer on both sides.
        let inner = deep[deep.count / 2].lines[0]
        #expect(inner.count == 4 && inner[0] == Int32(-MapTiles.buffer) && inner[2] == Int32(MapTiles.extent + MapTiles.buffer))
    }

    @Test func deeperTilesAreCutFromTheDeepestStoredOne() {
        let parent = MapTiles.TileID(z: 13, x: 100, y: 200)
        let child = MapTiles.TileID(z: 15, x: 401, y: 802)  // the second column and third row of its 4 × 4
        #expect(child.stored == parent)
        // A line across the parent's middle, in the child's column.
        let lines: [[Int32]] = [[1100, 2100, 1900, 2300]]
        let cut = MapTiles.descend(lines, from: parent, to: child)
        #expect(cut == [[304, 208, 3504, 1008]])
        // A line elsewhere in the parent is not in the child.
        #expect(MapTiles.descend([[3000, 3000, 3100, 3100]], from: parent, to: child).isEmpty)
    }

    @Test func linesRoundTripThroughTheirStoredForm() {
        let lines: [[Int32]] = [[-64, 0, 4160, 4096, 12, 13], [5, 5, 5, 5]]
        let bytes = MapTiles.encode(lines)
        #expect(bytes.count == 2 + 12 + 2 + 8)
        #expect(MapTiles.decode(bytes) == lines)
        // A damaged blob gives the whole lines before the damage, never a crash.
        #expect(MapTiles.decode(Array(bytes.dropLast(3))) == [lines[0]])
        #expect(MapTiles.decode([0xff, 0x7f, 1]) == [])
        // A line longer than a 16-bit count goes as two that share a point.
        let long: [Int32] = (0..<40_000).flatMap { [Int32($0 % 4096), 7] }
        let split = MapTiles.decode(MapTiles.encode([long]))
        #expect(split.map(\.count) == [2 * 32_767, 2 * (40_000 - 32_766)])
        #expect(split[0].suffix(2) == split[1].prefix(2))
        #expect(Array(split[0]) + split[1].dropFirst(2) == long)
    }

    @Test func tripsAreKindedByTheirSpeeds() {
        #expect(TripKind(avgSpeedMps: 1.3, maxSpeedMps: 2.5) == .walk)
        #expect(TripKind(avgSpeedMps: 4.5, maxSpeedMps: 11) == .cycle)
        #expect(TripKind(avgSpeedMps: 4.5, maxSpeedMps: 25) == .drive)
        #expect(TripKind(avgSpeedMps: 14, maxSpeedMps: 33) == .drive)
        #expect(TripKind(avgSpeedMps: nil, maxSpeedMps: nil) == .drive)
    }

    // MARK: - Stored as trips end

    func trip(_ id: String, device: String = "car", start: String, speed: Double, _ track: [[Double]], event: String? = nil) -> StoredEvent {
        statsEvent("trip.ended", id: event ?? "e-\(id)", device: device, statsJSON([
            "trip_id": id, "device": device, "start_time": start, "end_time": start.replacingOccurrences(of: "T10", with: "T11"),
            "avg_speed_mps": speed, "max_speed_mps": speed * 2, "distance_m": 1000, "duration_s": 600,
            "track": track,
        ] as [String: Any]))
    }

    /// A served tile read back: each trip's speed (dm/s) and score (× 10), newest first.
    func tripsInTile(_ store: StatsStore, _ tile: MapTiles.TileID, _ filter: MapFilter = .init()) async throws -> [(speed: Int, score: Int, lines: [[Int32]])] {
        try await store.updateMap()
        let bytes = try await store.mapTile(tile, filter)
        #expect(Array(bytes.prefix(4)) == Array("DBT1".utf8))
        func value(_ at: Int, _ size: Int) -> Int { (0..<size).reduce(0) { $0 | Int(bytes[at + $1]) << (8 * $1) } }
        var trips: [(Int, Int, [[Int32]])] = []
        var offset = 4
        while offset + 8 <= bytes.count {
            let end = offset + 8 + value(offset + 4, 4) * 2
            trips.append((value(offset, 2), value(offset + 2, 2), MapTiles.decode(Array(bytes[(offset + 8)..<end]))))
            offset = end
        }
        #expect(offset == bytes.count)
        return trips
    }

    func pick(_ store: StatsStore, _ tile: MapTiles.TileID, at point: Coordinate, _ filter: MapFilter = .init()) async throws -> String? {
        try await store.updateMap()
        let world = Double(MapTiles.extent) * Double(1 << tile.z)
        let lat = point.lat * .pi / 180
        let x = (point.lon + 180) / 360 * world - Double(tile.x * MapTiles.extent)
        let y = (1 - log(tan(lat) + 1 / cos(lat)) / .pi) / 2 * world - Double(tile.y * MapTiles.extent)
        let json = statsParse(String(decoding: try await store.mapPickJSON(tile, x: x, y: y, radius: 64, filter), as: UTF8.self))
        return json.stats("trip_id")?.statsString
    }

    @Test func tilesFollowTripsAsTheyEndAndAreFiltered() async throws {
        let scratch = StatsScratch()
        let store = try StatsStore(.init(path: scratch.database))
        let drive = [[48.2070, 16.3710], [48.2080, 16.3720]]
        let walk = [[48.2075, 16.3710], [48.2085, 16.3720]]  // 55 m north: apart at zoom 13
        try await store.store([
            trip("drive-1", start: "2026-01-05T10:00:00Z", speed: 12, drive),
            trip("walk-1", device: "phone", start: "2026-02-05T10:00:00Z", speed: 1.2, walk),
            trip("far-1", start: "2026-03-05T10:00:00Z", speed: 12, [[52.5, 13.4], [52.51, 13.41]]),
        ])
        let tile = MapTiles.TileID(z: 14, x: 8937, y: 5681)
        // Newest first; average speeds in dm/s; no scores yet.
        #expect(try await tripsInTile(store, tile).map { [$0.speed, $0.score] } == [[12, 0xFFFF], [120, 0xFFFF]])
        #expect(try await tripsInTile(store, tile, MapFilter(query: StatsQuery(device: "phone"))).map(\.speed) == [12])
        #expect(try await tripsInTile(store, tile, MapFilter(kind: .drive)).map(\.speed) == [120])
        #expect(try await tripsInTile(store, tile, MapFilter(query: StatsQuery(from: statsTime("2026-02-01T00:00:00Z")))).map(\.speed) == [12])
        #expect(try await pick(store, tile, at: Coordinate(lat: 48.2075, lon: 16.3710)) == "walk-1")
        #expect(try await pick(store, tile, at: Coordinate(lat: 48.2070, lon: 16.3710)) == "drive-1")
        #expect(try await pick(store, tile, at: Coordinate(lat: 48.2075, lon: 16.3710), MapFilter(kind: .drive)) == nil)
        // Deeper than stored: cut from zoom 13, and only where the trips are.
        let deep = MapTiles.TileID(z: 17, x: 8937 * 8, y: 5681 * 8 + 1)
        #expect(try await tripsInTile(store, deep).count == 2)
        #expect(try await pick(store, deep, at: Coordinate(lat: 48.2070, lon: 16.3710)) == "drive-1")
        #expect(try await tripsInTile(store, MapTiles.TileID(z: 17, x: 8937 * 8 + 7, y: 5681 * 8 + 7)).isEmpty)

        // An older trip along the very same line would be drawn under the drive: not sent, still picked.
        try await store.store([trip("drive-0", start: "2025-12-05T10:00:00Z", speed: 30, drive)])
        #expect(try await tripsInTile(store, tile).map(\.speed) == [12, 120])
        #expect(try await pick(store, tile, at: Coordinate(lat: 48.2070, lon: 16.3710), MapFilter(query: StatsQuery(to: statsTime("2026-01-01T00:00:00Z")))) == "drive-0")

        // The score arrives later and colours the trip (a new data version); a re-computed trip moves.
        func version() async throws -> Double? {
            statsParse(String(decoding: try await store.mapBoundsJSON(MapFilter()), as: UTF8.self)).stats("version")?.statsNumber
        }
        let before = try #require(try await version())
        try await store.store([statsEvent("drive.scored", statsJSON(["trip_id": "drive-1", "device": "car", "score": 87.5] as [String: Any]))])
        #expect(try await version() == before + 1)
        #expect(try await tripsInTile(store, tile, MapFilter(kind: .drive)).map(\.score) == [875])
        try await store.store([trip("drive-1", start: "2026-01-05T10:00:00Z", speed: 12, [[52.5, 13.4], [52.51, 13.41]], event: "e-drive-1-again")])
        #expect(try await tripsInTile(store, tile).map(\.speed) == [12, 300])

        try await store.updateMap()
        let bounds = statsParse(String(decoding: try await store.mapBoundsJSON(MapFilter(query: StatsQuery(device: "car", from: statsTime("2026-01-01T00:00:00Z")))), as: UTF8.self))
        #expect(bounds.stats("trips")?.statsNumber == 2)
        #expect(bounds.stats("bounds")?.statsArray.map { $0.statsArray.compactMap(\.statsNumber) } == [[52.5, 13.4], [52.51, 13.41]])
        let none = statsParse(String(decoding: try await store.mapBoundsJSON(MapFilter(query: StatsQuery(device: "nobody"))), as: UTF8.self))
        #expect(none.stats("trips")?.statsNumber == 0 && none.stats("bounds") == .null)
    }

    @Test func tripsAreOnTheMapOnceTheMapIsUpdated() async throws {
        let scratch = StatsScratch()
        let store = try StatsStore(.init(path: scratch.database))
        try await store.store((0..<5).map { index in
            trip("t\(index)", start: "2026-01-0\(index + 1)T10:00:00Z", speed: 12, [[48.2070 + Double(index) * 0.001, 16.3710], [48.2080 + Double(index) * 0.001, 16.3720]])
        })
        let tile = MapTiles.TileID(z: 12, x: 8937 >> 2, y: 5681 >> 2)
        #expect(try await store.mapTile(tile, MapFilter()) == Array("DBT1".utf8))
        #expect(try await store.updateMap(limit: 3) == 3)
        #expect(try await store.updateMap(limit: 3) == 2)
        #expect(try await store.updateMap(limit: 3) == 0)
        #expect(try await tripsInTile(store, tile).count == 5)
        // Without the map, nothing is queued.
        let plain = try StatsStore(.init(path: scratch.path + "/plain.sqlite", mapTiles: false))
        try await plain.store([trip("t", start: "2026-01-01T10:00:00Z", speed: 12, [[48.2, 16.37], [48.21, 16.38]])])
        #expect(try await plain.updateMap() == 0)
    }

    @Test func aTileSendsOnlyWhatPaintsAFreeCell() {
        var coverage = MapTiles.Coverage()
        // A line across the tile, then the same line again, then one that shares half of it.
        let first = coverage.visible([[0, 100, 4000, 100]])
        #expect(first == [[0, 100, 4000, 100]])
        #expect(coverage.visible([[0, 100, 4000, 100]]).isEmpty)
        #expect(coverage.visible([[0, 100, 2000, 100, 2000, 3000]]) == [[2000, 100, 2000, 3000]])
        // Within a cell (16 units) of a painted one counts as painted only in the same cell.
        #expect(coverage.visible([[0, 104, 4000, 104]]).isEmpty)
        #expect(coverage.visible([[0, 120, 4000, 120]]) == [[0, 120, 4000, 120]])

        // The byte path that serves tiles agrees with it, line breaks included.
        var lines: [[Int32]] = []
        var random = SystemRandomNumberGenerator()
        for _ in 0..<200 {
            lines.append((0..<(2 * Int.random(in: 2...30, using: &random))).map { _ in Int32.random(in: -64...4160, using: &random) })
        }
        var byLines = MapTiles.Coverage(), byBytes = MapTiles.Coverage()
        let expected = MapTiles.encode(byLines.visible(lines))
        var out: [UInt8] = []
        let written = MapTiles.encode(lines).withUnsafeBytes { byBytes.appendVisible(encoded: $0, to: &out) }
        #expect(out == expected)
        #expect(written * 2 == out.count)
    }

    @Test func theMapFilterNamesABadKind() throws {
        #expect(throws: StatsError.invalid("kind", "must be one of walk, cycle, drive, got \"boat\"")) {
            try MapFilter.parse(StatsParameters(query: "kind=boat"))
        }
        #expect(try MapFilter.parse(StatsParameters(query: "kind=walk&device=car")) == MapFilter(query: StatsQuery(device: "car"), kind: .walk))
    }
}
