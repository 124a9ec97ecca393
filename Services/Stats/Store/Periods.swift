import DrivebusGeo
import DrivebusSchema
import Foundation
import StatsCore
import GRDB

/// Daily or monthly figures. Days are UTC days: a trip counts on the day it started, and time
/// away from home is split at UTC midnight.
public struct PeriodStats: Sendable, Equatable {
    public enum Period: String, Sendable {
        case day, month
    }

    /// `2025-03-01` for a day, `2025-03` for a month.
    public var period: String
    public var distanceM: Double = 0
    public var drives = 0
    public var drivingS: Double = 0
    public var fixes = 0
    /// Nil when none of the devices asked about has a home.
    public var awayFromHomeS: Double?
    /// Scored drives' distance above the limit × tolerance, out of their distance with a known
    /// limit (docs/speed-limits.md).
    public var speedingM: Double = 0
    public var limitKnownM: Double = 0

    public init(period: String, distanceM: Double = 0, drives: Int = 0, drivingS: Double = 0, fixes: Int = 0, awayFromHomeS: Double? = nil) {
        self.period = period
        self.distanceM = distanceM
        self.drives = drives
        self.drivingS = drivingS
        self.fixes = fixes
        self.awayFromHomeS = awayFromHomeS
    }
}

extension StatsStore {
    /// Periods with any fix, trip or time away in the range, oldest first.
    public func periods(_ period: PeriodStats.Period, _ query: StatsQuery) async throws -> [PeriodStats] {
        let configuration = configuration
        return try await pool.read { db in
            try PeriodQueries.compute(db, period: period, query: query, configuration: configuration, homes: homes, includeFrozen: true)
        }
    }

    /// `{"days": [...]}` or `{"months": [...]}`.
    public func periodsJSON(_ period: PeriodStats.Period, _ query: StatsQuery) async throws -> [UInt8] {
        let periods = try await periods(period, query)
        var writer = JSONWriter(capacity: 160 * max(1, periods.count))
        writer.beginObject()
        writer.key("max_gap_s"); writer.optional(configuration.maxGapS)
        switch period {
        case .day: writer.key("days")
        case .month: writer.key("months")
        }
        writer.beginArray()
        for item in periods {
            writer.beginObject()
            switch period {
            case .day: writer.key("date")
            case .month: writer.key("month")
            }
            writer.string(item.period)
            writer.key("distance_m"); writer.optional(item.distanceM)
            writer.key("drives"); writer.number(UInt64(item.drives))
            writer.key("driving_s"); writer.optional(item.drivingS)
            writer.key("fixes"); writer.number(UInt64(item.fixes))
            writer.key("away_from_home_s"); writer.optional(item.awayFromHomeS)
            writer.key("speeding_m"); writer.optional(item.speedingM)
            writer.key("limit_known_m"); writer.optional(item.limitKnownM)
            // The share of distance driven above the limit, where a limit was known.
            writer.key("speeding_share"); writer.optional(item.limitKnownM > 0 ? (item.speedingM / item.limitKnownM * 10_000).rounded() / 10_000 : nil)
            writer.endObject()
        }
        writer.endArray()
        writer.endObject()
        return writer.bytes
    }
}

enum PeriodQueries {
    static let dayMs: Int64 = 86_400_000

    struct Bucket {
        var distanceM = 0.0
        var drives = 0
        var drivingS = 0.0
        var fixes = 0
        var awayS = 0.0
        var speedingM = 0.0
        var limitKnownM = 0.0
    }

