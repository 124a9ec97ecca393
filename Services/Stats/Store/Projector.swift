import DrivebusGeo
import DrivebusSchema
import Foundation
import StatsCore
import GRDB

/// Turns stored events into the rows the API reads. Payloads are read generically (field names
/// from docs/events.md), so the stats service does not depend on the publishers' Swift types and
/// ignores fields it does not know.
enum Projector {
    /// Why a payload was not projected; the event itself stays in `events`.
    struct Rejection: Error {
        let field: String
        let reason: String
        var description: String { "\(field): \(reason)" }
    }

    static func store(_ batch: [StoredEvent], in db: Database, mapTiles: Bool) throws -> StatsStore.Summary {
        var summary = StatsStore.Summary()
        let insertEvent = try RawInsert(db, sql: """
            INSERT OR IGNORE INTO events (id, type, device, source, time_ms, payload) VALUES (?, ?, ?, ?, ?, ?)
            """)
        let insertFix = try RawInsert(db, sql: """
            INSERT OR IGNORE INTO fixes (device, time_ms, lat, lon, accuracy_m, altitude_m, speed_mps, course_deg, seq)
            VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
            """)
        var spans: [String: (first: Int64, last: Int64)] = [:]
        var batteries: [String: (timeMs: Int64, level: Double)] = [:]
        for event in batch {
            // Heartbeats are state, not history: two a second from every service would drown the table.
            if event.type.hasPrefix("svc.") {
                summary.skipped += 1
                continue
            }
            do {
                if event.type == "fix" {
                    // A fix keeps no row in `events` (since 2026-11-28): `fixes` holds what stats
                    // reads of it and the journal the record itself, and a replay of what was
                    // stored before is not stored again (StatsRecorder), so nothing needs to
                    // guard it. Its key in `fixes` finds it when it comes twice. (`drivebus-bench
                    // stats`: 53 bytes of database a fix, 171 while it had an empty row in
                    // `events` too, 385 while that row held its payload.)
                    do {
                        if try projectFix(event, statement: insertFix, spans: &spans, batteries: &batteries) {
                            summary.inserted += 1
                        } else {
                            summary.duplicates += 1
                        }
                    } catch let error where isUnprojectable(error) {
                        // Not projected: kept in `events` with its payload, to show what came.
                        guard try insertEvent.run(event) else {
                            summary.duplicates += 1
                            continue
                        }
                        summary.inserted += 1
                        throw error
                    }
                    continue
                }
                guard try insertEvent.run(event) else {
                    summary.duplicates += 1
                    continue
                }
                summary.inserted += 1
                // In a savepoint, so that a payload that breaks a constraint loses only its
                // own rows, not the batch (which the subscriber would retry for ever).
                try db.inSavepoint {
                    try project(event, in: db, mapTiles: mapTiles)
                    return .commit
                }
            } catch let error as DatabaseError where error.resultCode == .SQLITE_CONSTRAINT {
                summary.unprojected += 1
                if summary.problems.count < 5 {
                    summary.problems.append("\(event.type) \(event.id): \(error.message ?? "constraint failed")")
                }
            } catch let rejection as Rejection {
                summary.unprojected += 1
                if summary.problems.count < 5 {
                    summary.problems.append("\(event.type) \(event.id): \(rejection.description)")
                }
            }
        }
        if !spans.isEmpty {
            let upsert = try db.cachedStatement(sql: """
                INSERT INTO devices (device, first_ms, last_ms) VALUES (?, ?, ?)
                ON CONFLICT(device) DO UPDATE SET first_ms = min(first_ms, excluded.first_ms), last_ms = max(last_ms, excluded.last_ms)
                """)
            for (device, span) in spans {
                try upsert.execute(arguments: [device, span.first, span.last])
            }
        }
        if !batteries.isEmpty {
            // The latest battery level wins, whatever order imports and live fixes arrive in.
            let update = try db.cachedStatement(sql: """
                UPDATE devices SET battery = ?, battery_ms = ? WHERE device = ? AND (battery_ms IS NULL OR battery_ms <= ?)
                """)
            for (device, reading) in batteries {
                try update.execute(arguments: [reading.level, reading.timeMs, device, reading.timeMs])
            }
        }
        return summary
    }

