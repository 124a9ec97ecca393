import AsyncHTTPClient
import DrivebusConfiguration
import DrivebusKit
import DrivebusMQTT
import DrivebusSchema
import Foundation
import Logging
import MQTTCore
import NIOCore
import ServiceLifecycle
import Synchronization

/// The devices MQTT knows: the config's and those of `drivebus device add`, reread every two
/// seconds off the cooperative pool.
final class DeviceBook: Sendable {
    private let config: DrivebusConfig
    private let registry: DeviceRegistry
    private let logger: Logger
    private let current: Mutex<[HomeAssistantBridge.Device]>
    /// The devices Home Assistant was last told of. Kept apart from `current`: a message from a
    /// device just added reloads `current` on the client's thread, and the periodic reload must
    /// still see that the new device was never announced.
    private let announced = Mutex<[HomeAssistantBridge.Device]?>(nil)
    private static let queue = DispatchQueue(label: "drivebus.mqtt.devices")

    init(config: DrivebusConfig, logger: Logger) {
        self.config = config
        registry = DeviceRegistry(layout: config.layout)
        self.logger = logger
        current = Mutex(Self.devices(config, (try? registry.load()) ?? []))
    }

    var list: [HomeAssistantBridge.Device] { current.withLock { $0 } }
    var ids: Set<String> { Set(list.map(\.id)) }

    /// Rereads the registry at once, blocking: for the MQTT client's own thread, when a message
    /// names a device not known yet (one `drivebus device add` made a moment ago).
    func reloadBlocking() -> Set<String> {
        if let entries = try? registry.load() { current.withLock { $0 = Self.devices(config, entries) } }
        return ids
    }

    /// Whether the devices differ from those last announced.
    var changedSinceAnnounced: Bool { announced.withLock { $0 } != list }

    /// Records `devices` as announced.
    func markAnnounced(_ devices: [HomeAssistantBridge.Device]) { announced.withLock { $0 = devices } }

    /// Rereads the registry; true when the devices changed.
    @discardableResult
    func reload() async -> Bool {
        let loaded = await withCheckedContinuation { continuation in
            Self.queue.async { [registry] in continuation.resume(returning: Result { () throws(ConfigError) in try registry.load() }) }
        }
        switch loaded {
        case .success(let entries):
            let devices = Self.devices(config, entries)
            return current.withLock { list in
                defer { list = devices }
                return list != devices
            }
        case .failure(let error):
            logger.error("devices not reloaded, the previous ones stay: \(error)")
            return false
        }
    }

    private static func devices(_ config: DrivebusConfig, _ entries: [DeviceRegistry.Entry]) -> [HomeAssistantBridge.Device] {
        config.devices(with: entries).map { .init(id: $0.id, home: $0.home) }
    }
}

/// Everything drivebus publishes to MQTT: availability, discovery (and the removal of entities
/// whose device or zone is gone), states from bus events, today's figures from stats.
struct BridgePublisher: Service {
    let client: MQTTClient
    let bridge: HomeAssistantBridge
    let devices: DeviceBook
    let events: AsyncStream<MQTTClient.Event>
    let bus: BusClient
    let stats: DrivebusConfig.Listen
    /// The discovery topics published so far, so that an entity that is gone can be removed.
    let state: String
    let counters: Counters
    let logger: Logger

    func run() async throws {
        let busEvents = try await bus.subscribe(HomeAssistantBridge.eventPrefixes)
        // Positions on a subscription of their own, sized for journal pages of up to 32 KB: at
        // most 2,000 in the socket and 64 groups of 32 after it, about 130 MB at the very most
        // (64 groups of 64 pages of 16 KB were about 100 MB). Only the latest position matters, so under a flood
        // the oldest pages are the ones dropped, and never an event.
        let pages = try await bus.subscribe([JournalPage.type], highWaterMark: 2_000, bufferLimit: 64, batchLimit: 32, keepsNewest: true)
        let http = HTTPClient(eventLoopGroup: HTTPClient.defaultEventLoopGroup)
        let refresh = TodayRefresh()
        await withDiscardingTaskGroup { group in
            group.addTask {
                for await event in events.cancelOnGracefulShutdown() {
                    switch event {
                    case .connected(let sessionPresent):
                        counters.add("connects")
                        logger.info("connected", metadata: ["session_present": "\(sessionPresent)"])
                        client.publish(MQTTMessage(bridge.online()))
                        await announce()
                        refresh.all()
                    case .disconnected(let reason):
                        logger.warning("not connected: \(reason)")
                    case .subscriptionRefused(let filter, let granted):
                        counters.add("subscriptions_refused")
                        logger.error("the broker refused the subscription to \(filter) (granted \(granted)): check its ACL for this user")
                    case .publishRefused(let topic, let reason):
                        counters.add("publishes_refused")
                        logger.warning("not published to \(topic): \(reason)")
                    }
                }
            }
            group.addTask {
                for await group in busEvents.groups.cancelOnGracefulShutdown() {
                    client.publish(bridge.publications(group.map { ($0.topic, $0.payload) }).map(MQTTMessage.init))
                    for message in group where HomeAssistantBridge.changesToday(busTopic: message.topic) {
                        if let device = message.topic.split(separator: ".").last { refresh.add(String(device)) }
                    }
                }
            }
            group.addTask {
                for await group in pages.groups.cancelOnGracefulShutdown() {
                    let (fixes, unreadable) = HomeAssistantBridge.liveFixes(inPages: group)
                    if unreadable > 0 {
                        counters.add("unreadable_pages", unreadable)
                        logger.warning("journal pages not readable, their fixes not published", metadata: ["pages": "\(unreadable)"])
                    }
                    client.publish(bridge.publications(fixes).map(MQTTMessage.init))
                }
            }
            group.addTask {
                // Devices added or removed, and today's figures: on change, and once a minute.
                var lastFull = ContinuousClock.now
                while !Task.isCancelled && !Task.isShuttingDownGracefully {
                    try? await cancelWhenGracefulShutdown { try await Task.sleep(for: .seconds(2)) }
                    await devices.reload()
                    if devices.changedSinceAnnounced, client.isConnected {
                        await announce()
                        refresh.all()
                    }
                    if ContinuousClock.now - lastFull >= .seconds(bridge.configuration.todayRefreshS) {
                        lastFull = .now
                        refresh.all()
                    }
                    for device in refresh.take(devices.ids) where client.isConnected {
                        await publishToday(device, http: http)
                    }
                }
            }
        }
        // Stopping: a receive still waiting for ingest gives up (the client says it is stopping);
        // "offline" goes out before the clean disconnect, which does not publish the will. At
        // QoS 0: libmosquitto holds QoS 1 messages beyond its 20 in flight until their
        // acknowledgements are read, which a stopping client no longer does, and the last word
        // must not wait behind them.
        var offline = MQTTMessage(bridge.offline())
        offline.qos = 0
        await client.shutdown(publishing: [offline])
        try? await http.shutdown()
        let counts = client.counts
        logger.info("disconnected", metadata: ["published": "\(counts.published)", "dropped": "\(counts.dropped)"])
    }

