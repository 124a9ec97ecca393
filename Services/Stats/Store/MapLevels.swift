import DrivebusGeo
import DrivebusSchema
import Foundation
import GRDB
import StatsCore

/// What the interactive map shows: the trips of a device, a time range (by start) and a kind.
public struct MapFilter: Sendable, Equatable {
    public var query: StatsQuery
    public var kind: TripKind?

    public init(query: StatsQuery = .init(), kind: TripKind? = nil) {
        self.query = query
        self.kind = kind
    }

    /// `device`, `from`, `to` and `kind` from query parameters.
    public static func parse(_ parameters: StatsParameters) throws(StatsError) -> MapFilter {
        var filter = MapFilter(query: try StatsQuery.parse(parameters))
        if let text = try parameters.single("kind") {
            guard let kind = TripKind(rawValue: text) else {
                throw .invalid("kind", "must be one of \(TripKind.allCases.map(\.rawValue).joined(separator: ", ")), got \"\(text)\"")
            }
            filter.kind = kind
        }
        return filter
    }
}

/// The interactive map's tiles (`MapTiles`), kept in `map_tiles` as trips end, and the extent of
/// each trip in `map_trips` for the first view.
extension StatsStore {
    /// `GET /api/v1/map/tiles/{z}/{x}/{y}`: the trips drawn in one tile, from stored rows (the
    /// binary layout is in `MapLevels.tile` and docs/map.md).
    public func mapTile(_ tile: MapTiles.TileID, _ filter: MapFilter) async throws -> [UInt8] {
        try await pool.read { db in try MapLevels.tile(db, tile: tile, filter: filter) }
    }

    /// `GET /api/v1/map/pick`: the trip nearest a point of a tile, within `radius` tile units
    /// (the newest of equally near ones), `{"trip_id": …}` or `{"trip_id": null}`.
    public func mapPickJSON(_ tile: MapTiles.TileID, x: Double, y: Double, radius: Double, _ filter: MapFilter) async throws -> [UInt8] {
        try await pool.read { db in
            var best: (id: String, distance: Double)?
            try MapLevels.eachTrip(db, tile: tile, filter: filter) { row, lines in
                let distance = MapTiles.distance(from: x, y, to: lines)
                if distance <= radius, distance < (best?.distance ?? .infinity) { best = (row[0], distance) }
            }
            var writer = JSONWriter()
            writer.beginObject()
            writer.key("trip_id")
            if let best { writer.string(best.id) } else { writer.value(.null) }
            writer.endObject()
            return writer.bytes
        }
    }

    /// Cuts the trips stored since the last call into the map's tiles, up to `limit` in one
    /// write; returns how many it took (0: the map is current). The stats service calls it every
    /// second, so a trip is on the map a second after it is stored.
    @discardableResult
    public func updateMap(limit: Int = 500) async throws -> Int {
        try await pool.write { db in try MapLevels.update(db, limit: limit) }
    }

    /// How many tile rows there are and the bytes of their lines, for the benchmark and `docs/map.md`.
    public func mapTileStorage() async throws -> (rows: Int, lineBytes: Int) {
        try await pool.read { db in
            (try Int.fetchOne(db, sql: "SELECT count(*) FROM map_tiles") ?? 0, try Int.fetchOne(db, sql: "SELECT sum(length(lines)) FROM map_tiles") ?? 0)
        }
    }

    /// `GET /api/v1/map/bounds`: how many trips match, the box around them for the first view,
    /// and the map's data version.
    public func mapBoundsJSON(_ filter: MapFilter) async throws -> [UInt8] {
        try await pool.read { db in
            let row = try Row.fetchOne(db, sql: """
                SELECT count(*), min(min_lat), min(min_lon), max(max_lat), max(max_lon) FROM map_trips
                WHERE start_ms >= ?1 AND start_ms < ?2 AND (?3 IS NULL OR device = ?3) AND (?4 IS NULL OR kind = ?4)
                """, arguments: [filter.query.fromMs, filter.query.toMs, filter.query.device, filter.kind?.rawValue])
            var writer = JSONWriter()
            writer.beginObject()
            writer.key("bounds")
            if let row, let south: Double = row[1], let west: Double = row[2], let north: Double = row[3], let east: Double = row[4] {
                writer.value(.array([.array([.number(south), .number(west)]), .array([.number(north), .number(east)])]))
            } else {
                writer.value(.null)
            }
            writer.key("trips"); writer.value(.number(Double(row?[0] as Int64? ?? 0)))
            let version = try Int64.fetchOne(db, sql: "SELECT value FROM cursors WHERE name = 'map'") ?? 0
            writer.key("version"); writer.value(.number(Double(version)))
            writer.endObject()
            return writer.bytes
        }
    }
}

