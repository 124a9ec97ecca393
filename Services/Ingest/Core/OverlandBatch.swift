import DrivebusSchema

/// An Overland body read in one pass, keeping of each location only the values that become a
/// fix. A tree of the whole body (a dictionary for every object, a string for every key and
/// value, `wifi` and `battery_state` included) took 40 % of ingest's time under batched uploads.
///
/// Nothing is judged while reading: the body is checked to its end first, so a malformed body
/// is refused as malformed JSON, and the fields are then judged in the order they always were.
/// As in any JSON object, a key given twice counts with its last value. Nesting is limited as
/// `JSONValue.parse` limits it (each value read at the depth it has in the document).
struct OverlandBatch {
    enum Locations {
        case missing
        case notAList
        case list
    }

    struct Location {
        var isObject = true
        /// nil when absent or `null`: a location without one is an app event, not a fix.
        var geometry: Geometry?
        var properties = Properties()
    }

    struct Geometry {
        var isObject = true
        /// nil when absent or `null`.
        var coordinates: List<Coordinates>?
    }

    /// A list inside a location, read element by element: what a fix needs of it, without the
    /// tree (a list and its values cost two allocations a location, a tenth of reading a batch).
    enum List<Contents> {
        case list(Contents)
        /// Anything but a list or `null`.
        case notAList
    }

    /// `geometry.coordinates`: its first two elements, judged later as any field is, and how many
    /// it holds.
    struct Coordinates {
        var count = 0
        var longitude: JSONValue?
        var latitude: JSONValue?
    }

    /// The activities drivebus knows among the strings of `properties.motion`; anything else in
    /// the list is ignored.
    struct MotionNames: OptionSet {
        let rawValue: UInt8
        static let driving = Self(rawValue: 1 << 0)
        static let cycling = Self(rawValue: 1 << 1)
        static let running = Self(rawValue: 1 << 2)
        static let walking = Self(rawValue: 1 << 3)
        static let stationary = Self(rawValue: 1 << 4)
    }

    struct Properties {
        var isObject = true
        var timestamp: JSONValue?
        var deviceID: JSONValue?
        var horizontalAccuracy: JSONValue?
        var altitude: JSONValue?
        var speed: JSONValue?
        var course: JSONValue?
        var batteryLevel: JSONValue?
        /// nil when absent or `null`.
        var motion: List<MotionNames>?
    }

    private(set) var isObject = true
    private(set) var locations = Locations.missing
    /// Every location up to `limit`; `count` counts them all.
    private(set) var items: [Location] = []
    private(set) var count = 0

    /// Reads `body`; only malformed JSON is an error here. At most `limit` locations are kept.
    init(_ body: [UInt8], limit: Int) throws(IngestError) {
        var reader = JSONReader(body)
        do {
            try read(&reader, limit: limit)
            try reader.finish()
        } catch {
            throw .malformedJSON(error.description)
        }
    }

    private mutating func read(_ reader: inout JSONReader, limit: Int) throws(JSONReader.Failure) {
        isObject = try Self.readObject(&reader, depth: 0) { (reader: inout JSONReader, key: JSONKey) throws(JSONReader.Failure) in
            guard "locations" ~= key else { return try reader.skipValue(depth: 1) }
            items = []
            count = 0
            if reader.readNull() {
                locations = .missing
            } else if reader.peekNonSpace() == UInt8(ascii: "[") {
                locations = .list
                try reader.readArray { (reader: inout JSONReader) throws(JSONReader.Failure) in
                    count += 1
                    if count > limit { return try reader.skipValue(depth: 2) }
                    items.append(try Location(reading: &reader))
                }
            } else {
                locations = .notAList
                try reader.skipValue(depth: 1)
            }
        }
    }

    /// Reads the object at `depth`, calling `field` for each key as `JSONReader.readObject` does;
    /// anything else there is skipped (checked, as the body is checked to its end) and false
    /// returned, to be judged after the reading.
    static func readObject(
        _ reader: inout JSONReader, depth: Int, _ field: (inout JSONReader, JSONKey) throws(JSONReader.Failure) -> Void
    ) throws(JSONReader.Failure) -> Bool {
        guard reader.peekNonSpace() == UInt8(ascii: "{") else {
            try reader.skipValue(depth: depth)
            return false
        }
        try reader.readObject(field)
        return true
    }

