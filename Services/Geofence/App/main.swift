import DrivebusConfiguration
import DrivebusKit
import Foundation
import GeofenceCore

await ServiceRunner.main(.geofence, configuration: DrivebusConfig.self) { context, config in
    let configuration = config.geofence
    // A device that signs in by its id alone (Traccar Client, OsmAnd: `allow_id_auth`) can be
    // posted as by anyone who reaches ingest: said once at start, for each gate it can open.
    for gate in configuration.gates {
        for device in config.devices where device.allowIDAuth && (gate.devices?.contains(device.id) ?? true) {
            context.logger.warning(
                "gate \(gate.id) opens for device \(device.id), which signs in by its id alone (allow_id_auth): anyone who reaches ingest can post its position; list the gate's devices under gates[].devices")
        }
    }
    let outbox = try Outbox(path: config.layout.dataDir + "/outbox.sqlite")
    let events = try EventLog(context: context) { purge in
        ["outbox": try await outbox.purge(device: purge.device, from: purge.from, to: purge.to)]
    }
    let delivery = GateDelivery(context: context, outbox: outbox, events: events, gates: configuration.gates, sender: WebhookSender())
    let consumer = try JournalConsumer(
        context: context,
        initial: GeofenceEngine(configuration: configuration), events: events,
        decodingUserInfo: CheckpointConfiguration.userInfo(configuration),
        apply: { engine, message, _ in
            let input: GeofenceInput
            switch message.decoded {
            // A fix opens a gate only if it is recent (max_age_s, checked by the engine) and came
            // from a phone, not an import. Whether it arrived live or by replay does not matter:
            // after a crash the step is redone, and the outbox key keeps the call to one.
            case .fix(let fix)?: input = .fix(fix, live: fix.source != .import)
            case .motion(let sample)?: input = .motion(sample)
            default: return []
            }
            return try delivery.route(engine.handle(input, now: Date()))
        },
        tick: { engine, now in try delivery.route(engine.handle(.tick(now: now), now: now)) }
    )
    return ServiceParts(consumer: consumer, services: [delivery], rpc: [
        "outbox": { _ in await GateDelivery.outboxReply(outbox) },
        "dead_letters": { _ in await GateDelivery.deadLettersReply(outbox) },
    ])
}
