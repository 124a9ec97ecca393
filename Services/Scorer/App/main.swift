import DrivebusConfiguration
import DrivebusKit
import DrivebusRoadLimits
import Foundation
import ScorerCore

await ServiceRunner.main(.scorer, configuration: DrivebusConfig.self) { context, config in
    let scorerConfiguration = config.scorer
    // `drivebus limits import` replaces the index; the next message or tick uses the new one.
    let roadLimits = RoadLimitsWatcher(path: config.layout.roadLimitsIndex) { [logger = context.logger] change in
        logger.info("road limits: \(change)")
    }
    // Trips are derived here too (DriveDerivations); only the scores are published: the trips
    // service publishes the trips.
    let consumer = try JournalConsumer(
        context: context,
        initial: DriveDerivations(trips: config.trips, scorer: scorerConfiguration),
        decodingUserInfo: CheckpointConfiguration.userInfo(config.trips, scorerConfiguration),
        apply: { state, message, _ in
            if roadLimits.differs(from: state.scorer.roadLimits) { state.scorer.roadLimits = roadLimits.current }
            return message.decoded.map { state.handle($0, arrivedAt: Date()).scores } ?? []
        },
        tick: { state, now in
            if roadLimits.differs(from: state.scorer.roadLimits) { state.scorer.roadLimits = roadLimits.current }
            return state.tick(now).scores
        }
    )
    return ServiceParts(consumer: consumer)
}
