import DrivebusConfiguration
import DrivebusJournal
import DrivebusSchema
import DrivebusTrackFormats
import Foundation
import Synchronization

/// One fix as a client described it, with the client's own field names kept for error messages,
/// before validation.
struct RawFix {
    struct Value<T> {
        var value: T
        /// Where the value was, kept in two parts and joined only for an error message: joining
        /// them for every field of every fix was a measurable share of ingest's time.
        private let path: String
        private let key: String

        var field: String { path.isEmpty ? key : "\(path).\(key)" }

        init(value: T, field: String) {
            self.init(value: value, path: "", key: field)
        }

        init(value: T, path: String, key: String) {
            self.value = value
            self.path = path
            self.key = key
        }

        /// The same field, converted (km/h to m/s, percent to a fraction).
        func map<U>(_ transform: (T) -> U) -> Value<U> { Value<U>(value: transform(value), path: path, key: key) }
    }

    var time: Value<Date>
    var lat: Value<Double>
    var lon: Value<Double>
    var accuracyM: Value<Double>?
    var altitudeM: Value<Double>?
    var speedMps: Value<Double>?
    var courseDeg: Value<Double>?
    /// 0–1; percentages are converted before they get here.
    var battery: Value<Double>?
    var meta: [String: String] = [:]
}

/// Optional readings left out of fixes, by reading and reason: an impossible value (a speed of
/// 9001 m/s) or a client's placeholder for "unknown" (GPSLogger's 0). The fix itself is kept.
public final class DroppedReadings: Sendable {
    private let counts = Mutex<[String: UInt64]>([:])

    public init() {}

    func count(_ reading: String, _ reason: String) {
        counts.withLock { $0["dropped_readings.\(reading).\(reason)", default: 0] += 1 }
    }

    /// `dropped_readings.<reading>.<impossible|placeholder>` → count since start, for heartbeats.
    public var snapshot: [String: UInt64] { counts.withLock { $0 } }
}

