import DrivebusSchema
import Foundation

/// GeoJSON: a FeatureCollection, a Feature or a bare geometry. A Point is a point on its own, with
/// its time from the `time` or `timestamp` property (RFC 3339 text or epoch seconds or
/// milliseconds) and `speed`; a LineString is a track, a MultiLineString one track of its lines
/// joined, with times from `coordTimes` (one list, or one per line) and the name from `name` or
/// `title`. Other geometries are skipped; a feature whose geometry is `null` too.
///
/// JSON is parsed whole (depth-limited by `JSONValue`), up to `TrackLimits.maxGeoJSONBytes`.
final class GeoJSONTrackReader: FormatReader {
    private let source: ByteSource
    private let limits: TrackLimits
    private var features: [(value: JSONValue, location: String)]?
    private var featureIndex = 0
    private var trackCount = 0
    private var line: Line?

    /// One line of a track: its positions and times as parsed, and where it is in the document.
    /// A position's own location is made only when it is read: a string per position made a
    /// large LineString cost more than its parsed JSON.
    private struct Part {
        var positions: [JSONValue]
        var times: [JSONValue]
        var location: String
    }

    private struct Line {
        var index: Int
        var name: String?
        var parts: [Part]
        var pointCount: Int
        var part = 0
        var offset = 0
        var read = 0
    }

    init(source: ByteSource, limits: TrackLimits) {
        self.source = source
        self.limits = limits
    }

    func next() throws(TrackFormatError) -> TrackReader.Event? {
        if features == nil { features = try Self.features(of: try readAll()) }
        while true {
            if var open = line {
                while open.part < open.parts.count, open.offset >= open.parts[open.part].positions.count {
                    open.part += 1
                    open.offset = 0
                }
                guard open.part < open.parts.count else {
                    line = nil
                    return .track(TrackReader.Track(index: open.index, kind: .line, name: open.name, pointCount: open.pointCount))
                }
                let part = open.parts[open.part], offset = open.offset
                open.offset += 1
                open.read += 1
                line = open
                let location = "\(part.location)[\(offset)]"
                func failure(_ message: String) -> TrackFormatError {
                    TrackFormatError(location: location, message: message, track: open.index, trackName: open.name, point: open.read)
                }
                var point = try Self.point(part.positions[offset], location: location, failure)
                point.track = open.index
                if offset < part.times.count { point.time = try Self.time(part.times[offset], failure) }
                return .point(point)
            }
            guard let features, featureIndex < features.count else { return nil }
            let (feature, location) = features[featureIndex]
            featureIndex += 1
            if let point = try self.feature(feature, location: location) { return .point(point) }
        }
    }

    /// The bytes, up to the limit.
    private func readAll() throws(TrackFormatError) -> [UInt8] {
        var bytes: [UInt8] = []
        let reader = ChunkedReader(source)
        while true {
            if try reader.read(appendingTo: &bytes) == 0 { return bytes }
            guard bytes.count <= limits.maxGeoJSONBytes else {
                throw TrackFormatError(location: "", message: "GeoJSON over \(limits.maxGeoJSONBytes) bytes is not read; use GPX (or CSV, to import) for tracks this big")
            }
        }
    }

    private static let geometryTypes: Set<String> = ["Point", "MultiPoint", "LineString", "MultiLineString", "Polygon", "MultiPolygon", "GeometryCollection"]

    private static func features(of bytes: [UInt8]) throws(TrackFormatError) -> [(value: JSONValue, location: String)] {
        let root: JSONValue
        do { root = try JSONValue.parse(bytes) } catch { throw TrackFormatError(location: "", message: "not valid JSON: \(error)") }
        guard case .object(let object) = root else { throw TrackFormatError(location: "", message: "expected a GeoJSON object") }
        let type: String?
        if case .string(let text)? = object["type"] { type = text } else { type = nil }
        // A collection without its type, as some tools write it, is still a collection.
        let collection = type == "FeatureCollection" || (type == nil && object["features"] != nil)
        switch type {
        case _ where collection:
            guard case .array(let list)? = object["features"] else {
                throw TrackFormatError(location: "features", message: "a FeatureCollection needs a features array")
            }
            return list.enumerated().map { ($1, "features[\($0)]") }
        case "Feature"?:
            return [(root, "feature")]
        case let type? where geometryTypes.contains(type):
            return [(.object(["type": .string("Feature"), "geometry": root]), "geometry")]
        default:
            throw TrackFormatError(location: "", message: "expected a GeoJSON FeatureCollection, Feature or geometry")
        }
    }

