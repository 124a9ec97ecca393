import DrivebusConfiguration
import DrivebusJournal
import DrivebusSchema
import Foundation

/// What one request carries, once parsed: records for the journal, and the client's own label
/// for its device (Traccar's `id`), which matters only for id-authenticated clients. Until the
/// request is authenticated its records carry the device "-".
struct Parsed {
    var records: [JournalRecord] = []
    var clientID: (field: String, value: String)?
}

/// Turns each phone app's payload into journal records. Pure: no I/O, no clock but `normalizer.now`.
struct ClientParsers: Sendable {
    let normalizer: Normalizer

    // MARK: OwnTracks (HTTP mode)

    func ownTracks(_ body: [UInt8], device: String, headers: [String: String]) throws -> [JournalRecord] {
        // A zero-length POST is legal and means nothing.
        if body.allSatisfy({ $0 == 0x20 || $0 == 0x0A || $0 == 0x0D || $0 == 0x09 }) { return [] }
        let json = try JSONFields.parse(body)
        var messages = [json]
        var isList = false
        if case .array(let items) = json {
            messages = items
            isList = true
        }
        var records: [JournalRecord] = []
        for (index, message) in messages.enumerated() {
            let fields = try JSONFields.object(message, path: isList ? "[\(index)]" : "")
            switch try fields.string("_type") {
            case "location":
                records.append(JournalRecord(.fix(try ownTracksFix(fields, device: device, headers: headers))))
            case "transition":
                records.append(JournalRecord(.transition(try ownTracksTransition(fields, device: device))))
            case nil:
                throw IngestError.invalid(fields.name("_type"), "is required (location, transition, waypoint, lwt, card…)")
            default:
                continue  // waypoint, lwt, card, cmd…: not fixes, nothing to keep.
            }
        }
        return records
    }

    private func ownTracksFix(_ fields: JSONFields, device: String, headers: [String: String]) throws -> Fix {
        guard let time = try fields.time("tst") else { throw IngestError.invalid(fields.name("tst"), "is required") }
        var meta: [String: String] = [:]
        if let tid = try fields.string("tid") { meta["tid"] = tid }
        if let topic = try fields.string("topic") { meta["topic"] = topic }
        if let label = headers["x-limit-d"] {
            guard label.utf8.count <= IngestLimits.labelBytes else { throw IngestLimits.tooLong("X-Limit-D", limit: IngestLimits.labelBytes) }
            meta["x_limit_d"] = label
        }
        var raw = RawFix(time: time, lat: try fields.requiredDouble("lat"), lon: try fields.requiredDouble("lon"), meta: meta)
        raw.accuracyM = try fields.double("acc")
        raw.altitudeM = try fields.double("alt")
        raw.speedMps = try fields.double("vel").map { $0.map { $0 / 3.6 } }  // km/h
        raw.courseDeg = try fields.double("cog")
        raw.battery = try fields.double("batt").map { $0.map { $0 < 0 ? -1 : $0 / 100 } }
        return try normalizer.fix(raw, device: device, source: .owntracks)
    }

    private func ownTracksTransition(_ fields: JSONFields, device: String) throws -> ClientTransition {
        guard let time = try fields.time("tst") else { throw IngestError.invalid(fields.name("tst"), "is required") }
        try normalizer.checkTime(time.value, field: time.field)
        guard let event = try fields.string("event"), ["enter", "leave"].contains(event) else {
            throw IngestError.invalid(fields.name("event"), "expected enter or leave")
        }
        let lat = try fields.double("lat")
        let lon = try fields.double("lon")
        if let lat, !(lat.value.isFinite && (-90...90).contains(lat.value)) { throw IngestError.invalid(lat.field, "latitude must be from -90 to 90") }
        if let lon, !(lon.value.isFinite && (-180...180).contains(lon.value)) { throw IngestError.invalid(lon.field, "longitude must be from -180 to 180") }
        let accuracy = try fields.double("acc").map(\.value).flatMap { $0.isFinite && $0 >= 0 ? $0 : nil }
        return ClientTransition(
            device: device, time: Normalizer.milliseconds(time.value), event: event, region: try fields.string("desc") ?? fields.string("rid"),
            lat: lat?.value, lon: lon?.value, accuracyM: accuracy, source: .owntracks)
    }

