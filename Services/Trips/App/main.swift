import DrivebusConfiguration
import DrivebusKit
import Foundation
import TripsCore

await ServiceRunner.main(.trips, configuration: DrivebusConfig.self) { context, config in
    let consumer = try JournalConsumer(
        context: context,
        initial: TripSegmenter(configuration: config.trips),
        decodingUserInfo: CheckpointConfiguration.userInfo(config.trips),
        apply: { segmenter, message, _ in
            guard let input = message.decoded.flatMap(TripsInput.init) else { return [] }
            return segmenter.handle(input, arrivedAt: Date()).compactMap(\.derived)
        },
        tick: { segmenter, now in segmenter.handle(.tick(now: now)).compactMap(\.derived) }
    )
    return ServiceParts(consumer: consumer)
}
