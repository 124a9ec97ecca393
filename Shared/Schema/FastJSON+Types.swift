import Foundation

extension EnvelopeHeader: FastJSONDecodable {
    public init(reading reader: inout JSONReader) throws(JSONReader.Failure) {
        var v: Int?, id: String?, type: String?, source: String?, seq: UInt64?, epoch: String?, time: Date?, logSeq: UInt64?
        try reader.readObject { (reader: inout JSONReader, key: JSONKey) throws(JSONReader.Failure) in
            switch key {
            case "v": v = try reader.readInt()
            case "id": id = try reader.readString()
            case "type": type = try reader.readString()
            case "source": source = try reader.readString()
            case "seq": seq = try reader.readUInt64()
            case "epoch": epoch = try reader.readString()
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
    static let byName = allCases.map { (name: JSONKey($0.rawValue), source: $0) }
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
                guard let known = FixSource.byName.first(where: { $0.name == name })?.source else {
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
        hex(high, from: 64, count: 8, to: &out)
        out.append(UInt8(ascii: "-"))
        hex(high, from: 32, count: 4, to: &out)
        out.append(UInt8(ascii: "-"))
        hex(high, from: 16, count: 4, to: &out)
        out.append(UInt8(ascii: "-"))
        hex(low, from: 64, count: 4, to: &out)
        out.append(UInt8(ascii: "-"))
        hex(low, from: 48, count: 12, to: &out)
    }

    /// `count` hex digits of `value`, the first of them ending at bit `from`.
    @inline(__always)
    private static func hex(_ value: UInt64, from: Int, count: Int, to out: inout OutputSpan<UInt8>) {
        for position in stride(from: from - 4, through: from - 4 * count, by: -4) {
            let digit = UInt8((value >> UInt64(position)) & 0xF)
            out.append(digit < 10 ? UInt8(ascii: "0") + digit : UInt8(ascii: "a") - 10 + digit)
        }
    }
}
