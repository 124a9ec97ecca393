import DrivebusSchema
import Foundation
import StatsCore
import GRDB
import Mustache

/// What `GET /` shows, and for when.
public struct DashboardOptions: Sendable {
    /// "This month" and the last 12 months are counted back from here (UTC).
    public var now: Date
    public var device: String?
    public var costs: CostsConfiguration
    public var recentTrips: Int
    public var candidates: Int
    /// The devices known now, for the devices table (those with fixes are listed anyway).
    public var knownDevices: [KnownDevice]
    /// Whether the page may offer "Set up phone" (the setup route is on).
    public var phoneSetup: Bool
    /// The drawing of drives shows the newest this many: it is inline, and years of trips would
    /// make the page heavy. The interactive map (`/map`) has them all.
    public var mapTrips: Int

    public init(
        now: Date = Date(), device: String? = nil, costs: CostsConfiguration = .init(), recentTrips: Int = 12, candidates: Int = 20,
        knownDevices: [KnownDevice] = [], phoneSetup: Bool = false, mapTrips: Int = 1000
    ) {
        self.mapTrips = mapTrips
        self.knownDevices = knownDevices
        self.phoneSetup = phoneSetup
        self.now = now
        self.device = device
        self.costs = costs
        self.recentTrips = recentTrips
        self.candidates = candidates
    }
}

extension StatsStore {
    /// The dashboard: one server-rendered page, well-formed XHTML with inline SVG and CSS, and
    /// nothing loaded from elsewhere, so it works on a LAN without internet.
    public func dashboardHTML(_ options: DashboardOptions) async throws -> [UInt8] {
        let data = try await Dashboard.gather(self, options)
        return Array(Dashboard.render(data, options).utf8)
    }
}

enum Dashboard {
    struct Month {
        var key: String  // 2025-03
        var year: Int64
        var month: Int64
    }

    struct Candidate {
        var name: String
        var sessions: Int
        var drives: Int
        var distanceM: Double
        var latestScore: Double?
        var averageScore: Double?
        var lastSessionMs: Int64
    }

    struct Page {
        var months: [Month]
        var monthly: [String: PeriodStats]
        var days: [(date: String, awayS: Double?)]
        var hasHome: Bool
        var trips: [TripSummary]
        var costs: [MonthCosts]
        var mapSVG: String
        var candidates: [Candidate]
        var drivesEver: Int
        var devices: [(device: KnownDevice, stored: DeviceQueries.Stored?)]
    }

