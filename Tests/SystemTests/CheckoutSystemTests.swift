import DrivebusConfiguration
import DrivebusKit
import DrivebusTestSupport
import Foundation
import Testing

/// Check-in, motion and fixes through the real ingest HTTP endpoints; `taxi.checkout` off the bus.
@Suite(.serialized) struct CheckoutSystemTests {
    @Test func aRiderIsCheckedOutWhenTheyWalkAwayAndOnlyOnce() async throws {
        let system = try await RiderSystem()
        let (path, config, base, token, client) = (system.path, system.config, system.base, RiderSystem.token, system.client)
        let (bus, ingest) = (system.bus, system.ingest)
        var checkout = system.checkout
        var events = try await joinedSubscription(client, ["taxi.checkout."], heartbeatsFrom: [.checkout])

        let checkin = Date(timeIntervalSince1970: (Date().timeIntervalSince1970 / 60).rounded(.down) * 60 - 3600)
        func at(_ seconds: Double) -> String { RFC3339.format(checkin.addingTimeInterval(seconds)) }
        #expect(try await http("POST", base + "/api/v1/taxi/checkin", token: token, body: Data(#"{"time":"\#(at(0))"}"#.utf8)).status == 200)
        // Walking to the taxi (inside the grace period), the ride, a short stop, then the walk away.
        let motion = """
            {"samples":[
              {"start":"\(at(-30))","activity":"walking","confidence":"high"},
              {"start":"\(at(20))","activity":"automotive","confidence":"high"},
              {"start":"\(at(400))","activity":"walking","confidence":"medium"},
              {"start":"\(at(420))","activity":"automotive","confidence":"high"},
              {"start":"\(at(900))","activity":"walking","confidence":"high"},
              {"start":"\(at(1000))","activity":"stationary","confidence":"high"}]}
            """
        let fixes = (0..<10).map { #"{"time":"\#(at(Double($0) * 100))","lat":\#(48.2 + Double($0) * 0.005),"lon":16.37,"speed_mps":12}"# }
        #expect(try await http("POST", base + "/api/v1/fixes", token: token, body: Data(#"{"fixes":[\#(fixes.joined(separator: ","))]}"#.utf8)).status == 200)
        #expect(try await http("POST", base + "/api/v1/motion", token: token, body: Data(motion.utf8)).status == 200)

        let message = try #require(await next(&events, of: client) { $0.topic.hasPrefix("taxi.checkout.") })
        #expect(message.topic == "taxi.checkout.rider")
        #expect(message.header.id == "taxi.checkout-rider-1")
        let payload = try message.decode(TaxiCheckout.self)
        #expect(payload.checkinTime == checkin)
        #expect(payload.checkoutTime == checkin.addingTimeInterval(900))
        #expect(payload.reason == .walking)
        #expect(payload.confidence == .high)
        #expect(payload.rideS == 900)

        // Killed and restarted, the service replays from its checkpoint and publishes nothing new.
        checkout.signal(SIGKILL)
        _ = try await checkout.exitStatus()
        checkout = try Child("drivebus-checkout", ["--config", path])
        try await waitUntilLive(.checkout, config: config)
        var restarted: HealthReply?
        _ = await eventually(within: .seconds(20)) {
            restarted = try? await client.call(.checkout, RPCRequestHead(op: "health"), as: HealthReply.self, timeout: .milliseconds(300))
            return restarted?.lastSeq["journal"] == 17
        }
        #expect(restarted?.lastSeq["journal"] == 17)
        // Every check-out is journaled before it is published, and one derived again after a
        // restart is not journaled twice: the service's event journal still holds exactly one.
        #expect(restarted?.lastSeq["events"] == 1)
        let journal = try await client.call(.checkout, EventsQuery(fromSeq: 1), as: EventsQuery.Page.self)
        #expect(journal.events.map(\.id) == ["taxi.checkout-rider-1"])
        // On `events`, joined before the restart, nothing but that one check-out was published.
        let restartedPID = checkout.pid
        var seen: [BusMessage] = []
        #expect(await next(&events, of: client) { message in
            if message.topic.hasPrefix("taxi.checkout.") { seen.append(message) }
            guard message.topic == "svc.heartbeat.checkout", let beat = try? message.decode(Heartbeat.self) else { return false }
            return beat.pid == restartedPID && beat.status == "ok"
        } != nil)
        #expect(seen.allSatisfy { $0.header.id == "taxi.checkout-rider-1" }, "a second, different check-out: \(seen.map(\.header.id))")

        await client.shutdown()
        for child in [checkout, ingest, bus] { child.signal(SIGTERM) }
        for child in [checkout, ingest, bus] { #expect(try await child.exitStatus() == 0, "\(child.stderr)") }
    }

