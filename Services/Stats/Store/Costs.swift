import DrivebusSchema
import Foundation
import StatsCore
import GRDB

/// Own car against rentals for a range: what `GET /api/v1/costs` answers.
public struct CostReport: Sendable, Equatable {
    /// A chain of one device's trips with gaps shorter than `rental_keep_s`: one car kept.
    public struct Rental: Sendable, Equatable {
        public var device: String
        public var start: Date
        public var end: Date
        /// Started minutes from the first trip's start to the last one's end, parking included.
        public var minutes: Int
        public var distanceM: Double
        public var tripIDs: [String]
        /// One price per service, in configuration order.
        public var prices: [Decimal]
        /// The index of the cheapest service (the first on a tie); nil without services.
        public var cheapest: Int?
    }

    public struct Service: Sendable, Equatable {
        public var name: String
        public var total: Decimal
    }

    public var currency: String
    public var drives: Int
    public var distanceM: Double
    /// The ledger's total in the range (configured and posted expenses).
    public var ownCarTotal: Decimal
    /// `ownCarTotal` per km driven, to a tenth of a cent; nil without distance.
    public var ownCarCostPerKm: Decimal?
    public var expenseCount: Int
    public var byCategory: [String: Decimal]
    public var rentals: [Rental]
    public var services: [Service]
    /// The sum of each rental's cheapest price; nil without services.
    public var mixedTotal: Decimal?
}

/// Own car against each service and mixed rent, for one month.
struct MonthCosts: Sendable, Equatable {
    var month: String
    var ownCar: Decimal
    var services: [Decimal]
    var mixed: Decimal?
}

extension StatsStore {
    /// The cost comparison for trips that started in the range, and ledger entries dated in it.
    public func costs(_ query: StatsQuery, configuration costs: CostsConfiguration) async throws -> CostReport {
        try await pool.read { db in try CostQueries.report(db, query: query, costs: costs) }
    }

    public func costsJSON(_ query: StatsQuery, configuration costs: CostsConfiguration) async throws -> [UInt8] {
        let report = try await self.costs(query, configuration: costs)
        return CostQueries.json(report, query: query, costs: costs)
    }

    /// Per UTC month of `months` (`YYYY-MM`), rentals bucketed by the month they started in.
    func monthlyCosts(_ query: StatsQuery, months: [String], configuration costs: CostsConfiguration) async throws -> [MonthCosts] {
        try await pool.read { db in
            let rentals = try CostQueries.rentals(db, query: query, costs: costs)
            let ledger = try Ledger.entries(db, query: query, costs: costs)
            return months.map { month in
                let mine = rentals.filter { CostQueries.month(of: $0.start) == month }
                let services = costs.rentals.indices.map { index in mine.reduce(Decimal(0)) { $0 + $1.prices[index] } }
                let mixed: Decimal? = costs.rentals.isEmpty ? nil : CostQueries.mixed(mine)
                let own = ledger.filter { $0.date.hasPrefix(month) }.reduce(Decimal(0)) { $0 + $1.amount }
                return MonthCosts(month: month, ownCar: Money.cents(own), services: services, mixed: mixed)
            }
        }
    }
}

enum CostQueries {
    static func report(_ db: Database, query: StatsQuery, costs: CostsConfiguration) throws -> CostReport {
        let rentals = try rentals(db, query: query, costs: costs)
        let ledger = try Ledger.entries(db, query: query, costs: costs)
        let distanceM = rentals.reduce(0) { $0 + $1.distanceM }
        let drives = rentals.reduce(0) { $0 + $1.tripIDs.count }
        var byCategory: [String: Decimal] = [:]
        for entry in ledger { byCategory[entry.category, default: 0] += entry.amount }
        let total = Money.cents(ledger.reduce(Decimal(0)) { $0 + $1.amount })
        let perKm: Decimal? = distanceM > 0 ? Money.round(total / (Money.decimal(distanceM) / 1000), places: 3) : nil
        let services = costs.rentals.enumerated().map { index, service in
            CostReport.Service(name: service.name, total: rentals.reduce(Decimal(0)) { $0 + $1.prices[index] })
        }
        let mixed: Decimal? = costs.rentals.isEmpty ? nil : mixed(rentals)
        return CostReport(
            currency: costs.currency, drives: drives, distanceM: distanceM, ownCarTotal: total, ownCarCostPerKm: perKm,
            expenseCount: ledger.count, byCategory: byCategory.mapValues(Money.cents), rentals: rentals, services: services, mixedTotal: mixed)
    }

