import DrivebusGeo
import DrivebusSchema
import Foundation
import StatsCore
import GRDB

/// The streamed exports. Each reads a SQLite cursor and writes chunks as it goes, so a year of
/// 1 Hz fixes needs one chunk of memory, not a year.
public enum StatsExport: Sendable, Equatable {
    public enum Format: String, Sendable, CaseIterable {
        case csv, gpx, geojson
    }

    /// `export/fixes.{csv,gpx,geojson}`: every fix in the range.
    case fixes(Format)
    /// `export/trips.{gpx,geojson}`: one track per trip, from its fixes when they are stored,
    /// otherwise from the simplified track of `trip.ended`.
    case trips(Format)
    /// `map.geojson`: every trip's simplified track.
    case map

    public var contentType: String {
        switch self {
        case .fixes(.csv), .trips(.csv): "text/csv; charset=utf-8"
        case .fixes(.gpx), .trips(.gpx): "application/gpx+xml"
        case .fixes(.geojson), .trips(.geojson), .map: "application/geo+json"
        }
    }

    /// A download name such as `drivebus-fixes-car.gpx`.
    public func filename(device: String?) -> String {
        switch self {
        case .fixes(let format): "drivebus-fixes\(device.map { "-" + $0 } ?? "").\(format.rawValue)"
        case .trips(let format): "drivebus-trips\(device.map { "-" + $0 } ?? "").\(format.rawValue)"
        case .map: "drivebus-map.geojson"
        }
    }
}

extension StatsStore {
    /// Checks an export before its first byte is sent, while a refusal can still be a 400.
    public func validate(_ export: StatsExport, _ query: StatsQuery) async throws {
        if case .trips(.csv) = export {
            throw StatsError.invalid("format", "trips are exported as gpx or geojson")
        }
        if case .fixes(.csv) = export, query.device == nil {
            // CSV has no device column, so it carries one device.
            let devices = try await pool.read { db in try ExportQueries.devicesWithFixes(db, query: query) }
            if devices.count > 1 {
                throw StatsError.invalid("device", "is required for CSV when fixes of several devices are stored (\(devices.joined(separator: ", ")))")
            }
        }
    }

    /// Writes `export` in chunks of about `chunkBytes`, in order, to `emit`. It blocks for the
    /// whole export: run it on a thread of its own. If `emit` throws, the export stops there.
    public func export(_ export: StatsExport, _ query: StatsQuery, chunkBytes: Int = 64 * 1024, emit: ([UInt8]) throws -> Void) throws {
        let configuration = configuration
        try withoutActuallyEscaping(emit) { emit in
            var out = ChunkWriter(chunkBytes: chunkBytes, emit: emit)
            try pool.read { db in
                switch export {
                case .fixes(.csv): try ExportQueries.fixesCSV(db, query: query, homes: homes, out: &out)
                case .fixes(.gpx): try ExportQueries.fixesGPX(db, query: query, configuration: configuration, out: &out)
                case .fixes(.geojson): try ExportQueries.fixesGeoJSON(db, query: query, out: &out)
                case .trips(.gpx): try ExportQueries.tripsGPX(db, query: query, out: &out)
                case .trips(.geojson): try ExportQueries.tripsGeoJSON(db, query: query, out: &out)
                case .trips(.csv): throw StatsError.invalid("format", "trips are exported as gpx or geojson")
                case .map: try MapQueries.geoJSON(db, query: query, toleranceM: configuration.mapToleranceM, out: &out)
                }
            }
            try out.flush()
        }
    }
}

enum ExportQueries {
    /// A stored fix is the same row that was projected from the bus.
    typealias FixRecord = FixRow

