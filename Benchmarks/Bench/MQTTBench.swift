import ArgumentParser
import DrivebusConfiguration
import DrivebusKit
import DrivebusMQTT
import DrivebusTestSupport
import Foundation
import Synchronization

/// `drivebus-bench mqtt`: a real Mosquitto (Debian's, on a free loopback port, authentication
/// on), the release `drivebus-bus`, `drivebus-ingest` and `drivebus-mqtt`, and two MQTT clients of
/// this process: a phone that publishes OwnTracks locations with QoS 1, and Home Assistant that
/// listens to the state topics.
/// - `mqtt owntracks`: messages/s from the phone's first publish to the last fix durable in the
///   journal (counted as `fix.phone` records in the journal pages ingest publishes after the sync).
/// - `http owntracks`: in the same run, single-fix OwnTracks POSTs to ingest over 16 connections.
/// - `mqtt state latency`: one location at a time, publish → `drivebus/phone/location` received
///   by the Home Assistant client; p50 and p99.
struct MQTTBench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "mqtt", abstract: "Measure OwnTracks over MQTT and Home Assistant state latency.")

    @Option(help: "Messages in the throughput case.")
    var messages = 100_000

    @Option(help: "Requests in the HTTP comparison.")
    var requests = 20_000

    @Option(help: "Locations in the latency case.")
    var samples = 500

    func run() async throws {
        let token = "bench-token-0123456789"
        let brokerDirectory = NSTemporaryDirectory() + "drivebus-bench-mqtt-\(getpid())"
        defer { try? FileManager.default.removeItem(atPath: brokerDirectory) }
        let broker = try await Mosquitto(in: brokerDirectory)
        let system = try await BenchSystem(
            services: [.bus, .ingest, .mqtt], extraConfig: "devices: [{id: phone, token: \(token)}]\n" + broker.configSection)
        defer { system.stop() }
        let bus = BusClient(settings: system.config.process, name: "bench")
        // Fixes counted in the journal pages every follower takes: a subscriber of `fix.` would
        // make ingest publish a message per fix too, which a running system does not.
        var fixes = JournalPageFixes(try await bus.subscribe([JournalPage.type, "svc.heartbeat.ingest"]).makeAsyncIterator())
        while let topic = await fixes.next(), topic != "svc.heartbeat.ingest" {}

        let homeAssistant = try BenchMQTT(broker, id: "home-assistant", subscribe: ["drivebus/phone/location"])
        let phone = try BenchMQTT(broker, id: "phone")
        try await phone.connected()
        try await homeAssistant.connected()
        // drivebus-mqtt announces itself once connected; wait for its subscription to be in place.
        while !(await Self.isConnected(bus)) { try await Task.sleep(for: .milliseconds(50)) }

        let start = 1_763_000_000
        // Latency, on the idle system: publish → Home Assistant's state topic, one at a time.
        var latencies: [Double] = []
        let base = start - samples
        for index in 0..<samples {
            let latitude = 47 + Double(index) * 1e-4
            let sent = ContinuousClock.now
            phone.client.publish(MQTTMessage(
                topic: "owntracks/jan/phone", text: #"{"_type":"location","tst":\#(base + index),"lat":\#(latitude),"lon":16.3,"acc":5}"#, qos: 1))
            let marker = "\"time\":\"\(RFC3339.format(Date(timeIntervalSince1970: Double(base + index))))\""
            guard let arrived = await homeAssistant.arrival(containing: marker, within: .seconds(5)) else {
                throw ValidationError("no state for sample \(index) within 5 s")
            }
            latencies.append(seconds(sent.duration(to: arrived)) * 1000)
        }
        latencies.sort()
        func percentile(_ p: Double) -> Double { (latencies[min(latencies.count - 1, Int(Double(latencies.count) * p))] * 100).rounded() / 100 }
        report(["name": "mqtt state latency", "samples": samples, "p50_ms": percentile(0.5), "p99_ms": percentile(0.99), "max_ms": percentile(1)])

        // The latency phase's fixes are on the bus already: count past them.
        var latencyFixes = 0
        while latencyFixes < samples, let topic = await fixes.next() {
            if topic == "fix.phone" { latencyFixes += 1 }
        }

        // Throughput: the phone publishes as fast as the library takes it.
        let payloads = (0..<messages).map { index in
            #"{"_type":"location","tid":"ph","tst":\#(start + index),"lat":48.2,"lon":\#(16.3 + Double(index) * 1e-6),"acc":5,"vel":48,"batt":80}"#
        }
        let cpuBefore = system.cpuSeconds().merging(["mosquitto": cpuSecondsOf(broker.pid ?? 0)]) { a, _ in a }
        let started = ContinuousClock.now
        phone.client.publish(payloads.map { MQTTMessage(topic: "owntracks/jan/phone", text: $0, qos: 1) })
        var received = 0
        while received < messages, let topic = await fixes.next() {
            if topic == "fix.phone" { received += 1 }
        }
        let elapsed = seconds(started.duration(to: .now))
        let cpuAfter = system.cpuSeconds().merging(["mosquitto": cpuSecondsOf(broker.pid ?? 0)]) { a, _ in a }
        // CPU per message of each process, in microseconds: where the time went.
        report(["name": "mqtt owntracks", "messages": messages, "qos": 1, "msgs_per_s": Int(Double(messages) / elapsed),
                "cpu_us_per_msg": cpuAfter.reduce(into: [String: Double]()) { $0[$1.key] = (($1.value - (cpuBefore[$1.key] ?? 0)) * 1e7 / Double(messages)).rounded() / 10 }])

        // The HTTP path, in the same run and on the same journal.
        let auth = ("Authorization", "Bearer \(token)")
        let single: [[UInt8]] = (0..<requests).map { index in
            Array(#"{"_type":"location","lat":48.3,"lon":\#(16.3 + Double(index) * 1e-6),"tst":\#(start + messages + index),"acc":5,"vel":48,"batt":80,"tid":"ph"}"#.utf8)
        }
        let port = system.port
        let http = try await Task.detached {
            try HTTPConnection.load(port: port, connections: 16, bodies: single, path: "/owntracks", headers: [auth, ("Content-Type", "application/json")])
        }.value
        report(["name": "http owntracks", "requests": requests, "connections": 16, "requests_per_s": Int(Double(requests) / http)])

        await phone.client.shutdown()
        await homeAssistant.client.shutdown()
        await bus.shutdown()
        try await broker.stop()
    }

    static func isConnected(_ bus: BusClient) async -> Bool {
        return (try? await bus.call(.mqtt, RPCRequestHead(op: "mqtt_status"), as: MQTTStatus.self, timeout: .milliseconds(500)))?.connected == true
    }
}

/// A benchmark's own MQTT client, which notes when each message arrived.
final class BenchMQTT: Sendable {
    final class Inbox: Sendable {
        let arrivals = Mutex<[(text: String, at: ContinuousClock.Instant)]>([])
        let connects = Atomic<Int>(0)
    }

    let client: MQTTClient
    private let inbox: Inbox

    init(_ broker: Mosquitto, id: String, subscribe: [String] = []) throws {
        var configuration = MQTTClient.Configuration(host: "127.0.0.1", port: broker.port, clientID: id)
        configuration.username = broker.username
        configuration.password = broker.password
        configuration.persistentSession = false
        configuration.maxPendingPublishes = 1_000_000
        configuration.subscriptions = subscribe.map { .init($0, qos: 0) }
        let inbox = Inbox()
        self.inbox = inbox
        client = try MQTTClient(configuration, onEvent: { event in
            if case .connected = event { inbox.connects.add(1, ordering: .relaxed) }
        }) { messages, _ in
            let now = ContinuousClock.now
            inbox.arrivals.withLock { $0 += messages.map { (String(decoding: $0.payload, as: UTF8.self), now) } }
            return true
        }
    }

    func connected() async throws {
        while inbox.connects.load(ordering: .relaxed) == 0 { try await Task.sleep(for: .milliseconds(10)) }
    }

    func arrival(containing marker: String, within timeout: Duration) async -> ContinuousClock.Instant? {
        let deadline = ContinuousClock.now + timeout
        while ContinuousClock.now < deadline {
            if let hit = inbox.arrivals.withLock({ $0.first { $0.text.contains(marker) }?.at }) { return hit }
            try? await Task.sleep(for: .microseconds(200))
        }
        return nil
    }
}

/// The topics of a subscription's messages, a journal page's records one by one.
private struct JournalPageFixes {
    var messages: BusSubscription.AsyncIterator
    var pending: [String] = []

    init(_ messages: BusSubscription.AsyncIterator) { self.messages = messages }

    mutating func next() async -> String? {
        while pending.isEmpty {
            guard let message = await messages.next() else { return nil }
            guard message.topic == JournalPage.type else { return message.topic }
            pending = ((try? JournalPage.records(in: message)) ?? []).map(\.topic).reversed()
        }
        return pending.removeLast()
    }
}
