import DrivebusGeo
import DrivebusSchema
import Foundation
import StatsCore
import GRDB

/// A stored trip with its score and driving-school session, as `/api/v1/trips` lists it.
public struct TripSummary: Sendable, Equatable {
    public struct Score: Sendable, Equatable {
        public var score: Double?
        /// `{type: n}`, as the scorer sent it.
        public var counts: JSONValue
        public var eventsPer100km: Double?
        public var speedVariation: Double?
        /// The scorer's event list; only filled for one trip or a session report.
        public var events: JSONValue?
        /// Why the score is what it is (`[{name, value, unit, points}]`); only with `events`.
        public var components: JSONValue?
    }

    public struct Session: Sendable, Equatable {
        public var id: String
        public var candidate: String?
    }

    public var tripID: String
    public var device: String
    public var start: Date
    public var end: Date
    public var durationS: Double?
    public var distanceM: Double?
    public var maxSpeedMps: Double?
    public var avgSpeedMps: Double?
    public var ascentM: Double?
    public var descentM: Double?
    public var startPoint: Coordinate?
    public var endPoint: Coordinate?
    public var fixCount: Int64?
    public var firstSeq: Int64?
    public var lastSeq: Int64?
    public var score: Score?
    public var session: Session?
    /// The simplified track from `trip.ended`; only filled for one trip.
    public var track: [Coordinate]?
    /// The stretches driven above the limit, from the fixes; only filled for one trip.
    var speeding: [SpeedingStretch]?

    func write(to writer: inout JSONWriter) {
        writer.beginObject()
        writer.key("ascent_m"); writer.optional(ascentM)
        writer.key("avg_speed_mps"); writer.optional(avgSpeedMps)
        writer.key("descent_m"); writer.optional(descentM)
        writer.key("device"); writer.string(device)
        writer.key("distance_m"); writer.optional(distanceM)
        writer.key("duration_s"); writer.optional(durationS)
        writer.key("end"); Self.write(endPoint, to: &writer)
        writer.key("end_time"); writer.date(end)
        writer.key("first_seq"); writer.optional(firstSeq)
        writer.key("fix_count"); writer.optional(fixCount)
        writer.key("last_seq"); writer.optional(lastSeq)
        writer.key("max_speed_mps"); writer.optional(maxSpeedMps)
        writer.key("score")
        if let score {
            writer.beginObject()
            if let components = score.components { writer.key("components"); writer.value(components) }
            writer.key("counts"); writer.value(score.counts)
            if let events = score.events { writer.key("events"); writer.value(events) }
            writer.key("events_per_100km"); writer.optional(score.eventsPer100km)
            writer.key("score"); writer.optional(score.score)
            writer.key("speed_variation"); writer.optional(score.speedVariation)
            writer.endObject()
        } else {
            writer.value(.null)
        }
        writer.key("session")
        if let session {
            writer.beginObject()
            writer.key("candidate"); writer.optional(session.candidate)
            writer.key("id"); writer.string(session.id)
            writer.endObject()
        } else {
            writer.value(.null)
        }
        if let speeding {
            writer.key("speeding")
            writer.beginArray()
            for stretch in speeding { stretch.write(to: &writer, track: true) }
            writer.endArray()
        }
        writer.key("start"); Self.write(startPoint, to: &writer)
        writer.key("start_time"); writer.date(start)
        if let track {
            writer.key("track")
            Self.write(track, to: &writer)
        }
        writer.key("trip_id"); writer.string(tripID)
        writer.endObject()
    }

    /// `[[lat, lon], …]`.
    static func write(_ track: [Coordinate], to writer: inout JSONWriter) {
        writer.beginArray()
        for point in track {
            writer.beginArray()
            writer.number(point.lat)
            writer.number(point.lon)
            writer.endArray()
        }
        writer.endArray()
    }

    private static func write(_ point: Coordinate?, to writer: inout JSONWriter) {
        guard let point else { return writer.value(.null) }
        writer.beginObject()
        writer.key("lat"); writer.number(point.lat)
        writer.key("lon"); writer.number(point.lon)
        writer.endObject()
    }
}

