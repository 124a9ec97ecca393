/// Follows header `seq` per publisher to notice lost messages.
///
/// PUB/SUB may drop under load. A consumer that sees a gap replays the journal from its own
/// checkpoint, so the gap only needs to be noticed, not filled from here.
public struct SeqTracker: Sendable {
    public enum Observation: Sendable, Equatable {
        /// The first message seen from this source (or epoch): nothing to compare with.
        case first
        /// Exactly the next one.
        case inOrder
        /// Messages `missing` never arrived.
        case gap(missing: ClosedRange<UInt64>)
        /// Already seen (a duplicate, or a late message after a gap).
        case stale
        /// The publisher restarted with a new epoch; its seq began again.
        case newEpoch
    }

    private var last: [String: (epoch: String, seq: UInt64)] = [:]

    public init() {}

    public mutating func observe(source: String, epoch: String, seq: UInt64) -> Observation {
        guard let previous = last[source] else {
            last[source] = (epoch, seq)
            return .first
        }
        guard previous.epoch == epoch else {
            last[source] = (epoch, seq)
            return .newEpoch
        }
        if seq <= previous.seq { return .stale }
        last[source] = (epoch, seq)
        return seq == previous.seq + 1 ? .inOrder : .gap(missing: (previous.seq + 1)...(seq - 1))
    }

    public mutating func observe(_ header: EnvelopeHeader) -> Observation {
        observe(source: header.source, epoch: header.epoch, seq: header.seq)
    }
}
