import Foundation

/// RFC 3339 times as the bus writes them: UTC with milliseconds, `2026-11-21T18:42:54.123Z`.
///
/// Hand-written because `ISO8601DateFormatter` is slow and not `Sendable`, and every message on the
/// bus carries at least one time.
public enum RFC3339 {
    /// Formats `date` in UTC, rounded to the millisecond.
    public static func format(_ date: Date) -> String {
        var out = [UInt8]()
        out.reserveCapacity(24)
        write(date, to: &out)
        return String(decoding: out, as: UTF8.self)
    }

    /// The range RFC 3339 can spell: years 0000 to 9999. Dates outside it are clamped, so that
    /// formatting never traps whatever a client sent.
    static let representableMs: ClosedRange<Double> = -62_167_219_200_000...253_402_300_799_999

    /// Appends the 24 bytes of `format(date)` to `out`, without allocating.
    public static func write(_ date: Date, to out: inout [UInt8]) {
        out.append(addingCapacity: length) { write(date, to: &$0) }
    }

    /// The length of every time it writes.
    static let length = 24

    /// Writes the 24 bytes of `format(date)` into room the caller made.
    static func write(_ date: Date, to out: inout OutputSpan<UInt8>) {
        let milliseconds = (date.timeIntervalSince1970 * 1000).rounded()
        let totalMs = Int64(milliseconds.isNaN ? 0 : min(max(milliseconds, representableMs.lowerBound), representableMs.upperBound))
        let (days, msOfDay) = floorDivMod(totalMs, 86_400_000)
        let (year, month, day) = civil(fromDays: days)
        let seconds = msOfDay / 1000
        digit(year / 1000, to: &out)
        digit(year / 100, to: &out)
        two(year, then: "-", to: &out)
        two(month, then: "-", to: &out)
        two(day, then: "T", to: &out)
        two(seconds / 3600, then: ":", to: &out)
        two(seconds / 60 % 60, then: ":", to: &out)
        two(seconds % 60, then: ".", to: &out)
        let millisecond = msOfDay % 1000
        digit(millisecond / 100, to: &out)
        two(millisecond, then: "Z", to: &out)
    }

    // Each digit by a constant divisor, which the compiler turns into a multiplication.
    @inline(__always)
    private static func digit(_ value: Int64, to out: inout OutputSpan<UInt8>) {
        out.append(UInt8(ascii: "0") + UInt8(value % 10))
    }

    @inline(__always)
    private static func two(_ value: Int64, then separator: Unicode.Scalar, to out: inout OutputSpan<UInt8>) {
        digit(value / 10, to: &out)
        digit(value, to: &out)
        out.append(UInt8(ascii: separator))
    }

    /// Parses an RFC 3339 date-time with any offset (`Z`, `+02:00`, `-0530`) and an optional
    /// fraction, to the millisecond. Returns `nil` for anything else, including impossible dates.
    public static func parse(_ text: some StringProtocol) -> Date? {
        parse(utf8: Array(text.utf8)[...])
    }

    /// The usual case, without the generic one's lookups from other modules.
    public static func parse(_ text: String) -> Date? {
        parse(utf8: Array(text.utf8)[...])
    }

