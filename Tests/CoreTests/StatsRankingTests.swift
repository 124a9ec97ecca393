import DrivebusGeo
import DrivebusSchema
import DrivebusTestSupport
import Foundation
import Hummingbird
import HummingbirdTesting
import StatsCore
import StatsStore
import StatsHTTP
import Testing
#if canImport(FoundationXML)
import FoundationXML
#endif

/// A route heading east from Vienna with a point every `step` metres and the given elevations.
func issue9Route(_ name: String, step: Double = 100, _ elevations: [Double?], origin: Coordinate = Coordinate(lat: 48.2, lon: 16.3)) -> RouteInput {
    let projection = LocalProjection(origin: origin)
    return RouteInput(name: name, points: elevations.enumerated().map { index, elevation in
        .init(projection.unproject(x: Double(index) * step, y: 0), elevationM: elevation)
    })
}

/// Wiggles of up to 4 m around 200 m: less than the 5 m hysteresis, so no climb at all.
let issue9Flat = issue9Route("flat", (0...20).map { $0 == 0 ? 200 : $0 % 2 == 1 ? 203 : 199 })
/// Up 60 m over 1 km at 6 %, and down again.
let issue9Hill = issue9Route("hill", (0...20).map { 200 + 6 * Double(min($0, 20 - $0)) })
/// Up 100 m over 500 m at 20 %, then level.
let issue9Steep = issue9Route("steep", (0...10).map { 200 + 20 * Double(min($0, 5)) })

func issue9GPX(_ routes: [(kind: String, route: RouteInput)]) -> String {
    var text = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<gpx version=\"1.1\" creator=\"test\" xmlns=\"http://www.topografix.com/GPX/1/1\">\n"
    text += "<wpt lat=\"48.1\" lon=\"16.1\"><ele>999</ele><name>not a route</name></wpt>\n"
    for (kind, route) in routes {
        let point = kind == "trk" ? "trkpt" : "rtept"
        text += "<\(kind)><name>\(route.name)</name>" + (kind == "trk" ? "<trkseg>" : "") + "\n"
        for (index, p) in route.points.enumerated() {
            // A track's second segment is joined to the first.
            if kind == "trk", index == route.points.count / 2 { text += "</trkseg><trkseg>\n" }
            text += "<\(point) lat=\"\(p.coordinate.lat)\" lon=\"\(p.coordinate.lon)\">" + (p.elevationM.map { "<ele>\($0)</ele>" } ?? "") + "<name>p\(index)</name></\(point)>\n"
        }
        text += (kind == "trk" ? "</trkseg>" : "") + "</\(kind)>\n"
    }
    return text + "</gpx>\n"
}

func issue9GeoJSON(_ routes: [RouteInput]) -> String {
    let features: [[String: Any]] = routes.map { route in
        [
            "type": "Feature", "properties": ["name": route.name],
            "geometry": ["type": "LineString", "coordinates": route.points.map { p -> [Any] in
                [p.coordinate.lon, p.coordinate.lat] + (p.elevationM.map { [$0] } ?? [])
            }],
        ]
    }
    return String(decoding: statsJSON(["type": "FeatureCollection", "features": features] as [String: Any]), as: UTF8.self)
}

/// Elements and their attributes, read with a real XML parser.
final class Issue9XML: NSObject, XMLParserDelegate {
    var elements: [(name: String, attributes: [String: String])] = []
    var text = ""

    static func parse(_ text: String) -> Issue9XML? {
        let reader = Issue9XML()
        let parser = XMLParser(data: Data(text.utf8))
        parser.delegate = reader
        return parser.parse() ? reader : nil
    }

    func parser(_ parser: XMLParser, didStartElement name: String, namespaceURI: String?, qualifiedName: String?, attributes: [String: String] = [:]) {
        elements.append((name, attributes))
    }

    func parser(_ parser: XMLParser, foundCharacters string: String) { text += string }

    func named(_ name: String) -> [[String: String]] { elements.filter { $0.name == name }.map(\.attributes) }
}

@Suite struct StatsRankingTests {
    let ranking = RouteRanking()