enum MapLevels {
    static let schema = """
        CREATE TABLE map_trips (
            trip_id TEXT PRIMARY KEY NOT NULL,
            device TEXT NOT NULL,
            start_ms INTEGER NOT NULL,
            kind TEXT NOT NULL,
            min_lat REAL NOT NULL, min_lon REAL NOT NULL,
            max_lat REAL NOT NULL, max_lon REAL NOT NULL
        );
        CREATE TABLE map_tiles (
            z INTEGER NOT NULL, x INTEGER NOT NULL, y INTEGER NOT NULL,
            trip_id TEXT NOT NULL,
            device TEXT NOT NULL,
            start_ms INTEGER NOT NULL,
            kind TEXT NOT NULL,
            avg_speed_mps REAL,
            score REAL,
            lines BLOB NOT NULL,
            PRIMARY KEY (z, x, y, start_ms, trip_id)
        ) WITHOUT ROWID;
        CREATE INDEX map_tiles_by_trip ON map_tiles(trip_id);
        CREATE TABLE map_pending (trip_id TEXT PRIMARY KEY NOT NULL);
        """

    /// Cuts up to `limit` pending trips (`map_pending`, filled as trips are stored) into their
    /// tiles, in one transaction; returns how many it took. A re-computed trip (same id) moves on
    /// the map too. The filter's columns and the score sit in every row, and rows are kept in time
    /// order within a tile, so a tile is one range read, newest first, with no joins and no sort.
    /// Rows are written in key order: trips taken together share the pages of their tiles, which
    /// is most of what writing them costs.
    static func update(_ db: Database, limit: Int) throws -> Int {
        let pending = try Row.fetchAll(db, sql: """
            SELECT p.rowid, p.trip_id, t.device, t.start_ms, t.avg_speed_mps, t.max_speed_mps, t.track, s.score
            FROM map_pending p LEFT JOIN trips t USING (trip_id) LEFT JOIN scores s USING (trip_id)
            ORDER BY p.rowid LIMIT ?
            """, arguments: [limit])
        guard let lastRowID: Int64 = pending.last?[0] else { return 0 }
        struct Insert {
            var tile: MapTiles.TileID, startMs: Int64, tripID: String, device: String, kind: String
            var avgSpeedMps: Double?, score: Double?, lines: [UInt8]
        }
        var inserts: [Insert] = []
        let insertTrip = try db.cachedStatement(sql: """
            INSERT INTO map_trips (trip_id, device, start_ms, kind, min_lat, min_lon, max_lat, max_lon) VALUES (?, ?, ?, ?, ?, ?, ?, ?)
            """)
        for row in pending {
            let tripID: String = row[1]
            try remove(tripID: tripID, in: db)
            // A trip that is gone, or has nothing to draw, has no tiles.
            guard let device: String = row[2], let startMs: Int64 = row[3], let text: String = row[6] else { continue }
            let track = TripQueries.parseTrack(text)
            guard !track.isEmpty else { continue }
            let avgSpeedMps: Double? = row[4], maxSpeedMps: Double? = row[5]
            let kind = TripKind(avgSpeedMps: avgSpeedMps, maxSpeedMps: maxSpeedMps).rawValue
            try insertTrip.execute(arguments: [
                tripID, device, startMs, kind, track.map(\.lat).min()!, track.map(\.lon).min()!, track.map(\.lat).max()!, track.map(\.lon).max()!,
            ])
            for piece in MapTiles.pieces(of: track) {
                inserts.append(Insert(
                    tile: piece.tile, startMs: startMs, tripID: tripID, device: device, kind: kind, avgSpeedMps: avgSpeedMps,
                    score: row[7], lines: MapTiles.encode(piece.lines)))
            }
        }
        inserts.sort { ($0.tile, $0.startMs, $0.tripID) < ($1.tile, $1.startMs, $1.tripID) }
        let insert = try RawInsert(db, sql: """
            INSERT INTO map_tiles (z, x, y, trip_id, device, start_ms, kind, avg_speed_mps, score, lines) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
            """)
        for row in inserts {
            _ = try insert.run { bind in
                bind.integer(Int64(row.tile.z)); bind.integer(Int64(row.tile.x)); bind.integer(Int64(row.tile.y))
                bind.text(row.tripID); bind.text(row.device); bind.integer(row.startMs); bind.text(row.kind)
                bind.real(row.avgSpeedMps); bind.real(row.score); bind.blob(row.lines)
            }
        }
        try db.execute(sql: "DELETE FROM map_pending WHERE rowid <= ?", arguments: [lastRowID])
        try bumpVersion(db)
        return pending.count
    }

    static func remove(tripID: String, in db: Database) throws {
        try db.cachedStatement(sql: "DELETE FROM map_tiles WHERE trip_id = ?").execute(arguments: [tripID])
        try db.cachedStatement(sql: "DELETE FROM map_trips WHERE trip_id = ?").execute(arguments: [tripID])
    }