    // MARK: Overland

    func overland(_ body: [UInt8], device: String) throws -> [JournalRecord] {
        let batch = try OverlandBatch(body, limit: IngestLimits.batchItems)
        guard batch.isObject else { throw IngestError.invalid("body", "expected a JSON object") }
        switch batch.locations {
        case .missing: throw IngestError.invalid("locations", "is required")
        case .notAList: throw IngestError.invalid("locations", "expected a list")
        case .list: break
        }
        guard batch.count <= IngestLimits.batchItems else {
            throw IngestError.tooLarge("a batch holds at most \(IngestLimits.batchItems) locations, got \(batch.count)", field: "locations")
        }
        var records: [JournalRecord] = []
        var samples: [MotionSample] = []
        records.reserveCapacity(batch.items.count)
        for (index, item) in batch.items.enumerated() {
            // One name per location; each field's is joined to it only for an error message.
            let path = "locations[\(index)]"
            guard item.isObject else { throw IngestError.invalid(path, "expected a JSON object") }
            // Records without a geometry (`action: will_terminate`…) are app events, not fixes.
            guard let geometry = item.geometry else { continue }
            guard geometry.isObject else { throw IngestError.invalid(path + ".geometry", "expected a JSON object") }
            let properties = item.properties
            guard properties.isObject else { throw IngestError.invalid(path + ".properties", "expected a JSON object") }
            guard let coordinateList = geometry.coordinates else { throw IngestError.invalid(path + ".geometry.coordinates", "expected [longitude, latitude]") }
            guard case .list(let coordinates) = coordinateList else { throw IngestError.invalid(path + ".geometry.coordinates", "expected a list") }
            guard coordinates.count >= 2 else { throw IngestError.invalid(path + ".geometry.coordinates", "expected [longitude, latitude]") }
            guard let time = try JSONFields.time(properties.timestamp, path: path, key: "properties.timestamp") else {
                throw IngestError.invalid(path + ".properties.timestamp", "is required")
            }
            var meta: [String: String] = [:]
            if let label = try JSONFields.string(properties.deviceID, path: path, key: "properties.device_id"), !label.isEmpty { meta["device_id"] = label }
            guard let lat = try JSONFields.double(coordinates.latitude, path: path, key: "geometry.coordinates[1]") else {
                throw IngestError.invalid(path + ".geometry.coordinates[1]", "is required")
            }
            guard let lon = try JSONFields.double(coordinates.longitude, path: path, key: "geometry.coordinates[0]") else {
                throw IngestError.invalid(path + ".geometry.coordinates[0]", "is required")
            }
            var raw = RawFix(time: time, lat: lat, lon: lon, meta: meta)
            raw.accuracyM = try JSONFields.double(properties.horizontalAccuracy, path: path, key: "properties.horizontal_accuracy")
            raw.altitudeM = try JSONFields.double(properties.altitude, path: path, key: "properties.altitude")
            raw.speedMps = try JSONFields.double(properties.speed, path: path, key: "properties.speed")
            raw.courseDeg = try JSONFields.double(properties.course, path: path, key: "properties.course")
            raw.battery = try JSONFields.double(properties.batteryLevel, path: path, key: "properties.battery_level")
            let fix = try normalizer.fix(raw, device: device, source: .overland)
            records.append(JournalRecord(.fix(fix)))
            switch properties.motion {
            case nil: break
            case .notAList?: throw IngestError.invalid(path + ".properties.motion", "expected a list")
            case .list(let names)?:
                let activity = Self.overlandActivity(names)
                // A run of one activity is one change: `MotionChanges` would leave the rest out
                // (a batch of a hundred locations made a hundred samples, to drop ninety-nine).
                if samples.last?.activity != activity {
                    samples.append(MotionSample(device: device, start: fix.time, activity: activity, confidence: .medium, source: .overland))
                }
            }
        }
        // Appended in place: `records + …` would copy every fix into a new array.
        records.append(contentsOf: samples.lazy.map { JournalRecord(.motion($0)) })
        return records
    }

