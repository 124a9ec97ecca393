import DrivebusSchema
import Foundation

/// A native batch of fixes as drivebus's own tools write it (`drivebus import`'s `publish`): read
/// straight from the bytes, without building a JSON tree, which was a third of ingest's time per
/// imported point. Only the plain shape is taken: known keys, numbers as numbers, RFC 3339 times.
/// Anything else returns nil and the batch is read the general way (`ClientParsers.nativeFixes`),
/// so every error and every leniency stays that path's.
public struct NativeBatch {
    var device: String
    var items: [PackedFixes.Fix]

    init(device: String, items: [PackedFixes.Fix]) {
        self.device = device
        self.items = items
    }

    /// A `publish_packed` batch: the same fixes, already in binary.
    init(packed: (device: String, fixes: [PackedFixes.Fix])) {
        self.init(device: packed.device, items: packed.fixes)
    }

    /// Whether `body` has the plain shape (for tests: the two paths must agree).
    public static func isPlain(_ body: String) -> Bool { read(Array(body.utf8)) != nil }

    static func read(_ body: [UInt8]) -> NativeBatch? {
        var reader = JSONReader(body)
        var device: String?
        var items: [PackedFixes.Fix] = []
        do throws(JSONReader.Failure) {
            try reader.readObject { reader, key throws(JSONReader.Failure) in
                switch key {
                case "op": _ = try reader.readString()
                case "device": device = try reader.readString()
                case "fixes":
                    try reader.readArray { reader throws(JSONReader.Failure) in
                        guard items.count < IngestLimits.batchItems else { throw reader.failure("too many") }
                        items.append(try readItem(&reader))
                    }
                default: throw reader.failure("not the plain shape")
                }
            }
            try reader.finish()
        } catch {
            return nil
        }
        guard let device else { return nil }
        return NativeBatch(device: device, items: items)
    }

    private static func readItem(_ reader: inout JSONReader) throws(JSONReader.Failure) -> PackedFixes.Fix {
        var time: Date?, lat: Double?, lon: Double?
        var item = PackedFixes.Fix(time: .distantPast, lat: 0, lon: 0)
        try reader.readObject { reader, key throws(JSONReader.Failure) in
            switch key {
            case "time": time = try reader.readDate()
            case "lat": lat = try reader.readDouble()
            case "lon": lon = try reader.readDouble()
            case "accuracy_m": item.accuracyM = try reader.readDouble()
            case "altitude_m": item.altitudeM = try reader.readDouble()
            case "speed_mps": item.speedMps = try reader.readDouble()
            case "course_deg": item.courseDeg = try reader.readDouble()
            case "battery": item.battery = try reader.readDouble()
            default: throw reader.failure("not the plain shape")
            }
        }
        guard let time, let lat, let lon else { throw reader.failure("not the plain shape") }
        item.time = time
        item.lat = lat
        item.lon = lon
        return item
    }
}
