import Foundation
import GRDB

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
            try delete("fixes", "device = ? AND time_ms BETWEEN ? AND ?", inRange)
            try delete("visits", "device = ? AND start_ms <= ? AND end_ms >= ?", [device, high, low])
            try delete("geofence_transitions", "device = ? AND time_ms BETWEEN ? AND ?", inRange)
            try delete("gate_calls", "device = ? AND time_ms BETWEEN ? AND ?", inRange)
            try delete("checkouts", "device = ? AND checkout_ms BETWEEN ? AND ?", inRange)
            // The trips' own events (trip.ended, drive.scored) go with them, whenever they were sent.
            let tripEventIDs = try String.fetchAll(db, sql: """
                SELECT event_id FROM trips WHERE trip_id IN (SELECT value FROM json_each(?))
                UNION SELECT event_id FROM scores WHERE trip_id IN (SELECT value FROM json_each(?))
                """, arguments: [Self.jsonArray(trips), Self.jsonArray(trips)])
            try delete("events", "(device = ? AND time_ms BETWEEN ? AND ?) OR id IN (SELECT value FROM json_each(?))", [device, low, high, Self.jsonArray(tripEventIDs)])
            for table in ["scores", "map_tiles", "map_trips", "map_pending", "trips"] {
                try delete(table, "trip_id IN (SELECT value FROM json_each(?))", [Self.jsonArray(trips)])
            }
            return purged
        }
    }

    /// `retention.raw_fixes_days`: deletes every device's fixes from before `before`, device by
    /// device along the primary key, in pieces of 50,000 rows (a transaction each, so the
    /// recorder's writes are not held up for long). Returns how many went.
    public func expireFixes(before: Date) async throws -> Int {
        let cutoff = Int64((before.timeIntervalSince1970 * 1000).rounded())
        let devices = try await pool.read { db in try String.fetchAll(db, sql: "SELECT DISTINCT device FROM fixes") }
        var removed = 0
        for device in devices {
            while true {
                let rows = try await pool.write { db -> Int in
                    try db.execute(sql: """
                        DELETE FROM fixes WHERE (device, time_ms, lat, lon) IN
                            (SELECT device, time_ms, lat, lon FROM fixes WHERE device = ? AND time_ms < ? LIMIT 50000)
                        """, arguments: [device, cutoff])
                    return db.changesCount
                }
                removed += rows
                if rows < 50_000 { break }
            }
        }
        return removed
    }

    private static func jsonArray(_ strings: [String]) -> String {
        String(decoding: try! JSONSerialization.data(withJSONObject: strings), as: UTF8.self)
    }
}