    /// Overland lists every activity iOS reports at once (`["driving", "stationary"]` at a light):
    /// the most specific one wins.
    static func overlandActivity(_ names: OverlandBatch.MotionNames) -> MotionSample.Activity {
        if names.contains(.driving) { return .automotive }
        if names.contains(.cycling) { return .cycling }
        if names.contains(.running) { return .running }
        if names.contains(.walking) { return .walking }
        if names.contains(.stationary) { return .stationary }
        return .unknown
    }

    // MARK: Traccar Client / OsmAnd

    func osmand(parameters: Parameters, body: [UInt8], isJSON: Bool) throws -> Parsed {
        if isJSON { return try traccarJSON(body) }
        var parsed = Parsed()
        parsed.clientID = parameters.first("id", "deviceid").map { (field: $0.name, value: $0.value) }
        var latitude = try parameters.first("lat").map { RawFix.Value(value: try Normalizer.number($0.value, field: $0.name), field: $0.name) }
        var longitude = try parameters.first("lon").map { RawFix.Value(value: try Normalizer.number($0.value, field: $0.name), field: $0.name) }
        if let location = parameters["location"] {
            let parts = location.split(separator: ",")
            guard parts.count == 2 else { throw IngestError.invalid("location", "expected latitude,longitude, got \"\(location)\"") }
            latitude = .init(value: try Normalizer.number(String(parts[0]), field: "location"), field: "location")
            longitude = .init(value: try Normalizer.number(String(parts[1]), field: "location"), field: "location")
        }
        // Cell- or wifi-only reports carry no position: acknowledged, nothing stored.
        guard let latitude, let longitude else { return parsed }
        let time = try parameters.first("timestamp").map { RawFix.Value(value: try Normalizer.parseTime($0.value, field: $0.name), field: $0.name) }
            ?? .init(value: normalizer.now(), field: "timestamp")
        var raw = RawFix(time: time, lat: latitude, lon: longitude)
        func number(_ names: String...) throws -> RawFix.Value<Double>? {
            for name in names {
                if let text = parameters[name], !text.isEmpty { return .init(value: try Normalizer.number(text, field: name), field: name) }
            }
            return nil
        }
        raw.speedMps = try number("speed").map { $0.map { $0 * 0.514_444 } }  // knots
        raw.courseDeg = try number("bearing", "heading")
        raw.altitudeM = try number("altitude")
        raw.accuracyM = try number("accuracy", "hacc")
        raw.battery = try number("batt").map { $0.map { $0 < 0 ? -1 : $0 / 100 } }
        if let id = parsed.clientID { raw.meta["id"] = id.value }
        parsed.records = [JournalRecord(.fix(try normalizer.fix(raw, device: "-", source: .osmand)))]
        return parsed
    }

