import DrivebusKit
import Foundation

await ServiceRunner.main(.scorer) { context in
    let scorerConfiguration = context.config.scorer
    // Trips are derived here too (DriveDerivations); only the scores are published: the trips
    // service publishes the trips.
    let consumer = try JournalConsumer(
        context: context,
        initial: DriveDerivations(trips: context.config.trips, scorer: scorerConfiguration),
        configure: { [tripsConfiguration = context.config.trips] in
            $0.scorer.configuration = scorerConfiguration
            $0.segmenter.configuration = tripsConfiguration
        },
        apply: { state, message, _ in state.handle(message, arrivedAt: Date()).scores },
        tick: { state, now in state.tick(now).scores }
    )
    return ServiceParts(consumer: consumer)
}
