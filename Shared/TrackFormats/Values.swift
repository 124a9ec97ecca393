import DrivebusSchema
import Foundation

/// Checks bytes are well-formed UTF-8 (no overlongs, surrogates or code points past U+10FFFF).
public enum UTF8Validation {
    public static func isValid(_ bytes: some Collection<UInt8>) -> Bool {
        var iterator = bytes.makeIterator()
        var decoder = UTF8()
        while true {
            switch decoder.decode(&iterator) {
            case .scalarValue: continue
            case .emptyInput: return true
            case .error: return false
            }
        }
    }
}

/// The values a track file holds, read strictly: what is not exactly a number or a time is an
/// error, never a guess, and never NaN or infinity.
enum Values {
    /// A decimal number (`-12`, `3.5`, `.5`, `1e3`), with spaces, tabs and line breaks around
    /// it allowed; not `nan`, `inf`, hexadecimal or anything Foundation would also accept.
    static func number(_ bytes: some Collection<UInt8>) -> Double? {
        var text = Array(bytes)[...]
        while let first = text.first, isSpace(first) { text = text.dropFirst() }
        while let last = text.last, isSpace(last) { text = text.dropLast() }
        guard !text.isEmpty, text.count <= 400 else { return nil }
        var index = text.startIndex
        func digits() -> Int {
            let start = index
            while index < text.endIndex, (48...57).contains(text[index]) { index += 1 }
            return index - start
        }
        if text[index] == UInt8(ascii: "-") || text[index] == UInt8(ascii: "+") { index += 1 }
        var count = digits()
        if index < text.endIndex, text[index] == UInt8(ascii: ".") {
            index += 1
            count += digits()
        }
        guard count > 0 else { return nil }
        if index < text.endIndex, text[index] == UInt8(ascii: "e") || text[index] == UInt8(ascii: "E") {
            index += 1
            if index < text.endIndex, text[index] == UInt8(ascii: "-") || text[index] == UInt8(ascii: "+") { index += 1 }
            guard digits() > 0 else { return nil }
        }
        guard index == text.endIndex, let value = Double(String(decoding: text, as: UTF8.self)), value.isFinite else { return nil }
        return value
    }

    static func number(_ text: String) -> Double? { number(text.utf8) }

    static func isSpace(_ byte: UInt8) -> Bool { byte == 0x20 || byte == 0x09 || byte == 0x0A || byte == 0x0D }

    /// An RFC 3339 / ISO 8601 time, `Z` assumed when it has no offset (GPX `<time>`).
    static func isoTime(_ text: String) -> Date? {
        let trimmed = Whitespace.trimmed(text, newlines: true)
        return RFC3339.parse(trimmed) ?? RFC3339.parse(trimmed + "Z")
    }

    static let timeFormats = "expected epoch seconds or milliseconds, ISO 8601, or yyyy-MM-dd HH:mm:ss"

    /// A time as phone apps and spreadsheets write it: epoch seconds, epoch milliseconds (above
    /// 2147483647), RFC 3339 / ISO 8601 with any offset, or `yyyy-MM-dd HH:mm:ss` in UTC. The
    /// same rules as ingest's; the error is the reason, without the field.
    static func time(_ text: String) -> Result<Date, TimeError> {
        let trimmed = Whitespace.trimmed(text)
        if !trimmed.isEmpty, trimmed.utf8.allSatisfy({ (48...57).contains($0) || $0 == UInt8(ascii: ".") }) {
            guard let number = number(trimmed) else { return .failure(TimeError(reason: "\(timeFormats), got \(quoted(text))")) }
            return epoch(number).map(Result.success) ?? .failure(TimeError(reason: "time \(trimmed) is out of range"))
        }
        if let date = RFC3339.parse(trimmed) ?? RFC3339.parse(trimmed + "Z") { return .success(date) }
        return .failure(TimeError(reason: "\(timeFormats), got \(quoted(text))"))
    }

    struct TimeError: Error { let reason: String }

    /// Epoch seconds, or milliseconds above 2147483647; nothing before 1970 or after 9999.
    static func epoch(_ number: Double) -> Date? {
        guard number.isFinite, number >= 0 else { return nil }
        let seconds = number > 2_147_483_647 ? number / 1000 : number
        guard seconds < 253_402_300_800 else { return nil }
        return Date(timeIntervalSince1970: seconds)
    }

    /// `"text"` for a message, cut at 64 characters so a hostile value cannot fill a log.
    static func quoted(_ text: String) -> String {
        text.count <= 64 ? "\"\(text)\"" : "\"\(text.prefix(64))…\""
    }

    static func quoted(bytes: some Collection<UInt8>) -> String {
        quoted(String(decoding: Array(bytes.prefix(256)), as: UTF8.self) + (bytes.count > 256 ? "…" : ""))
    }

    /// A track's name as shown: trimmed, at most 200 characters; `nil` if blank.
    static func name(_ text: String) -> String? {
        let trimmed = text.trimmingCharacters(in: .whitespacesAndNewlines)
        return trimmed.isEmpty ? nil : String(trimmed.prefix(200))
    }

    /// A number for a message: `91`, `1e+300`.
    static func text(_ value: Double) -> String {
        value == value.rounded() && abs(value) < 1e15 ? String(Int64(value)) : "\(value)"
    }

    /// The checks every format makes of a point's numbers: `nil`, or what is wrong, to follow
    /// the field's name.
    static func checkLatitude(_ value: Double) -> String? {
        (-90...90).contains(value) ? nil : "must be from -90 to 90, got \(text(value))"
    }

    static func checkLongitude(_ value: Double) -> String? {
        (-180...180).contains(value) ? nil : "must be from -180 to 180, got \(text(value))"
    }

    /// Elevations beyond 100 km up or down are not on Earth (and the route ranking's bound).
    static let maxElevationM = 100_000.0

    static func checkElevation(_ value: Double) -> String? {
        abs(value) <= maxElevationM ? nil : "must be from -100000 to 100000 m, got \(text(value))"
    }
}

/// `trimmingCharacters(in: .whitespaces)` (or `.whitespacesAndNewlines`) without Foundation's
/// bridging for the usual case, plain ASCII at both ends: through `NSString` it was most of the
/// time spent on a timestamp, in ingest and in `drivebus import`.
public enum Whitespace {
    public static func trimmed(_ text: String, newlines: Bool = false) -> String {
        let utf8 = text.utf8
        guard let first = utf8.first, let last = utf8.last else { return text }
        // Made only when needed: a `CharacterSet` costs more to make than the ASCII trim does.
        func foundationTrimmed() -> String { text.trimmingCharacters(in: newlines ? .whitespacesAndNewlines : .whitespaces) }
        guard first < 0x80, last < 0x80 else { return foundationTrimmed() }
        func isSpace(_ byte: UInt8) -> Bool { byte == 0x20 || byte == 0x09 || (newlines && (byte == 0x0A || byte == 0x0D || byte == 0x0B || byte == 0x0C)) }
        guard isSpace(first) || isSpace(last) else { return text }
        guard let start = utf8.firstIndex(where: { !isSpace($0) }), let end = utf8.lastIndex(where: { !isSpace($0) }) else { return "" }
        // Unicode spaces behind the ASCII ones: Foundation knows them all.
        guard utf8[start] < 0x80, utf8[end] < 0x80 else { return foundationTrimmed() }
        return String(text[start...end])
    }
}
