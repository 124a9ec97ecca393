import DrivebusSchema
import Foundation

/// The `costs:` section: the own car's ledger and the car-sharing tariffs it is compared with.
/// See docs/costs.md for the price formula.
public struct CostsConfiguration: Sendable, Equatable {
    /// One line of the own car's ledger: fuel, insurance, tax, repairs, value drop…
    public struct Expense: Sendable, Equatable {
        /// A UTC day, `YYYY-MM-DD`.
        public var date: String
        public var category: String
        /// In `currency`; negative for money back (a refund, the sale of the car).
        public var amount: Double

        public init(date: String, category: String, amount: Double) {
            self.date = date
            self.category = category
            self.amount = amount
        }
    }

    public struct OwnCar: Sendable, Equatable {
        public var expenses: [Expense]
        public init(expenses: [Expense] = []) { self.expenses = expenses }
    }

    /// One car-sharing service's tariff, in `currency`.
    public struct Rental: Sendable, Equatable {
        public var name: String
        public var startFee: Double
        /// Per started minute.
        public var perMinute: Double
        public var perKm: Double
        /// The time part of each started hour costs at most this.
        public var perHourCap: Double?
        /// The whole rental costs at most this per started day (24 h from its start).
        public var perDayCap: Double?
        public var minFee: Double

        public init(
            name: String, startFee: Double = 0, perMinute: Double = 0, perKm: Double = 0,
            perHourCap: Double? = nil, perDayCap: Double? = nil, minFee: Double = 0
        ) {
            self.name = name
            self.startFee = startFee
            self.perMinute = perMinute
            self.perKm = perKm
            self.perHourCap = perHourCap
            self.perDayCap = perDayCap
            self.minFee = minFee
        }
    }

    /// A value that cannot be used, with its YAML key path (`costs.rentals[0].per_minute`).
    public struct Problem: Error, Sendable, Equatable, CustomStringConvertible {
        public let path: String
        public let reason: String
        public var description: String { "\(path): \(reason)" }
    }

    public var currency: String
    /// Drives closer together than this are one rental: you would have kept the car.
    public var rentalKeepS: Double
    public var ownCar: OwnCar
    public var rentals: [Rental]

    public init(currency: String = "EUR", rentalKeepS: Double = 7200, ownCar: OwnCar = .init(), rentals: [Rental] = []) {
        self.currency = currency
        self.rentalKeepS = rentalKeepS
        self.ownCar = ownCar
        self.rentals = rentals
    }

    /// Refuses what the price formula cannot use, naming the key; call it when loading the config.
    public func validate() throws(Problem) {
        guard (1...16).contains(currency.count), !currency.unicodeScalars.contains(where: { $0.value < 0x20 }) else {
            throw Problem(path: "costs.currency", reason: "must be 1 to 16 printable characters, such as EUR")
        }
        guard rentalKeepS.isFinite, (0...2_592_000).contains(rentalKeepS) else {
            throw Problem(path: "costs.rental_keep_s", reason: "must be from 0 to 2592000 (30 days)")
        }
        for (index, expense) in ownCar.expenses.enumerated() {
            if let (field, reason) = LedgerRules.problem(date: expense.date, category: expense.category, amount: expense.amount) {
                throw Problem(path: "costs.own_car.expenses[\(index)].\(field)", reason: reason)
            }
        }
        var names = Set<String>()
        for (index, rental) in rentals.enumerated() {
            let path = "costs.rentals[\(index)]"
            guard (1...64).contains(rental.name.count), !rental.name.unicodeScalars.contains(where: { $0.value < 0x20 }) else {
                throw Problem(path: path + ".name", reason: "must be 1 to 64 printable characters")
            }
            guard names.insert(rental.name).inserted else { throw Problem(path: path + ".name", reason: "\"\(rental.name)\" is used twice") }
            let rates: [(String, Double?, Bool)] = [
                ("start_fee", rental.startFee, true), ("per_minute", rental.perMinute, true), ("per_km", rental.perKm, true),
                ("per_hour_cap", rental.perHourCap, false), ("per_day_cap", rental.perDayCap, false), ("min_fee", rental.minFee, true),
            ]
            for (key, value, zeroAllowed) in rates {
                guard let value else { continue }
                guard value.isFinite, value <= 1_000_000, zeroAllowed ? value >= 0 : value > 0 else {
                    throw Problem(path: path + "." + key, reason: zeroAllowed ? "must be from 0 to 1000000" : "must be above 0 and at most 1000000")
                }
            }
        }
    }
}