    static let gpxHeader: StaticString = """
        <?xml version="1.0" encoding="UTF-8"?>
        <gpx version="1.1" creator="drivebus" xmlns="http://www.topografix.com/GPX/1/1" \
        xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance" \
        xmlns:gpxtpx="http://www.garmin.com/xmlschemas/TrackPointExtension/v2" \
        xsi:schemaLocation="http://www.topografix.com/GPX/1/1 http://www.topografix.com/GPX/1/1/gpx.xsd \
        http://www.garmin.com/xmlschemas/TrackPointExtension/v2 http://www.garmin.com/xmlschemas/TrackPointExtensionv2.xsd">

        """

    /// Devices with at least one fix in the range, each found through the primary key.
    static func devicesWithFixes(_ db: Database, query: StatsQuery) throws -> [String] {
        if let device = query.device { return [device] }
        return try String.fetchAll(db, sql: """
            SELECT device FROM devices d
            WHERE EXISTS (SELECT 1 FROM fixes f WHERE f.device = d.device AND f.time_ms >= ? AND f.time_ms < ?)
            ORDER BY device
            """, arguments: [query.fromMs, query.toMs])
    }

    /// Calls `body` with each fix of `device` in `[fromMs, toMs)`, in time order.
    static func eachFix(_ db: Database, device: String, fromMs: Int64, toMs: Int64, _ body: (FixRecord) throws -> Void) throws {
        let statement = try db.cachedStatement(sql: """
            SELECT time_ms, lat, lon, accuracy_m, altitude_m, speed_mps, course_deg, seq FROM fixes
            WHERE device = ? AND time_ms >= ? AND time_ms < ? ORDER BY time_ms, lat, lon
            """)
        let rows = try Row.fetchCursor(statement, arguments: [device, fromMs, toMs])
        while let row = try rows.next() {
            try body(FixRecord(
                device: device, timeMs: row[0], lat: row[1], lon: row[2], accuracyM: row[3], altitudeM: row[4],
                speedMps: row[5], courseDeg: row[6], seq: (row[7] as Int64?).map { UInt64(max(0, $0)) }))
        }
    }

    static func fixesCSV(_ db: Database, query: StatsQuery, homes: [String: HomeCircle], out: inout ChunkWriter) throws {
        out.append("time,lat,lon,accuracy_m,altitude_m,speed_mps,course_deg,is_home,distance_from_home_m\n")
        for device in try devicesWithFixes(db, query: query) {
            let home = homes[device]
            try eachFix(db, device: device, fromMs: query.fromMs, toMs: query.toMs) { fix in
                out.time(ms: fix.timeMs)
                out.byte(","); out.number(fix.lat)
                out.byte(","); out.number(fix.lon)
                out.byte(","); if let value = fix.accuracyM { out.number(value) }
                out.byte(","); if let value = fix.altitudeM { out.number(value) }
                out.byte(","); if let value = fix.speedMps { out.number(value) }
                out.byte(","); if let value = fix.courseDeg { out.number(value) }
                out.byte(",")
                if let home {
                    let distance = Geo.distance(Coordinate(lat: fix.lat, lon: fix.lon), home.center)
                    out.append(distance <= home.radiusM ? "true" : "false")
                    out.byte(","); out.append(Decimal64.text(distance, places: 1))
                } else {
                    out.byte(",")
                }
                out.byte("\n")
                try out.flushIfFull()
            }
        }
    }

    static func fixesGPX(_ db: Database, query: StatsQuery, configuration: StatsStore.Configuration, out: inout ChunkWriter) throws {
        out.append(gpxHeader)
        out.append("<metadata><name>drivebus fixes</name></metadata>\n")
        let maxGapMs = Int64(max(0, min(configuration.maxGapS, 1e9)) * 1000)
        for device in try devicesWithFixes(db, query: query) {
            out.append("<trk><name>"); out.xml(device); out.append("</name><type>fixes</type>\n<trkseg>\n")
            var lastMs: Int64?
            try eachFix(db, device: device, fromMs: query.fromMs, toMs: query.toMs) { fix in
                // A long silence starts a new segment, so viewers do not draw a line across it.
                if let lastMs, fix.timeMs - lastMs > maxGapMs { out.append("</trkseg>\n<trkseg>\n") }
                lastMs = fix.timeMs
                writeTrackPoint(fix, to: &out)
                try out.flushIfFull()
            }
            out.append("</trkseg>\n</trk>\n")
        }
        out.append("</gpx>\n")
    }

