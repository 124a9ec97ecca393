import Foundation

extension EnvelopeHeader: FastJSONDecodable {
    public init(reading reader: inout JSONReader) throws(JSONReader.Failure) {
        try self.init(reading: &reader, knownEpoch: nil)
    }

    /// Reads a header whose epoch is likely `knownEpoch`, the last one read from the same
    /// publisher: it is then kept, not made again (a subscriber reads one per message).
    init(reading reader: inout JSONReader, knownEpoch: String?) throws(JSONReader.Failure) {
        var v: Int?, id: String?, type: String?, source: String?, seq: UInt64?, epoch: String?, time: Date?, logSeq: UInt64?
        try reader.readObject { (reader: inout JSONReader, key: JSONKey) throws(JSONReader.Failure) in
            switch key {
            case "v": v = try reader.readInt()
            case "id": id = try reader.readString()
            case "type": type = try reader.readString()
            case "source": source = try reader.readString()
            case "seq": seq = try reader.readUInt64()
            case "epoch": epoch = try reader.readString(reusing: knownEpoch)
            case "time": time = try reader.readDate()
            case "log_seq": logSeq = try reader.readUInt64()
            default: try reader.skipValue()
            }
        }
        func required<T>(_ value: T?, _ name: String) throws(JSONReader.Failure) -> T {
            guard let value else { throw JSONReader.Failure(field: name, reason: "is required") }
            return value
        }
        self.init(
            id: try required(id, "id"), type: try required(type, "type"), source: try required(source, "source"),
            seq: try required(seq, "seq"), epoch: try required(epoch, "epoch"), time: try required(time, "time"), logSeq: logSeq)
        self.v = try required(v, "v")
    }
}

extension FixSource {
    /// Every source by its name as packed bytes: matched without a `String` or the generic
    /// string `switch` that `init(rawValue:)` makes (every consumer reads every fix's source).
    private static let byName = allCases.map { (name: JSONKey($0.rawValue), source: $0) }

    /// The source whose name `name` is; nil for none.
    init?(named name: JSONKey) {
        guard let known = Self.byName.first(where: { $0.name == name })?.source else { return nil }
        self = known
    }
}

extension Fix: FastJSONEncodable, FastJSONDecodable {
    public func writeJSON(to writer: inout JSONWriter) {
        writer.beginObject()
        if let accuracyM { writer.key("accuracy_m"); writer.number(accuracyM) }
        if let altitudeM { writer.key("altitude_m"); writer.number(altitudeM) }
        if let battery { writer.key("battery"); writer.number(battery) }
        if let courseDeg { writer.key("course_deg"); writer.number(courseDeg) }
        writer.key("device"); writer.string(device)
        writer.key("lat"); writer.number(lat)
        writer.key("lon"); writer.number(lon)
        if let meta { writer.key("meta"); writer.stringMap(meta) }
        if let seq { writer.key("seq"); writer.number(seq) }
        writer.key("source"); writer.string(source.rawValue)
        if let speedMps { writer.key("speed_mps"); writer.number(speedMps) }
        writer.key("time"); writer.date(time)
        writer.endObject()
    }

    public init(reading reader: inout JSONReader) throws(JSONReader.Failure) {
        let start = reader.offset
        if let fix = Self(readingAsWritten: &reader) {
            self = fix
            return
        }
        reader.rewind(to: start)
        var seq: UInt64?, device: String?, time: Date?, lat: Double?, lon: Double?, source: FixSource?
        var accuracyM: Double?, altitudeM: Double?, speedMps: Double?, courseDeg: Double?, battery: Double?
        var meta: [String: String]?
        try reader.readObject { (reader: inout JSONReader, key: JSONKey) throws(JSONReader.Failure) in
            if reader.readNull() { return }
            switch key {
            case "seq": seq = try reader.readUInt64()
            case "device": device = try reader.readString()
            case "time": time = try reader.readDate()
            case "lat": lat = try reader.readDouble()
            case "lon": lon = try reader.readDouble()
            case "accuracy_m": accuracyM = try reader.readDouble()
            case "altitude_m": altitudeM = try reader.readDouble()
            case "speed_mps": speedMps = try reader.readDouble()
            case "course_deg": courseDeg = try reader.readDouble()
            case "battery": battery = try reader.readDouble()
            case "meta": meta = try reader.readStringMap()
            case "source":
                let name = try reader.readSymbol()
                guard let known = FixSource(named: name) else {
                    throw reader.failure("unknown source \"\(name)\"")
                }
                source = known
            default: try reader.skipValue()
            }
        }
        guard let device else { throw JSONReader.Failure(field: "device", reason: "is required") }
        guard let time else { throw JSONReader.Failure(field: "time", reason: "is required") }
        guard let lat else { throw JSONReader.Failure(field: "lat", reason: "is required") }
        guard let lon else { throw JSONReader.Failure(field: "lon", reason: "is required") }
        guard let source else { throw JSONReader.Failure(field: "source", reason: "is required") }
        self.init(
            seq: seq, device: device, time: time, lat: lat, lon: lon, accuracyM: accuracyM, altitudeM: altitudeM,
            speedMps: speedMps, courseDeg: courseDeg, battery: battery, source: source, meta: meta)
    }
}

