/// Seeded, deterministic mutations of valid samples, for fuzzing every parser drivebus exposes:
/// bit flips, truncation, invalid UTF-8, huge numbers, NaN and infinities, deep nesting,
/// duplicate keys, wrong types, splices of other samples. The same seed gives the same cases.
public struct Mutator: Sendable {
    public private(set) var random: SplitMix64

    public init(seed: UInt64) {
        random = SplitMix64(seed: seed)
    }

    /// Whole-value replacements for a number or a string: what a hostile client sends.
    static let hostileValues: [String] = [
        "1e999", "-1e999", "1e308", "-1e308", "NaN", "nan", "Infinity", "-Infinity", "inf", "-0", "0x10", "1e-400",
        "99999999999999999999999999", "-99999999999999999999999999", "18446744073709551616", "9001", "\"\"", "null", "true",
        "[]", "{}", "\"x\"", "[[[[[]]]]]", "\"\\u0000\"", "\"\\ud800\"", "\"\\uZZZZ\"", "0.0000000000000000000000001",
    ]

    static let invalidUTF8: [[UInt8]] = [
        [0xFF], [0xFE, 0xFF], [0xC3], [0xC0, 0x80], [0xED, 0xA0, 0x80], [0xF8, 0x88, 0x80, 0x80, 0x80], [0xE2, 0x28, 0xA1], [0x80, 0x80],
    ]

    static let fragments: [String] = [
        "\"lat\":1,", "\"tst\":\"1700000000\",", "<!DOCTYPE x [<!ENTITY a \"aaaaaaaaaa\"><!ENTITY b \"&a;&a;&a;&a;&a;&a;\">]>", "&b;",
        "<trkpt lat=\"1\" lon=\"2\">", "</gpx>", "%", "%zz", "%ff%fe", "&&&===", "\r\n", "\u{0000}", ",,,", "\"\\\"", "]]]]", "}}}}",
        "time,latitude,longitude\n", "\n2025-01-01T00:00:00Z,1,2", "<![CDATA[", "<?xml version=\"1.0\" encoding=\"UTF-16\"?>",
    ]

    public mutating func int(_ upper: Int) -> Int { upper <= 1 ? 0 : Int(random.next() % UInt64(upper)) }

    public mutating func pick<T>(_ items: [T]) -> T { items[int(items.count)] }

    /// One to four mutations of `sample`; `corpus` is spliced from.
    public mutating func mutate(_ sample: [UInt8], corpus: [[UInt8]]) -> [UInt8] {
        var bytes = sample
        for _ in 0...int(4) { bytes = mutateOnce(bytes, corpus: corpus) }
        return bytes
    }

    private mutating func mutateOnce(_ input: [UInt8], corpus: [[UInt8]]) -> [UInt8] {
        var bytes = input
        let at = int(bytes.count + 1)
        switch int(12) {
        case 0:  // bit flip
            if !bytes.isEmpty { bytes[int(bytes.count)] ^= UInt8(1) << UInt8(int(8)) }
        case 1:  // truncation
            bytes = Array(bytes.prefix(at))
        case 2:  // invalid UTF-8, anywhere (names, values, keys)
            bytes.insert(contentsOf: pick(Self.invalidUTF8), at: at)
        case 3:  // a number or a value replaced by a hostile one
            bytes = replaceToken(bytes, with: Array(pick(Self.hostileValues).utf8))
        case 4:  // deep nesting
            let depth = 1 + int(20_000)
            let open = pick(["[", "{\"a\":", "<a>"])
            let close = open == "[" ? "]" : open == "<a>" ? "</a>" : "}"
            bytes = Array(String(repeating: open, count: depth).utf8) + bytes + Array(String(repeating: close, count: int(2) == 0 ? depth : 0).utf8)
        case 5:  // duplicate keys, structural fragments
            bytes.insert(contentsOf: Array(pick(Self.fragments).utf8), at: at)
        case 6:  // delete a range
            if !bytes.isEmpty {
                let start = int(bytes.count)
                bytes.removeSubrange(start..<min(bytes.count, start + 1 + int(16)))
            }
        case 7:  // duplicate a range
            if !bytes.isEmpty {
                let start = int(bytes.count)
                let piece = bytes[start..<min(bytes.count, start + 1 + int(64))]
                bytes.insert(contentsOf: piece, at: int(bytes.count + 1))
            }
        case 8:  // splice another sample
            if let other = corpus.isEmpty ? nil : pick(corpus), !other.isEmpty {
                let start = int(other.count)
                bytes.insert(contentsOf: other[start..<min(other.count, start + 1 + int(200))], at: at)
            }
        case 9:  // random bytes
            bytes.insert(contentsOf: (0..<(1 + int(8))).map { _ in UInt8(truncatingIfNeeded: random.next()) }, at: at)
        case 10:  // a huge string value
            bytes.insert(contentsOf: Array(String(repeating: "x", count: 1 + int(100_000)).utf8), at: at)
        default:  // a byte set to a structural character
            if !bytes.isEmpty { bytes[int(bytes.count)] = pick(Array("{}[]\",:<>&=%\\".utf8)) }
        }
        return bytes
    }

    /// Replaces one number (or quoted string) in `bytes` with `value`; appends it if there is none.
    private mutating func replaceToken(_ bytes: [UInt8], with value: [UInt8]) -> [UInt8] {
        let starts = bytes.indices.filter { index in
            let byte = bytes[index]
            let previous = index > 0 ? bytes[index - 1] : 0
            return (byte == UInt8(ascii: "-") || (0x30...0x39).contains(byte) || byte == UInt8(ascii: "\""))
                && !(0x30...0x39).contains(previous) && previous != UInt8(ascii: ".")
        }
        guard !starts.isEmpty else { return bytes + value }
        let start = pick(starts)
        var end = start + 1
        if bytes[start] == UInt8(ascii: "\"") {
            while end < bytes.count, bytes[end] != UInt8(ascii: "\"") { end += 1 }
            end = min(end + 1, bytes.count)
        } else {
            while end < bytes.count, "0123456789.eE+-".utf8.contains(bytes[end]) { end += 1 }
        }
        return Array(bytes[..<start]) + value + Array(bytes[end...])
    }
}
