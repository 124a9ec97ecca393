import DrivebusConfiguration
import DrivebusJournal
import DrivebusSchema
import DrivebusTrackFormats
import Foundation

/// One point read from a GPX, GeoJSON or CSV file, before validation.
public struct TrackPoint: Sendable, Equatable {
    public var time: Date?
    public var lat: Double
    public var lon: Double
    public var altitudeM: Double?
    public var speedMps: Double?
    public var courseDeg: Double?
    public var accuracyM: Double?
    /// Where it is in the file, for messages: `line 12`, `trkpt 40`.
    public var location: String

    public init(
        time: Date?, lat: Double, lon: Double, altitudeM: Double? = nil, speedMps: Double? = nil, courseDeg: Double? = nil,
        accuracyM: Double? = nil, location: String
    ) {
        self.time = time
        self.lat = lat
        self.lon = lon
        self.altitudeM = altitudeM
        self.speedMps = speedMps
        self.courseDeg = courseDeg
        self.accuracyM = accuracyM
        self.location = location
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

/// Reads tracks for bulk import, through the one reader per format in `DrivebusTrackFormats`:
/// GPX 1.0/1.1 (tracks and routes), GeoJSON (Points with a `time` or `timestamp` property;
/// LineStrings and MultiLineStrings with `coordTimes`) and CSV
/// (`timestamp|time, latitude|lat, longitude|lon, speed?, altitude|ele?, bearing|course?`).
public enum TrackFiles {
    /// Reads a file's bytes in the format its name's extension says.
    public static func read(_ data: Data, name: String) throws(TrackFileError) -> [TrackPoint] {
        try all(Reader(format: format(of: name), source: MemoryByteSource(Array(data))))
    }

    public static func gpx(_ data: Data) throws(TrackFileError) -> [TrackPoint] {
        try all(Reader(format: .gpx, source: MemoryByteSource(Array(data))))
    }

    public static func geoJSON(_ bytes: [UInt8]) throws(TrackFileError) -> [TrackPoint] {
        try all(Reader(format: .geoJSON, source: MemoryByteSource(bytes)))
    }

    public static func csv(_ text: String) throws(TrackFileError) -> [TrackPoint] {
        try all(Reader(format: .csv, source: MemoryByteSource(Array(text.utf8))))
    }

    /// A file's format by its content (`TrackFormat(sniffing:)`), else by its name.
    public static func format(ofFile path: String) throws(TrackFileError) -> TrackFormat {
        if let handle = FileHandle(forReadingAtPath: path) {
            defer { try? handle.close() }
            if let start = try? handle.read(upToCount: 64 << 10), let format = TrackFormat(sniffing: start) { return format }
        }
        return try format(of: path)
    }

    /// The format a file's name says: `.gpx`, `.geojson` or `.json`, `.csv`, `.rec`.
    public static func format(of name: String) throws(TrackFileError) -> TrackFormat {
        guard let format = TrackFormat(fileName: name) else {
            throw TrackFileError(location: name, message: "unknown format: use GPX, GeoJSON, CSV, Google location history or OwnTracks Recorder (.rec) files")
        }
        return format
    }

    private static func all(_ reader: Reader) throws(TrackFileError) -> [TrackPoint] {
        var points: [TrackPoint] = []
        while let point = try reader.next() { points.append(point) }
        return points
    }

    /// A track file read a point at a time, for files too big to hold: GPX and CSV take
    /// bounded memory whatever their size (GeoJSON is parsed whole).
    public final class Reader {
        private let reader: TrackReader

        public init(format: TrackFormat, source: ByteSource) {
            reader = TrackReader(format: format, source: source)
        }

        /// Bytes taken from the source so far.
        public var bytesRead: Int { reader.bytesRead }

        public enum Item: Sendable {
            case point(TrackPoint)
            case activity(TrackReader.Activity)
            case visit(TrackReader.Visit)
        }

        /// The next point, or activity or visit (a location history's), or `nil` at the end of the file.
        public func nextItem() throws(TrackFileError) -> Item? {
            do {
                while let event = try reader.next() {
                    switch event {
                    case .point(let point):
                        return .point(TrackPoint(
                            time: point.time, lat: point.lat, lon: point.lon, altitudeM: point.elevationM, speedMps: point.speedMps,
                            courseDeg: point.courseDeg, accuracyM: point.accuracyM, location: point.location))
                    case .activity(let activity): return .activity(activity)
                    case .visit(let visit): return .visit(visit)
                    case .track: continue
                    }
                }
                return nil
            } catch {
                throw TrackFileError(location: error.location, message: error.message)
            }
        }

        /// The next point, or `nil` at the end of the file.
        public func next() throws(TrackFileError) -> TrackPoint? {
            while let item = try nextItem() {
                if case .point(let point) = item { return point }
            }
            return nil
        }
    }
}