    public static func parse(utf8 text: ArraySlice<UInt8>) -> Date? {
        var scanner = Scanner(text)
        guard let year = scanner.digits(4), scanner.skip("-"),
              let month = scanner.digits(2), scanner.skip("-"),
              let day = scanner.digits(2),
              scanner.skip("T") || scanner.skip("t") || scanner.skip(" "),
              let hour = scanner.digits(2), scanner.skip(":"),
              let minute = scanner.digits(2), scanner.skip(":"),
              let second = scanner.digits(2)
        else { return nil }
        guard (1...12).contains(month), (1...daysIn(month: month, year: year)).contains(day),
              hour < 24, minute < 60, second <= 60
        else { return nil }
        var milliseconds: Int64 = 0
        if scanner.skip(".") {
            var scale: Int64 = 100
            var count = 0
            var roundUp = false
            while let digit = scanner.digit() {
                if count < 3 {
                    milliseconds += Int64(digit) * scale
                    scale /= 10
                } else if count == 3 {
                    roundUp = digit >= 5
                }
                count += 1
            }
            guard count > 0 else { return nil }
            if roundUp { milliseconds += 1 }
        }
        var offsetSeconds = 0
        if scanner.skip("Z") || scanner.skip("z") {
            offsetSeconds = 0
        } else if let sign = scanner.sign() {
            guard let offsetHours = scanner.digits(2) else { return nil }
            _ = scanner.skip(":")
            guard let offsetMinutes = scanner.digits(2), offsetHours < 24, offsetMinutes < 60 else { return nil }
            offsetSeconds = sign * (offsetHours * 3600 + offsetMinutes * 60)
        } else {
            return nil
        }
        guard scanner.atEnd else { return nil }
        // A leap second is folded into the second before it.
        let seconds = Int64(days(fromYear: year, month: month, day: day)) * 86_400
            + Int64(hour * 3600 + minute * 60 + min(second, 59) - offsetSeconds)
        return Date(timeIntervalSince1970: Double(seconds * 1000 + milliseconds) / 1000)
    }

    // MARK: Calendar arithmetic (Howard Hinnant's days-from-civil algorithms)

    public static func days(fromYear year: Int, month: Int, day: Int) -> Int {
        let y = month <= 2 ? year - 1 : year
        let era = (y >= 0 ? y : y - 399) / 400
        let yearOfEra = y - era * 400
        let dayOfYear = (153 * (month + (month > 2 ? -3 : 9)) + 2) / 5 + day - 1
        let dayOfEra = yearOfEra * 365 + yearOfEra / 4 - yearOfEra / 100 + dayOfYear
        return era * 146_097 + dayOfEra - 719_468
    }

    public static func civil(fromDays days: Int64) -> (year: Int64, month: Int64, day: Int64) {
        let z = days + 719_468
        let era = (z >= 0 ? z : z - 146_096) / 146_097
        let dayOfEra = z - era * 146_097
        let yearOfEra = (dayOfEra - dayOfEra / 1460 + dayOfEra / 36524 - dayOfEra / 146_096) / 365
        let dayOfYear = dayOfEra - (365 * yearOfEra + yearOfEra / 4 - yearOfEra / 100)
        let mp = (5 * dayOfYear + 2) / 153
        let day = dayOfYear - (153 * mp + 2) / 5 + 1
        let month = mp < 10 ? mp + 3 : mp - 9
        return (yearOfEra + era * 400 + (month <= 2 ? 1 : 0), month, day)
    }

    static func daysIn(month: Int, year: Int) -> Int {
        switch month {
        case 2: (year % 4 == 0 && year % 100 != 0) || year % 400 == 0 ? 29 : 28
        case 4, 6, 9, 11: 30
        default: 31
        }
    }

    private static func floorDivMod(_ a: Int64, _ b: Int64) -> (Int64, Int64) {
        let q = a / b, r = a % b
        return r < 0 ? (q - 1, r + b) : (q, r)
    }

    private struct Scanner {
        let bytes: ArraySlice<UInt8>
        var index: Int
        init(_ bytes: ArraySlice<UInt8>) {
            self.bytes = bytes
            index = bytes.startIndex
        }

        var atEnd: Bool { index == bytes.endIndex }

        mutating func skip(_ character: Unicode.Scalar) -> Bool {
            guard index < bytes.endIndex, bytes[index] == UInt8(ascii: character) else { return false }
            index += 1
            return true
        }

        mutating func digit() -> Int? {
            guard index < bytes.endIndex, (48...57).contains(bytes[index]) else { return nil }
            defer { index += 1 }
            return Int(bytes[index] - 48)
        }

        mutating func digits(_ count: Int) -> Int? {
            var value = 0
            for _ in 0..<count {
                guard let digit = digit() else { return nil }
                value = value * 10 + digit
            }
            return value
        }

        mutating func sign() -> Int? {
            if skip("+") { return 1 }
            if skip("-") { return -1 }
            return nil
        }
    }
}
