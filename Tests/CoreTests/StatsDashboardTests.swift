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

/// "Now" for the dashboard tests: the last 12 months are April 2024 to March 2025.
let issue9Now = statsTime("2025-03-20T18:00:00Z")
let issue9Home = Coordinate(lat: 48.2082, lon: 16.3738)

/// Places around Vienna the synthetic drives go to.
let issue9Places: [String: Coordinate] = [
    "office": Coordinate(lat: 48.2286, lon: 16.4110), "shop": Coordinate(lat: 48.1860, lon: 16.3280),
    "schoenbrunn": Coordinate(lat: 48.1845, lon: 16.3122), "airport": Coordinate(lat: 48.1103, lon: 16.5697),
    "klosterneuburg": Coordinate(lat: 48.3054, lon: 16.3255), "kahlenberg": Coordinate(lat: 48.2768, lon: 16.3339),
    "donauzentrum": Coordinate(lat: 48.2427, lon: 16.4343), "school": Coordinate(lat: 48.1700, lon: 16.3900),
]

/// A small deterministic random source, so that every run draws the same page.
struct Issue9Random {
    var state: UInt64
    mutating func next() -> Double {
        state = state &* 6364136223846793005 &+ 1442695040888963407
        return Double(state >> 11) / Double(1 << 53)
    }
    mutating func int(_ range: ClosedRange<Int>) -> Int { range.lowerBound + Int(next() * Double(range.count)) % range.count }
}

