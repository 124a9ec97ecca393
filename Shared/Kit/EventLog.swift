import DrivebusJournal
import DrivebusSchema
import Foundation

/// Publishes a service's derived events durably: each is appended to the service's event
/// journal (`STATE/data/<service>.events`) and synced before it goes on the bus, with its journal
/// seq in the header (`log_seq`). A consumer that missed it replays it with the `events` RPC.
public final class EventLog: Sendable {
    public let journal: EventJournal
    private let publisher: Publisher

    public init(context: ServiceContext) throws {
        journal = try EventJournal(path: "\(context.settings.layout.dataDir)/\(context.name.rawValue).events")
        publisher = context.publisher
    }

    /// Journals `events` (an id already journaled recently is left out), then publishes what was
    /// journaled. Throws if they could not be journaled: the caller must not consider them done.
    public func publish(_ events: [DerivedEvent]) async throws {
        guard !events.isEmpty else { return }
        for event in try await journal.append(events, time: Date()) {
            // On disk already: a publish that fails (an invalid topic cannot get this far) is
            // recovered by the subscribers' replay.
            _ = try? publisher.publish(event.type, device: event.device, payloadJSON: event.payload, id: event.id, time: event.time, logSeq: event.seq)
        }
    }

    /// The RPC ops that serve the journal to followers.
    public var rpc: [String: RPCHandler] { ["events": EventsRPC.handler(journal)] }
}
