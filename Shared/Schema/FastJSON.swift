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
        let comma = takeComma()
        let text = UnsafeRawBufferPointer(start: key.utf8Start, count: key.utf8CodeUnitCount)
        bytes.append(addingCapacity: text.count + 4) { out in
            if comma { out.append(UInt8(ascii: ",")) }
            out.append(UInt8(ascii: "\""))
            out.append(copying: text)
            out.append(UInt8(ascii: "\""))
            out.append(UInt8(ascii: ":"))
        }
    }

    public mutating func string(_ value: String) {
        var value = value
        let plain = value.withUTF8 { utf8 in
            guard utf8.allSatisfy(Self.needsNoEscape) else { return false }
            // The usual string, copied whole.
            let comma = takeComma()
            bytes.append(addingCapacity: utf8.count + 3) { out in
                if comma { out.append(UInt8(ascii: ",")) }
                out.append(UInt8(ascii: "\""))
                out.append(copying: UnsafeRawBufferPointer(utf8))
                out.append(UInt8(ascii: "\""))
            }
            return true
        }
        if !plain { escaped(value) }
        needsComma = true
    }

    @inline(__always)
    private static func needsNoEscape(_ byte: UInt8) -> Bool {
        byte >= 0x20 && byte != UInt8(ascii: "\"") && byte != UInt8(ascii: "\\")
    }

    private mutating func escaped(_ value: String) {
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
    }

    /// Non-finite numbers have no JSON spelling; callers validate before writing.
    public mutating func number(_ value: Double) {
        precondition(value.isFinite, "JSON has no spelling for \(value)")
        let comma = takeComma()
        // A whole number: compared through Int64 (in range below 1e15), which compiles to two
        // conversions where `rounded()` calls libm on the baseline x86-64 target.
        if abs(value) < 1e15, Double(Int64(value)) == value {
            bytes.append(addingCapacity: 22) { out in
                if comma { out.append(UInt8(ascii: ",")) }
                out.appendDecimal(Int64(value))
            }
        } else if let few = FewDecimals(value) {
            bytes.append(addingCapacity: 22) { out in
                if comma { out.append(UInt8(ascii: ",")) }
                few.write(to: &out)
            }
        } else {
            if comma { bytes.append(UInt8(ascii: ",")) }
            bytes.append(contentsOf: value.description.utf8)
        }
        needsComma = true
    }

    public mutating func number(_ value: UInt64) {
        let comma = takeComma()
        bytes.append(addingCapacity: 21) { out in
            if comma { out.append(UInt8(ascii: ",")) }
            out.appendDecimal(value)
        }
        needsComma = true
    }

    public mutating func date(_ value: Date) {
        let comma = takeComma()
        bytes.append(addingCapacity: RFC3339.length + 3) { out in
            if comma { out.append(UInt8(ascii: ",")) }
            out.append(UInt8(ascii: "\""))
            RFC3339.write(value, to: &out)
            out.append(UInt8(ascii: "\""))
        }
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
        if takeComma() { bytes.append(UInt8(ascii: ",")) }
    }

    /// Whether a comma goes before the next value, read before `bytes` is opened for writing
    /// (a value is written in one growth of it: one check of capacity and uniqueness for the
    /// value, where appending byte by byte made one per byte, a fifth of encoding a fix).
    @inline(__always)
    private mutating func takeComma() -> Bool {
        defer { needsComma = false }
        return needsComma
    }
}

/// An object key as written in the document, matched against literals without making a `String`.
/// Keys of up to 32 bytes (every key of ours, and the phone apps' `horizontal_accuracy`) are
/// packed into four words; longer ones keep their text.
public struct JSONKey: Sendable, Equatable, CustomStringConvertible {
    private typealias Words = (UInt64, UInt64, UInt64, UInt64)
    private static let packedBytes = MemoryLayout<Words>.size

    private let count: Int
    private let words: Words
    private let long: String?