    /// The errors that leave an event unprojected (counted in the summary) rather than fail the
    /// batch.
    private static func isUnprojectable(_ error: any Error) -> Bool {
        error is Rejection || (error as? DatabaseError)?.resultCode == .SQLITE_CONSTRAINT
    }

    /// Stores a fix's row; false when the same fix (device, time and place) was there already.
    private static func projectFix(
        _ event: StoredEvent, statement: RawInsert, spans: inout [String: (first: Int64, last: Int64)],
        batteries: inout [String: (timeMs: Int64, level: Double)]
    ) throws -> Bool {
        let fix = try event.fix.map { try FixRow($0, fallbackDevice: event.device) } ?? FixRow(event.payload, fallbackDevice: event.device)
        guard try statement.run({ bind in
            bind.text(fix.device)
            bind.integer(fix.timeMs)
            bind.real(fix.lat)
            bind.real(fix.lon)
            bind.real(fix.accuracyM)
            bind.real(fix.altitudeM)
            bind.real(fix.speedMps)
            bind.real(fix.courseDeg)
            bind.integer(fix.seq.map { Int64(truncatingIfNeeded: $0) })
        }) else { return false }
        if let level = fix.battery, fix.timeMs >= batteries[fix.device]?.timeMs ?? .min {
            batteries[fix.device] = (fix.timeMs, level)
        }
        if let span = spans[fix.device] {
            spans[fix.device] = (min(span.first, fix.timeMs), max(span.last, fix.timeMs))
        } else {
            spans[fix.device] = (fix.timeMs, fix.timeMs)
        }
        return true
    }

