import DrivebusSchema
import Foundation
import GRDB
import StatsCore

/// A device the system knows now: from the config's `devices:`, or added with `drivebus device`.
public struct KnownDevice: Sendable, Equatable {
    public var id: String
    /// `config` or `added`.
    public var origin: String
    public var app: String?
    public var addedAt: Date?

    public init(id: String, origin: String, app: String? = nil, addedAt: Date? = nil) {
        self.id = id
        self.origin = origin
        self.app = app
        self.addedAt = addedAt
    }
}

extension StatsStore {
    /// `{"devices": [...]}`: every known device, and every device with stored fixes that is no
    /// longer known (`origin: "removed"`), by id: where it comes from, its app, when it was added,
    /// its first and last fix, and where the last fix was.
    public func devicesJSON(_ known: [KnownDevice]) async throws -> [UInt8] {
        let rows = try await pool.read { db -> [String: (first: Int64, last: Int64, lat: Double?, lon: Double?, accuracy: Double?)] in
            var found: [String: (first: Int64, last: Int64, lat: Double?, lon: Double?, accuracy: Double?)] = [:]
            for row in try Row.fetchAll(db, sql: "SELECT device, first_ms, last_ms FROM devices") {
                let device: String = row[0], last: Int64 = row[2]
                let fix = try Row.fetchOne(
                    db, sql: "SELECT lat, lon, accuracy_m FROM fixes WHERE device = ? AND time_ms = ? LIMIT 1", arguments: [device, last])
                found[device] = (row[1], last, fix?[0], fix?[1], fix?[2])
            }
            return found
        }
        var byID = Dictionary(known.map { ($0.id, $0) }, uniquingKeysWith: { first, _ in first })
        for id in rows.keys where byID[id] == nil { byID[id] = KnownDevice(id: id, origin: "removed") }
        var writer = JSONWriter(capacity: 1024)
        writer.beginObject()
        writer.key("devices")
        writer.beginArray()
        for device in byID.values.sorted(by: { $0.id < $1.id }) {
            let stored = rows[device.id]
            writer.beginObject()
            writer.key("added_at"); writer.optionalTime(ms: device.addedAt.map(milliseconds))
            writer.key("app"); writer.optional(device.app)
            writer.key("device"); writer.string(device.id)
            writer.key("first_fix"); writer.optionalTime(ms: stored?.first)
            writer.key("last_fix"); writer.optionalTime(ms: stored?.last)
            writer.key("last_position")
            if let lat = stored?.lat, let lon = stored?.lon {
                writer.beginObject()
                writer.key("accuracy_m"); writer.optional(stored?.accuracy)
                writer.key("lat"); writer.number(lat)
                writer.key("lon"); writer.number(lon)
                writer.endObject()
            } else {
                writer.value(.null)
            }
            writer.key("origin"); writer.string(device.origin)
            writer.endObject()
        }
        writer.endArray()
        writer.endObject()
        return writer.bytes
    }
}
