import Synchronization

/// A socket that callers on any thread send on directly, one at a time under a lock, instead of
/// queueing every message to the loop's I/O thread.
///
/// For a PUB socket that hop cost more than the send: a queue, a wake-up, and every frame freed
/// on another thread than the one that made it (which contends for malloc's arena lock). A PUB
/// send never blocks (it drops at the high-water mark) and a PUB is never polled, so nothing needs
/// the I/O thread. libzmq lets a socket move between threads across a full memory barrier, which
/// the lock is. The loop still closes it when it stops.
///
/// An XPUB sends the same way, and also tells which topics anyone subscribed to: a publisher
/// then skips making a message that the socket would only drop (ingest's record-by-record
/// topics, when only journal pages are followed).
public final class ZMQSendingSocket: Sendable {
    private struct State {
        var socket: ZMQSocket?
        /// The prefixes subscribed to, as an XPUB hears of them; nil for a PUB, which does not tell.
        var prefixes: [[UInt8]]?
        /// Topics already matched against `prefixes`, until they change.
        var wanted: [[UInt8]: Bool] = [:]
        /// When the XPUB was last asked for news: asking costs libzmq a `poll` call.
        var lastRead = ContinuousClock.now - .seconds(1)
    }

    private let state: Mutex<State>

    init(_ socket: consuming sending ZMQSocket, learnsSubscriptions: Bool) {
        self.state = Mutex(State(socket: socket, prefixes: learnsSubscriptions ? [] : nil))
    }

    /// Runs `body` with the socket while holding its lock; `nil` once it is closed. `body` must
    /// not block: send with `dontWait`.
    public func withSocket<Result, Failure: Error>(
        _ body: (ZMQSocket) throws(Failure) -> sending Result
    ) throws(Failure) -> sending Result? {
        try state.withLock { (state: inout sending State) throws(Failure) -> sending Result? in
            guard let open = state.socket else { return nil }
            return try body(open)
        }
    }

    /// Like `withSocket`, but only if a message on `topic` would reach a subscriber: always on a
    /// PUB (it filters for itself), on an XPUB if a subscription it was told of covers `topic`.
    public func withSocket<Result, Failure: Error>(
        sendingOn topic: [UInt8], _ body: (ZMQSocket) throws(Failure) -> sending Result
    ) throws(Failure) -> sending Result? {
        try state.withLock { (state: inout sending State) throws(Failure) -> sending Result? in
            guard let open = state.socket else { return nil }
            guard Self.wants(topic, &state, open) else { return nil }
            return try body(open)
        }
    }

    /// Reads the (un)subscriptions waiting on an XPUB, then matches `topic`.
    private static func wants(_ topic: [UInt8], _ state: inout State, _ socket: ZMQSocket) -> Bool {
        guard state.prefixes != nil else { return true }
        // At most once a millisecond: a subscription that arrived meanwhile misses at most that
        // much, as a subscriber that has just connected does anyway.
        let now = ContinuousClock.now
        if now - state.lastRead >= .milliseconds(1) { Self.read(&state, socket, now: now) }
        if let known = state.wanted[topic] { return known }
        let wanted = state.prefixes?.contains { prefix in topic.starts(with: prefix) } ?? true
        state.wanted[topic] = wanted
        return wanted
    }

    private static func read(_ state: inout State, _ socket: ZMQSocket, now: ContinuousClock.Instant) {
        state.lastRead = now
        // Each is one frame: 1 and the prefix to subscribe, 0 and the prefix to unsubscribe.
        // An XPUB passes on only a prefix's first subscription and its last unsubscription.
        while let message = try? socket.receive(dontWait: true), let frame = message.first, let kind = frame.first {
            let prefix = Array(frame.dropFirst())
            if kind == 1 {
                state.prefixes?.append(prefix)
            } else if kind == 0, let index = state.prefixes?.firstIndex(of: prefix) {
                state.prefixes?.remove(at: index)
            }
            state.wanted.removeAll()
        }
    }

    /// Closes the socket; later sends do nothing.
    public func close() {
        state.withLock { state in
            state.socket?.close()
            state.socket = nil
        }
    }
}
