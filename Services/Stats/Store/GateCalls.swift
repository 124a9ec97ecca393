import DrivebusSchema
import Foundation
import GRDB
import StatsCore

extension StatsStore {
    /// Gate calls given up on (`failed`, or `expired`: older than the gate's `max_age_s`), newest
    /// first: `{"dead_letters":[{"id","outcome","gate","device","zone","seq","idempotency_key","status","attempts","error","time"}]}`.
    public func deadLettersJSON(_ query: StatsQuery) async throws -> [UInt8] {
        try await pool.read { db in
            var writer = JSONWriter()
            writer.beginObject()
            writer.key("dead_letters")
            writer.beginArray()
            let rows = try Row.fetchCursor(db, sql: """
                SELECT id, outcome, gate, device, zone, seq, idempotency_key, status, attempts, error, time_ms FROM gate_calls
                WHERE outcome IN ('failed', 'expired') AND (?1 IS NULL OR device = ?1) AND time_ms >= ?2 AND time_ms < ?3
                ORDER BY time_ms DESC LIMIT 1000
                """, arguments: [query.device, query.fromMs, query.toMs])
            while let row = try rows.next() {
                writer.beginObject()
                writer.key("id"); writer.string(row[0])
                writer.key("outcome"); writer.string(row[1])
                writer.key("gate"); writer.string(row[2])
                writer.key("device"); writer.optional(row[3] as String?)
                writer.key("zone"); writer.optional(row[4] as String?)
                writer.key("seq"); writer.optional(row[5] as Int64?)
                writer.key("idempotency_key"); writer.optional(row[6] as String?)
                writer.key("status"); writer.optional(row[7] as Int64?)
                writer.key("attempts"); writer.optional(row[8] as Int64?)
                writer.key("error"); writer.optional(row[9] as String?)
                writer.key("time"); writer.time(ms: row[10])
                writer.endObject()
            }
            writer.endArray()
            writer.endObject()
            return writer.bytes
        }
    }
}