    private static func project(_ event: StoredEvent, in db: Database, mapTiles: Bool) throws {
        switch event.type {
        case "visit":
            let p = try payload(event)
            guard let start = p.date("start"), let end = p.date("end"), let lat = p.double("lat"), let lon = p.double("lon"),
                  Coordinate.isValid(lat: lat, lon: lon), end >= start else {
                throw Rejection(field: "visit", reason: "needs start, end (not before start), lat and lon")
            }
            try db.execute(sql: """
                INSERT INTO visits (device, start_ms, end_ms, lat, lon, name, address, place_id, semantic_type, seq)
                VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
                ON CONFLICT(device, start_ms, lat, lon) DO UPDATE SET end_ms = excluded.end_ms, name = excluded.name,
                    address = excluded.address, place_id = excluded.place_id, semantic_type = excluded.semantic_type, seq = excluded.seq
                """, arguments: [
                    try p.device(event), milliseconds(start), milliseconds(end), lat, lon, p.string("name"), p.string("address"),
                    p.string("place_id"), p.string("semantic_type"), p.int("seq"),
                ])
        case "trip.ended":
            try projectTrip(try payload(event), event: event, in: db, mapTiles: mapTiles)
        case "drive.scored":
            try projectScore(try payload(event), event: event, in: db)
        case "session.started":
            let p = try payload(event)
            try db.execute(sql: """
                INSERT INTO sessions (session_id, device, candidate, instructor, note, start_ms) VALUES (?, ?, ?, ?, ?, ?)
                ON CONFLICT(session_id) DO UPDATE SET device = excluded.device, candidate = excluded.candidate,
                    instructor = excluded.instructor, note = excluded.note, start_ms = excluded.start_ms
                """, arguments: [
                    try p.requiredString("session_id"), try p.device(event), try p.requiredString("candidate"),
                    p.string("instructor"), p.string("note"), try p.timeMs("time", default: event.time),
                ])
        case "session.stopped":
            let p = try payload(event)
            let time = try p.timeMs("time", default: event.time)
            if let id = p.string("session_id") {
                try db.execute(sql: "UPDATE sessions SET end_ms = ? WHERE session_id = ?", arguments: [time, id])
            } else {
                // Without an id, the device's latest open session is the one that stopped.
                try db.execute(sql: """
                    UPDATE sessions SET end_ms = ? WHERE session_id = (
                        SELECT session_id FROM sessions WHERE device = ? AND end_ms IS NULL AND start_ms <= ?
                        ORDER BY start_ms DESC LIMIT 1)
                    """, arguments: [time, try p.device(event), time])
            }
        case "geofence.enter", "geofence.exit", "geofence.dwell":
            let p = try payload(event)
            try db.execute(sql: """
                INSERT OR IGNORE INTO geofence_transitions (id, device, zone, event, time_ms, lat, lon, seq, dwell_s)
                VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
                """, arguments: [
                    event.id, try p.device(event), try p.requiredString("zone"),
                    p.string("event") ?? String(event.type.dropFirst("geofence.".count)),
                    try p.timeMs("time", default: event.time), p.double("lat"), p.double("lon"), p.int("seq"), p.double("dwell_s"),
                ])
        case "gate.fired", "gate.failed", "gate.expired":
            let p = try payload(event)
            try db.execute(sql: """
                INSERT OR IGNORE INTO gate_calls (id, outcome, gate, device, zone, seq, idempotency_key, status, latency_ms, attempts, error, time_ms)
                VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
                """, arguments: [
                    event.id, String(event.type.dropFirst("gate.".count)), try p.requiredString("gate"),
                    p.string("device") ?? event.device, p.string("zone"), p.int("seq"), p.string("idempotency_key"),
                    p.int("status"), p.double("latency_ms"), p.int("attempts"), p.string("error"),
                    try p.timeMs("time", default: event.time),
                ])
        case "taxi.checkout":
            let p = try payload(event)
            guard let checkout = p.date("checkout_time") else { throw Rejection(field: "checkout_time", reason: "is required") }
            try db.execute(sql: """
                INSERT OR IGNORE INTO checkouts (id, device, checkin_ms, checkout_ms, reason, confidence, ride_s, ride_distance_m)
                VALUES (?, ?, ?, ?, ?, ?, ?, ?)
                """, arguments: [
                    event.id, try p.device(event), p.date("checkin_time").map(milliseconds), milliseconds(checkout),
                    p.string("reason"), p.string("confidence") ?? p.double("confidence").map { "\($0)" },
                    p.double("ride_s"), p.double("ride_distance_m"),
                ])
        default:
            break  // Kept in `events` only.
        }
    }

    private static func projectTrip(_ p: Payload, event: StoredEvent, in db: Database, mapTiles: Bool) throws {
        let id = try p.requiredString("trip_id")
        guard let start = p.date("start_time") else { throw Rejection(field: "start_time", reason: "is required") }
        guard let end = p.date("end_time") else { throw Rejection(field: "end_time", reason: "is required") }
        // The track is re-written compactly; points that are not [lat, lon] pairs in range are dropped.
        var track = [UInt8]()
        track.reserveCapacity(32 * 64)
        track.append(UInt8(ascii: "["))
        var first = true
        if case .array(let points)? = p["track"] {
            for point in points {
                guard case .array(let pair) = point, pair.count >= 2, case .number(let lat) = pair[0], case .number(let lon) = pair[1],
                      Coordinate.isValid(lat: lat, lon: lon) else { continue }
                if !first { track.append(UInt8(ascii: ",")) }
                first = false
                track.append(UInt8(ascii: "["))
                track.append(contentsOf: Decimal64.text(lat).utf8)
                track.append(UInt8(ascii: ","))
                track.append(contentsOf: Decimal64.text(lon).utf8)
                track.append(UInt8(ascii: "]"))
            }
        }
        track.append(UInt8(ascii: "]"))
        let startPoint = p.coordinate("start"), endPoint = p.coordinate("end")
        // A re-computed trip (same id) replaces the old one: the latest summary wins.
        try db.execute(sql: """
            INSERT OR REPLACE INTO trips (trip_id, device, start_ms, end_ms, duration_s, distance_m, max_speed_mps, avg_speed_mps,
                ascent_m, descent_m, start_lat, start_lon, end_lat, end_lon, fix_count, first_seq, last_seq, track, event_id)
            VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
            """, arguments: [
                id, try p.device(event), milliseconds(start), milliseconds(end),
                p.double("duration_s") ?? max(0, end.timeIntervalSince(start)), p.double("distance_m") ?? 0,
                p.double("max_speed_mps"), p.double("avg_speed_mps"), p.double("ascent_m"), p.double("descent_m"),
                startPoint?.lat, startPoint?.lon, endPoint?.lat, endPoint?.lon,
                p.int("fix_count"), p.int("first_seq"), p.int("last_seq"),
                String(decoding: track, as: UTF8.self), event.id,
            ])
        try db.execute(sql: """
            INSERT INTO devices (device, first_ms, last_ms) VALUES (?, ?, ?)
            ON CONFLICT(device) DO UPDATE SET first_ms = min(first_ms, excluded.first_ms), last_ms = max(last_ms, excluded.last_ms)
            """, arguments: [try p.device(event), milliseconds(start), milliseconds(end)])
        if mapTiles { try MapLevels.enqueue(tripID: id, in: db) }
    }