    /// `includeFrozen`: with the figures of days whose fixes have expired (`fix_days`), counted
    /// whole for each day that starts in the range.
    static func compute(
        _ db: Database, period: PeriodStats.Period, query: StatsQuery, configuration: StatsStore.Configuration, homes: [String: HomeCircle],
        includeFrozen: Bool
    ) throws -> [PeriodStats] {
        var days: [Int64: Bucket] = [:]
        let fromMs = query.fromMs, toMs = query.toMs

        let trips = try Row.fetchCursor(db, sql: """
            SELECT start_ms, distance_m, duration_s FROM trips
            WHERE start_ms >= ? AND start_ms < ? AND (?3 IS NULL OR device = ?3)
            """, arguments: [fromMs, toMs, query.device])
        while let row = try trips.next() {
            let day = floorDiv(row[0], dayMs)
            days[day, default: Bucket()].drives += 1
            days[day, default: Bucket()].distanceM += (row[1] as Double?) ?? 0
            days[day, default: Bucket()].drivingS += (row[2] as Double?) ?? 0
        }

        let scores = try Row.fetchCursor(db, sql: """
            SELECT start_ms, speeding_m, limit_known_m FROM scores
            WHERE limit_known_m > 0 AND start_ms >= ? AND start_ms < ? AND (?3 IS NULL OR device = ?3)
            """, arguments: [fromMs, toMs, query.device])
        while let row = try scores.next() {
            let day = floorDiv(row[0], dayMs)
            days[day, default: Bucket()].speedingM += (row[1] as Double?) ?? 0
            days[day, default: Bucket()].limitKnownM += (row[2] as Double?) ?? 0
        }

        let devices: [String] = try query.device.map { [$0] } ?? String.fetchAll(db, sql: "SELECT device FROM devices ORDER BY device")
        var anyHome = false
        let maxGapMs = Int64(max(0, min(configuration.maxGapS, 1e9)) * 1000)
        for device in devices {
            guard let home = homes[device] else {
                // No home: only counts, which SQLite does fastest.
                let counts = try Row.fetchCursor(db, sql: """
                    SELECT time_ms / \(dayMs), count(*) FROM fixes WHERE device = ? AND time_ms >= ? AND time_ms < ? GROUP BY 1
                    """, arguments: [device, max(0, fromMs), toMs])
                while let row = try counts.next() { days[row[0], default: Bucket()].fixes += row[1] as Int }
                continue
            }
            anyHome = true
            var away = AwayClock(home: home, maxGapMs: maxGapMs, fromMs: fromMs, toMs: toMs)
            // Fixes up to max_gap_s beyond both ends, so that a stay across `from` or `to`
            // counts up to the edge; AwayClock clips it there.
            let fixes = try Row.fetchCursor(db, sql: """
                SELECT time_ms, lat, lon FROM fixes WHERE device = ? AND time_ms >= ? AND time_ms <= ? ORDER BY time_ms
                """, arguments: [device, max(0, fromMs - maxGapMs), toMs > Int64.max / 4 ? toMs : toMs + maxGapMs])
            while let row = try fixes.next() {
                let time: Int64 = row[0]
                if time >= toMs, away.isPastEnd { break }
                if time >= fromMs, time < toMs { days[floorDiv(time, dayMs), default: Bucket()].fixes += 1 }
                away.add(time: time, at: Coordinate(lat: row[1], lon: row[2])) { day, seconds in
                    days[day, default: Bucket()].awayS += seconds
                }
            }
            // An expired day's last fix carries the clock past its midnight to the next fix kept,
            // as the fixes themselves did: the part up to midnight is in that day's frozen
            // figures, the rest is counted here.
            let carries = try Row.fetchAll(db, sql: """
                SELECT day, last_ms, last_lat, last_lon FROM fix_days
                WHERE device = ? AND last_ms IS NOT NULL AND (day + 1) * \(dayMs) < ? AND (day + 1) * \(dayMs) + ? > ?
                """, arguments: [device, toMs, maxGapMs, fromMs])
            for carry in carries {
                let midnight = ((carry[0] as Int64) + 1) * dayMs
                guard let next = try Row.fetchOne(db, sql: """
                    SELECT time_ms, lat, lon FROM fixes WHERE device = ? AND time_ms >= ? ORDER BY time_ms LIMIT 1
                    """, arguments: [device, midnight]) else { continue }
                var clock = AwayClock(home: home, maxGapMs: maxGapMs, fromMs: max(midnight, fromMs), toMs: toMs)
                clock.add(time: carry[1], at: Coordinate(lat: carry[2], lon: carry[3])) { _, _ in }
                clock.add(time: next[0], at: Coordinate(lat: next[1], lon: next[2])) { day, seconds in days[day, default: Bucket()].awayS += seconds }
            }
        }

        if includeFrozen {
            let frozen = try Row.fetchCursor(db, sql: """
                SELECT day, fixes, away_s FROM fix_days
                WHERE day >= ?1 AND day * \(dayMs) < ?2 AND (?3 IS NULL OR device = ?3)
                """, arguments: [floorDiv(fromMs, dayMs) + (floorDiv(fromMs, dayMs) * dayMs < fromMs ? 1 : 0), toMs, query.device])
            while let row = try frozen.next() {
                days[row[0], default: Bucket()].fixes += row[1] as Int
                if let away = row[2] as Double? {
                    days[row[0], default: Bucket()].awayS += away
                    anyHome = true
                }
            }
        }

        switch period {
        case .day:
            return days.keys.sorted().map { day in
                let bucket = days[day]!
                let (y, m, d) = RFC3339.civil(fromDays: day)
                var stats = PeriodStats(
                    period: pad(y, 4) + "-" + pad(m, 2) + "-" + pad(d, 2), distanceM: bucket.distanceM, drives: bucket.drives,
                    drivingS: bucket.drivingS, fixes: bucket.fixes, awayFromHomeS: anyHome ? bucket.awayS : nil)
                (stats.speedingM, stats.limitKnownM) = (bucket.speedingM, bucket.limitKnownM)
                return stats
            }
        case .month:
            var months: [Int64: Bucket] = [:]
            for (day, bucket) in days {
                let (y, m, _) = RFC3339.civil(fromDays: day)
                var month = months[y * 12 + m - 1, default: Bucket()]
                month.distanceM += bucket.distanceM
                month.drives += bucket.drives
                month.drivingS += bucket.drivingS
                month.fixes += bucket.fixes
                month.awayS += bucket.awayS
                month.speedingM += bucket.speedingM
                month.limitKnownM += bucket.limitKnownM
                months[y * 12 + m - 1] = month
            }
            return months.keys.sorted().map { key in
                let bucket = months[key]!
                var stats = PeriodStats(
                    period: pad(floorDiv(key, 12), 4) + "-" + pad(key - floorDiv(key, 12) * 12 + 1, 2), distanceM: bucket.distanceM,
                    drives: bucket.drives, drivingS: bucket.drivingS, fixes: bucket.fixes, awayFromHomeS: anyHome ? bucket.awayS : nil)
                (stats.speedingM, stats.limitKnownM) = (bucket.speedingM, bucket.limitKnownM)
                return stats
            }
        }
    }

