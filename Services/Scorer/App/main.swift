import DrivebusConfiguration
import DrivebusKit
import Foundation
import ScorerCore

await ServiceRunner.main(.scorer, configuration: DrivebusConfig.self) { context, config in
    let scorerConfiguration = config.scorer
    // Trips are derived here too (DriveDerivations); only the scores are published: the trips
    // service publishes the trips.
    let consumer = try JournalConsumer(
        context: context,
        initial: DriveDerivations(trips: config.trips, scorer: scorerConfiguration),
        decodingUserInfo: CheckpointConfiguration.userInfo(config.trips, scorerConfiguration),
        apply: { state, message, _ in message.decoded.map { state.handle($0, arrivedAt: Date()).scores } ?? [] },
        tick: { state, now in state.tick(now).scores }
    )
    return ServiceParts(consumer: consumer)
}
