import DrivebusSchema
import DrivebusTestSupport
import Foundation
import Hummingbird
import HummingbirdTesting
import StatsCore
import StatsStore
import StatsHTTP
import Testing

// Prices below are worked out by hand from docs/costs.md, to the cent.

/// The tariff from the issue.
let issue9Citycar = CostsConfiguration.Rental(
    name: "citycar", startFee: 0.5, perMinute: 0.17, perKm: 0.25, perHourCap: 9.99, perDayCap: 39.0, minFee: 2.0)
/// Cheaper by the minute, dearer by the km, no hourly cap, a higher daily cap.
let issue9Weekender = CostsConfiguration.Rental(name: "weekender", perMinute: 0.09, perKm: 0.35, perDayCap: 49)

func issue9Costs() -> CostsConfiguration {
    CostsConfiguration(
        currency: "EUR", rentalKeepS: 7200,
        ownCar: .init(expenses: [
            .init(date: "2025-03-10", category: "fuel", amount: 62.40),
            .init(date: "2025-12-31", category: "value_drop", amount: 1800),
        ]),
        rentals: [issue9Citycar, issue9Weekender])
}

func issue9Money(_ text: String) -> Decimal { Decimal(string: text)! }

func issue9Trip(_ id: String, device: String = "car", _ start: String, _ end: String, metres: Double) -> StoredEvent {
    statsEvent("trip.ended", id: "ev-" + id, device: device, statsJSON([
        "trip_id": id, "device": device, "start_time": start, "end_time": end, "distance_m": metres, "track": [] as [Any],
    ] as [String: Any]))
}

/// Rentals, in start order:
/// 1. car A+B: 08:00:00–09:50:30 (70 min parked between), 111 started minutes, 20 km
/// 2. van G:   08:30–08:40, 10 min, 3 km (another car: never chained with car's trips)
/// 3. car C:   14:00–14:05, 5 min, 1.5 km (4 h after B: a new rental)
/// 4. car D+E+F: 07:00–13:00 next day, 360 min, 120 km (gaps of 119 and 90 min)
/// 5. car I:   15:00–15:10, 10 min, 2 km (exactly rental_keep_s after F: not shorter, so new)
func issue9CostStore(_ scratch: StatsScratch) throws -> StatsStore {
    let store = try StatsStore(.init(path: scratch.database))
    try statsStoreSync(store, [
        issue9Trip("A", "2025-03-10T08:00:00Z", "2025-03-10T08:20:00Z", metres: 12_000),
        issue9Trip("B", "2025-03-10T09:30:00Z", "2025-03-10T09:50:30Z", metres: 8_000),
        issue9Trip("G", device: "van", "2025-03-10T08:30:00Z", "2025-03-10T08:40:00Z", metres: 3_000),
        issue9Trip("C", "2025-03-10T14:00:00Z", "2025-03-10T14:05:00Z", metres: 1_500),
        issue9Trip("D", "2025-03-11T07:00:00Z", "2025-03-11T08:00:00Z", metres: 50_000),
        issue9Trip("E", "2025-03-11T09:59:00Z", "2025-03-11T11:00:00Z", metres: 60_000),
        issue9Trip("F", "2025-03-11T12:30:00Z", "2025-03-11T13:00:00Z", metres: 10_000),
        issue9Trip("I", "2025-03-11T15:00:00Z", "2025-03-11T15:10:00Z", metres: 2_000),
        // February: outside the range asked about.
        issue9Trip("Z", "2025-02-27T10:00:00Z", "2025-02-27T10:30:00Z", metres: 9_000),
    ])
    return store
}

