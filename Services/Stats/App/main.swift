import DrivebusConfiguration
import DrivebusQRCode
import DrivebusKit
import Foundation
import Hummingbird
import Prometheus
import ServiceLifecycle
import StatsCore
import StatsStore
import StatsHTTP

await ServiceRunner.main(.stats, configuration: DrivebusConfig.self) { context, config in
    var homes: [String: Zone] = [:]
    for device in config.devices {
        if let home = device.home, let zone = config.geofence.zones.first(where: { $0.id == home }) { homes[device.id] = zone }
    }
    let costs = config.costs
    let store = try StatsStore(.init(path: config.layout.dataDir + "/drivebus.sqlite", homes: homes, maxGapS: config.stats.maxGapS))
    let metrics = StatsMetrics()
    let recorder = StatsRecorder(context: context, config: config, store: store, metrics: metrics)
    let setup: @Sendable (String) async throws(StatsError) -> [UInt8] = { device throws(StatsError) in try await newSetup(device, config) }
    let purge: @Sendable (DevicePurgeRequest) async throws(StatsError) -> [UInt8] = { request throws(StatsError) in
        try await purgeEverywhere(request, bus: context.bus, store: store)
    }
    let listening = ReadyFlag()
    let http = Application(
        router: makeStatsRouter(store: store, configuration: .init(
            metrics: { metrics.text() }, costs: costs, ascentHysteresisM: config.trips.ascentHysteresisM,
            knownDevices: { await knownDevices(config) },
            // A setup code is a credential: handed out only to this machine (see ActionGuard).
            deviceSetup: config.stats.listen.isLoopback ? setup : nil,
            // So is a purge: it deletes for good.
            devicePurge: config.stats.listen.isLoopback ? purge : nil,
            map: .init(tileURL: config.stats.map.tileURL, attribution: config.stats.map.attribution, leafletDirectory: config.stats.map.leafletDir),
            loopbackOnly: config.stats.listen.isLoopback, allowedHosts: config.stats.allowedHosts)),
        configuration: .init(address: .hostname(config.stats.listen.host, port: config.stats.listen.port), serverName: "drivebus-stats"),
        onServerRunning: { _ in listening.set() },
        logger: context.logger
    )
    return ServiceParts(services: [recorder, http], lastSeq: { ["journal": recorder.lastSeq] }, ready: { recorder.isLive && listening.isSet })
}

/// The config's devices and the registry's, read on a dispatch queue (a file read is not for the
/// cooperative pool).
func knownDevices(_ config: DrivebusConfig) async -> [KnownDevice] {
    await withCheckedContinuation { continuation in
        DispatchQueue.global().async {
            let added = (try? DeviceRegistry(layout: config.layout).load()) ?? []
            let configured = config.devices.map { KnownDevice(id: $0.id, origin: "config") }
            let ids = Set(configured.map(\.id))
            continuation.resume(returning: configured + added.filter { !ids.contains($0.id) }.map {
                KnownDevice(id: $0.id, origin: "added", app: $0.app, addedAt: $0.addedAt)
            })
        }
    }
}

/// The dashboard's "set up phone": a new token for an added device (the old one is refused
/// within a second, as with `drivebus device rotate-token`), and what the phone needs, with the
/// QR code as SVG. The token is in this answer only.
func newSetup(_ device: String, _ config: DrivebusConfig) async throws(StatsError) -> [UInt8] {
    let result: Result<[UInt8], StatsError> = await withCheckedContinuation { continuation in
        DispatchQueue.global().async {
            continuation.resume(returning: Result { () throws(StatsError) -> [UInt8] in
                if config.devices.contains(where: { $0.id == device }) {
                    throw StatsError(status: 409, code: "stats.config_device", message: "\(device) is in the config file: its token is there", field: "id")
                }
                // A code the phone cannot use would cost it its working token.
                guard config.ingest.publicURL != nil || !config.ingest.listen.isLoopback else {
                    throw StatsError(
                        status: 409, code: "stats.no_public_url",
                        message: "ingest listens on \(config.ingest.listen) only, which a phone cannot reach: set ingest.public_url", field: "ingest.public_url")
                }
                let rotated: (token: String, entry: DeviceRegistry.Entry)?
                do {
                    rotated = try DeviceRegistry(layout: config.layout).update { entries in DeviceRegistry.rotate(device, in: &entries, digest: TokenDigest.hex) }
                } catch {
                    throw StatsError(status: 500, code: "stats.devices_unwritable", message: String(describing: error))
                }
                guard let (token, entry) = rotated else { throw StatsError.notFound("id", "no device \(device) added with drivebus device") }
                let app = entry.app.flatMap(PhoneApp.init(rawValue:)) ?? .owntracks
                let setup = PhoneSetup(device: device, token: token, base: PhoneSetup.base(config))
                let code = setup.code(for: app)
                let (scan, byHand) = setup.steps(for: app)
                let reply: [String: String] = [
                    "device": device, "app": app.rawValue, "code": code, "svg": (try? QRCode(code).svg()) ?? "", "scan": scan, "by_hand": byHand,
                ]
                return Array((try? JSONSerialization.data(withJSONObject: reply, options: [.sortedKeys])) ?? Data())
            })
        }
    }
    return try result.get()
}

/// The stats API's purge: the journal and the services' events first (`SystemPurge`), then
/// stats' own tables, as `drivebus purge` does. The answer says what went from where, and which
/// services did not answer (`complete` is then false, and the same request again finishes it).
func purgeEverywhere(_ request: DevicePurgeRequest, bus: BusClient, store: StatsStore) async throws(StatsError) -> [UInt8] {
    let outcome: SystemPurge.Outcome
    do {
        outcome = try await SystemPurge.run(device: request.device, from: request.from, to: request.to, resendOK: request.resendOK, bus: bus)
    } catch {
        throw StatsError(status: 503, code: "stats.purge_not_done", message: "\(error); the same request again is safe")
    }
    let stats: StatsStore.Purged
    do {
        stats = try await store.purge(device: request.device, from: request.from, to: request.to)
    } catch {
        throw StatsError(status: 500, code: "stats.purge_failed", message: "the journal and the services' events were purged, stats was not (\(error)); the same request again is safe")
    }
    let journal = outcome.journal
    var events: [String: Any] = [:]
    for (service, purged) in outcome.events { events[service.rawValue] = ["events": purged.events, "rows": purged.rows] }
    let reply: [String: Any] = [
        "device": request.device, "from": RFC3339.format(request.from), "to": RFC3339.format(request.to),
        "journal": ["records": journal.records, "segments": journal.segments, "bytes_before": journal.bytesBefore, "bytes_after": journal.bytesAfter],
        "events": events,
        "stats": Dictionary(stats.map { ($0.table, $0.rows) }, uniquingKeysWith: +),
        "not_reached": Dictionary(outcome.unreached.map { ($0.service.rawValue, $0.reason) }, uniquingKeysWith: { first, _ in first }),
        "complete": outcome.unreached.isEmpty,
    ]
    return Array((try? JSONSerialization.data(withJSONObject: reply, options: [.sortedKeys])) ?? Data())
}
