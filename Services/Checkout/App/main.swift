import CheckoutCore
import DrivebusConfiguration
import DrivebusKit

await ServiceRunner.main(.checkout, configuration: DrivebusConfig.self) { context, config in
    let configuration = config.checkout
    let consumer = try JournalConsumer(
        context: context,
        initial: CheckoutDetector(configuration: configuration),
        decodingUserInfo: CheckpointConfiguration.userInfo(configuration),
        // Each tick adds to an open ride's observed silence, which a restart cannot observe
        // again: a crash must not take minutes of it away.
        tickStateMatters: { $0.openCheckins > 0 },
        apply: { detector, message, _ in
            let input: CheckoutInput
            switch message.decoded {
            case .checkin(let checkin)?: input = .checkin(checkin)
            case .motion(let sample)?: input = .motion(sample)
            case .fix(let fix)?: input = .fix(fix)
            default: return []
            }
            return published(detector.handle(input))
        },
        tick: { detector, now in published(detector.handle(.tick(now: now))) }
    )
    return ServiceParts(consumer: consumer)
}

func published(_ checkouts: [TaxiCheckout]) -> [DerivedEvent] {
    checkouts.compactMap { try? DerivedEvent(type: "taxi.checkout", device: $0.device, id: $0.eventID, payload: $0) }
}
