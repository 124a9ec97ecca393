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

extension JSONValue {
    fileprivate var number: Double? {
        if case .number(let value) = self { return value }
        return nil
    }
}

/// Rounded for the payload, so reports print and compare stably.
private func rounded(_ value: Double, _ places: Int) -> Double {
    let scale = [1.0, 10, 100, 1000][min(max(places, 0), 3)]
    return (value * scale).rounded() / scale
}

/// What a candidate's report adds up across mock tests: where the points went, the worst
/// moments, and the trend.
struct CandidateSummary {
    struct Component: Equatable {
        var name: String
        var unit: String
        var meanValue: Double
        var meanPoints: Double
    }

    struct Moment {
        var tripID: String
        var sessionID: String
        /// The scorer's event, as sent.
        var event: [String: JSONValue]
        var severity: Double
    }

    var components: [Component] = []
    var worstMoments: [Moment] = []
    /// Points per mock test: the least-squares slope of the sessions' average scores.
    var trendPerSession: Double?

    static let worstMomentCount = 5

    init(_ sessions: [SessionReport]) {
        var sums: [String: (unit: String, value: Double, points: Double, count: Double)] = [:]
        var order: [String] = []
        var moments: [Moment] = []
        for session in sessions {
            for trip in session.trips {
                if case .array(let components)? = trip.score?.components {
                    for case .object(let component) in components {
                        guard case .string(let name)? = component["name"] else { continue }
                        if sums[name] == nil { order.append(name) }
                        var sum = sums[name] ?? (unit: "", value: 0, points: 0, count: 0)
                        if case .string(let unit)? = component["unit"] { sum.unit = unit }
                        sum.value += component["value"]?.number ?? 0
                        sum.points += component["points"]?.number ?? 0
                        sum.count += 1
                        sums[name] = sum
                    }
                }
                if case .array(let events)? = trip.score?.events {
                    for case .object(let event) in events {
                        moments.append(Moment(tripID: trip.tripID, sessionID: session.sessionID, event: event, severity: Self.severity(event)))
                    }
                }
            }
        }
        components = order.compactMap { name in
            sums[name].map { Component(name: name, unit: $0.unit, meanValue: $0.value / $0.count, meanPoints: $0.points / $0.count) }
        }
        worstMoments = Array(moments.sorted { $0.severity > $1.severity }.prefix(Self.worstMomentCount))
        let averages = sessions.compactMap(\.averageScore)
        if averages.count >= 2 {
            let n = Double(averages.count)
            let meanX = (n - 1) / 2, meanY = averages.reduce(0, +) / n
            var covariance = 0.0, variance = 0.0
            for (index, score) in averages.enumerated() {
                covariance += (Double(index) - meanX) * (score - meanY)
                variance += (Double(index) - meanX) * (Double(index) - meanX)
            }
            trendPerSession = covariance / variance
        }
    }

    /// Harsh events by their peak in m/s²; speeding by km/h over the limit, a tenth of it (10 km/h
    /// over weighs as 1 m/s²).
    static func severity(_ event: [String: JSONValue]) -> Double {
        if let peak = event["peak_mps2"]?.number { return abs(peak) }
        if let over = event["over_kmh"]?.number { return over / 10 }
        return 0
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

    /// `{"candidate", "sessions": [...], "drives", "distance_m", "average_score", "latest_score",
    /// "components", "worst_moments", "trend"}` (docs/stats.md).
    public func sessionsJSON(candidate: String, _ query: StatsQuery) async throws -> [UInt8] {
        let sessions = try await sessions(candidate: candidate, query)
        let trips = sessions.flatMap(\.trips)
        let summary = CandidateSummary(sessions)
        var writer = JSONWriter(capacity: 4096)
        writer.beginObject()
        writer.key("average_score"); writer.optional(SessionReport.mean(trips.compactMap { $0.score?.score }))
        writer.key("candidate"); writer.string(candidate)
        writer.key("components")
        writer.beginArray()
        for component in summary.components {
            writer.beginObject()
            writer.key("mean_points"); writer.number(rounded(component.meanPoints, 2))
            writer.key("mean_value"); writer.number(rounded(component.meanValue, 3))
            writer.key("name"); writer.string(component.name)
            writer.key("unit"); writer.string(component.unit)
            writer.endObject()
        }
        writer.endArray()
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
        writer.key("trend")
        writer.beginObject()
        writer.key("per_session"); writer.optional(summary.trendPerSession.map { rounded($0, 2) })
        writer.key("scores")
        writer.beginArray()
        for session in sessions {
            writer.beginObject()
            writer.key("average_score"); writer.optional(session.averageScore)
            writer.key("session_id"); writer.string(session.sessionID)
            writer.key("start_time"); writer.date(session.start)
            writer.endObject()
        }
        writer.endArray()
        writer.endObject()
        writer.key("worst_moments")
        writer.beginArray()
        for moment in summary.worstMoments {
            writer.beginObject()
            writer.key("event"); writer.value(.object(moment.event))
            writer.key("session_id"); writer.string(moment.sessionID)
            writer.key("trip_id"); writer.string(moment.tripID)
            writer.endObject()
        }
        writer.endArray()
        writer.endObject()
        return writer.bytes
    }
}