    static func updateScore(tripID: String, score: Double?, in db: Database) throws {
        try db.execute(sql: "UPDATE map_tiles SET score = ? WHERE trip_id = ?", arguments: [score, tripID])
        if db.changesCount > 0 { try bumpVersion(db) }
    }

    /// The map's data version (`cursors.map`): it changes whenever a tile may have, so a page
    /// names it in tile URLs and caches them, and sees when to draw again.
    static func bumpVersion(_ db: Database) throws {
        try db.execute(sql: "INSERT INTO cursors (name, value) VALUES ('map', 1) ON CONFLICT(name) DO UPDATE SET value = value + 1")
    }

    /// Queues a stored trip for `update`.
    static func enqueue(tripID: String, in db: Database) throws {
        try db.execute(sql: "INSERT OR IGNORE INTO map_pending (trip_id) VALUES (?)", arguments: [tripID])
    }

    /// A tile's rows through the filter, newest first: `trip_id`, `avg_speed_mps`, `score` and
    /// the stored `lines` of the stored tile holding it.
    static func eachRow(_ db: Database, tile: MapTiles.TileID, filter: MapFilter, _ body: (Row) throws -> Void) throws {
        let stored = tile.stored
        let rows = try Row.fetchCursor(db, sql: """
            SELECT trip_id, avg_speed_mps, score, lines FROM map_tiles
            WHERE z = ?1 AND x = ?2 AND y = ?3 AND start_ms >= ?4 AND start_ms < ?5
                AND (?6 IS NULL OR device = ?6) AND (?7 IS NULL OR kind = ?7)
            ORDER BY start_ms DESC, trip_id DESC
            """, arguments: [
                stored.z, stored.x, stored.y, filter.query.fromMs, filter.query.toMs, filter.query.device, filter.kind?.rawValue,
            ])
        while let row = try rows.next() { try body(row) }
    }

    /// The same with each trip's lines cut to the tile.
    static func eachTrip(_ db: Database, tile: MapTiles.TileID, filter: MapFilter, _ body: (Row, [[Int32]]) throws -> Void) throws {
        try eachRow(db, tile: tile, filter: filter) { row in
            let lines = try row.withUnsafeData(atIndex: 3) { storedLines(data: $0, in: tile) }
            if !lines.isEmpty { try body(row, lines) }
        }
    }

    /// A row's stored lines as they fall in `tile`, itself or a deeper one.
    static func storedLines(data: Data?, in tile: MapTiles.TileID) -> [[Int32]] {
        let lines = MapTiles.decode(data.map(Array.init) ?? [])
        return tile.stored == tile ? lines : MapTiles.descend(lines, from: tile.stored, to: tile)
    }

    /// A tile as the page draws it: `DBT1`, then per trip with anything to show (newest first)
    /// its average speed in dm/s and its score × 10 (UInt16, 0xFFFF for none), the count of
    /// Int16 values that follow (UInt32), and its lines as stored (a point count, then x, y
    /// pairs); little-endian throughout. Only what paints a free cell is sent (`Coverage`).
    static func tile(_ db: Database, tile: MapTiles.TileID, filter: MapFilter) throws -> [UInt8] {
        var out = Array("DBT1".utf8)
        out.reserveCapacity(64 * 1024)
        var coverage = MapTiles.Coverage()
        /// A reading × 10 in 16 bits, 0xFFFF for none.
        func put16(tenths value: Double?, at index: Int) {
            let bits = value.map { UInt16(max(0, min(65_534, ($0 * 10).rounded()))) } ?? 0xFFFF
            out[index] = UInt8(truncatingIfNeeded: bits)
            out[index + 1] = UInt8(truncatingIfNeeded: bits >> 8)
        }
        let deeper = tile.stored != tile
        try eachRow(db, tile: tile, filter: filter) { row in
            let header = out.count
            out += [0, 0, 0, 0, 0, 0, 0, 0]
            let written = try row.withUnsafeData(atIndex: 3) { (data: Data?) -> Int in
                guard let data else { return 0 }
                if deeper {
                    return MapTiles.encode(storedLines(data: data, in: tile)).withUnsafeBytes { coverage.appendVisible(encoded: $0, to: &out) }
                }
                return data.withUnsafeBytes { coverage.appendVisible(encoded: $0, to: &out) }
            }
            guard written > 0 else {
                out.removeLast(8)
                return
            }
            let speed: Double? = row[1], score: Double? = row[2]
            put16(tenths: speed, at: header)
            put16(tenths: score, at: header + 2)
            for byte in 0..<4 { out[header + 4 + byte] = UInt8(truncatingIfNeeded: written >> (8 * byte)) }
        }
        return out
    }
}
