import DrivebusGeo
import DrivebusSchema
import DrivebusTestbed
import DrivebusTestSupport
import DrivebusTrackFormats
import Foundation
import IngestCore
import StatsCore
import Testing

/// The events a reader gives for `bytes`, or its error.
private func events(_ format: TrackFormat, _ bytes: [UInt8], limits: TrackLimits = TrackLimits()) -> Result<[TrackReader.Event], TrackFormatError> {
    let reader = TrackReader(format: format, bytes: bytes, limits: limits)
    var out: [TrackReader.Event] = []
    do {
        while let event = try reader.next() { out.append(event) }
        return .success(out)
    } catch {
        return .failure(error)
    }
}

private func events(_ format: TrackFormat, _ text: String) -> Result<[TrackReader.Event], TrackFormatError> {
    events(format, Array(text.utf8))
}

/// The error reading `bytes` gives; fails the test if there is none.
private func failure(_ format: TrackFormat, _ bytes: [UInt8], limits: TrackLimits = TrackLimits(), sourceLocation: SourceLocation = #_sourceLocation) -> TrackFormatError? {
    switch events(format, bytes, limits: limits) {
    case .success(let events):
        Issue.record("read \(events.count) events, expected an error", sourceLocation: sourceLocation)
        return nil
    case .failure(let error):
        return error
    }
}

private func failure(_ format: TrackFormat, _ text: String, sourceLocation: SourceLocation = #_sourceLocation) -> TrackFormatError? {
    failure(format, Array(text.utf8), sourceLocation: sourceLocation)
}

extension Result {
    var failure: Failure? {
        if case .failure(let error) = self { error } else { nil }
    }
}

/// One byte at a time: every boundary a file read can have.
private func byteByByte(_ format: TrackFormat, _ bytes: [UInt8]) -> Result<[TrackReader.Event], TrackFormatError> {
    var offset = 0
    let source = ChunkByteSource { () throws(ByteSourceError) -> [UInt8]? in
        guard offset < bytes.count else { return nil }
        offset += 1
        return [bytes[offset - 1]]
    }
    let reader = TrackReader(format: format, source: source)
    var out: [TrackReader.Event] = []
    do {
        while let event = try reader.next() { out.append(event) }
        return .success(out)
    } catch {
        return .failure(error)
    }
}

/// A GPX whose element name (`ele`) or attribute name holds the bytes 0xFF 0xFE, on line 4.
func invalidUTF8GPX(in place: String) -> [UInt8] {
    var bytes = Array("<?xml version=\"1.0\"?>\n<gpx version=\"1.1\" xmlns=\"http://www.topografix.com/GPX/1/1\">\n<trk><name>bad</name><trkseg>\n".utf8)
    if place == "element" {
        bytes += Array("<trkpt lat=\"48.2\" lon=\"16.3\"><e".utf8) + [0xFF, 0xFE] + Array("le>200</e".utf8) + [0xFF, 0xFE] + Array("le></trkpt>".utf8)
    } else {
        bytes += Array("<trkpt lat=\"48.2\" lon=\"16.3\" x".utf8) + [0xFF, 0xFE] + Array("=\"1\"><ele>200</ele></trkpt>".utf8)
    }
    return bytes + Array("\n<trkpt lat=\"48.21\" lon=\"16.3\"><ele>210</ele></trkpt>\n</trkseg></trk></gpx>\n".utf8)
}

@Suite struct TrackFormatTests {
    // MARK: GPX

