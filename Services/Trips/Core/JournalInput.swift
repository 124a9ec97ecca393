import DrivebusSchema
import Foundation

// How journal messages feed the segmenter, and how its outputs go on the bus.

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
}
