import AsyncHTTPClient
import DrivebusConfiguration
import DrivebusKit
import Foundation
import GeofenceCore

await ServiceRunner.main(.geofence, configuration: DrivebusConfig.self) { context, config in
    let configuration = config.geofence
    let outbox = try Outbox(path: config.layout.dataDir + "/outbox.sqlite")
    let events = try EventLog(context: context)
    let delivery = GateDelivery(context: context, outbox: outbox, events: events, gates: configuration.gates, sender: WebhookSender(client: .shared))
    let consumer = try JournalConsumer(
        context: context,
        initial: GeofenceEngine(configuration: configuration), events: events,
        decodingUserInfo: CheckpointConfiguration.userInfo(configuration),
        apply: { engine, message, live in
            let input: GeofenceInput
            switch message.decoded {
            case .fix(let fix)?: input = .fix(fix, live: live)
            case .motion(let sample)?: input = .motion(sample)
            default: return []
            }
            return delivery.route(engine.handle(input, now: Date()))
        },
        tick: { engine, now in delivery.route(engine.handle(.tick(now: now), now: now)) }
    )
    return ServiceParts(consumer: consumer, services: [delivery], rpc: ["outbox": { _ in await GateDelivery.outboxReply(outbox) }])
}
