import DrivebusConfiguration
import DrivebusKit
import DrivebusTestSupport
import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import Testing

struct ReplayReply: Decodable {
    struct Message: Decodable {
        let seq: UInt64
        let topic: String
        /// Only fixes are decoded; other payloads are nil.
        let payload: Fix?

        enum CodingKeys: String, CodingKey { case seq, topic, payload }

        init(from decoder: any Decoder) throws {
            let container = try decoder.container(keyedBy: CodingKeys.self)
            seq = try container.decode(UInt64.self, forKey: .seq)
            topic = try container.decode(String.self, forKey: .topic)
            payload = topic.hasPrefix("fix.") ? try container.decode(Fix.self, forKey: .payload) : nil
        }
    }
    let lastSeq: UInt64
    let messages: [Message]
    enum CodingKeys: String, CodingKey {
        case lastSeq = "last_seq"
        case messages
    }
}

/// `drivebus-bus` and `drivebus-ingest`, for real, on ipc sockets and a loopback port.
@Suite(.serialized) struct IngestSystemTests {
    let token = "test-token-abcdefgh"

    @Test func fixesFlowFromHTTPToTheBusDurablyAndOnce() async throws {
        let dir = TempDir()
        let port = freePort()
        let yaml = """
            state_dir: \(dir.path)/state
            heartbeat_interval_s: 0.2
            devices: [{id: car, token: \(token)}]
            ingest: {listen: "127.0.0.1:\(port)", max_body_bytes: 65536}
            """
        let path = dir.file("drivebus.yaml", yaml)
        let config = try DrivebusConfig.parse(yaml: yaml)
        let base = "http://127.0.0.1:\(port)"
        let bus = try Child("drivebus-bus", ["--config", path])
        var ingest = try Child("drivebus-ingest", ["--config", path])
        #expect(await eventually(within: .seconds(20)) { (try? await http("GET", base + "/healthz").status) == 200 }, "\(ingest.stderr)")

        // Join the bus: once ingest's heartbeat arrives, its fixes and import reports will too.
        let client = BusClient(settings: config.process, name: "test")
        var messages = try await joinedSubscription(client, ["fix.", "import.finished."], heartbeatsFrom: [.ingest])

        let overland = try JSONSerialization.jsonObject(with: try fixture("overland.json")) as! [String: Any]
        let batch = try JSONSerialization.data(withJSONObject: (overland["samples"] as! [[String: Any]])[0]["payload"]!)
        let posted = try await http("POST", base + "/overland", token: token, body: batch)
        #expect(posted.status == 200)
        #expect(posted.body == #"{"result":"ok"}"#)

        let received = await next(&messages, of: client) { $0.topic == "fix.car" }
        let fix = try #require(try received?.decode(Fix.self))
        #expect(fix == Fix(seq: 1, device: "car", time: date("2015-10-01T15:00:00Z"), lat: 37.3318, lon: -122.030581, accuracyM: 30, altitudeM: 0, speedMps: 4, battery: 0.8, source: .overland))
        #expect(received?.header.source == "ingest")
        // The header carries the journal seq, so followers need not decode the payload for it.
        #expect(received?.header.logSeq == 1)

        // Replay gives back exactly what was published.
        let replay = try BusJSON.decode(ReplayReply.self, from: try await client.loop.request(
            ZMQEndpoint(config.layout.rpcEndpoint(.ingest)), body: Array(#"{"op":"replay","from_seq":1,"limit":10}"#.utf8), timeout: .seconds(5)))
        #expect(replay.messages.map(\.topic) == ["fix.car", "motion.car"])
        #expect(replay.messages.map(\.seq) == [1, 2])
        #expect(replay.messages.first?.payload == fix)
        // What a follower replays is the payload exactly as published, not a re-encoding.
        let page = try await ReplayPage.fetch(from: 1, limit: 1, bus: client)
        #expect(page.messages.first?.payload == received?.payload)
        #expect(page.lastSeq == 2)

        // Overland re-sends the same batch: acknowledged, nothing new.
        #expect(try await http("POST", base + "/overland", token: token, body: batch).status == 200)
        let health = try await client.call(.ingest, RPCRequestHead(op: "health"), as: HealthReply.self)
        #expect(health.lastSeq["journal"] == 2)

        // Bodies over max_body_bytes get 413 naming the body.
        let huge = try await http("POST", base + "/api/v1/fixes", token: token, body: Data(repeating: 0x20, count: 70_000))
        #expect(huge.status == 413)
        #expect(huge.body.contains(#""field":"body""#))

        // Kill ingest the moment it has answered 2xx: the fix is in the journal after restart.
        let fresh = #"{"fixes":[{"time":"2025-06-01T12:00:00.123Z","lat":48.2,"lon":16.37,"speed_mps":13.5}]}"#
        let accepted = try await http("POST", base + "/api/v1/fixes", token: token, body: Data(fresh.utf8))
        ingest.signal(SIGKILL)
        #expect(accepted.status == 200)
        #expect(accepted.body == #"{"accepted":1,"duplicates":0,"last_seq":3}"#)
        _ = try await ingest.exitStatus()
        ingest = try Child("drivebus-ingest", ["--config", path])
        #expect(await eventually(within: .seconds(20)) { (try? await http("GET", base + "/healthz").status) == 200 })
        // A heartbeat from the new process: its publisher has the subscription again.
        let restartedPID = ingest.pid
        #expect(await next(&messages, of: client) {
            $0.topic == "svc.heartbeat.ingest" && (try? $0.decode(Heartbeat.self))?.pid == restartedPID
        } != nil)
        let afterRestart = try BusJSON.decode(ReplayReply.self, from: try await client.loop.request(
            ZMQEndpoint(config.layout.rpcEndpoint(.ingest)), body: Array(#"{"op":"replay","from_seq":3}"#.utf8), timeout: .seconds(5)))
        #expect(afterRestart.lastSeq == 3)
        #expect(afterRestart.messages.map(\.payload) == [Fix(seq: 3, device: "car", time: date("2025-06-01T12:00:00.123Z"), lat: 48.2, lon: 16.37, speedMps: 13.5, source: .api)])

        // Bulk import through ingest: counts, then a re-import that adds nothing.
        let gpx = fixtures.appendingPathComponent("car_vienna_osm_1hz.gpx").path
        let imported = try await run("drivebus", ["import", "--config", path, "--device", "car", gpx])
        #expect(imported.status == 0, "\(imported.stderr)")
        #expect(imported.stdout == "\(gpx): 1525 points, 1525 imported, 0 already there, 0 refused, 0 without a time\n")
        let again = try await run("drivebus", ["import", "--config", path, "--device", "car", gpx])
        #expect(again.stdout == "\(gpx): 1525 points, 0 imported, 1525 already there, 0 refused, 0 without a time\n")
        let done = try #require(await next(&messages, of: client) { $0.topic == "import.finished.car" })
        #expect(try done.decode(ImportFinished.self) == ImportFinished(seq: 1529, device: "car", file: "car_vienna_osm_1hz.gpx", fixes: 1525))
        // Import is local and trusted: a device it names that does not exist is created.
        let unknown = try await run("drivebus", ["import", "--config", path, "--device", "nobody", gpx])
        #expect(unknown.status == 0, "\(unknown.stderr)")
        #expect(unknown.stdout.hasPrefix("drivebus import: created device \"nobody\""))
        #expect(unknown.stdout.hasSuffix("\(gpx): 1525 points, 1525 imported, 0 already there, 0 refused, 0 without a time\n"))
        let invalid = try await run("drivebus", ["import", "--config", path, "--device", "no body", gpx])
        #expect(invalid.status != 0 && invalid.stderr.contains("--device"))

        // A file with an error stops there; what came before it stays, and the mended file adds the rest.
        let csvPath = dir.path + "/broken.csv"
        let good = (0..<3).map { "2025-07-01T10:00:0\($0)Z,48.2,16.3\($0)" }
        try (["time,lat,lon"] + good + ["2025-07-01T10:00:09Z,north,16.4", "2025-07-01T10:00:10Z,48.3,16.4"]).joined(separator: "\n")
            .write(toFile: csvPath, atomically: true, encoding: .utf8)
        let broken = try await run("drivebus", ["import", "--config", path, "--device", "car", "--batch", "2", csvPath])
        #expect(broken.status == 1)
        #expect(broken.stdout.hasPrefix("\(csvPath): line 5: "), "\(broken.stdout)")
        #expect(broken.stdout.hasSuffix("  stopped there: 3 points before it, 3 imported, 0 already there, 0 refused; they stay\n"), "\(broken.stdout)")
        try (["time,lat,lon"] + good + ["2025-07-01T10:00:09Z,48.25,16.4", "2025-07-01T10:00:10Z,48.3,16.4"]).joined(separator: "\n")
            .write(toFile: csvPath, atomically: true, encoding: .utf8)
        let mended = try await run("drivebus", ["import", "--config", path, "--device", "car", csvPath])
        #expect(mended.stdout == "\(csvPath): 5 points, 2 imported, 3 already there, 0 refused, 0 without a time\n", "\(mended.stdout)")

        await client.shutdown()
        ingest.signal(SIGTERM)
        bus.signal(SIGTERM)
        #expect(try await ingest.exitStatus() == 0)
        #expect(try await bus.exitStatus() == 0)
    }
}
