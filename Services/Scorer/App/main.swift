import DrivebusKit
import ScorerCore
import Foundation
import TripsCore

/// The scorer's state: the same segmenter the trips service runs, fed the same journal, so trip
/// boundaries (and ids) are known here deterministically instead of waiting on trips' messages.
struct ScorerState: Codable, Sendable {
    var segmenter: TripSegmenter
    var scorer: DriveScorer

    mutating func handle(_ message: JournalMessage) -> [DerivedEvent] {
        var outputs: [ScorerOutput] = []
        switch message.type {
        case "fix":
            guard let fix = try? BusJSON.decode(Fix.self, from: message.payload) else { return [] }
            outputs += scorer.handle(.fix(fix))
        case "session.started":
            guard let session = try? BusJSON.decode(SessionStarted.self, from: message.payload) else { return [] }
            outputs += scorer.handle(.sessionStarted(session))
        case "session.stopped":
            guard let session = try? BusJSON.decode(SessionStopped.self, from: message.payload) else { return [] }
            outputs += scorer.handle(.sessionStopped(session))
        default:
            break
        }
        if let input = TripsInput(message) {
            for trip in segmenter.handle(input, arrivedAt: Date()).compactMap(\.scorerInput) { outputs += scorer.handle(trip) }
        }
        return outputs.compactMap(\.derived)
    }

    mutating func tick(_ now: Date) -> [DerivedEvent] {
        segmenter.handle(.tick(now: now)).compactMap(\.scorerInput).flatMap { scorer.handle($0) }.compactMap(\.derived)
    }
}

await ServiceRunner.main(.scorer) { context in
    let scorerConfiguration = context.config.scorer
    let consumer = try JournalConsumer(
        context: context,
        initial: ScorerState(segmenter: TripSegmenter(configuration: context.config.trips), scorer: DriveScorer(configuration: scorerConfiguration)),
        configure: { $0.scorer.configuration = scorerConfiguration },
        apply: { state, message, _ in state.handle(message) },
        tick: { state, now in state.tick(now) }
    )
    return ServiceParts(consumer: consumer)
}