    init(_ bytes: UnsafeBufferPointer<UInt8>) {
        count = bytes.count
        if bytes.count <= Self.packedBytes {
            words = Self.pack(bytes)
            long = nil
        } else {
            words = (0, 0, 0, 0)
            long = String(decoding: bytes, as: UTF8.self)
        }
    }

    init(_ text: String) {
        var text = text
        self = text.withUTF8 { Self($0) }
    }

    /// The key's bytes copied in, in memory order, the rest zero (every key of every payload is
    /// packed, so no loop over its bytes).
    private static func pack(_ bytes: UnsafeBufferPointer<UInt8>) -> Words {
        var words: Words = (0, 0, 0, 0)
        withUnsafeMutableBytes(of: &words) { $0.copyMemory(from: UnsafeRawBufferPointer(bytes)) }
        return words
    }

    public static func == (a: JSONKey, b: JSONKey) -> Bool {
        a.count == b.count && a.words.0 == b.words.0 && a.words.1 == b.words.1 && a.words.2 == b.words.2 && a.words.3 == b.words.3
            && a.long == b.long
    }

    public var description: String {
        if let long { return long }
        var words = words
        return withUnsafeBytes(of: &words) { String(decoding: $0.prefix(count), as: UTF8.self) }
    }

    /// Lets `switch key { case "lat": … }` compare bytes: a length check, inlined into the
    /// switch since most cases fail it, then byte by byte until the first that differs.
    @inline(__always)
    public static func ~= (pattern: StaticString, key: JSONKey) -> Bool {
        pattern.utf8CodeUnitCount == key.count && key.hasBytes(of: pattern)
    }

