import DrivebusSchema
import DrivebusTestSupport
import Foundation
import Hummingbird
import HummingbirdTesting
import StatsCore
import StatsStore
import StatsHTTP
import Testing

/// The routes, through Hummingbird's in-process test client: no sockets.
@Suite struct StatsHTTPTests {
    func statsApp(_ store: StatsStore, _ configuration: StatsHTTPConfiguration = .init()) -> some ApplicationProtocol {
        Application(router: makeStatsRouter(store: store, configuration: configuration))
    }

    func statsBody(_ response: TestResponse) -> String { String(buffer: response.body) }

    @Test func badParametersGet400NamingTheParameter() async throws {
        let scratch = StatsScratch()
        let store = try statsViennaStore(scratch)
        try await statsApp(store).test(.router) { client in
            for (uri, field) in [
                ("/api/v1/trips?from=yesterday", "from"),
                ("/api/v1/stats/daily?to=2025-13-01", "to"),
                ("/api/v1/stats/monthly?device=a/b", "device"),
                ("/api/v1/export/fixes.gpx?from=2025-03-02&to=2025-03-01", "to"),
                ("/api/v1/export/fixes.csv?device=car&device=bike", "device"),
                ("/map.svg?width=5", "width"),
                ("/api/v1/map.geojson?from=", "from"),
            ] {
                try await client.execute(uri: uri, method: .get) { response in
                    #expect(response.status == .badRequest, "\(uri)")
                    #expect(response.headers[.contentType] == "application/json")
                    let json = statsParse(statsBody(response))
                    #expect(json.stats("error", "field")?.statsString == field, "\(uri)")
                    #expect(json.stats("error", "code")?.statsString == "stats.invalid_parameter")
                }
            }
            try await client.execute(uri: "/api/v1/trips/nope", method: .get) { response in
                #expect(response.status == .notFound)
                #expect(statsParse(statsBody(response)).stats("error", "code")?.statsString == "stats.not_found")
            }
            try await client.execute(uri: "/metrics", method: .get) { response in #expect(response.status == .notFound) }
        }
    }

    @Test func routesAnswerForTheViennaDrive() async throws {
        let scratch = StatsScratch()
        let store = try statsViennaStore(scratch)
        let configuration = StatsHTTPConfiguration(
            chunkBytes: 4096, bufferedChunks: 2, metrics: { "drivebus_up 1\n" },
            knownDevices: { [KnownDevice(id: "phone", origin: "added", app: "overland", addedAt: statsTime("2026-11-25T10:00:00Z"))] })
        try await statsApp(store, configuration).test(.router) { client in
            try await client.execute(uri: "/api/v1/trips?device=car&from=2021-11-03&to=2021-11-03", method: .get) { response in
                #expect(response.status == .ok)
                let json = statsParse(statsBody(response))
                #expect(json.stats("count")?.statsNumber == 1 && json.stats("trips", 0, "trip_id")?.statsString == "car-1")
            }
            try await client.execute(uri: "/api/v1/trips/car-1", method: .get) { response in
                #expect(statsParse(statsBody(response)).stats("track")?.statsArray.isEmpty == false)
            }
            try await client.execute(uri: "/api/v1/stats/daily", method: .get) { response in
                #expect(statsParse(statsBody(response)).stats("days", 0, "drives")?.statsNumber == 1)
            }
            // Streamed through the export thread and the bounded pipe.
            try await client.execute(uri: "/api/v1/export/fixes.gpx?device=car", method: .get) { response in
                #expect(response.status == .ok && response.headers[.contentType] == "application/gpx+xml")
                #expect(response.headers[.contentDisposition] == "attachment; filename=\"drivebus-fixes-car.gpx\"")
                let gpx = try #require(StatsGPXReader.parse(statsBody(response)))
                #expect(gpx.points.count == statsVienna.count)
                #expect(gpx.points.last.flatMap { Double($0.lat) } == statsVienna.last!.lat)
            }
            try await client.execute(uri: "/api/v1/export/fixes.csv?device=car", method: .get) { response in
                #expect(statsBody(response).split(separator: "\n").count == statsVienna.count + 1)
            }
            try await client.execute(uri: "/api/v1/export/trips.geojson", method: .get) { response in
                #expect(statsParse(statsBody(response)).stats("features")?.statsArray.count == 1)
            }
            try await client.execute(uri: "/api/v1/map.geojson", method: .get) { response in
                #expect(response.headers[.contentType] == "application/geo+json")
                #expect(statsParse(statsBody(response)).stats("features")?.statsArray.count == 1)
            }
            try await client.execute(uri: "/map.svg?width=640&height=480", method: .get) { response in
                #expect(response.headers[.contentType] == "image/svg+xml")
                #expect(statsBody(response).components(separatedBy: "<polyline").count == 2)
            }
            // The devices: known ones with their last fix, or none yet; a device with fixes that
            // is no longer known is listed as removed.
            try await client.execute(uri: "/api/v1/devices", method: .get) { response in
                let json = statsParse(statsBody(response))
                let devices = json.stats("devices")?.statsArray ?? []
                #expect(devices.map { $0.stats("device")?.statsString } == ["car", "phone"])
                #expect(devices[0].stats("origin")?.statsString == "removed")
                #expect(devices[0].stats("last_position", "lat")?.statsNumber == statsVienna.last!.lat)
                #expect(devices[0].stats("last_fix")?.statsString == RFC3339.format(statsVienna.last!.time))
                #expect(devices[1].stats("origin")?.statsString == "added" && devices[1].stats("app")?.statsString == "overland")
                #expect(devices[1].stats("added_at")?.statsString == "2026-11-25T10:00:00.000Z")
                #expect(devices[1].stats("last_fix")?.statsString == nil && devices[1].stats("last_position") != nil)
            }
            try await client.execute(uri: "/api/v1/sessions/nobody", method: .get) { response in
                #expect(response.status == .notFound)
            }
            try await client.execute(uri: "/metrics", method: .get) { response in
                #expect(statsBody(response) == "drivebus_up 1\n")
            }
        }
    }
}

/// `POST /api/v1/devices/{id}/purge`'s parameters.
@Suite struct DevicePurgeRequestTests {
    @Test func daysAreTakenWholeAndTimesAsGiven() throws {
        let day = try DevicePurgeRequest(device: "car", query: "from=2025-11-13&to=2025-11-14")
        // To the millisecond, as the stores compare.
        #expect(RFC3339.format(day.from) == "2025-11-13T00:00:00.000Z" && RFC3339.format(day.to) == "2025-11-14T23:59:59.999Z")
        #expect(day.device == "car" && !day.resendOK)
        let times = try DevicePurgeRequest(device: "car", query: "from=2025-11-13T07:00:00Z&to=2025-11-13T09:30:00Z&resend_ok=true")
        #expect(times == DevicePurgeRequest(device: "car", from: RFC3339.parse("2025-11-13T07:00:00Z")!, to: RFC3339.parse("2025-11-13T09:30:00Z")!, resendOK: true))
    }

