import DrivebusSchema
import Foundation

/// A `Records.json` location in the shape Takeout writes it, read straight from its bytes with no
/// JSON tree: building a dictionary per location was half the importer's time. Only the plain
/// shape is taken: numbers as numbers, `timestamp` as RFC 3339, each key once. Anything else
/// (`timestampMs`, numbers as strings, nulls, values out of range) returns false and the element
/// is read the general way (`LocationHistoryReader.record`), so every error and every leniency
/// stays that path's, and the two agree wherever this one answers.
enum PlainRecord {
    /// Appends the location's point and activities to `events`; false when `bytes` is not the
    /// plain shape (then nothing was appended).
    static func read(_ bytes: [UInt8], location: String, into events: inout [TrackReader.Event]) -> Bool {
        var reader = JSONReader(bytes)
        var latE7: Double?, lonE7: Double?, time: Date?, timeMs: Date?
        var accuracy: Double?, velocity: Double?, heading: Double?, altitude: Double?
        var readings: [Reading] = []
        var seen: UInt16 = 0
        do throws(JSONReader.Failure) {
            func once(_ bit: UInt16, _ reader: JSONReader) throws(JSONReader.Failure) {
                guard seen & bit == 0 else { throw reader.failure("repeated") }
                seen |= bit
            }
            try reader.readObject { reader, key throws(JSONReader.Failure) in
                switch key {
                case "latitudeE7": try once(1, reader); latE7 = try finite(&reader)
                case "longitudeE7": try once(2, reader); lonE7 = try finite(&reader)
                case "timestamp": try once(4, reader); time = try reader.readDate()
                case "accuracy": try once(8, reader); accuracy = try finite(&reader)
                case "velocity": try once(16, reader); velocity = try finite(&reader)
                case "heading": try once(32, reader); heading = try finite(&reader)
                case "altitude": try once(64, reader); altitude = try finite(&reader)
                case "activity": try once(128, reader); readings = try readActivity(&reader)
                case "timestampMs": try once(256, reader); timeMs = try epochText(&reader)
                // Depths as the general path counts them from the element, so that both refuse
                // the same nesting.
                default: try reader.skipValue(depth: 1)
                }
            }
            try reader.finish()
        } catch {
            return false
        }
        // `timestamp` first, as the general path takes it.
        if time == nil { time = timeMs }
        // A position half there, or out of range, is the general path's to judge.
        if (latE7 == nil) != (lonE7 == nil) { return false }
        var point: TrackReader.Point?
        if let latE7, let lonE7 {
            let lat = LocationHistoryReader.unwrapE7(latE7) / 1e7, lon = LocationHistoryReader.unwrapE7(lonE7) / 1e7
            guard abs(lat) <= 90, abs(lon) <= 180 else { return false }
            var found = TrackReader.Point(lat: lat, lon: lon, location: location)
            found.time = time
            found.accuracyM = accuracy
            found.speedMps = velocity
            found.courseDeg = heading
            found.elevationM = altitude
            point = found
        }
        if let point { events.append(.point(point)) }
        for (index, reading) in readings.enumerated() {
            guard let (kind, percent) = reading.best, let at = reading.time ?? time else { continue }
            events.append(.activity(TrackReader.Activity(
                time: at, activity: kind, confidence: LocationHistoryReader.confidence(percent: percent),
                location: "\(location).activity[\(index)]")))
        }
        return true
    }

    /// One entry of `activity[]`: its own time, if it has one, and its most likely activity.
    private struct Reading {
        var time: Date?
        var best: (MotionSample.Activity, Double)?
    }

    private static func readActivity(_ reader: inout JSONReader) throws(JSONReader.Failure) -> [Reading] {
        var readings: [Reading] = []
        try reader.readArray { reader throws(JSONReader.Failure) in
            var reading = Reading()
            var hasCandidates = false
            var timeMs: Date?
            try reader.readObject { reader, key throws(JSONReader.Failure) in
                switch key {
                case "timestamp":
                    guard reading.time == nil else { throw reader.failure("repeated") }
                    reading.time = try reader.readDate()
                case "activity":
                    guard !hasCandidates else { throw reader.failure("repeated") }
                    hasCandidates = true
                    try reader.readArray { reader throws(JSONReader.Failure) in
                        var type: String?, percent: Double?
                        try reader.readObject { reader, key throws(JSONReader.Failure) in
                            switch key {
                            case "type":
                                guard type == nil else { throw reader.failure("repeated") }
                                type = try reader.readString()
                            case "confidence":
                                guard percent == nil else { throw reader.failure("repeated") }
                                percent = try finite(&reader)
                            default: try reader.skipValue(depth: 5)
                            }
                        }
                        guard let type, let kind = LocationHistoryReader.activity(type) else { return }
                        let score = percent ?? 0
                        if reading.best.map({ score > $0.1 }) ?? true { reading.best = (kind, score) }
                    }
                case "timestampMs":
                    guard timeMs == nil else { throw reader.failure("repeated") }
                    timeMs = try epochText(&reader)
                default: try reader.skipValue(depth: 3)
                }
            }
            if reading.time == nil { reading.time = timeMs }
            // Without candidates `best` stays nil, and the reading is skipped as the general path
            // skips it.
            readings.append(reading)
        }
        return readings
    }

    /// Old exports' `timestampMs`: epoch milliseconds as a string, read by the general path's rules.
    private static func epochText(_ reader: inout JSONReader) throws(JSONReader.Failure) -> Date {
        guard case .success(let date) = Values.time(try reader.readString()) else { throw reader.failure("not a time") }
        return date
    }

    private static func finite(_ reader: inout JSONReader) throws(JSONReader.Failure) -> Double {
        let value = try reader.readDouble()
        guard value.isFinite else { throw reader.failure("not finite") }
        return value
    }
}