    /// Inlined too: with the literal known, the compiler compares it without a loop.
    @inline(__always)
    private func hasBytes(of pattern: StaticString) -> Bool {
        let literal = UnsafeBufferPointer(start: pattern.utf8Start, count: pattern.utf8CodeUnitCount)
        if let long { return long.utf8.elementsEqual(literal) }
        var words = words
        return withUnsafeBytes(of: &words) { stored in
            for offset in 0..<literal.count where stored[offset] != literal[offset] { return false }
            return true
        }
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
    /// Where the key whose value is being read starts: a plain offset, so that keeping it costs
    /// nothing per field; its text is read again only for an error message.
    private var currentFieldAt: Int?

    public init(_ bytes: [UInt8]) { self.bytes = bytes }

    /// The field being read, for error messages.
    public var currentKey: String? {
        guard let at = currentFieldAt else { return nil }
        var key = self
        key.index = at
        key.currentFieldAt = nil
        return try? key.readString()
    }

    public func failure(_ reason: String) -> Failure { Failure(field: currentKey, reason: reason) }

    /// Reads an object, calling `field` for each key with the reader positioned at its value,
    /// which `field` must read or skip.
    public mutating func readObject(_ field: (inout JSONReader, JSONKey) throws(Failure) -> Void) throws(Failure) {
        try expect(UInt8(ascii: "{"))
        skipSpace()
        if peek() == UInt8(ascii: "}") { index += 1; return }
        while true {
            skipSpace()
            let keyAt = index
            let key = try readKey()
            try expect(UInt8(ascii: ":"))
            let outer = currentFieldAt
            currentFieldAt = keyAt
            try field(&self, key)
            currentFieldAt = outer
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
        let (start, end, plain) = try scanString()
        if plain { return String(decoding: bytes[start..<end], as: UTF8.self) }
        return try unescape(start, end)
    }

    /// A string value, returned as `known` itself when it has the same text: no new `String`
    /// for a value that repeats from one message to the next.
    public mutating func readString(reusing known: String?) throws(Failure) -> String {
        guard var known else { return try readString() }
        let (start, end, plain) = try scanString()
        guard plain else { return try unescape(start, end) }
        let same = known.withUTF8 { knownBytes in
            knownBytes.count == end - start
                && (knownBytes.isEmpty || bytes.withUnsafeBufferPointer { memcmp($0.baseAddress! + start, knownBytes.baseAddress!, knownBytes.count) == 0 })
        }
        return same ? known : String(decoding: bytes[start..<end], as: UTF8.self)
    }

    /// A string value from a fixed set (a fix's `source`), read as a key is: matched as packed
    /// bytes, without making a `String` of it.
    mutating func readSymbol() throws(Failure) -> JSONKey { try readKey() }

    private mutating func readKey() throws(Failure) -> JSONKey {
        let (start, end, plain) = try scanString()
        guard plain else { return JSONKey(try unescape(start, end)) }
        return bytes.withUnsafeBufferPointer { JSONKey(UnsafeBufferPointer(rebasing: $0[start..<end])) }
    }

    /// Reads past the string that comes next: its contents are `start..<end`, and `plain` says
    /// whether they hold no escapes.
    private mutating func scanString() throws(Failure) -> (start: Int, end: Int, plain: Bool) {
        try expect(UInt8(ascii: "\""))
        let start = index
        // The loop runs over every byte of every string on the bus: through the buffer, whose
        // `while` condition is the only bounds check.
        let (end, plain, control) = bytes.withUnsafeBufferPointer { buffer in
            var position = start
            var plain = true
            while position < buffer.count {
                let byte = buffer[position]
                if byte == UInt8(ascii: "\"") { return (position, plain, false) }
                if byte == UInt8(ascii: "\\") {
                    plain = false
                    position += 2
                    continue
                }
                if byte < 0x20 { return (position, plain, true) }
                position += 1
            }
            return (buffer.count, plain, false)
        }
        index = end
        guard !control else { throw failure("control character in string") }
        guard end < bytes.count else { throw failure("unterminated string") }
        index += 1
        return (start, end, plain)
    }

    /// Decodes the escapes of a string scanned from `start` to `end` (its closing quote):
    /// `\"` `\\` `\/` `\b` `\f` `\n` `\r` `\t` and `\uXXXX`, a surrogate pair as one
    /// character. Anything else, or a lone surrogate, is an invalid escape. (Foundation's decoder,
    /// once made per string here, made a body of many escaped strings slow to even skip.)
    private func unescape(_ start: Int, _ end: Int) throws(Failure) -> String {
        func hex(at position: Int) -> UInt32? {
            guard position + 4 <= end else { return nil }
            var value: UInt32 = 0
            for byte in bytes[position..<(position + 4)] {
                switch byte {
                case UInt8(ascii: "0")...UInt8(ascii: "9"): value = value << 4 | UInt32(byte - UInt8(ascii: "0"))
                case UInt8(ascii: "a")...UInt8(ascii: "f"): value = value << 4 | UInt32(byte - UInt8(ascii: "a") + 10)
                case UInt8(ascii: "A")...UInt8(ascii: "F"): value = value << 4 | UInt32(byte - UInt8(ascii: "A") + 10)
                default: return nil
                }
            }
            return value
        }
        var text: [UInt8] = []
        text.reserveCapacity(end - start)
        var position = start
        while position < end {
            let byte = bytes[position]
            guard byte == UInt8(ascii: "\\") else {
                text.append(byte)
                position += 1
                continue
            }
            guard position + 1 < end else { throw failure("invalid string escape") }
            let escaped = bytes[position + 1]
            position += 2
            switch escaped {
            case UInt8(ascii: "\""), UInt8(ascii: "\\"), UInt8(ascii: "/"): text.append(escaped)
            case UInt8(ascii: "b"): text.append(0x08)
            case UInt8(ascii: "f"): text.append(0x0C)
            case UInt8(ascii: "n"): text.append(0x0A)
            case UInt8(ascii: "r"): text.append(0x0D)
            case UInt8(ascii: "t"): text.append(0x09)
            case UInt8(ascii: "u"):
                guard var value = hex(at: position) else { throw failure("invalid string escape") }
                position += 4
                if (0xD800...0xDBFF).contains(value) {
                    guard position + 1 < end, bytes[position] == UInt8(ascii: "\\"), bytes[position + 1] == UInt8(ascii: "u"),
                          let low = hex(at: position + 2), (0xDC00...0xDFFF).contains(low)
                    else { throw failure("invalid string escape: a lone surrogate") }
                    position += 6
                    value = 0x10000 + ((value - 0xD800) << 10) + (low - 0xDC00)
                }
                guard let scalar = Unicode.Scalar(value) else { throw failure("invalid string escape: a lone surrogate") }
                text.append(contentsOf: UTF8.encode(scalar)!)
            default:
                throw failure("invalid string escape")
            }
        }
        return String(decoding: text, as: UTF8.self)
    }

    /// One pass validates the JSON number grammar and gathers the digits. Clinger's fast path
    /// then covers the numbers phones send (`48.2082123`, `-3.5`, `180`): when the digits fit in
    /// 53 bits and there are at most 22 decimals, one division of two exact doubles is correctly
    /// rounded, so it equals `strtod`. Exponents and long mantissas go to `strtod`.
    /// A number's parts, scanned and checked against JSON's grammar from `start` to `end`.
    private struct ScannedNumber {
        let start: Int, end: Int
        let negative: Bool
        /// The digits without the point, exact while `exact`.
        let mantissa: UInt64
        /// At most 2^53 in the digits and no exponent: the value is `mantissa / 10^decimals`.
        let exact: Bool
        let decimals: Int
    }

    private func scanNumber() throws(Failure) -> ScannedNumber {
        let start = index
        var position = index
        var negative = false
        var mantissa: UInt64 = 0
        var exact = true
        var decimals = 0
        func digit(at position: Int) -> UInt64? {
            guard position < bytes.count else { return nil }
            let value = bytes[position] &- UInt8(ascii: "0")
            return value < 10 ? UInt64(value) : nil
        }
        func gather(_ value: UInt64) {
            guard exact else { return }
            mantissa = mantissa &* 10 &+ value
            if mantissa >= 1 << 53 { exact = false }
        }
        if position < bytes.count, bytes[position] == UInt8(ascii: "-") {
            negative = true
            position += 1
        }
        let integerStart = position
        while let value = digit(at: position) { gather(value); position += 1 }
        var valid = position > integerStart && !(position - integerStart > 1 && bytes[integerStart] == UInt8(ascii: "0"))
        if valid, position < bytes.count, bytes[position] == UInt8(ascii: ".") {
            position += 1
            let fractionStart = position
            while let value = digit(at: position) { gather(value); decimals += 1; position += 1 }
            valid = position > fractionStart
        }
        if valid, position < bytes.count, bytes[position] == UInt8(ascii: "e") || bytes[position] == UInt8(ascii: "E") {
            exact = false
            position += 1
            if position < bytes.count, bytes[position] == UInt8(ascii: "+") || bytes[position] == UInt8(ascii: "-") { position += 1 }
            let exponentStart = position
            while digit(at: position) != nil { position += 1 }
            valid = position > exponentStart
        }
        // What follows must not continue the number: `1.2.3`, `1-2` and `0x10` are not numbers.
        if position < bytes.count, Self.isNumberByte(bytes[position]) || Self.isLetter(bytes[position]) { valid = false }
        guard valid else {
            var end = start
            while end < bytes.count, Self.isNumberByte(bytes[end]) { end += 1 }
            if end == start { throw failure("expected a number") }
            throw failure("invalid number \(String(decoding: bytes[start..<end], as: UTF8.self))")
        }
        return ScannedNumber(start: start, end: position, negative: negative, mantissa: mantissa, exact: exact, decimals: decimals)
    }

    public mutating func readDouble() throws(Failure) -> Double {
        skipSpace()
        let number = try scanNumber()
        let (start, position, negative, mantissa, exact, decimals) = (
            number.start, number.end, number.negative, number.mantissa, number.exact, number.decimals
        )
        index = position
        if exact, decimals <= 22 {
            let magnitude = decimals > 0 ? Double(mantissa) / Self.powersOfTen[decimals] : Double(mantissa)
            return negative ? -magnitude : magnitude
        }
        let value: Double? = bytes.withUnsafeBufferPointer { buffer in
            // strtod stops at the first byte that is not part of the number, and the byte after
            // the number is inside the buffer unless the document is a bare number.
            guard position < buffer.count else { return Double(String(decoding: buffer[start..<position], as: UTF8.self)) }
            var stop: UnsafeMutablePointer<CChar>?
            let base = UnsafeRawPointer(buffer.baseAddress! + start).assumingMemoryBound(to: CChar.self)
            let parsed = strtod(base, &stop)
            return stop.map { UnsafeRawPointer($0) - UnsafeRawPointer(base) } == position - start ? parsed : nil
        }
        guard let value, value.isFinite else {
            throw failure("invalid number \(String(decoding: bytes[start..<position], as: UTF8.self))")
        }
        return value
    }

    private static let powersOfTen: [Double] = (0...22).map { exponent in
        (0..<exponent).reduce(1.0) { value, _ in value * 10 }  // each step exact: 10^22 = 2^22 · 5^22 < 2^53 · 2^22
    }

    public mutating func readUInt64() throws(Failure) -> UInt64 {
        skipSpace()
        let start = index
        var value: UInt64 = 0
        var overflow = false
        while index < bytes.count, (48...57).contains(bytes[index]) {
            let (times10, o1) = value.multipliedReportingOverflow(by: 10)
            let (sum, o2) = times10.addingReportingOverflow(UInt64(bytes[index] - 48))
            overflow = overflow || o1 || o2
            value = sum
            index += 1
        }
        guard index > start, !overflow else { throw failure("expected a non-negative integer") }
        if index < bytes.count, Self.isNumberByte(bytes[index]) { throw failure("expected an integer") }
        return value
    }

    public mutating func readInt() throws(Failure) -> Int {
        skipSpace()
        let negative = peek() == UInt8(ascii: "-")
        if negative { index += 1 }
        let magnitude = try readUInt64()
        // Int.min's magnitude is one more than Int.max's.
        guard magnitude <= Int.max.magnitude + (negative ? 1 : 0) else { throw failure("integer out of range") }
        return negative ? Int(truncatingIfNeeded: 0 &- magnitude) : Int(magnitude)
    }

    public mutating func readDate() throws(Failure) -> Date {
        skipSpace()
        let (start, end, plain) = try scanString()
        // Plain timestamps are parsed straight from the buffer.
        let date = plain ? RFC3339.parse(utf8: bytes[start..<end]) : RFC3339.parse(try unescape(start, end))
        guard let date else {
            let text = plain ? String(decoding: bytes[start..<end], as: UTF8.self) : (try? unescape(start, end)) ?? ""
            throw failure("expected an RFC 3339 time, got \"\(text)\"")
        }
        return date
    }

    public mutating func readStringMap() throws(Failure) -> [String: String] {
        var map: [String: String] = [:]
        try readObject { (reader: inout JSONReader, key: JSONKey) throws(Failure) in map[key.description] = try reader.readString() }
        return map
    }

    /// Skips any value: unknown fields are ignored, as the bus's rules require. Nesting is
    /// limited, so a hostile document cannot exhaust the stack.
    /// Reads past a string; its escapes, if it has any, are checked.
    private mutating func skipString() throws(Failure) {
        let (start, end, plain) = try scanString()
        if !plain { _ = try unescape(start, end) }
    }

    /// Reads past any value, checked to be JSON, without making its strings or numbers (keys
    /// are packed, as `readObject` does, so that an error names the innermost one).
    public mutating func skipValue(depth: Int = 0) throws(Failure) {
        guard depth < 64 else { throw failure("nested too deeply") }
        skipSpace()
        guard index < bytes.count else { throw failure("unexpected end") }
        switch bytes[index] {
        case UInt8(ascii: "\""): try skipString()
        case UInt8(ascii: "{"): try readObject { (reader: inout JSONReader, _: JSONKey) throws(Failure) in try reader.skipValue(depth: depth + 1) }
        case UInt8(ascii: "["): try readArray { (reader: inout JSONReader) throws(Failure) in try reader.skipValue(depth: depth + 1) }
        case UInt8(ascii: "t"): try literal("true")
        case UInt8(ascii: "f"): try literal("false")
        case UInt8(ascii: "n"): try literal("null")
        default:
            let number = try scanNumber()
            // Beyond the exact path, whether the value is finite is strtod's to say.
            guard number.exact, number.decimals <= 22 else { _ = try readDouble(); return }
            index = number.end
        }
    }

    /// Reads past any value and returns its bytes as they are, checked to be JSON: a document
    /// embedded in another goes on unchanged, without a tree made of it and written again.
    public mutating func readRawValue() throws(Failure) -> [UInt8] {
        skipSpace()
        let start = index
        try skipValue()
        return Array(bytes[start..<index])
    }

    /// Takes the next `byteCount` bytes as an object, as its writer framed it, without reading
    /// them: only that they start with `{` and end with `}` is checked. For payloads whose
    /// producer is trusted and which the consumer decodes anyway; a wrong count leaves the
    /// reader inside or past the value, and what follows then fails to read.
    public mutating func readRawObject(byteCount: Int) throws(Failure) -> [UInt8] {
        skipSpace()
        guard byteCount >= 2, byteCount <= bytes.count - index, bytes[index] == UInt8(ascii: "{"),
              bytes[index + byteCount - 1] == UInt8(ascii: "}") else { throw failure("not an object of \(byteCount) bytes") }
        defer { index += byteCount }
        return Array(bytes[index..<(index + byteCount)])
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

    /// Where the reader is, to come back to with `rewind(to:)`.
    var offset: Int { index }

    /// Goes back to an `offset` read before: a reader that tried a document's expected layout
    /// and found another reads it again the general way. (Not a closure that returns what it
    /// read: a fix passed back through one cost 4 % of decoding it.)
    mutating func rewind(to offset: Int) { index = offset }

    /// Consumes `text`, after a comma when `afterComma`, if exactly those bytes come next (no
    /// space skipped): a key with its quotes and colon, as this project writes them, costs one
    /// comparison, and nothing is consumed when it is not there.
    @inline(__always)
    mutating func take(_ text: StaticString, afterComma: Bool = false) -> Bool {
        let comma = afterComma ? 1 : 0, count = text.utf8CodeUnitCount
        guard bytes.count - index >= comma + count else { return false }
        let same = bytes.withUnsafeBufferPointer { buffer in
            (!afterComma || buffer[index] == UInt8(ascii: ",")) && memcmp(buffer.baseAddress! + index + comma, text.utf8Start, count) == 0
        }
        if same { index += comma + count }
        return same
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

    @inline(__always)
    private mutating func expect(_ byte: UInt8) throws(Failure) {
        skipSpace()
        guard index < bytes.count, bytes[index] == byte else {
            throw failure("expected \(Character(Unicode.Scalar(byte)))")
        }
        index += 1
    }

    @inline(__always)
    private func peek() -> UInt8? { index < bytes.count ? bytes[index] : nil }

    /// Inlined with its first test: the bus's JSON is compact, so mostly no space follows.
    @inline(__always)
    private mutating func skipSpace() {
        guard index < bytes.count, bytes[index] <= 0x20 else { return }
        skipSpaceRun()
    }

    private mutating func skipSpaceRun() {
        while index < bytes.count {
            let byte = bytes[index]
            guard byte == 0x20 || byte == 0x0A || byte == 0x0D || byte == 0x09 else { return }
            index += 1
        }
    }

    private static func isLetter(_ byte: UInt8) -> Bool { (0x41...0x5A).contains(byte) || (0x61...0x7A).contains(byte) }

    private static func isNumberByte(_ byte: UInt8) -> Bool {
        (48...57).contains(byte) || byte == UInt8(ascii: "-") || byte == UInt8(ascii: "+") || byte == UInt8(ascii: ".")
            || byte == UInt8(ascii: "e") || byte == UInt8(ascii: "E")
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
            try readObject { (reader: inout JSONReader, key: JSONKey) throws(Failure) in
                object[key.description] = try reader.readValue(depth: depth + 1)
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

/// A number written with the fewest decimals (up to 9) that read back as exactly it, the digits
/// `description` writes, without making a String: coordinates and readings are most of the
/// numbers on the bus. None for a value outside 0.001 ..< 1e9 or one that needs more decimals.
///
/// For each count of decimals `d`, `m = round(|value| × 10^d)` is tried: below 2^53 both `m` and
/// `10^d` are exact, so `m / 10^d` is correctly rounded, the double any exact reader makes of the
/// decimal. If that is `value`, the decimal reads back as it.
struct FewDecimals {
    private let negative: Bool
    private let digits: UInt64
    private let decimals: Int
    private let power: UInt64

    init?(_ value: Double) {
        let magnitude = value.magnitude
        guard magnitude >= 0.001, magnitude < 1e9 else { return nil }
        var scale = 10.0
        var power: UInt64 = 10
        for decimals in 1...9 {
            let scaled = Self.wholeNearest(magnitude * scale)
            if scaled < 9_007_199_254_740_992, scaled / scale == magnitude {
                (self.negative, self.digits, self.decimals, self.power) = (value < 0, UInt64(scaled), decimals, power)
                return
            }
            scale *= 10
            power *= 10
        }
        return nil
    }

    /// `x` (≥ 0) rounded to a whole number, to nearest, ties to even: adding 2^52 leaves no bits
    /// below the units, and taking it away again is exact; from 2^52 on a double is whole. No
    /// call into libm, which `rounded()` makes on the baseline x86-64 target. At a tie (the
    /// product can be exactly k + 0.5 from 2^50 on) the choice can decide whether these digits
    /// or `description` write the number, but the text is the same either way (tested).
    @inline(__always)
    static func wholeNearest(_ x: Double) -> Double {
        x < 0x1p52 ? (x + 0x1p52) - 0x1p52 : x
    }

    /// At most 20 bytes: a sign, nine digits, the point and nine decimals.
    func write(to out: inout OutputSpan<UInt8>) {
        if negative { out.append(UInt8(ascii: "-")) }
        out.appendDecimal(digits / power)
        out.append(UInt8(ascii: "."))
        var fraction = digits % power
        var place = power / 10
        for _ in 0..<decimals {
            out.append(UInt8(ascii: "0") + UInt8(fraction / place))
            fraction %= place
            place /= 10
        }
    }
}

extension [UInt8] {
    /// Appends `value` in decimal without making a String: integers are in every header and fix.
    public mutating func appendDecimal(_ value: UInt64) {
        append(addingCapacity: 20) { $0.appendDecimal(value) }
    }

    public mutating func appendDecimal(_ value: Int64) {
        append(addingCapacity: 21) { $0.appendDecimal(value) }
    }
}

extension OutputSpan<UInt8> {
    /// At most 20 bytes, written in place from the last digit back.
    mutating func appendDecimal(_ value: UInt64) {
        var count = 1, power: UInt64 = 10
        while count < 20, value >= power {
            count += 1
            if count < 20 { power &*= 10 }
        }
        withUnsafeMutableBufferPointer { buffer, initialized in
            precondition(buffer.count - initialized >= count, "no room made for \(count) digits")
            var rest = value, index = initialized + count
            repeat {
                index -= 1
                buffer[index] = UInt8(ascii: "0") + UInt8(rest % 10)
                rest /= 10
            } while rest > 0
            initialized += count
        }
    }

    /// At most 21 bytes.
    mutating func appendDecimal(_ value: Int64) {
        if value < 0 { append(UInt8(ascii: "-")) }
        appendDecimal(value.magnitude)
    }

    /// Copies `bytes` in; the caller made room for them.
    @inline(__always)
    mutating func append(copying bytes: UnsafeRawBufferPointer) {
        guard let source = bytes.baseAddress else { return }
        withUnsafeMutableBufferPointer { buffer, initialized in
            precondition(buffer.count - initialized >= bytes.count, "no room made for \(bytes.count) bytes")
            UnsafeMutableRawPointer(buffer.baseAddress! + initialized).copyMemory(from: source, byteCount: bytes.count)
            initialized += bytes.count
        }
    }
}
