import DrivebusConfiguration
import DrivebusKit
import DrivebusMQTT
import DrivebusTestSupport
import Foundation
import Synchronization
import Testing

/// drivebus-mqtt against a real Mosquitto: OwnTracks in, Home Assistant out, nothing lost when a
/// process or the broker dies.
@Suite(.serialized) struct MQTTSystemTests {
    struct Harness {
        let dir = TempDir()
        let broker: Mosquitto
        let path: String
        let config: DrivebusConfig
        var processes: [ServiceName: Child] = [:]

        init(
            extra: String = "", services: [ServiceName] = [.mqtt], tls: Bool = false,
            zones: String = "[{id: home, circle: {lat: 48.2, lon: 16.37, radius_m: 150}}]"
        ) async throws {
            broker = try await Mosquitto(in: dir.path + "/broker", tls: tls)
            let yaml = """
                state_dir: \(dir.path)/state
                heartbeat_interval_s: 0.2
                devices: [{id: phone, token: phone-token-0123456789, home: home}]
                zones: \(zones)
                ingest: {listen: "127.0.0.1:\(freePort())"}
                stats: {listen: "127.0.0.1:\(freePort())"}
                \(broker.configSection)
                \(extra)
                """
            path = dir.file("drivebus.yaml", yaml)
            config = try DrivebusConfig.parse(yaml: yaml)
            for service in [ServiceName.bus, .ingest] + services {
                processes[service] = try Child(service.executable, ["--config", path])
                if service == .bus { try await waitUntilLive(.bus, config: config) }
            }
            for service in services { try await waitUntilLive(service, config: config) }
            // Some tests post to ingest's HTTP at once (its listener may come after the bus).
            let health = "http://\(config.ingest.listen)/healthz"
            guard await eventually(within: .seconds(20), { (try? await http("GET", health).status) == 200 }) else {
                throw Timeout(description: "ingest's HTTP did not answer at \(health)")
            }
        }

        mutating func kill(_ service: ServiceName, restart: Bool = true) async throws {
            processes[service]?.signal(SIGKILL)
            _ = try await processes[service]?.exitStatus()
            processes[service] = restart ? try Child(service.executable, ["--config", path]) : nil
        }

        func mqttStatus() async throws -> [String: UInt64] {
            let client = BusClient(settings: config.process, name: "test-status")
            defer { Task { await client.shutdown() } }
            return try await client.call(.mqtt, RPCRequestHead(op: "mqtt_status"), as: MQTTStatus.self, timeout: .seconds(2)).counters
        }

        /// Every journaled record's topic and payload, in seq order.
        func journal() async throws -> [JournalMessage] {
            let client = BusClient(settings: config.process, name: "test-journal")
            var all: [JournalMessage] = []
            while true {
                let page = try await ReplayPage.fetch(from: UInt64(all.count + 1), limit: 10_000, bus: client)
                all += page.messages
                if page.messages.isEmpty || all.count >= Int(page.lastSeq) { break }
            }
            await client.shutdown()
            return all
        }

        func stop() async throws {
            for child in processes.values { child.signal(SIGTERM) }
            for (service, child) in processes { #expect(try await child.exitStatus() == 0, "\(service): \(child.stderr.suffix(2000))") }
            try await broker.stop()
        }
    }

    static func location(_ tst: Int, lat: Double = 48.21, lon: Double = 16.37, battery: Int = 80) -> String {
        #"{"_type":"location","tid":"jp","tst":\#(tst),"lat":\#(lat),"lon":\#(lon),"acc":8,"vel":36,"batt":\#(battery)}"#
    }

