import Crypto
import DrivebusConfiguration
import DrivebusKit
import DrivebusTestSupport
import Foundation
import GRDB
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
        try await self.init(receiverURL: receiver.url, retries: retries)
    }

    init(receiverURL: String, retries: Int = 100, yardMaxAgeS: Double = 120) async throws {
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
                max_age_s: 120
                webhook:
                  url: "\(receiverURL)?key=url-secret-4e1d90"
                  headers: {X-Api-Key: api-key-7f3a9c21, Authorization: "Bearer bearer-secret-5b82e7"}
                  body: '{"gate":"{{gate}}","device":"{{device}}","time":"{{time}}"}'
                  secret: hmac-secret-xyz
                  timeout_s: 2
                  retries: \(retries)
              - id: yard-gate
                zone: yard
                max_age_s: \(yardMaxAgeS)
                webhook: {url: "\(receiverURL)"}
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
        #expect(call.method == "POST" && call.path == "/open?key=url-secret-4e1d90")
        #expect(call.body == #"{"gate":"main-gate","device":"car","time":"\#(RFC3339.format(enter!.time))"}"#)
        #expect(call.headers["idempotency-key"] == "main-gate:car:\(seq)")
        #expect(call.headers["x-api-key"] == "api-key-7f3a9c21")
        #expect(call.headers["authorization"] == "Bearer bearer-secret-5b82e7")
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

        // No secret at rest: not the device tokens, the URL's key, the headers or the HMAC secret,
        // in any file under the state directory (journal, event journals, checkpoints, outbox).
        let secrets = ["car-token-0123456789", "van-token-0123456789", "url-secret-4e1d90", "api-key-7f3a9c21", "bearer-secret-5b82e7", "hmac-secret-xyz"]
        let files = try #require(FileManager.default.subpaths(atPath: harness.config.stateDir))
        var read = 0
        for file in files {
            let path = harness.config.stateDir + "/" + file
            guard let data = FileManager.default.contents(atPath: path) else { continue }
            read += 1
            for secret in secrets { #expect(data.firstRange(of: Data(secret.utf8)) == nil, "\(secret) is in \(file)") }
        }
        #expect(read >= 5, "state files read: \(files)")
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
        // Backoff: 0.25 s, then 0.5 s (doubling to a 2 s cap).
        if calls.count == 3 {
            #expect(calls[1].at.timeIntervalSince(calls[0].at) >= 0.22)
            #expect(calls[2].at.timeIntervalSince(calls[1].at) >= 0.47)
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

    @Test func aReceiverDownForAMinuteGetsItsPendingCallWithinFiveSecondsOfItsReturnAndStaleOnesAreDeadLettered() async throws {
        // Nothing listens on the receiver's port: every attempt is refused.
        let port = freePort()
        let harness = try await GateHarness(receiverURL: "http://127.0.0.1:\(port)/open", yardMaxAgeS: 30)
        let outage = ContinuousClock.now
        _ = try await harness.drive(to: (48.2, 16.37), from: 200, through: 0, endAgo: 1)
        _ = try await harness.drive(to: (48.3, 16.37), from: 200, through: 0, endAgo: 1, token: "van-token-0123456789")
        #expect(await eventually(within: .seconds(10)) {
            let calls = (try? await harness.outbox()) ?? []
            return calls.count == 2 && calls.allSatisfy { ($0["attempts"] as? Int ?? 0) >= 2 }
        }, "both calls are in the outbox and being retried")
        // The outage is the scenario: a minute without a receiver.
        try await Task.sleep(until: outage + .seconds(60))
        let receiver = try WebhookReceiver(statuses: [200], port: port)
        let back = Date()
        #expect(await eventually(within: .seconds(10)) { receiver.received.count == 1 })
        let call = try #require(receiver.received.first)
        print("gate call delivered \(call.at.timeIntervalSince(back)) s after the receiver came back")
        #expect(call.at.timeIntervalSince(back) <= 5, "delivered \(call.at.timeIntervalSince(back)) s after the receiver came back")
        #expect(call.headers["idempotency-key"]?.hasPrefix("main-gate:car:") == true)
        var calls: [[String: Any]] = []
        #expect(await eventually(within: .seconds(10)) {
            calls = (try? await harness.outbox()) ?? []
            return Set(calls.compactMap { $0["state"] as? String }) == ["delivered", "expired"]
        })
        // The yard gate's call, older than its max_age_s of 30 s, was never sent: dead-lettered,
        // with a gate.expired event in the service's event journal.
        let expired = try #require(calls.first { $0["state"] as? String == "expired" })
        #expect(expired["gate"] as? String == "yard-gate")
        let client = BusClient(settings: harness.config.process, name: "test-dead-letters")
        let deadLetters = try await client.loop.request(
            ZMQEndpoint(harness.config.layout.rpcEndpoint(.geofence)), body: Array(#"{"op":"dead_letters"}"#.utf8), timeout: .seconds(3))
        #expect(String(decoding: deadLetters, as: UTF8.self).contains(#""gate":"yard-gate""#))
        let journal = try await client.loop.request(
            ZMQEndpoint(harness.config.layout.rpcEndpoint(.geofence)), body: Array(#"{"op":"events","from_seq":1}"#.utf8), timeout: .seconds(3))
        #expect(String(decoding: journal, as: UTF8.self).contains(#""type":"gate.expired","device":"van""#))
        await client.shutdown()
        // Each call once: the receiver saw one request, and the outbox holds one delivered row.
        #expect(receiver.received.count == 1)
        try await harness.stop()
        receiver.stop()
    }

    @Test func anOutboxWriteThatFailsOnceLosesNoGateCall() async throws {
        let receiver = try WebhookReceiver(statuses: [200])
        let harness = try await GateHarness(receiver: receiver)
        // Another process holds the outbox's write lock (a backup tool, a stuck writer): geofence's
        // write fails, so it must not checkpoint past the step, and stops.
        let outboxPath = harness.config.layout.dataDir + "/outbox.sqlite"
        let holder = try DatabaseQueue(path: outboxPath)
        let release = DispatchSemaphore(value: 0)
        await withCheckedContinuation { (held: CheckedContinuation<Void, Never>) in
            // A thread of its own holds the transaction open until released.
            Thread {
                try? holder.inTransaction(.immediate) { _ in
                    held.resume()
                    release.wait()
                    return .commit
                }
            }.start()
        }
        _ = try await harness.drive(to: (48.2, 16.37), from: 200, through: 0, endAgo: 1)
        #expect(try await harness.processes[2].exitStatus(within: .seconds(20)) == 1, "geofence stops when its outbox cannot be written")
        #expect(receiver.received.isEmpty)
        release.signal()
        _ = try await holder.read { _ in }  // the transaction is over once the queue is free
        try holder.close()
        // The supervisor restarts it; the journal replays the step, which asks for the call again.
        let restarted = try Child("drivebus-geofence", ["--config", harness.path])
        #expect(await eventually(within: .seconds(15)) { receiver.received.count == 1 })
        var outbox: [[String: Any]] = []
        #expect(await eventually(within: .seconds(10)) {
            outbox = (try? await harness.outbox()) ?? []
            return outbox.first?["state"] as? String == "delivered"
        })
        #expect(outbox.count == 1 && receiver.received.count == 1)
        restarted.signal(SIGTERM)
        #expect(try await restarted.exitStatus() == 0)
        for child in harness.processes.prefix(2).reversed() { child.signal(SIGTERM) }
        for child in harness.processes.prefix(2) { _ = try await child.exitStatus() }
        receiver.stop()
    }
}
