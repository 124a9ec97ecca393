import DrivebusSchema
import DrivebusTestSupport
import DrivebusTrackFormats
import Foundation
import Testing

/// Small files in the published shapes of Google's location histories and the OwnTracks
/// Recorder's store, written here from the formats: no one's real history.
@Suite struct LocationHistoryTests {
    /// All the points of `text`, read from a source that hands over `chunk` bytes at a time.
    func points(_ text: String, chunk: Int = 5) throws -> [TrackReader.Point] {
        let bytes = Array(text.utf8)
        let format = try #require(TrackFormat(sniffing: bytes))
        var offset = 0
        let source = ChunkByteSource { () throws(ByteSourceError) -> [UInt8]? in
            guard offset < bytes.count else { return nil }
            defer { offset += chunk }
            return Array(bytes[offset..<min(offset + chunk, bytes.count)])
        }
        return try TrackReader(format: format, source: source).readAll().points
    }

    func activities(_ text: String) throws -> [TrackReader.Activity] {
        let reader = TrackReader(format: try #require(TrackFormat(sniffing: Array(text.utf8))), bytes: Array(text.utf8))
        var out: [TrackReader.Activity] = []
        while let event = try reader.next() { if case .activity(let activity) = event { out.append(activity) } }
        return out
    }

    func error(_ text: String) -> TrackFormatError? {
        do { _ = try points(text); return nil } catch let error as TrackFormatError { return error } catch { return nil }
    }

    static let records = """
        {
          "locations": [{
            "latitudeE7": 481234567, "longitudeE7": 163456789, "accuracy": 12,
            "activity": [{"activity": [{"type": "STILL", "confidence": 100}], "timestamp": "2019-05-01T10:00:01.123Z"}],
            "source": "WIFI", "deviceTag": -1234, "timestamp": "2019-05-01T10:00:00.500Z"
          }, {
            "latitudeE7": 481234667, "longitudeE7": 163456889, "timestampMs": "1556704860000",
            "velocity": 14, "heading": 271, "altitude": 180, "verticalAccuracy": 3, "accuracy": 5
          }, {
            "timestamp": "2019-05-01T10:02:00Z", "activity": [{"activity": [{"type": "IN_VEHICLE", "confidence": 80}]}]
          }, {
            "latitudeE7": 4294967296, "longitudeE7": -1, "timestamp": "2019-05-01T10:03:00+02:00", "note": "a \\"quoted\\" [bracket] {brace}"
          }]
        }
        """

    @Test func takeoutRecordsWithE7BothTimestampsAndMissingFields() throws {
        #expect(TrackFormat(sniffing: Array(Self.records.utf8)) == .locationHistory)
        let read = try points(Self.records)
        // The third location has no position: skipped, as its activity is.
        #expect(read.count == 3)
        #expect(read[0].lat == 48.1234567 && read[0].lon == 16.3456789)
        #expect(read[0].time == RFC3339.parse("2019-05-01T10:00:00.500Z") && read[0].accuracyM == 12 && read[0].speedMps == nil)
        #expect(read[0].location == "locations[0]")
        #expect(read[1].time == Date(timeIntervalSince1970: 1_556_704_860))
        #expect(read[1].speedMps == 14 && read[1].courseDeg == 271 && read[1].elevationM == 180 && read[1].accuracyM == 5)
        // E7 values 2³² too large (old exports) are taken back; quotes and brackets inside
        // strings do not confuse the scanner.
        #expect(read[2].lat == 0 && abs(read[2].lon - -1e-7) < 1e-12)
        #expect(read[2].time == RFC3339.parse("2019-05-01T08:03:00Z") && read[2].location == "locations[3]")
        // Read a byte at a time, the same.
        #expect(try points(Self.records, chunk: 1) == read)
        // Activities become motion samples: each reading's likeliest, at its own time or else
        // its location's.
        #expect(try activities(Self.records) == [
            TrackReader.Activity(time: RFC3339.parse("2019-05-01T10:00:01.123Z")!, activity: .stationary, confidence: .high, location: "locations[0].activity[0]"),
            TrackReader.Activity(time: RFC3339.parse("2019-05-01T10:02:00Z")!, activity: .automotive, confidence: .high, location: "locations[2].activity[0]"),
        ])
    }

    /// Plain `Records.json` locations are read without a JSON tree; a key written twice (with
    /// the same value) sends an element down the general path. Both must give the same events.
    @Test func plainAndGeneralRecordsReadTheSame() throws {
        let elements = [
            #""latitudeE7": 481234567, "longitudeE7": 163456789, "accuracy": 12, "velocity": 3.5, "heading": 90, "altitude": -12.25, "timestamp": "2019-05-01T10:00:00.500Z""#,
            #""latitudeE7": 4294967296, "longitudeE7": -1, "timestamp": "2019-05-01T10:03:00+02:00", "source": "GPS", "platformType": "ANDROID""#,
            #""latitudeE7": 481234567, "longitudeE7": 163456789, "activity": [{"timestamp": "2019-05-01T10:00:01Z", "activity": [{"type": "WALKING", "confidence": 40}, {"type": "IN_VEHICLE", "confidence": 55}, {"type": "TILTING", "confidence": 99}, {"type": "STILL", "confidence": 55}]}, {"activity": [{"type": "ON_BICYCLE"}]}, {"timestamp": "2019-05-01T10:00:09Z"}], "timestamp": "2019-05-01T10:00:00Z""#,
            #""latitudeE7": -338567890, "longitudeE7": 1512150000, "verticalAccuracy": 3, "deviceDesignation": {"nested": [1, 2, {"x": null}]}, "timestampMs": "1556704860000", "activity": [{"timestampMs": "1556704861000", "activity": [{"type": "ON_FOOT", "confidence": 75}]}, {"activity": [{"type": "STILL", "confidence": 50}]}]"#,
            #""latitudeE7": 1, "longitudeE7": 2, "timestampMs": "1556704870000", "timestamp": "2019-05-01T10:01:11Z""#,
        ]
        func file(_ bodies: [String]) -> String { #"{"locations": ["# + bodies.map { "{\($0)}" }.joined(separator: ", ") + "]}" }
        func events(_ text: String) throws -> [TrackReader.Event] {
            let reader = TrackReader(format: .locationHistory, bytes: Array(text.utf8))
            var out: [TrackReader.Event] = []
            while let event = try reader.next() { out.append(event) }
            return out
        }
        let plain = try events(file(elements))
        let general = try events(file(elements.map { $0 + #", "latitudeE7": "# + $0.split(separator: ",")[0].split(separator: ":")[1] }))
        #expect(plain == general)
        #expect(plain.count == 9)
        // The likeliest of each reading, the first of equals; a reading without a time takes
        // its location's; one without candidates is skipped.
        #expect(plain.compactMap { if case .activity(let a) = $0 { a } else { nil } } == [
            TrackReader.Activity(time: RFC3339.parse("2019-05-01T10:00:01Z")!, activity: .automotive, confidence: .medium, location: "locations[2].activity[0]"),
            TrackReader.Activity(time: RFC3339.parse("2019-05-01T10:00:00Z")!, activity: .cycling, confidence: .low, location: "locations[2].activity[1]"),
            // Epoch milliseconds, of old exports, the reading's own or else its location's.
            TrackReader.Activity(time: Date(timeIntervalSince1970: 1_556_704_861), activity: .walking, confidence: .high, location: "locations[3].activity[0]"),
            TrackReader.Activity(time: Date(timeIntervalSince1970: 1_556_704_860), activity: .stationary, confidence: .medium, location: "locations[3].activity[1]"),
        ])
        // `timestamp` goes before `timestampMs`.
        if case .point(let point) = plain[8] { #expect(point.time == RFC3339.parse("2019-05-01T10:01:11Z")) } else { Issue.record("expected a point last") }
        if case .point(let point) = plain[0] {
            var expected = TrackReader.Point(time: RFC3339.parse("2019-05-01T10:00:00.500Z"), lat: 48.1234567, lon: 16.3456789, elevationM: -12.25, speedMps: 3.5, courseDeg: 90, location: "locations[0]")
            expected.accuracyM = 12
            #expect(point == expected)
        } else {
            Issue.record("expected a point first")
        }
    }

    @Test func semanticLocationHistoryGivesTheTimedPointsOfActivitySegments() throws {
        let month = """
            {"timelineObjects": [
              {"activitySegment": {
                "startLocation": {"latitudeE7": 481000000, "longitudeE7": 163000000},
                "duration": {"startTimestamp": "2021-03-01T08:00:00Z", "endTimestamp": "2021-03-01T08:20:00Z"},
                "activityType": "IN_PASSENGER_VEHICLE",
                "waypointPath": {"waypoints": [{"latE7": 481000000, "lngE7": 163000000}]},
                "simplifiedRawPath": {"points": [
                  {"latE7": 481000000, "lngE7": 163000000, "accuracyMeters": 10, "timestamp": "2021-03-01T08:00:00Z"},
                  {"latE7": 481100000, "lngE7": 163100000, "timestampMs": "1614586200000"}
                ]}}},
              {"placeVisit": {"location": {"latitudeE7": 481100000, "longitudeE7": 163100000, "name": "Office"},
                "duration": {"startTimestamp": "2021-03-01T08:20:00Z", "endTimestamp": "2021-03-01T17:00:00Z"}}}
            ]}
            """
        let read = try points(month)
        #expect(read.map(\.lat) == [48.1, 48.11] && read.map(\.lon) == [16.3, 16.31])
        #expect(read.map(\.time) == [RFC3339.parse("2021-03-01T08:00:00Z"), Date(timeIntervalSince1970: 1_614_586_200)])
        #expect(read[0].accuracyM == 10)
        #expect(read[1].location == "timelineObjects[0].activitySegment.simplifiedRawPath.points[1]")
        #expect(try activities(month).map(\.activity) == [.automotive])
        #expect(try activities(month).map(\.time) == [RFC3339.parse("2021-03-01T08:00:00Z")!])
    }

    @Test func phoneTimelineExportWithDegreeStrings() throws {
        let timeline = """
            {"semanticSegments": [
              {"startTime": "2024-06-01T09:00:00.000+02:00", "endTime": "2024-06-01T10:00:00.000+02:00",
               "timelinePath": [{"point": "48.1234567°, 11.1234567°", "time": "2024-06-01T09:05:00.000+02:00"},
                                {"point": "48.2°,11.2°", "time": "2024-06-01T09:06:00.000+02:00"}]},
              {"startTime": "2024-06-01T10:00:00.000+02:00", "visit": {"topCandidate": {"placeLocation": {"latLng": "48.2°, 11.2°"}}}},
              {"startTime": "2024-06-01T11:00:00.000+02:00", "activity": {"topCandidate": {"type": "WALKING", "probability": 0.6}}}
            ],
            "rawSignals": [
              {"position": {"LatLng": "48.3°, 11.3°", "accuracyMeters": 7, "altitudeMeters": 512.5, "source": "GPS",
                "timestamp": "2024-06-01T09:07:00.000+02:00", "speedMetersPerSecond": 3.5}},
              {"wifiScan": {"deliveryTime": "2024-06-01T09:08:00.000+02:00", "devicesRecords": []}},
              {"position": {"LatLng": "geo:48.4,11.4", "timestamp": "2024-06-01T09:09:00Z"}}
            ],
            "userLocationProfile": {"frequentPlaces": []}}
            """
        let read = try points(timeline)
        #expect(read.map(\.lat) == [48.1234567, 48.2, 48.3, 48.4])
        #expect(read.map(\.lon) == [11.1234567, 11.2, 11.3, 11.4])
        #expect(read[0].time == RFC3339.parse("2024-06-01T07:05:00Z"))
        #expect(read[2].accuracyM == 7 && read[2].elevationM == 512.5 && read[2].speedMps == 3.5)
        #expect(read[2].location == "rawSignals[0].position")
        #expect(try activities(timeline) == [
            TrackReader.Activity(time: RFC3339.parse("2024-06-01T09:00:00Z")!, activity: .walking, confidence: .medium, location: "semanticSegments[2].activity"),
        ])
    }

    @Test func iPhoneTimelineExportIsAnArrayWithMinuteOffsets() throws {
        let timeline = """
            [
              {"endTime": "2024-06-01T10:00:00.000+02:00", "startTime": "2024-06-01T09:00:00.000+02:00",
               "activity": {"end": "geo:48.2,11.2", "topCandidate": {"type": "in passenger vehicle", "probability": "0.91"},
                            "distanceMeters": "5000", "start": "geo:48.1,11.1"}},
              {"endTime": "2024-06-01T10:00:00.000+02:00", "startTime": "2024-06-01T09:00:00.000+02:00",
               "timelinePath": [{"point": "geo:48.1,11.1", "durationMinutesOffsetFromStartTime": "0"},
                                {"point": "geo:48.15,11.15", "durationMinutesOffsetFromStartTime": "12"}]},
              {"endTime": "2024-06-01T18:00:00.000+02:00", "startTime": "2024-06-01T10:00:00.000+02:00",
               "visit": {"hierarchyLevel": "0", "topCandidate": {"placeLocation": "geo:48.2,11.2", "semanticType": "Work"}, "probability": "0.9"}}
            ]
            """
        #expect(TrackFormat(sniffing: Array(timeline.utf8)) == .locationHistory)
        let read = try points(timeline)
        #expect(read.map(\.lat) == [48.1, 48.15] && read.map(\.lon) == [11.1, 11.15])
        #expect(read.map(\.time) == [RFC3339.parse("2024-06-01T07:00:00Z"), RFC3339.parse("2024-06-01T07:12:00Z")])
        #expect(read[1].location == "timeline[1].timelinePath[1]")
        #expect(try activities(timeline) == [
            TrackReader.Activity(time: RFC3339.parse("2024-06-01T07:00:00Z")!, activity: .automotive, confidence: .high, location: "timeline[0].activity"),
        ])
        // A JSON array that is not a timeline is nothing drivebus reads.
        #expect(TrackFormat(sniffing: Array("[1, 2, 3]".utf8)) == nil)
    }

    func visits(_ text: String) throws -> [TrackReader.Visit] {
        let reader = TrackReader(format: try #require(TrackFormat(sniffing: Array(text.utf8))), bytes: Array(text.utf8))
        var out: [TrackReader.Visit] = []
        while let event = try reader.next() { if case .visit(let visit) = event { out.append(visit) } }
        return out
    }

    @Test func visitsOfTheSemanticHistoryAndOfBothTimelineExports() throws {
        let semantic = """
            {"timelineObjects": [
              {"placeVisit": {"location": {"latitudeE7": 482084900, "longitudeE7": 163730800, "placeId": "ChIJplace1", "address": "Platz 1, 1010 Wien",
                 "name": "  Café Central ", "semanticType": "TYPE_SEARCHED_ADDRESS", "locationConfidence": 71.5},
               "duration": {"startTimestamp": "2019-05-01T10:00:00Z", "endTimestamp": "2019-05-01T11:30:00.250Z"}, "placeConfidence": "HIGH_CONFIDENCE"}},
              {"placeVisit": {"location": {"latitudeE7": 482000000, "longitudeE7": 163000000}, "duration": {"startTimestampMs": "1556712000000", "endTimestampMs": "1556715600000"}}},
              {"placeVisit": {"location": {"placeId": "no position"}, "duration": {"startTimestamp": "2019-05-01T14:00:00Z", "endTimestamp": "2019-05-01T15:00:00Z"}}}
            ]}
            """
        #expect(try visits(semantic) == [
            TrackReader.Visit(
                start: date("2019-05-01T10:00:00Z"), end: date("2019-05-01T11:30:00.250Z"), lat: 48.20849, lon: 16.37308, name: "Café Central",
                address: "Platz 1, 1010 Wien", placeID: "ChIJplace1", semanticType: "TYPE_SEARCHED_ADDRESS", location: "timelineObjects[0].placeVisit"),
            TrackReader.Visit(start: date("2019-05-01T12:00:00Z"), end: date("2019-05-01T13:00:00Z"), lat: 48.2, lon: 16.3, location: "timelineObjects[1].placeVisit"),
        ])
        let android = """
            {"semanticSegments": [
              {"startTime": "2024-03-01T08:00:00.000+01:00", "endTime": "2024-03-01T17:00:00.000+01:00",
               "visit": {"hierarchyLevel": 0, "probability": 0.9, "topCandidate": {"placeId": "ChIJwork", "semanticType": "WORK", "probability": 0.8,
                 "placeLocation": {"latLng": "48.1234567°, 11.1234567°"}}}},
              {"startTime": "2024-03-01T09:00:00.000+01:00", "endTime": "2024-03-01T10:00:00.000+01:00",
               "visit": {"hierarchyLevel": 1, "topCandidate": {"placeId": "ChIJroom", "placeLocation": {"latLng": "48.1234°, 11.1234°"}}}}
            ]}
            """
        #expect(try visits(android) == [TrackReader.Visit(
            start: date("2024-03-01T07:00:00Z"), end: date("2024-03-01T16:00:00Z"), lat: 48.1234567, lon: 11.1234567, placeID: "ChIJwork",
            semanticType: "WORK", location: "semanticSegments[0].visit")])
        let iPhone = """
            [{"startTime": "2024-03-02T18:00:00.000Z", "endTime": "2024-03-03T07:00:00.000Z",
              "visit": {"hierarchyLevel": "0", "probability": "0.95", "topCandidate": {"placeID": "ChIJhome", "semanticType": "Home", "probability": "0.9",
                "placeLocation": "geo:48.2,16.37"}}}]
            """
        #expect(try visits(iPhone) == [TrackReader.Visit(
            start: date("2024-03-02T18:00:00Z"), end: date("2024-03-03T07:00:00Z"), lat: 48.2, lon: 16.37, placeID: "ChIJhome", semanticType: "Home",
            location: "timeline[0].visit")])
        let backwards = #"{"timelineObjects": [{"placeVisit": {"location": {"latitudeE7": 482000000, "longitudeE7": 163000000}, "duration": {"startTimestamp": "2019-05-01T12:00:00Z", "endTimestamp": "2019-05-01T11:00:00Z"}}}]}"#
        // Passed on as it is: ingest refuses it and the import counts it, without stopping the file.
        #expect(try visits(backwards).map(\.end) == [date("2019-05-01T11:00:00Z")])
    }

    @Test func ownTracksRecorderLines() throws {
        let rec = """
            2023-01-05T07:40:12Z\t*                 \t{"_type":"location","tid":"jj","lat":48.5,"lon":16.5,"tst":1672904412,"acc":10,"vel":36,"cog":90,"alt":200,"batt":80}
            2023-01-05T07:40:30Z\t*                 \t{"_type":"lwt","tst":1672904430}
            2023-01-05T07:41:00Z\towntracks/jj/phone\t{"_type":"location","lat":48.51,"lon":16.51,"tst":1672904460}

            """
        #expect(TrackFormat(sniffing: Array(rec.utf8)) == .ownTracksRecorder)
        let read = try points(rec)
        #expect(read.count == 2)
        #expect(read[0].lat == 48.5 && read[0].time == Date(timeIntervalSince1970: 1_672_904_412))
        // OwnTracks' vel is km/h.
        #expect(read[0].speedMps == 10 && read[0].courseDeg == 90 && read[0].accuracyM == 10 && read[0].elevationM == 200)
        #expect(read[1].location == "line 3")
        #expect(TrackFormat(fileName: "2023-01.rec") == .ownTracksRecorder)
    }

    @Test func badHistoriesNameThePlace() {
        #expect(error(#"{"locations": [{"latitudeE7": 481234567, "longitudeE7": 163456789}, {"latitudeE7": "x", "longitudeE7": 1}]}"#)?.description
            == "locations[1]: latitudeE7 is not a number")
        #expect(error(#"{"locations": [{"latitudeE7": 1800000000, "longitudeE7": 1}]}"#)?.description
            == "locations[0]: latitudeE7 1800000000.0 is not a latitude")
        #expect(error(#"{"locations": [{"latitudeE7": 1, "longitudeE7": 1, "timestamp": "yesterday"}]}"#)?.location == "locations[0]")
        #expect(error(#"{"semanticSegments": [{"timelinePath": [{"point": "north", "time": "2024-01-01T00:00:00Z"}]}]}"#)?.location
            == "semanticSegments[0].timelinePath[0]")
        // Truncated in the middle of an element: named.
        let cut = String(Self.records.prefix(300))
        #expect(error(cut)?.message == "the file ends inside the JSON (truncated?)")
        #expect(error(cut)?.location == "locations[1]")
        #expect(error("2023-01-05T07:40:12Z\t*\t{\"_type\":\"location\",\"lat\":1}\n")?.description == "line 1: a location needs lat and lon")
        // A GeoJSON document is still GeoJSON.
        #expect(TrackFormat(sniffing: Array(#"{"type": "FeatureCollection", "features": []}"#.utf8)) == .geoJSON)
    }
}