    static let monthNames = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]

    static func gather(_ store: StatsStore, _ options: DashboardOptions) async throws -> Page {
        let dayMs = PeriodQueries.dayMs
        let today = PeriodQueries.floorDiv(milliseconds(options.now), dayMs)
        let (year, month, _) = RFC3339.civil(fromDays: today)
        let current = year * 12 + month - 1
        let months = (0..<12).reversed().map { back -> Month in
            let index = current - Int64(back)
            let y = PeriodQueries.floorDiv(index, 12), m = index - y * 12 + 1
            return Month(key: PeriodQueries.pad(y, 4) + "-" + PeriodQueries.pad(m, 2), year: y, month: m)
        }
        func firstDay(_ y: Int64, _ m: Int64) -> Date {
            msDate(Int64(RFC3339.days(fromYear: Int(y), month: Int(m), day: 1)) * dayMs)
        }
        let next = current + 1
        let nextYear = PeriodQueries.floorDiv(next, 12)
        let range = StatsQuery(device: options.device, from: firstDay(months[0].year, months[0].month), to: firstDay(nextYear, next - nextYear * 12 + 1))

        var monthly: [String: PeriodStats] = [:]
        for period in try await store.periods(.month, range) { monthly[period.period] = period }

        let daysQuery = StatsQuery(device: options.device, from: msDate((today - 29) * dayMs), to: msDate((today + 1) * dayMs))
        var away: [String: Double?] = [:]
        var hasHome = false
        for period in try await store.periods(.day, daysQuery) {
            away[period.period] = period.awayFromHomeS
            if period.awayFromHomeS != nil { hasHome = true }
        }
        let devicesWithHome = options.device.map { store.homes[$0] != nil } ?? !store.homes.isEmpty
        hasHome = hasHome || devicesWithHome
        let days: [(String, Double?)] = (0..<30).map { offset in
            let (y, m, d) = RFC3339.civil(fromDays: today - 29 + Int64(offset))
            let key = PeriodQueries.pad(y, 4) + "-" + PeriodQueries.pad(m, 2) + "-" + PeriodQueries.pad(d, 2)
            return (key, away[key] ?? (hasHome ? 0 : nil))
        }

        let recent = max(0, min(200, options.recentTrips))
        let device = options.device
        let stored = try await store.pool.read { db in try DeviceQueries.stored(db) }
        let devices = DeviceQueries.merged(options.knownDevices, stored).map { (device: $0, stored: stored[$0.id]) }
        let (trips, drivesEver, candidateRows) = try await store.pool.read { db in
            let trips = try TripQueries.list(db, query: StatsQuery(device: device), limit: recent)
            let count = try Int.fetchOne(db, sql: "SELECT count(*) FROM trips WHERE (?1 IS NULL OR device = ?1)", arguments: [device]) ?? 0
            let rows = try Row.fetchAll(db, sql: """
                SELECT candidate, count(*), max(start_ms) FROM sessions WHERE (?1 IS NULL OR device = ?1)
                GROUP BY candidate ORDER BY max(start_ms) DESC, candidate LIMIT ?2
                """, arguments: [device, max(0, min(500, options.candidates))])
            return (trips, count, rows.map { (name: $0[0] as String, sessions: $0[1] as Int, last: $0[2] as Int64) })
        }
        var candidates: [Candidate] = []
        for row in candidateRows {
            let sessions = try await store.sessions(candidate: row.name, StatsQuery(device: device))
            let scored = sessions.flatMap(\.trips)
            candidates.append(Candidate(
                name: row.name, sessions: row.sessions, drives: scored.count, distanceM: sessions.reduce(0) { $0 + $1.distanceM },
                latestScore: scored.last(where: { $0.score?.score != nil })?.score?.score,
                averageScore: SessionReport.mean(scored.compactMap { $0.score?.score }), lastSessionMs: row.last))
        }

        let costs = try await store.monthlyCosts(range, months: months.map(\.key), configuration: options.costs)
        // A small frame while there is nothing to draw.
        let mapHeight = drivesEver > 0 ? 720 : 240
        var map = String(decoding: try await store.mapSVG(StatsQuery(device: device), width: 1200, height: mapHeight, newest: options.mapTrips), as: UTF8.self)
        // Inline: the XML declaration is not allowed inside the page.
        if map.hasPrefix("<?xml"), let end = map.range(of: "?>") { map = String(map[end.upperBound...]) }
        return Page(
            months: months, monthly: monthly, days: days, hasHome: hasHome, trips: trips, costs: costs, mapSVG: map,
            candidates: candidates, drivesEver: drivesEver, devices: devices)
    }

    // MARK: Formatting

    static func grouped(_ value: Double, places: Int = 0) -> String {
        let text = Decimal64.text(value, places: places)
        let negative = text.hasPrefix("-")
        let body = negative ? String(text.dropFirst()) : text
        let parts = body.split(separator: ".", maxSplits: 1)
        var whole = String(parts.first ?? "0")
        var out = ""
        while whole.count > 3 {
            out = "," + whole.suffix(3) + out
            whole = String(whole.dropLast(3))
        }
        var fraction = parts.count > 1 ? String(parts[1]) : ""
        while fraction.count < places { fraction += "0" }
        return (negative ? "-" : "") + whole + out + (places > 0 ? "." + fraction : "")
    }

    static func km(_ metres: Double) -> String {
        metres < 100_000 ? grouped(metres / 1000, places: 1) + " km" : grouped(metres / 1000) + " km"
    }

    static func duration(_ seconds: Double) -> String {
        let minutes = Int((max(0, seconds.isFinite ? seconds : 0) / 60).rounded())
        if minutes < 60 { return "\(minutes) min" }
        let rest = minutes % 60
        return "\(minutes / 60) h " + (rest < 10 ? "0" : "") + "\(rest) min"
    }

    static func money(_ value: Decimal, _ currency: String) -> String {
        grouped(Money.double(value), places: 2) + " " + currency
    }

    static func time(_ date: Date) -> String {
        let text = RFC3339.format(date)  // 2025-03-10T08:12:00.000Z
        return String(text.prefix(10)) + " " + String(text.dropFirst(11).prefix(5))
    }

    /// `Mar`, with the year under January, and under the first month unless January is next
    /// (two years side by side would overlap in the small charts).
    static func monthLabels(_ months: [Month]) -> [String] {
        months.enumerated().map { index, month in
            let name = monthNames[Int(max(1, min(12, month.month))) - 1]
            let year = month.month == 1 || (index == 0 && months.count > 1 && months[1].month != 1)
            return year ? name + "\n" + String(month.year) : name
        }
    }

    static let palette = ["#8e6cc0", "#e07b39", "#3b9c8f", "#c9a227", "#b34d6d", "#5a7d2a"]

    // MARK: Page

    /// Fills the page template (`DashboardTemplate`) with what `gather` found.
    static func render(_ data: Page, _ options: DashboardOptions) -> String {
        let view = PageView(
            style: style, scope: options.device.map { "device \($0)" } ?? "all devices", drivesEver: data.drivesEver,
            updated: time(options.now), thisMonth: thisMonth(data), yearCharts: yearCharts(data), costs: costs(data, options.costs),
            trips: data.trips.isEmpty ? nil : .init(rows: data.trips.map(tripRow)), mapSVG: data.mapSVG,
            mapTitle: data.drivesEver > options.mapTrips ? "The latest \(options.mapTrips) of \(data.drivesEver) drives" : "All drives",
            mapLink: "map" + (options.device.map { "?device=" + $0 } ?? ""), away: away(data),
            candidates: data.candidates.isEmpty ? nil : .init(rows: data.candidates.map(candidateRow)),
            devices: data.devices.isEmpty ? nil : .init(rows: data.devices.map { row in
                PageView.DeviceRow(
                    name: row.device.id, origin: row.device.origin, app: row.device.app ?? "–",
                    battery: row.stored?.battery.map { "\(Int(($0 * 100).rounded())) %" } ?? "–", canSetUp: options.phoneSetup && row.device.origin == "added",
                    lastFix: row.stored.map { time(msDate($0.last)) } ?? "none yet",
                    position: row.stored.flatMap { stored in
                        stored.lat.flatMap { lat in stored.lon.map { Decimal64.text(lat, places: 5) + ", " + Decimal64.text($0, places: 5) } }
                    } ?? "–")
            }))
        return DashboardTemplate.page.render(view)
    }

    /// What the template shows; each optional section is left out (or says why) when nil.
    struct PageView {
        struct Card { let label, value: String }
        struct ThisMonth { let name: String; let cards: [Card] }
        struct Chart { let title, svg: String }
        struct Total { let name, amount: String; let best: Bool }
        struct Costs { let chart: String; let totals: [Total]; let noRentals: Bool }
        struct Score { let value, grade: String }
        struct Event { let name: String }
        struct TripRow {
            let id, start, device, distance, duration, candidate: String
            let score: Score?
            let scored: Bool
            let events: [Event]
        }
        struct DeviceRow {
            let name, origin, app, battery: String
            /// Added with `drivebus device`: the dashboard can make it a new setup code.
            let canSetUp: Bool
            let lastFix, position: String
        }
        struct CandidateRow {
            let name, link, distance, average, lastSession: String
            let sessions, drives: Int
            let latest: Score?
        }

        let style, scope: String
        let drivesEver: Int
        let updated: String
        let thisMonth: ThisMonth
        let yearCharts: [Chart]
        let costs: Costs?
        /// A table is a value of its own, so that the template opens and closes it once.
        struct Table<Row> { let rows: [Row] }
        let trips: Table<TripRow>?
        let mapSVG: String
        let mapTitle: String
        /// The interactive map, for the same device.
        let mapLink: String
        /// The chart of hours away, or nil when no device has a home.
        let away: String?
        let candidates: Table<CandidateRow>?
        let devices: Table<DeviceRow>?
    }

    static func thisMonth(_ data: Page) -> PageView.ThisMonth {
        let month = data.months.last!
        let stats = data.monthly[month.key] ?? PeriodStats(period: month.key)
        return PageView.ThisMonth(name: monthNames[Int(month.month) - 1] + " " + String(month.year), cards: [
            .init(label: "Distance", value: km(stats.distanceM)),
            .init(label: "Drives", value: "\(stats.drives)"),
            .init(label: "Driving time", value: duration(stats.drivingS)),
            .init(label: "Away from home", value: stats.awayFromHomeS.map(duration) ?? (data.hasHome ? duration(0) : "no home set")),
        ])
    }

    static func yearCharts(_ data: Page) -> [PageView.Chart] {
        let labels = monthLabels(data.months)
        let stats = data.months.map { data.monthly[$0.key] ?? PeriodStats(period: $0.key) }
        let highlight = data.months.count - 1
        func chart(_ title: String, _ values: [Double], _ color: String, _ tick: @escaping (Double) -> String, _ tip: (PeriodStats) -> String) -> PageView.Chart {
            let tips = [zip(data.months, stats).map { "\($0.key): \(tip($1))" }]
            return PageView.Chart(title: title, svg: Charts.bars(
                labels: labels, series: [.init(name: title, color: color, values: values)], tooltips: tips, highlight: highlight,
                width: 380, height: 210, tick: tick, minStep: title.hasPrefix("Driving time") ? 0.5 : 1,
                title: title + ", last 12 months", empty: "no drives yet"))
        }
        return [
            chart("Distance (km)", stats.map { $0.distanceM / 1000 }, "#2e86ab", { grouped($0) }, { km($0.distanceM) }),
            chart("Drives", stats.map { Double($0.drives) }, "#3b9c8f", { grouped($0) }, { "\($0.drives) drives" }),
            chart("Driving time (h)", stats.map { $0.drivingS / 3600 }, "#8e6cc0", { Decimal64.text($0, places: 1) }, { duration($0.drivingS) }),
        ]
    }

    static func costs(_ data: Page, _ costs: CostsConfiguration) -> PageView.Costs? {
        let anyExpense = data.costs.contains { $0.ownCar != 0 }
        if costs.rentals.isEmpty && !anyExpense && costs.ownCar.expenses.isEmpty { return nil }
        var series = [Charts.Series(name: "own car", color: "#2e86ab", values: data.costs.map { Money.double($0.ownCar) })]
        for (index, rental) in costs.rentals.enumerated() {
            series.append(.init(name: rental.name, color: palette[index % palette.count], values: data.costs.map { Money.double($0.services[index]) }))
        }
        if !costs.rentals.isEmpty {
            series.append(.init(name: "mixed rent", color: "#444444", values: data.costs.map { $0.mixed.map(Money.double) ?? 0 }))
        }
        let labels = monthLabels(data.months)
        let tips = series.map { item in zip(data.months, item.values).map { "\(item.name), \($0.key): \(grouped($1, places: 2)) \(costs.currency)" } }
        let chart = Charts.bars(
            labels: labels, series: series, tooltips: tips, width: 1140, height: 280, tick: { grouped($0) },
            title: "Costs per month in \(costs.currency)", empty: "no costs in the last 12 months", legend: true)
        // Totals over the 12 months; the cheapest is marked only when there is a choice.
        var totals = [("own car", data.costs.reduce(Decimal(0)) { $0 + $1.ownCar })]
        for (index, rental) in costs.rentals.enumerated() { totals.append((rental.name, data.costs.reduce(Decimal(0)) { $0 + $1.services[index] })) }
        if !costs.rentals.isEmpty { totals.append(("mixed rent", data.costs.reduce(Decimal(0)) { $0 + ($1.mixed ?? 0) })) }
        let cheapest = Set(totals.map(\.1)).count > 1 ? totals.map(\.1).min() : nil
        return PageView.Costs(
            chart: chart, totals: totals.map { .init(name: $0.0, amount: money($0.1, costs.currency), best: $0.1 == cheapest) },
            noRentals: costs.rentals.isEmpty)
    }

    static func grade(_ value: Double) -> PageView.Score {
        PageView.Score(value: Decimal64.text(value, places: 0), grade: value >= 85 ? "good" : value >= 70 ? "fair" : "poor")
    }

    static func tripRow(_ trip: TripSummary) -> PageView.TripRow {
        var events: [PageView.Event] = []
        if case .object(let counts)? = trip.score?.counts {
            for key in counts.keys.sorted() {
                guard case .number(let n) = counts[key]!, n > 0 else { continue }
                events.append(.init(name: key.replacingOccurrences(of: "_", with: " ") + " ×" + Decimal64.text(n)))
            }
        }
        return PageView.TripRow(
            id: trip.tripID, start: time(trip.start), device: trip.device, distance: km(trip.distanceM ?? 0),
            duration: duration(trip.durationS ?? trip.end.timeIntervalSince(trip.start)), candidate: trip.session?.candidate ?? "",
            score: trip.score?.score.map(grade), scored: trip.score != nil, events: events)
    }

    static func away(_ data: Page) -> String? {
        guard data.hasHome else { return nil }
        let labels = data.days.enumerated().map { index, day -> String in
            let d = Int(day.date.suffix(2)) ?? 0
            guard index == 0 || d == 1 || index % 5 == 4 || index == data.days.count - 1 else { return "" }
            let month = monthNames[max(0, min(11, (Int(day.date.dropFirst(5).prefix(2)) ?? 1) - 1))]
            return "\(d)\n\(month)"
        }
        let values = data.days.map { ($0.awayS ?? 0) / 3600 }
        let tips = [data.days.map { "\($0.date): \(duration($0.awayS ?? 0)) away" }]
        return Charts.bars(
            labels: labels, series: [.init(name: "hours away", color: "#d9822b", values: values)], tooltips: tips,
            highlight: data.days.count - 1, width: 1140, height: 220, tick: { Decimal64.text($0, places: 0) + " h" },
            title: "Hours away from home per day", empty: "no time away in the last 30 days")
    }

    static func candidateRow(_ candidate: Candidate) -> PageView.CandidateRow {
        PageView.CandidateRow(
            name: candidate.name,
            link: "api/v1/sessions/" + (candidate.name.addingPercentEncoding(withAllowedCharacters: .urlPathAllowed.subtracting(CharacterSet(charactersIn: "/"))) ?? ""),
            distance: km(candidate.distanceM), average: candidate.averageScore.map { Decimal64.text($0, places: 0) } ?? "–",
            lastSession: time(msDate(candidate.lastSessionMs)), sessions: candidate.sessions, drives: candidate.drives,
            latest: candidate.latestScore.map(grade))
    }

    /// System fonts only; no `<` or `&` so the page stays well-formed XML.
    static let style = """
        :root{--ink:#1f2328;--muted:#6b7280;--line:#e5e7eb;--bg:#f6f7f9;--card:#fff}
        *{box-sizing:border-box}
        body{margin:0;background:var(--bg);color:var(--ink);font:15px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif}
        header{background:#1f3a4d;color:#fff;padding:18px 28px}
        header h1{margin:0;font-size:24px;letter-spacing:.5px}
        header .sub{margin:4px 0 0;color:#cfe0ea;font-size:13px}
        main{max-width:1200px;margin:0 auto;padding:8px 20px 24px}
        section{background:var(--card);border:1px solid var(--line);border-radius:10px;padding:14px 18px 16px;margin:16px 0}
        h2{font-size:17px;margin:0 0 12px}
        .cards{display:grid;grid-template-columns:repeat(4,1fr);gap:12px}
        .card{border:1px solid var(--line);border-radius:8px;padding:10px 14px;background:#fbfcfd}
        .card .label{color:var(--muted);font-size:13px}
        .card .value{font-size:26px;font-weight:600;margin-top:2px}
        .charts{display:grid;grid-template-columns:repeat(3,1fr);gap:12px}
        figure{margin:0}
        figcaption{font-size:13px;color:var(--muted);margin-bottom:4px}
        svg.chart{width:100%;height:auto;display:block}
        svg.chart text{font-size:11px;fill:#4b5563}
        svg.chart .legend{font-size:12px;fill:#1f2328}
        svg.chart .empty{font-size:13px;fill:#9ca3af}
        svg.chart .grid{stroke:#eef0f2}
        svg.chart .axis{stroke:#9ca3af}
        .map svg{width:100%;height:auto;display:block;border-radius:6px}
        table{border-collapse:collapse;width:100%;font-size:14px}
        th,td{text-align:left;padding:6px 8px;border-bottom:1px solid var(--line);vertical-align:top}
        th{color:var(--muted);font-weight:600;font-size:13px}
        .num{text-align:right;font-variant-numeric:tabular-nums}
        table.totals{width:auto;min-width:340px;margin-top:10px}
        tr.best td{font-weight:600;color:#1a7f37}
        .score{display:inline-block;min-width:34px;text-align:center;border-radius:10px;padding:0 8px;font-weight:600}
        .score.good{background:#dcfce7;color:#166534}
        .score.fair{background:#fef9c3;color:#854d0e}
        .score.poor{background:#fee2e2;color:#991b1b}
        .event{display:inline-block;background:#eef2ff;color:#3730a3;border-radius:8px;padding:0 7px;margin:1px 4px 1px 0;font-size:12.5px}
        .muted,.note{color:var(--muted)}
        code{background:#f1f3f5;padding:0 4px;border-radius:4px}
        footer{max-width:1200px;margin:0 auto;padding:0 20px 24px;color:var(--muted);font-size:13px}
        footer a,td a{color:#2e6f95}
        figure.wide{overflow-x:auto}
        figure.wide svg.chart{min-width:760px}
        @media (max-width:820px){.charts svg.chart{max-width:460px}.cards{grid-template-columns:repeat(2,1fr)}.charts{grid-template-columns:1fr}table.trips td:nth-child(7),table.trips th:nth-child(7){display:none}}
        """
}
