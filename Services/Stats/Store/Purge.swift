import Foundation
import DrivebusSchema
import GRDB
import StatsCore

extension StatsStore {
    /// How many rows of each table `purge` deleted, by table name.
    public typealias Purged = [(table: String, rows: Int)]

    /// Deletes what stats holds of one device between two times, in one transaction: its fixes,
    /// stays and events in the range, the trips that overlap it (with their scores and their
    /// place on the map), and the zone crossings, gate calls and check-outs in it. Nothing of
    /// another device, and nothing outside the range.
    public func purge(device: String, from: Date, to: Date) async throws -> Purged {
        let low = Int64((from.timeIntervalSince1970 * 1000).rounded()), high = Int64((to.timeIntervalSince1970 * 1000).rounded())
        return try await pool.write { db -> Purged in
            let trips = try String.fetchAll(db, sql: "SELECT trip_id FROM trips WHERE device = ? AND start_ms <= ? AND end_ms >= ?", arguments: [device, high, low])
            var purged: Purged = []
            func delete(_ table: String, _ sql: String, _ arguments: StatementArguments) throws {
                try db.execute(sql: "DELETE FROM \(table) WHERE " + sql, arguments: arguments)
                purged.append((table, db.changesCount))
            }
            let inRange: StatementArguments = [device, low, high]
            // Stats keeps every journal record but a stored fix as an event row too
            // (`journal:<seq>`): motion, visits and transitions with their whole payload, position
            // included, and so do fixes that could not be stored, and fixes stored before
            // 2026-11-27 (until 2026-11-28 fixes kept an empty row). Those of the purged records
            // are emptied, not deleted (a replay stores nothing stored before either way).
            // Found by the time in the payload (rows stored before they carried their record's
            // own time carry when they arrived, and a fix expired before then has no row in
            // `fixes` left to find it by): a scan, but purges are rare. A payload that is not JSON
            // (kept from an event that could not be projected) has no time to find it by; without
            // the check, `json_extract` would fail the whole purge on it.
            try db.execute(sql: """
                UPDATE events SET payload = \(StatsStore.emptiedPayload)
                WHERE device = ? AND source = 'ingest' AND type IN ('fix', 'motion', 'client.transition', 'visit')
                    AND CASE WHEN json_valid(CAST(payload AS TEXT))
                        THEN coalesce(json_extract(CAST(payload AS TEXT), '$.start'), json_extract(CAST(payload AS TEXT), '$.time')) END BETWEEN ? AND ?
                """, arguments: [device, RFC3339.format(msDate(low)), RFC3339.format(msDate(high))])
            let journalRows = db.changesCount
            try delete("fixes", "device = ? AND time_ms BETWEEN ? AND ?", inRange)
            // Figures kept from expired fixes: a day's go whole if the range touches it.
            try delete("fix_days", "device = ? AND day BETWEEN ? AND ?", [device, PeriodQueries.floorDiv(low, PeriodQueries.dayMs), PeriodQueries.floorDiv(high, PeriodQueries.dayMs)])
            try delete("visits", "device = ? AND start_ms <= ? AND end_ms >= ?", [device, high, low])
            try delete("geofence_transitions", "device = ? AND time_ms BETWEEN ? AND ?", inRange)
            try delete("gate_calls", "device = ? AND time_ms BETWEEN ? AND ?", inRange)
            try delete("checkouts", "device = ? AND checkout_ms BETWEEN ? AND ?", inRange)
            // The trips' own events (trip.ended, drive.scored) go with them, whenever they were sent.
            let tripEventIDs = try String.fetchAll(db, sql: """
                SELECT event_id FROM trips WHERE trip_id IN (SELECT value FROM json_each(?))
                UNION SELECT event_id FROM scores WHERE trip_id IN (SELECT value FROM json_each(?))
                """, arguments: [Self.jsonArray(trips), Self.jsonArray(trips)])
            try delete(
                "events", "(device = ? AND time_ms BETWEEN ? AND ? AND source != 'ingest') OR id IN (SELECT value FROM json_each(?))",
                [device, low, high, Self.jsonArray(tripEventIDs)])
            purged[purged.count - 1].rows += journalRows
            for table in ["scores", "map_tiles", "map_trips", "map_pending", "trips"] {
                try delete(table, "trip_id IN (SELECT value FROM json_each(?))", [Self.jsonArray(trips)])
            }
            // A map page open meanwhile draws again, and asks for the tiles under a new version
            // rather than the ones its browser cached with the purged trips on them.
            if purged.contains(where: { ["map_tiles", "map_trips"].contains($0.table) && $0.rows > 0 }) { try MapLevels.bumpVersion(db) }
            // The device's first and last fix, when the range held either, from what is left (the
            // fixes, and the days kept from expired ones); its battery, when the last fix went.
            // With nothing left, its row goes: the devices list shows it as it shows a new one.
            let left = (
                first: "min(coalesce((SELECT min(time_ms) FROM fixes WHERE device = ?1), \(Int64.max)), coalesce((SELECT min(day) * \(PeriodQueries.dayMs) FROM fix_days WHERE device = ?1), \(Int64.max)))",
                last: "max(coalesce((SELECT max(time_ms) FROM fixes WHERE device = ?1), 0), coalesce((SELECT max(last_ms) FROM fix_days WHERE device = ?1), 0))")
            try db.execute(sql: """
                UPDATE devices SET
                    battery = CASE WHEN last_ms BETWEEN ?2 AND ?3 THEN NULL ELSE battery END,
                    battery_ms = CASE WHEN last_ms BETWEEN ?2 AND ?3 THEN NULL ELSE battery_ms END,
                    first_ms = CASE WHEN first_ms BETWEEN ?2 AND ?3 THEN \(left.first) ELSE first_ms END,
                    last_ms = CASE WHEN last_ms BETWEEN ?2 AND ?3 THEN \(left.last) ELSE last_ms END
                WHERE device = ?1
                """, arguments: [device, low, high])
            try delete("devices", """
                device = ?1 AND NOT EXISTS (SELECT 1 FROM fixes WHERE device = ?1) AND NOT EXISTS (SELECT 1 FROM fix_days WHERE device = ?1)
                """, [device])
            return purged
        }
    }

