import DrivebusSchema
import Foundation

/// The track file formats drivebus reads.
public enum TrackFormat: String, Sendable, CaseIterable {
    /// GPX 1.0 and 1.1: `trk`/`trkseg`/`trkpt` and `rte`/`rtept`.
    case gpx
    /// GeoJSON: Points with a `time` or `timestamp` property, LineStrings and MultiLineStrings
    /// (with `coordTimes`).
    case geoJSON
    /// `timestamp|time, latitude|lat, longitude|lon, speed?, altitude|ele?, bearing|course?`.
    case csv
    /// Google location history: Takeout's `Records.json` and Semantic Location History, the
    /// phone's Timeline export (see `LocationHistoryReader`). Streamed.
    case locationHistory
    /// The OwnTracks Recorder's `.rec` files.
    case ownTracksRecorder

    /// By a file name's extension: `.gpx`, `.geojson` or `.json`, `.csv`.
    public init?(fileName: String) {
        guard let dot = fileName.lastIndex(of: "."), !fileName[dot...].contains("/") else { return nil }
        switch fileName[fileName.index(after: dot)...].lowercased() {
        case "gpx": self = .gpx
        case "geojson", "json": self = .geoJSON
        case "csv": self = .csv
        case "rec": self = .ownTracksRecorder
        default: return nil
        }
    }

    /// By the content's start: `<` is GPX; `{` is a location history when its first key is one
    /// of `locations`, `timelineObjects`, `semanticSegments`, `rawSignals`, else GeoJSON; a line
    /// that starts with a digit and holds a tab and a `{` is an OwnTracks Recorder file.
    public init?(sniffing bytes: some Collection<UInt8>) {
        let start = Array(bytes.prefix(64 << 10))
        guard let first = start.firstIndex(where: { ![0x20, 0x0A, 0x0D, 0x09, 0xEF, 0xBB, 0xBF].contains($0) }) else { return nil }
        switch start[first] {
        case UInt8(ascii: "<"): self = .gpx
        case UInt8(ascii: "{"):
            if let open = start[first...].firstIndex(of: UInt8(ascii: "\"")),
               let close = start[(open + 1)...].firstIndex(of: UInt8(ascii: "\"")),
               LocationHistoryReader.arrays.contains(String(decoding: start[(open + 1)..<close], as: UTF8.self)) {
                self = .locationHistory
            } else {
                self = .geoJSON
            }
        case UInt8(ascii: "["):
            // The iPhone's Timeline export: an array of segments with `startTime` and a path,
            // a visit or an activity.
            let text = String(decoding: start, as: UTF8.self)
            guard text.contains("\"startTime\""), ["\"timelinePath\"", "\"visit\"", "\"activity\""].contains(where: text.contains) else { return nil }
            self = .locationHistory
        case UInt8(ascii: "0")...UInt8(ascii: "9"):
            let line = start[first...].prefix { $0 != 0x0A }
            guard line.contains(0x09), line.contains(UInt8(ascii: "{")) else { return nil }
            self = .ownTracksRecorder
        default: return nil
        }
    }
}

/// Why a track file could not be read, naming where: `line 3`, `trkpt 12 (line 40)`,
/// `features[2].coordinates[4]`.
public struct TrackFormatError: Error, Sendable, Equatable, CustomStringConvertible {
    /// Where, as a person would look for it; empty when it is the whole file.
    public let location: String
    public let message: String
    /// The track (GPX `trk`/`rte`, GeoJSON line) the error is in, when there is one: its index
    /// among the file's tracks from 0, and its name if one was read before the error.
    public let track: Int?
    public let trackName: String?
    /// The point's number within its track, from 1, when the error is about a point of a track.
    public let point: Int?

    public init(location: String, message: String, track: Int? = nil, trackName: String? = nil, point: Int? = nil) {
        self.location = location
        self.message = message
        self.track = track
        self.trackName = trackName
        self.point = point
    }

    public var description: String { location.isEmpty ? message : "\(location): \(message)" }
}

/// Sizes a file's contents may not exceed.
public struct TrackLimits: Sendable, Equatable {
    /// XML element nesting.
    public var maxDepth: Int
    /// One value: a number, a time, a name (names beyond it are cut, not refused).
    public var maxValueBytes: Int
    /// One CSV line.
    public var maxLineBytes: Int
    /// A GeoJSON document, which is parsed whole (JSON is not read in pieces here).
    public var maxGeoJSONBytes: Int

    public init(maxDepth: Int = 100, maxValueBytes: Int = 1024, maxLineBytes: Int = 1 << 20, maxGeoJSONBytes: Int = 256 << 20) {
        self.maxDepth = maxDepth
        self.maxValueBytes = maxValueBytes
        self.maxLineBytes = maxLineBytes
        self.maxGeoJSONBytes = maxGeoJSONBytes
    }
}