/// Drives, scores, driving-school sessions and fixes for a year of a household near Vienna, plus
/// the real Vienna drive two days before `issue9Now`. Returns the number of trips.
@discardableResult
func issue9FillDashboardStore(_ store: StatsStore, now: Date = issue9Now) throws -> Int {
    var random = Issue9Random(state: 2025)
    var events: [StoredEvent] = []
    var fixes = 0, trips = 0
    func fix(_ device: String, _ time: Date, _ at: Coordinate) {
        fixes += 1
        let value = Fix(seq: UInt64(1_000_000 + fixes), device: device, time: time, lat: at.lat, lon: at.lon, accuracyM: 8, source: .api)
        events.append(statsEvent("fix", id: "gen-fix-\(fixes)", device: device, time: time, try! BusJSON.encode(value)))
    }
    /// A wiggly road from `a` to `b`, one point about every 120 m.
    func road(_ a: Coordinate, _ b: Coordinate) -> [Coordinate] {
        let projection = LocalProjection(origin: a)
        let end = projection.project(b)
        let length = (end.x * end.x + end.y * end.y).squareRoot()
        let count = max(3, Int(length / 120))
        let bend = (random.next() - 0.5) * 0.25 * length
        let phase = random.next() * 6
        return (0...count).map { index in
            let t = Double(index) / Double(count)
            let side = bend * sin(.pi * t) + 60 * sin(phase + t * 23) * sin(.pi * t)
            return projection.unproject(x: end.x * t - end.y / length * side, y: end.y * t + end.x / length * side)
        }
    }
    /// One drive; returns when it ends.
    func drive(_ device: String, from a: Coordinate, to b: Coordinate, at start: Date, session: (id: String, candidate: String)? = nil, withFixes: Bool) -> Date {
        trips += 1
        let points = road(a, b)
        let distance = zip(points, points.dropFirst()).reduce(0) { $0 + Geo.distance($1.0, $1.1) }
        let speed = 8 + random.next() * 9
        let duration = (distance / speed).rounded()
        let end = start.addingTimeInterval(duration)
        let id = "\(device)-gen-\(trips)"
        if withFixes {
            for (index, point) in points.enumerated() where index % 4 == 0 || index == points.count - 1 {
                fix(device, start.addingTimeInterval(duration * Double(index) / Double(points.count - 1)), point)
            }
        }
        events.append(statsEvent("trip.ended", id: "ev-" + id, device: device, time: end, statsJSON([
            "trip_id": id, "device": device, "start_time": RFC3339.format(start), "end_time": RFC3339.format(end),
            "duration_s": duration, "distance_m": distance, "max_speed_mps": speed * 1.6, "avg_speed_mps": speed,
            "start": ["lat": a.lat, "lon": a.lon], "end": ["lat": b.lat, "lon": b.lon], "fix_count": points.count,
            "track": points.map { [$0.lat, $0.lon] },
        ] as [String: Any])))
        let braking = random.int(0...2), speeding = random.next() < 0.3 ? random.int(1...3) : 0, cornering = random.next() < 0.2 ? 1 : 0
        let score = max(35, min(100, 100 - 7 * braking - 9 * speeding - 5 * cornering - random.int(0...6)))
        var counts: [String: Any] = [:]
        if braking > 0 { counts["harsh_braking"] = braking }
        if speeding > 0 { counts["speeding"] = speeding }
        if cornering > 0 { counts["harsh_cornering"] = cornering }
        var scored: [String: Any] = [
            "trip_id": id, "device": device, "start_time": RFC3339.format(start), "score": score, "distance_m": distance,
            "counts": counts, "events": [] as [Any], "events_per_100km": Double(braking + speeding + cornering) / distance * 100_000,
        ]
        if let session { scored["session"] = ["id": session.id, "candidate": session.candidate] }
        // Most drives are scored; a few are waiting for the scorer.
        if random.next() < 0.9 { events.append(statsEvent("drive.scored", id: "score-" + id, device: device, time: end, statsJSON(scored))) }
        return end
    }

    let dayMs = 86_400.0
    let today = (now.timeIntervalSince1970 / dayMs).rounded(.down) * dayMs
    let weekend = ["klosterneuburg", "kahlenberg", "schoenbrunn", "airport", "donauzentrum"]
    for back in stride(from: 365, through: 0, by: -1) {
        let day = Date(timeIntervalSince1970: today - Double(back) * dayMs)
        let withFixes = back < 32
        let weekday = Int((day.timeIntervalSince1970 / dayMs).rounded(.down) + 4) % 7  // 0 = Sunday
        var at = issue9Home
        var clock = day.addingTimeInterval(7 * 3600 + Double(random.int(0...90)) * 60)
        if withFixes { fix("car", day.addingTimeInterval(60), issue9Home) }
        // Fewer drives in winter, more in summer.
        let month = Int(RFC3339.format(day).dropFirst(5).prefix(2))!
        let keen = (6...9).contains(month) ? 0.85 : 0.6
        if random.next() > keen { continue }
        let stops: [String] = (1...5).contains(weekday)
            ? ["office"] + (random.next() < 0.35 ? ["shop"] : [])
            : [weekend[random.int(0...(weekend.count - 1))]]
        for stop in stops {
            if withFixes { fix("car", clock.addingTimeInterval(-120), at) }
            clock = drive("car", from: at, to: issue9Places[stop]!, at: clock, withFixes: withFixes)
            at = issue9Places[stop]!
            let stay = stop == "office" ? 8.5 * 3600 : Double(random.int(1...4)) * 3600
            if withFixes {
                var t = clock
                while t < clock.addingTimeInterval(stay) { fix("car", t, at); t = t.addingTimeInterval(1800) }
            }
            clock = clock.addingTimeInterval(stay)
        }
        clock = drive("car", from: at, to: issue9Home, at: clock, withFixes: withFixes)
        if withFixes { fix("car", clock.addingTimeInterval(600), issue9Home) }
    }

    // Driving school: two candidates, a session a week each in the last months.
    for (offset, candidate) in ["anna", "ben"].enumerated() {
        for week in 0..<10 {
            let start = Date(timeIntervalSince1970: today - Double(70 - week * 7 + offset) * dayMs + 15 * 3600)
            let id = "\(candidate)-\(week)"
            events.append(statsEvent("session.started", id: "start-" + id, device: "school", time: start, statsJSON([
                "session_id": id, "device": "school", "candidate": candidate, "instructor": "Eva", "time": RFC3339.format(start),
            ])))
            var clock = start.addingTimeInterval(300)
            clock = drive("school", from: issue9Places["school"]!, to: issue9Places[week % 2 == 0 ? "schoenbrunn" : "donauzentrum"]!, at: clock, session: (id, candidate), withFixes: false)
            clock = drive("school", from: issue9Places[week % 2 == 0 ? "schoenbrunn" : "donauzentrum"]!, to: issue9Places["school"]!, at: clock.addingTimeInterval(600), session: (id, candidate), withFixes: false)
            events.append(statsEvent("session.stopped", id: "stop-" + id, device: "school", time: clock, statsJSON([
                "session_id": id, "device": "school", "time": RFC3339.format(clock.addingTimeInterval(120)),
            ])))
        }
    }

    // The real drive, moved to two days ago, with its score.
    let shift = now.addingTimeInterval(-2 * dayMs).timeIntervalSince1970 - statsVienna[0].time.timeIntervalSince1970 - 2 * 3600
    let vienna = statsVienna.map { original -> Fix in
        var moved = original
        moved.time = original.time.addingTimeInterval(shift)
        return moved
    }
    events += vienna.map { statsEvent("fix", id: "vienna-\($0.seq!)", device: "car", time: $0.time, try! BusJSON.encode($0)) }
    events.append(statsEvent("trip.ended", id: "ev-vienna", statsTripEnded(vienna, id: "car-vienna")))
    events.append(statsEvent("drive.scored", id: "score-vienna", statsJSON([
        "trip_id": "car-vienna", "device": "car", "score": 88, "counts": ["harsh_braking": 1, "speeding": 1],
        "events": [["type": "harsh_braking", "time": RFC3339.format(vienna[400].time)]], "events_per_100km": 9.0,
    ] as [String: Any])))
    trips += 1
    try statsStoreSync(store, events)
    return trips
}