    /// A service at rest leaves its checkpoint alone: ticks that decide nothing are redone after
    /// a restart anyway. A message applied is saved within the checkpoint interval, what the
    /// ticks changed is saved at shutdown, and a ride's growing silence as it grows.
    @Test func aServiceAtRestDoesNotRewriteItsCheckpoint() async throws {
        let system = try await RiderSystem()
        let (dir, path, config, base, token, client) = (system.dir, system.path, system.config, system.base, RiderSystem.token, system.client)
        let (bus, ingest, checkout) = (system.bus, system.ingest, system.checkout)
        var beats = try await joinedSubscription(client, [], heartbeatsFrom: [.checkout])

        let checkpoint = "\(dir.path)/state/data/checkout.checkpoint.json"
        struct Saved: Decodable { let lastSeq: UInt64 }
        // The file's bytes (its core holds the clock of the last tick) and its inode (each save
        // renames a new file over the old one).
        func saved() -> (seq: UInt64, bytes: Data, file: Int)? {
            guard let data = FileManager.default.contents(atPath: checkpoint),
                  let file = (try? FileManager.default.attributesOfItem(atPath: checkpoint))?[.systemFileNumber] as? Int,
                  let seq = try? JSONDecoder().decode(Saved.self, from: data).lastSeq else { return nil }
            return (seq, data, file)
        }
        func post(_ seconds: Double) async throws -> Int {
            let fix = #"{"fixes":[{"time":"\#(RFC3339.format(Date().addingTimeInterval(seconds - 60)))","lat":48.2,"lon":16.37}]}"#
            return try await http("POST", base + "/api/v1/fixes", token: token, body: Data(fix.utf8)).status
        }
        /// Waits until the service's heartbeats show `seconds` more of its life: ticks come once
        /// a second, and so do checkpoint rounds.
        func quiet(for seconds: Double) async -> Bool {
            let from = Date()
            return await next(&beats, of: client) { $0.topic == "svc.heartbeat.checkout" && $0.header.time > from.addingTimeInterval(seconds) } != nil
        }

        #expect(try await post(0) == 200)
        #expect(await eventually(within: .seconds(20)) { saved()?.seq == 1 })
        let first = try #require(saved())
        #expect(await quiet(for: 4))
        #expect(saved()?.bytes == first.bytes && saved()?.file == first.file, "the checkpoint was written again with nothing new")

        #expect(try await post(1) == 200)
        #expect(await eventually(within: .seconds(20)) { saved()?.seq == 2 })
        let second = try #require(saved())
        #expect(await quiet(for: 2))
        #expect(saved()?.bytes == second.bytes)

        checkout.signal(SIGTERM)
        #expect(try await checkout.exitStatus() == 0, "\(checkout.stderr)")
        #expect(saved()?.seq == 2)
        #expect(saved()?.bytes != second.bytes, "the ticks since the last message were not saved at shutdown")

        // During a ride each tick adds to its observed silence, which a restart cannot observe
        // again: it is saved as it grows, with no message arriving.
        let restarted = try Child("drivebus-checkout", ["--config", path])
        try await waitUntilLive(.checkout, config: config)
        beats = try await joinedSubscription(client, [], heartbeatsFrom: [.checkout])
        #expect(try await http("POST", base + "/api/v1/taxi/checkin", token: token, body: Data(#"{"time":"\#(RFC3339.format(Date()))"}"#.utf8)).status == 200)
        #expect(await eventually(within: .seconds(20)) { saved()?.seq == 3 })
        let riding = try #require(saved())
        #expect(await quiet(for: 3))
        #expect(saved()?.bytes != riding.bytes, "a ride's silence was not saved while it grew")
        restarted.signal(SIGTERM)
        #expect(try await restarted.exitStatus() == 0, "\(restarted.stderr)")

        await client.shutdown()
        for child in [ingest, bus] { child.signal(SIGTERM) }
        for child in [ingest, bus] { #expect(try await child.exitStatus() == 0, "\(child.stderr)") }
    }
}

/// Bus, ingest and checkout on a temporary state directory, one rider device, heartbeats every
/// 0.2 s; ready once ingest answers.
struct RiderSystem {
    static let token = "rider-token-0123456789"
    let dir = TempDir()
    let path: String
    let config: DrivebusConfig
    let base: String
    let bus: Child
    let ingest: Child
    let checkout: Child
    let client: BusClient

    init() async throws {
        let port = freePort()
        let yaml = """
            state_dir: \(dir.path)/state
            heartbeat_interval_s: 0.2
            devices: [{id: rider, token: \(Self.token)}]
            ingest: {listen: "127.0.0.1:\(port)"}
            """
        path = dir.file("drivebus.yaml", yaml)
        config = try DrivebusConfig.parse(yaml: yaml)
        base = "http://127.0.0.1:\(port)"
        bus = try Child("drivebus-bus", ["--config", path])
        ingest = try Child("drivebus-ingest", ["--config", path])
        checkout = try Child("drivebus-checkout", ["--config", path])
        let base = base
        #expect(await eventually(within: .seconds(20)) { (try? await http("GET", base + "/healthz").status) == 200 })
        client = BusClient(settings: config.process, name: "test")
    }
}

/// The `events` RPC of a service, as a test reads it.
struct EventsQuery: Codable, Sendable {
    var op = "events"
    let fromSeq: UInt64
    enum CodingKeys: String, CodingKey {
        case op
        case fromSeq = "from_seq"
    }

    struct Page: Codable, Sendable {
        struct Event: Codable, Sendable { let seq: UInt64; let id: String; let type: String }
        let events: [Event]
    }
}