    @Test func gpx11TracksRoutesAndExtensionsWithExactValues() throws {
        let gpx = """
            <?xml version="1.0" encoding="UTF-8"?>
            <gpx version="1.1" creator="test" xmlns="http://www.topografix.com/GPX/1/1" xmlns:gpxtpx="http://www.garmin.com/xmlschemas/TrackPointExtension/v2">
            <wpt lat="1" lon="1"><ele>5</ele><name>a waypoint, not a track</name></wpt>
            <trk><name>  Morning ride  </name><trkseg>
            <trkpt lat="48.2" lon="16.3"><ele>200.5</ele><time>2024-05-01T10:00:00Z</time><name>not the track's</name></trkpt>
            </trkseg><trkseg>
            <trkpt lat=" -33.5 " lon="151.25"><time>2024-05-01T10:00:01.250+02:00</time><extensions><gpxtpx:TrackPointExtension><gpxtpx:speed>4.5</gpxtpx:speed><gpxtpx:course>270</gpxtpx:course></gpxtpx:TrackPointExtension></extensions></trkpt>
            </trkseg></trk>
            <rte><rtept lat="0" lon="0"/><rtept lat="1e1" lon="-1.5E1"><ele/></rtept></rte>
            <trk><trkseg><trkpt lat="90" lon="-180"><time>2024-05-01T10:00:02</time></trkpt></trkseg></trk>
            </gpx>
            """
        let read = try events(.gpx, gpx).get()
        #expect(read == [
            .point(.init(time: date("2024-05-01T10:00:00Z"), lat: 48.2, lon: 16.3, elevationM: 200.5, location: "trkpt 1 (line 5)", track: 0)),
            .point(.init(time: date("2024-05-01T08:00:01.250Z"), lat: -33.5, lon: 151.25, speedMps: 4.5, courseDeg: 270, location: "trkpt 2 (line 7)", track: 0)),
            .track(.init(index: 0, kind: .gpxTrack, name: "Morning ride", pointCount: 2)),
            .point(.init(lat: 0, lon: 0, location: "rtept 1 (line 9)", track: 1)),
            .point(.init(lat: 10, lon: -15, location: "rtept 2 (line 9)", track: 1)),
            .track(.init(index: 1, kind: .gpxRoute, name: nil, pointCount: 2)),
            .point(.init(time: date("2024-05-01T10:00:02Z"), lat: 90, lon: -180, location: "trkpt 3 (line 10)", track: 2)),
            .track(.init(index: 2, kind: .gpxTrack, name: nil, pointCount: 1)),
        ])
        // The same, a byte at a time.
        #expect(try byteByByte(.gpx, Array(gpx.utf8)).get() == read)
    }

    @Test func gpxPointsOutsideATrackBelongToNone() throws {
        let read = try events(.gpx, #"<gpx><trkpt lat="1" lon="2"/></gpx>"#).get()
        #expect(read == [.point(.init(lat: 1, lon: 2, location: "trkpt 1 (line 1)", track: nil))])
    }

    @Test func invalidUTF8InElementAndAttributeNamesIsAnErrorNamingTheLine() throws {
        for place in ["element", "attribute"] {
            let bytes = invalidUTF8GPX(in: place)
            let error = try #require(failure(.gpx, bytes), "\(place)")
            #expect(error.location == "line 4", "\(place): \(error)")
            #expect(error.message.hasPrefix("not valid GPX: "), "\(place): \(error)")
            #expect(error.message.contains("UTF-8"), "\(place): \(error)")
            // Read in pieces, the same error.
            let pieces = try #require(byteByByte(.gpx, bytes).failure)
            #expect(pieces.location == error.location && pieces.message == error.message, "\(place): \(pieces)")

            // The import reader (drivebus import).
            #expect(throws: TrackFileError(location: "line 4", message: error.message)) { try TrackFiles.gpx(Data(bytes)) }
            #expect(throws: TrackFileError(location: "line 4", message: error.message)) { try TrackFiles.read(Data(bytes), name: "bad.gpx") }

            // The route ranking reader (POST /api/v1/routes/rank): a 400 naming the line.
            do {
                _ = try RouteRanking.read(bytes)
                Issue.record("\(place): read")
            } catch {
                #expect(error.status == 400 && error.code == "stats.invalid_body" && error.field == "body")
                #expect(error.message == "body: line 4: " + (failure(.gpx, bytes)?.message ?? ""), "\(error.message)")
            }
        }
        // Text that is not UTF-8 is refused the same way.
        let text = Array("<gpx><trk><name>a".utf8) + [0xC3, 0x28] + Array("</name></trk></gpx>".utf8)
        #expect(failure(.gpx, text)?.message.contains("UTF-8") == true)
    }

    @Test func gpxPointErrorsNameThePoint() throws {
        // The second point of the track "hills", on line 2.
        let cases: [(point: String, message: String)] = [
            (#"<trkpt lat="north" lon="2"/>"#, #"lat "north" is not a number"#),
            (#"<trkpt lat="NaN" lon="2"/>"#, #"lat "NaN" is not a number"#),
            (#"<trkpt lat="1" lon="inf"/>"#, #"lon "inf" is not a number"#),
            (#"<trkpt lat="1e999" lon="2"/>"#, #"lat "1e999" is not a number"#),
            (#"<trkpt lat="0x10" lon="2"/>"#, #"lat "0x10" is not a number"#),
            (#"<trkpt lat="1e308" lon="2"/>"#, "lat must be from -90 to 90, got 1e+308"),
            (#"<trkpt lat="91" lon="2"/>"#, "lat must be from -90 to 90, got 91"),
            (#"<trkpt lat="1" lon="-180.5"/>"#, "lon must be from -180 to 180, got -180.5"),
            (#"<trkpt lon="2"/>"#, "lat and lon attributes are required"),
            (#"<trkpt lat="1" lon="2"><ele>high</ele></trkpt>"#, #"ele "high" is not a number"#),
            (#"<trkpt lat="1" lon="2"><ele>nan</ele></trkpt>"#, #"ele "nan" is not a number"#),
            (#"<trkpt lat="1" lon="2"><ele>1e300</ele></trkpt>"#, "ele must be from -100000 to 100000 m, got 1e+300"),
            (#"<trkpt lat="1" lon="2"><speed>Infinity</speed></trkpt>"#, #"speed "Infinity" is not a number"#),
            (#"<trkpt lat="1" lon="2"><time>yesterday</time></trkpt>"#, #"time "yesterday" is not ISO 8601"#),
            ("<trkpt lat=\"1\" lon=\"2\"><ele>\(String(repeating: "1", count: 2000))</ele></trkpt>", "ele is longer than 1024 bytes"),
        ]
        for (point, message) in cases {
            let gpx = "<gpx><trk><name>hills</name><trkseg><trkpt lat=\"1\" lon=\"1\"/>\n" + point + "</trkseg></trk></gpx>"
            #expect(failure(.gpx, gpx) == TrackFormatError(location: "trkpt 2 (line 2)", message: message, track: 0, trackName: "hills", point: 2), "\(point)")
            // Import: the location and message as they are printed.
            #expect(throws: TrackFileError(location: "trkpt 2 (line 2)", message: message)) { try TrackFiles.gpx(Data(gpx.utf8)) }
            // Route ranking: route and point named.
            #expect(throws: StatsError(status: 400, code: "stats.invalid_body", message: "route \"hills\" point 2: \(message)", field: "body", details: ["route": .string("hills"), "point": .number(2)])) {
                try RouteRanking.read(Array(gpx.utf8))
            }
        }
        // A point inside a point: the inner one is named.
        let nested = "<gpx><trk><trkseg><trkpt lat=\"1\" lon=\"2\">\n<trkpt lat=\"1\" lon=\"2\"/></trkpt></trkseg></trk></gpx>"
        #expect(failure(.gpx, nested) == TrackFormatError(location: "trkpt 2 (line 2)", message: "a point inside a point", track: 0, point: 1))
    }

    @Test func hostileXMLIsAnErrorNotACrashOrAnExpansion() throws {
        // Truncated anywhere: an error, never a crash.
        let gpx = #"<?xml version="1.0"?><gpx><trk><name>x</name><trkseg><trkpt lat="1" lon="2"><ele>3</ele><time>2024-01-01T00:00:00Z</time></trkpt></trkseg></trk></gpx>"#
        let bytes = Array(gpx.utf8)
        for length in 0..<bytes.count {
            guard case .failure(let error) = events(.gpx, Array(bytes[..<length])) else {
                Issue.record("\(length) bytes read without an error")
                continue
            }
            #expect(error.location == "line 1" || error.location == "line 0", "\(length): \(error)")
        }
        #expect(throws: TrackFileError.self) { try TrackFiles.gpx(Data("<gpx><trk><trkpt lat='x'".utf8)) }

        // 10,000 levels deep.
        let deep = "<gpx>\n" + String(repeating: "<a>", count: 10_000) + String(repeating: "</a>", count: 10_000) + "</gpx>"
        #expect(failure(.gpx, deep) == TrackFormatError(location: "line 2", message: "not valid GPX: elements nested deeper than 100"))

        // A billion laughs: refused at the DOCTYPE, nothing expanded.
        var lol = "<?xml version=\"1.0\"?>\n<!DOCTYPE gpx [\n<!ENTITY lol \"lol\">\n"
        for level in 1...9 { lol += "<!ENTITY lol\(level) \"" + String(repeating: "&lol\(level == 1 ? "" : String(level - 1));", count: 10) + "\">\n" }
        lol += "]>\n<gpx><trk><name>&lol9;</name></trk></gpx>\n"
        let started = ContinuousClock.now
        let laughs = try #require(failure(.gpx, lol))
        #expect(laughs.message.hasPrefix("not valid GPX: "), "\(laughs)")
        #expect(ContinuousClock.now - started < .seconds(5))

        // An external entity: not read.
        let xxe = "<?xml version=\"1.0\"?>\n<!DOCTYPE gpx [<!ENTITY x SYSTEM \"file:///etc/passwd\">]>\n<gpx><trk><name>&x;</name><trkseg><trkpt lat=\"1\" lon=\"2\"/></trkseg></trk></gpx>"
        let external = try #require(failure(.gpx, xxe))
        // (libxml2 keeps no line for a DOCTYPE: the line is where its parser had got to.)
        #expect(external.message == "not valid GPX: a DOCTYPE is not allowed" && external.location.hasPrefix("line "), "\(external)")
        // Undeclared entities and garbage are errors too.
        #expect(failure(.gpx, "<gpx><trk><name>&nope;</name></trk></gpx>")?.location == "line 1")
        #expect(failure(.gpx, "")?.message.hasPrefix("not valid GPX: ") == true)
        #expect(failure(.gpx, [0xFF, 0xFE, 0xFD])?.message.hasPrefix("not valid GPX: ") == true)
        #expect(failure(.gpx, "<gpx><trk></rte></gpx>")?.location == "line 1")
        #expect(failure(.gpx, "<gpx><trk><trk></trk></trk></gpx>") == TrackFormatError(location: "line 1", message: "a trk inside a trk", track: 0))
        // The predefined entities and character references are fine.
        let named = try events(.gpx, "<gpx><trk><name>A &amp; B &#x263A;</name></trk></gpx>").get()
        #expect(named == [.track(.init(index: 0, kind: .gpxTrack, name: "A & B ☺", pointCount: 0))])
    }

    // MARK: GeoJSON

    @Test func geoJSONPointsLinesAndMultiLinesWithExactValues() throws {
        let geojson = """
            {"type":"FeatureCollection","features":[
              {"type":"Feature","geometry":{"type":"Point","coordinates":[16.1,48.1,200]},"properties":{"timestamp":1714557600000,"speed":3}},
              {"type":"Feature","geometry":{"type":"LineString","coordinates":[[16.2,48.2],[16.3,48.3,null]]},"properties":{"name":"a line","coordTimes":["2024-05-01T10:00:01Z",1714557602]}},
              {"type":"Feature","geometry":{"type":"MultiLineString","coordinates":[[[1,2,3]],[[4,5],[6,7,8]]]},"properties":{"title":"two parts","coordTimes":[["2024-05-01 10:00:03"],[null,"2024-05-01T10:00:05Z"]]}},
              {"type":"Feature","geometry":{"type":"Polygon","coordinates":[]}},
              {"type":"Feature","geometry":null}
            ]}
            """
        let read = try events(.geoJSON, geojson).get()
        #expect(read == [
            .point(.init(time: date("2024-05-01T10:00:00Z"), lat: 48.1, lon: 16.1, elevationM: 200, speedMps: 3, location: "features[0]")),
            .point(.init(time: date("2024-05-01T10:00:01Z"), lat: 48.2, lon: 16.2, location: "features[1].coordinates[0]", track: 0)),
            .point(.init(time: date("2024-05-01T10:00:02Z"), lat: 48.3, lon: 16.3, location: "features[1].coordinates[1]", track: 0)),
            .track(.init(index: 0, kind: .line, name: "a line", pointCount: 2)),
            .point(.init(time: date("2024-05-01T10:00:03Z"), lat: 2, lon: 1, elevationM: 3, location: "features[2].coordinates[0][0]", track: 1)),
            .point(.init(lat: 5, lon: 4, location: "features[2].coordinates[1][0]", track: 1)),
            .point(.init(time: date("2024-05-01T10:00:05Z"), lat: 7, lon: 6, elevationM: 8, location: "features[2].coordinates[1][1]", track: 1)),
            .track(.init(index: 1, kind: .line, name: "two parts", pointCount: 3)),
        ])
        // A bare geometry and a single Feature.
        #expect(try events(.geoJSON, #"{"type":"LineString","coordinates":[[1,2]]}"#).get() == [
            .point(.init(lat: 2, lon: 1, location: "geometry.coordinates[0]", track: 0)), .track(.init(index: 0, kind: .line, name: nil, pointCount: 1)),
        ])
        #expect(try events(.geoJSON, #"{"type":"Feature","geometry":{"type":"Point","coordinates":[1,2]},"properties":null}"#).get() == [
            .point(.init(lat: 2, lon: 1, location: "feature")),
        ])
    }

    @Test func geoJSONWrongTypesAndNumbersAreErrors() throws {
        func feature(_ geometry: String, _ properties: String = "{}") -> String {
            #"{"type":"FeatureCollection","features":[{"type":"Feature","geometry":{"type":"Point","coordinates":[1,2]}},{"type":"Feature","geometry":\#(geometry),"properties":\#(properties)}]}"#
        }
        let cases: [(String, TrackFormatError)] = [
            ("[]", TrackFormatError(location: "", message: "expected a GeoJSON object")),
            ("{", TrackFormatError(location: "", message: #"not valid JSON: expected ""#)),
            (#"{"type":"Topology"}"#, TrackFormatError(location: "", message: "expected a GeoJSON FeatureCollection, Feature or geometry")),
            (#"{"type":"FeatureCollection","features":{}}"#, TrackFormatError(location: "features", message: "a FeatureCollection needs a features array")),
            (#"{"type":"FeatureCollection","features":[1]}"#, TrackFormatError(location: "features[0]", message: "expected a Feature object")),
            (feature(#""a line""#), TrackFormatError(location: "features[1]", message: "geometry must be an object or null")),
            (feature(#"{"type":"Point","coordinates":[1,2]}"#, "[]"), TrackFormatError(location: "features[1]", message: "properties must be an object or null")),
            (feature(#"{"coordinates":[1,2]}"#), TrackFormatError(location: "features[1].geometry", message: "needs a type")),
            (feature(#"{"type":"Point","coordinates":"1,2"}"#), TrackFormatError(location: "features[1]", message: "a position must be [longitude, latitude, elevation?]")),
            (feature(#"{"type":"Point","coordinates":[1,"2"]}"#), TrackFormatError(location: "features[1]", message: "a position must be [longitude, latitude, elevation?]")),
            (feature(#"{"type":"Point","coordinates":[1,1e999]}"#), TrackFormatError(location: "", message: "not valid JSON: coordinates: invalid number 1e999")),
            (feature(#"{"type":"Point","coordinates":[1,NaN]}"#), TrackFormatError(location: "", message: "not valid JSON: coordinates: expected a number")),
            (feature(#"{"type":"Point","coordinates":[1e300,2]}"#), TrackFormatError(location: "features[1]", message: "longitude must be from -180 to 180, got 1e+300")),
            (feature(#"{"type":"Point","coordinates":[1,2,1e300]}"#), TrackFormatError(location: "features[1]", message: "elevation must be from -100000 to 100000 m, got 1e+300")),
            (feature(#"{"type":"Point","coordinates":[1,2,"high"]}"#), TrackFormatError(location: "features[1]", message: "elevation must be a number of metres")),
            (feature(#"{"type":"Point","coordinates":[1,2]}"#, #"{"time":true}"#), TrackFormatError(location: "features[1]", message: "time must be RFC 3339 text or epoch seconds")),
            (feature(#"{"type":"Point","coordinates":[1,2]}"#, #"{"time":"soon"}"#), TrackFormatError(location: "features[1]", message: #"time: expected epoch seconds or milliseconds, ISO 8601, or yyyy-MM-dd HH:mm:ss, got "soon""#)),
            (feature(#"{"type":"Point","coordinates":[1,2]}"#, #"{"time":1e20}"#), TrackFormatError(location: "features[1]", message: "time 1e+20 is out of range")),
            (feature(#"{"type":"Point","coordinates":[1,2]}"#, #"{"speed":"fast"}"#), TrackFormatError(location: "features[1]", message: "speed must be a number")),
            (feature(#"{"type":"LineString","coordinates":{}}"#), TrackFormatError(location: "features[1].coordinates", message: "must be an array")),
            (feature(#"{"type":"MultiLineString","coordinates":[[[1,2]],3]}"#), TrackFormatError(location: "features[1].coordinates[1]", message: "must be an array of positions")),
            (feature(#"{"type":"LineString","coordinates":[[1,2]]}"#, #"{"coordTimes":"now"}"#), TrackFormatError(location: "features[1]", message: "coordTimes must be an array")),
            (
                feature(#"{"type":"LineString","coordinates":[[1,2],[1,95]]}"#, #"{"name":"north"}"#),
                TrackFormatError(location: "features[1].coordinates[1]", message: "latitude must be from -90 to 90, got 95", track: 0, trackName: "north", point: 2)
            ),
            (
                feature(#"{"type":"LineString","coordinates":[[1,2]]}"#, #"{"coordTimes":[{}]}"#),
                TrackFormatError(location: "features[1].coordinates[0]", message: "time must be RFC 3339 text or epoch seconds", track: 0, point: 1)
            ),
        ]
        for (text, expected) in cases {
            #expect(failure(.geoJSON, text) == expected, "\(text)")
        }
        // Nesting beyond what JSONValue allows.
        let deep = String(repeating: "[", count: 10_000) + String(repeating: "]", count: 10_000)
        #expect(failure(.geoJSON, #"{"type":"Feature","geometry":"# + deep + "}") == TrackFormatError(location: "", message: "not valid JSON: geometry: nested too deeply"))
        // Over the size limit.
        #expect(failure(.geoJSON, Array(repeating: UInt8(ascii: " "), count: 2000) + Array("{}".utf8), limits: TrackLimits(maxGeoJSONBytes: 1000))?.message.hasPrefix("GeoJSON over 1000 bytes") == true)

        // The route ranking reader names the route and point.
        #expect(throws: StatsError(status: 400, code: "stats.invalid_body", message: "route \"north\" point 2: latitude must be from -90 to 90, got 95", field: "body", details: ["route": .string("north"), "point": .number(2)])) {
            try RouteRanking.read(Array(feature(#"{"type":"LineString","coordinates":[[1,2],[1,95]]}"#, #"{"name":"north"}"#).utf8))
        }
    }

    // MARK: CSV

    @Test func csvColumnsQuotesLineBreaksAndExactValues() throws {
        let csv = "\u{FEFF}Time,\"Lat\" , lon,ele,speed,course,note\r\n"
            + "2024-05-01T10:00:00Z,48.5,16.25,200,3.5,90,\"a, quoted \"\"note\"\"\"\r\n"
            + "\r\n"
            + "  \t \n"
            + "1714557601,\" -1.5 \",2,,,,\r"
            + "1714557602500,3,4\n"
            + ",5,6"
        let expected: [TrackReader.Event] = [
            .point(.init(time: date("2024-05-01T10:00:00Z"), lat: 48.5, lon: 16.25, elevationM: 200, speedMps: 3.5, courseDeg: 90, location: "line 2")),
            .point(.init(time: date("2024-05-01T10:00:01Z"), lat: -1.5, lon: 2, location: "line 5")),
            .point(.init(time: date("2024-05-01T10:00:02.500Z"), lat: 3, lon: 4, location: "line 6")),
            .point(.init(lat: 5, lon: 6, location: "line 7")),
        ]
        #expect(try events(.csv, csv).get() == expected)
        #expect(try byteByByte(.csv, Array(csv.utf8)).get() == expected)
    }

    @Test func csvErrorsNameTheLine() throws {
        let header = "time,lat,lon,ele\n2024-01-01T00:00:00Z,1,2,3\n"
        let cases: [(String, TrackFormatError)] = [
            ("when,where\n1,2\n", TrackFormatError(location: "line 1", message: "the header needs timestamp (or time), latitude (or lat) and longitude (or lon)")),
            ("\n\nwhen,where\n", TrackFormatError(location: "line 3", message: "the header needs timestamp (or time), latitude (or lat) and longitude (or lon)")),
            (header + "2024-01-01T00:00:01Z,north,2\n", TrackFormatError(location: "line 3", message: #"lat "north" is not a number"#)),
            (header + "2024-01-01T00:00:01Z,nan,2\n", TrackFormatError(location: "line 3", message: #"lat "nan" is not a number"#)),
            (header + "2024-01-01T00:00:01Z,1,1e999\n", TrackFormatError(location: "line 3", message: #"lon "1e999" is not a number"#)),
            (header + "2024-01-01T00:00:01Z,1,1e300\n", TrackFormatError(location: "line 3", message: "lon must be from -180 to 180, got 1e+300")),
            (header + "2024-01-01T00:00:01Z,1,2,-1e6\n", TrackFormatError(location: "line 3", message: "ele must be from -100000 to 100000 m, got -1000000")),
            (header + "2024-01-01T00:00:01Z,,2\n", TrackFormatError(location: "line 3", message: "latitude and longitude are required")),
            (header + "tomorrow,1,2\n", TrackFormatError(location: "line 3", message: #"time: expected epoch seconds or milliseconds, ISO 8601, or yyyy-MM-dd HH:mm:ss, got "tomorrow""#)),
            (header + "99999999999999999,1,2\n", TrackFormatError(location: "line 3", message: "time: time 99999999999999999 is out of range")),
            (header + "2024-01-01T00:00:01Z,\(String(repeating: "9", count: 500)),2\n", TrackFormatError(location: "line 3", message: "lat \"\(String(repeating: "9", count: 64))…\" is not a number")),
        ]
        for (text, expected) in cases {
            #expect(failure(.csv, text) == expected, "\(text.prefix(80))")
            #expect(throws: TrackFileError(location: expected.location, message: expected.message)) { try TrackFiles.csv(text) }
        }
        // Bytes that are not UTF-8 in a value: an error, not a crash.
        let bytes = Array(header.utf8) + Array("2024-01-01T00:00:01Z,".utf8) + [0xFF, 0xFE] + Array(",2\n".utf8)
        #expect(failure(.csv, bytes) == TrackFormatError(location: "line 3", message: "lat \"\u{FFFD}\u{FFFD}\" is not a number"))
        // A line too long to hold.
        let long = "time,lat,lon\n" + String(repeating: "x", count: 5000)
        #expect(failure(.csv, Array(long.utf8), limits: TrackLimits(maxLineBytes: 1000)) == TrackFormatError(location: "line 2", message: "longer than 1000 bytes"))
    }

    // MARK: Streaming

    @Test func aFileIsReadInPiecesNotWhole() async throws {
        try await offThePool {
            let dir = TempDir()
            var gpx = "<?xml version=\"1.0\"?>\n<gpx version=\"1.1\"><trk><name>long</name><trkseg>\n"
            for index in 0..<100_000 {
                gpx += "<trkpt lat=\"\(48 + Double(index % 1000) / 1e4)\" lon=\"16.3\"><time>2024-05-01T10:00:00Z</time></trkpt>\n"
            }
            gpx += "</trkseg></trk></gpx>\n"
            let path = dir.file("long.gpx", gpx)
            let csvPath = dir.file("long.csv", "time,lat,lon\n" + String(repeating: "2024-05-01T10:00:00Z,48.1,16.3\n", count: 100_000))
            for (path, format) in [(path, TrackFormat.gpx), (csvPath, .csv)] {
                let source = try FileByteSource(path: path)
                let size = try #require(source.size)
                #expect(size > 2_000_000)
                let reader = TrackReader(format: format, source: source)
                _ = try #require(try reader.nextPoint())
                // One point read: the reader has taken only its first pieces of the file.
                #expect(reader.bytesRead < 200_000, "\(format)")
                var count = 1
                var last: TrackReader.Point?
                while let point = try reader.nextPoint() {
                    count += 1
                    last = point
                }
                #expect(count == 100_000)
                // Line numbers past 65,535 (where libxml2 keeps them apart) are right too.
                #expect(last?.location == (format == .gpx ? "trkpt 100000 (line 100002)" : "line 100001"))
                #expect(reader.bytesRead == size)
            }
            // The import reader's streaming form.
            let imported = TrackFiles.Reader(format: .gpx, source: try FileByteSource(path: path))
            let first = try #require(try imported.next())
            #expect(first == TrackPoint(time: date("2024-05-01T10:00:00Z"), lat: 48, lon: 16.3, location: "trkpt 1 (line 3)"))
            #expect(throws: ByteSourceError.self) { try FileByteSource(path: dir.path + "/missing.gpx") }
        }
    }

    // MARK: Never a crash

    /// Seeded mutations of valid files (bit flips, bytes that are not UTF-8, truncation, huge
    /// numbers, deep nesting): each reads or throws a `TrackFormatError`, and the process lives.
    @Test func mutatedFilesReadOrThrow() async throws {
        try await offThePool {
            func lines(_ name: String) -> [Substring] { String(decoding: (try? fixture(name)) ?? Data(), as: UTF8.self).split(whereSeparator: \.isNewline) }
            let samples: [(TrackFormat, [UInt8])] = [
                (.gpx, Array((lines("car_vienna_osm_1hz.gpx").prefix(30) + ["</trkseg></trk></gpx>"]).joined(separator: "\n").utf8)),
                (.csv, Array(lines("bus_liverpool_route14.csv").prefix(40).joined(separator: "\n").utf8)),
                (.geoJSON, Array(#"{"type":"FeatureCollection","features":[{"type":"Feature","geometry":{"type":"LineString","coordinates":[[16.2,48.2,1],[16.3,48.3,2]]},"properties":{"name":"x","coordTimes":["2024-05-01T10:00:01Z",1714557602]}},{"type":"Feature","geometry":{"type":"Point","coordinates":[1,2]},"properties":{"time":"2024-05-01T10:00:00Z"}}]}"#.utf8)),
            ]
            let insertions: [[UInt8]] = [[0xFF, 0xFE], [0xC3], [0x00], Array("1e999".utf8), Array("NaN".utf8), Array("<a>".utf8), Array("&lol;".utf8), Array("\"".utf8), Array("[[[[".utf8), Array("-".utf8)]
            var generator = SplitMix64(seed: 14)
            var outcomes = (read: 0, refused: 0)
            for (format, sample) in samples {
                #expect(throws: Never.self) { try TrackReader(format: format, bytes: sample).readAll() }
                for _ in 0..<400 {
                    var bytes = sample
                    switch generator.next() % 4 {
                    case 0:
                        for _ in 0..<(1 + generator.next() % 4) {
                            let index = Int(generator.next() % UInt64(bytes.count))
                            bytes[index] ^= UInt8(1 << (generator.next() % 8))
                        }
                    case 1:
                        bytes = Array(bytes.prefix(Int(generator.next() % UInt64(bytes.count))))
                    default:
                        let index = Int(generator.next() % UInt64(bytes.count + 1))
                        bytes.insert(contentsOf: insertions[Int(generator.next() % UInt64(insertions.count))], at: index)
                    }
                    switch events(format, bytes) {
                    case .success: outcomes.read += 1
                    case .failure: outcomes.refused += 1
                    }
                    _ = try? RouteRanking.read(bytes)
                }
            }
            #expect(outcomes.read + outcomes.refused == 1200 && outcomes.refused > 200)
        }
    }

    @Test func formatsByNameAndFirstByte() {
        #expect(TrackFormat(fileName: "a/b/Drive.GPX") == .gpx)
        #expect(TrackFormat(fileName: "x.geojson") == .geoJSON && TrackFormat(fileName: "x.json") == .geoJSON)
        #expect(TrackFormat(fileName: "x.csv") == .csv)
        #expect(TrackFormat(fileName: "x.kml") == nil && TrackFormat(fileName: "gpx") == nil && TrackFormat(fileName: "a.gpx/b") == nil)
        #expect(TrackFormat(sniffing: Array("\u{FEFF} \n<gpx/>".utf8)) == .gpx)
        #expect(TrackFormat(sniffing: Array("\t{}".utf8)) == .geoJSON)
        #expect(TrackFormat(sniffing: Array("time,lat".utf8)) == nil && TrackFormat(sniffing: []) == nil)
        #expect(throws: TrackFileError(location: "x.kml", message: "unknown format: use GPX, GeoJSON, CSV, Google location history or OwnTracks Recorder (.rec) files")) { try TrackFiles.read(Data(), name: "x.kml") }
    }
}