    /// Reads the list at `depth` into `contents`, one `element` call each; nil for `null`, and
    /// anything else is skipped (checked) and `.notAList`.
    static func readList<Contents>(
        _ reader: inout JSONReader, depth: Int, into contents: Contents, _ element: (inout JSONReader, inout Contents) throws(JSONReader.Failure) -> Void
    ) throws(JSONReader.Failure) -> List<Contents>? {
        if reader.readNull() { return nil }
        guard reader.peekNonSpace() == UInt8(ascii: "["), depth < 64 else {
            try reader.skipValue(depth: depth)
            return .notAList
        }
        var contents = contents
        try reader.readArray { (reader: inout JSONReader) throws(JSONReader.Failure) in try element(&reader, &contents) }
        return .list(contents)
    }
}

extension OverlandBatch.Location {
    /// A location at depth 2 (body, `locations`, here).
    init(reading reader: inout JSONReader) throws(JSONReader.Failure) {
        isObject = try OverlandBatch.readObject(&reader, depth: 2) { (reader: inout JSONReader, key: JSONKey) throws(JSONReader.Failure) in
            switch key {
            case "geometry": geometry = reader.readNull() ? nil : try OverlandBatch.Geometry(reading: &reader)
            case "properties": properties = reader.readNull() ? .init() : try OverlandBatch.Properties(reading: &reader)
            default: try reader.skipValue(depth: 3)
            }
        }
    }
}

extension OverlandBatch.Geometry {
    init(reading reader: inout JSONReader) throws(JSONReader.Failure) {
        isObject = try OverlandBatch.readObject(&reader, depth: 3) { (reader: inout JSONReader, key: JSONKey) throws(JSONReader.Failure) in
            guard "coordinates" ~= key else { return try reader.skipValue(depth: 4) }
            coordinates = try OverlandBatch.readList(&reader, depth: 4, into: OverlandBatch.Coordinates()) { (reader: inout JSONReader, coordinates: inout OverlandBatch.Coordinates) throws(JSONReader.Failure) in
                switch coordinates.count {
                case 0: coordinates.longitude = try reader.readValue(depth: 5)
                case 1: coordinates.latitude = try reader.readValue(depth: 5)
                default: try reader.skipValue(depth: 5)  // an altitude, or whatever else follows
                }
                coordinates.count += 1
            }
        }
    }
}

extension OverlandBatch.Properties {
    init(reading reader: inout JSONReader) throws(JSONReader.Failure) {
        isObject = try OverlandBatch.readObject(&reader, depth: 3) { (reader: inout JSONReader, key: JSONKey) throws(JSONReader.Failure) in
            switch key {
            case "timestamp": timestamp = try reader.readValue(depth: 4)
            case "device_id": deviceID = try reader.readValue(depth: 4)
            case "horizontal_accuracy": horizontalAccuracy = try reader.readValue(depth: 4)
            case "altitude": altitude = try reader.readValue(depth: 4)
            case "speed": speed = try reader.readValue(depth: 4)
            case "course": course = try reader.readValue(depth: 4)
            case "battery_level": batteryLevel = try reader.readValue(depth: 4)
            case "motion":
                motion = try OverlandBatch.readList(&reader, depth: 4, into: OverlandBatch.MotionNames()) { (reader: inout JSONReader, names: inout OverlandBatch.MotionNames) throws(JSONReader.Failure) in
                    guard reader.peekNonSpace() == UInt8(ascii: "\"") else { return try reader.skipValue(depth: 5) }
                    switch try reader.readString() {  // short names are Strings without an allocation
                    case "driving": names.insert(.driving)
                    case "cycling": names.insert(.cycling)
                    case "running": names.insert(.running)
                    case "walking": names.insert(.walking)
                    case "stationary": names.insert(.stationary)
                    default: break
                    }
                }
            default: try reader.skipValue(depth: 4)
            }
        }
    }
}