/// The rules every fix passes, whatever client it came from. Time and position must be valid or
/// the fix is refused; an optional reading that is impossible is left out and counted.
package struct Normalizer: Sendable {
    /// Fixes from before this are refused: no phone app predates it, and it catches epoch-zero clocks.
    static let earliest = Date(timeIntervalSince1970: 946_684_800)  // 2000-01-01
    static let maxFutureS: TimeInterval = 86_400

    let now: @Sendable () -> Date
    let dropped: DroppedReadings

    /// Why a fix's time, latitude or longitude is refused, if it is: the one rule, for ingest and
    /// for `drivebus import`, which leaves such a fix out before it sends (a refused batch's good
    /// fixes, sent again one by one, would arrive after later batches, older than what the
    /// consumers already have, and trips would drop them).
    package static func refusal(time: Date, lat: Double, lon: Double, now: Date) -> (field: String, message: String)? {
        if let problem = timeProblem(time, now: now) { return ("time", problem) }
        if let problem = latitudeProblem(lat) { return ("lat", problem) }
        if let problem = longitudeProblem(lon) { return ("lon", problem) }
        return nil
    }

    static func timeProblem(_ time: Date, now: Date) -> String? {
        if time < earliest { return "time \(RFC3339.format(time)) is before 2000" }
        if time.timeIntervalSince(now) > maxFutureS { return "time \(RFC3339.format(time)) is more than 1 day in the future" }
        return nil
    }

    static func latitudeProblem(_ lat: Double) -> String? {
        guard lat.isFinite else { return "must be a finite number" }
        return (-90...90).contains(lat) ? nil : "latitude must be from -90 to 90, got \(lat)"
    }

    static func longitudeProblem(_ lon: Double) -> String? {
        guard lon.isFinite else { return "must be a finite number" }
        return (-180...180).contains(lon) ? nil : "longitude must be from -180 to 180, got \(lon)"
    }

    func fix(_ raw: RawFix, device: String, source: FixSource) throws(IngestError) -> Fix {
        try checkTime(raw.time.value, field: raw.time.field)
        if let problem = Self.latitudeProblem(raw.lat.value) { throw .invalid(raw.lat.field, problem) }
        if let problem = Self.longitudeProblem(raw.lon.value) { throw .invalid(raw.lon.field, problem) }
        let (lat, lon) = (raw.lat.value, raw.lon.value)
        // Negative accuracy, speed, course or battery is how clients say "not known". A reading no
        // phone can produce is left out (and counted): the position is still worth keeping.
        // Accuracy 0 m is impossible too: it is a placeholder.
        let accuracy = reading(raw.accuracyM, "accuracy_m", valid: 0...1_000_000).flatMap { value -> Double? in
            guard value == 0 else { return value }
            dropped.count("accuracy_m", "placeholder")
            return nil
        }
        let altitude = reading(raw.altitudeM, "altitude_m", valid: -1_000...100_000, negativeIsUnknown: false)
        let speed = reading(raw.speedMps, "speed_mps", valid: 0...1_000)
        let course = reading(raw.courseDeg, "course_deg", valid: 0...360).map { $0 == 360 ? 0 : $0 }
        let battery = reading(raw.battery, "battery", valid: 0...1)
        return Fix(
            device: device, time: Self.milliseconds(raw.time.value), lat: lat, lon: lon, accuracyM: accuracy,
            altitudeM: altitude, speedMps: speed, courseDeg: course, battery: battery, source: source,
            meta: raw.meta.isEmpty ? nil : raw.meta)
    }

    func checkTime(_ time: Date, field: String) throws(IngestError) {
        if let problem = Self.timeProblem(time, now: now()) { throw .invalid(field, problem) }
    }

    /// Times travel at millisecond precision, so that a fix reads back exactly as it was stored.
    static func milliseconds(_ time: Date) -> Date {
        Date(timeIntervalSince1970: (time.timeIntervalSince1970 * 1000).rounded() / 1000)
    }

    /// An optional reading, or nil when it is absent, negative (unknown, for most readings) or
    /// impossible (non-finite or outside `valid`; counted).
    private func reading(_ value: RawFix.Value<Double>?, _ name: String, valid: ClosedRange<Double>, negativeIsUnknown: Bool = true) -> Double? {
        guard let value = value?.value else { return nil }
        if negativeIsUnknown, value < 0, value.isFinite { return nil }
        guard value.isFinite, valid.contains(value) else {
            dropped.count(name, "impossible")
            return nil
        }
        return value
    }

    /// Client timestamps: epoch seconds, epoch milliseconds (above 2147483647), RFC 3339 / ISO 8601
    /// with any offset, or `yyyy-MM-dd HH:mm:ss` in UTC.
    static func parseTime(_ text: String, field: @autoclosure () -> String) throws(IngestError) -> Date {
        let trimmed = trimmingWhitespace(text)
        // Digits and a point only: a date is not handed to `Double` first, which copies it.
        if trimmed.utf8.allSatisfy({ (UInt8(ascii: "0")...UInt8(ascii: "9")).contains($0) || $0 == UInt8(ascii: ".") }), let number = Double(trimmed) {
            let seconds = number > 2_147_483_647 ? number / 1000 : number
            // Beyond year 9999 even as milliseconds: not a time any client meant.
            guard seconds < 253_402_300_800 else { throw .invalid(field(), "time \(text) is out of range") }
            return Date(timeIntervalSince1970: seconds)
        }
        if let date = RFC3339.parse(trimmed) ?? RFC3339.parse(trimmed + "Z") { return date }
        throw .invalid(field(), "expected epoch seconds or milliseconds, ISO 8601, or yyyy-MM-dd HH:mm:ss, got \"\(text)\"")
    }

    static func number(_ text: String, field: @autoclosure () -> String) throws(IngestError) -> Double {
        guard let value = Double(trimmingWhitespace(text)), value.isFinite else {
            throw .invalid(field(), "expected a number, got \"\(text)\"")
        }
        return value
    }

    static func trimmingWhitespace(_ text: String) -> String { Whitespace.trimmed(text) }
}

