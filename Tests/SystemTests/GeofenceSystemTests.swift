import Crypto
import DrivebusConfiguration
import DrivebusKit
import DrivebusTestSupport
import Foundation
import Testing

/// The real bus, ingest and geofence, a real HTTP receiver for the gate.
struct GateHarness {
    let dir = TempDir()
    let path: String
    let config: DrivebusConfig
    let base: String
    let token = "car-token-0123456789"
    let processes: [Child]

    init(receiver: WebhookReceiver, retries: Int = 3) async throws {
        let port = freePort()
        let yaml = """
            state_dir: \(dir.path)/state
            heartbeat_interval_s: 0.2
            devices: [{id: car, token: \(token)}, {id: van, token: van-token-0123456789}]
            ingest: {listen: "127.0.0.1:\(port)"}
            zones:
              - {id: gate, circle: {lat: 48.2, lon: 16.37, radius_m: 40}}
              - {id: yard, circle: {lat: 48.3, lon: 16.37, radius_m: 40}}
            gates:
              - id: main-gate
                zone: gate
                devices: [car]
                cooldown_s: 300
                max_age_s: 60
                webhook:
                  url: \(receiver.url)
                  headers: {X-Api-Key: key-123}
                  body: '{"gate":"{{gate}}","device":"{{device}}","time":"{{time}}"}'
                  secret: hmac-secret-xyz
                  timeout_s: 2
                  retries: \(retries)
              - id: yard-gate
                zone: yard
                webhook: {url: "\(receiver.url)"}
            """
        path = dir.file("drivebus.yaml", yaml)
        config = try DrivebusConfig.parse(yaml: yaml)
        base = "http://127.0.0.1:\(port)"
        processes = [
            try Child("drivebus-bus", ["--config", path]), try Child("drivebus-ingest", ["--config", path]),
            try Child("drivebus-geofence", ["--config", path]),
        ]
        let base = base
        #expect(await eventually(within: .seconds(20)) { (try? await http("GET", base + "/healthz").status) == 200 })
        try await waitUntilLive(.geofence, config: config)
    }