@Suite struct StatsCostsTests {
    @Test func priceFormulaToTheCent() {
        let cases: [(minutes: Int, metres: Double, citycar: String, weekender: String, why: String)] = [
            // 0.5 + 10 × 0.17 + 4 × 0.25 = 3.20 | 0.90 + 1.40
            (10, 4_000, "3.2", "2.3", "plain"),
            // 0.5 + 0.34 + 0.125 = 0.965 → min fee 2.00 | 0.18 + 0.175 = 0.355 → 0.36
            (2, 500, "2", "0.36", "minimum fee"),
            // hour 1: min(10.20, 9.99) + 30 × 0.17 = 5.10 → 15.09; + 0.5 + 7.50 = 23.09 | 8.10 + 10.50
            (90, 30_000, "23.09", "18.6", "hour cap, then a partial hour"),
            // 9.99 + 0.17 + 0.5 = 10.66 | 5.49
            (61, 0, "10.66", "5.49", "one minute into the second hour"),
            // 5 × 9.99 + 0.5 + 25 = 75.45 → day cap 39 | 27 + 35 = 62 → 49
            (300, 100_000, "39", "49", "day cap"),
            // 25 h: 249.75 + 0.5 + 2.5 = 252.75 → 2 started days × 39 = 78 | 135 + 3.5 → 2 × 49 = 98
            (1_500, 10_000, "78", "98", "two started days"),
            // 1440 min is one day exactly: 24 × 9.99 + 0.5 = 240.26 → 39 | 129.6 → 49
            (1_440, 0, "39", "49", "exactly one day"),
            // 0.5 + 3.40 + 2.02 × 0.25 = 0.505 → 4.405 → 4.41 (half away from zero; Double would say 4.40)
            (20, 2_020, "4.41", "2.51", "half a cent rounds up"),
            // 0.5 + 2.21 + 3.08625 = 5.79625 → 5.80 | 1.17 + 4.32075 = 5.49075 → 5.49
            (13, 12_345, "5.8", "5.49", "fractions of a cent"),
            // nothing at all: minimum fee | 0
            (0, 0, "2", "0", "empty rental"),
        ]
        for item in cases {
            #expect(issue9Citycar.price(minutes: item.minutes, distanceM: item.metres) == issue9Money(item.citycar), "citycar: \(item.why)")
            #expect(issue9Weekender.price(minutes: item.minutes, distanceM: item.metres) == issue9Money(item.weekender), "weekender: \(item.why)")
        }
        // Nonsense never crashes: negative or non-finite inputs count as nothing.
        #expect(issue9Citycar.price(minutes: -5, distanceM: -.infinity) == issue9Money("2"))
        #expect(issue9Weekender.price(minutes: 10, distanceM: .nan) == issue9Money("0.9"))
    }

    @Test func chainedRentalsAndMixedRent() async throws {
        let scratch = StatsScratch()
        let store = try issue9CostStore(scratch)
        let query = try StatsQuery.parse(StatsParameters(query: "from=2025-03-01&to=2025-03-31"))
        let report = try await store.costs(query, configuration: issue9Costs())

        #expect(report.rentals.map(\.tripIDs) == [["A", "B"], ["G"], ["C"], ["D", "E", "F"], ["I"]])
        #expect(report.rentals.map(\.minutes) == [111, 10, 5, 360, 10])
        #expect(report.rentals.map(\.distanceM) == [20_000, 3_000, 1_500, 120_000, 2_000])
        // citycar: 1: 9.99 + 51 × 0.17 + 0.5 + 20 × 0.25 = 24.16; 2: 0.5 + 1.70 + 0.75 = 2.95;
        // 3: 1.725 → min 2.00; 4: 90.44 → day cap 39.00; 5: 0.5 + 1.70 + 0.50 = 2.70.
        #expect(report.rentals.map { $0.prices[0] } == ["24.16", "2.95", "2", "39", "2.7"].map(issue9Money))
        // weekender: 1: 9.99 + 7.00 = 16.99; 2: 0.90 + 1.05 = 1.95; 3: 0.45 + 0.525 = 0.975 → 0.98;
        // 4: 32.40 + 42.00 = 74.40 → day cap 49.00; 5: 0.90 + 0.70 = 1.60.
        #expect(report.rentals.map { $0.prices[1] } == ["16.99", "1.95", "0.98", "49", "1.6"].map(issue9Money))
        #expect(report.services.map(\.total) == [issue9Money("70.81"), issue9Money("70.52")])
        // Mixed rent: weekender except for the long day, where citycar's day cap wins.
        #expect(report.rentals.map(\.cheapest) == [1, 1, 1, 0, 1])
        #expect(report.mixedTotal == issue9Money("60.52"))

        // The own car: fuel from the config (the value drop is in December) and nothing posted yet.
        #expect(report.ownCarTotal == issue9Money("62.4"))
        #expect(report.distanceM == 146_500 && report.drives == 8)
        // 62.40 / 146.5 km = 0.42594 → 0.426
        #expect(report.ownCarCostPerKm == issue9Money("0.426"))

        // One device: the van's rental is left out.
        let car = try await store.costs(StatsQuery(device: "car", from: query.from, to: query.to), configuration: issue9Costs())
        #expect(car.rentals.count == 4 && car.services[0].total == issue9Money("67.86") && car.mixedTotal == issue9Money("58.57"))
    }