extension Fix {
    /// Reads a fix laid out as `writeJSON` writes it (every journal record and bus message of a
    /// fix is): its keys in that order, no space, no nulls. Each key is then one comparison of
    /// bytes where the general reader scans it, packs it and matches it against every name, a
    /// third of decoding a fix, which every consumer does for every fix. Nil for anything else
    /// (the reader somewhere inside), which the general reader then reads, or rejects with the
    /// field named.
    init?(readingAsWritten reader: inout JSONReader) {
        var accuracyM: Double?, altitudeM: Double?, battery: Double?, courseDeg: Double?, meta: [String: String]?
        var seq: UInt64?, speedMps: Double?
        var fields = 0
        /// Takes `key` when it comes next, after the comma that separates it from the field before.
        func next(_ key: StaticString) -> Bool {
            guard reader.take(key, afterComma: fields > 0) else { return false }
            fields += 1
            return true
        }
        do {
            guard reader.take("{") else { return nil }
            if next(#""accuracy_m":"#) { accuracyM = try reader.readDouble() }
            if next(#""altitude_m":"#) { altitudeM = try reader.readDouble() }
            if next(#""battery":"#) { battery = try reader.readDouble() }
            if next(#""course_deg":"#) { courseDeg = try reader.readDouble() }
            guard next(#""device":"#) else { return nil }
            let device = try reader.readString()
            guard next(#""lat":"#) else { return nil }
            let lat = try reader.readDouble()
            guard next(#""lon":"#) else { return nil }
            let lon = try reader.readDouble()
            if next(#""meta":"#) { meta = try reader.readStringMap() }
            if next(#""seq":"#) { seq = try reader.readUInt64() }
            guard next(#""source":"#) else { return nil }
            let name = try reader.readSymbol()
            guard let source = FixSource(named: name) else { return nil }
            if next(#""speed_mps":"#) { speedMps = try reader.readDouble() }
            guard next(#""time":"#) else { return nil }
            let time = try reader.readDate()
            guard reader.take("}") else { return nil }
            self.init(
                seq: seq, device: device, time: time, lat: lat, lon: lon, accuracyM: accuracyM, altitudeM: altitudeM,
                speedMps: speedMps, courseDeg: courseDeg, battery: battery, source: source, meta: meta)
        } catch {
            return nil
        }
    }
}

/// Event ids shaped as UUIDs (version 8, RFC 9562): 60 bits that identify the publisher's run,
/// and 62 bits of its `seq`. Unique without a random draw per message.
public enum EventID {
    /// Every id's length in bytes.
    static let length = 36

    public static func make(run: UInt64, seq: UInt64) -> String {
        String(unsafeUninitializedCapacity: length) { buffer in
            var out = OutputSpan(buffer: buffer, initializedCount: 0)
            write(run: run, seq: seq, to: &out)
            return out.finalize(for: buffer)
        }
    }

    /// The id's 36 bytes, where the caller made room: a publisher writes it straight into the
    /// header (this is on every message a service publishes), without making a `String` of it.
    static func write(run: UInt64, seq: UInt64, to out: inout OutputSpan<UInt8>) {
        let high = (run & ~0xF000) | 0x8000  // version 8 in bits 48–51 of the first half
        let low = (seq & 0x3FFF_FFFF_FFFF_FFFF) | 0x8000_0000_0000_0000  // variant 10
        // 8-4-4-4-12 digits, made eight at a time and stored as words, each group then slid
        // into place: a word's worth of digits costs a few instructions, where one digit at a
        // time cost a branch and a bounds check each.
        var text: (UInt64, UInt64, UInt64, UInt64, UInt64) = (0, 0, 0, 0, 0)
        withUnsafeMutableBytes(of: &text) { text in
            func slide(_ from: Int, to: Int) {
                text.storeBytes(of: text.loadUnaligned(fromByteOffset: from, as: UInt32.self), toByteOffset: to, as: UInt32.self)
            }
            text.storeBytes(of: hexDigits(UInt32(truncatingIfNeeded: high >> 32)), toByteOffset: 0, as: UInt64.self)
            text.storeBytes(of: hexDigits(UInt32(truncatingIfNeeded: high)), toByteOffset: 10, as: UInt64.self)
            slide(10, to: 9)
            text.storeBytes(of: hexDigits(UInt32(truncatingIfNeeded: low >> 32)), toByteOffset: 20, as: UInt64.self)
            text.storeBytes(of: hexDigits(UInt32(truncatingIfNeeded: low)), toByteOffset: 28, as: UInt64.self)
            slide(20, to: 19)
            for dash in [8, 13, 18, 23] { text[dash] = UInt8(ascii: "-") }
            out.append(copying: UnsafeRawBufferPointer(rebasing: text[..<length]))
        }
    }

    /// The eight lowercase hex digits of `value`, most significant first in memory.
    @inline(__always)
    static func hexDigits(_ value: UInt32) -> UInt64 {
        // Spread the nibbles one to a byte, the most significant in the highest byte.
        var x = UInt64(value)
        x = (x | x << 16) & 0x0000_FFFF_0000_FFFF
        x = (x | x << 8) & 0x00FF_00FF_00FF_00FF
        x = (x | x << 4) & 0x0F0F_0F0F_0F0F_0F0F
        // "0"… for 0–9; a nibble of 10–15 carries into bit 4 when 6 is added, and gets "a" - "0" - 10 more.
        let letters = ((x &+ 0x0606_0606_0606_0606) >> 4) & 0x0101_0101_0101_0101
        x = x &+ 0x3030_3030_3030_3030 &+ letters &* 0x27
        return x.bigEndian
    }
}