    @Test func routesWithKnownClimbsRankFlattestFirst() throws {
        let ranked = try ranking.rank([issue9Steep, issue9Flat, issue9Hill])
        #expect(ranked.map(\.name) == ["flat", "hill", "steep"])
        #expect(ranked.map(\.rank) == [1, 2, 3])
        #expect(ranked.map(\.index) == [1, 2, 0])
        #expect(ranked.map { RouteRanking.tenthForTests($0.ascentM) } == [0, 60, 100])
        #expect(ranked.map { RouteRanking.tenthForTests($0.descentM) } == [0, 60, 0])
        #expect(ranked.map { RouteRanking.tenthForTests($0.maxGradePct) } == [4, 6, 20])
        #expect(ranked.map { ($0.distanceM / 10).rounded() * 10 } == [2000, 2000, 1000])
        #expect(ranked.first!.rankColor == "#1a9850" && ranked.last!.rankColor == "#d73027")
        // Four routes: exactly green, yellow, orange, red.
        let four = try ranking.rank([issue9Steep, issue9Flat, issue9Hill, issue9Route("gentle", step: 400, [200, 210, 220])])
        #expect(four.map(\.name) == ["flat", "gentle", "hill", "steep"])
        #expect(four.map(\.rankColor) == ["#1a9850", "#e6be14", "#f2821e", "#d73027"])
    }

    @Test func equalClimbsGoByTheSteepestStretch() throws {
        // Both climb 10 m; the shorter one does it at 10 %, the longer at 2.5 %.
        let short = issue9Route("short and steep", [0, 10, 10])
        let long = issue9Route("long and gentle", step: 400, [0, 10])
        let ranked = try ranking.rank([short, long])
        #expect(ranked.map(\.name) == ["long and gentle", "short and steep"])
        #expect(ranked.map { RouteRanking.tenthForTests($0.maxGradePct) } == [2.5, 10])
    }

    @Test func densifiedSoNoTwoPointsAreMoreThan40mApart() throws {
        let long = issue9Route("one long segment", step: 10_000, [200, 300])
        let ranked = try ranking.rank([issue9Hill, long])
        for route in ranked {
            let gaps = zip(route.points, route.points.dropFirst()).map { Geo.distance($0, $1) }
            #expect(gaps.max()! <= 40, "\(route.name)")
            #expect(route.points.count == route.elevationsM.count && route.points.count == route.distancesM.count)
        }
        let hill = ranked.first { $0.name == "hill" }!
        // Every 100 m segment in three pieces of 33.3 m; the posted points are kept.
        #expect(hill.points.count == 61)
        #expect(hill.points[3] == issue9Hill.points[1].coordinate)
        #expect(abs(hill.elevationsM[1] - 202) < 1e-9)
        let segment = ranked.first { $0.name == "one long segment" }!
        #expect(segment.points.count == 252)
        #expect(abs(segment.distancesM.last! - Geo.distance(long.points[0].coordinate, long.points[1].coordinate)) < 1e-6)
        // 100 m over 10 km: 1 %, whatever window.
        #expect(RouteRanking.tenthForTests(segment.maxGradePct) == 1)

        // Across the antimeridian too: a great circle, not a trip round the world.
        let dateLine = RouteInput(name: "date line", points: [
            .init(Coordinate(lat: -17, lon: 179.999), elevationM: 0), .init(Coordinate(lat: -17, lon: -179.999), elevationM: 0),
        ])
        let crossed = try ranking.rank([dateLine])[0]
        #expect(crossed.distanceM < 250 && zip(crossed.points, crossed.points.dropFirst()).allSatisfy { Geo.distance($0, $1) <= 40 })
    }

    @Test func ascentAgreesWithTheTripsCounter() throws {
        // A noisy climb, as a barometer or GPS would record it at 1 Hz.
        var elevations: [Double] = []
        var state: UInt64 = 42
        for index in 0..<600 {
            state = state &* 6364136223846793005 &+ 1442695040888963407
            let noise = Double(state >> 40) / Double(1 << 24) * 6 - 3
            elevations.append(300 + 40 * sin(Double(index) / 60) + noise)
        }
        let route = issue9Route("noisy", step: 15, elevations)
        var counter = AscentCounter(hysteresisM: 5)
        for elevation in elevations { counter.add(elevation) }
        let ranked = try ranking.rank([route])[0]
        #expect(ranked.ascentM == counter.ascentM && ranked.descentM == counter.descentM)
        // The hysteresis is the configured one: a smaller one counts more of the wiggles.
        var fine = AscentCounter(hysteresisM: 1)
        for elevation in elevations { fine.add(elevation) }
        let finer = try RouteRanking(ascentHysteresisM: 1).rank([route])[0]
        #expect(finer.ascentM == fine.ascentM && finer.ascentM > ranked.ascentM)
        // Points without elevation are skipped by the counter, as in trips, and interpolated in the profile.
        let gaps = issue9Route("gaps", [200, nil, 212, nil, nil, 200])
        let measured = try ranking.rank([gaps])[0]
        #expect(measured.ascentM == 12 && measured.descentM == 12)
        #expect(abs(measured.elevationsM[3] - 206) < 1e-9 && abs(measured.elevationsM[9] - 208) < 1e-9)
    }

