import DrivebusSchema
import Foundation

/// The location histories people bring with them, read as a stream:
/// - Google Takeout's `Records.json`: `locations[]` with `latitudeE7`, `longitudeE7`,
///   `timestamp` (RFC 3339) or `timestampMs`, `accuracy`, `velocity`, `heading`, `altitude`;
/// - Takeout's Semantic Location History (monthly files): `timelineObjects[]`, the timed points
///   of each `activitySegment.simplifiedRawPath`;
/// - the phone's own Timeline export (`Timeline.json`): Android's `semanticSegments[]
///   .timelinePath[]` (`point` as `"48.1234567°, 11.1234567°"`, `time`) and
///   `rawSignals[].position`; the iPhone's top-level array of segments, whose path points
///   (`"geo:48.1,11.5"`) are timed by `durationMinutesOffsetFromStartTime`.
///
/// Such files run to gigabytes, so the file is never parsed whole: `ElementScanner` cuts the
/// elements of those top-level arrays out one at a time and each is parsed on its own, in the
/// memory of one element. Activities become `.activity` events (the most likely one of each
/// reading, in drivebus's motion vocabulary), visits `.visit` events; an element with none of
/// these is skipped. A value that is there but wrong is an error naming the
/// element: `locations[12]: latitudeE7 …`.
final class LocationHistoryReader: FormatReader {
    private let scanner: ElementScanner
    private var pending: [TrackReader.Event] = []
    private var nextPending = 0

    static let arrays: Set<String> = ["locations", "timelineObjects", "semanticSegments", "rawSignals"]

    init(source: ByteSource, limits: TrackLimits) {
        scanner = ElementScanner(source: source, keys: Self.arrays, maxElementBytes: limits.maxGeoJSONBytes)
    }

    func next() throws(TrackFormatError) -> TrackReader.Event? {
        while nextPending == pending.count {
            pending.removeAll(keepingCapacity: true)
            nextPending = 0
            guard let element = try scanner.next() else { return nil }
            let location = "\(element.key)[\(element.index)]"
            if element.key == "locations", PlainRecord.read(element.bytes, location: location, into: &pending) { continue }
            let value: JSONValue
            do { value = try JSONValue.parse(element.bytes) } catch {
                throw TrackFormatError(location: location, message: "not valid JSON: \(error)")
            }
            guard case .object(let object) = value else { continue }
            switch element.key {
            case "locations":
                if let point = try Self.record(object, location) { pending.append(.point(point)) }
                try Self.recordActivities(object, location, into: &pending)
            case "timelineObjects": try Self.semantic(object, location, into: &pending)
            case "semanticSegments", ElementScanner.topLevelArray: try Self.segment(object, location, into: &pending)
            default: if let point = try Self.rawSignal(object, location) { pending.append(.point(point)) }
            }
        }
        defer { nextPending += 1 }
        return pending[nextPending]
    }

    // MARK: Activities

    /// Google's activity types in drivebus's motion vocabulary; the rest (`TILTING`, `UNKNOWN`,
    /// `EXITING_VEHICLE`, flying, sailing …) say nothing a motion sample can.
    static func activity(_ type: String) -> MotionSample.Activity? {
        // `IN_PASSENGER_VEHICLE` on Android, `in passenger vehicle` on iPhones.
        switch type.uppercased().replacingOccurrences(of: " ", with: "_") {
        case "STILL": .stationary
        case "ON_FOOT", "WALKING", "WALKING_NORDIC", "HIKING": .walking
        case "RUNNING": .running
        case "ON_BICYCLE", "CYCLING": .cycling
        case "IN_VEHICLE", "IN_ROAD_VEHICLE", "IN_RAIL_VEHICLE", "IN_PASSENGER_VEHICLE", "IN_CAR", "IN_BUS", "IN_TAXI",
             "IN_TRAIN", "IN_SUBWAY", "IN_TRAM", "DRIVING", "MOTORCYCLING", "IN_FOUR_WHEELER_VEHICLE", "IN_TWO_WHEELER_VEHICLE":
            .automotive
        default: nil
        }
    }