    /// Traccar Client 9+: `{"device_id", "location": {"timestamp", "coords": {…}, "activity", "battery"}}`.
    private func traccarJSON(_ body: [UInt8]) throws -> Parsed {
        let root = try JSONFields.object(try JSONFields.parse(body), path: "")
        var parsed = Parsed()
        if let id = try root.string("device_id") { parsed.clientID = ("device_id", id) }
        guard let location = try root.child("location"), let coords = try location.child("coords") else { return parsed }
        guard let time = try location.time("timestamp") else { throw IngestError.invalid(location.name("timestamp"), "is required") }
        var raw = RawFix(time: time, lat: try coords.requiredDouble("latitude"), lon: try coords.requiredDouble("longitude"))
        raw.speedMps = try coords.double("speed")  // m/s here, unlike the query form's knots
        raw.courseDeg = try coords.double("heading")
        raw.altitudeM = try coords.double("altitude")
        raw.accuracyM = try coords.double("accuracy")
        raw.battery = try location.child("battery")?.double("level")
        if let id = parsed.clientID { raw.meta["device_id"] = id.value }
        let fix = try normalizer.fix(raw, device: "-", source: .osmand)
        parsed.records = [JournalRecord(.fix(fix))]
        if let activity = try location.child("activity"), let type = try activity.string("type") {
            let confidence = try activity.double("confidence").map(\.value) ?? 50
            let sample = MotionSample(
                device: "-", start: fix.time, activity: Self.traccarActivity(type),
                confidence: confidence >= 75 ? .high : confidence >= 40 ? .medium : .low, source: .osmand)
            parsed.records.append(JournalRecord(.motion(sample)))
        }
        return parsed
    }

    static func traccarActivity(_ type: String) -> MotionSample.Activity {
        switch type {
        case "still": .stationary
        case "on_foot", "walking": .walking
        case "running": .running
        case "on_bicycle": .cycling
        case "in_vehicle": .automotive
        default: .unknown
        }
    }

    // MARK: GPSLogger

    func gpsLogger(_ parameters: Parameters, device: String) throws -> [JournalRecord] {
        func number(_ names: String...) throws -> RawFix.Value<Double>? {
            for name in names {
                if let text = parameters[name], !text.isEmpty { return .init(value: try Normalizer.number(text, field: name), field: name) }
            }
            return nil
        }
        guard let lat = try number("latitude", "lat") else { throw IngestError.invalid("latitude", "is required") }
        guard let lon = try number("longitude", "lon") else { throw IngestError.invalid("longitude", "is required") }
        let time = try parameters.first("time", "timestamp").map { RawFix.Value(value: try Normalizer.parseTime($0.value, field: $0.name), field: $0.name) }
            ?? .init(value: normalizer.now(), field: "time")
        var raw = RawFix(time: time, lat: lat, lon: lon)
        raw.accuracyM = try number("accuracy", "acc")
        raw.altitudeM = try number("altitude", "alt")
        raw.speedMps = try number("speed", "spd")
        raw.courseDeg = try number("direction", "dir", "bearing")
        raw.battery = try number("battery", "batt").map { $0.map { $0 < 0 ? -1 : $0 / 100 } }
        // GPSLogger writes 0 for what it does not know: an altitude or battery of exactly 0 is
        // its placeholder, not a reading.
        if raw.altitudeM?.value == 0 {
            raw.altitudeM = nil
            normalizer.dropped.count("altitude_m", "placeholder")
        }
        if raw.battery?.value == 0 {
            raw.battery = nil
            normalizer.dropped.count("battery", "placeholder")
        }
        if let label = parameters["device"] { raw.meta["device"] = label }
        return [JournalRecord(.fix(try normalizer.fix(raw, device: device, source: .gpslogger)))]
    }

    // MARK: Native API

    func nativeFixes(_ body: [UInt8], device: String, source: FixSource = .api) throws -> [JournalRecord] {
        try nativeFixes(root: try JSONFields.object(try JSONFields.parse(body), path: ""), device: device, source: source)
    }

