import DrivebusSchema
import Foundation

/// Why the stats API refused a request. Errors that come from the input name the parameter.
public struct StatsError: Error, Sendable, Equatable, CustomStringConvertible {
    public let status: Int
    /// Stable: `stats.invalid_parameter`, `stats.not_found`, `stats.busy`, `stats.cancelled`,
    /// `stats.invalid_expense`, `stats.invalid_body`, `stats.too_large`, `stats.no_routes`,
    /// `stats.invalid_route`, `stats.no_elevation`.
    public let code: String
    public let message: String
    public let field: String?
    /// More members of the error object, such as the `row` of a bad ledger row or the `route`
    /// that has no elevation.
    public let details: [String: JSONValue]

    public init(status: Int, code: String, message: String, field: String? = nil, details: [String: JSONValue] = [:]) {
        self.status = status
        self.code = code
        self.message = message
        self.field = field
        self.details = details
    }

    public var description: String { field.map { "\(code) (\($0)): \(message)" } ?? "\(code): \(message)" }

    public static func invalid(_ field: String, _ message: String) -> StatsError {
        StatsError(status: 400, code: "stats.invalid_parameter", message: "\(field): \(message)", field: field)
    }

    public static func notFound(_ field: String, _ message: String) -> StatsError {
        StatsError(status: 404, code: "stats.not_found", message: message, field: field)
    }

    public static let busy = StatsError(status: 503, code: "stats.busy", message: "too many exports are running; try again shortly")
    /// The reader of a streaming export went away.
    public static let cancelled = StatsError(status: 499, code: "stats.cancelled", message: "the export was cancelled")

    /// `{"error":{"code","field","message"}}`, plus any `details`.
    public var json: [UInt8] {
        var error = details
        error["code"] = .string(code)
        error["field"] = field.map(JSONValue.string) ?? .null
        error["message"] = .string(message)
        var writer = JSONWriter()
        writer.value(.object(["error": .object(error)]))
        return writer.bytes
    }
}

/// The parameters every endpoint takes: `device`, `from`, `to`.
///
/// `from` is inclusive and `to` exclusive. A date (`2025-03-01`) means that whole UTC day, so
/// `from=2025-03-01&to=2025-03-31` covers all of March 1 to 31; an RFC 3339 time is that instant.
public struct StatsQuery: Sendable, Equatable {
    public var device: String?
    public var from: Date?
    public var to: Date?

    public init(device: String? = nil, from: Date? = nil, to: Date? = nil) {
        self.device = device
        self.from = from
        self.to = to
    }

    package var fromMs: Int64 { from.map(milliseconds) ?? Int64.min / 2 }
    package var toMs: Int64 { to.map(milliseconds) ?? Int64.max / 2 }

    /// Reads `device`, `from` and `to` from query parameters; other names are left to the caller.
    public static func parse(_ parameters: StatsParameters) throws(StatsError) -> StatsQuery {
        var query = StatsQuery()
        if let device = try parameters.single("device") {
            guard isDeviceID(device) else { throw .invalid("device", "must match [A-Za-z0-9_-]{1,64}") }
            query.device = device
        }
        if let text = try parameters.single("from") {
            guard let (start, _) = parseTime(text) else { throw .invalid("from", "must be a date (YYYY-MM-DD) or an RFC 3339 time, got \"\(text)\"") }
            query.from = start
        }
        if let text = try parameters.single("to") {
            guard let (start, dayEnd) = parseTime(text) else { throw .invalid("to", "must be a date (YYYY-MM-DD) or an RFC 3339 time, got \"\(text)\"") }
            query.to = dayEnd ?? start
        }
        if let from = query.from, let to = query.to, to <= from {
            throw .invalid("to", "must be after from")
        }
        return query
    }

    static func isDeviceID(_ text: String) -> Bool {
        let bytes = text.utf8
        return (1...64).contains(bytes.count) && bytes.allSatisfy { byte in
            (48...57).contains(byte) || (65...90).contains(byte) || (97...122).contains(byte) || byte == UInt8(ascii: "_") || byte == UInt8(ascii: "-")
        }
    }

    /// A date gives its UTC midnight and the next; an RFC 3339 time gives itself. Years outside
    /// 1970–9999 are refused, so later arithmetic cannot overflow.
    static func parseTime(_ text: String) -> (Date, Date?)? {
        let bytes = Array(text.utf8)
        if bytes.count == 10, bytes[4] == UInt8(ascii: "-"), bytes[7] == UInt8(ascii: "-"),
           let day = RFC3339.parse(text + "T00:00:00Z") {
            guard (0...2_932_896 * 86_400.0).contains(day.timeIntervalSince1970) else { return nil }
            return (day, day.addingTimeInterval(86_400))
        }
        guard let time = RFC3339.parse(text), (0...253_402_300_799.0).contains(time.timeIntervalSince1970) else { return nil }
        return (time, nil)
    }
}

/// Query parameters as they came, in order, percent-decoded.
public struct StatsParameters: Sendable, Equatable {
    public var pairs: [(name: String, value: String)]

    public init(_ pairs: [(name: String, value: String)]) { self.pairs = pairs }

    /// Parses a raw query string (`a=1&b=2`), decoding `%XX` and `+`.
    public init(query: String) {
        pairs = query.split(separator: "&", omittingEmptySubsequences: true).map { item in
            let parts = item.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
            let decode = { (text: Substring) in
                String(text).replacingOccurrences(of: "+", with: " ").removingPercentEncoding ?? String(text)
            }
            return (decode(parts[0]), parts.count > 1 ? decode(parts[1]) : "")
        }
    }

    public static func == (a: StatsParameters, b: StatsParameters) -> Bool {
        a.pairs.elementsEqual(b.pairs) { $0.name == $1.name && $0.value == $1.value }
    }

    /// The value of `name`, nil when absent; given twice or empty is an error.
    public func single(_ name: String) throws(StatsError) -> String? {
        let values = pairs.filter { $0.name == name }.map(\.value)
        guard values.count <= 1 else { throw .invalid(name, "is given more than once") }
        guard let value = values.first else { return nil }
        guard !value.isEmpty else { throw .invalid(name, "is empty") }
        return value
    }

    public func integer(_ name: String, default fallback: Int, in range: ClosedRange<Int>) throws(StatsError) -> Int {
        guard let text = try single(name) else { return fallback }
        guard let value = Int(text), range.contains(value) else {
            throw .invalid(name, "must be an integer from \(range.lowerBound) to \(range.upperBound)")
        }
        return value
    }
}
