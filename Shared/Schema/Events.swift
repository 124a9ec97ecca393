import Foundation

/// `client.transition.<device>`: a phone app's own geofence transition (OwnTracks `transition`),
/// passed on as the app reported it.
public struct ClientTransition: Codable, Sendable, Equatable {
    public var seq: UInt64?
    public var device: String
    public var time: Date
    /// `enter` or `leave`, as the app says.
    public var event: String
    public var region: String?
    public var lat: Double?
    public var lon: Double?
    public var accuracyM: Double?
    public var source: FixSource

    public init(seq: UInt64? = nil, device: String, time: Date, event: String, region: String?, lat: Double?, lon: Double?, accuracyM: Double?, source: FixSource) {
        self.seq = seq
        self.device = device
        self.time = time
        self.event = event
        self.region = region
        self.lat = lat
        self.lon = lon
        self.accuracyM = accuracyM
        self.source = source
    }

    enum CodingKeys: String, CodingKey {
        case seq, device, time, event, region, lat, lon, source
        case accuracyM = "accuracy_m"
    }
}

/// `taxi.checkin.<device>`: a rider boarded a taxi.
public struct TaxiCheckin: Codable, Sendable, Equatable {
    public var seq: UInt64?
    public var device: String
    public var time: Date

    public init(seq: UInt64? = nil, device: String, time: Date) {
        self.seq = seq
        self.device = device
        self.time = time
    }
}

/// `visit.<device>`: a stay at a place, from an imported location history (Google's
/// `placeVisit`, a Timeline `visit`): when, where, and the place's name where the history has one.
public struct Visit: Codable, Sendable, Equatable {
    public var seq: UInt64?
    public var device: String
    public var start: Date
    public var end: Date
    public var lat: Double
    public var lon: Double
    public var name: String?
    public var address: String?
    /// Google's place id.
    public var placeID: String?
    /// `HOME`, `WORK`, `INFERRED_HOME`… as the history says it.
    public var semanticType: String?

    public init(
        seq: UInt64? = nil, device: String, start: Date, end: Date, lat: Double, lon: Double, name: String? = nil, address: String? = nil,
        placeID: String? = nil, semanticType: String? = nil
    ) {
        self.seq = seq
        self.device = device
        self.start = start
        self.end = end
        self.lat = lat
        self.lon = lon
        self.name = name
        self.address = address
        self.placeID = placeID
        self.semanticType = semanticType
    }

    enum CodingKeys: String, CodingKey {
        case seq, device, start, end, lat, lon, name, address
        case placeID = "place_id"
        case semanticType = "semantic_type"
    }
}

/// `import.finished.<device>`: a bulk import of one file is complete, so consumers can close
/// whatever is still open for the device.
public struct ImportFinished: Codable, Sendable, Equatable {
    public var seq: UInt64?
    public var device: String
    public var file: String
    public var fixes: Int

    public init(seq: UInt64? = nil, device: String, file: String, fixes: Int) {
        self.seq = seq
        self.device = device
        self.file = file
        self.fixes = fixes
    }
}

extension MotionSample: FastJSONEncodable {
    public func writeJSON(to writer: inout JSONWriter) {
        writer.beginObject()
        writer.key("activity"); writer.string(activity.rawValue)
        writer.key("confidence"); writer.string(confidence.rawValue)
        writer.key("device"); writer.string(device)
        if let seq { writer.key("seq"); writer.number(seq) }
        writer.key("source"); writer.string(source.rawValue)
        writer.key("start"); writer.date(start)
        writer.endObject()
    }
}