    /// The fixes of a batch read by `NativeBatch`, checked and normalised as `nativeFixes` does.
    func nativeFixes(_ batch: NativeBatch, source: FixSource) throws(IngestError) -> [JournalRecord] {
        var records: [JournalRecord] = []
        records.reserveCapacity(batch.items.count)
        for (index, item) in batch.items.enumerated() {
            let path = "fixes[\(index)]"
            func value(_ number: Double?, _ key: String) -> RawFix.Value<Double>? { number.map { .init(value: $0, path: path, key: key) } }
            var raw = RawFix(time: .init(value: item.time, path: path, key: "time"), lat: .init(value: item.lat, path: path, key: "lat"),
                             lon: .init(value: item.lon, path: path, key: "lon"))
            raw.accuracyM = value(item.accuracyM, "accuracy_m")
            raw.altitudeM = value(item.altitudeM, "altitude_m")
            raw.speedMps = value(item.speedMps, "speed_mps")
            raw.courseDeg = value(item.courseDeg, "course_deg")
            raw.battery = value(item.battery, "battery")
            records.append(JournalRecord(.fix(try normalizer.fix(raw, device: batch.device, source: source))))
        }
        return records
    }

    /// The fixes of a native batch whose body is parsed already.
    func nativeFixes(root: JSONFields, device: String, source: FixSource = .api) throws -> [JournalRecord] {
        guard let fixes = try root.array("fixes") else { throw IngestError.invalid("fixes", "is required") }
        guard fixes.count <= IngestLimits.batchItems else {
            throw IngestError.tooLarge("a batch holds at most \(IngestLimits.batchItems) fixes, got \(fixes.count)", field: "fixes")
        }
        var records: [JournalRecord] = []
        records.reserveCapacity(fixes.count)
        for (index, item) in fixes.enumerated() {
            let fields = try JSONFields.object(item, path: "fixes[\(index)]")
            if let named = try fields.string("device"), named != device {
                throw IngestError.forbidden("this token belongs to device \"\(device)\", not \"\(named)\"", field: fields.name("device"))
            }
            guard let time = try fields.time("time") else { throw IngestError.invalid(fields.name("time"), "is required") }
            var raw = RawFix(time: time, lat: try fields.requiredDouble("lat"), lon: try fields.requiredDouble("lon"))
            raw.accuracyM = try fields.double("accuracy_m")
            raw.altitudeM = try fields.double("altitude_m")
            raw.speedMps = try fields.double("speed_mps")
            raw.courseDeg = try fields.double("course_deg")
            raw.battery = try fields.double("battery")
            records.append(JournalRecord(.fix(try normalizer.fix(raw, device: device, source: source))))
        }
        return records
    }

    func nativeMotion(_ body: [UInt8], device: String) throws -> [JournalRecord] {
        try nativeMotion(root: try JSONFields.object(try JSONFields.parse(body), path: ""), device: device)
    }

    func nativeMotion(root: JSONFields, device: String) throws -> [JournalRecord] {
        guard let samples = try root.array("samples") else { throw IngestError.invalid("samples", "is required") }
        guard samples.count <= IngestLimits.batchItems else {
            throw IngestError.tooLarge("a batch holds at most \(IngestLimits.batchItems) samples, got \(samples.count)", field: "samples")
        }
        var records: [JournalRecord] = []
        for (index, item) in samples.enumerated() {
            let fields = try JSONFields.object(item, path: "samples[\(index)]")
            guard let start = try fields.time("start") else { throw IngestError.invalid(fields.name("start"), "is required") }
            try normalizer.checkTime(start.value, field: start.field)
            guard let activityName = try fields.string("activity"), let activity = MotionSample.Activity(rawValue: activityName) else {
                throw IngestError.invalid(fields.name("activity"), "expected one of \(MotionSample.Activity.allCases.map(\.rawValue).joined(separator: ", "))")
            }
            guard let confidenceName = try fields.string("confidence"), let confidence = MotionSample.Confidence(rawValue: confidenceName) else {
                throw IngestError.invalid(fields.name("confidence"), "expected low, medium or high")
            }
            records.append(JournalRecord(.motion(MotionSample(
                device: device, start: Normalizer.milliseconds(start.value), activity: activity, confidence: confidence, source: .api))))
        }
        return records
    }

