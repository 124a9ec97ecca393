import DrivebusSchema
import Foundation
import StatsCore
import GRDB

/// One driving-school session with its trips, scores and events.
public struct SessionReport: Sendable, Equatable {
    public var sessionID: String
    public var device: String
    public var candidate: String
    public var instructor: String?
    public var note: String?
    public var start: Date
    /// Nil while the session is open.
    public var end: Date?
    public var trips: [TripSummary]

    public var distanceM: Double { trips.reduce(0) { $0 + ($1.distanceM ?? 0) } }
    /// The plain mean of the scored trips' scores.
    public var averageScore: Double? { Self.mean(trips.compactMap { $0.score?.score }) }

    static func mean(_ values: [Double]) -> Double? {
        values.isEmpty ? nil : values.reduce(0, +) / Double(values.count)
    }
}

extension StatsStore {
    /// The candidate's sessions that started in the range, oldest first; `stats.not_found` when
    /// the candidate has no session at all.
    public func sessions(candidate: String, _ query: StatsQuery) async throws -> [SessionReport] {
        let result: [SessionReport]? = try await pool.read { db in
            guard try Bool.fetchOne(db, sql: "SELECT EXISTS (SELECT 1 FROM sessions WHERE candidate = ?)", arguments: [candidate]) == true else {
                return nil
            }
            let rows = try Row.fetchAll(db, sql: """
                SELECT session_id, device, candidate, instructor, note, start_ms, end_ms FROM sessions
                WHERE candidate = ?1 AND start_ms >= ?2 AND start_ms < ?3 AND (?4 IS NULL OR device = ?4)
                ORDER BY start_ms, session_id
                """, arguments: [candidate, query.fromMs, query.toMs, query.device])
            return try rows.map { row in
                let id: String = row[0], device: String = row[1], startMs: Int64 = row[5], endMs: Int64? = row[6]
                return SessionReport(
                    sessionID: id, device: device, candidate: row[2], instructor: row[3], note: row[4],
                    start: msDate(startMs), end: endMs.map(msDate),
                    trips: try TripQueries.ofSession(db, id: id, device: device, startMs: startMs, endMs: endMs))
            }
        }
        guard let result else { throw StatsError.notFound("candidate", "no driving-school session for candidate \"\(candidate)\"") }
        return result
    }

    /// `{"candidate", "sessions": [...], "drives", "distance_m", "average_score", "latest_score"}`.
    public func sessionsJSON(candidate: String, _ query: StatsQuery) async throws -> [UInt8] {
        let sessions = try await sessions(candidate: candidate, query)
        let trips = sessions.flatMap(\.trips)
        var writer = JSONWriter(capacity: 4096)
        writer.beginObject()
        writer.key("average_score"); writer.optional(SessionReport.mean(trips.compactMap { $0.score?.score }))
        writer.key("candidate"); writer.string(candidate)
        writer.key("distance_m"); writer.optional(sessions.reduce(0) { $0 + $1.distanceM })
        writer.key("drives"); writer.number(UInt64(trips.count))
        writer.key("latest_score"); writer.optional(trips.last(where: { $0.score?.score != nil })?.score?.score)
        writer.key("sessions")
        writer.beginArray()
        for session in sessions {
            writer.beginObject()
            writer.key("average_score"); writer.optional(session.averageScore)
            writer.key("device"); writer.string(session.device)
            writer.key("distance_m"); writer.optional(session.distanceM)
            writer.key("drives"); writer.number(UInt64(session.trips.count))
            writer.key("end_time"); writer.optionalTime(ms: session.end.map(milliseconds))
            writer.key("instructor"); writer.optional(session.instructor)
            writer.key("note"); writer.optional(session.note)
            writer.key("session_id"); writer.string(session.sessionID)
            writer.key("start_time"); writer.date(session.start)
            writer.key("trips")
            writer.beginArray()
            for trip in session.trips { trip.write(to: &writer) }
            writer.endArray()
            writer.endObject()
        }
        writer.endArray()
        writer.endObject()
        return writer.bytes
    }
}
