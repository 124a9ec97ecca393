import DrivebusConfiguration
import DrivebusJournal
import DrivebusSchema
import Foundation
#if canImport(FoundationXML)
import FoundationXML
#endif

/// One point read from a GPX, GeoJSON or CSV file, before validation.
public struct TrackPoint: Sendable, Equatable {
    public var time: Date?
    public var lat: Double
    public var lon: Double
    public var altitudeM: Double?
    public var speedMps: Double?
    public var courseDeg: Double?
    /// Where it is in the file, for messages: `line 12`, `trkpt 40`.
    public var location: String

    public init(time: Date?, lat: Double, lon: Double, altitudeM: Double? = nil, speedMps: Double? = nil, courseDeg: Double? = nil, location: String) {
        self.time = time
        self.lat = lat
        self.lon = lon
        self.altitudeM = altitudeM
        self.speedMps = speedMps
        self.courseDeg = courseDeg
        self.location = location
    }

    /// The native API's fix object, which `publish` takes.
    public var nativeJSON: JSONValue {
        var object: [String: JSONValue] = ["lat": .number(lat), "lon": .number(lon)]
        if let time { object["time"] = .string(RFC3339.format(time)) }
        if let altitudeM { object["altitude_m"] = .number(altitudeM) }
        if let speedMps { object["speed_mps"] = .number(speedMps) }
        if let courseDeg { object["course_deg"] = .number(courseDeg) }
        return .object(object)
    }
}

public struct TrackFileError: Error, Sendable, Equatable, CustomStringConvertible {
    public let location: String
    public let message: String

    public init(location: String, message: String) {
        self.location = location
        self.message = message
    }

    public var description: String { location.isEmpty ? message : "\(location): \(message)" }
}

/// Reads tracks for bulk import: GPX 1.0/1.1 (tracks and routes), GeoJSON (Points with a `time`
/// or `timestamp` property; LineStrings with `coordTimes`) and CSV
/// (`timestamp|time, latitude|lat, longitude|lon, speed?, altitude|ele?, bearing|course?`).
public enum TrackFiles {
    /// Reads a file's bytes in the format its name's extension says.
    public static func read(_ data: Data, name: String) throws(TrackFileError) -> [TrackPoint] {
        switch URL(fileURLWithPath: name).pathExtension.lowercased() {
        case "gpx": return try gpx(data)
        case "geojson", "json": return try geoJSON(Array(data))
        case "csv": return try csv(String(decoding: data, as: UTF8.self))
        default: throw TrackFileError(location: name, message: "unknown format: use .gpx, .geojson, .json or .csv")
        }
    }

    // MARK: GPX

    public static func gpx(_ data: Data) throws(TrackFileError) -> [TrackPoint] {
        let reader = GPXReader()
        let parser = XMLParser(data: data)
        parser.shouldResolveExternalEntities = false  // as for route GPX in stats: a file names no other files
        parser.delegate = reader
        guard parser.parse() else {
            throw TrackFileError(location: "line \(parser.lineNumber)", message: "not valid GPX: \(parser.parserError?.localizedDescription ?? "XML error")")
        }
        if let error = reader.error { throw error }
        return reader.points
    }

    private final class GPXReader: NSObject, XMLParserDelegate {
        var points: [TrackPoint] = []
        var error: TrackFileError?
        private var current: TrackPoint?
        private var text = ""
        private var counts: [String: Int] = [:]

        func parser(_ parser: XMLParser, didStartElement name: String, namespaceURI: String?, qualifiedName: String?, attributes: [String: String] = [:]) {
            text = ""
            let local = name.split(separator: ":").last.map(String.init) ?? name
            guard local == "trkpt" || local == "rtept" else { return }
            counts[local, default: 0] += 1
            let location = "\(local) \(counts[local]!) (line \(parser.lineNumber))"
            guard let lat = attributes["lat"].flatMap(Double.init), let lon = attributes["lon"].flatMap(Double.init) else {
                error = error ?? TrackFileError(location: location, message: "lat and lon attributes are required")
                return
            }
            current = TrackPoint(time: nil, lat: lat, lon: lon, location: location)
        }

        func parser(_ parser: XMLParser, foundCharacters string: String) { text += string }

        func parser(_ parser: XMLParser, didEndElement name: String, namespaceURI: String?, qualifiedName: String?) {
            let local = name.split(separator: ":").last.map(String.init) ?? name
            let value = text.trimmingCharacters(in: .whitespacesAndNewlines)
            guard current != nil else { return }
            switch local {
            case "trkpt", "rtept":
                points.append(current!)
                current = nil
            case "time":
                guard let time = RFC3339.parse(value) ?? RFC3339.parse(value + "Z") else {
                    error = error ?? TrackFileError(location: current!.location, message: "time \"\(value)\" is not ISO 8601")
                    return
                }
                current!.time = time
            case "ele": current!.altitudeM = Double(value)
            case "speed": current!.speedMps = Double(value)  // GPX 1.0, and the common 1.1 extensions
            case "course": current!.courseDeg = Double(value)
            default: break
            }
        }
    }

