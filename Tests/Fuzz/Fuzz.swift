import DrivebusConfiguration
import DrivebusJournal
import DrivebusKit
import DrivebusTestbed
import DrivebusTestSupport
import Foundation
import Hummingbird
import HummingbirdTesting
import IngestCore
import StatsCore
import StatsHTTP
import StatsStore

/// What one target's fuzz run came to. A crash ends the process, so it is never counted: a run
/// that returns had none.
public struct FuzzReport: Sendable, CustomStringConvertible {
    public let target: String
    public let cases: Int
    /// Answers of 500 and above (HTTP targets).
    public var serverErrors = 0
    /// Refused requests after which the journal had grown (ingest).
    public var storedFromRejected = 0
    /// The first few problems, with their input.
    public var problems: [String] = []
    /// How many cases got each HTTP status (HTTP targets): proof that both paths were taken.
    public var statuses: [Int: Int] = [:]
    /// Seconds spent per endpoint (HTTP targets), to find what a hostile input makes slow.
    public var secondsByEndpoint: [String: Double] = [:]
    public var seconds = 0.0

    public var isClean: Bool { serverErrors == 0 && storedFromRejected == 0 && problems.isEmpty }

    public var description: String {
        "\(target): \(cases) cases in \(String(format: "%.1f", seconds)) s, \(serverErrors) 5xx, \(storedFromRejected) stored from rejected"
            + (problems.isEmpty ? "" : "; " + problems.joined(separator: " | "))
    }

    mutating func note(_ problem: String) {
        if problems.count < 5 { problems.append(String(problem.prefix(300))) }
    }
}

/// Seeded fuzzing of every parser a client, a file or the bus can reach: ingest's endpoints,
/// stats' endpoints, the track file formats and the bus decoders. `drivebus-bench fuzz` runs it
/// long; the test suite runs a few thousand cases per target.
public enum Fuzz {
    static func corpus(_ names: [String]) -> [[UInt8]] { names.map { Array($0.utf8) } }

    // MARK: Ingest

    struct IngestCase {
        let method: String
        let path: String
        var query: String
        var headers: [String: String]
        var body: [UInt8]
    }

    static let token = "car-token-0123456789"