    static func writeTrackPoint(_ fix: FixRecord, to out: inout ChunkWriter) {
        out.append("<trkpt lat=\""); out.number(fix.lat)
        out.append("\" lon=\""); out.number(fix.lon); out.append("\">")
        if let altitude = fix.altitudeM { out.append("<ele>"); out.number(altitude); out.append("</ele>") }
        out.append("<time>"); out.time(ms: fix.timeMs); out.append("</time>")
        // GPX 1.1 has no speed or course; Garmin's TrackPointExtension v2 is what readers know.
        let speed = fix.speedMps.flatMap { $0 >= 0 ? $0 : nil }
        let course = fix.courseDeg.map { value in
            let folded = value.truncatingRemainder(dividingBy: 360)
            return folded < 0 ? folded + 360 : folded
        }
        if speed != nil || course != nil {
            out.append("<extensions><gpxtpx:TrackPointExtension>")
            if let speed { out.append("<gpxtpx:speed>"); out.number(speed); out.append("</gpxtpx:speed>") }
            if let course { out.append("<gpxtpx:course>"); out.number(course); out.append("</gpxtpx:course>") }
            out.append("</gpxtpx:TrackPointExtension></extensions>")
        }
        out.append("</trkpt>\n")
    }

    static func fixesGeoJSON(_ db: Database, query: StatsQuery, out: inout ChunkWriter) throws {
        out.append("{\"type\":\"FeatureCollection\",\"features\":[\n")
        var first = true
        for device in try devicesWithFixes(db, query: query) {
            try eachFix(db, device: device, fromMs: query.fromMs, toMs: query.toMs) { fix in
                if !first { out.append(",\n") }
                first = false
                out.append("{\"type\":\"Feature\",\"geometry\":{\"type\":\"Point\",\"coordinates\":[")
                out.number(fix.lon); out.byte(","); out.number(fix.lat)
                out.append("]},\"properties\":{")
                if let value = fix.accuracyM { out.append("\"accuracy_m\":"); out.number(value); out.byte(",") }
                if let value = fix.altitudeM { out.append("\"altitude_m\":"); out.number(value); out.byte(",") }
                if let value = fix.courseDeg { out.append("\"course_deg\":"); out.number(value); out.byte(",") }
                out.append("\"device\":"); out.json(device)
                if let value = fix.seq { out.append(",\"seq\":"); out.append(String(value)) }
                if let value = fix.speedMps { out.append(",\"speed_mps\":"); out.number(value) }
                out.append(",\"time\":\""); out.time(ms: fix.timeMs); out.append("\"}}")
                try out.flushIfFull()
            }
        }
        out.append("\n]}\n")
    }

    struct TripRow {
        var tripID: String
        var device: String
        var startMs: Int64
        var endMs: Int64
        var distanceM: Double?
        var durationS: Double?
        var ascentM: Double?
        var descentM: Double?
        var track: String
    }

    /// Trips oldest first; with `newest`, only that many of the latest.
    static func eachTrip(_ db: Database, query: StatsQuery, newest: Int? = nil, _ body: (TripRow) throws -> Void) throws {
        let rows = try Row.fetchCursor(db, sql: """
            SELECT * FROM (
                SELECT trip_id, device, start_ms, end_ms, distance_m, duration_s, ascent_m, descent_m, track FROM trips
                WHERE start_ms >= ?1 AND start_ms < ?2 AND (?3 IS NULL OR device = ?3)
                ORDER BY start_ms DESC, trip_id DESC LIMIT ?4)
            ORDER BY start_ms, trip_id
            """, arguments: [query.fromMs, query.toMs, query.device, newest ?? -1])
        while let row = try rows.next() {
            try body(TripRow(
                tripID: row[0], device: row[1], startMs: row[2], endMs: row[3], distanceM: row[4], durationS: row[5],
                ascentM: row[6], descentM: row[7], track: row[8] ?? "[]"))
        }
    }