    /// Fixes along a line through a zone's centre, one a second, ending `endAgo` seconds ago.
    func drive(to center: (lat: Double, lon: Double), from metresSouth: Double, through metresNorth: Double, endAgo: Double, token: String? = nil) async throws -> Int {
        let count = Int((metresSouth + metresNorth) / 10)
        let end = (Date().timeIntervalSince1970 - endAgo).rounded(.down)
        let fixes = (0...count).map { index -> String in
            let north = -metresSouth + Double(index) * 10
            let time = RFC3339.format(Date(timeIntervalSince1970: end - Double(count - index)))
            return #"{"time":"\#(time)","lat":\#(center.lat + north / 111_195),"lon":\#(center.lon),"speed_mps":10}"#
        }
        let response = try await http("POST", base + "/api/v1/fixes", token: token ?? self.token, body: Data(#"{"fixes":[\#(fixes.joined(separator: ","))]}"#.utf8))
        #expect(response.status == 200, "\(response.body)")
        return fixes.count
    }

    func outbox() async throws -> [[String: Any]] {
        let client = BusClient(settings: config.process, name: "test-outbox")
        defer { Task { await client.shutdown() } }
        let reply = try await client.loop.request(ZMQEndpoint(config.layout.rpcEndpoint(.geofence)), body: Array(#"{"op":"outbox"}"#.utf8), timeout: .seconds(3))
        return (try JSONSerialization.jsonObject(with: Data(reply)) as? [String: Any])?["calls"] as? [[String: Any]] ?? []
    }

    func stop() async throws {
        for child in processes.reversed() { child.signal(SIGTERM) }
        for child in processes { _ = try await child.exitStatus() }
    }
}

@Suite(.serialized) struct GeofenceSystemTests {
    @Test func aDriveThroughTheGateMakesExactlyOneSignedCall() async throws {
        let receiver = try WebhookReceiver(statuses: [200])
        let harness = try await GateHarness(receiver: receiver)
        let client = BusClient(settings: harness.config.process, name: "test")
        var events = try await joinedSubscription(client, ["geofence.", "gate."], heartbeatsFrom: [.geofence])

        _ = try await harness.drive(to: (48.2, 16.37), from: 200, through: 0, endAgo: 2)
        #expect(await eventually(within: .seconds(10)) { receiver.received.count == 1 })
        var enter: GeofenceTransition?
        var fired: GateFired?
        while fired == nil, let message = await next(&events, of: client, where: { ["geofence.enter.car", "gate.fired.car"].contains($0.topic) }) {
            if message.topic == "geofence.enter.car" { enter = try message.decode(GeofenceTransition.self) }
            if message.topic == "gate.fired.car" { fired = try message.decode(GateFired.self) }
        }
        let call = try #require(receiver.received.first)
        let seq = try #require(enter?.seq)
        #expect(enter?.zone == "gate")
        #expect(call.method == "POST" && call.path == "/open")
        #expect(call.body == #"{"gate":"main-gate","device":"car","time":"\#(RFC3339.format(enter!.time))"}"#)
        #expect(call.headers["idempotency-key"] == "main-gate:car:\(seq)")
        #expect(call.headers["x-api-key"] == "key-123")
        let mac = HMAC<SHA256>.authenticationCode(for: Data(call.body.utf8), using: SymmetricKey(data: Data("hmac-secret-xyz".utf8)))
        #expect(call.headers["x-drivebus-signature"] == "sha256=" + mac.map { String(format: "%02x", $0) }.joined())
        #expect(fired?.status == 200 && fired?.attempts == 1 && fired?.seq == seq)
        #expect(fired?.idempotencyKey == "main-gate:car:\(seq)")

        // Out and back in within the cooldown: no second call.
        _ = try await harness.drive(to: (48.2, 16.37), from: -400, through: 500, endAgo: 1)
        _ = try await harness.drive(to: (48.2, 16.37), from: 300, through: 0, endAgo: 0)
        // A pass through another gate with fixes two hours old (an import): state, but no call.
        _ = try await harness.drive(to: (48.3, 16.37), from: 200, through: 200, endAgo: 7200, token: "van-token-0123456789")
        let yard = try await next(&events, of: client) { $0.topic == "geofence.enter.van" }?.decode(GeofenceTransition.self)
        #expect(yard?.zone == "yard")
        // Geofence has handled every fix (a heartbeat at ingest's journal head). Every call is
        // written to the outbox before it is sent, so one outbox row means one call, ever.
        let journal = try await client.call(.ingest, RPCRequestHead(op: "health"), as: HealthReply.self).lastSeq["journal"] ?? 0
        #expect(await next(&events, of: client) {
            $0.topic == "svc.heartbeat.geofence" && ((try? $0.decode(Heartbeat.self))?.lastSeq["journal"] ?? 0) >= journal
        } != nil)
        #expect(try await harness.outbox().count == 1)
        #expect(await eventually { receiver.received.count == 1 })
        await client.shutdown()
        try await harness.stop()
        receiver.stop()
    }

    @Test func failuresAreRetriedWithOneIdempotencyKey() async throws {
        let receiver = try WebhookReceiver(statuses: [500, 503, 200])
        let harness = try await GateHarness(receiver: receiver)
        _ = try await harness.drive(to: (48.2, 16.37), from: 200, through: 0, endAgo: 1)
        #expect(await eventually(within: .seconds(15)) { receiver.received.count == 3 })
        var outbox: [[String: Any]] = []
        #expect(await eventually(within: .seconds(20)) {
            outbox = (try? await harness.outbox()) ?? []
            return outbox.first?["state"] as? String == "delivered"
        })
        let calls = receiver.received
        #expect(calls.count == 3)
        #expect(Set(calls.compactMap { $0.headers["idempotency-key"] }).count == 1)
        // Backoff: 0.5 s, then 1 s.
        if calls.count == 3 {
            #expect(calls[1].at.timeIntervalSince(calls[0].at) >= 0.45)
            #expect(calls[2].at.timeIntervalSince(calls[1].at) >= 0.95)
        }
        #expect(outbox.first?["state"] as? String == "delivered")
        #expect(outbox.first?["attempts"] as? Int == 3)
        try await harness.stop()
        receiver.stop()
    }

    @Test func aCallInterruptedByAKillIsDeliveredOnceAfterRestart() async throws {
        // The receiver holds the first request without answering: the call is in the outbox and
        // on the wire when geofence is killed.
        let receiver = try WebhookReceiver(statuses: [nil])
        let harness = try await GateHarness(receiver: receiver, retries: 5)
        _ = try await harness.drive(to: (48.2, 16.37), from: 200, through: 0, endAgo: 1)
        #expect(await eventually(within: .seconds(10)) { receiver.received.count == 1 })
        harness.processes[2].signal(SIGKILL)
        _ = try await harness.processes[2].exitStatus()
        receiver.script([200])
        let restarted = try Child("drivebus-geofence", ["--config", harness.path])
        #expect(await eventually(within: .seconds(15)) { receiver.received.count == 2 })
        var outbox: [[String: Any]] = []
        #expect(await eventually(within: .seconds(20)) {
            outbox = (try? await harness.outbox()) ?? []
            return outbox.first?["state"] as? String == "delivered"
        })
        let calls = receiver.received
        #expect(calls.count == 2)
        #expect(calls.map { $0.headers["idempotency-key"] }.allSatisfy { $0 == calls[0].headers["idempotency-key"] })
        #expect(outbox.count == 1 && outbox.first?["state"] as? String == "delivered")
        restarted.signal(SIGTERM)
        #expect(try await restarted.exitStatus() == 0)
        try await harness.stop()
        receiver.stop()
    }
}