    /// `retention.raw_fixes_days`: lets every device's fixes of the UTC days before the one of
    /// `before` go, a device's day at a time (a transaction each, at most a day of fixes, so the
    /// recorder's writes are not held up for long). What the daily figures took from that day's
    /// fixes (their count, the time away from home) is kept in `fix_days` in the same
    /// transaction, so the figures stay as they were. Returns how many fixes went.
    public func expireFixes(before: Date) async throws -> Int {
        let firstKeptDay = PeriodQueries.floorDiv(Int64((before.timeIntervalSince1970 * 1000).rounded()), PeriodQueries.dayMs)
        let devices = try await pool.read { db in try String.fetchAll(db, sql: "SELECT DISTINCT device FROM fixes") }
        var removed = 0
        for device in devices {
            while true {
                let rows = try await pool.write { [configuration, homes] db -> Int in
                    guard let first = try Int64.fetchOne(db, sql: "SELECT min(time_ms) FROM fixes WHERE device = ?", arguments: [device]) else { return 0 }
                    let day = PeriodQueries.floorDiv(first, PeriodQueries.dayMs)
                    guard day < firstKeptDay else { return 0 }
                    let (start, end) = (day * PeriodQueries.dayMs, (day + 1) * PeriodQueries.dayMs)
                    // The day before is gone already: the clock of time away runs on from its last
                    // fix, kept in `fix_days` (PeriodQueries.compute).
                    let figures = try PeriodQueries.compute(
                        db, period: .day, query: StatsQuery(device: device, from: Date(timeIntervalSince1970: Double(start) / 1000),
                                                            to: Date(timeIntervalSince1970: Double(end) / 1000)),
                        configuration: configuration, homes: homes, includeFrozen: false
                    ).first
                    let last = try Row.fetchOne(db, sql: """
                        SELECT time_ms, lat, lon FROM fixes WHERE device = ? AND time_ms >= ? AND time_ms < ? ORDER BY time_ms DESC LIMIT 1
                        """, arguments: [device, start, end])
                    // Added to what a day already frozen holds: fixes of it imported since.
                    try db.execute(sql: """
                        INSERT INTO fix_days (device, day, fixes, away_s, last_ms, last_lat, last_lon) VALUES (?, ?, ?, ?, ?, ?, ?)
                        ON CONFLICT (device, day) DO UPDATE SET
                            fixes = fixes + excluded.fixes,
                            away_s = CASE WHEN excluded.away_s IS NULL THEN away_s ELSE coalesce(away_s, 0) + excluded.away_s END,
                            last_lat = CASE WHEN excluded.last_ms > coalesce(last_ms, excluded.last_ms - 1) THEN excluded.last_lat ELSE last_lat END,
                            last_lon = CASE WHEN excluded.last_ms > coalesce(last_ms, excluded.last_ms - 1) THEN excluded.last_lon ELSE last_lon END,
                            last_ms = max(coalesce(last_ms, excluded.last_ms), excluded.last_ms)
                        """, arguments: [device, day, figures?.fixes ?? 0, figures?.awayFromHomeS, last?[0] as Int64?, last?[1] as Double?, last?[2] as Double?])
                    // Fixes stored before 2026-11-28 have event rows of their own (`journal:<seq>`):
                    // those still holding a payload (before 2026-11-27) are emptied of it.
                    try db.execute(sql: """
                        UPDATE events SET payload = \(StatsStore.emptiedPayload)
                        WHERE id IN (SELECT 'journal:' || seq FROM fixes WHERE device = ? AND time_ms >= ? AND time_ms < ? AND seq IS NOT NULL)
                        """, arguments: [device, start, end])
                    try db.execute(sql: "DELETE FROM fixes WHERE device = ? AND time_ms >= ? AND time_ms < ?", arguments: [device, start, end])
                    return max(db.changesCount, 1)
                }
                if rows == 0 { break }
                removed += rows
            }
        }
        return removed
    }

