import DrivebusKit
import Foundation
import TripsCore

await ServiceRunner.main(.trips) { context in
    let consumer = try JournalConsumer(
        context: context,
        initial: TripSegmenter(configuration: context.config.trips),
        configure: { [configuration = context.config.trips] in $0.configuration = configuration },
        apply: { segmenter, message, _ in
            guard let input = TripsInput(message) else { return [] }
            return segmenter.handle(input, arrivedAt: Date()).compactMap(\.derived)
        },
        tick: { segmenter, now in segmenter.handle(.tick(now: now)).compactMap(\.derived) }
    )
    return ServiceParts(consumer: consumer)
}