    /// `publish_visits`: stays at places from an imported history.
    func visits(root: JSONFields, device: String) throws -> [JournalRecord] {
        guard let visits = try root.array("visits") else { throw IngestError.invalid("visits", "is required") }
        guard visits.count <= IngestLimits.batchItems else {
            throw IngestError.tooLarge("a batch holds at most \(IngestLimits.batchItems) visits, got \(visits.count)", field: "visits")
        }
        return try visits.enumerated().map { index, item in
            let fields = try JSONFields.object(item, path: "visits[\(index)]")
            guard let start = try fields.time("start") else { throw IngestError.invalid(fields.name("start"), "is required") }
            guard let end = try fields.time("end") else { throw IngestError.invalid(fields.name("end"), "is required") }
            try normalizer.checkTime(start.value, field: start.field)
            try normalizer.checkTime(end.value, field: end.field)
            guard end.value >= start.value else { throw IngestError.invalid(end.field, "is before start") }
            let lat = try fields.requiredDouble("lat"), lon = try fields.requiredDouble("lon")
            guard lat.value.isFinite, (-90...90).contains(lat.value) else {
                throw IngestError.invalid(fields.name("lat"), "latitude must be from -90 to 90, got \(lat.value)")
            }
            guard lon.value.isFinite, (-180...180).contains(lon.value) else {
                throw IngestError.invalid(fields.name("lon"), "longitude must be from -180 to 180, got \(lon.value)")
            }
            return JournalRecord(.visit(Visit(
                device: device, start: Normalizer.milliseconds(start.value), end: Normalizer.milliseconds(end.value), lat: lat.value, lon: lon.value,
                name: try fields.string("name", limit: 1024), address: try fields.string("address", limit: 1024), placeID: try fields.string("place_id", limit: 1024),
                semanticType: try fields.string("semantic_type", limit: 1024))))
        }
    }

    func sessionStart(_ body: [UInt8], device: String) throws -> [JournalRecord] {
        let root = try JSONFields.object(try JSONFields.parse(body), path: "")
        guard let candidate = try root.string("candidate"), !candidate.isEmpty, candidate.count <= 200 else {
            throw IngestError.invalid("candidate", "is required (at most 200 characters)")
        }
        let time = try root.time("time")?.value ?? normalizer.now()
        try normalizer.checkTime(time, field: "time")
        return [JournalRecord(.sessionStarted(SessionStarted(
            sessionID: "", device: device, candidate: candidate, instructor: try root.string("instructor"), note: try root.string("note", limit: IngestLimits.noteBytes),
            time: Normalizer.milliseconds(time))))]
    }

    func sessionStop(_ body: [UInt8], device: String, open: String?) throws -> [JournalRecord] {
        var time = normalizer.now()
        var id = open ?? ""
        if !body.allSatisfy({ $0 == 0x20 || $0 == 0x0A || $0 == 0x0D || $0 == 0x09 }) {
            let root = try JSONFields.object(try JSONFields.parse(body), path: "")
            if let given = try root.time("time") {
                try normalizer.checkTime(given.value, field: given.field)
                time = given.value
            }
            if let named = try root.string("session_id") { id = named }
        }
        return [JournalRecord(.sessionStopped(SessionStopped(sessionID: id, device: device, time: Normalizer.milliseconds(time))))]
    }

    func checkin(_ body: [UInt8], device: String) throws -> [JournalRecord] {
        var time = normalizer.now()
        if !body.allSatisfy({ $0 == 0x20 || $0 == 0x0A || $0 == 0x0D || $0 == 0x09 }) {
            let root = try JSONFields.object(try JSONFields.parse(body), path: "")
            if let given = try root.time("time") {
                try normalizer.checkTime(given.value, field: given.field)
                time = given.value
            }
        }
        return [JournalRecord(.checkin(TaxiCheckin(device: device, time: Normalizer.milliseconds(time))))]
    }
}