    /// A percentage: 75 and above is high, 50 and above medium.
    static func confidence(percent: Double) -> MotionSample.Confidence {
        percent >= 75 ? .high : percent >= 50 ? .medium : .low
    }

    /// A `Records.json` location's `activity[]`: each reading's most likely activity.
    static func recordActivities(_ object: [String: JSONValue], _ location: String, into events: inout [TrackReader.Event]) throws(TrackFormatError) {
        guard case .array(let readings)? = object["activity"] else { return }
        for (index, reading) in readings.enumerated() {
            guard case .object(let fields) = reading, case .array(let candidates)? = fields["activity"] else { continue }
            let here = "\(location).activity[\(index)]"
            guard let time = try time(fields["timestamp"] ?? fields["timestampMs"] ?? object["timestamp"] ?? object["timestampMs"], here) else { continue }
            var best: (MotionSample.Activity, Double)?
            for case .object(let candidate) in candidates {
                guard case .string(let type)? = candidate["type"], let kind = activity(type) else { continue }
                let percent = try number(candidate["confidence"], "confidence", here) ?? 0
                if best.map({ percent > $0.1 }) ?? true { best = (kind, percent) }
            }
            if let (kind, percent) = best {
                events.append(.activity(TrackReader.Activity(time: time, activity: kind, confidence: confidence(percent: percent), location: here)))
            }
        }
    }

    // MARK: Formats

    /// A `Records.json` location. E7 values beyond ±90°/±180° are 2³² too large (a known fault
    /// of older exports) and are taken back.
    static func record(_ object: [String: JSONValue], _ location: String) throws(TrackFormatError) -> TrackReader.Point? {
        guard let position = try e7(object, "latitudeE7", "longitudeE7", location) else { return nil }
        var point = TrackReader.Point(lat: position.lat, lon: position.lon, location: location)
        point.time = try time(object["timestamp"] ?? object["timestampMs"], location)
        point.accuracyM = try number(object["accuracy"], "accuracy", location)
        point.speedMps = try number(object["velocity"], "velocity", location)
        point.courseDeg = try number(object["heading"], "heading", location)
        point.elevationM = try number(object["altitude"], "altitude", location)
        return point
    }

    /// A Semantic Location History object: the timed points of an activity segment's raw path,
    /// or a place visit.
    static func semantic(_ object: [String: JSONValue], _ location: String, into points: inout [TrackReader.Event]) throws(TrackFormatError) {
        if case .object(let visit)? = object["placeVisit"] {
            if let visit = try placeVisit(visit, location + ".placeVisit") { points.append(.visit(visit)) }
            return
        }
        guard case .object(let segment)? = object["activitySegment"] else { return }
        // The segment's activity, from its start.
        if case .string(let type)? = segment["activityType"], let kind = activity(type),
           case .object(let duration)? = segment["duration"],
           let start = try time(duration["startTimestamp"] ?? duration["startTimestampMs"], location + ".activitySegment.duration") {
            var percent = 75.0
            if case .string(let level)? = segment["confidence"] { percent = ["HIGH": 90, "MEDIUM": 60, "LOW": 25][level.uppercased()] ?? 25 }
            points.append(.activity(TrackReader.Activity(time: start, activity: kind, confidence: confidence(percent: percent), location: location + ".activitySegment")))
        }
        guard case .object(let path)? = segment["simplifiedRawPath"], case .array(let raw)? = path["points"] else { return }
        for (index, entry) in raw.enumerated() {
            guard case .object(let fields) = entry else { continue }
            let here = "\(location).activitySegment.simplifiedRawPath.points[\(index)]"
            guard let position = try e7(fields, "latE7", "lngE7", here) else { continue }
            var point = TrackReader.Point(lat: position.lat, lon: position.lon, location: here)
            point.time = try time(fields["timestamp"] ?? fields["timestampMs"], here)
            point.accuracyM = try number(fields["accuracyMeters"], "accuracyMeters", here)
            points.append(.point(point))
        }
    }