/// The own car's ledger for the 12 months up to `now`, and the two tariffs.
func issue9DashboardCosts(now: Date = issue9Now) -> CostsConfiguration {
    let (year, month, _) = RFC3339.civil(fromDays: Int64((now.timeIntervalSince1970 / 86_400).rounded(.down)))
    var expenses: [CostsConfiguration.Expense] = []
    for back in 0..<12 {
        let index = year * 12 + month - 1 - Int64(back)
        let y = index / 12, m = index % 12 + 1
        let prefix = "\(y)-" + (m < 10 ? "0\(m)" : "\(m)")
        expenses.append(.init(date: prefix + "-05", category: "fuel", amount: 55 + Double(back % 4) * 9.5))
        expenses.append(.init(date: prefix + "-01", category: "insurance", amount: 48.20))
        expenses.append(.init(date: prefix + "-28", category: "value_drop", amount: 150))
        if back == 6 { expenses.append(.init(date: prefix + "-12", category: "repairs", amount: 420)) }
        if m == 1 { expenses.append(.init(date: prefix + "-15", category: "tax", amount: 310)) }
    }
    // Station-based: cheap by time and distance, but a minimum fee that short hops pay in full.
    let stadtauto = CostsConfiguration.Rental(name: "stadtauto", perMinute: 0.05, perKm: 0.19, perDayCap: 45, minFee: 4.5)
    return CostsConfiguration(
        currency: "EUR", rentalKeepS: 7200, ownCar: .init(expenses: expenses), rentals: [issue9Citycar, issue9Weekender, stadtauto])
}

/// The dashboard's elements, read with a real XML parser: it must be well-formed.
final class Issue9Page: NSObject, XMLParserDelegate {
    struct Element { var name: String; var attributes: [String: String]; var path: [String] }
    var elements: [Element] = []
    var texts: [String: String] = [:]  // section id → its text
    private var stack: [String] = []
    private var section: String?