    // MARK: GeoJSON

    public static func geoJSON(_ bytes: [UInt8]) throws(TrackFileError) -> [TrackPoint] {
        let root: JSONValue
        do { root = try JSONValue.parse(bytes) } catch { throw TrackFileError(location: "", message: "not valid JSON: \(error)") }
        guard case .object(let object) = root else { throw TrackFileError(location: "", message: "expected a GeoJSON object") }
        var features: [JSONValue] = [root]
        if case .array(let list)? = object["features"] { features = list }
        var points: [TrackPoint] = []
        for (index, feature) in features.enumerated() {
            guard case .object(let feature) = feature, case .object(let geometry)? = feature["geometry"] else { continue }
            let properties: [String: JSONValue]
            if case .object(let props)? = feature["properties"] { properties = props } else { properties = [:] }
            let location = "features[\(index)]"
            switch geometry["type"] {
            case .string("Point"):
                guard case .array(let position)? = geometry["coordinates"] else { continue }
                let time = (properties["time"] ?? properties["timestamp"]).flatMap(Self.time)
                points.append(try point(position, time: time, location: location, properties: properties))
            case .string("LineString"):
                guard case .array(let positions)? = geometry["coordinates"] else { continue }
                var times: [JSONValue] = []
                if case .array(let list)? = properties["coordTimes"] { times = list }
                for (offset, position) in positions.enumerated() {
                    guard case .array(let position) = position else { continue }
                    let time = offset < times.count ? Self.time(times[offset]) : nil
                    points.append(try point(position, time: time, location: "\(location).coordinates[\(offset)]", properties: [:]))
                }
            default:
                continue
            }
        }
        return points
    }

    private static func time(_ value: JSONValue) -> Date? {
        switch value {
        case .string(let text): try? Normalizer.parseTime(text, field: "time")
        case .number(let number): number.isFinite && abs(number) < 1e15 ? try? Normalizer.parseTime(String(Int64(number)), field: "time") : nil
        default: nil
        }
    }

    private static func point(_ position: [JSONValue], time: Date?, location: String, properties: [String: JSONValue]) throws(TrackFileError) -> TrackPoint {
        guard position.count >= 2, case .number(let lon) = position[0], case .number(let lat) = position[1] else {
            throw TrackFileError(location: location, message: "coordinates must be [longitude, latitude, elevation?]")
        }
        var point = TrackPoint(time: time, lat: lat, lon: lon, location: location)
        if position.count > 2, case .number(let elevation) = position[2] { point.altitudeM = elevation }
        if case .number(let speed)? = properties["speed"] { point.speedMps = speed }
        return point
    }

    // MARK: CSV

    public static func csv(_ text: String) throws(TrackFileError) -> [TrackPoint] {
        var lines = text.split(omittingEmptySubsequences: false, whereSeparator: \.isNewline).enumerated().filter { !$0.element.isEmpty }.makeIterator()
        guard let header = lines.next() else { return [] }
        let columns = header.element.split(separator: ",", omittingEmptySubsequences: false).map { $0.trimmingCharacters(in: .whitespaces).lowercased() }
        func column(_ names: String...) -> Int? { names.lazy.compactMap { columns.firstIndex(of: $0) }.first }
        guard let timeColumn = column("timestamp", "time"), let latColumn = column("latitude", "lat"), let lonColumn = column("longitude", "lon") else {
            throw TrackFileError(location: "line 1", message: "the header needs timestamp (or time), latitude (or lat) and longitude (or lon)")
        }
        let speedColumn = column("speed", "speed_mps"), altitudeColumn = column("altitude", "ele", "altitude_m")
        let courseColumn = column("bearing", "course", "course_deg")
        var points: [TrackPoint] = []
        while let (offset, line) = lines.next() {
            let location = "line \(offset + 1)"
            let cells = line.split(separator: ",", omittingEmptySubsequences: false).map { $0.trimmingCharacters(in: .whitespaces) }
            func number(_ index: Int?) throws(TrackFileError) -> Double? {
                guard let index, index < cells.count, !cells[index].isEmpty else { return nil }
                guard let value = Double(cells[index]) else { throw TrackFileError(location: location, message: "\(columns[index]) \"\(cells[index])\" is not a number") }
                return value
            }
            guard let lat = try number(latColumn), let lon = try number(lonColumn) else {
                throw TrackFileError(location: location, message: "latitude and longitude are required")
            }
            let time: Date?
            do { time = timeColumn < cells.count ? try Normalizer.parseTime(cells[timeColumn], field: columns[timeColumn]) : nil } catch {
                throw TrackFileError(location: location, message: error.message)
            }
            points.append(TrackPoint(
                time: time, lat: lat, lon: lon, altitudeM: try number(altitudeColumn), speedMps: try number(speedColumn),
                courseDeg: try number(courseColumn), location: location))
        }
        return points
    }
}
