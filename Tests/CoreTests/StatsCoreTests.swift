import DrivebusGeo
import DrivebusSchema
import DrivebusTestSupport
import Foundation
import GRDB
import StatsCore
import StatsStore
import Testing
#if canImport(FoundationXML)
import FoundationXML
#endif

// MARK: Helpers (prefixed `stats`: other test files define their own)

/// A scratch directory for one store, removed at the end.
final class StatsScratch: @unchecked Sendable {
    let path: String
    init() {
        path = NSTemporaryDirectory() + "/drivebus-stats-" + UUID().uuidString
        try? FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
    }
    var database: String { path + "/data/drivebus.sqlite" }
    deinit { try? FileManager.default.removeItem(atPath: path) }
}

func statsTime(_ text: String) -> Date { RFC3339.parse(text)! }

func statsEvent(_ type: String, id: String? = nil, device: String? = "car", time: Date = Date(timeIntervalSince1970: 1_700_000_000), _ payload: [UInt8]) -> StoredEvent {
    StoredEvent(id: id ?? UUID().uuidString.lowercased(), type: type, device: device, source: "test", time: time, payload: payload)
}

func statsJSON(_ value: Any) -> [UInt8] {
    Array(try! JSONSerialization.data(withJSONObject: value, options: [.sortedKeys]))
}

func statsFixEvent(_ fix: Fix) -> StoredEvent {
    statsEvent("fix", id: "fix-\(fix.device)-\(fix.seq ?? 0)", device: fix.device, time: fix.time, try! BusJSON.encode(fix))
}