    static func parse(_ html: String) -> Issue9Page? {
        let page = Issue9Page()
        let parser = XMLParser(data: Data(html.utf8))
        parser.delegate = page
        guard parser.parse() else {
            Issue.record("not well-formed at line \(parser.lineNumber): \(parser.parserError.map { "\($0)" } ?? "")")
            return nil
        }
        return page
    }

    func parser(_ parser: XMLParser, didStartElement name: String, namespaceURI: String?, qualifiedName: String?, attributes: [String: String] = [:]) {
        if name == "section" { section = attributes["id"] }
        elements.append(Element(name: name, attributes: attributes, path: stack + [section ?? ""]))
        stack.append(name)
    }

    func parser(_ parser: XMLParser, didEndElement name: String, namespaceURI: String?, qualifiedName: String?) {
        stack.removeLast()
        if name == "section" { section = nil }
    }

    func parser(_ parser: XMLParser, foundCharacters string: String) {
        if let section { texts[section, default: ""] += string }
    }

    func inSection(_ id: String, _ name: String) -> [Element] { elements.filter { $0.name == name && $0.path.last == id } }
}

@Suite struct StatsDashboardTests {
    static let sections = ["this-month", "last-12-months", "costs", "trips", "map", "away", "devices", "school"]

    func checkSelfContained(_ html: String) {
        // Inline script only (the devices' setup button): nothing loaded from elsewhere.
        #expect(!html.contains("<script src") && !html.contains("<link") && !html.contains("@import") && !html.contains("url("))
        // The only URLs are XML namespaces.
        var rest = Substring(html)
        while let range = rest.range(of: "http") {
            let before = rest[..<range.lowerBound].suffix(7)
            #expect(before.hasSuffix("xmlns=\""), "external reference near \(rest[range.lowerBound...].prefix(60))")
            rest = rest[range.upperBound...]
        }
    }

    @Test func anEmptyDatabaseStillRendersEverySection() async throws {
        let scratch = StatsScratch()
        let store = try StatsStore(.init(path: scratch.database))
        let html = String(decoding: try await store.dashboardHTML(DashboardOptions(now: issue9Now)), as: UTF8.self)
        let page = try #require(Issue9Page.parse(html))
        #expect(page.elements.filter { $0.name == "section" }.compactMap { $0.attributes["id"] } == Self.sections)
        #expect(page.texts["this-month"]?.contains("March 2025") == true || page.texts["this-month"]?.contains("Mar 2025") == true)
        #expect(page.inSection("last-12-months", "svg").count == 3)
        #expect(page.inSection("last-12-months", "rect").count == 36)
        #expect(page.texts["last-12-months"]?.contains("no drives yet") == true)
        #expect(page.texts["trips"]?.contains("No trips yet.") == true)
        #expect(page.texts["school"]?.contains("No driving-school sessions yet.") == true)
        #expect(page.texts["devices"]?.contains("drivebus device add my-phone") == true)
        #expect(page.texts["costs"]?.contains("No costs yet") == true)
        #expect(page.texts["away"]?.contains("No home set") == true)
        #expect(page.inSection("map", "svg").count == 1 && page.texts["map"]?.contains("no drives in this range") == true)
        checkSelfContained(html)
    }

