import AsyncHTTPClient
import DrivebusConfiguration
import DrivebusKit
import DrivebusMQTT
import Foundation
import Logging
import MQTTCore
import ServiceLifecycle
import Synchronization

await ServiceRunner.main(.mqtt, configuration: DrivebusConfig.self) { context, config in
    guard let settings = config.mqtt else {
        throw ConfigError(path: "mqtt", reason: "is not in the config; drivebus-mqtt has nothing to do")
    }
    let logger = context.logger
    let counters = Counters()
    let devices = DeviceBook(config: config, logger: logger)
    // With a map of topics, a phone whose topic is not listed is refused (a topic's device part
    // alone would let any broker user post as that device): said at start.
    let mapped = Set(settings.ownTracks.devices.values)
    if !mapped.isEmpty, case let unlisted = devices.list.map(\.id).filter({ !mapped.contains($0) }), !unlisted.isEmpty {
        logger.notice("devices not listed under mqtt.owntracks.devices, whose messages over MQTT are refused: \(unlisted.joined(separator: ", "))")
    }
    let inbound = OwnTracksInbound(bus: context.bus, configuration: settings, devices: devices, counters: counters, logger: logger)
    let bridge = HomeAssistantBridge(configuration: settings, zones: config.geofence.zones.map(\.id))
    let (events, eventSink) = AsyncStream.makeStream(of: MQTTClient.Event.self)

    var client = MQTTClient.Configuration(host: settings.host, port: settings.port, clientID: settings.clientID)
    client.username = settings.username
    client.password = settings.password
    client.tls = settings.tls.map { .init(caFile: $0.caFile, certFile: $0.certFile, keyFile: $0.keyFile) }
    client.will = MQTTMessage(bridge.offline())
    client.subscriptions = OwnTracksTopics.filters(settings).map { .init($0, qos: 1) }
    let mqtt = try MQTTClient(client, onEvent: { eventSink.yield($0) }) { messages, isStopping in
        inbound.store(messages, giveUpWhen: isStopping)
    }
    logger.info("connecting", metadata: ["broker": "\(settings)"])
    let publisher = BridgePublisher(
        client: mqtt, bridge: bridge, devices: devices, events: events, bus: context.bus, stats: config.stats.listen,
        state: config.layout.dataDir + "/mqtt-discovery.json", counters: counters, logger: logger)
    return ServiceParts(
        services: [publisher],
        rpc: ["mqtt_status": { _ in
            let reply = MQTTStatus(connected: mqtt.isConnected, broker: "\(settings.host):\(settings.port)", counters: counters.snapshot)
            return (try? BusJSON.encode(RPCReply.success(reply))) ?? []
        }],
        counters: { counters.snapshot.merging(["mqtt.connected": mqtt.isConnected ? 1 : 0]) { a, _ in a } }
    )
}

extension MQTTMessage {
    init(_ publication: Publication) {
        self.init(topic: publication.topic, text: publication.payload, qos: publication.qos, retain: publication.retain)
    }
}

/// What drivebus-mqtt counts, for the heartbeat (and so `/metrics`) and `drivebus status`.
final class Counters: Sendable {
    private let values = Mutex<[String: UInt64]>([:])
    func add(_ name: String, _ count: Int = 1) {
        guard count > 0 else { return }
        values.withLock { $0["mqtt." + name, default: 0] += UInt64(count) }
    }
    var snapshot: [String: UInt64] { values.withLock { $0 } }
}
