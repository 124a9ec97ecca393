import DrivebusGeo
import DrivebusSchema
import Foundation

/// Numbers as plain decimals, never with an exponent: XML Schema's `xsd:decimal` (GPX lat/lon)
/// has no exponent, and a CSV reader should not have to know one. Digits are Swift's shortest
/// round-trip spelling, so a number read back is the same `Double`.
package enum Decimal64 {
    package static func text(_ value: Double) -> String {
        guard value.isFinite else { return "" }
        if value == value.rounded(), abs(value) < 1e15 { return String(Int64(value)) }
        let spelled = value.description
        guard let e = spelled.firstIndex(where: { $0 == "e" || $0 == "E" }), let exponent = Int(spelled[spelled.index(after: e)...]) else {
            return spelled
        }
        var mantissa = spelled[..<e]
        let negative = mantissa.hasPrefix("-")
        if negative { mantissa = mantissa.dropFirst() }
        let parts = mantissa.split(separator: ".", omittingEmptySubsequences: false)
        let whole = parts[0], fraction = parts.count > 1 ? parts[1] : ""
        var digits = String(whole + fraction)
        // The decimal point sits after `point` digits.
        var point = whole.count + exponent
        if point <= 0 {
            digits = String(repeating: "0", count: 1 - point) + digits
            point = 1
        } else if point > digits.count {
            digits += String(repeating: "0", count: point - digits.count)
        }
        var head = String(digits.prefix(point)), tail = String(digits.dropFirst(point))
        while tail.hasSuffix("0") { tail.removeLast() }
        while head.count > 1, head.hasPrefix("0") { head.removeFirst() }
        return (negative ? "-" : "") + head + (tail.isEmpty ? "" : "." + tail)
    }

    /// Rounded to `places` decimals, for sizes that do not need every bit (map coordinates).
    package static func text(_ value: Double, places: Int) -> String {
        let scale = pow(10, Double(places))
        return text((value * scale).rounded() / scale)
    }
}

/// A growing output buffer that hands itself to `emit` in chunks, so that an export of any size
/// needs only one chunk of memory.
package struct ChunkWriter {
    private(set) var bytes: [UInt8] = []
    let chunkBytes: Int
    let emit: ([UInt8]) throws -> Void

    package init(chunkBytes: Int, emit: @escaping ([UInt8]) throws -> Void) {
        self.chunkBytes = max(1024, chunkBytes)
        self.emit = emit
        bytes.reserveCapacity(self.chunkBytes + 4096)
    }

    @inline(__always)
    package mutating func append(_ text: String) { bytes.append(contentsOf: text.utf8) }

    @inline(__always)
    package mutating func append(_ text: StaticString) {
        bytes.append(contentsOf: UnsafeBufferPointer(start: text.utf8Start, count: text.utf8CodeUnitCount))
    }

    @inline(__always)
    package mutating func byte(_ character: Unicode.Scalar) { bytes.append(UInt8(ascii: character)) }

    package mutating func append(bytes more: [UInt8]) { bytes.append(contentsOf: more) }

    package mutating func number(_ value: Double) { bytes.append(contentsOf: Decimal64.text(value).utf8) }

    package mutating func time(ms: Int64) { RFC3339.write(msDate(ms), to: &bytes) }

    package mutating func xml(_ text: String) { bytes.append(contentsOf: Markup.escape(text).utf8) }

    package mutating func json(_ text: String) {
        var writer = JSONWriter()
        writer.string(text)
        bytes.append(contentsOf: writer.bytes)
    }

    /// Emits a chunk once enough has gathered.
    @inline(__always)
    package mutating func flushIfFull() throws {
        if bytes.count >= chunkBytes { try flush() }
    }

    package mutating func flush() throws {
        guard !bytes.isEmpty else { return }
        try emit(bytes)
        bytes.removeAll(keepingCapacity: true)
    }
}

package enum Markup {
    package static func escape(_ text: String) -> String {
        guard text.utf8.contains(where: { $0 == UInt8(ascii: "&") || $0 == UInt8(ascii: "<") || $0 == UInt8(ascii: ">") || $0 == UInt8(ascii: "\"") || $0 == UInt8(ascii: "'") || $0 < 0x20 }) else {
            return text
        }
        var out = ""
        for scalar in text.unicodeScalars {
            switch scalar {
            case "&": out += "&amp;"
            case "<": out += "&lt;"
            case ">": out += "&gt;"
            case "\"": out += "&quot;"
            case "'": out += "&apos;"
            case "\t", "\n", "\r": out.unicodeScalars.append(scalar)
            default:
                // XML 1.0 has no spelling for other control characters.
                if scalar.value < 0x20 { out += "\u{FFFD}" } else { out.unicodeScalars.append(scalar) }
            }
        }
        return out
    }
}

extension JSONWriter {
    /// A number, or `null` when there is none (or it is not finite).
    package mutating func optional(_ value: Double?) {
        if let value, value.isFinite { number(value) } else { self.value(.null) }
    }

    package mutating func optional(_ value: Int64?) {
        if let value { number(Double(value)) } else { self.value(.null) }
    }

    package mutating func optional(_ value: String?) {
        if let value { string(value) } else { self.value(.null) }
    }

    package mutating func time(ms: Int64) { date(msDate(ms)) }

    package mutating func optionalTime(ms: Int64?) {
        if let ms { time(ms: ms) } else { value(.null) }
    }
}

/// Milliseconds since 1970, the unit of every time column.
@inline(__always)
package func milliseconds(_ date: Date) -> Int64 {
    let ms = (date.timeIntervalSince1970 * 1000).rounded()
    // Clamped so that an absurd date cannot trap; validation refuses such times anyway.
    return ms.isFinite ? Int64(max(-9e15, min(9e15, ms))) : 0
}

@inline(__always)
package func msDate(_ ms: Int64) -> Date { Date(timeIntervalSince1970: Double(ms) / 1000) }

extension Coordinate {
    package static func isValid(lat: Double, lon: Double) -> Bool {
        lat.isFinite && lon.isFinite && (-90...90).contains(lat) && (-180...180).contains(lon)
    }
}