    private static func projectScore(_ p: Payload, event: StoredEvent, in db: Database) throws {
        let id = try p.requiredString("trip_id")
        var events = JSONValue.array([])
        if case .array? = p["events"] { events = p["events"]! }
        var counts = JSONValue.object([:])
        if case .object? = p["counts"] { counts = p["counts"]! }
        var components = JSONValue.array([])
        if case .array? = p["components"] { components = p["components"]! }
        var sessionID: String?, candidate: String?
        if case .object(let session)? = p["session"] {
            if case .string(let value)? = session["id"] { sessionID = value }
            if case .string(let value)? = session["candidate"] { candidate = value }
        }
        try db.execute(sql: """
            INSERT OR REPLACE INTO scores (trip_id, device, start_ms, score, distance_m, events, counts, events_per_100km,
                speed_variation, session_id, candidate, event_id, components, speeding_m, limit_known_m)
            VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
            """, arguments: [
                id, p.string("device") ?? event.device, p.date("start_time").map(milliseconds), p.double("score"), p.double("distance_m"),
                String(decoding: events.encoded, as: UTF8.self), String(decoding: counts.encoded, as: UTF8.self),
                p.double("events_per_100km"), p.double("speed_variation"), sessionID, candidate, event.id,
                String(decoding: components.encoded, as: UTF8.self), p.double("speeding_m"), p.double("limit_known_m"),
            ])
        try MapLevels.updateScore(tripID: id, score: p.double("score"), in: db)
    }

    private static func payload(_ event: StoredEvent) throws -> Payload {
        do {
            guard case .object(let object) = try JSONValue.parse(event.payload) else {
                throw Rejection(field: "payload", reason: "is not a JSON object")
            }
            return Payload(object: object)
        } catch let failure as JSONReader.Failure {
            throw Rejection(field: failure.field ?? "payload", reason: failure.reason)
        }
    }
}

/// Field access on a payload object, lenient about what it does not need.
struct Payload {
    let object: [String: JSONValue]

    subscript(key: String) -> JSONValue? { object[key] }

    func string(_ key: String) -> String? {
        if case .string(let value)? = object[key] { return value }
        return nil
    }

    func requiredString(_ key: String) throws -> String {
        guard let value = string(key), !value.isEmpty else { throw Projector.Rejection(field: key, reason: "is required") }
        return value
    }

    func double(_ key: String) -> Double? {
        if case .number(let value)? = object[key], value.isFinite { return value }
        return nil
    }

    func int(_ key: String) -> Int64? {
        guard let value = double(key), value.rounded() == value, abs(value) < 9e15 else { return nil }
        return Int64(value)
    }