    /// A Point feature's point; for a line, sets `line` and returns `nil`.
    private func feature(_ value: JSONValue, location: String) throws(TrackFormatError) -> TrackReader.Point? {
        func failure(_ message: String) -> TrackFormatError { TrackFormatError(location: location, message: message) }
        guard case .object(let feature) = value else { throw failure("expected a Feature object") }
        let properties: [String: JSONValue]
        switch feature["properties"] {
        case .object(let object)?: properties = object
        case nil, .null?: properties = [:]
        default: throw failure("properties must be an object or null")
        }
        let geometry: [String: JSONValue]
        switch feature["geometry"] {
        case .object(let object)?: geometry = object
        case nil, .null?: return nil
        default: throw failure("geometry must be an object or null")
        }
        // Inside a bare geometry, its members are the root's.
        let prefix = location == "geometry" ? "geometry" : location + ".geometry"
        guard case .string(let type)? = geometry["type"] else { throw TrackFormatError(location: prefix, message: "needs a type") }
        switch type {
        case "Point":
            var point = try Self.point(geometry["coordinates"] ?? .null, location: location, failure)
            if let time = properties["time"] ?? properties["timestamp"] { point.time = try Self.time(time, failure) }
            switch properties["speed"] {
            case .number(let speed)?: point.speedMps = speed
            case nil, .null?: break
            default: throw failure("speed must be a number")
            }
            return point
        case "LineString", "MultiLineString":
            let coordinates = location == "geometry" ? "geometry.coordinates" : location + ".coordinates"
            guard case .array(let items)? = geometry["coordinates"] else { throw TrackFormatError(location: coordinates, message: "must be an array") }
            let lines: [(positions: [JSONValue], location: String)]
            if type == "LineString" {
                lines = [(items, coordinates)]
            } else {
                lines = try items.enumerated().map { offset, item throws(TrackFormatError) in
                    guard case .array(let positions) = item else {
                        throw TrackFormatError(location: "\(coordinates)[\(offset)]", message: "must be an array of positions")
                    }
                    return (positions, "\(coordinates)[\(offset)]")
                }
            }
            // coordTimes: one list for all positions, or (MultiLineString) one list per line.
            var times: [[JSONValue]] = []
            switch properties["coordTimes"] {
            case .array(let list)?:
                if type == "MultiLineString", list.allSatisfy({ if case .array = $0 { true } else { false } }), !list.isEmpty {
                    times = list.map { if case .array(let inner) = $0 { inner } else { [] } }
                } else {
                    var flat = list[...]
                    for line in lines {
                        times.append(Array(flat.prefix(line.positions.count)))
                        flat = flat.dropFirst(line.positions.count)
                    }
                }
            case nil, .null?: break
            default: throw failure("coordTimes must be an array")
            }
            var name: String?
            for key in ["name", "title"] {
                if case .string(let text)? = properties[key], let trimmed = Values.name(text) {
                    name = trimmed
                    break
                }
            }
            let parts = lines.enumerated().map { number, line in
                Part(positions: line.positions, times: number < times.count ? times[number] : [], location: line.location)
            }
            line = Line(index: trackCount, name: name, parts: parts, pointCount: lines.reduce(0) { $0 + $1.positions.count })
            trackCount += 1
            return nil
        default:
            return nil  // areas and multipoints are not tracks
        }
    }

    private static func point(
        _ value: JSONValue, location: String, _ failure: (String) -> TrackFormatError
    ) throws(TrackFormatError) -> TrackReader.Point {
        guard case .array(let values) = value, values.count >= 2, case .number(let lon) = values[0], case .number(let lat) = values[1] else {
            throw failure("a position must be [longitude, latitude, elevation?]")
        }
        if let problem = Values.checkLatitude(lat) { throw failure("latitude " + problem) }
        if let problem = Values.checkLongitude(lon) { throw failure("longitude " + problem) }
        var point = TrackReader.Point(lat: lat, lon: lon, location: location)
        if values.count > 2 {
            switch values[2] {
            case .number(let elevation):
                if let problem = Values.checkElevation(elevation) { throw failure("elevation " + problem) }
                point.elevationM = elevation
            case .null: break
            default: throw failure("elevation must be a number of metres")
            }
        }
        return point
    }

    private static func time(_ value: JSONValue, _ failure: (String) -> TrackFormatError) throws(TrackFormatError) -> Date? {
        switch value {
        case .string(let text):
            switch Values.time(text) {
            case .success(let date): return date
            case .failure(let error): throw failure("time: \(error.reason)")
            }
        case .number(let number):
            guard let date = Values.epoch(number) else { throw failure("time \(Values.text(number)) is out of range") }
            return date
        case .null:
            return nil
        default:
            throw failure("time must be RFC 3339 text or epoch seconds")
        }
    }
}