    @Test func ownTracksMessagesAreJournaledOnceAndBadOnesCountedWithoutADisconnect() async throws {
        let harness = try await Harness(services: [.mqtt, .stats])
        let phone = try TestMQTT(harness.broker, id: "phone")
        try await phone.connected()
        let messages: [(String, String)] = [
            ("owntracks/jan/phone", Self.location(1_700_000_000)),
            ("owntracks/jan/phone", Self.location(1_700_000_000)),  // the app's resend
            ("owntracks/jan/phone/event", #"{"_type":"transition","tst":1700000005,"event":"leave","desc":"home","lat":48.2,"lon":16.37,"acc":10}"#),
            ("owntracks/jan/phone/event", #"{"_type":"transition","tst":1700000005,"event":"leave","desc":"home","lat":48.2,"lon":16.37,"acc":10}"#),
            ("owntracks/jan/phone", #"{"_type":"lwt","tst":1700000010}"#),
            ("owntracks/jan/phone", "not json at all"),
            ("owntracks/jan/phone", #"{"_type":"location","tst":1700000020,"lat":"north","lon":16.37}"#),
            ("owntracks/jan/phone", String(repeating: "x", count: 10 << 20)),
            ("owntracks/eve/tablet", Self.location(1_700_000_030)),
            ("owntracks/jan/phone", Self.location(1_700_000_040, lat: 48.22)),
        ]
        for (topic, payload) in messages { phone.client.publish(MQTTMessage(topic: topic, text: payload, qos: 1)) }
        // Every message has its outcome: `received` is counted as a group arrives, the rest once
        // ingest has answered for it.
        let settled = await eventually(within: .seconds(30)) {
            guard let counters = try? await harness.mqttStatus() else { return false }
            let outcomes = ["mqtt.accepted", "mqtt.duplicates", "mqtt.ignored", "mqtt.refused"].reduce(0) { $0 + (counters[$1] ?? 0) }
            return counters["mqtt.received"] == UInt64(messages.count) && outcomes == UInt64(messages.count)
        }
        let counters = try await harness.mqttStatus()
        #expect(settled, "\(counters)")
        #expect(counters["mqtt.accepted"] == 3)
        #expect(counters["mqtt.duplicates"] == 2)
        #expect(counters["mqtt.ignored"] == 1)
        #expect(counters["mqtt.refused"] == 4)
        #expect(counters["mqtt.refused.malformed_json"] == 1, "\(counters)")
        #expect(counters["mqtt.refused.invalid_field"] == 1)
        #expect(counters["mqtt.refused.too_large"] == 1)
        #expect(counters["mqtt.refused.unknown_device"] == 1)
        #expect(counters["mqtt.connects"] == 1, "bad input must not cost the connection")
        let journal = try await harness.journal()
        #expect(journal.map(\.topic) == ["fix.phone", "client.transition.phone", "fix.phone"])
        let fix = try BusJSON.decode(Fix.self, from: journal[0].payload)
        #expect(fix.lat == 48.21 && fix.speedMps == 10 && fix.battery == 0.8 && fix.source == .owntracks && fix.meta?["tid"] == "jp")
        // The counters reach /metrics through the heartbeat, and `drivebus status` asks for them.
        let metricsURL = "http://\(harness.config.stats.listen)/metrics"
        #expect(await eventually(within: .seconds(10)) {
            let metrics = (try? await http("GET", metricsURL))?.body ?? ""
            return metrics.contains(#"drivebus_mqtt_refused_by_code{code="too_large"} 1"#) && metrics.contains("drivebus_mqtt_accepted 3")
        })
        let status = try await run("drivebus", ["status", "--config", harness.path])
        #expect(status.stdout.contains(
            "MQTT: connected to 127.0.0.1:\(harness.broker.port); received 10, accepted 3, duplicates 2, ignored 1, refused 4 "
                + "(invalid_field 1, malformed_json 1, too_large 1, unknown_device 1)"), "\(status.stdout)")
        try await harness.stop()
    }

    @Test func homeAssistantDiscoversDevicesSeesStatesAndAvailability() async throws {
        var harness = try await Harness(services: [.mqtt, .stats])
        let homeAssistant = try TestMQTT(harness.broker, id: "home-assistant", subscribe: ["homeassistant/#", "drivebus/#"])
        try await homeAssistant.connected()
        let tracker = try #require(await homeAssistant.message("homeassistant/device_tracker/drivebus_phone/location/config"))
        let config = try #require(try JSONSerialization.jsonObject(with: Data(tracker.payload)) as? [String: Any])
        #expect(config["json_attributes_topic"] as? String == "drivebus/phone/location")
        #expect(config["unique_id"] as? String == "drivebus_phone_location")
        #expect(config["availability_topic"] as? String == "drivebus/status")
        #expect(tracker.retain)
        #expect(await homeAssistant.message("homeassistant/binary_sensor/drivebus_phone/zone_home/config") != nil)
        #expect(await homeAssistant.message("homeassistant/sensor/drivebus_phone/today_away/config") != nil)
        #expect(await homeAssistant.message("drivebus/status") { $0.text == "online" } != nil)

        // A fix over MQTT becomes the tracker's position and battery.
        let phone = try TestMQTT(harness.broker, id: "phone")
        try await phone.connected()
        phone.client.publish(MQTTMessage(topic: "owntracks/jan/phone", text: Self.location(1_700_000_000, lat: 48.25, battery: 57), qos: 1))
        let location = try #require(await homeAssistant.message("drivebus/phone/location") { $0.text.contains("48.25") })
        #expect(location.text == #"{"gps_accuracy":8,"latitude":48.25,"longitude":16.37,"speed_kmh":36,"time":"2023-11-14T22:13:20.000Z"}"#)
        #expect(await homeAssistant.message("drivebus/phone/battery") { $0.text == "57" } != nil)
        // Today's figures come from the stats service (a UTC day).
        let today = String(RFC3339.format(Date()).prefix(10))
        #expect(await homeAssistant.message("drivebus/phone/today")?.text == #"{"away_s":0,"date":"\#(today)","distance_km":0}"#)

        // A device added with `drivebus device add` gets its entities; removed, they go.
        let added = try await run("drivebus", ["device", "add", "tablet", "--app", "owntracks", "--config", harness.path])
        #expect(added.status == 0, "\(added.stderr)")
        // With a broker configured, the setup says what to enter in OwnTracks' MQTT mode too.
        let port = harness.broker.port
        #expect(added.stdout.contains("Or in MQTT mode (drivebus reads 127.0.0.1:\(port)): Mode MQTT, Host 127.0.0.1, Port \(port),\n"), "\(added.stdout)")
        #expect(added.stdout.contains("make its topic owntracks/<user>/tablet (DeviceID tablet)."))
        // Its phone is heard at once, before the periodic reload: that message reloads the
        // devices on the client's thread, and the new device's entities must come all the same.
        phone.client.publish(MQTTMessage(topic: "owntracks/jan/tablet", text: Self.location(1_700_000_100, lat: 48.26, battery: 80), qos: 1))
        #expect(await homeAssistant.message("drivebus/tablet/location") { $0.text.contains("48.26") } != nil)
        #expect(await homeAssistant.message("homeassistant/device_tracker/drivebus_tablet/location/config") { !$0.payload.isEmpty } != nil)
        let removed = try await run("drivebus", ["device", "remove", "tablet", "--config", harness.path])
        #expect(removed.status == 0, "\(removed.stderr)")
        #expect(await homeAssistant.message("homeassistant/device_tracker/drivebus_tablet/location/config") { $0.payload.isEmpty } != nil)
        #expect(await homeAssistant.message("homeassistant/sensor/drivebus_tablet/battery/config") { $0.payload.isEmpty } != nil)

        // Killed, drivebus is unavailable (the will); back, it is online again.
        try await harness.kill(.mqtt)
        #expect(await eventually(within: .seconds(15)) { homeAssistant.texts("drivebus/status").suffix(2) == ["offline", "online"] })
        try await harness.stop()
    }

    @Test func anImportedHistoryMovesNoStateButItsEventsAreCopied() async throws {
        // The Vienna GPX (a real drive) ends in `arrival`: imported as a new phone's history (as
        // a Takeout is at setup), it makes a trip, a score and a crossing into `arrival`, all of
        // them history. No state of Home Assistant's changes for them; the events are copied
        // under drivebus/events/ with their flag. (A phone's history imported after its live
        // fixes makes no trips: the trip segmenter skips fixes older than the newest.)
        var harness = try await Harness(
            services: [.mqtt, .trips, .geofence, .scorer],
            zones: "[{id: home, circle: {lat: 48.2, lon: 16.37, radius_m: 150}}, {id: arrival, circle: {lat: 48.208, lon: 16.39, radius_m: 300}}]")
        let homeAssistant = try TestMQTT(harness.broker, id: "home-assistant", subscribe: ["drivebus/#"])
        try await homeAssistant.connected()
        let gpx = fixtures.appendingPathComponent("car_vienna_osm_1hz.gpx").path
        let imported = try await run("drivebus", ["import", "--config", harness.path, "--device", "phone", gpx])
        #expect(imported.status == 0, "\(imported.stderr)")
        for topic in ["trip/started", "trip/ended", "drive/scored", "geofence/enter"] {
            let copy = await homeAssistant.message("drivebus/events/\(topic)/phone", within: .seconds(30))
            #expect(copy?.text.contains(#""imported":true"#) == true, "\(topic): \(copy?.text ?? "nothing")")
        }
        for state in ["trip", "last_trip", "last_score", "zone/arrival"] {
            #expect(homeAssistant.texts("drivebus/phone/\(state)").isEmpty, "\(state): \(homeAssistant.texts("drivebus/phone/\(state)"))")
        }
        #expect(homeAssistant.texts("drivebus/phone/location").isEmpty)

        // The live phone is news: its position, and its leaving the zone where the history ended.
        let phone = try TestMQTT(harness.broker, id: "phone")
        try await phone.connected()
        phone.client.publish(MQTTMessage(topic: "owntracks/jan/phone", text: Self.location(Int(Date().timeIntervalSince1970), lat: 48.25), qos: 1))
        #expect(await homeAssistant.message("drivebus/phone/zone/arrival") { $0.text == "OFF" } != nil)
        #expect(await homeAssistant.message("drivebus/phone/location")?.text.contains("48.25") == true)
        #expect(homeAssistant.texts("drivebus/phone/location").count == 1)
        try await harness.stop()
    }

    @Test func overTLSWithAClientCertificate() async throws {
        let harness = try await Harness(tls: true)
        let phone = try TestMQTT(harness.broker, id: "phone")
        try await phone.connected()
        phone.client.publish(MQTTMessage(topic: "owntracks/jan/phone", text: Self.location(1_700_000_000), qos: 1))
        #expect(await eventually(within: .seconds(15)) { (try? await harness.journal())?.count == 1 })
        #expect(try await harness.mqttStatus()["mqtt.connects"] == 1)
        try await harness.stop()
    }

    @Test func withTheBrokerDownItWaitsWithoutSpinningAndComesBack() async throws {
        let harness = try await Harness()
        try await harness.broker.stop()
        // A fix arrives: its state is queued for the broker, which wakes the client's backoff.
        let url = "http://\(harness.config.ingest.listen)/owntracks"
        #expect(try await http("POST", url, token: "phone-token-0123456789", body: Data(Self.location(1_700_000_001).utf8)).status == 200)
        #expect(await eventually(within: .seconds(5)) { (try? await harness.mqttStatus())?["mqtt.connects"] == 1 })
        // A measuring window, not a wait for something: the client must stay idle through it.
        let cpuBefore = cpuSecondsOf(harness.processes[.mqtt]!.pid)
        try await Task.sleep(for: .seconds(2))
        let spent = cpuSecondsOf(harness.processes[.mqtt]!.pid) - cpuBefore
        #expect(spent < 0.2, "drivebus-mqtt used \(spent) s of CPU in 2 s while the broker was down")
        try await harness.broker.start()
        let homeAssistant = try TestMQTT(harness.broker, id: "home-assistant", subscribe: ["drivebus/phone/location"])
        #expect(await homeAssistant.message("drivebus/phone/location") != nil)
        try await harness.stop()
    }

    @Test func nothingIsLostOrDoubledWhenAProcessOrTheBrokerDiesMidStream() async throws {
        var harness = try await Harness()
        let phone = try TestMQTT(harness.broker, id: "phone", persistent: true)
        try await phone.connected()
        let total = 3000
        let start = 1_700_000_000
        // The phone publishes steadily while things die around it.
        let publishing = Task {
            for index in 0..<total {
                phone.client.publish(MQTTMessage(topic: "owntracks/jan/phone", text: Self.location(start + index, lat: 48 + Double(index) * 1e-5), qos: 1))
                if index % 50 == 49 { try? await Task.sleep(for: .milliseconds(20)) }
            }
        }
        func journaled() async -> Int { (try? await harness.journal().count) ?? 0 }
        #expect(await eventually(within: .seconds(30)) { await journaled() >= 300 })
        try await harness.kill(.mqtt)
        #expect(await eventually(within: .seconds(30)) { await journaled() >= 900 })
        try await harness.kill(.ingest)
        #expect(await eventually(within: .seconds(30)) { await journaled() >= 1500 })
        try await harness.broker.stop()
        try await harness.broker.start()
        await publishing.value
        #expect(await eventually(within: .seconds(60)) { await journaled() >= total })
        let journal = try await harness.journal()
        let times = try journal.map { try BusJSON.decode(Fix.self, from: $0.payload).time }
        #expect(journal.count == total, "\(journal.count) records for \(total) messages")
        #expect(Set(times).count == total, "every message exactly once")
        try await harness.stop()
    }
}

/// The test's own MQTT client: the phone that publishes, or Home Assistant that listens.
final class TestMQTT: Sendable {
    let client: MQTTClient
    private let inbox: Inbox

