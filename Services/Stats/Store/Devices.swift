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

/// What stats has stored of each device.
enum DeviceQueries {
    struct Stored {
        var first: Int64
        var last: Int64
        var lat: Double?
        var lon: Double?
        var accuracy: Double?
        var battery: Double?
    }

    static func stored(_ db: Database) throws -> [String: Stored] {
        var found: [String: Stored] = [:]
        for row in try Row.fetchAll(db, sql: "SELECT device, first_ms, last_ms, battery FROM devices") {
            let device: String = row[0], last: Int64 = row[2]
            let fix = try Row.fetchOne(
                db, sql: "SELECT lat, lon, accuracy_m FROM fixes WHERE device = ? AND time_ms = ? LIMIT 1", arguments: [device, last])
            found[device] = Stored(first: row[1], last: last, lat: fix?[0], lon: fix?[1], accuracy: fix?[2], battery: row[3])
        }
        return found
    }

    /// The known devices and those with fixes known no more (`removed`), by id.
    static func merged(_ known: [KnownDevice], _ stored: [String: Stored]) -> [KnownDevice] {
        var byID = Dictionary(known.map { ($0.id, $0) }, uniquingKeysWith: { first, _ in first })
        for id in stored.keys where byID[id] == nil { byID[id] = KnownDevice(id: id, origin: "removed") }
        return byID.values.sorted { $0.id < $1.id }
    }
}

extension StatsStore {
    /// `{"devices": [...]}`: every known device, and every device with stored fixes that is no
    /// longer known (`origin: "removed"`), by id: where it comes from, its app, when it was added,
    /// its first and last fix, and where the last fix was.
    public func devicesJSON(_ known: [KnownDevice]) async throws -> [UInt8] {
        let rows = try await pool.read { db in try DeviceQueries.stored(db) }
        let byID = DeviceQueries.merged(known, rows)
        var writer = JSONWriter(capacity: 1024)
        writer.beginObject()
        writer.key("devices")
        writer.beginArray()
        for device in byID {
            let stored = rows[device.id]
            writer.beginObject()
            writer.key("added_at"); writer.optionalTime(ms: device.addedAt.map(milliseconds))
            writer.key("app"); writer.optional(device.app)
            writer.key("battery"); writer.optional(stored?.battery)
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