    /// Empties the journal rows of fixes from UTC days before `before`'s that still hold their
    /// payload: those whose fixes expired before their rows were emptied with them (stats until
    /// 2026-11-27 kept them), or whose fix row was never stored. A scan by the time in the
    /// payload, so it runs once per start, a chunk of rows per transaction so that the recorder's
    /// writes are not held up. Returns how many rows it emptied.
    public func emptyExpiredJournalFixRows(before: Date) async throws -> Int {
        let firstKeptDay = PeriodQueries.floorDiv(Int64((before.timeIntervalSince1970 * 1000).rounded()), PeriodQueries.dayMs)
        let cutoff = RFC3339.format(msDate(firstKeptDay * PeriodQueries.dayMs))
        var after: Int64 = 0, emptied = 0
        while true {
            let step = try await pool.write { [after] db -> (last: Int64, rows: Int)? in
                guard let last = try Int64.fetchOne(db, sql: "SELECT max(rowid) FROM (SELECT rowid FROM events WHERE rowid > ? ORDER BY rowid LIMIT 20000)", arguments: [after])
                else { return nil }
                try db.execute(sql: """
                    UPDATE events SET payload = \(Self.emptiedPayload)
                    WHERE rowid > ? AND rowid <= ? AND source = 'ingest' AND type = 'fix' AND length(payload) > 2
                        AND CASE WHEN json_valid(CAST(payload AS TEXT)) THEN json_extract(CAST(payload AS TEXT), '$.time') END < ?
                    """, arguments: [after, last, cutoff])
                return (last, db.changesCount)
            }
            guard let step else { return emptied }
            (after, emptied) = (step.last, emptied + step.rows)
        }
    }

    /// What a purged or expired record's journal row keeps of its payload: nothing.
    static let emptiedPayload = "CAST('{}' AS BLOB)"

    private static func jsonArray(_ strings: [String]) -> String {
        String(decoding: try! JSONSerialization.data(withJSONObject: strings), as: UTF8.self)
    }
}