    final class Inbox: Sendable {
        let messages = Mutex<[MQTTMessage]>([])
        let connects = Atomic<Int>(0)
    }

    init(_ broker: Mosquitto, id: String, subscribe: [String] = [], persistent: Bool = false) throws {
        var configuration = MQTTClient.Configuration(host: "127.0.0.1", port: broker.port, clientID: id)
        configuration.username = broker.username
        configuration.password = broker.password
        configuration.persistentSession = persistent
        configuration.subscriptions = subscribe.map { .init($0, qos: 1) }
        if broker.tls {
            configuration.tls = .init(caFile: broker.directory + "/ca.pem", certFile: broker.directory + "/client.pem", keyFile: broker.directory + "/client.key")
        }
        let inbox = Inbox()
        self.inbox = inbox
        client = try MQTTClient(configuration, onEvent: { event in
            if case .connected = event { inbox.connects.add(1, ordering: .relaxed) }
        }) { messages, _ in
            inbox.messages.withLock { $0 += messages }
            return true
        }
    }

    deinit {
        let client = client
        Task { await client.shutdown() }
    }

    func connected() async throws {
        guard await eventually(within: .seconds(10), { inbox.connects.load(ordering: .relaxed) > 0 }) else {
            throw Timeout(description: "the test's MQTT client did not connect")
        }
    }

    /// Every payload on `topic` so far, in order.
    func texts(_ topic: String) -> [String] { inbox.messages.withLock { $0.filter { $0.topic == topic }.map(\.text) } }

    /// The first message on `topic` that `matches`, waiting up to 15 s for it.
    func message(_ topic: String, within timeout: Duration = .seconds(15), where matches: @escaping @Sendable (MQTTMessage) -> Bool = { _ in true }) async -> MQTTMessage? {
        var found: MQTTMessage?
        _ = await eventually(within: timeout) {
            found = inbox.messages.withLock { $0.first { $0.topic == topic && matches($0) } }
            return found != nil
        }
        return found
    }
}

extension MQTTMessage {
    var text: String { String(decoding: payload, as: UTF8.self) }
}