/// Typed reads from a parsed JSON object, tolerant as the phone apps need (numbers that arrive
/// as strings) and strict about everything else, with the field's path in every error.
struct JSONFields {
    let object: [String: JSONValue]
    let path: String

    init(_ object: [String: JSONValue], path: String = "") {
        self.object = object
        self.path = path
    }

    static func parse(_ body: [UInt8]) throws(IngestError) -> JSONValue {
        do {
            return try JSONValue.parse(body)
        } catch {
            throw .malformedJSON(error.description)
        }
    }

    static func object(_ value: JSONValue, path: String) throws(IngestError) -> JSONFields {
        guard case .object(let object) = value else { throw .invalid(path.isEmpty ? "body" : path, "expected a JSON object") }
        return JSONFields(object, path: path)
    }

    func name(_ key: String) -> String { Self.name(path, key) }

    static func name(_ path: String, _ key: String) -> String { path.isEmpty ? key : "\(path).\(key)" }

    private func value(_ key: String) -> JSONValue? { object[key] }

    func double(_ key: String) throws(IngestError) -> RawFix.Value<Double>? { try Self.double(value(key), path: path, key: key) }

    func requiredDouble(_ key: String) throws(IngestError) -> RawFix.Value<Double> {
        guard let value = try double(key) else { throw .invalid(name(key), "is required") }
        return value
    }

    func string(_ key: String, limit: Int = IngestLimits.labelBytes) throws(IngestError) -> String? {
        try Self.string(value(key), path: path, key: key, limit: limit)
    }

    func time(_ key: String) throws(IngestError) -> RawFix.Value<Date>? { try Self.time(value(key), path: path, key: key) }

    func child(_ key: String) throws(IngestError) -> JSONFields? {
        guard let value = value(key), value != .null else { return nil }
        return try JSONFields.object(value, path: name(key))
    }

    func array(_ key: String) throws(IngestError) -> [JSONValue]? { try Self.array(value(key), path: path, key: key) }

    // The same reads of one value, for readers that keep values without an object around them
    // (`OverlandBatch`). Absent and `null` are the same: nil. The field's name is `path.key`.

    static func double(_ value: JSONValue?, path: String, key: String) throws(IngestError) -> RawFix.Value<Double>? {
        switch value {
        case nil, .null: return nil
        case .number(let number): return .init(value: number, path: path, key: key)
        case .string(let text):
            if text.isEmpty { return nil }
            return .init(value: try Normalizer.number(text, field: name(path, key)), path: path, key: key)
        default: throw .invalid(name(path, key), "expected a number")
        }
    }

    static func string(_ value: JSONValue?, path: String, key: String, limit: Int = IngestLimits.labelBytes) throws(IngestError) -> String? {
        switch value {
        case nil, .null: return nil
        case .string(let text):
            guard text.utf8.count <= limit else { throw IngestLimits.tooLong(name(path, key), limit: limit) }
            return text
        case .number(let number): return format(number)
        default: throw .invalid(name(path, key), "expected a string")
        }
    }

    static func time(_ value: JSONValue?, path: String, key: String) throws(IngestError) -> RawFix.Value<Date>? {
        switch value {
        case nil, .null: return nil
        case .number(let number): return .init(value: try Normalizer.parseTime(format(number), field: name(path, key)), path: path, key: key)
        case .string(let text): return .init(value: try Normalizer.parseTime(text, field: name(path, key)), path: path, key: key)
        default: throw .invalid(name(path, key), "expected a time")
        }
    }

    static func array(_ value: JSONValue?, path: String, key: String) throws(IngestError) -> [JSONValue]? {
        switch value {
        case nil, .null: return nil
        case .array(let items): return items
        default: throw .invalid(name(path, key), "expected a list")
        }
    }

    private static func format(_ number: Double) -> String {
        number == number.rounded() && abs(number) < 1e15 ? String(Int64(number)) : String(number)
    }
}