    @Test func aFilledDatabaseShowsTripsCostsMapAndCandidates() async throws {
        let scratch = StatsScratch()
        let store = try StatsStore(.init(path: scratch.database, homes: ["car": Zone(id: "home", shape: .circle(center: issue9Home, radiusM: 300))]))
        let trips = try issue9FillDashboardStore(store)
        let app = Application(router: makeStatsRouter(store: store, configuration: .init(costs: issue9DashboardCosts())))
        try await app.test(.router) { client in
            try await client.execute(uri: "/?device=a/b", method: .get) { response in
                #expect(response.status == .badRequest)
                #expect(statsParse(String(buffer: response.body)).stats("error", "field")?.statsString == "device")
            }
            try await client.execute(uri: "/", method: .get) { response in
                #expect(response.status == .ok && response.headers[.contentType] == "text/html; charset=utf-8")
                #expect(String(buffer: response.body).contains("<section id=\"costs\">"))
            }
        }
        let known = [KnownDevice(id: "phone", origin: "added", app: "owntracks", addedAt: statsTime("2025-03-01T00:00:00Z"))]
        let html = String(decoding: try await store.dashboardHTML(DashboardOptions(now: issue9Now, costs: issue9DashboardCosts(), knownDevices: known)), as: UTF8.self)
        let page = try #require(Issue9Page.parse(html))
        #expect(page.elements.filter { $0.name == "section" }.compactMap { $0.attributes["id"] } == Self.sections)
        checkSelfContained(html)

        // The devices: the known one without fixes yet, those with fixes but not known listed as removed.
        let deviceRows = page.inSection("devices", "tr").compactMap { $0.attributes["data-device"] }
        #expect(deviceRows == ["car", "phone", "school"])
        #expect(page.texts["devices"]?.contains("owntracks") == true && page.texts["devices"]?.contains("none yet") == true)

        // This month's cards agree with the monthly statistics.
        let march = try await store.periods(.month, StatsQuery(from: statsTime("2025-03-01T00:00:00Z"), to: statsTime("2025-04-01T00:00:00Z")))
        #expect(march.count == 1)
        let cards = page.elements.filter { $0.name == "div" && $0.attributes["class"] == "card" }
        #expect(cards.count == 4)
        #expect(page.texts["this-month"]?.contains("\(march[0].drives)") == true)

        // Twelve months in each bar chart; four series in the cost chart, with a legend.
        #expect(page.inSection("last-12-months", "svg").count == 3)
        #expect(page.inSection("last-12-months", "rect").count == 36)
        let costBars = page.inSection("costs", "rect").filter { $0.attributes["width"] != "12" }
        #expect(costBars.count == 12 * 5)
        for name in ["own car", "citycar", "weekender", "stadtauto", "mixed rent"] { #expect(page.texts["costs"]?.contains(name) == true, "\(name)") }
        #expect(page.inSection("costs", "tr").count == 6)
        // Mixed rent is the cheapest way to rent, and marked so.
        let yearCosts = try await store.costs(
            StatsQuery(from: statsTime("2024-04-01T00:00:00Z"), to: statsTime("2025-04-01T00:00:00Z")), configuration: issue9DashboardCosts())
        let mixed = try #require(yearCosts.mixedTotal)
        #expect(yearCosts.services.allSatisfy { mixed < $0.total })
        #expect(page.inSection("costs", "tr").filter { $0.attributes["class"] == "best" }.count == 1)

        // Recent trips, newest first, with scores and events.
        let rows = page.inSection("trips", "tr").filter { $0.attributes["data-trip"] != nil }
        #expect(rows.count == 12)
        let newest = try await store.trips(StatsQuery())
        #expect(rows.map { $0.attributes["data-trip"]! } == Array(newest.prefix(12).map(\.tripID)))
        #expect(page.texts["trips"]?.contains("harsh braking") == true)
        #expect(page.inSection("trips", "span").contains { $0.attributes["class"]?.hasPrefix("score ") == true })

        // The map of all drives: one line per trip, and a link to the interactive map.
        #expect(page.inSection("map", "polyline").count == trips)
        #expect(page.inSection("map", "a").first?.attributes["href"] == "map")
        #expect(page.texts["map"]?.contains("All drives") == true)
        // Years of trips: the drawing keeps to the newest, and says so.
        let capped = try #require(Issue9Page.parse(String(decoding: try await store.dashboardHTML(DashboardOptions(
            now: issue9Now, device: "car", costs: issue9DashboardCosts(), knownDevices: known, mapTrips: 5)), as: UTF8.self)))
        let carTrips = try await store.trips(StatsQuery(device: "car")).count
        #expect(capped.inSection("map", "polyline").count == 5)
        #expect(capped.texts["map"]?.contains("The latest 5 of \(carTrips) drives") == true)
        #expect(capped.inSection("map", "a").first?.attributes["href"] == "map?device=car")

        // Thirty days away from home, with time counted on most of them.
        #expect(page.inSection("away", "rect").count == 30)
        let awayDays = try await store.periods(.day, StatsQuery(device: "car", from: statsTime("2025-02-19T00:00:00Z"), to: statsTime("2025-03-21T00:00:00Z")))
        #expect(awayDays.filter { ($0.awayFromHomeS ?? 0) > 0 }.count >= 12)

        // Candidates with their latest score, as the session report has it.
        let candidates = page.inSection("school", "tr").filter { $0.attributes["data-candidate"] != nil }
        #expect(candidates.compactMap { $0.attributes["data-candidate"] }.sorted() == ["anna", "ben"])
        for name in ["anna", "ben"] {
            let report = statsParse(String(decoding: try await store.sessionsJSON(candidate: name, StatsQuery()), as: UTF8.self))
            let latest = try #require(report.stats("latest_score")?.statsNumber)
            #expect(html.contains("data-candidate=\"\(name)\"") && html.contains(">\(Int(latest))</span>"))
        }

        try await issue9Screenshot()
    }
}