    /// Discovery for every device, and empty configs for what was announced before and is gone.
    /// Runs when connected (on connecting, and when the devices change): configs queued while
    /// the broker is away could be dropped, and the removals among them would then never be
    /// sent again, as the saved topics no longer hold them.
    private func announce() async {
        let list = devices.list
        devices.markAnnounced(list)
        let current = bridge.discovery(list)
        let previous = await Self.offPool { [state] in Self.loadTopics(state) }
        let removals = HomeAssistantBridge.removals(previous: previous, current: current)
        client.publish((current + removals).map(MQTTMessage.init))
        if !removals.isEmpty { logger.info("removed \(removals.count) Home Assistant entities of devices or zones that are gone") }
        await Self.offPool { [state] in Self.saveTopics(Set(current.map(\.topic)), to: state) }
    }

    private func publishToday(_ device: String, http: HTTPClient) async {
        let day = String(RFC3339.format(Date()).prefix(10))
        let url = "http://\(stats)/api/v1/stats/daily?device=\(device)&from=\(day)"
        do {
            let response = try await http.execute(HTTPClientRequest(url: url), timeout: .seconds(5))
            let body = try await response.body.collect(upTo: 1 << 20)
            guard response.status == .ok else { throw MQTTStatsError(status: Int(response.status.code)) }
            let reply = try JSONDecoder().decode(DailyReply.self, from: Data(body.readableBytesView))
            let today = reply.days.first { $0.date == day }
            let hasHome = devices.list.first { $0.id == device }?.home != nil
            client.publish(MQTTMessage(bridge.today(
                device: device, date: day, distanceM: today?.distanceM ?? 0, awayS: hasHome ? (today?.awayFromHomeS ?? 0) : nil)))
        } catch {
            logger.debug("today's figures for \(device) not refreshed: \(error)")
        }
    }

    private static func loadTopics(_ path: String) -> Set<String> {
        guard let data = FileManager.default.contents(atPath: path), let topics = try? JSONDecoder().decode([String].self, from: data) else { return [] }
        return Set(topics)
    }

    private static func saveTopics(_ topics: Set<String>, to path: String) {
        guard let data = try? JSONEncoder().encode(topics.sorted()) else { return }
        try? data.write(to: URL(fileURLWithPath: path), options: .atomic)
    }

    private static func offPool<T: Sendable>(_ work: @escaping @Sendable () -> T) async -> T {
        await withCheckedContinuation { continuation in DispatchQueue.global().async { continuation.resume(returning: work()) } }
    }
}

/// Which devices' figures for today are due.
final class TodayRefresh: Sendable {
    private let due = Mutex<(all: Bool, devices: Set<String>)>((false, []))
    func all() { due.withLock { $0.all = true } }
    func add(_ device: String) { _ = due.withLock { $0.devices.insert(device) } }
    func take(_ known: Set<String>) -> [String] {
        due.withLock { state in
            defer { state = (false, []) }
            return (state.all ? known : state.devices.intersection(known)).sorted()
        }
    }
}

struct MQTTStatsError: Error, CustomStringConvertible {
    let status: Int
    var description: String { "the stats service answered HTTP \(status)" }
}

/// The part of `GET /api/v1/stats/daily` that MQTT shows.
struct DailyReply: Decodable {
    struct Day: Decodable {
        let date: String
        let distanceM: Double
        let awayFromHomeS: Double?
        enum CodingKeys: String, CodingKey {
            case date
            case distanceM = "distance_m"
            case awayFromHomeS = "away_from_home_s"
        }
    }
    let days: [Day]
}