/// The real drive: 1,525 fixes at 1 Hz through Vienna, read with a small scan of the GPX.
let statsVienna: [Fix] = {
    let url = URL(fileURLWithPath: #filePath).deletingLastPathComponent().appendingPathComponent("../Fixtures/car_vienna_osm_1hz.gpx").standardized
    let text = try! String(contentsOf: url, encoding: .utf8)
    var fixes: [Fix] = []
    for piece in text.components(separatedBy: "<trkpt ").dropFirst() {
        func attribute(_ name: String) -> Double {
            let start = piece.range(of: name + "=\"")!.upperBound
            return Double(piece[start..<piece[start...].firstIndex(of: "\"")!])!
        }
        let time = piece.range(of: "<time>")!.upperBound
        let end = piece.range(of: "</time>")!.lowerBound
        fixes.append(Fix(
            seq: UInt64(fixes.count + 1), device: "car", time: RFC3339.parse(piece[time..<end])!,
            lat: attribute("lat"), lon: attribute("lon"), source: .import))
    }
    return fixes
}()

/// The drive in export order: by time, then position (the fixture has a few repeated seconds).
let statsViennaSorted: [Fix] = statsVienna.sorted { ($0.time, $0.lat, $0.lon) < ($1.time, $1.lat, $1.lon) }

/// A hand-made `trip.ended` for a run of fixes, as the trips service would publish it.
func statsTripEnded(_ fixes: [Fix], id: String) -> [UInt8] {
    let points = fixes.map { Coordinate(lat: $0.lat, lon: $0.lon) }
    let distance = zip(points, points.dropFirst()).reduce(0) { $0 + Geo.distance($1.0, $1.1) }
    let duration = fixes.last!.time.timeIntervalSince(fixes.first!.time)
    return statsJSON([
        "trip_id": id, "device": fixes[0].device,
        "start_time": RFC3339.format(fixes.first!.time), "end_time": RFC3339.format(fixes.last!.time),
        "duration_s": duration, "distance_m": distance, "max_speed_mps": 20.5, "avg_speed_mps": distance / duration,
        "ascent_m": 12, "descent_m": 9,
        "start": ["lat": points.first!.lat, "lon": points.first!.lon], "end": ["lat": points.last!.lat, "lon": points.last!.lon],
        "fix_count": fixes.count, "first_seq": fixes.first!.seq!, "last_seq": fixes.last!.seq!,
        "track": DouglasPeucker.simplified(points, epsilonM: 5).map { [$0.lat, $0.lon] },
    ] as [String: Any])
}

func statsViennaStore(_ scratch: StatsScratch, homes: [String: Zone] = [:]) throws -> StatsStore {
    let store = try StatsStore(.init(path: scratch.database, homes: homes))
    try statsStoreSync(store, statsVienna.map(statsFixEvent) + [statsEvent("trip.ended", id: "trip-vienna", statsTripEnded(statsVienna, id: "car-1"))])
    return store
}

func statsExport(_ store: StatsStore, _ export: StatsExport, _ query: StatsQuery = StatsQuery()) throws -> (text: String, chunks: Int) {
    var bytes: [UInt8] = []
    var chunks = 0
    try store.export(export, query, chunkBytes: 4096) { chunk in
        bytes += chunk
        chunks += 1
    }
    return (String(decoding: bytes, as: UTF8.self), chunks)
}

/// Track points from a GPX document, read with a real XML parser.
final class StatsGPXReader: NSObject, XMLParserDelegate {
    struct Point: Equatable { var lat: String; var lon: String; var time: String?; var ele: String? }
    var points: [Point] = []
    var tracks = 0
    var segments = 0
    private var text = ""

    static func parse(_ text: String) -> StatsGPXReader? {
        let reader = StatsGPXReader()
        let parser = XMLParser(data: Data(text.utf8))
        parser.delegate = reader
        return parser.parse() ? reader : nil
    }

    func parser(_ parser: XMLParser, didStartElement name: String, namespaceURI: String?, qualifiedName: String?, attributes: [String: String] = [:]) {
        text = ""
        switch name {
        case "trkpt": points.append(Point(lat: attributes["lat"] ?? "", lon: attributes["lon"] ?? ""))
        case "trk": tracks += 1
        case "trkseg": segments += 1
        default: break
        }
    }

    func parser(_ parser: XMLParser, foundCharacters string: String) { text += string }

    func parser(_ parser: XMLParser, didEndElement name: String, namespaceURI: String?, qualifiedName: String?) {
        if name == "time", !points.isEmpty { points[points.count - 1].time = text }
        if name == "ele", !points.isEmpty { points[points.count - 1].ele = text }
    }
}

/// Parsed JSON, or `null` (and a recorded issue) when it is not JSON.
func statsParse(_ text: String) -> JSONValue {
    do {
        return try JSONValue.parse(Array(text.utf8))
    } catch {
        Issue.record("not JSON: \(error): \(text.prefix(200))")
        return .null
    }
}

/// The blocking `store`, which async code cannot call directly (it gets the async one).
@discardableResult
func statsStoreSync(_ store: StatsStore, _ batch: [StoredEvent]) throws -> StatsStore.Summary { try store.store(batch) }

/// A step into parsed JSON: a key or an index.
enum StatsPath: ExpressibleByStringLiteral, ExpressibleByIntegerLiteral {
    case key(String), index(Int)
    init(stringLiteral value: String) { self = .key(value) }
    init(integerLiteral value: Int) { self = .index(value) }
}

extension JSONValue {
    /// `json.stats("days", 0, "date")`: nil when any step is missing.
    func stats(_ path: StatsPath...) -> JSONValue? {
        var value: JSONValue? = self
        for step in path {
            switch (step, value) {
            case (.key(let key), .object(let object)?): value = object[key]
            case (.index(let index), .array(let array)?) where array.indices.contains(index): value = array[index]
            default: return nil
            }
        }
        return value
    }
    var statsArray: [JSONValue] { if case .array(let array) = self { return array } else { return [] } }
    var statsNumber: Double? { if case .number(let value) = self { return value } else { return nil } }
    var statsString: String? { if case .string(let value) = self { return value } else { return nil } }
}

// MARK: Tests

@Suite struct StatsCoreTests {
    @Test func storingTheSameEventsTwiceChangesNothing() async throws {
        let scratch = StatsScratch()
        let store = try StatsStore(.init(path: scratch.database))
        let fixes = Array(statsVienna.prefix(300))
        let batch: [StoredEvent] = fixes.map(statsFixEvent) + [
            statsEvent("trip.ended", id: "e-trip", statsTripEnded(fixes, id: "car-1")),
            statsEvent("drive.scored", id: "e-score", statsJSON([
                "trip_id": "car-1", "device": "car", "start_time": RFC3339.format(fixes[0].time), "score": 87.5, "distance_m": 2000,
                "events": [["type": "harsh_braking", "time": RFC3339.format(fixes[100].time)]], "counts": ["harsh_braking": 1],
                "events_per_100km": 50, "speed_variation": 0.2, "session": ["id": "s1", "candidate": "anna"],
            ] as [String: Any])),
            statsEvent("session.started", id: "e-s1", statsJSON(["session_id": "s1", "device": "car", "candidate": "anna", "instructor": "Eva", "time": RFC3339.format(fixes[0].time)])),
            statsEvent("session.stopped", id: "e-s1-stop", statsJSON(["session_id": "s1", "device": "car", "time": RFC3339.format(fixes[299].time)])),
            statsEvent("geofence.enter", id: "e-g1", statsJSON(["device": "car", "zone": "home", "event": "enter", "time": RFC3339.format(fixes[5].time), "lat": 48.1, "lon": 16.6, "seq": 6])),
            statsEvent("gate.fired", id: "e-gate", statsJSON(["gate": "garage", "device": "car", "zone": "home", "seq": 6, "idempotency_key": "garage:6", "status": 200, "latency_ms": 120, "attempts": 1, "time": RFC3339.format(fixes[6].time)])),
            statsEvent("taxi.checkout", id: "e-co", statsJSON(["device": "car", "checkin_time": RFC3339.format(fixes[0].time), "checkout_time": RFC3339.format(fixes[299].time), "reason": "walking", "confidence": "high", "ride_s": 299])),
            statsEvent("something.new", id: "e-new", statsJSON(["x": 1])),
            statsEvent("svc.heartbeat", id: "e-hb", statsJSON(["service": "trips"])),
        ]
        let first = try await store.store(batch)
        #expect(first.inserted == batch.count - 1 && first.duplicates == 0 && first.skipped == 1 && first.unprojected == 0)
        let counts = try await store.counts()
        // A fix is a row of `fixes` only; every other event keeps its row in `events`.
        #expect(counts["events"] == batch.count - 1 - 300)
        #expect(counts["fixes"] == 300 && counts["trips"] == 1 && counts["scores"] == 1 && counts["sessions"] == 1)
        #expect(counts["geofence_transitions"] == 1 && counts["gate_calls"] == 1 && counts["checkouts"] == 1)

        let second = try statsStoreSync(store, batch)
        #expect(second.inserted == 0 && second.duplicates == batch.count - 1)
        #expect(try await store.counts() == counts)

        // The same fix again under another event id (a re-import) is still one fix.
        var again = statsFixEvent(fixes[0])
        again.id = "reimported"
        try await store.store([again])
        #expect(try await store.counts()["fixes"] == 300)
    }

    @Test func badPayloadsAreKeptButNotProjected() async throws {
        let scratch = StatsScratch()
        let store = try StatsStore(.init(path: scratch.database))
        let summary = try await store.store([
            statsEvent("fix", Array("{\"lat\": 91, \"lon\": 0, \"device\": \"car\", \"time\": \"2025-01-01T00:00:00Z\"}".utf8)),
            statsEvent("fix", Array("not json".utf8)),
            statsEvent("trip.ended", statsJSON(["device": "car"])),
            statsEvent("drive.scored", Array("[1,2]".utf8)),
        ])
        #expect(summary.inserted == 4 && summary.unprojected == 4 && summary.problems.count == 4)
        let counts = try await store.counts()
        #expect(counts["events"] == 4 && counts["fixes"] == 0 && counts["trips"] == 0 && counts["scores"] == 0)
        // A fix's row keeps its payload when the fix could not be stored, to show what came.
        let payloads = try await store.eventPayloads()
        #expect(payloads.contains("not json") && payloads.contains { $0.contains("\"lat\": 91") })
    }

    @Test func theViennaDriveIsListedWithItsSummary() async throws {
        let scratch = StatsScratch()
        let store = try statsViennaStore(scratch)
        let trips = try await store.trips(StatsQuery(device: "car"))
        #expect(trips.count == 1)
        let trip = try #require(trips.first)
        #expect(trip.tripID == "car-1" && trip.start == statsVienna.first!.time && trip.end == statsVienna.last!.time)
        #expect(trip.fixCount == 1525 && abs((trip.distanceM ?? 0) - 22_300) < 500 && trip.durationS == 1735)
        #expect(trip.track == nil && trip.score == nil)
        #expect(try await store.trips(StatsQuery(device: "bike")).isEmpty)
        #expect(try await store.trips(StatsQuery(from: statsTime("2021-11-04T00:00:00Z"))).isEmpty)

        let one = try await store.trip(id: "car-1")
        #expect((one.track?.count ?? 0) > 10)
        let json = statsParse(String(decoding: try await store.tripJSON(id: "car-1"), as: UTF8.self))
        #expect(json.stats("trip_id")?.statsString == "car-1" && json.stats("track")?.statsArray.count == one.track?.count)
        #expect(json.stats("start_time")?.statsString == "2021-11-03T16:19:50.000Z")
        await #expect(throws: StatsError.self) { try await store.trip(id: "nope") }
    }

    @Test func gpxExportRoundTripsEveryPoint() throws {
        let scratch = StatsScratch()
        let store = try statsViennaStore(scratch)
        let (text, chunks) = try statsExport(store, .fixes(.gpx), StatsQuery(device: "car"))
        #expect(chunks > 10)  // written in pieces, not built whole
        let gpx = try #require(StatsGPXReader.parse(text))
        #expect(gpx.tracks == 1 && gpx.segments == 1)
        #expect(gpx.points.count == statsVienna.count)
        for (point, fix) in zip(gpx.points, statsViennaSorted) {
            #expect(Double(point.lat) == fix.lat && Double(point.lon) == fix.lon)
            #expect(point.time.flatMap { RFC3339.parse($0) } == fix.time)
        }
        #expect(text.hasPrefix("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<gpx version=\"1.1\""))

        let trips = try #require(StatsGPXReader.parse(try statsExport(store, .trips(.gpx)).text))
        #expect(trips.tracks == 1 && trips.points.count == statsVienna.count)
    }

    @Test func csvAndGeoJSONExportsRoundTripEveryPoint() throws {
        let scratch = StatsScratch()
        let home = Zone(id: "home", shape: .circle(center: Coordinate(lat: statsVienna[0].lat, lon: statsVienna[0].lon), radiusM: 100))
        let store = try statsViennaStore(scratch, homes: ["car": home])

        let csv = try statsExport(store, .fixes(.csv), StatsQuery(device: "car")).text
        var lines = csv.split(separator: "\n", omittingEmptySubsequences: false)
        #expect(lines.removeFirst() == "time,lat,lon,accuracy_m,altitude_m,speed_mps,course_deg,is_home,distance_from_home_m")
        #expect(lines.removeLast() == "")
        #expect(lines.count == statsVienna.count)
        for (line, fix) in zip(lines, statsViennaSorted) {
            let cells = line.split(separator: ",", omittingEmptySubsequences: false)
            #expect(cells.count == 9)
            #expect(RFC3339.parse(cells[0]) == fix.time && Double(cells[1]) == fix.lat && Double(cells[2]) == fix.lon)
            let distance = Geo.distance(Coordinate(lat: fix.lat, lon: fix.lon), home.circle.center)
            #expect(cells[7] == (distance <= 100 ? "true" : "false"))
            #expect(abs(Double(cells[8])! - distance) <= 0.05)
        }
        #expect(lines[0].hasSuffix(",,,,,true,0"))

        let geojson = statsParse(try statsExport(store, .fixes(.geojson), StatsQuery(device: "car")).text)
        #expect(geojson.stats("type")?.statsString == "FeatureCollection")
        let features = geojson.stats("features")?.statsArray ?? []
        #expect(features.count == statsVienna.count)
        for (feature, fix) in zip(features, statsViennaSorted) {
            #expect(feature.stats("geometry", "coordinates") == .array([.number(fix.lon), .number(fix.lat)]))
            #expect(feature.stats("properties", "time")?.statsString.flatMap { RFC3339.parse($0) } == fix.time)
        }
        let trips = statsParse(try statsExport(store, .trips(.geojson)).text)
        #expect(trips.stats("features", 0, "geometry", "coordinates")?.statsArray.count == statsVienna.count)
        #expect(trips.stats("features", 0, "properties", "trip_id")?.statsString == "car-1")
    }

    @Test func csvNeedsADeviceWhenThereAreSeveral() async throws {
        let scratch = StatsScratch()
        let store = try statsViennaStore(scratch)
        try await store.validate(.fixes(.csv), StatsQuery())
        var bike = statsVienna[0]
        bike.device = "bike"
        try await store.store([statsFixEvent(bike)])
        await #expect(throws: StatsError.invalid("device", "is required for CSV when fixes of several devices are stored (bike, car)")) {
            try await store.validate(.fixes(.csv), StatsQuery())
        }
        try await store.validate(.fixes(.csv), StatsQuery(device: "bike"))
        // GPX carries one track per device.
        let gpx = try #require(StatsGPXReader.parse(try statsExport(store, .fixes(.gpx)).text))
        #expect(gpx.tracks == 2 && gpx.points.count == statsVienna.count + 1)
    }

    @Test func dailyAndMonthlyStatsMatchTheTrip() async throws {
        let scratch = StatsScratch()
        let store = try statsViennaStore(scratch)
        let trip = try #require(try await store.trips(StatsQuery()).first)
        let days = try await store.periods(.day, StatsQuery(device: "car"))
        #expect(days == [PeriodStats(period: "2021-11-03", distanceM: trip.distanceM!, drives: 1, drivingS: 1735, fixes: 1525, awayFromHomeS: nil)])
        let months = try await store.periods(.month, StatsQuery())
        #expect(months == [PeriodStats(period: "2021-11", distanceM: trip.distanceM!, drives: 1, drivingS: 1735, fixes: 1525, awayFromHomeS: nil)])
        #expect(try await store.periods(.day, StatsQuery(from: statsTime("2021-11-04T00:00:00Z"))).isEmpty)

        let json = statsParse(String(decoding: try await store.periodsJSON(.day, StatsQuery()), as: UTF8.self))
        #expect(json.stats("days", 0, "date")?.statsString == "2021-11-03" && json.stats("days", 0, "fixes")?.statsNumber == 1525)
        #expect(json.stats("days", 0, "away_from_home_s") == .null)
        let monthly = statsParse(String(decoding: try await store.periodsJSON(.month, StatsQuery()), as: UTF8.self))
        #expect(monthly.stats("months", 0, "month")?.statsString == "2021-11")
    }

    /// A day that leaves home at 08:00 and is back at 17:30, with two hours of silence at noon.
    @Test func timeAwayFromHome() async throws {
        let scratch = StatsScratch()
        let center = Coordinate(lat: 48.2, lon: 16.37)
        let projection = LocalProjection(origin: center)
        let work = projection.unproject(x: 3000, y: 1500)
        var fixes: [Fix] = []
        func add(_ time: String, _ at: Coordinate) {
            fixes.append(Fix(seq: UInt64(fixes.count + 1), device: "van", time: statsTime(time), lat: at.lat, lon: at.lon, accuracyM: 10, source: .api))
        }
        for minute in stride(from: 6 * 60, to: 8 * 60, by: 5) { add(String(format: "2025-03-10T%02d:%02d:00Z", minute / 60, minute % 60), projection.unproject(x: 20, y: -30)) }
        for minute in stride(from: 8 * 60, to: 17 * 60 + 30, by: 1) where minute < 12 * 60 || minute >= 14 * 60 {
            add(String(format: "2025-03-10T%02d:%02d:00Z", minute / 60, minute % 60), work)
        }
        for minute in stride(from: 17 * 60 + 30, through: 19 * 60, by: 10) { add(String(format: "2025-03-10T%02d:%02d:00Z", minute / 60, minute % 60), center) }
        // An evening out across midnight: 23:30 to 00:30.
        for minute in stride(from: 23 * 60 + 30, to: 24 * 60, by: 10) { add(String(format: "2025-03-10T%02d:%02d:00Z", minute / 60, minute % 60), work) }
        for minute in stride(from: 0, to: 30, by: 10) { add(String(format: "2025-03-11T00:%02d:00Z", minute), work) }
        add("2025-03-11T00:30:00Z", center)

        let home = Zone(id: "home", shape: .circle(center: center, radiusM: 150))
        let store = try StatsStore(.init(path: scratch.database, homes: ["van": home]))
        try await store.store(fixes.map(statsFixEvent))

        // 08:00–11:59 and 14:00–17:30: the silence from 11:59 to 14:00 is longer than max_gap_s.
        let days = try await store.periods(.day, StatsQuery(device: "van"))
        #expect(days.map(\.period) == ["2025-03-10", "2025-03-11"])
        let expected: [Double?] = [4 * 3600 - 60 + 3.5 * 3600 + 1800, 1800]
        #expect(days.map(\.awayFromHomeS) == expected)
        #expect(days.map(\.fixes) == [fixes.count - 4, 4])
        // From 09:00, the first hour is outside the range.
        let later = try await store.periods(.day, StatsQuery(device: "van", from: statsTime("2025-03-10T09:00:00Z"), to: statsTime("2025-03-11T00:00:00Z")))
        let fromNine: Double = 3 * 3600 - 60 + 3.5 * 3600 + 1800
        #expect(later.map(\.awayFromHomeS) == [fromNine])
        let month = try await store.periods(.month, StatsQuery(device: "van"))
        let wholeMonth: Double = 4 * 3600 - 60 + 3.5 * 3600 + 3600
        #expect(month.map(\.awayFromHomeS) == [wholeMonth])

        // With a longer max_gap_s the silence counts: the whole 9.5 hours.
        let lenient = try StatsStore(.init(path: scratch.database, homes: ["van": home], maxGapS: 3 * 3600))
        let whole = try await lenient.periods(.day, StatsQuery(device: "van", to: statsTime("2025-03-10T20:00:00Z")))
        let allDay: Double = 9.5 * 3600
        #expect(whole.map(\.awayFromHomeS) == [allDay])

        let csv = try statsExport(store, .fixes(.csv), StatsQuery(device: "van", from: statsTime("2025-03-10T08:00:00Z"), to: statsTime("2025-03-10T08:00:01Z"))).text
        #expect(csv.split(separator: "\n")[1].hasPrefix("2025-03-10T08:00:00.000Z,") && csv.contains(",10,,,,false,3353.7\n"))
    }

    /// A purge empties the journal rows that still hold a position in the range: a motion
    /// sample's, a fix's from before fixes' rows were stored empty, a rejected fix's. Rows that
    /// hold none, another device's, and a payload that is not JSON (no time to find it by) stay;
    /// neither the purge nor the expiry sweep fails on that one.
    @Test func aPurgeEmptiesTheJournalRowsThatStillHoldAPosition() async throws {
        let scratch = StatsScratch()
        let store = try StatsStore(.init(path: scratch.database))
        let day = statsTime("2025-03-10T00:00:00Z")
        func row(_ seq: Int, _ type: String, device: String = "car", _ payload: [UInt8], fix: Fix? = nil) -> StoredEvent {
            StoredEvent(id: "journal:\(seq)", type: type, device: device, source: "ingest", time: day.addingTimeInterval(Double(seq)), payload: payload, fix: fix)
        }
        let fixes = (1...3).map { Fix(seq: UInt64($0), device: "car", time: day.addingTimeInterval(Double($0)), lat: 48.2, lon: 16.37, accuracyM: 5, source: .api) }
        let motion = statsJSON(["device": "car", "time": RFC3339.format(day.addingTimeInterval(4)), "activity": "walking"])
        let offEarth = Array(#"{"device":"car","time":"2025-03-10T00:00:05Z","lat":91,"lon":0}"#.utf8)
        let bikeMotion = statsJSON(["device": "bike", "time": RFC3339.format(day.addingTimeInterval(6)), "activity": "cycling"])
        try await store.store(fixes.map { row(Int($0.seq!), "fix", BusJSON.encode($0), fix: $0) } + [
            row(4, "motion", motion), row(5, "fix", offEarth), row(6, "motion", device: "bike", bikeMotion), row(7, "fix", Array("not json".utf8)),
        ])
        // The fixes stored keep no row in `events`; those that could not be stored keep theirs whole.
        #expect(try await store.eventPayloads() == [String(decoding: motion, as: UTF8.self), String(decoding: offEarth, as: UTF8.self),
                                                     String(decoding: bikeMotion, as: UTF8.self), "not json"])
        // The first fix's row as stats stored it before 2026-11-27, and the second's as until 2026-11-28.
        let legacy = try DatabaseQueue(path: scratch.database)
        try await legacy.write { [fixes] db in
            for (fix, payload) in [(fixes[0], Data(BusJSON.encode(fixes[0]))), (fixes[1], Data("{}".utf8))] {
                try db.execute(
                    sql: "INSERT INTO events (id, type, device, source, time_ms, payload) VALUES (?, 'fix', 'car', 'ingest', ?, ?)",
                    arguments: ["journal:\(fix.seq!)", Int64(fix.time.timeIntervalSince1970 * 1000), payload])
            }
        }
        try legacy.close()

        let purged = try await store.purge(device: "car", from: day, to: day.addingTimeInterval(86_399))
        #expect(purged.first { $0.table == "events" }?.rows == 3)
        #expect(purged.first { $0.table == "fixes" }?.rows == 3)
        #expect(try await store.eventPayloads() == ["{}", "{}", "{}", "{}", String(decoding: bikeMotion, as: UTF8.self), "not json"])
        #expect(try await store.emptyExpiredJournalFixRows(before: statsTime("2026-01-01T00:00:00Z")) == 0)
    }

    /// A replay from derivations saved behind the data writes cursors lower than the stored one
    /// (with what it derived, or the state alone): the cursor stays where it stands, so a crash
    /// during the replay cannot make the next start store again what was purged meanwhile. The
    /// derivations' own seq is the state's, whatever it was.
    @Test func aCursorNeverGoesBack() async throws {
        let scratch = StatsScratch()
        let store = try StatsStore(.init(path: scratch.database))
        let fix = Fix(seq: 10, device: "car", time: statsTime("2025-03-10T08:00:00Z"), lat: 48.2, lon: 16.37, source: .api)
        try await store.store([statsFixEvent(fix)], cursor: "journal", seq: 10, state: (10, Data("ten".utf8)))
        try await store.store([], cursor: "journal", seq: 4, state: (4, Data("four".utf8)))
        #expect(try await store.cursor("journal") == 10)
        #expect(try await store.journalCursor() == (4, Data("four".utf8)))
        try await store.store([statsEvent("something.new", id: "e-1", statsJSON(["x": 1]))], cursor: "journal", seq: 7)
        #expect(try await store.cursor("journal") == 10)
        try await store.store([], cursor: "journal", seq: 12)
        #expect(try await store.cursor("journal") == 12)
    }

    /// `retention.raw_fixes_days` (issue 21): the fixes of expired days go, and the daily and
    /// monthly figures they gave (the count, the time away from home) stay exactly as they were.
    @Test func expiredFixesLeaveTheirDaysFiguresAsTheyWere() async throws {
        let scratch = StatsScratch()
        let center = Coordinate(lat: 48.2, lon: 16.37)
        let work = LocalProjection(origin: center).unproject(x: 3000, y: 1500)
        var fixes: [Fix] = []
        func add(_ time: String, _ at: Coordinate) {
            fixes.append(Fix(seq: UInt64(fixes.count + 1), device: "van", time: statsTime(time), lat: at.lat, lon: at.lon, accuracyM: 10, source: .api))
        }
        for minute in stride(from: 8 * 60, to: 17 * 60, by: 1) { add(String(format: "2025-03-10T%02d:%02d:00Z", minute / 60, minute % 60), work) }
        add("2025-03-10T17:00:00Z", center)
        // Out across midnight, with no fix between 23:50 and 00:20, and home at 00:30.
        for minute in stride(from: 23 * 60 + 30, to: 24 * 60, by: 10) { add(String(format: "2025-03-10T%02d:%02d:00Z", minute / 60, minute % 60), work) }
        add("2025-03-11T00:20:00Z", work)
        add("2025-03-11T00:30:00Z", center)
        let store = try StatsStore(.init(path: scratch.database, homes: ["van": Zone(id: "home", shape: .circle(center: center, radiusM: 150))]))
        // As the recorder stores them: each fix as its journal record holds it.
        func journalRow(_ fix: Fix) -> StoredEvent {
            StoredEvent(id: "journal:\(fix.seq!)", type: "fix", device: fix.device, source: "ingest", time: fix.time, payload: BusJSON.encode(fix), fix: fix)
        }
        try await store.store(fixes.map(journalRow))
        #expect(try await store.counts()["fixes"] == fixes.count)
        #expect(try await store.counts()["events"] == 0)
        // A database from before 2026-11-27, whose fixes' rows in `events` held their payloads,
        // with one more row that no fix refers to (the same fix again under another seq).
        var again = fixes[0]
        again.seq = 5000
        let legacy = try DatabaseQueue(path: scratch.database)
        try await legacy.write { [fixes, again] db in
            for fix in fixes + [again] {
                try db.execute(
                    sql: "INSERT INTO events (id, type, device, source, time_ms, payload) VALUES (?, 'fix', ?, 'ingest', ?, ?)",
                    arguments: ["journal:\(fix.seq!)", fix.device, Int64(fix.time.timeIntervalSince1970 * 1000), Data(BusJSON.encode(fix))])
            }
        }
        try legacy.close()
        let days = try await store.periods(.day, StatsQuery(device: "van"))
        let months = try await store.periods(.month, StatsQuery())
        #expect(days.map(\.fixes) == [fixes.count - 2, 2])
        #expect(days.map(\.awayFromHomeS) == [9 * 3600 + 1800, 1800])

        // Noon of the 11th: the 10th's fixes go, the 11th's stay. The 11th still counts its
        // first twenty minutes away, from the 10th's last fix.
        #expect(try await store.expireFixes(before: statsTime("2025-03-11T12:00:00Z")) == fixes.count - 2)
        #expect(try await store.counts()["fixes"] == 2)
        // Their old rows in `events` stay but hold no position; a row no fix refers to is found
        // by the time in its payload.
        #expect(try await store.counts()["events"] == fixes.count + 1)
        #expect(try await store.eventPayloads().filter { $0 != "{}" }.count == 3)
        #expect(try await store.emptyExpiredJournalFixRows(before: statsTime("2025-03-11T12:00:00Z")) == 1)
        #expect(try await store.eventPayloads().filter { $0 != "{}" }.count == 2)
        #expect(try await store.emptyExpiredJournalFixRows(before: statsTime("2025-03-11T12:00:00Z")) == 0)
        // (A replay stores no record stored before: StatsRecorder, and StatsSystemTests.)
        #expect(try await store.periods(.day, StatsQuery(device: "van")) == days)
        #expect(try await store.periods(.month, StatsQuery()) == months)
        // A day starting in the range counts whole; one that does not, not at all.
        #expect(try await store.periods(.day, StatsQuery(from: statsTime("2025-03-10T00:00:00Z"), to: statsTime("2025-03-10T00:00:01Z"))) == [days[0]])
        #expect(try await store.periods(.day, StatsQuery(from: statsTime("2025-03-10T00:00:01Z"), to: statsTime("2025-03-11T00:00:00Z"))).isEmpty)
        // Again: nothing more goes, nothing changes.
        #expect(try await store.expireFixes(before: statsTime("2025-03-11T12:00:00Z")) == 0)
        #expect(try await store.periods(.day, StatsQuery(device: "van")) == days)
        // A fix of the 10th imported later is counted with it once it expires too.
        try await store.store([statsFixEvent(Fix(seq: 9999, device: "van", time: statsTime("2025-03-10T20:00:00Z"), lat: center.lat, lon: center.lon, accuracyM: 10, source: .import))])
        #expect(try await store.expireFixes(before: statsTime("2025-03-11T12:00:00Z")) == 1)
        #expect(try await store.periods(.day, StatsQuery(device: "van")).map(\.fixes) == [fixes.count - 1, 2])
        #expect(try await store.periods(.day, StatsQuery(device: "van")).map(\.awayFromHomeS) == days.map(\.awayFromHomeS))
    }

    @Test func badParametersNameTheParameter() throws {
        func refusal(_ query: String) -> String? {
            do {
                _ = try StatsQuery.parse(StatsParameters(query: query))
                return nil
            } catch {
                #expect(error.status == 400 && error.code == "stats.invalid_parameter")
                return error.field
            }
        }
        #expect(refusal("from=yesterday") == "from")
        #expect(refusal("to=2025-02-30") == "to")
        #expect(refusal("from=2025-03-02&to=2025-03-01") == "to")
        #expect(refusal("device=no%20spaces") == "device")
        #expect(refusal("device=a&device=b") == "device")
        #expect(refusal("from=") == "from")
        #expect(refusal("from=1969-12-31") == "from")
        #expect(refusal("from=2025-03-01&to=2025-03-01&device=car") == nil)
        #expect(throws: StatsError.invalid("width", "must be an integer from 100 to 200")) {
            try StatsParameters(query: "width=5").integer("width", default: 1, in: 100...200)
        }

        let query = try StatsQuery.parse(StatsParameters(query: "device=car&from=2025-03-01&to=2025-03-01"))
        #expect(query == StatsQuery(device: "car", from: statsTime("2025-03-01T00:00:00Z"), to: statsTime("2025-03-02T00:00:00Z")))
        let instant = try StatsQuery.parse(StatsParameters(query: "from=2025-03-01T10:00:00%2B02:00"))
        #expect(instant.from == statsTime("2025-03-01T08:00:00Z"))
        let json = statsParse(String(decoding: StatsError.invalid("from", "bad").json, as: UTF8.self))
        #expect(json.stats("error", "field")?.statsString == "from" && json.stats("error", "code")?.statsString == "stats.invalid_parameter")
    }

    @Test func theMapHasOnePolylinePerTrip() async throws {
        let scratch = StatsScratch()
        let store = try StatsStore(.init(path: scratch.database, homes: ["car": Zone(id: "home", shape: .circle(center: Coordinate(lat: 48.2, lon: 16.37), radiusM: 200))]))
        let parts = [statsVienna[0..<500], statsVienna[500..<1000], statsVienna[1000...]]
        try await store.store(parts.enumerated().map { index, part in statsEvent("trip.ended", statsTripEnded(Array(part), id: "t\(index)")) })
        // A trip with a single point has nothing to draw.
        try await store.store([statsEvent("trip.ended", statsJSON([
            "trip_id": "dot", "device": "car", "start_time": "2021-11-04T10:00:00Z", "end_time": "2021-11-04T10:01:00Z",
            "track": [[48.2, 16.3]],
        ] as [String: Any]))])

        let svg = String(decoding: try await store.mapSVG(StatsQuery(), width: 800, height: 600), as: UTF8.self)
        #expect(svg.components(separatedBy: "<polyline").count - 1 == 3)
        #expect(StatsGPXReader.parse(svg) != nil)  // well-formed XML
        #expect(svg.contains("width=\"800\" height=\"600\""))
        #expect(svg.contains("3 drives"))

        let map = statsParse(try statsExport(store, .map).text)
        let features = map.stats("features")?.statsArray ?? []
        #expect(features.count == 3)
        #expect(features.allSatisfy { $0.stats("geometry", "type")?.statsString == "LineString" && ($0.stats("geometry", "coordinates")?.statsArray.count ?? 0) >= 2 })

        let empty = String(decoding: try await store.mapSVG(StatsQuery(device: "nobody")), as: UTF8.self)
        #expect(!empty.contains("<polyline") && StatsGPXReader.parse(empty) != nil)
    }

    @Test func sessionReportHasTripsScoresAndEvents() async throws {
        let scratch = StatsScratch()
        let store = try statsViennaStore(scratch)
        try await store.store([
            statsEvent("session.started", statsJSON(["session_id": "s1", "device": "car", "candidate": "anna", "instructor": "Eva", "time": "2021-11-03T16:00:00Z"])),
            statsEvent("session.stopped", statsJSON(["device": "car", "time": "2021-11-03T17:00:00Z"])),
            statsEvent("drive.scored", statsJSON([
                "trip_id": "car-1", "device": "car", "start_time": "2021-11-03T16:19:50Z", "score": 91, "distance_m": 22_300,
                "events": [["type": "harsh_braking", "time": "2021-11-03T16:30:00Z"]], "counts": ["harsh_braking": 1],
                "events_per_100km": 4.5, "speed_variation": 0.3, "session": ["id": "s1", "candidate": "anna"],
            ] as [String: Any])),
        ])
        let sessions = try await store.sessions(candidate: "anna", StatsQuery())
        #expect(sessions.count == 1)
        #expect(sessions[0].end == statsTime("2021-11-03T17:00:00Z") && sessions[0].instructor == "Eva")
        #expect(sessions[0].trips.map(\.tripID) == ["car-1"] && sessions[0].averageScore == 91)
        let json = statsParse(String(decoding: try await store.sessionsJSON(candidate: "anna", StatsQuery()), as: UTF8.self))
        #expect(json.stats("latest_score")?.statsNumber == 91)
        #expect(json.stats("sessions", 0, "trips", 0, "score", "events", 0, "type")?.statsString == "harsh_braking")
        let listed = try await store.trips(StatsQuery())
        #expect(listed.first?.session?.id == "s1" && listed.first?.session?.candidate == "anna" && listed.first?.score?.score == 91)
        await #expect(throws: StatsError.self) { try await store.sessions(candidate: "bob", StatsQuery()) }
    }

    @Test func candidateReportShowsWhereThePointsWentTheWorstMomentsAndTheTrend() async throws {
        let scratch = StatsScratch()
        let store = try statsViennaStore(scratch)
        func component(_ name: String, _ value: Double, _ points: Double) -> [String: Any] {
            ["name": name, "value": value, "unit": name == "speed_variation" ? "mps2" : "per_100km", "points": points]
        }
        func scored(_ trip: String, _ session: String, _ score: Double, variation: Double, brakes: [Double]) -> StoredEvent {
            statsEvent("drive.scored", statsJSON([
                "trip_id": trip, "device": "car", "start_time": "2021-11-03T16:19:50Z", "score": score, "distance_m": 22_300,
                "events": brakes.enumerated().map { index, peak in
                    ["type": "harsh_brake", "time": "2021-11-03T16:3\(index):00Z", "peak_mps2": peak, "lat": 48.2, "lon": 16.37] as [String: Any]
                },
                "counts": ["harsh_brake": brakes.count], "events_per_100km": Double(brakes.count) * 100 / 22.3,
                "speed_variation": variation, "session": ["id": session, "candidate": "anna"],
                "components": [component("speed_variation", variation, 6 * (variation - 0.25) / 0.1), component("harsh_brake", Double(brakes.count) * 100 / 22.3, Double(brakes.count) * 100 / 22.3)],
            ] as [String: Any]))
        }
        try await store.store([
            statsEvent("session.started", statsJSON(["session_id": "s1", "device": "car", "candidate": "anna", "time": "2021-11-03T16:00:00Z"])),
            statsEvent("session.stopped", statsJSON(["device": "car", "time": "2021-11-03T17:00:00Z"])),
            statsEvent("trip.ended", id: "trip-2", statsTripEnded(statsVienna, id: "car-2")),
            statsEvent("session.started", statsJSON(["session_id": "s2", "device": "car", "candidate": "anna", "time": "2021-11-03T16:00:01Z"])),
            statsEvent("session.stopped", statsJSON(["device": "car", "time": "2021-11-03T17:00:00Z"])),
            // The first mock test: jerky, three hard brakes; the second: smoother, one.
            scored("car-1", "s1", 60, variation: 0.45, brakes: [-2.1, -3.0, -1.9]),
            scored("car-2", "s2", 80, variation: 0.35, brakes: [-2.5]),
        ])
        let json = statsParse(String(decoding: try await store.sessionsJSON(candidate: "anna", StatsQuery()), as: UTF8.self))
        #expect(json.stats("sessions")?.statsArray.count == 2)
        // Mean over the two drives: variation (0.45 + 0.35) / 2, points (12 + 6) / 2.
        #expect(json.stats("components", 0, "name")?.statsString == "speed_variation")
        #expect(abs((json.stats("components", 0, "mean_value")?.statsNumber ?? 0) - 0.4) < 1e-9)
        #expect(abs((json.stats("components", 0, "mean_points")?.statsNumber ?? 0) - 9) < 1e-9)
        // The hardest brakes first, each with its trip and session.
        let worst = json.stats("worst_moments")?.statsArray ?? []
        #expect(worst.count == 4)
        #expect(worst.map { $0.stats("event", "peak_mps2")?.statsNumber } == [-3.0, -2.5, -2.1, -1.9])
        #expect(worst.first?.stats("trip_id")?.statsString == "car-1" && worst.first?.stats("session_id")?.statsString == "s1")
        // From 60 to 80 over two mock tests: 20 points a test.
        #expect(json.stats("trend", "per_session")?.statsNumber == 20)
        #expect(json.stats("trend", "scores")?.statsArray.map { $0.stats("average_score")?.statsNumber } == [60, 80])
    }

    /// Numbers that Swift spells with an exponent still come out as plain decimals, exactly.
    @Test func exportsWritePlainDecimalsThatReadBackExactly() throws {
        let scratch = StatsScratch()
        let store = try StatsStore(.init(path: scratch.database))
        let values: [(Double, Double, Double)] = [
            (1e-05, -2.5e-07, 1e16), (-0.000123, 179.99999999999997, Double.leastNonzeroMagnitude), (48.1230487, 16.6098346, 123.456),
            (0, -0, 999_999_999_999_999.9), (-89.99999, 1e-10, 1.7976931348623157e308),
        ]
        let fixes = values.enumerated().map { index, value in
            Fix(seq: UInt64(index + 1), device: "car", time: statsTime("2025-01-01T00:00:0\(index).123Z"), lat: value.0, lon: value.1, altitudeM: value.2, source: .api)
        }
        try statsStoreSync(store, fixes.map(statsFixEvent))
        let csv = try statsExport(store, .fixes(.csv), StatsQuery(device: "car")).text
        let rows = csv.split(separator: "\n").dropFirst().map { $0.split(separator: ",", omittingEmptySubsequences: false) }
        #expect(rows.count == values.count)
        for (row, fix) in zip(rows, fixes) {
            #expect(!row.joined().contains("e") && !row.joined().contains("E"), "\(row)")
            #expect(Double(row[1]) == fix.lat && Double(row[2]) == fix.lon && Double(row[4]) == fix.altitudeM, "\(row)")
            #expect(RFC3339.parse(row[0]) == fix.time)
        }
        #expect(rows[0][1] == "0.00001" && rows[0][2] == "-0.00000025" && rows[0][4] == "10000000000000000")
        let gpx = try #require(StatsGPXReader.parse(try statsExport(store, .fixes(.gpx)).text))
        #expect(gpx.points.map { Double($0.lat) } == fixes.map(\.lat) && gpx.points.map { Double($0.lon) } == fixes.map(\.lon))
    }

    @Test func exportsStopWhenTheReaderGoesAway() throws {
        let scratch = StatsScratch()
        let store = try statsViennaStore(scratch)
        var chunks = 0
        #expect(throws: StatsError.cancelled) {
            try store.export(.fixes(.geojson), StatsQuery(), chunkBytes: 1024) { _ in
                chunks += 1
                if chunks == 2 { throw StatsError.cancelled }
            }
        }
        #expect(chunks == 2)
    }
}