/// With `DRIVEBUS_SCREENSHOT=/path/dashboard.png` and Debian's chromium installed, serves the
/// dashboard on a real socket and has headless Chromium photograph it.
func issue9Screenshot() async throws {
    guard let path = ProcessInfo.processInfo.environment["DRIVEBUS_SCREENSHOT"], !path.isEmpty else { return }
    let chromium = ["/usr/bin/chromium", "/usr/bin/chromium-browser"].first { FileManager.default.isExecutableFile(atPath: $0) }
    let browser = try #require(chromium, "DRIVEBUS_SCREENSHOT is set but chromium is not installed")
    let size = ProcessInfo.processInfo.environment["DRIVEBUS_SCREENSHOT_SIZE"] ?? "1280,1800"
    // The server's "this month" is the real one: the same household, a year up to today.
    let scratch = StatsScratch()
    let store = try StatsStore(.init(path: scratch.database, homes: ["car": Zone(id: "home", shape: .circle(center: issue9Home, radiusM: 300))]))
    try issue9FillDashboardStore(store, now: Date())
    let app = Application(router: makeStatsRouter(store: store, configuration: .init(costs: issue9DashboardCosts(now: Date()))))
    try? FileManager.default.removeItem(atPath: path)
    try await app.test(.live) { client in
        let port = try #require(client.port)
        // The page must be the same one a browser gets: fetch it once over the socket first.
        try await client.execute(uri: "/", method: .get) { response in #expect(response.status == .ok) }
        let process = Process()
        process.executableURL = URL(fileURLWithPath: browser)
        process.arguments = [
            "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run", "--force-device-scale-factor=1",
            "--screenshot=\(path)", "--window-size=\(size)", "http://127.0.0.1:\(port)/",
        ]
        process.standardOutput = FileHandle.nullDevice
        process.standardError = FileHandle.nullDevice
        // Wait without blocking a thread of the pool, which the server needs to answer Chromium.
        let status: Int32 = try await withCheckedThrowingContinuation { continuation in
            process.terminationHandler = { continuation.resume(returning: $0.terminationStatus) }
            do { try process.run() } catch { continuation.resume(throwing: error) }
        }
        #expect(status == 0)
    }
    let bytes = try #require(FileManager.default.contents(atPath: path))
    #expect(bytes.count > 50_000 && bytes.starts(with: [0x89, 0x50, 0x4E, 0x47]))
}