    /// Trips that started in the range, chained per device into rentals and priced.
    static func rentals(_ db: Database, query: StatsQuery, costs: CostsConfiguration) throws -> [CostReport.Rental] {
        let rows = try Row.fetchCursor(db, sql: """
            SELECT trip_id, device, start_ms, end_ms, distance_m FROM trips
            WHERE start_ms >= ? AND start_ms < ? AND (?3 IS NULL OR device = ?3)
            ORDER BY device, start_ms, trip_id
            """, arguments: [query.fromMs, query.toMs, query.device])
        // Clamped, and NaN taken as 0, so that an unvalidated configuration cannot trap.
        let keepMs = costs.rentalKeepS.isFinite ? Int64(max(0, min(costs.rentalKeepS, 1e9)) * 1000) : 0
        var chains: [(device: String, startMs: Int64, endMs: Int64, distanceM: Double, trips: [String])] = []
        while let row = try rows.next() {
            let id: String = row[0], device: String = row[1], startMs: Int64 = row[2]
            let endMs = max(startMs, row[3] as Int64)
            let distance = (row[4] as Double?).flatMap { $0.isFinite && $0 > 0 ? $0 : nil } ?? 0
            // A gap shorter than rental_keep_s: the car would have been kept, parked.
            if let last = chains.last, last.device == device, startMs - last.endMs < keepMs {
                chains[chains.count - 1].endMs = max(last.endMs, endMs)
                chains[chains.count - 1].distanceM += distance
                chains[chains.count - 1].trips.append(id)
            } else {
                chains.append((device, startMs, endMs, distance, [id]))
            }
        }
        return chains.sorted { ($0.startMs, $0.device) < ($1.startMs, $1.device) }.map { chain in
            // Per started minute, as car-sharing services bill.
            let minutes = Int((chain.endMs - chain.startMs + 59_999) / 60_000)
            let prices = costs.rentals.map { $0.price(minutes: minutes, distanceM: chain.distanceM) }
            var cheapest: Int?
            for (index, price) in prices.enumerated() {
                if let best = cheapest, prices[best] <= price { continue }
                cheapest = index
            }
            return CostReport.Rental(
                device: chain.device, start: msDate(chain.startMs), end: msDate(chain.endMs), minutes: minutes,
                distanceM: chain.distanceM, tripIDs: chain.trips, prices: prices, cheapest: cheapest)
        }
    }

    /// Mixed rent: each rental at its cheapest service.
    static func mixed(_ rentals: [CostReport.Rental]) -> Decimal {
        var total = Decimal(0)
        for rental in rentals {
            if let cheapest = rental.cheapest { total += rental.prices[cheapest] }
        }
        return total
    }

    static func month(of date: Date) -> String {
        let (y, m, _) = RFC3339.civil(fromDays: PeriodQueries.floorDiv(milliseconds(date), PeriodQueries.dayMs))
        return PeriodQueries.pad(y, 4) + "-" + PeriodQueries.pad(m, 2)
    }

    static func json(_ report: CostReport, query: StatsQuery, costs: CostsConfiguration) -> [UInt8] {
        func money(_ value: Decimal) -> JSONValue { .number(Money.double(value)) }
        let names = costs.rentals.map(\.name)
        var writer = JSONWriter(capacity: 1024 + 256 * report.rentals.count)
        writer.beginObject()
        writer.key("currency"); writer.string(report.currency)
        writer.key("device"); writer.optional(query.device)
        writer.key("distance_m"); writer.optional(report.distanceM)
        writer.key("drives"); writer.number(UInt64(report.drives))
        writer.key("from"); writer.optionalTime(ms: query.from.map(milliseconds))
        writer.key("mixed")
        if let mixed = report.mixedTotal {
            writer.beginObject()
            writer.key("services"); writer.value(.array(report.rentals.map { r in r.cheapest.map { .string(names[$0]) } ?? .null }))
            writer.key("total"); writer.value(money(mixed))
            writer.endObject()
        } else {
            writer.value(.null)
        }
        writer.key("own_car")
        writer.beginObject()
        writer.key("by_category"); writer.value(.object(report.byCategory.mapValues(money)))
        writer.key("cost_per_km"); writer.value(report.ownCarCostPerKm.map(money) ?? .null)
        writer.key("expenses"); writer.number(UInt64(report.expenseCount))
        writer.key("total"); writer.value(money(report.ownCarTotal))
        writer.endObject()
        writer.key("rental_keep_s"); writer.optional(costs.rentalKeepS)
        writer.key("rentals")
        writer.beginArray()
        for rental in report.rentals {
            writer.beginObject()
            writer.key("cheapest"); writer.optional(rental.cheapest.map { names[$0] })
            writer.key("device"); writer.string(rental.device)
            writer.key("distance_m"); writer.optional(rental.distanceM)
            writer.key("end_time"); writer.date(rental.end)
            writer.key("minutes"); writer.number(UInt64(rental.minutes))
            writer.key("prices"); writer.value(.object(Dictionary(zip(names, rental.prices.map(money)), uniquingKeysWith: { a, _ in a })))
            writer.key("start_time"); writer.date(rental.start)
            writer.key("trip_ids"); writer.value(.array(rental.tripIDs.map(JSONValue.string)))
            writer.endObject()
        }
        writer.endArray()
        writer.key("services")
        writer.beginArray()
        for (index, service) in report.services.enumerated() {
            writer.beginObject()
            writer.key("name"); writer.string(service.name)
            writer.key("prices"); writer.value(.array(report.rentals.map { money($0.prices[index]) }))
            writer.key("total"); writer.value(money(service.total))
            writer.endObject()
        }
        writer.endArray()
        writer.key("to"); writer.optionalTime(ms: query.to.map(milliseconds))
        writer.endObject()
        return writer.bytes
    }
}
