import Foundation

/// A batch of fixes as `drivebus import` hands them to ingest (the `publish_packed` RPC): a JSON
/// head line, `{"op":"publish_packed","device":"car","count":5000}`, then the fixes in binary.
/// Writing a batch as JSON and parsing it back was a seventh of an import's CPU, and both ends
/// are drivebus; what a phone sends stays JSON.
///
/// Each fix: a flags byte (which optional readings follow), the time (seconds since 1970), lat
/// and lon, then the readings that are there (accuracy 1, altitude 2, speed 4, course 8, battery
/// 16, in that order); every number is a little-endian IEEE 754 double.
public enum PackedFixes {
    public static let op = "publish_packed"

    /// A fix as a local tool sends it, before ingest checks it (also what ingest reads from a
    /// plain JSON `publish`).
    public struct Fix: Sendable, Equatable {
        public var time: Date
        public var lat: Double
        public var lon: Double
        public var accuracyM: Double?
        public var altitudeM: Double?
        public var speedMps: Double?
        public var courseDeg: Double?
        /// 0 to 1.
        public var battery: Double?

        public init(
            time: Date, lat: Double, lon: Double, accuracyM: Double? = nil, altitudeM: Double? = nil, speedMps: Double? = nil, courseDeg: Double? = nil,
            battery: Double? = nil
        ) {
            self.time = time
            self.lat = lat
            self.lon = lon
            self.accuracyM = accuracyM
            self.altitudeM = altitudeM
            self.speedMps = speedMps
            self.courseDeg = courseDeg
            self.battery = battery
        }
    }

    /// Why a body is not a packed batch, and where.
    public struct Failure: Error, Sendable, Equatable, CustomStringConvertible {
        public let field: String
        public let reason: String
        public var description: String { "\(field): \(reason)" }

        public init(field: String, reason: String) {
            self.field = field
            self.reason = reason
        }
    }

    private struct Head: Decodable {
        var op: String
        var device: String
        var count: Int
    }

    public static func encode(device: String, fixes: [Fix]) -> [UInt8] {
        // By hand, `op` first: the RPC service reads a request's op from its first bytes.
        var head = JSONWriter()
        head.beginObject()
        head.key("op"); head.string(op)
        head.key("device"); head.string(device)
        head.key("count"); head.number(UInt64(fixes.count))
        head.endObject()
        var out = head.bytes
        out.append(0x0A)
        out.reserveCapacity(out.count + fixes.count * 41)
        func put(_ value: Double) { withUnsafeBytes(of: value.bitPattern.littleEndian) { out.append(contentsOf: $0) } }
        for fix in fixes {
            let flags: UInt8 = (fix.accuracyM == nil ? 0 : 1) | (fix.altitudeM == nil ? 0 : 2) | (fix.speedMps == nil ? 0 : 4)
                | (fix.courseDeg == nil ? 0 : 8) | (fix.battery == nil ? 0 : 16)
            out.append(flags)
            put(fix.time.timeIntervalSince1970)
            put(fix.lat)
            put(fix.lon)
            if let accuracyM = fix.accuracyM { put(accuracyM) }
            if let altitudeM = fix.altitudeM { put(altitudeM) }
            if let speedMps = fix.speedMps { put(speedMps) }
            if let courseDeg = fix.courseDeg { put(courseDeg) }
            if let battery = fix.battery { put(battery) }
        }
        return out
    }

    public static func decode(_ body: [UInt8]) throws(Failure) -> (device: String, fixes: [Fix]) {
        guard let newline = body.firstIndex(of: 0x0A),
              let head = try? BusJSON.decode(Head.self, from: Array(body[..<newline])), head.op == op else {
            throw Failure(field: "body", reason: "expected a {\"op\":\"\(op)\",\"device\",\"count\"} line before the fixes")
        }
        guard head.count >= 0, head.count <= (body.count - newline - 1) / 25 else {
            throw Failure(field: "count", reason: "\(head.count) fixes cannot fit in \(body.count - newline - 1) bytes")
        }
        var fixes: [Fix] = []
        fixes.reserveCapacity(head.count)
        var at = newline + 1
        let failure = body.withUnsafeBytes { (raw: UnsafeRawBufferPointer) -> Failure? in
            do throws(Failure) {
                try readFixes(raw)
                return nil
            } catch {
                return error
            }
        }
        if let failure { throw failure }
        guard at == body.count else { throw Failure(field: "body", reason: "\(body.count - at) bytes after the last fix") }
        return (head.device, fixes)

        func readFixes(_ raw: UnsafeRawBufferPointer) throws(Failure) {
            for index in 0..<head.count {
                func double() throws(Failure) -> Double {
                    guard at + 8 <= raw.count else { throw Failure(field: "fixes[\(index)]", reason: "the body ends inside it") }
                    defer { at += 8 }
                    return Double(bitPattern: UInt64(littleEndian: raw.loadUnaligned(fromByteOffset: at, as: UInt64.self)))
                }
                guard at < raw.count else { throw Failure(field: "fixes[\(index)]", reason: "the body ends before it") }
                let flags = raw[at]
                at += 1
                guard flags < 32 else { throw Failure(field: "fixes[\(index)]", reason: "unknown flags \(flags)") }
                let time = try double()
                guard time.isFinite else { throw Failure(field: "fixes[\(index)].time", reason: "is not a number") }
                var fix = Fix(time: Date(timeIntervalSince1970: time), lat: try double(), lon: try double())
                if flags & 1 != 0 { fix.accuracyM = try double() }
                if flags & 2 != 0 { fix.altitudeM = try double() }
                if flags & 4 != 0 { fix.speedMps = try double() }
                if flags & 8 != 0 { fix.courseDeg = try double() }
                if flags & 16 != 0 { fix.battery = try double() }
                fixes.append(fix)
            }
        }
    }
}