    @Test(arguments: [
        ("from=2025-11-13", "to"), ("to=2025-11-13", "from"), ("from=2025-11-14&to=2025-11-13", "to"), ("from=yesterday&to=2025-11-13", "from"),
        ("from=2025-11-13&to=2025-11-13&resend_ok=yes", "resend_ok"), ("from=2025-11-13&to=2025-11-13&device=bike", "device"),
    ])
    func badParametersAreRefusedByName(query: String, field: String) {
        #expect(throws: StatsError.self) { try DevicePurgeRequest(device: "car", query: query) }
        do { _ = try DevicePurgeRequest(device: "car", query: query) } catch { #expect(error.field == field, "\(query)") }
    }
}

/// Other sites, through a browser on this machine: a name made to resolve to 127.0.0.1 (DNS
/// rebinding) reads nothing, and a page of another origin writes nothing; `curl` is not held up.
@Suite struct BrowserGuardTests {
    @Test func otherNamesAndOtherOriginsAreRefusedAndScriptsAreNot() async throws {
        let scratch = StatsScratch()
        let store = try StatsStore(.init(path: scratch.database))
        let app = Application(router: makeStatsRouter(store: store, configuration: .init(loopbackOnly: true)))
        try await app.test(.live) { client in
            let base = "http://127.0.0.1:\(try #require(client.port))"
            #expect(try await http("GET", base + "/api/v1/devices").status == 200)
            #expect(try await http("GET", base + "/api/v1/devices", headers: [("Host", "localhost:8091")]).status == 200)
            let rebound = try await http("GET", base + "/api/v1/export/fixes.csv", headers: [("Host", "evil.example:8091")])
            #expect(rebound.status == 403 && rebound.body.contains(#""field":"Host""#), "\(rebound)")
            let expense = Data(#"[{"date":"2025-06-01","category":"fuel","amount":10}]"#.utf8)
            let forged = try await http("POST", base + "/api/v1/costs/expenses", body: expense, contentType: "text/plain", headers: [("Origin", "http://evil.example")])
            #expect(forged.status == 403 && forged.body.contains(#""field":"Origin""#), "\(forged)")
            let crossSite = try await http("POST", base + "/api/v1/costs/expenses", body: expense, headers: [("Sec-Fetch-Site", "cross-site")])
            #expect(crossSite.status == 403 && crossSite.body.contains(#""field":"Sec-Fetch-Site""#), "\(crossSite)")
            #expect(try await store.counts()["expenses"] == 0)
            // A script, or this server's own page, posts as before.
            #expect(try await http("POST", base + "/api/v1/costs/expenses", body: expense).status == 200)
            #expect(try await http("POST", base + "/api/v1/costs/expenses", body: expense, headers: [("Origin", "http://127.0.0.1"), ("Sec-Fetch-Site", "same-origin")]).status == 200)
            #expect(try await store.counts()["expenses"] == 1)
        }
    }

    /// Behind a reverse proxy: its public name, kept in `Host` (Caddy) or only in the page's
    /// `Origin` (nginx rewrites `Host`), is let in when listed; `*.localhost` and IPv6 loopback are
    /// this machine.
    @Test func allowedHostsAndThisMachinesOtherNamesAreLetIn() async throws {
        let scratch = StatsScratch()
        let store = try StatsStore(.init(path: scratch.database))
        let app = Application(router: makeStatsRouter(store: store, configuration: .init(loopbackOnly: true, allowedHosts: ["drivebus.example.org"])))
        try await app.test(.live) { client in
            let port = try #require(client.port)
            let base = "http://127.0.0.1:\(port)"
            for host in ["drivebus.example.org", "DriveBus.example.org:443", "car.localhost:\(port)", "[::1]:\(port)"] {
                #expect(try await http("GET", base + "/api/v1/devices", headers: [("Host", host)]).status == 200, "\(host)")
            }
            #expect(try await http("GET", base + "/api/v1/devices", headers: [("Host", "drivebus.example.org.evil.example")]).status == 403)
            let expense = Data(#"[{"date":"2025-06-01","category":"fuel","amount":10}]"#.utf8)
            for (host, origin, status) in [
                ("127.0.0.1:\(port)", "http://127.0.0.1:\(port)", 200),
                ("127.0.0.1:\(port)", "https://drivebus.example.org", 200),
                ("drivebus.example.org", "https://drivebus.example.org", 200),
                ("127.0.0.1:\(port)", "http://127.0.0.1:1", 403),
                ("127.0.0.1:\(port)", "null", 403),
            ] {
                let answer = try await http("POST", base + "/api/v1/costs/expenses", body: expense, headers: [("Host", host), ("Origin", origin)])
                #expect(answer.status == status, "\(host) \(origin): \(answer)")
            }
        }
    }
}

/// Only this machine's own dashboard gets a setup code or purges.
@Suite struct ActionGuardTests {
    func refusedField(_ headers: [(String, String)]) -> String? {
        do {
            try ActionGuard.check(headers.map { (name: $0.0, value: $0.1) }, action: "setup")
            return nil
        } catch {
            return error.field ?? "?"
        }
    }

    @Test func theDashboardOnThisMachineMayAskAndNothingElse() {
        let action = ("x-drivebus-action", "setup")
        #expect(refusedField([action, ("host", "127.0.0.1:8091")]) == nil)
        #expect(refusedField([action, ("host", "localhost:8091"), ("sec-fetch-site", "same-origin"), ("origin", "http://localhost:8091")]) == nil)
        #expect(refusedField([action, ("host", "[::1]:8091")]) == nil)
        #expect(refusedField([("host", "127.0.0.1:8091")]) == "X-Drivebus-Action")
        // DNS rebinding: another name that resolves here still says its name.
        #expect(refusedField([action, ("host", "rebind.example:8091")]) == "Host")
        #expect(refusedField([action]) == "Host")
        #expect(refusedField([action, ("host", "127.0.0.1:8091"), ("sec-fetch-site", "cross-site")]) == "Sec-Fetch-Site")
        #expect(refusedField([action, ("host", "127.0.0.1:8091"), ("origin", "http://evil.example")]) == "Origin")
    }

    @Test(arguments: [
        ("127.0.0.1", true), ("127.1.2.3:80", true), ("localhost", true), ("LOCALHOST:1", true), ("[::1]:8091", true), ("[::1]", true),
        ("127.0.0.1.evil.example", false), ("128.0.0.1", false), ("[::2]:1", false), ("192.168.1.2:8091", false), ("", false), ("127.0.0", false),
    ])
    func loopbackHosts(host: String, loopback: Bool) {
        #expect(ActionGuard.isLoopback(host) == loopback)
    }
}
