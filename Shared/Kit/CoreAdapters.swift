import DrivebusSchema
import ScorerCore
import TripsCore

// How journal messages feed the cores, and how their outputs go on the bus. Kept in one place
// because the scorer runs the trips segmenter too.

extension TripsInput {
    /// The segmenter's input for a journal message, or nil for types it does not take.
    public init?(_ message: JournalMessage) {
        switch message.type {
        case "fix":
            guard let fix = try? BusJSON.decode(Fix.self, from: message.payload) else { return nil }
            self = .fix(fix)
        case "motion":
            guard let sample = try? BusJSON.decode(MotionSample.self, from: message.payload) else { return nil }
            self = .motion(sample)
        case "import.finished":
            guard let finished = try? BusJSON.decode(ImportFinished.self, from: message.payload) else { return nil }
            self = .importFinished(finished)
        default:
            return nil
        }
    }
}

extension TripsOutput {
    public var derived: DerivedEvent? {
        switch self {
        case .started(let started): try? DerivedEvent(type: type, device: device, id: eventID, payload: started)
        case .ended(let ended): try? DerivedEvent(type: type, device: device, id: eventID, payload: ended)
        case .silent(let silent): try? DerivedEvent(type: type, device: device, id: eventID, payload: silent)
        }
    }

    /// The trip as the scorer sees it.
    public var scorerInput: ScorerInput? {
        switch self {
        case .started(let started):
            .tripStarted(ScorerTrip(tripID: started.tripID, device: started.device, startTime: started.startTime, firstSeq: started.firstSeq ?? 0))
        case .ended(let ended):
            .tripEnded(ScorerTrip(
                tripID: ended.tripID, device: ended.device, startTime: ended.startTime, endTime: ended.endTime,
                firstSeq: ended.firstSeq ?? 0, lastSeq: ended.lastSeq, distanceM: ended.distanceM))
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