    static func floorDiv(_ a: Int64, _ b: Int64) -> Int64 {
        let q = a / b
        return (a % b != 0 && (a < 0) != (b < 0)) ? q - 1 : q
    }

    static func pad(_ value: Int64, _ width: Int) -> String {
        let text = String(value)
        return text.count >= width ? text : String(repeating: "0", count: width - text.count) + text
    }
}

/// Time away from home from a device's fixes in time order. A fix's state (home or away) holds
/// until the next fix; a gap longer than `maxGapMs` is unknown and not counted.
struct AwayClock {
    let home: HomeCircle
    let maxGapMs: Int64
    let fromMs: Int64
    let toMs: Int64
    private var last: (time: Int64, away: Bool)?

    init(home: HomeCircle, maxGapMs: Int64, fromMs: Int64, toMs: Int64) {
        self.home = home
        self.maxGapMs = maxGapMs
        self.fromMs = fromMs
        self.toMs = toMs
    }

    /// True once a fix at or after `toMs` has been seen: later ones add nothing.
    var isPastEnd: Bool { (last?.time ?? Int64.min) >= toMs }

    /// Calls `credit(day, seconds)` for the away time that ends at this fix, split at UTC midnight.
    mutating func add(time: Int64, at point: Coordinate, credit: (Int64, Double) -> Void) {
        let away = Geo.distance(point, home.center) > home.radiusM
        if let last, last.away, time - last.time <= maxGapMs {
            var start = max(last.time, fromMs)
            let end = min(time, toMs)
            while start < end {
                let day = PeriodQueries.floorDiv(start, PeriodQueries.dayMs)
                let dayEnd = min(end, (day + 1) * PeriodQueries.dayMs)
                credit(day, Double(dayEnd - start) / 1000)
                start = dayEnd
            }
        }
        last = (time, away)
    }
}