    @Test func rentalKeepDecidesTheChains() async throws {
        let scratch = StatsScratch()
        let store = try issue9CostStore(scratch)
        let query = StatsQuery(device: "car", from: statsTime("2025-03-10T00:00:00Z"), to: statsTime("2025-03-11T00:00:00Z"))
        var costs = issue9Costs()
        costs.rentalKeepS = 0
        // Every trip is its own rental: A 20 min 12 km, B 20.5 → 21 min 8 km, C.
        let apart = try await store.costs(query, configuration: costs)
        #expect(apart.rentals.map(\.minutes) == [20, 21, 5])
        // citycar: 0.5 + 3.40 + 3.00 = 6.90; 0.5 + 3.57 + 2.00 = 6.07; 2.00
        #expect(apart.services[0].total == issue9Money("14.97"))
        costs.rentalKeepS = 86_400
        let together = try await store.costs(query, configuration: costs)
        // 08:00:00–14:05:00 = 365 min, 21.5 km: 6 × 9.99 + 5 × 0.17 + 0.5 + 5.375 = 66.665 → cap 39
        #expect(together.rentals.map(\.minutes) == [365] && together.services[0].total == issue9Money("39"))
    }

    @Test func postedExpensesJoinTheLedgerAndBadRowsStoreNothing() async throws {
        let scratch = StatsScratch()
        let store = try issue9CostStore(scratch)
        let app = Application(router: makeStatsRouter(store: store, configuration: .init(costs: issue9Costs())))
        try await app.test(.router) { client in
            let csv = "date,category,amount\n2025-03-01,insurance,45.10\n\"2025-03-02\",\"parking, garage\",\"3.50\"\n"
            try await client.execute(uri: "/api/v1/costs/expenses", method: .post, headers: [.contentType: "text/csv"], body: ByteBuffer(string: csv)) { response in
                #expect(response.status == .ok)
                let json = statsParse(String(buffer: response.body))
                #expect(json.stats("added")?.statsNumber == 2 && json.stats("stored")?.statsNumber == 2)
            }
            // The same ledger again adds nothing.
            try await client.execute(uri: "/api/v1/costs/expenses", method: .post, headers: [.contentType: "text/csv"], body: ByteBuffer(string: csv)) { response in
                #expect(statsParse(String(buffer: response.body)).stats("unchanged")?.statsNumber == 2)
            }
            let body = #"{"expenses":[{"date":"2025-03-15","category":"tax","amount":"12.35"},{"date":"2025-03-16","category":"wash","amount":8}]}"#
            try await client.execute(uri: "/api/v1/costs/expenses", method: .post, headers: [.contentType: "application/json"], body: ByteBuffer(string: body)) { response in
                #expect(statsParse(String(buffer: response.body)).stats("added")?.statsNumber == 2)
            }
            // Bad rows: 400 naming the row and field, and none of the good rows before them is stored.
            let bad: [(String, String, Int, String)] = [
                ("text/csv", "date,category,amount\n2025-03-20,fuel,50\n2025-03-21,fuel,12.5x\n", 3, "amount"),
                ("text/csv", "2025-03-20,fuel,50\n2025-02-30,fuel,10\n", 2, "date"),
                ("text/csv", "2025-03-20,fuel\n", 1, "row"),
                ("text/csv", "date,what,amount\n2025-03-20,fuel,50\n", 1, "header"),
                ("application/json", #"{"expenses":[{"date":"2025-03-20","category":"fuel","amount":50},{"date":"20.3.2025","category":"fuel","amount":1}]}"#, 2, "date"),
                ("application/json", #"{"expenses":[{"date":"2025-03-20","category":"","amount":50}]}"#, 1, "category"),
                ("application/json", #"{"expenses":[{"date":"2025-03-20","category":"fuel","amount":"lots"}]}"#, 1, "amount"),
                ("application/json", #"{"expenses":[{"date":"2025-03-20","category":"fuel"}]}"#, 1, "amount"),
                ("application/json", #"{"expenses":[{"date":"2025-03-20","category":"fuel","amount":1e300}]}"#, 1, "amount"),
            ]
            for (type, text, row, field) in bad {
                try await client.execute(uri: "/api/v1/costs/expenses", method: .post, headers: [.contentType: type], body: ByteBuffer(string: text)) { response in
                    #expect(response.status == .badRequest, "\(text)")
                    let json = statsParse(String(buffer: response.body))
                    #expect(json.stats("error", "code")?.statsString == "stats.invalid_expense", "\(text)")
                    #expect(json.stats("error", "row")?.statsNumber == Double(row), "\(text)")
                    #expect(json.stats("error", "field")?.statsString == field, "\(text)")
                }
            }
            for text in ["", "date,category,amount\n", "{\"expenses\":7}", "{nope"] {
                try await client.execute(uri: "/api/v1/costs/expenses", method: .post, body: ByteBuffer(string: text)) { response in
                    #expect(response.status == .badRequest, "\(text)")
                    #expect(statsParse(String(buffer: response.body)).stats("error", "code")?.statsString == "stats.invalid_body")
                }
            }
            try await client.execute(uri: "/api/v1/costs/expenses?from=2025-03-01&to=2025-03-31", method: .get) { response in
                let json = statsParse(String(buffer: response.body))
                #expect(json.stats("expenses")?.statsArray.count == 5)
                // 45.10 + 3.50 + 62.40 + 12.35 + 8
                #expect(json.stats("total")?.statsNumber == 131.35)
            }
            try await client.execute(uri: "/api/v1/costs?from=2025-03-01&to=2025-03-31", method: .get) { response in
                #expect(response.status == .ok)
                let json = statsParse(String(buffer: response.body))
                #expect(json.stats("own_car", "total")?.statsNumber == 131.35)
                #expect(json.stats("own_car", "by_category", "parking, garage")?.statsNumber == 3.5)
                // 131.35 / 146.5 = 0.89659 → 0.897
                #expect(json.stats("own_car", "cost_per_km")?.statsNumber == 0.897)
                #expect(json.stats("services", 0, "name")?.statsString == "citycar")
                #expect(json.stats("services", 0, "total")?.statsNumber == 70.81)
                #expect(json.stats("services", 1, "prices")?.statsArray.compactMap(\.statsNumber) == [16.99, 1.95, 0.98, 49, 1.6])
                #expect(json.stats("mixed", "total")?.statsNumber == 60.52)
                #expect(json.stats("mixed", "services", 3)?.statsString == "citycar")
                #expect(json.stats("rentals", 0, "trip_ids", 1)?.statsString == "B")
                #expect(json.stats("rentals", 0, "prices", "weekender")?.statsNumber == 16.99)
                #expect(json.stats("rentals", 0, "minutes")?.statsNumber == 111)
            }
            try await client.execute(uri: "/api/v1/costs?from=tomorrow", method: .get) { response in
                #expect(response.status == .badRequest)
                #expect(statsParse(String(buffer: response.body)).stats("error", "field")?.statsString == "from")
            }
        }
    }

    @Test func configurationProblemsNameTheKey() {
        #expect(throws: Never.self) { try issue9Costs().validate() }
        func problem(_ change: (inout CostsConfiguration) -> Void) -> String? {
            var costs = issue9Costs()
            change(&costs)
            do { try costs.validate() } catch { return error.path }
            return nil
        }
        #expect(problem { $0.rentals[1].perMinute = -0.1 } == "costs.rentals[1].per_minute")
        #expect(problem { $0.rentals[0].perHourCap = 0 } == "costs.rentals[0].per_hour_cap")
        #expect(problem { $0.rentals[0].perDayCap = .nan } == "costs.rentals[0].per_day_cap")
        #expect(problem { $0.rentals[1].name = "citycar" } == "costs.rentals[1].name")
        #expect(problem { $0.ownCar.expenses[1].date = "31.12.2025" } == "costs.own_car.expenses[1].date")
        #expect(problem { $0.ownCar.expenses[0].amount = .infinity } == "costs.own_car.expenses[0].amount")
        #expect(problem { $0.rentalKeepS = -1 } == "costs.rental_keep_s")
        #expect(problem { $0.currency = "" } == "costs.currency")
    }
}
