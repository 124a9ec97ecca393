import DrivebusJournal
import DrivebusSchema
import Foundation

/// Publishes a service's derived events durably: each is appended to the service's event
/// journal (`STATE/data/<service>.events`) and synced before it goes on the bus, with its journal
/// seq in the header (`log_seq`). A consumer that missed it replays it with the `events` RPC.
public final class EventLog: Sendable {
    /// Removes what a service keeps besides its event journal for a purge, and counts it by table.
    public typealias PurgeElsewhere = @Sendable (EventsRPCMessages.Purge) async throws -> [String: Int]

    public let journal: EventJournal
    private let publisher: Publisher
    private let purgeElsewhere: PurgeElsewhere?

    public init(context: ServiceContext, purgeElsewhere: PurgeElsewhere? = nil) throws {
        journal = try EventJournal(path: "\(context.settings.layout.dataDir)/\(context.name.rawValue).events")
        publisher = context.publisher
        self.purgeElsewhere = purgeElsewhere
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
    public var rpc: [String: RPCHandler] {
        [
            "events": EventsRPC.handler(journal),
            "purge_events": RPC.handler(EventsRPCMessages.Purge.self) { [journal, purgeElsewhere] request throws(RPCErrorBody) in
                guard request.from <= request.to else { throw .badRequest("from is after to") }
                do {
                    let removal = try await journal.remove(device: request.device, from: request.from, to: request.to)
                    let rows = try await purgeElsewhere?(request) ?? [:]
                    return EventsRPCMessages.Purged(events: removal.events, bytesBefore: removal.bytesBefore, bytesAfter: removal.bytesAfter, rows: rows)
                } catch {
                    throw RPCErrorBody(code: "events.purge_failed", message: String(describing: error))
                }
            },
        ]
    }
}