extension CostsConfiguration.Rental {
    /// The price of one rental of `minutes` started minutes and `distanceM` metres, to the cent
    /// (docs/costs.md): start fee + time + distance; the time part capped per started hour, the
    /// whole capped per started day, and at least the minimum fee.
    public func price(minutes: Int, distanceM: Double) -> Decimal {
        let minutes = max(0, minutes)
        let perMinute = Money.decimal(self.perMinute)
        var time: Decimal
        if let cap = perHourCap.map(Money.decimal) {
            // Each started hour's minutes cost at most the cap.
            let hours = minutes / 60, rest = minutes % 60
            time = Decimal(hours) * min(60 * perMinute, cap) + min(Decimal(rest) * perMinute, cap)
        } else {
            time = Decimal(minutes) * perMinute
        }
        let km = Money.decimal(distanceM.isFinite ? max(0, distanceM) : 0) / 1000
        var total = Money.decimal(startFee) + time + Money.decimal(perKm) * km
        if let cap = perDayCap.map(Money.decimal) {
            let days = max(1, (minutes + 1439) / 1440)
            total = min(total, Decimal(days) * cap)
        }
        return Money.cents(max(total, Money.decimal(minFee)))
    }
}

/// Money is `Decimal`: tariffs like 0.17 are exact, so hand-computed prices match to the cent.
package enum Money {
    /// The decimal a `Double` was written as (its shortest round-trip spelling): 0.17 is 0.17.
    package static func decimal(_ value: Double) -> Decimal {
        guard value.isFinite else { return 0 }
        return Decimal(string: Decimal64.text(value)) ?? 0
    }

    /// Rounded to the cent, halves away from zero (commercial rounding).
    package static func cents(_ value: Decimal) -> Decimal { round(value, places: 2) }

    package static func round(_ value: Decimal, places: Int) -> Decimal {
        var input = value, output = Decimal()
        NSDecimalRound(&output, &input, places, .plain)
        return output
    }

    /// For JSON: the `Double` whose shortest spelling is the decimal's (12.3 for 12.30).
    package static func double(_ value: Decimal) -> Double { Double(value.description) ?? 0 }

    /// A strict decimal: `-?[0-9]+(.[0-9]+)?`, at most 18 digits. (`Decimal(string:)` would take
    /// "12abc" as 12.)
    package static func parse(_ text: String) -> Decimal? {
        var digits = 0, sawPoint = false, afterPoint = 0
        for (offset, byte) in text.utf8.enumerated() {
            switch byte {
            case UInt8(ascii: "-") where offset == 0: continue
            case UInt8(ascii: "0")...UInt8(ascii: "9"):
                digits += 1
                if sawPoint { afterPoint += 1 }
            case UInt8(ascii: ".") where !sawPoint && digits > 0: sawPoint = true
            default: return nil
            }
        }
        guard digits > 0, digits <= 18, !sawPoint || afterPoint > 0 else { return nil }
        return Decimal(string: text)
    }
}


/// What the own car's ledger accepts, for the config and for posted rows alike.
package enum LedgerRules {
    /// Days since 1970 of a strict `YYYY-MM-DD` from 1970 to 9999; nil otherwise.
    package static func day(_ text: String) -> Int64? {
        let bytes = Array(text.utf8)
        guard bytes.count == 10, bytes[4] == UInt8(ascii: "-"), bytes[7] == UInt8(ascii: "-") else { return nil }
        func number(_ range: Range<Int>) -> Int? {
            var value = 0
            for byte in bytes[range] {
                guard (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(byte) else { return nil }
                value = value * 10 + Int(byte - UInt8(ascii: "0"))
            }
            return value
        }
        guard let year = number(0..<4), let month = number(5..<7), let day = number(8..<10),
              (1970...9999).contains(year), (1...12).contains(month), (1...31).contains(day) else { return nil }
        let days = Int64(RFC3339.days(fromYear: year, month: month, day: day))
        // February 30 comes back as March 2: refused.
        let civil = RFC3339.civil(fromDays: days)
        guard civil.month == Int64(month), civil.day == Int64(day) else { return nil }
        return days
    }

    /// Why a row cannot be in the ledger, as (field, reason); nil when it can.
    package static func problem(date: String, category: String, amount: Double) -> (String, String)? {
        if day(date) == nil { return ("date", "must be a date YYYY-MM-DD from 1970 to 9999, got \"\(date.prefix(40))\"") }
        if let reason = categoryProblem(category) { return ("category", reason) }
        if !amount.isFinite || abs(amount) > 1e9 { return ("amount", "must be a number from -1000000000 to 1000000000") }
        return nil
    }

    package static func categoryProblem(_ category: String) -> String? {
        guard (1...64).contains(category.count), !category.unicodeScalars.contains(where: { $0.value < 0x20 }),
              category.trimmingCharacters(in: .whitespaces) == category else {
            return "must be 1 to 64 printable characters without surrounding spaces"
        }
        return nil
    }
}