    func date(_ key: String) -> Date? { string(key).flatMap { RFC3339.parse($0) } }

    func timeMs(_ key: String, default fallback: Date) throws -> Int64 {
        if object[key] == nil { return milliseconds(fallback) }
        guard let date = date(key) else { throw Projector.Rejection(field: key, reason: "is not an RFC 3339 time") }
        return milliseconds(date)
    }

    func device(_ event: StoredEvent) throws -> String {
        if let device = string("device"), !device.isEmpty { return device }
        if let device = event.device, !device.isEmpty { return device }
        throw Projector.Rejection(field: "device", reason: "is required")
    }

    func coordinate(_ key: String) -> Coordinate? {
        guard case .object(let point)? = object[key], case .number(let lat)? = point["lat"], case .number(let lon)? = point["lon"],
              Coordinate.isValid(lat: lat, lon: lon) else { return nil }
        return Coordinate(lat: lat, lon: lon)
    }
}

/// A `fix` payload, read straight from the bytes: the hot path of storing.
struct FixRow {
    var device: String
    var timeMs: Int64
    var lat: Double
    var lon: Double
    var accuracyM: Double?
    var altitudeM: Double?
    var speedMps: Double?
    var courseDeg: Double?
    var seq: UInt64?
    /// 0–1; not a column of `fixes`: only each device's latest is kept, in `devices`.
    var battery: Double?

    init(device: String, timeMs: Int64, lat: Double, lon: Double, accuracyM: Double?, altitudeM: Double?, speedMps: Double?, courseDeg: Double?, seq: UInt64?) {
        self.device = device
        self.timeMs = timeMs
        self.lat = lat
        self.lon = lon
        self.accuracyM = accuracyM
        self.altitudeM = altitudeM
        self.speedMps = speedMps
        self.courseDeg = courseDeg
        self.seq = seq
    }

    /// Reads the payload with the bus's own `Fix` decoder, then checks what the tables need.
    init(_ bytes: [UInt8], fallbackDevice: String?) throws {
        let fix: Fix
        do {
            fix = try BusJSON.decode(Fix.self, from: bytes)
        } catch {
            throw Projector.Rejection(field: error.field ?? "payload", reason: error.reason)
        }
        try self.init(fix, fallbackDevice: fallbackDevice)
    }

    /// Checks what the tables need of a decoded fix.
    init(_ fix: Fix, fallbackDevice: String?) throws {
        let device = fix.device.isEmpty ? (fallbackDevice ?? "") : fix.device
        guard !device.isEmpty else { throw Projector.Rejection(field: "device", reason: "is required") }
        let time = fix.time, lat = fix.lat, lon = fix.lon
        // Day arithmetic in SQL assumes times after 1970.
        guard (0...253_402_300_799.0).contains(time.timeIntervalSince1970) else {
            throw Projector.Rejection(field: "time", reason: "must be between 1970 and 9999")
        }
        guard Coordinate.isValid(lat: lat, lon: lon) else {
            throw Projector.Rejection(field: "lat", reason: "lat and lon must be a position on Earth")
        }
        let (accuracyM, altitudeM, speedMps, courseDeg, seq) = (fix.accuracyM, fix.altitudeM, fix.speedMps, fix.courseDeg, fix.seq)
        self.device = device
        self.timeMs = milliseconds(time)
        self.lat = lat
        self.lon = lon
        self.accuracyM = accuracyM
        self.altitudeM = altitudeM
        self.speedMps = speedMps
        self.courseDeg = courseDeg
        self.seq = seq
        battery = fix.battery.flatMap { (0...1).contains($0) ? $0 : nil }
    }
}

extension RawInsert {
    /// Runs the `events` insert for one event, its payload whole.
    fileprivate func run(_ event: StoredEvent) throws -> Bool {
        try run { bind in
            bind.text(event.id)
            bind.text(event.type)
            bind.text(event.device)
            bind.text(event.source)
            bind.integer(milliseconds(event.time))
            bind.blob(event.payload)
        }
    }
}
