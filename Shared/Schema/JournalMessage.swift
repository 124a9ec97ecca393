import Foundation

/// A message from the ingest journal, live from the bus or replayed.
public struct JournalMessage: Sendable {
    public let seq: UInt64
    public let topic: String
    public let payload: [UInt8]

    public init(seq: UInt64, topic: String, payload: [UInt8]) {
        self.seq = seq
        self.topic = topic
        self.payload = payload
    }

    /// The topic without its device: `fix`, `taxi.checkin`…
    public var type: String {
        for (type, prefix) in zip(JournalTopics.types, JournalTopics.prefixes) where topic.hasPrefix(prefix) { return type }
        return topic
    }

    /// The device the topic ends with: `car` in `fix.car`.
    public var device: String? {
        for prefix in JournalTopics.prefixes where topic.hasPrefix(prefix) { return String(topic.dropFirst(prefix.count)) }
        return nil
    }
}

/// Every type ingest journals. A consumer subscribes to all of them, so the journal seqs it sees
/// are contiguous and a gap is unmistakable.
public enum JournalTopics {
    public static let types = ["fix", "motion", "client.transition", "taxi.checkin", "import.finished", "session.started", "session.stopped"]
    public static let prefixes = types.map { $0 + "." }
}

/// An event a core derived, ready for the bus. Its id is computed from its inputs, so that a
/// re-processed journal yields the same ids and stores deduplicate.
public struct DerivedEvent: Sendable {
    public let type: String
    public let device: String?
    public let id: String
    public let payload: [UInt8]

    public init(type: String, device: String?, id: String, payload: some Encodable) throws {
        self.type = type
        self.device = device
        self.id = id
        self.payload = try BusJSON.encode(payload)
    }
}