extension StatsStore {
    /// Trips that started in the range, newest first.
    public func trips(_ query: StatsQuery) async throws -> [TripSummary] {
        try await pool.read { db in try TripQueries.list(db, query: query) }
    }

    /// One trip with its track and the scorer's events; `stats.not_found` when unknown.
    public func trip(id: String) async throws -> TripSummary {
        let found = try await pool.read { db in try TripQueries.one(db, id: id) }
        guard let found else { throw StatsError.notFound("id", "no trip with id \"\(id)\"") }
        return found
    }

    /// `{"count": n, "trips": [...]}`
    public func tripsJSON(_ query: StatsQuery) async throws -> [UInt8] {
        let trips = try await trips(query)
        var writer = JSONWriter(capacity: 512 * max(1, trips.count))
        writer.beginObject()
        writer.key("count"); writer.number(UInt64(trips.count))
        writer.key("trips")
        writer.beginArray()
        for trip in trips { trip.write(to: &writer) }
        writer.endArray()
        writer.endObject()
        return writer.bytes
    }

    public func tripJSON(id: String) async throws -> [UInt8] {
        let trip = try await trip(id: id)
        var writer = JSONWriter(capacity: 1024 + 40 * (trip.track?.count ?? 0))
        trip.write(to: &writer)
        return writer.bytes
    }
}

enum TripQueries {
    static let columns = """
        t.trip_id, t.device, t.start_ms, t.end_ms, t.duration_s, t.distance_m, t.max_speed_mps, t.avg_speed_mps,
        t.ascent_m, t.descent_m, t.start_lat, t.start_lon, t.end_lat, t.end_lon, t.fix_count, t.first_seq, t.last_seq,
        s.trip_id, s.score, s.counts, s.events_per_100km, s.speed_variation, s.events,
        COALESCE(se.session_id, s.session_id), COALESCE(se.candidate, s.candidate), t.track, s.components
        """
    /// A trip's session: the one its score names, or else the device's session that was open
    /// when the trip started.
    static let joins = """
        FROM trips t
        LEFT JOIN scores s ON s.trip_id = t.trip_id
        LEFT JOIN sessions se ON se.session_id = COALESCE(s.session_id, (
            SELECT x.session_id FROM sessions x
            WHERE x.device = t.device AND x.start_ms <= t.start_ms AND (x.end_ms IS NULL OR x.end_ms >= t.start_ms)
            ORDER BY x.start_ms DESC LIMIT 1))
        """

    static func list(_ db: Database, query: StatsQuery, limit: Int? = nil) throws -> [TripSummary] {
        let rows = try Row.fetchCursor(db, sql: """
            SELECT \(columns) \(joins)
            WHERE t.start_ms >= ? AND t.start_ms < ? AND (?3 IS NULL OR t.device = ?3)
            ORDER BY t.start_ms DESC, t.trip_id
            LIMIT ?4
            """, arguments: [query.fromMs, query.toMs, query.device, limit ?? -1])
        var trips: [TripSummary] = []
        while let row = try rows.next() { trips.append(summary(row, detail: false)) }
        return trips
    }

    static func one(_ db: Database, id: String) throws -> TripSummary? {
        guard var trip = try Row.fetchOne(db, sql: "SELECT \(columns) \(joins) WHERE t.trip_id = ?", arguments: [id]).map({ summary($0, detail: true) })
        else { return nil }
        trip.speeding = try SpeedingStretch.all(db, tripID: trip.tripID, device: trip.device)
        return trip
    }

    /// Trips of a driving-school session: those its scores name, and unscored ones of the
    /// device that started while it was open.
    static func ofSession(_ db: Database, id: String, device: String, startMs: Int64, endMs: Int64?) throws -> [TripSummary] {
        let rows = try Row.fetchCursor(db, sql: """
            SELECT \(columns) \(joins)
            WHERE s.session_id = ?1
               OR (s.session_id IS NULL AND t.device = ?2 AND t.start_ms >= ?3 AND t.start_ms <= ?4)
            ORDER BY t.start_ms, t.trip_id
            """, arguments: [id, device, startMs, endMs ?? Int64.max / 2])
        var trips: [TripSummary] = []
        while let row = try rows.next() {
            var trip = summary(row, detail: true)
            trip.track = nil
            trips.append(trip)
        }
        return trips
    }

