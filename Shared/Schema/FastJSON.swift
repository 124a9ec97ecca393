import Foundation

/// Hand-written JSON for the types on the hot path (envelope header, `Fix`, `MotionSample`):
/// Foundation's coders cost several microseconds per message, which would dominate the bus.
/// Output is byte-for-byte what `BusJSON`'s sorted-key encoder writes, and input follows the same
/// rules: unknown fields are skipped, missing optional fields are nil.
public protocol FastJSONEncodable {
    func writeJSON(to writer: inout JSONWriter)
}

public protocol FastJSONDecodable {
    init(reading reader: inout JSONReader) throws(JSONReader.Failure)
}

public struct JSONWriter {
    public private(set) var bytes: [UInt8] = []
    private var needsComma = false

    public init(capacity: Int = 256) { bytes.reserveCapacity(capacity) }

    public mutating func beginObject() {
        separate()
        bytes.append(UInt8(ascii: "{"))
        needsComma = false
    }

    public mutating func endObject() {
        bytes.append(UInt8(ascii: "}"))
        needsComma = true
    }

    /// `key` must need no escaping: every key of ours is plain snake_case ASCII.
    public mutating func key(_ key: StaticString) {
        separate()
        bytes.append(UInt8(ascii: "\""))
        bytes.append(contentsOf: UnsafeBufferPointer(start: key.utf8Start, count: key.utf8CodeUnitCount))
        bytes.append(UInt8(ascii: "\""))
        bytes.append(UInt8(ascii: ":"))
        needsComma = false
    }

