import Foundation

/// One device's data between two times taken out of the running system (docs/data.md): first
/// ingest's journal, then what each service derived, in its event journal. Stats' own tables are
/// its store's part (`StatsStore.purge`), done by the caller: `drivebus purge` or stats' route.
public enum SystemPurge {
    /// The services whose event journals a purge reaches.
    public static let eventServices: [ServiceName] = [.trips, .scorer, .geofence, .checkout]

    public struct Outcome: Sendable {
        public var journal: IngestRPCMessages.Purged
        /// What each service that answered removed, in `eventServices`' order.
        public var events: [(service: ServiceName, purged: EventsRPCMessages.Purged)] = []
        /// The services that did not answer, and why: the same purge again finishes the job.
        public var unreached: [(service: ServiceName, reason: String)] = []
    }

    /// The journal could not be purged (ingest down, a disk error): nothing else was touched.
    public struct JournalNotPurged: Error, CustomStringConvertible {
        public let reason: String
        public var description: String { "the journal may not have been purged (\(reason)); nothing else was touched" }
    }

    public static func run(device: String, from: Date, to: Date, resendOK: Bool, bus: BusClient) async throws(JournalNotPurged) -> Outcome {
        var outcome: Outcome
        do {
            let request = IngestRPCMessages.Purge(device: device, from: from, to: to, resendOK: resendOK)
            outcome = Outcome(journal: try await bus.call(.ingest, request, as: IngestRPCMessages.Purged.self, timeout: .seconds(600)))
        } catch {
            throw JournalNotPurged(reason: String(describing: error))
        }
        for service in eventServices {
            do {
                // A service that is down would leave the purge waiting for its long timeout.
                _ = try await bus.call(service, RPCRequestHead(op: "health"), as: HealthReply.self, timeout: .seconds(3))
                let purged = try await bus.call(
                    service, EventsRPCMessages.Purge(device: device, from: from, to: to), as: EventsRPCMessages.Purged.self, timeout: .seconds(600))
                outcome.events.append((service, purged))
            } catch {
                outcome.unreached.append((service, String(describing: error)))
            }
        }
        return outcome
    }
}
