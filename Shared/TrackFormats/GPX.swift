import Foundation

/// GPX 1.0 and 1.1 over `XMLPullReader`. Points are `trkpt` and `rtept` (waypoints are not a
/// track); a point's `ele` and `time` are its children, `speed` and `course` any descendant
/// (GPX 1.0 has them as children, 1.1 files in extensions such as Garmin's
/// `gpxtpx:TrackPointExtension`). Names are matched without their namespace prefix.
final class GPXTrackReader: FormatReader {
    private let xml: XMLPullReader
    private let limits: TrackLimits

    private enum Element {
        case trk, rte, trkpt, rtept, ele, time, speed, course, name, other
    }

    private struct OpenTrack {
        var index: Int
        var kind: TrackReader.Track.Kind
        var depth: Int
        var name: String?
        var points = 0
    }

    private struct OpenPoint {
        var point: TrackReader.Point
        var depth: Int
        /// Its number within its track, from 1.
        var number: Int?
    }

    /// What the text being gathered is for, and the depth of its element.
    private enum Capture {
        case elevation, time, speed, course, trackName
    }

    private var track: OpenTrack?
    private var point: OpenPoint?
    private var capture: (what: Capture, depth: Int)?
    private var text: [UInt8] = []
    private var textComplete = true
    private var trackCount = 0
    private var trkptCount = 0
    private var rteptCount = 0

    init(source: ByteSource, limits: TrackLimits) {
        xml = XMLPullReader(source: source, maxDepth: limits.maxDepth)
        self.limits = limits
    }

    func next() throws(TrackFormatError) -> TrackReader.Event? {
        while true {
            let node: XMLPullReader.Node?
            do { node = try xml.next() } catch {
                throw TrackFormatError(
                    location: "line \(error.line)", message: "not valid GPX: \(error.message)", track: track?.index, trackName: track?.name)
            }
            switch node {
            case nil:
                return nil
            case .start?:
                try start()
            case .text?:
                if capture != nil, textComplete { textComplete = xml.appendText(to: &text, limit: limits.maxValueBytes) }
            case .end?:
                if let event = try end() { return event }
            }
        }
    }

    private var element: Element {
        if xml.isNamed("trkpt") { return .trkpt }
        if xml.isNamed("rtept") { return .rtept }
        if xml.isNamed("ele") { return .ele }
        if xml.isNamed("time") { return .time }
        if xml.isNamed("trk") { return .trk }
        if xml.isNamed("rte") { return .rte }
        if xml.isNamed("name") { return .name }
        if xml.isNamed("speed") { return .speed }
        if xml.isNamed("course") { return .course }
        return .other
    }

    private func start() throws(TrackFormatError) {
        text.removeAll(keepingCapacity: true)
        textComplete = true
        capture = nil
        let depth = xml.depth
        let element = self.element
        let inPoint = point != nil
        let childOfPoint = point.map { depth == $0.depth + 1 } ?? false
        let childOfTrack = !inPoint && (track.map { depth == $0.depth + 1 } ?? false)
        switch element {
        case .trk, .rte:
            let kind: TrackReader.Track.Kind = element == .trk ? .gpxTrack : .gpxRoute
            guard track == nil, point == nil else {
                throw TrackFormatError(location: "line \(xml.line)", message: "a \(kind.rawValue) inside a \(track?.kind.rawValue ?? "point")", track: track?.index, trackName: track?.name)
            }
            track = OpenTrack(index: trackCount, kind: kind, depth: depth)
            trackCount += 1
        case .trkpt, .rtept:
            let kind = element == .trkpt ? "trkpt" : "rtept"
            let count: Int
            if element == .trkpt { trkptCount += 1; count = trkptCount } else { rteptCount += 1; count = rteptCount }
            let location = "\(kind) \(count) (line \(xml.line))"
            let number = track.map { $0.points + 1 }
            func failure(_ message: String) -> TrackFormatError {
                TrackFormatError(location: location, message: message, track: track?.index, trackName: track?.name, point: number)
            }
            guard point == nil else { throw failure("a point inside a point") }
            let latText: String?, lonText: String?
            do {
                latText = try xml.attribute("lat")
                lonText = try xml.attribute("lon")
            } catch { throw failure(error.message) }
            guard let latText, let lonText else { throw failure("lat and lon attributes are required") }
            guard let lat = Values.number(latText) else { throw failure("lat \(Values.quoted(latText)) is not a number") }
            guard let lon = Values.number(lonText) else { throw failure("lon \(Values.quoted(lonText)) is not a number") }
            if let problem = Values.checkLatitude(lat) { throw failure("lat " + problem) }
            if let problem = Values.checkLongitude(lon) { throw failure("lon " + problem) }
            point = OpenPoint(point: TrackReader.Point(lat: lat, lon: lon, location: location, track: track?.index), depth: depth, number: number)
        case .ele where childOfPoint:
            capture = (.elevation, depth)
        case .time where childOfPoint:
            capture = (.time, depth)
        case .speed where inPoint:
            capture = (.speed, depth)
        case .course where inPoint:
            capture = (.course, depth)
        case .name where childOfTrack:
            capture = (.trackName, depth)
        default:
            break
        }
    }

    private func end() throws(TrackFormatError) -> TrackReader.Event? {
        let depth = xml.depth
        if let (what, captureDepth) = capture, captureDepth == depth {
            capture = nil
            try finish(what)
            return nil
        }
        if let open = point, open.depth == depth {
            point = nil
            track?.points += 1
            return .point(open.point)
        }
        if let open = track, open.depth == depth {
            track = nil
            return .track(TrackReader.Track(index: open.index, kind: open.kind, name: open.name, pointCount: open.points))
        }
        return nil
    }

    private func finish(_ what: Capture) throws(TrackFormatError) {
        if what == .trackName {
            if track?.name == nil { track?.name = Values.name(String(decoding: text, as: UTF8.self)) }
            return
        }
        guard var open = point else { return }
        let field: String
        switch what {
        case .elevation: field = "ele"
        case .time: field = "time"
        case .speed: field = "speed"
        case .course: field = "course"
        case .trackName: return
        }
        func failure(_ message: String) -> TrackFormatError {
            TrackFormatError(location: open.point.location, message: message, track: track?.index, trackName: track?.name, point: open.number)
        }
        guard textComplete else { throw failure("\(field) is longer than \(limits.maxValueBytes) bytes") }
        guard UTF8Validation.isValid(text) else { throw failure("\(field) is not valid UTF-8") }
        let value = String(decoding: text, as: UTF8.self)
        guard !value.allSatisfy(\.isWhitespace) else { return }  // <ele/>: not given
        if what == .time {
            guard let time = Values.isoTime(value) else { throw failure("time \(Values.quoted(value)) is not ISO 8601") }
            open.point.time = time
        } else {
            guard let number = Values.number(value) else { throw failure("\(field) \(Values.quoted(value)) is not a number") }
            switch what {
            case .elevation:
                if let problem = Values.checkElevation(number) { throw failure("ele " + problem) }
                open.point.elevationM = number
            case .speed: open.point.speedMps = number
            default: open.point.courseDeg = number
            }
        }
        point = open
    }
}
