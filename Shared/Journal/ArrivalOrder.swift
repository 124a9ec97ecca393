import Synchronization

/// Keeps the requests of chosen RPC ops in the order they arrived where it matters, while the
/// rest of their work runs concurrently: an import sends its next batch while ingest journals
/// the last, and the batches must still reach the journal in the file's order.
///
/// `RPCService` numbers each request of an ordered op as it arrives and runs its handler with
/// that number in `ArrivalOrder.current`. The handler parses as it likes, then waits for its turn
/// (`turn`), does what must be in order, and leaves (`leave`). `RPCService` leaves for it when
/// the handler returns, so a request that failed early never holds up the next.
public final class ArrivalOrder: Sendable {
    @TaskLocal public static var current: UInt64?

    private struct State {
        var nextNumber: UInt64 = 0
        /// Every number below this one has left.
        var turn: UInt64 = 0
        var left: Set<UInt64> = []
        var waiting: [UInt64: CheckedContinuation<Void, Never>] = [:]
    }

    private let state = Mutex(State())

    public init() {}

    /// The next arrival's number: called by the RPC service, in arrival order.
    public func number() -> UInt64 {
        state.withLock { state in
            defer { state.nextNumber += 1 }
            return state.nextNumber
        }
    }

    /// How many requests are waiting for their turn.
    public var waiting: Int { state.withLock { $0.waiting.count } }

    /// Returns once every request that arrived before `number` has left.
    public func turn(_ number: UInt64) async {
        await withCheckedContinuation { continuation in
            let ready = state.withLock { state -> Bool in
                // Its turn has come (or passed: it left already).
                guard number > state.turn else { return true }
                state.waiting[number] = continuation
                return false
            }
            if ready { continuation.resume() }
        }
    }

    /// `number` is done with what must be in order; leaving twice is harmless.
    public func leave(_ number: UInt64) {
        let next = state.withLock { state -> CheckedContinuation<Void, Never>? in
            guard number >= state.turn else { return nil }
            state.left.insert(number)
            while state.left.remove(state.turn) != nil { state.turn += 1 }
            return state.waiting.removeValue(forKey: state.turn)
        }
        next?.resume()
    }
}