    /// A trip's own fixes, or nil when none are stored (stats started later than the trip).
    static func hasFixes(_ db: Database, trip: TripRow) throws -> Bool {
        try Bool.fetchOne(db, sql: "SELECT EXISTS (SELECT 1 FROM fixes WHERE device = ? AND time_ms >= ? AND time_ms <= ?)",
                          arguments: [trip.device, trip.startMs, trip.endMs]) == true
    }

    static func tripsGPX(_ db: Database, query: StatsQuery, out: inout ChunkWriter) throws {
        out.append(gpxHeader)
        out.append("<metadata><name>drivebus trips</name></metadata>\n")
        try eachTrip(db, query: query) { trip in
            out.append("<trk><name>"); out.xml(trip.tripID); out.append("</name><desc>")
            out.xml("\(trip.device), \(RFC3339.format(msDate(trip.startMs))), \(Decimal64.text((trip.distanceM ?? 0) / 1000, places: 2)) km")
            out.append("</desc><type>drive</type>\n<trkseg>\n")
            if try hasFixes(db, trip: trip) {
                try eachFix(db, device: trip.device, fromMs: trip.startMs, toMs: trip.endMs + 1) { fix in
                    writeTrackPoint(fix, to: &out)
                    try out.flushIfFull()
                }
            } else {
                for point in TripQueries.parseTrack(trip.track) {
                    out.append("<trkpt lat=\""); out.number(point.lat)
                    out.append("\" lon=\""); out.number(point.lon); out.append("\"></trkpt>\n")
                }
            }
            out.append("</trkseg>\n</trk>\n")
            try out.flushIfFull()
        }
        out.append("</gpx>\n")
    }

    static func tripsGeoJSON(_ db: Database, query: StatsQuery, out: inout ChunkWriter) throws {
        out.append("{\"type\":\"FeatureCollection\",\"features\":[\n")
        var first = true
        try eachTrip(db, query: query) { trip in
            if !first { out.append(",\n") }
            first = false
            out.append("{\"type\":\"Feature\",\"geometry\":{\"type\":\"LineString\",\"coordinates\":[")
            var firstPoint = true
            if try hasFixes(db, trip: trip) {
                try eachFix(db, device: trip.device, fromMs: trip.startMs, toMs: trip.endMs + 1) { fix in
                    if !firstPoint { out.byte(",") }
                    firstPoint = false
                    out.byte("["); out.number(fix.lon); out.byte(","); out.number(fix.lat); out.byte("]")
                    try out.flushIfFull()
                }
            } else {
                for point in TripQueries.parseTrack(trip.track) {
                    if !firstPoint { out.byte(",") }
                    firstPoint = false
                    out.byte("["); out.number(point.lon); out.byte(","); out.number(point.lat); out.byte("]")
                }
            }
            out.append("]},\"properties\":")
            writeTripProperties(trip, to: &out)
            out.byte("}")
            try writeSpeedingStretches(db, trip: trip, to: &out)
            try out.flushIfFull()
        }
        out.append("\n]}\n")
    }