    /// Takeout's `placeVisit`: `location` (E7 position, `name`, `address`, `placeId`,
    /// `semanticType`) and `duration` (start and end, as timestamps or milliseconds). Without a
    /// position or both times it is not a visit drivebus can keep, and is skipped.
    static func placeVisit(_ visit: [String: JSONValue], _ location: String) throws(TrackFormatError) -> TrackReader.Visit? {
        guard case .object(let place)? = visit["location"], case .object(let duration)? = visit["duration"],
              let position = try e7(place, "latitudeE7", "longitudeE7", location + ".location") else { return nil }
        let here = location + ".duration"
        guard let start = try time(duration["startTimestamp"] ?? duration["startTimestampMs"], here + ".startTimestamp"),
              let end = try time(duration["endTimestamp"] ?? duration["endTimestampMs"], here + ".endTimestamp") else { return nil }
        // One that ends before it starts goes on to ingest, which refuses it by itself and says why.
        return TrackReader.Visit(
            start: start, end: end, lat: position.lat, lon: position.lon, name: label(place["name"]), address: label(place["address"]),
            placeID: label(place["placeId"]), semanticType: label(place["semanticType"]), location: location)
    }

    /// A Timeline export visit: `topCandidate` with `placeLocation` (`{"latLng": "48.1°, 11.5°"}` on
    /// Android, `"geo:48.1,11.5"` on iPhones), `placeId` (or `placeID`) and `semanticType`, timed
    /// by the segment. Only the top of the hierarchy (level 0): the levels below are the same
    /// time at a place within it.
    static func timelineVisit(_ object: [String: JSONValue], _ location: String) throws(TrackFormatError) -> TrackReader.Visit? {
        guard case .object(let visit)? = object["visit"], case .object(let top)? = visit["topCandidate"] else { return nil }
        let here = location + ".visit"
        if let level = try? number(visit["hierarchyLevel"], "hierarchyLevel", here), level != 0 { return nil }
        let position: (lat: Double, lon: Double)
        switch top["placeLocation"] {
        case .object(let place)?:
            guard case .string(let text)? = place["latLng"] else { return nil }
            position = try degrees(text, "placeLocation.latLng", here + ".topCandidate")
        case .string(let text)?:
            position = try degrees(text, "placeLocation", here + ".topCandidate")
        default:
            return nil
        }
        guard let start = try time(object["startTime"], location), let end = try time(object["endTime"], location) else { return nil }
        return TrackReader.Visit(
            start: start, end: end, lat: position.lat, lon: position.lon, placeID: label(top["placeId"] ?? top["placeID"]),
            semanticType: label(top["semanticType"]), location: here)
    }

    /// A short text of a history: trimmed, at most 200 characters; nil if absent or blank.
    static func label(_ value: JSONValue?) -> String? {
        guard case .string(let text)? = value else { return nil }
        return Values.name(text)
    }

    /// A Timeline export segment: its activity (from its start), its `timelinePath` points, or
    /// its visit.
    static func segment(_ object: [String: JSONValue], _ location: String, into points: inout [TrackReader.Event]) throws(TrackFormatError) {
        if let visit = try timelineVisit(object, location) { points.append(.visit(visit)) }
        if case .object(let activity)? = object["activity"], case .object(let top)? = activity["topCandidate"],
           case .string(let type)? = top["type"], let kind = Self.activity(type),
           let start = try time(object["startTime"], location) {
            let probability = try number(top["probability"], "probability", location + ".activity.topCandidate") ?? 0.5
            points.append(.activity(TrackReader.Activity(
                time: start, activity: kind, confidence: confidence(percent: probability * 100), location: location + ".activity")))
        }
        guard case .array(let path)? = object["timelinePath"] else { return }
        let start = try time(object["startTime"], location)
        for (index, entry) in path.enumerated() {
            guard case .object(let fields) = entry, case .string(let text)? = fields["point"] else { continue }
            let here = "\(location).timelinePath[\(index)]"
            let position = try degrees(text, "point", here)
            var point = TrackReader.Point(lat: position.lat, lon: position.lon, location: here)
            point.time = try time(fields["time"], here)
            // The iPhone's export gives minutes from the segment's start instead.
            if point.time == nil, let start, let minutes = try number(fields["durationMinutesOffsetFromStartTime"], "durationMinutesOffsetFromStartTime", here) {
                point.time = start.addingTimeInterval(minutes * 60)
            }
            points.append(.point(point))
        }
    }