    public mutating func string(_ value: String) {
        separate()
        bytes.append(UInt8(ascii: "\""))
        for byte in value.utf8 {
            switch byte {
            case UInt8(ascii: "\""): bytes.append(contentsOf: [UInt8(ascii: "\\"), UInt8(ascii: "\"")])
            case UInt8(ascii: "\\"): bytes.append(contentsOf: [UInt8(ascii: "\\"), UInt8(ascii: "\\")])
            case UInt8(ascii: "\n"): bytes.append(contentsOf: [UInt8(ascii: "\\"), UInt8(ascii: "n")])
            case UInt8(ascii: "\r"): bytes.append(contentsOf: [UInt8(ascii: "\\"), UInt8(ascii: "r")])
            case UInt8(ascii: "\t"): bytes.append(contentsOf: [UInt8(ascii: "\\"), UInt8(ascii: "t")])
            case 0..<0x20:
                let hex = Array("0123456789abcdef".utf8)
                bytes.append(contentsOf: Array(#"\u00"#.utf8) + [hex[Int(byte >> 4)], hex[Int(byte & 0xF)]])
            default: bytes.append(byte)
            }
        }
        bytes.append(UInt8(ascii: "\""))
        needsComma = true
    }

    /// Non-finite numbers have no JSON spelling; callers validate before writing.
    public mutating func number(_ value: Double) {
        precondition(value.isFinite, "JSON has no spelling for \(value)")
        separate()
        if value == value.rounded(), abs(value) < 1e15 {
            bytes.append(contentsOf: String(Int64(value)).utf8)
        } else {
            bytes.append(contentsOf: value.description.utf8)
        }
        needsComma = true
    }

    public mutating func number(_ value: UInt64) {
        separate()
        bytes.append(contentsOf: String(value).utf8)
        needsComma = true
    }

    public mutating func date(_ value: Date) {
        separate()
        bytes.append(UInt8(ascii: "\""))
        RFC3339.write(value, to: &bytes)
        bytes.append(UInt8(ascii: "\""))
        needsComma = true
    }

    public mutating func beginArray() {
        separate()
        bytes.append(UInt8(ascii: "["))
        needsComma = false
    }

    public mutating func endArray() {
        bytes.append(UInt8(ascii: "]"))
        needsComma = true
    }

    mutating func literal(_ word: StaticString) {
        separate()
        bytes.append(contentsOf: UnsafeBufferPointer(start: word.utf8Start, count: word.utf8CodeUnitCount))
        needsComma = true
    }

    /// After a key written with `string`: the value follows without a comma.
    mutating func bytesAppendColon() {
        bytes.append(UInt8(ascii: ":"))
        needsComma = false
    }

    public mutating func stringMap(_ map: [String: String]) {
        beginObject()
        for key in map.keys.sorted() {
            string(key)
            bytesAppendColon()
            string(map[key]!)
        }
        endObject()
    }

    private mutating func separate() {
        if needsComma { bytes.append(UInt8(ascii: ",")) }
        needsComma = false
    }
}

/// A pull parser over one JSON document.
public struct JSONReader {
    public struct Failure: Error, Sendable, Equatable, CustomStringConvertible {
        public let field: String?
        public let reason: String
        public var description: String { field.map { "\($0): \(reason)" } ?? reason }
    }

    private let bytes: [UInt8]
    private var index = 0
    /// The field being read, for error messages.
    public private(set) var currentKey: String?

    public init(_ bytes: [UInt8]) { self.bytes = bytes }

    public func failure(_ reason: String) -> Failure { Failure(field: currentKey, reason: reason) }

    /// Reads an object, calling `field` for each key with the reader positioned at its value,
    /// which `field` must read or skip.
    public mutating func readObject(_ field: (inout JSONReader, String) throws(Failure) -> Void) throws(Failure) {
        try expect(UInt8(ascii: "{"))
        skipSpace()
        if peek() == UInt8(ascii: "}") { index += 1; return }
        while true {
            skipSpace()
            let key = try readString()
            try expect(UInt8(ascii: ":"))
            let outer = currentKey
            currentKey = key
            try field(&self, key)
            currentKey = outer
            skipSpace()
            guard index < bytes.count else { throw failure("unterminated object") }
            let next = bytes[index]
            index += 1
            if next == UInt8(ascii: "}") { return }
            guard next == UInt8(ascii: ",") else { throw failure("expected , or } in object") }
        }
    }

    /// Consumes `null` if that is what comes next.
    public mutating func readNull() -> Bool {
        skipSpace()
        guard bytes.count - index >= 4, bytes[index] == UInt8(ascii: "n"), bytes[index + 1] == UInt8(ascii: "u"),
              bytes[index + 2] == UInt8(ascii: "l"), bytes[index + 3] == UInt8(ascii: "l") else { return false }
        index += 4
        return true
    }

    public mutating func readString() throws(Failure) -> String {
        try expect(UInt8(ascii: "\""))
        let start = index
        var plain = true
        while index < bytes.count {
            let byte = bytes[index]
            if byte == UInt8(ascii: "\"") {
                defer { index += 1 }
                if plain { return String(decoding: bytes[start..<index], as: UTF8.self) }
                // Rare: let Foundation handle escapes, including surrogate pairs.
                let quoted = Data(bytes[(start - 1)...index])
                guard let text = try? JSONDecoder().decode(String.self, from: quoted) else { throw failure("invalid string escape") }
                return text
            }
            if byte == UInt8(ascii: "\\") {
                plain = false
                index += 2
                continue
            }
            guard byte >= 0x20 else { throw failure("control character in string") }
            index += 1
        }
        throw failure("unterminated string")
    }

    public mutating func readDouble() throws(Failure) -> Double {
        skipSpace()
        let start = index
        while index < bytes.count, Self.isNumberByte(bytes[index]) { index += 1 }
        guard index > start else { throw failure("expected a number") }
        let end = index
        guard Self.isJSONNumber(bytes[start..<end]) else {
            throw failure("invalid number \(String(decoding: bytes[start..<end], as: UTF8.self))")
        }
        let value: Double? = bytes.withUnsafeBufferPointer { buffer in
            // strtod stops at the first byte that is not part of the number, and the byte after
            // the number is inside the buffer unless the document is a bare number.
            guard end < buffer.count else { return Double(String(decoding: buffer[start..<end], as: UTF8.self)) }
            var stop: UnsafeMutablePointer<CChar>?
            let base = UnsafeRawPointer(buffer.baseAddress! + start).assumingMemoryBound(to: CChar.self)
            let parsed = strtod(base, &stop)
            return stop.map { UnsafeRawPointer($0) - UnsafeRawPointer(base) } == end - start ? parsed : nil
        }
        guard let value, value.isFinite else {
            throw failure("invalid number \(String(decoding: bytes[start..<end], as: UTF8.self))")
        }
        return value
    }

    public mutating func readUInt64() throws(Failure) -> UInt64 {
        skipSpace()
        let start = index
        while index < bytes.count, (48...57).contains(bytes[index]) { index += 1 }
        guard index > start, let value = UInt64(String(decoding: bytes[start..<index], as: UTF8.self)) else {
            throw failure("expected a non-negative integer")
        }
        if index < bytes.count, Self.isNumberByte(bytes[index]) { throw failure("expected an integer") }
        return value
    }

    public mutating func readInt() throws(Failure) -> Int {
        skipSpace()
        let negative = peek() == UInt8(ascii: "-")
        if negative { index += 1 }
        let magnitude = try readUInt64()
        guard magnitude <= UInt64(Int.max) else { throw failure("integer out of range") }
        return negative ? -Int(magnitude) : Int(magnitude)
    }

    public mutating func readDate() throws(Failure) -> Date {
        skipSpace()
        let start = index + 1
        let text = try readString()
        // Plain timestamps are parsed straight from the buffer.
        let date = index - 1 - start == text.utf8.count ? RFC3339.parse(utf8: bytes[start..<(index - 1)]) : RFC3339.parse(text)
        guard let date else { throw failure("expected an RFC 3339 time, got \"\(text)\"") }
        return date
    }

    public mutating func readStringMap() throws(Failure) -> [String: String] {
        var map: [String: String] = [:]
        try readObject { (reader: inout JSONReader, key: String) throws(Failure) in map[key] = try reader.readString() }
        return map
    }

    /// Skips any value: unknown fields are ignored, as the bus's rules require. Nesting is
    /// limited, so a hostile document cannot exhaust the stack.
    public mutating func skipValue(depth: Int = 0) throws(Failure) {
        guard depth < 64 else { throw failure("nested too deeply") }
        skipSpace()
        guard index < bytes.count else { throw failure("unexpected end") }
        switch bytes[index] {
        case UInt8(ascii: "\""): _ = try readString()
        case UInt8(ascii: "{"): try readObject { (reader: inout JSONReader, _: String) throws(Failure) in try reader.skipValue(depth: depth + 1) }
        case UInt8(ascii: "["): try readArray { (reader: inout JSONReader) throws(Failure) in try reader.skipValue(depth: depth + 1) }
        case UInt8(ascii: "t"): try literal("true")
        case UInt8(ascii: "f"): try literal("false")
        case UInt8(ascii: "n"): try literal("null")
        default: _ = try readDouble()
        }
    }

    /// Reads an array, calling `element` with the reader positioned at each element.
    public mutating func readArray(_ element: (inout JSONReader) throws(Failure) -> Void) throws(Failure) {
        try expect(UInt8(ascii: "["))
        skipSpace()
        if peek() == UInt8(ascii: "]") { index += 1; return }
        while true {
            try element(&self)
            skipSpace()
            guard index < bytes.count else { throw failure("unterminated array") }
            let next = bytes[index]
            index += 1
            if next == UInt8(ascii: "]") { return }
            guard next == UInt8(ascii: ",") else { throw failure("expected , or ] in array") }
        }
    }

    public mutating func readBool() throws(Failure) -> Bool {
        switch peekNonSpace() {
        case UInt8(ascii: "t"): try literal("true"); return true
        case UInt8(ascii: "f"): try literal("false"); return false
        default: throw failure("expected true or false")
        }
    }

    /// The next byte that is not whitespace, without consuming it.
    public mutating func peekNonSpace() -> UInt8? {
        skipSpace()
        return peek()
    }

    /// Checks that nothing but whitespace follows the document.
    public mutating func finish() throws(Failure) {
        skipSpace()
        guard index == bytes.count else { throw Failure(field: nil, reason: "unexpected data after the JSON value") }
    }

    private mutating func literal(_ word: StaticString) throws(Failure) {
        let count = word.utf8CodeUnitCount
        guard bytes.count - index >= count,
              bytes[index..<(index + count)].elementsEqual(UnsafeBufferPointer(start: word.utf8Start, count: count))
        else { throw failure("invalid literal") }
        index += count
    }

    private mutating func expect(_ byte: UInt8) throws(Failure) {
        skipSpace()
        guard index < bytes.count, bytes[index] == byte else {
            throw failure("expected \(Character(Unicode.Scalar(byte)))")
        }
        index += 1
    }

    private func peek() -> UInt8? { index < bytes.count ? bytes[index] : nil }

    private mutating func skipSpace() {
        while index < bytes.count {
            let byte = bytes[index]
            guard byte == 0x20 || byte == 0x0A || byte == 0x0D || byte == 0x09 else { return }
            index += 1
        }
    }

    private static func isNumberByte(_ byte: UInt8) -> Bool {
        (48...57).contains(byte) || byte == UInt8(ascii: "-") || byte == UInt8(ascii: "+") || byte == UInt8(ascii: ".")
            || byte == UInt8(ascii: "e") || byte == UInt8(ascii: "E")
    }

    /// Swift's `Double(String)` also takes forms JSON forbids (`+1`, `.5`, `1.`, hex, `inf`).
    private static func isJSONNumber(_ text: ArraySlice<UInt8>) -> Bool {
        var rest = text[...]
        if rest.first == UInt8(ascii: "-") { rest = rest.dropFirst() }
        guard let first = rest.first, (48...57).contains(first) else { return false }
        if first == UInt8(ascii: "0"), rest.count > 1, (48...57).contains(rest[rest.startIndex + 1]) { return false }
        if let dot = rest.firstIndex(of: UInt8(ascii: ".")) {
            let after = rest.index(after: dot)
            guard after < rest.endIndex, (48...57).contains(rest[after]) else { return false }
        }
        return true
    }
}

/// A parsed JSON document, for payloads whose shape varies (the phone apps'). Numbers are read
/// with `strtod`, exactly; Foundation's `JSONSerialization` on Linux can be off by an ulp.
public enum JSONValue: Sendable, Equatable {
    case object([String: JSONValue])
    case array([JSONValue])
    case string(String)
    case number(Double)
    case bool(Bool)
    case null

    public static func parse(_ bytes: [UInt8]) throws(JSONReader.Failure) -> JSONValue {
        var reader = JSONReader(bytes)
        let value = try reader.readValue()
        try reader.finish()
        return value
    }
}

extension JSONReader {
    public mutating func readValue(depth: Int = 0) throws(Failure) -> JSONValue {
        guard depth < 64 else { throw failure("nested too deeply") }
        switch peekNonSpace() {
        case UInt8(ascii: "{"):
            var object: [String: JSONValue] = [:]
            try readObject { (reader: inout JSONReader, key: String) throws(Failure) in
                object[key] = try reader.readValue(depth: depth + 1)
            }
            return .object(object)
        case UInt8(ascii: "["):
            var array: [JSONValue] = []
            try readArray { (reader: inout JSONReader) throws(Failure) in array.append(try reader.readValue(depth: depth + 1)) }
            return .array(array)
        case UInt8(ascii: "\""):
            return .string(try readString())
        case UInt8(ascii: "t"), UInt8(ascii: "f"):
            return .bool(try readBool())
        case UInt8(ascii: "n"):
            guard readNull() else { throw failure("invalid literal") }
            return .null
        case nil:
            throw failure("unexpected end")
        default:
            return .number(try readDouble())
        }
    }
}

extension JSONWriter {
    /// Writes any JSON value; object keys are sorted, as everywhere on the bus.
    public mutating func value(_ value: JSONValue) {
        switch value {
        case .object(let object):
            beginObject()
            for key in object.keys.sorted() {
                string(key)
                bytesAppendColon()
                self.value(object[key]!)
            }
            endObject()
        case .array(let items):
            beginArray()
            for item in items { self.value(item) }
            endArray()
        case .string(let text): string(text)
        case .number(let number): self.number(number)
        case .bool(let flag): literal(flag ? "true" : "false")
        case .null: literal("null")
        }
    }
}

extension JSONValue {
    public var encoded: [UInt8] {
        var writer = JSONWriter()
        writer.value(self)
        return writer.bytes
    }
}
