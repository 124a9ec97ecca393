import DrivebusSchema
import Foundation

/// A webhook template: literal text with `{{field}}` placeholders, parsed once.
struct Template: Sendable, Equatable {
    enum Field: String, Sendable, CaseIterable {
        case gate, device, zone, time, lat, lon
        case speedMps = "speed_mps"
    }

    /// How values are written into the text around them.
    enum Mode: Sendable, Equatable {
        /// Strings are JSON-escaped (the template supplies the quotes); an unknown speed is `null`.
        case json
        /// `application/x-www-form-urlencoded`.
        case form
        /// A URL: values are percent-encoded.
        case url
        case plain
    }

    typealias Values = GateValues

    private enum Part: Sendable, Equatable {
        case literal(String)
        case field(Field)
    }

    private let parts: [Part]
    /// Placeholders that are not template fields; they are left as written.
    let unknownFields: [String]

    init(_ text: String) {
        var parts: [Part] = []
        var unknown: [String] = []
        var literal = ""
        var rest = text[...]
        while let open = rest.range(of: "{{") {
            guard let close = rest[open.upperBound...].range(of: "}}") else { break }
            let name = rest[open.upperBound..<close.lowerBound].trimmingCharacters(in: .whitespaces)
            literal += rest[..<open.lowerBound]
            if let field = Field(rawValue: name) {
                if !literal.isEmpty { parts.append(.literal(literal)) }
                literal = ""
                parts.append(.field(field))
            } else {
                unknown.append(name)
                literal += rest[open.lowerBound..<close.upperBound]
            }
            rest = rest[close.upperBound...]
        }
        literal += rest
        if !literal.isEmpty { parts.append(.literal(literal)) }
        self.parts = parts
        unknownFields = unknown
    }

    func render(_ values: Values, mode: Mode) -> String {
        var out = ""
        for part in parts {
            switch part {
            case .literal(let text): out += text
            case .field(let field): out += Self.format(field, values, mode)
            }
        }
        return out
    }

    private static func format(_ field: Field, _ values: Values, _ mode: Mode) -> String {
        let raw: String
        switch field {
        case .gate: raw = values.gate
        case .device: raw = values.device
        case .zone: raw = values.zone
        case .time: raw = values.time
        case .lat: raw = number(values.lat)
        case .lon: raw = number(values.lon)
        case .speedMps:
            guard let speed = values.speedMps else { return mode == .json ? "null" : "" }
            raw = number((speed * 100).rounded() / 100)
        }
        switch mode {
        case .json: return jsonEscaped(raw)
        case .form, .url: return raw.addingPercentEncoding(withAllowedCharacters: unreserved) ?? ""
        case .plain: return raw
        }
    }

    /// The shortest text that reads back as `value`; always valid JSON for finite values.
    private static func number(_ value: Double) -> String {
        guard value.isFinite else { return "0" }
        if value == value.rounded(), abs(value) < 1e15 { return String(Int64(value)) }
        return String(value)
    }

    /// RFC 3986 unreserved characters: everything else is percent-encoded.
    private static let unreserved = CharacterSet(charactersIn: "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")

    static func jsonEscaped(_ text: String) -> String {
        var out = ""
        out.unicodeScalars.reserveCapacity(text.unicodeScalars.count)
        for scalar in text.unicodeScalars {
            switch scalar {
            case "\"": out += "\\\""
            case "\\": out += "\\\\"
            case "\n": out += "\\n"
            case "\r": out += "\\r"
            case "\t": out += "\\t"
            case "\u{2028}": out += "\\u2028"  // legal JSON, but not in JavaScript string literals
            case "\u{2029}": out += "\\u2029"
            default:
                if scalar.value < 0x20 {
                    let hex = String(scalar.value, radix: 16)
                    out += "\\u" + String(repeating: "0", count: 4 - hex.count) + hex
                } else {
                    out.unicodeScalars.append(scalar)
                }
            }
        }
        return out
    }

    /// JSON for `application/json` or a body that looks like JSON, a form for
    /// `application/x-www-form-urlencoded`, otherwise the values as they are.
    static func bodyMode(body: String, contentType: String?) -> Mode {
        if let type = contentType?.lowercased() {
            if type.contains("json") { return .json }
            if type.contains("x-www-form-urlencoded") { return .form }
            return .plain
        }
        let first = body.unicodeScalars.first { !CharacterSet.whitespacesAndNewlines.contains($0) }
        return first == "{" || first == "[" ? .json : .plain
    }
}

/// The values a gate call's templates are filled with. Nothing secret: the outbox keeps them, and
/// renders the URL (which may hold a key) from the configuration at send time.
public struct GateValues: Sendable, Equatable, Codable {
    public var gate: String
    public var device: String
    public var zone: String
    public var time: String
    public var lat: Double
    public var lon: Double
    public var speedMps: Double?

    public init(gate: String, device: String, zone: String, time: String, lat: Double, lon: Double, speedMps: Double?) {
        self.gate = gate
        self.device = device
        self.zone = zone
        self.time = time
        self.lat = lat
        self.lon = lon
        self.speedMps = speedMps
    }

    enum CodingKeys: String, CodingKey {
        case gate, device, zone, time, lat, lon
        case speedMps = "speed_mps"
    }
}

extension Webhook {
    /// The URL for a call with `values`, its template fields percent-encoded.
    public func url(for values: GateValues) -> String {
        Template(url).render(values, mode: .url)
    }
}