    /// A Timeline export raw signal: a `position` with its accuracy, altitude and speed.
    static func rawSignal(_ object: [String: JSONValue], _ location: String) throws(TrackFormatError) -> TrackReader.Point? {
        guard case .object(let fields)? = object["position"], case .string(let text)? = fields["LatLng"] else { return nil }
        let here = location + ".position"
        let position = try degrees(text, "LatLng", here)
        var point = TrackReader.Point(lat: position.lat, lon: position.lon, location: here)
        point.time = try time(fields["timestamp"], here)
        point.accuracyM = try number(fields["accuracyMeters"], "accuracyMeters", here)
        point.elevationM = try number(fields["altitudeMeters"], "altitudeMeters", here)
        point.speedMps = try number(fields["speedMetersPerSecond"], "speedMetersPerSecond", here)
        return point
    }

    // MARK: Values

    /// E7 values beyond ±90°/±180° are 2³² too large (a known fault of older exports).
    static func unwrapE7(_ value: Double) -> Double { value > 2_147_483_647 ? value - 4_294_967_296 : value }

    static func e7(_ object: [String: JSONValue], _ latKey: String, _ lonKey: String, _ location: String) throws(TrackFormatError) -> (lat: Double, lon: Double)? {
        guard let rawLat = try number(object[latKey], latKey, location), let rawLon = try number(object[lonKey], lonKey, location) else { return nil }
        let lat = unwrapE7(rawLat) / 1e7, lon = unwrapE7(rawLon) / 1e7
        guard abs(lat) <= 90 else { throw TrackFormatError(location: location, message: "\(latKey) \(rawLat) is not a latitude") }
        guard abs(lon) <= 180 else { throw TrackFormatError(location: location, message: "\(lonKey) \(rawLon) is not a longitude") }
        return (lat, lon)
    }

    /// `"48.1234567°, 11.1234567°"`, or `"geo:48.1234567,11.1234567"` as iPhones write it.
    static func degrees(_ text: String, _ key: String, _ location: String) throws(TrackFormatError) -> (lat: Double, lon: Double) {
        var body = Substring(text.trimmingCharacters(in: .whitespaces))
        if body.hasPrefix("geo:") { body = body.dropFirst(4) }
        let parts = body.split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces).replacingOccurrences(of: "°", with: "") }
        guard parts.count == 2, let lat = Values.number(parts[0]), let lon = Values.number(parts[1]), abs(lat) <= 90, abs(lon) <= 180 else {
            throw TrackFormatError(location: location, message: "\(key): expected \"lat°, lon°\", got \(Values.quoted(text))")
        }
        return (lat, lon)
    }

    static func number(_ value: JSONValue?, _ key: String, _ location: String) throws(TrackFormatError) -> Double? {
        switch value {
        case nil, .null?: return nil
        case .number(let number)? where number.isFinite: return number
        case .string(let text)?:
            // Takeout writes some numbers as strings.
            guard let number = Values.number(text) else { break }
            return number
        default: break
        }
        throw TrackFormatError(location: location, message: "\(key) is not a number")
    }

    static func time(_ value: JSONValue?, _ location: String) throws(TrackFormatError) -> Date? {
        switch value {
        case nil, .null?: return nil
        case .string(let text)?:
            switch Values.time(text) {
            case .success(let date): return date
            case .failure(let error): throw TrackFormatError(location: location, message: "time: \(error.reason)")
            }
        case .number(let number)?:
            guard let date = Values.epoch(number) else { break }
            return date
        default: break
        }
        throw TrackFormatError(location: location, message: "time: \(Values.timeFormats)")
    }
}

/// Cuts the elements of chosen top-level arrays (`{"locations": [ {…}, {…} ]}`) out of a JSON
/// stream, one element's bytes at a time, without parsing anything else. Strings and escapes are
/// followed so that brackets inside them do not count. The file must be an object at the top.
final class ElementScanner {
    struct Element {
        var key: String
        var index: Int
        var bytes: [UInt8]
    }

    private let reader: ChunkedReader
    private let keys: Set<String>
    private let maxElementBytes: Int
    private var buffer: [UInt8] = []
    private var position = 0
    private var offset = 0
    private var ended = false