/// Reads one track file a point at a time.
///
/// GPX and CSV are read in pieces from the source, so a file of any size takes bounded memory;
/// GeoJSON is parsed whole, up to `TrackLimits.maxGeoJSONBytes`. Numbers must be finite decimal
/// numbers, latitudes within ±90, longitudes within ±180 and elevations within ±100 km; times
/// must parse. Anything else, and any input that is not well-formed, is a `TrackFormatError`
/// naming the line or element. Nothing here traps, whatever the bytes.
///
/// ```swift
/// let reader = TrackReader(format: .gpx, source: try FileByteSource(path: path))
/// while let event = try reader.next() {
///     switch event {
///     case .point(let point): …       // in file order
///     case .track(let track): …       // after its last point
///     }
/// }
/// ```
public final class TrackReader {
    /// One position as the file has it.
    public struct Point: Sendable, Equatable {
        public var time: Date?
        public var lat: Double
        public var lon: Double
        public var elevationM: Double?
        public var speedMps: Double?
        public var courseDeg: Double?
        /// Horizontal accuracy, in metres (CSV only).
        public var accuracyM: Double?
        /// Where it is in the file, for messages: `trkpt 40 (line 44)`, `line 12`, `features[3]`.
        public var location: String
        /// The index of its track (see `Track`), or `nil` for a point on its own: a CSV row, a
        /// GeoJSON Point, a GPX `trkpt` outside any `trk`.
        public var track: Int?

        public init(
            time: Date? = nil, lat: Double, lon: Double, elevationM: Double? = nil, speedMps: Double? = nil, courseDeg: Double? = nil,
            location: String, track: Int? = nil
        ) {
            self.time = time
            self.lat = lat
            self.lon = lon
            self.elevationM = elevationM
            self.speedMps = speedMps
            self.courseDeg = courseDeg
            self.location = location
            self.track = track
        }
    }

    /// A GPX `trk` (its segments joined) or `rte`, or a GeoJSON LineString or MultiLineString
    /// (its lines joined): reported after its last point.
    public struct Track: Sendable, Equatable {
        public enum Kind: String, Sendable {
            case gpxTrack = "trk"
            case gpxRoute = "rte"
            case line = "LineString"
        }

        /// Among the file's tracks, from 0.
        public var index: Int
        public var kind: Kind
        /// `<name>`, or the `name` (or `title`) property, trimmed and cut at 200 characters.
        public var name: String?
        public var pointCount: Int

        public init(index: Int, kind: Kind, name: String?, pointCount: Int) {
            self.index = index
            self.kind = kind
            self.name = name
            self.pointCount = pointCount
        }
    }

    /// What the phone thought its owner was doing (location histories' activity records),
    /// in drivebus's motion vocabulary.
    public struct Activity: Sendable, Equatable {
        public var time: Date
        public var activity: MotionSample.Activity
        public var confidence: MotionSample.Confidence
        public var location: String

        public init(time: Date, activity: MotionSample.Activity, confidence: MotionSample.Confidence, location: String) {
            self.time = time
            self.activity = activity
            self.confidence = confidence
            self.location = location
        }
    }

    /// A stay at a place (location histories' visits).
    public struct Visit: Sendable, Equatable {
        public var start: Date
        public var end: Date
        public var lat: Double
        public var lon: Double
        public var name: String?
        public var address: String?
        public var placeID: String?
        public var semanticType: String?
        public var location: String

        public init(
            start: Date, end: Date, lat: Double, lon: Double, name: String? = nil, address: String? = nil, placeID: String? = nil,
            semanticType: String? = nil, location: String
        ) {
            self.start = start
            self.end = end
            self.lat = lat
            self.lon = lon
            self.name = name
            self.address = address
            self.placeID = placeID
            self.semanticType = semanticType
            self.location = location
        }
    }

    public enum Event: Sendable, Equatable {
        case point(Point)
        case track(Track)
        case activity(Activity)
        case visit(Visit)
    }

    public let format: TrackFormat
    private let counter: CountingSource
    private let implementation: any FormatReader
    private var failed = false

    public init(format: TrackFormat, source: ByteSource, limits: TrackLimits = TrackLimits()) {
        self.format = format
        counter = CountingSource(source)
        switch format {
        case .gpx: implementation = GPXTrackReader(source: counter, limits: limits)
        case .csv: implementation = CSVTrackReader(source: counter, limits: limits)
        case .geoJSON: implementation = GeoJSONTrackReader(source: counter, limits: limits)
        case .locationHistory: implementation = LocationHistoryReader(source: counter, limits: limits)
        case .ownTracksRecorder: implementation = RecorderTrackReader(source: counter, limits: limits)
        }
    }

    public convenience init(format: TrackFormat, bytes: [UInt8], limits: TrackLimits = TrackLimits()) {
        self.init(format: format, source: MemoryByteSource(bytes), limits: limits)
    }

    /// How many bytes have been taken from the source so far: with the file's size, progress.
    public var bytesRead: Int { counter.count }

    /// The next point or finished track, or `nil` at the end of the file. After an error, `nil`.
    public func next() throws(TrackFormatError) -> Event? {
        guard !failed else { return nil }
        do {
            return try implementation.next()
        } catch {
            failed = true
            throw error
        }
    }

    /// The next point, skipping the tracks' ends.
    public func nextPoint() throws(TrackFormatError) -> Point? {
        while let event = try next() {
            if case .point(let point) = event { return point }
        }
        return nil
    }

    /// Everything at once, for what is in memory anyway (an HTTP body).
    public func readAll() throws(TrackFormatError) -> (points: [Point], tracks: [Track]) {
        var points: [Point] = []
        var tracks: [Track] = []
        while let event = try next() {
            switch event {
            case .point(let point): points.append(point)
            case .track(let track): tracks.append(track)
            case .activity, .visit: break
            }
        }
        return (points, tracks)
    }
}

/// One format's reader behind `TrackReader`.
protocol FormatReader: AnyObject {
    func next() throws(TrackFormatError) -> TrackReader.Event?
}