    static func ingestSamples() throws -> [IngestCase] {
        let auth = ["Authorization": "Bearer \(token)"]
        var samples: [IngestCase] = []
        // Verbatim client payloads from the fixtures.
        if case .object(let root)? = try? JSONValue.parse(Array(fixture("owntracks.json"))), case .array(let items)? = root["samples"] {
            for item in items {
                guard case .object(let entry) = item, let payload = entry["payload"] else { continue }
                samples.append(IngestCase(method: "POST", path: "/owntracks", query: "", headers: auth.merging(["X-Limit-U": "anna", "X-Limit-D": "phone"]) { a, _ in a }, body: payload.encoded))
            }
        }
        samples.append(IngestCase(method: "POST", path: "/overland", query: "", headers: auth, body: Array(try fixture("overland.json"))))
        for line in String(decoding: try fixture("osmand.tsv"), as: UTF8.self).split(separator: "\n").dropFirst().prefix(40) {
            let cells = line.split(separator: "\t", omittingEmptySubsequences: false)
            guard cells.count >= 6 else { continue }
            let uri = cells[3].split(separator: "?", maxSplits: 1)
            samples.append(IngestCase(
                method: String(cells[2]), path: String(uri.first ?? "/"), query: uri.count > 1 ? String(uri[1]) : "",
                headers: cells[4] == "-" ? [:] : ["Content-Type": String(cells[4])], body: cells[5] == "-" ? [] : Array(cells[5].utf8)))
        }
        samples += [
            IngestCase(method: "GET", path: "/gpslogger", query: "lat=48.2&lon=16.37&time=2025-01-01T00:00:00Z&spd=3&acc=5&alt=180&batt=80&dir=90&token=\(token)", headers: [:], body: []),
            IngestCase(method: "POST", path: "/gpslogger", query: "", headers: ["Content-Type": "application/x-www-form-urlencoded"], body: Array("latitude=48.2&longitude=16.37&device=car&accuracy=5&battery=70&speed=2&token=\(token)".utf8)),
            IngestCase(method: "POST", path: "/api/v1/fixes", query: "", headers: auth, body: Array(#"{"fixes":[{"time":"2025-01-01T00:00:00Z","lat":48.2,"lon":16.37,"speed_mps":12.5,"accuracy_m":4,"course_deg":90,"altitude_m":200,"battery":0.5}]}"#.utf8)),
            IngestCase(method: "POST", path: "/api/v1/motion", query: "", headers: auth, body: Array(#"{"samples":[{"start":"2025-01-01T00:00:00Z","activity":"walking","confidence":"high"}]}"#.utf8)),
            IngestCase(method: "POST", path: "/api/v1/sessions/start", query: "", headers: auth, body: Array(#"{"candidate":"Anna K.","instructor":"Marek","note":"mock test"}"#.utf8)),
            IngestCase(method: "POST", path: "/api/v1/sessions/stop", query: "", headers: auth, body: Array(#"{"session_id":"car-1"}"#.utf8)),
            IngestCase(method: "POST", path: "/api/v1/taxi/checkin", query: "", headers: auth, body: Array(#"{"time":"2025-01-01T00:00:00Z"}"#.utf8)),
            IngestCase(method: "GET", path: "/healthz", query: "", headers: [:], body: []),
        ]
        return samples
    }

    /// Every ingest endpoint, in process: no answer of 500 or above, and nothing journaled from a
    /// refused request.
    public static func ingest(cases: Int, seed: UInt64) async throws -> FuzzReport {
        let started = ContinuousClock.now
        let dir = TempDir()
        var config = DrivebusConfig.defaults(workingDirectory: "/")
        config.devices = [.init(id: "car", token: token), .init(id: "48241179", token: nil, allowIDAuth: true)]
        let journal = try Journal(path: dir.path + "/journal") { _ in }
        defer { journal.shutdown() }
        // A fixed clock: fixture times from years ago are all valid, none is in the future.
        let handler = IngestHandler(config: config, journal: journal, now: { Date(timeIntervalSince1970: 1_800_000_000) })
        let samples = try ingestSamples()
        let bodies = samples.map(\.body)
        var mutator = Mutator(seed: seed)
        var report = FuzzReport(target: "ingest", cases: cases)
        for index in 0..<cases {
            var request = mutator.pick(samples)
            switch mutator.int(4) {
            case 0: request.query = String(decoding: mutator.mutate(Array(request.query.utf8), corpus: []), as: UTF8.self)
            case 1:
                let key = mutator.pick(["X-Limit-D", "Authorization", "Content-Type", "X-Limit-U"])
                request.headers[key] = String(decoding: mutator.mutate(Array((request.headers[key] ?? "x").utf8), corpus: []), as: UTF8.self)
            default: request.body = mutator.mutate(request.body, corpus: bodies)
            }
            let before = journal.lastSeq
            let answer = await handler.handle(IngestRequest(method: request.method, path: request.path, query: request.query, headers: request.headers, body: request.body))
            report.statuses[answer.status, default: 0] += 1
            if answer.status >= 500 {
                report.serverErrors += 1
                report.note("case \(index) \(request.path): \(answer.status) \(String(decoding: answer.body.prefix(200), as: UTF8.self))")
            }
            if answer.status >= 400, journal.lastSeq != before {
                report.storedFromRejected += 1
                report.note("case \(index) \(request.path): \(answer.status) but the journal grew")
            }
        }
        report.seconds = started.duration(to: .now).inSeconds
        return report
    }

    // MARK: Stats

    /// Every stats endpoint, through Hummingbird's in-process client: no answer of 500 or above.
    public static func stats(cases: Int, seed: UInt64) async throws -> FuzzReport {
        let started = ContinuousClock.now
        let dir = TempDir()
        // Durability is not under test here: no fsync per posted ledger.
        let store = try StatsStore(.init(path: dir.path + "/stats.sqlite", durability: .normal))
        defer { try? store.close() }
        let gpx = """
            <?xml version="1.0"?><gpx version="1.1" creator="t" xmlns="http://www.topografix.com/GPX/1/1"><rte><name>a</name>\
            <rtept lat="48.2" lon="16.37"><ele>200</ele></rtept><rtept lat="48.21" lon="16.38"><ele>230</ele></rtept></rte>\
            <trk><name>b</name><trkseg><trkpt lat="48.2" lon="16.37"><ele>200</ele></trkpt><trkpt lat="48.2" lon="16.39"><ele>210</ele></trkpt></trkseg></trk></gpx>
            """
        let geojson = #"{"type":"FeatureCollection","features":[{"type":"Feature","properties":{"name":"a"},"geometry":{"type":"LineString","coordinates":[[16.37,48.2,200],[16.38,48.21,230]]}}]}"#
        let expenses = #"{"expenses":[{"date":"2025-03-01","category":"fuel","amount":60.5}]}"#
        let csv = "date,category,amount\n2025-03-01,fuel,60.50\n"
        let gets = [
            "/api/v1/trips?device=car&from=2025-01-01&to=2025-02-01", "/api/v1/trips/car-1", "/api/v1/stats/daily?from=2025-01-01", "/api/v1/stats/monthly",
            "/api/v1/sessions/Anna%20K.", "/api/v1/export/fixes.csv?device=car", "/api/v1/export/fixes.gpx", "/api/v1/export/trips.geojson",
            "/api/v1/map.geojson", "/map.svg?width=800&height=400", "/api/v1/costs", "/api/v1/costs/expenses", "/api/v1/gates/dead-letters", "/?device=car",
        ]
        let posts: [(String, String, String)] = [
            ("/api/v1/routes/rank", "application/gpx+xml", gpx), ("/api/v1/routes/rank", "application/geo+json", geojson),
            ("/api/v1/costs/expenses", "application/json", expenses), ("/api/v1/costs/expenses", "text/csv", csv),
        ]
        let corpus = posts.map { Array($0.2.utf8) }
        // The cases first, so the in-process client runs them in order from one closure.
        enum StatsCase: Sendable {
            case get(uri: String)
            case post(path: String, type: String, body: [UInt8])
        }
        var mutator = Mutator(seed: seed)
        let requests: [StatsCase] = (0..<cases).map { _ in
            if mutator.int(3) == 0 {
                let uri = mutator.pick(gets)
                let parts = uri.split(separator: "?", maxSplits: 1)
                let query = String(decoding: mutator.mutate(Array((parts.count > 1 ? parts[1] : "a=1").utf8), corpus: []), as: UTF8.self)
                // A query that is not even a URI is the HTTP layer's to refuse; keep it printable.
                let printable = query.unicodeScalars.filter { $0.value > 0x20 && $0.value < 0x7F && $0 != "#" }.map(String.init).joined()
                return .get(uri: String(parts[0]) + "?" + printable)
            }
            let (path, type, body) = mutator.pick(posts)
            return .post(path: path, type: type, body: mutator.mutate(Array(body.utf8), corpus: corpus))
        }
        let app = Application(router: makeStatsRouter(store: store))
        var report = try await app.test(.router) { client -> FuzzReport in
            var report = FuzzReport(target: "stats", cases: cases)
            for (index, request) in requests.enumerated() {
                let response: TestResponse
                let name: String
                let began = ContinuousClock.now
                defer {
                    let path = String(name.split(separator: "?").first ?? "")
                    report.secondsByEndpoint[path, default: 0] += began.duration(to: .now).inSeconds
                }
                switch request {
                case .get(let uri):
                    name = "GET \(uri)"
                    response = try await client.execute(uri: uri, method: .get)
                case .post(let path, let type, let body):
                    name = "POST \(path)"
                    response = try await client.execute(uri: path, method: .post, headers: [.contentType: type], body: ByteBuffer(bytes: body))
                }
                report.statuses[Int(response.status.code), default: 0] += 1
                if response.status.code >= 500 {
                    report.serverErrors += 1
                    report.note("case \(index) \(name.prefix(120)): \(response.status.code) \(String(buffer: response.body).prefix(200))")
                }
            }
            return report
        }
        report.seconds = started.duration(to: .now).inSeconds
        return report
    }

    // MARK: Files

    /// Every track file format `drivebus import` reads: an error or points, never a crash.
    public static func files(cases: Int, seed: UInt64) throws -> FuzzReport {
        let started = ContinuousClock.now
        let samples: [(name: String, bytes: [UInt8])] = [
            ("drive.gpx", Array(try fixture("car_vienna_osm_1hz.gpx").prefix(6000))),
            ("bus.csv", Array(try fixture("bus_liverpool_route14.csv").prefix(3000))),
            ("track.geojson", Array(#"{"type":"FeatureCollection","features":[{"type":"Feature","properties":{"time":"2025-01-01T00:00:00Z"},"geometry":{"type":"Point","coordinates":[16.37,48.2,200]}},{"type":"Feature","properties":{"coordTimes":["2025-01-01T00:00:01Z","2025-01-01T00:00:02Z"]},"geometry":{"type":"LineString","coordinates":[[16.37,48.2],[16.38,48.21]]}}]}"#.utf8)),
        ]
        var mutator = Mutator(seed: seed)
        let corpus = samples.map(\.bytes)
        for _ in 0..<cases {
            let sample = mutator.pick(samples)
            _ = try? TrackFiles.read(Data(mutator.mutate(sample.bytes, corpus: corpus)), name: sample.name)
        }
        var report = FuzzReport(target: "files", cases: cases)
        report.seconds = started.duration(to: .now).inSeconds
        return report
    }

    // MARK: Bus

    /// Every decoder of what arrives on the bus or an RPC socket, or is read back from a journal.
    public static func bus(cases: Int, seed: UInt64) -> FuzzReport {
        let started = ContinuousClock.now
        let header = Array(#"{"v":1,"id":"fix-1","type":"fix","source":"ingest","seq":17,"epoch":"e","time":"2025-01-01T00:00:00.000Z","log_seq":3}"#.utf8)
        let payloads = corpus([
            #"{"accuracy_m":5,"altitude_m":180.5,"battery":0.82,"course_deg":271,"device":"car","lat":48.2082,"lon":16.3738,"meta":{"device_id":"iphone"},"seq":1234,"source":"overland","speed_mps":13.4,"time":"2026-11-21T18:42:54.000Z"}"#,
            #"{"activity":"walking","confidence":"high","device":"rider","seq":1240,"source":"api","start":"2026-11-21T18:43:10.000Z"}"#,
            #"{"device":"rider","seq":1260,"time":"2026-11-21T18:30:00.000Z"}"#,
            #"{"device":"car","file":"a.gpx","fixes":1525,"seq":2786}"#,
            #"{"seq":812,"candidate":"Anna K.","device":"car","instructor":"Marek","note":"n","session_id":"car-812","time":"2026-11-21T09:00:00.000Z"}"#,
            #"{"service":"ingest","pid":1,"epoch":"e","started_at":"2026-11-21T09:00:00.000Z","uptime_s":1,"status":"ok","published_seq":2,"last_seq":{"journal":3},"counters":{"a":1}}"#,
            #"{"seq":1,"type":"trip.ended","device":"car","id":"trip.ended-car-1","time":"2026-11-21T09:00:00.000Z","payload":{"trip_id":"car-1"}}"#,
            #"{"ok":true,"last_seq":3,"messages":[{"seq":1,"topic":"fix.car","payload":{}}],"events":[]}"#,
            #"{"messages":[{"seq":1,"topic":"fix.car","payload_bytes":14,"payload":{"lat":48.2}},{"seq":2,"topic":"motion.car","payload_bytes":2,"payload":{}}]}"#,
            #"{"ok":true,"last_seq":2,"events":[{"seq":2,"type":"trip.ended","device":"car","id":"t","time":"2026-11-21T09:00:00.000Z","payload":{"track":[[48.2,16.3]]}}]}"#,
        ])
        let topics = ["fix.car", "motion.rider", "taxi.checkin.rider", "import.finished.car", "session.started.car", "client.transition.car"]
        // `drivebus import`'s binary batches, damaged like the rest.
        let packed = PackedFixes.encode(device: "car", fixes: [
            .init(time: Date(timeIntervalSince1970: 1_700_000_000.5), lat: 48.2, lon: 16.37, accuracyM: 5, courseDeg: 90),
            .init(time: Date(timeIntervalSince1970: 1_700_000_001), lat: 48.3, lon: 16.38, altitudeM: 180, speedMps: 12),
        ])
        var mutator = Mutator(seed: seed)
        for _ in 0..<cases {
            let payload = mutator.mutate(mutator.pick(payloads), corpus: payloads)
            let frames = [Array(mutator.pick(topics).utf8), mutator.int(3) == 0 ? mutator.mutate(header, corpus: payloads) : header, payload]
            if let message = try? BusMessage(frames: frames) {
                _ = try? message.decode(Heartbeat.self)
                _ = message.device
            }
            _ = JournalMessage(seq: 1, topic: mutator.pick(topics), payload: payload).decoded
            _ = LoggedEvent(line: payload[...])
            _ = try? ReplayPage(reply: payload)
            _ = try? JournalPage.decode(payload)
            _ = try? EventsRPC.page(reply: payload)
            _ = try? JSONValue.parse(payload)
            _ = try? BusJSON.decode(RPCRequestHead.self, from: payload)
            _ = try? BusJSON.decode(IngestRPCMessages.Replay.self, from: payload)
            _ = try? BusJSON.decode(RPCReply<HealthReply>.self, from: payload)
            _ = try? PackedFixes.decode(mutator.mutate(packed, corpus: [packed]))
        }
        var report = FuzzReport(target: "bus", cases: cases)
        report.seconds = started.duration(to: .now).inSeconds
        return report
    }
}