    private var depth = 0
    private var inString = false
    private var escaped = false
    /// The top-level key being read, and the last one read.
    private var keyBytes: [UInt8]?
    private var lastKey = ""
    private var expectingKey = false
    /// Inside a chosen array: its key and the next element's index.
    private var array: (key: String, index: Int)?
    /// Where the element being cut out starts in `buffer`, and its bytes from earlier pieces.
    private var elementStart: Int?
    private var carried: [UInt8] = []
    private var sawTop = false
    /// The depth at which elements stand: 2 inside `{"key": [ … ]}`, 1 in a top-level array.
    private var elementDepth = 2

    static let maxKeyBytes = 64
    /// The key that a top-level array's elements are reported under.
    static let topLevelArray = "timeline"

    init(source: ByteSource, keys: Set<String>, maxElementBytes: Int) {
        reader = ChunkedReader(source)
        self.keys = keys
        self.maxElementBytes = maxElementBytes
    }

    /// Runs over the bytes that change nothing: inside a string that is not a top-level key, all
    /// but quotes and backslashes; inside an element, all but quotes, brackets and braces. Most
    /// of a file is such bytes, so this loop is most of the scanner's time.
    private func skipPlainBytes() {
        guard !escaped, keyBytes == nil, inString || depth > elementDepth else { return }
        let inString = inString
        position = buffer.withUnsafeBufferPointer { bytes in
            var index = position
            while index < bytes.count {
                let byte = bytes[index]
                if byte == UInt8(ascii: "\"") || byte == UInt8(ascii: "\\") { break }
                if !inString, byte == UInt8(ascii: "{") || byte == UInt8(ascii: "}") || byte == UInt8(ascii: "[") || byte == UInt8(ascii: "]") { break }
                index += 1
            }
            return index
        }
    }

    private func failure(_ message: String) -> TrackFormatError {
        TrackFormatError(location: array.map { "\($0.key)[\($0.index)]" } ?? "byte \(offset + position)", message: message)
    }

    func next() throws(TrackFormatError) -> Element? {
        while true {
            if position == buffer.count {
                if let start = elementStart {
                    carried.append(contentsOf: buffer[start...])
                    elementStart = 0
                    if carried.count > maxElementBytes { throw failure("an element over \(maxElementBytes) bytes is not read") }
                }
                offset += buffer.count
                buffer.removeAll(keepingCapacity: true)
                position = 0
                if !ended, try reader.read(appendingTo: &buffer) == 0 { ended = true }
                if ended {
                    if depth != 0 || inString { throw failure("the file ends inside the JSON (truncated?)") }
                    guard sawTop else { throw TrackFormatError(location: "", message: "empty: no JSON object") }
                    return nil
                }
            }
            skipPlainBytes()
            if position == buffer.count { continue }
            let byte = buffer[position]
            position += 1
            if inString {
                if escaped {
                    escaped = false
                } else if byte == UInt8(ascii: "\\") {
                    escaped = true
                } else if byte == UInt8(ascii: "\"") {
                    inString = false
                    if let key = keyBytes {
                        lastKey = String(decoding: key, as: UTF8.self)
                        keyBytes = nil
                    }
                } else if keyBytes != nil, keyBytes!.count < Self.maxKeyBytes {
                    // Longer keys are none of the chosen ones: no need to keep them.
                    keyBytes!.append(byte)
                }
                continue
            }
            switch byte {
            case UInt8(ascii: "\""):
                inString = true
                if depth == 1, expectingKey {
                    keyBytes = []
                    expectingKey = false
                }
            case UInt8(ascii: "{"), UInt8(ascii: "["):
                if depth == 0 {
                    sawTop = true
                    if byte == UInt8(ascii: "{") {
                        expectingKey = true
                    } else {
                        // The iPhone's export: an array of segments at the top.
                        (array, elementDepth) = ((Self.topLevelArray, 0), 1)
                    }
                } else if depth == 1, elementDepth == 2, byte == UInt8(ascii: "["), keys.contains(lastKey) {
                    array = (lastKey, 0)
                } else if depth == elementDepth, array != nil, elementStart == nil {
                    elementStart = position - 1
                }
                depth += 1
            case UInt8(ascii: "}"), UInt8(ascii: "]"):
                depth -= 1
                guard depth >= 0 else { throw failure("unbalanced \(Character(UnicodeScalar(byte)))") }
                if depth == elementDepth, let start = elementStart, let current = array {
                    var bytes = carried
                    bytes.append(contentsOf: buffer[start..<position])
                    carried.removeAll(keepingCapacity: true)
                    elementStart = nil
                    array!.index += 1
                    return Element(key: current.key, index: current.index, bytes: bytes)
                }
                if depth == elementDepth - 1 { array = nil }
            case UInt8(ascii: ","):
                if depth == 1 { expectingKey = true }
            default:
                if depth == 0, ![0x20, 0x0A, 0x0D, 0x09, 0xEF, 0xBB, 0xBF].contains(byte) { throw failure("expected a JSON object or array at the top") }
            }
        }
    }
}