    static func summary(_ row: Row, detail: Bool) -> TripSummary {
        func point(_ lat: Int, _ lon: Int) -> Coordinate? {
            guard let la = row[lat] as Double?, let lo = row[lon] as Double? else { return nil }
            return Coordinate(lat: la, lon: lo)
        }
        var trip = TripSummary(
            tripID: row[0], device: row[1], start: msDate(row[2]), end: msDate(row[3]),
            durationS: row[4], distanceM: row[5], maxSpeedMps: row[6], avgSpeedMps: row[7], ascentM: row[8], descentM: row[9],
            startPoint: point(10, 11), endPoint: point(12, 13), fixCount: row[14], firstSeq: row[15], lastSeq: row[16])
        if (row[17] as String?) != nil {
            trip.score = TripSummary.Score(
                score: row[18], counts: json(row[19]) ?? .object([:]), eventsPer100km: row[20], speedVariation: row[21],
                events: detail ? json(row[22]) ?? .array([]) : nil,
                components: detail ? json(row[26]) ?? .array([]) : nil)
        }
        if let session = row[23] as String? {
            trip.session = TripSummary.Session(id: session, candidate: row[24])
        }
        if detail { trip.track = parseTrack(row[25] ?? "[]") }
        return trip
    }

    static func json(_ text: String?) -> JSONValue? {
        guard let text else { return nil }
        return try? JSONValue.parse(Array(text.utf8))
    }

    /// The stored track, `[[lat, lon], …]`, written by the projector.
    static func parseTrack(_ text: String) -> [Coordinate] {
        var reader = JSONReader(Array(text.utf8))
        var points: [Coordinate] = []
        do {
            try reader.readArray { (reader: inout JSONReader) throws(JSONReader.Failure) in
                var pair: [Double] = []
                try reader.readArray { (reader: inout JSONReader) throws(JSONReader.Failure) in pair.append(try reader.readDouble()) }
                if pair.count >= 2 { points.append(Coordinate(lat: pair[0], lon: pair[1])) }
            }
        } catch {
            return points
        }
        return points
    }
}

extension StatsStore {
    /// `GET /api/v1/visits`: stays at places (from imported histories) that began in the range,
    /// oldest first, at most 10,000.
    public func visitsJSON(_ query: StatsQuery) async throws -> [UInt8] {
        try await pool.read { db in
            let rows = try Row.fetchCursor(db, sql: """
                SELECT device, start_ms, end_ms, lat, lon, name, address, place_id, semantic_type FROM visits
                WHERE start_ms >= ? AND start_ms < ? AND (?3 IS NULL OR device = ?3)
                ORDER BY start_ms, device LIMIT 10000
                """, arguments: [query.fromMs, query.toMs, query.device])
            var writer = JSONWriter(capacity: 4096)
            writer.beginObject()
            writer.key("visits")
            writer.beginArray()
            while let row = try rows.next() {
                let start: Int64 = row[1], end: Int64 = row[2]
                writer.beginObject()
                writer.key("address"); writer.optional(row[6] as String?)
                writer.key("device"); writer.string(row[0])
                writer.key("duration_s"); writer.number(Double(end - start) / 1000)
                writer.key("end"); writer.optionalTime(ms: end)
                writer.key("lat"); writer.number(row[3] as Double)
                writer.key("lon"); writer.number(row[4] as Double)
                writer.key("name"); writer.optional(row[5] as String?)
                writer.key("place_id"); writer.optional(row[7] as String?)
                writer.key("semantic_type"); writer.optional(row[8] as String?)
                writer.key("start"); writer.optionalTime(ms: start)
                writer.endObject()
            }
            writer.endArray()
            writer.endObject()
            return writer.bytes
        }
    }
}
