import DrivebusSchema
import Foundation
import TripsCore

// The scorer runs the trips segmenter too, and so does stats: both feed the same journal to both
// cores, here.

extension TripsOutput {
    /// The trip as the scorer sees it.
    public var scorerInput: ScorerInput? {
        switch self {
        case .started(let started):
            .tripStarted(ScorerTrip(tripID: started.tripID, device: started.device, startTime: started.startTime, firstSeq: started.firstSeq ?? 0))
        case .ended(let ended):
            .tripEnded(ScorerTrip(
                tripID: ended.tripID, device: ended.device, startTime: ended.startTime, endTime: ended.endTime,
                firstSeq: ended.firstSeq ?? 0, lastSeq: ended.lastSeq, distanceM: ended.distanceM, imported: ended.imported))
        case .silent:
            nil
        }
    }
}

extension ScorerOutput {
    public var derived: DerivedEvent? {
        switch self {
        case .event(let event): try? DerivedEvent(type: type, device: device, id: eventID, payload: event)
        case .scored(let scored): try? DerivedEvent(type: type, device: device, id: eventID, payload: scored)
        }
    }
}

/// The trips segmenter and the scorer fed the same journal, as the scorer and stats both run
/// them: trip boundaries and ids come out identical to the trips service's without waiting on
/// its messages.
public struct DriveDerivations: Codable, Sendable {
    public var segmenter: TripSegmenter
    public var scorer: DriveScorer

    public init(trips: TripsConfiguration, scorer: ScorerConfiguration) {
        segmenter = TripSegmenter(configuration: trips)
        self.scorer = DriveScorer(configuration: scorer)
    }

    /// What one journal message or tick derived: the score events, and the trip events made
    /// only when asked for (the scorer publishes none, and a trip's end event holds its track).
    public struct Derived: Sendable {
        public let scores: [DerivedEvent]
        private let tripOutputs: [TripsOutput]

        init(tripOutputs: [TripsOutput], scores: [DerivedEvent]) {
            self.tripOutputs = tripOutputs
            self.scores = scores
        }

        /// Encoded each time it is read.
        public var trips: [DerivedEvent] { tripOutputs.compactMap(\.derived) }
    }

    /// The trip events and the score events one journal message causes.
    public mutating func handle(_ payload: JournalPayload, arrivedAt: Date) -> Derived {
        var scored: [ScorerOutput] = []
        switch payload {
        case .fix(let fix): scored += scorer.handle(.fix(fix))
        case .sessionStarted(let session): scored += scorer.handle(.sessionStarted(session))
        case .sessionStopped(let session): scored += scorer.handle(.sessionStopped(session))
        case .motion, .importFinished, .transition, .checkin, .visit: break
        }
        let tripsInput = TripsInput(payload)
        guard let tripsInput else { return Derived(tripOutputs: [], scores: scored.compactMap(\.derived)) }
        return feed(segmenter.handle(tripsInput, arrivedAt: arrivedAt), scored)
    }

    public mutating func tick(_ now: Date) -> Derived {
        feed(segmenter.handle(.tick(now: now)), [])
    }

    private mutating func feed(_ outputs: [TripsOutput], _ scored: [ScorerOutput]) -> Derived {
        var scored = scored
        for trip in outputs.compactMap(\.scorerInput) { scored += scorer.handle(trip) }
        return Derived(tripOutputs: outputs, scores: scored.compactMap(\.derived))
    }
}