/// The OwnTracks Recorder's store (`.rec` files): a line per message, `TIME<TAB>TOPIC<TAB>JSON`
/// (older files put `*` and spaces for the topic). Locations (`_type: location`: `lat`, `lon`,
/// `tst`, `acc`, `vel` in km/h, `cog`, `alt`) become points; other messages are skipped.
final class RecorderTrackReader: FormatReader {
    private let reader: ChunkedReader
    private var buffer: [UInt8] = []
    private var position = 0
    private var line = 0
    private var ended = false
    private let maxLineBytes: Int

    init(source: ByteSource, limits: TrackLimits) {
        reader = ChunkedReader(source)
        maxLineBytes = limits.maxLineBytes
    }

    func next() throws(TrackFormatError) -> TrackReader.Event? {
        while let text = try nextLine() {
            line += 1
            let location = "line \(line)"
            guard let tab = text.lastIndex(of: UInt8(ascii: "\t")), let brace = text[tab...].firstIndex(of: UInt8(ascii: "{")) else {
                if text.allSatisfy({ $0 == 0x20 || $0 == 0x0D }) { continue }
                throw TrackFormatError(location: location, message: "expected TIME, TOPIC and a JSON message separated by tabs")
            }
            let value: JSONValue
            do { value = try JSONValue.parse(Array(text[brace...])) } catch {
                throw TrackFormatError(location: location, message: "not valid JSON: \(error)")
            }
            guard case .object(let object) = value, case .string("location")? = object["_type"] else { continue }
            guard let lat = try LocationHistoryReader.number(object["lat"], "lat", location),
                  let lon = try LocationHistoryReader.number(object["lon"], "lon", location)
            else { throw TrackFormatError(location: location, message: "a location needs lat and lon") }
            guard abs(lat) <= 90 else { throw TrackFormatError(location: location, message: "lat: must be from -90 to 90, got \(lat)") }
            guard abs(lon) <= 180 else { throw TrackFormatError(location: location, message: "lon: must be from -180 to 180, got \(lon)") }
            var point = TrackReader.Point(lat: lat, lon: lon, location: location)
            point.time = try LocationHistoryReader.time(object["tst"], location)
            point.accuracyM = try LocationHistoryReader.number(object["acc"], "acc", location)
            point.speedMps = try LocationHistoryReader.number(object["vel"], "vel", location).map { $0 / 3.6 }
            point.courseDeg = try LocationHistoryReader.number(object["cog"], "cog", location)
            point.elevationM = try LocationHistoryReader.number(object["alt"], "alt", location)
            return .point(point)
        }
        return nil
    }

    private func nextLine() throws(TrackFormatError) -> ArraySlice<UInt8>? {
        while true {
            if let newline = buffer[position...].firstIndex(of: 0x0A) {
                let text = buffer[position..<newline]
                position = newline + 1
                return text
            }
            if ended {
                guard position < buffer.count else { return nil }
                let text = buffer[position...]
                position = buffer.count
                return text
            }
            buffer.removeFirst(position)
            position = 0
            if buffer.count > maxLineBytes { throw TrackFormatError(location: "line \(line + 1)", message: "longer than \(maxLineBytes) bytes") }
            if try reader.read(appendingTo: &buffer) == 0 { ended = true }
        }
    }
}
