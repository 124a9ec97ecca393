import DrivebusSchema
import Foundation

// How journal messages feed the segmenter, and how its outputs go on the bus.

extension TripsInput {
    /// The segmenter's input for a journal message, or nil for types it does not take.
    public init?(_ payload: JournalPayload) {
        switch payload {
        case .fix(let fix): self = .fix(fix)
        case .motion(let sample): self = .motion(sample)
        case .importFinished(let finished): self = .importFinished(finished)
        case .transition, .checkin, .sessionStarted, .sessionStopped, .visit: return nil
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
