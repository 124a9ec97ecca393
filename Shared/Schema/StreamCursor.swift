/// Where a consumer stands in a sequenced stream (the ingest journal, or a service's journal of
/// derived events) and what it must do next. Pure: the follower that owns it does the I/O.
///
/// The stream's records carry seqs 1, 2, 3… with no gaps. They arrive live over PUB/SUB, which
/// may drop or reorder nothing but may lose a tail, and can be replayed from their source. The
/// cursor applies each seq exactly once and in order:
/// - at start, everything after the checkpoint is replayed;
/// - a live record right after the last applied one is applied; an older one is skipped; one
///   after a gap asks for a replay of the gap first;
/// - the source's heartbeat claims its last seq: a claim still not applied by the next heartbeat
///   was lost at the tail and is replayed; the first heartbeat ends the catch-up, after which the
///   cursor is live (records come straight off the bus).
public struct StreamCursor: Sendable, Equatable {
    /// What to do with a live record.
    public enum Step: Sendable, Equatable {
        /// It is the next one: apply it, then call `applied(_:)`.
        case apply
        /// Already applied (a duplicate, or one a replay brought first).
        case skip
        /// Records `lastApplied + 1 ... through` are missing: replay them, then offer this record
        /// again with `afterFill(_:)`.
        case fill(through: UInt64)
    }

    /// The last seq applied; the consumer's checkpoint.
    public private(set) var lastApplied: UInt64
    /// Whether the start-up catch-up is done and the source is known to reach us live.
    public private(set) var isLive = false
    /// The last seq the source's previous heartbeat claimed.
    private var claimed: UInt64 = 0
    /// The seq through which a pending catch-up must reach before the cursor is live.
    private var liveAfter: UInt64?

    public init(lastApplied: UInt64) {
        self.lastApplied = lastApplied
    }

    /// A live record with `seq` arrived.
    public func received(_ seq: UInt64) -> Step {
        if seq <= lastApplied { return .skip }
        if seq == lastApplied + 1 { return .apply }
        return .fill(through: seq - 1)
    }

    /// A live record offered again after its gap was replayed. If the gap is still open (the
    /// source could not be reached, or is shutting down) it is skipped: applying it would skip
    /// the gap for good, and the next heartbeat replays it anyway.
    public func afterFill(_ seq: UInt64) -> Step {
        seq == lastApplied + 1 ? .apply : .skip
    }

    /// Records that `seq` was applied. Returns false, and records nothing, unless it is the next
    /// seq: a record is never applied out of order.
    @discardableResult
    public mutating func applied(_ seq: UInt64) -> Bool {
        guard seq == lastApplied + 1 else { return false }
        lastApplied = seq
        return true
    }

    /// The source's heartbeat says its last seq is `last`. Returns the seq to replay through, if
    /// anything must be replayed (a lost tail, or the start-up catch-up); call `replayEnded()`
    /// once that replay returns.
    public mutating func heartbeat(claims last: UInt64) -> UInt64? {
        var target: UInt64?
        // Everything before this heartbeat passed through the same queue: a seq the previous
        // one claimed that is still missing was lost.
        if claimed > lastApplied { target = claimed }
        claimed = last
        if !isLive, last > lastApplied || target != nil {
            liveAfter = max(last, target ?? 0)
            target = liveAfter
        } else if !isLive {
            isLive = true
        }
        return target
    }

    /// A replay asked for by `heartbeat(claims:)` returned. The catch-up is over once it reached
    /// its target; a replay cut short (the source unreachable, shutdown) leaves the cursor
    /// catching up, and the next heartbeat asks again.
    public mutating func replayEnded() {
        guard let target = liveAfter else { return }
        if lastApplied >= target {
            isLive = true
            liveAfter = nil
        }
    }
}