    /// The trip's speeding episodes (from its score) as features of their own:
    /// `{"kind": "speeding", "limit_kmh", "limit_source", "over_kmh", ...}`, so that a map colours
    /// the stretches over the limit.
    static func writeSpeedingStretches(_ db: Database, trip: TripRow, to out: inout ChunkWriter) throws {
        for stretch in try SpeedingStretch.all(db, tripID: trip.tripID, device: trip.device) {
            out.append(",\n{\"type\":\"Feature\",\"geometry\":{\"type\":\"LineString\",\"coordinates\":[")
            for (k, point) in stretch.track.enumerated() {
                if k > 0 { out.byte(",") }
                out.byte("["); out.number(point.lon); out.byte(","); out.number(point.lat); out.byte("]")
            }
            out.append("]},\"properties\":")
            var writer = JSONWriter()
            stretch.write(to: &writer, tripID: trip.tripID)
            out.append(bytes: writer.bytes)
            out.byte("}")
        }
    }

    static func writeTripProperties(_ trip: TripRow, to out: inout ChunkWriter) {
        var writer = JSONWriter()
        writer.beginObject()
        writer.key("ascent_m"); writer.optional(trip.ascentM)
        writer.key("descent_m"); writer.optional(trip.descentM)
        writer.key("device"); writer.string(trip.device)
        writer.key("distance_m"); writer.optional(trip.distanceM)
        writer.key("duration_s"); writer.optional(trip.durationS)
        writer.key("end_time"); writer.time(ms: trip.endMs)
        writer.key("start_time"); writer.time(ms: trip.startMs)
        writer.key("trip_id"); writer.string(trip.tripID)
        writer.endObject()
        out.append(bytes: writer.bytes)
    }
}

/// A stretch of a trip driven above the limit: a speeding episode of the trip's score, with the
/// fixes of its time. None once the fixes are no longer kept.
struct SpeedingStretch: Sendable, Equatable {
    var startTime: String
    var durationS: Double
    var limitKmh: Double?
    var limitSource: String?
    var overKmh: Double?
    var track: [Coordinate]

    static func all(_ db: Database, tripID: String, device: String) throws -> [SpeedingStretch] {
        guard let json = try String.fetchOne(db, sql: "SELECT events FROM scores WHERE trip_id = ?", arguments: [tripID]),
              case .array(let events)? = try? JSONValue.parse(Array(json.utf8))
        else { return [] }
        var stretches: [SpeedingStretch] = []
        for case .object(let event) in events {
            guard case .string("speeding")? = event["type"], case .string(let time)? = event["time"], let start = RFC3339.parse(time),
                  case .number(let duration)? = event["duration_s"], duration >= 0, duration < 86_400
            else { continue }
            let fromMs = Int64((start.timeIntervalSince1970 * 1000).rounded())
            var track: [Coordinate] = []
            try ExportQueries.eachFix(db, device: device, fromMs: fromMs, toMs: fromMs + Int64((duration * 1000).rounded()) + 1) { fix in
                track.append(Coordinate(lat: fix.lat, lon: fix.lon))
            }
            guard track.count >= 2 else { continue }
            func number(_ key: String) -> Double? { if case .number(let value)? = event[key] { value } else { nil } }
            var source: String?
            if case .string(let value)? = event["limit_source"] { source = value }
            stretches.append(SpeedingStretch(
                startTime: time, durationS: duration, limitKmh: number("limit_kmh"), limitSource: source, overKmh: number("over_kmh"), track: track))
        }
        return stretches
    }

    /// The GeoJSON feature's properties, or with `track` (`[[lat, lon], …]`) the trip detail's
    /// object: one shape for both.
    func write(to writer: inout JSONWriter, tripID: String? = nil, track withTrack: Bool = false) {
        writer.beginObject()
        writer.key("duration_s"); writer.optional(durationS)
        writer.key("kind"); writer.string("speeding")
        writer.key("limit_kmh"); writer.optional(limitKmh)
        writer.key("limit_source"); writer.optional(limitSource)
        writer.key("over_kmh"); writer.optional(overKmh)
        writer.key("start_time"); writer.string(startTime)
        if withTrack {
            writer.key("track")
            TripSummary.write(track, to: &writer)
        }
        if let tripID { writer.key("trip_id"); writer.string(tripID) }
        writer.endObject()
    }
}
