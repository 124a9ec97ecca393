import DrivebusConfiguration
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
    let http = Application(
        router: makeStatsRouter(store: store, configuration: .init(
            metrics: { metrics.text() }, costs: costs, ascentHysteresisM: config.trips.ascentHysteresisM,
            knownDevices: { await knownDevices(config) })),
        configuration: .init(address: .hostname(config.stats.listen.host, port: config.stats.listen.port), serverName: "drivebus-stats"),
        logger: context.logger
    )
    return ServiceParts(services: [recorder, http], lastSeq: { ["journal": recorder.lastSeq] }, ready: { recorder.isLive })
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