    @Test func gpxAndGeoJSONAreRead() throws {
        let gpx = issue9GPX([("trk", issue9Hill), ("rte", issue9Flat), ("trk", issue9Steep)])
        let fromGPX = try RouteRanking.read(Array(gpx.utf8))
        #expect(fromGPX.map(\.name) == ["hill", "flat", "steep"])
        #expect(fromGPX.map(\.points.count) == [21, 21, 11])
        #expect(fromGPX[0].points[10].elevationM == 260)
        let fromGeoJSON = try RouteRanking.read(Array(issue9GeoJSON([issue9Hill, issue9Flat]).utf8))
        #expect(fromGeoJSON.map(\.name) == ["hill", "flat"])
        #expect(fromGeoJSON[0].points == issue9Hill.points)
        // Unnamed routes are numbered.
        let unnamed = try RouteRanking.read(Array(#"{"type":"LineString","coordinates":[[16.3,48.2,200],[16.31,48.2,210]]}"#.utf8))
        #expect(unnamed.map(\.name) == ["route 1"])
        // GeoJSON is parsed whole: a body of it is taken up to 4 MiB, a GPX body is not held to that.
        let position = "[16.3,48.2,200],"
        let count = (RouteRanking.maxGeoJSONBytes - 64) / position.utf8.count
        let atLimit = #"{"type":"LineString","coordinates":["# + String(repeating: position, count: count) + "[16.31,48.2,210]]}"
        #expect(atLimit.utf8.count <= RouteRanking.maxGeoJSONBytes)
        #expect(try RouteRanking.read(Array(atLimit.utf8)).map(\.points.count) == [count + 1])
        let over = #"{"type":"LineString","coordinates":["# + String(repeating: position, count: count + 8) + "[16.31,48.2,210]]}"
        let refused = #expect(throws: StatsError.self) { try RouteRanking.read(Array(over.utf8)) }
        #expect(refused?.message.contains("GeoJSON over 4194304 bytes") == true)
    }

    @Test func theHTTPRouteRanksRefusesAndDraws() async throws {
        let scratch = StatsScratch()
        let store = try StatsStore(.init(path: scratch.database))
        let app = Application(router: makeStatsRouter(store: store))
        let gpx = issue9GPX([("trk", issue9Steep), ("rte", issue9Flat), ("trk", issue9Hill)])
        try await app.test(.router) { client in
            try await client.execute(uri: "/api/v1/routes/rank", method: .post, headers: [.contentType: "application/gpx+xml"], body: ByteBuffer(string: gpx)) { response in
                #expect(response.status == .ok)
                let json = statsParse(String(buffer: response.body))
                #expect(json.stats("count")?.statsNumber == 3)
                #expect(json.stats("routes")?.statsArray.compactMap { $0.stats("name")?.statsString } == ["flat", "hill", "steep"])
                #expect(json.stats("routes", 1, "ascent_m")?.statsNumber == 60)
                #expect(json.stats("routes", 1, "descent_m")?.statsNumber == 60)
                #expect(json.stats("routes", 1, "max_grade_pct")?.statsNumber == 6)
                #expect(json.stats("routes", 2, "rank_color")?.statsString == "#d73027")
                #expect(json.stats("routes", 1, "profile", 3)?.statsArray.compactMap(\.statsNumber) == [100, 206])
                // The densified route as written (7 decimals) keeps the spacing.
                let coordinates = json.stats("routes", 1, "coordinates")?.statsArray.map { $0.statsArray.compactMap(\.statsNumber) } ?? []
                #expect(coordinates.count == 61)
                let points = coordinates.map { Coordinate(lat: $0[1], lon: $0[0]) }
                #expect(zip(points, points.dropFirst()).allSatisfy { Geo.distance($0, $1) <= 40 })
            }
            try await client.execute(uri: "/api/v1/routes/rank?format=svg&width=800&height=400", method: .post, body: ByteBuffer(string: issue9GeoJSON([issue9Steep, issue9Flat, issue9Hill]))) { response in
                #expect(response.status == .ok && response.headers[.contentType] == "image/svg+xml")
                let svg = try #require(Issue9XML.parse(String(buffer: response.body)))
                let lines = svg.named("polyline")
                #expect(lines.count == 3)
                // Drawn steepest first so the flattest is on top, each in its rank colour.
                #expect(lines.map { $0["data-route"] } == ["steep", "hill", "flat"])
                #expect(lines.map { $0["stroke"] } == ["#d73027", "#eca019", "#1a9850"])
                #expect(svg.text.contains("distance (m)") && svg.text.contains("elevation (m)"))
                #expect(svg.named("svg").first?["width"] == "800")
            }
            // The real Vienna drive has no elevation: 422 naming it.
            let vienna = try String(contentsOf: URL(fileURLWithPath: #filePath).deletingLastPathComponent().appendingPathComponent("../Fixtures/car_vienna_osm_1hz.gpx").standardized, encoding: .utf8)
            try await client.execute(uri: "/api/v1/routes/rank", method: .post, body: ByteBuffer(string: vienna)) { response in
                #expect(response.status == .unprocessableContent)
                let json = statsParse(String(buffer: response.body))
                #expect(json.stats("error", "code")?.statsString == "stats.no_elevation")
                #expect(json.stats("error", "route")?.statsString == "03_Nov._2021_1749_edt.gpx")
            }
            let mixed = issue9GPX([("trk", issue9Hill), ("trk", issue9Route("no height", [nil, nil, nil]))])
            try await client.execute(uri: "/api/v1/routes/rank", method: .post, body: ByteBuffer(string: mixed)) { response in
                #expect(response.status == .unprocessableContent)
                let json = statsParse(String(buffer: response.body))
                #expect(json.stats("error", "route")?.statsString == "no height")
                #expect(json.stats("error", "message")?.statsString?.contains("\"no height\"") == true)
            }
            let refusals: [(String, String, HTTPResponse.Status, String)] = [
                ("", "", .badRequest, "stats.invalid_body"),
                ("", "hello", .badRequest, "stats.invalid_body"),
                ("", "<gpx><trk><trkseg><trkpt lat=\"91\" lon=\"0\"><ele>1</ele></trkpt>", .badRequest, "stats.invalid_body"),
                ("", "<gpx><trk><trkseg><trkpt lat=\"1\" lon=\"0\"><ele>high</ele></trkpt></trkseg></trk></gpx>", .badRequest, "stats.invalid_body"),
                ("", "<gpx><wpt lat=\"1\" lon=\"2\"/></gpx>", .unprocessableContent, "stats.no_routes"),
                ("", #"{"type":"FeatureCollection","features":[{"type":"Feature","geometry":{"type":"LineString","coordinates":[[16.3,48.2,1]]}}]}"#, .unprocessableContent, "stats.invalid_route"),
                ("", #"{"type":"FeatureCollection","features":[{"type":"Feature","geometry":{"type":"LineString","coordinates":[[16.3,"x"]]}}]}"#, .badRequest, "stats.invalid_body"),
                ("?format=png", issue9GPX([("trk", issue9Hill)]), .badRequest, "stats.invalid_parameter"),
                ("?format=svg&width=1", issue9GPX([("trk", issue9Hill)]), .badRequest, "stats.invalid_parameter"),
            ]
            for (query, body, status, code) in refusals {
                try await client.execute(uri: "/api/v1/routes/rank" + query, method: .post, body: ByteBuffer(string: body)) { response in
                    #expect(response.status == status, "\(query) \(body.prefix(60))")
                    #expect(statsParse(String(buffer: response.body)).stats("error", "code")?.statsString == code, "\(query) \(body.prefix(60))")
                }
            }
        }
        let small = Application(router: makeStatsRouter(store: store, configuration: .init(maxBodyBytes: 2048)))
        try await small.test(.router) { client in
            try await client.execute(uri: "/api/v1/routes/rank", method: .post, body: ByteBuffer(string: issue9GPX([("trk", issue9Hill), ("trk", issue9Flat)]))) { response in
                #expect(response.status == .contentTooLarge)
                #expect(statsParse(String(buffer: response.body)).stats("error", "code")?.statsString == "stats.too_large")
            }
        }
    }
}

extension RouteRanking {
    /// As the JSON writes it: to 0.1.
    static func tenthForTests(_ value: Double) -> Double { (value * 10).rounded() / 10 }
}
