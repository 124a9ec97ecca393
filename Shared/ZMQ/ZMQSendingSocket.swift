import Synchronization

/// A socket that callers on any thread send on directly, one at a time under a lock, instead of
/// queueing every message to the loop's I/O thread.
///
/// For a PUB socket that hop cost more than the send: a queue, a wake-up, and every frame freed
/// on another thread than the one that made it (which contends for malloc's arena lock). A PUB
/// send never blocks (it drops at the high-water mark) and a PUB is never polled, so nothing needs
/// the I/O thread. libzmq lets a socket move between threads across a full memory barrier, which
/// the lock is. The loop still closes it when it stops.
public final class ZMQSendingSocket: Sendable {
    private let socket: Mutex<ZMQSocket?>

    init(_ socket: consuming sending ZMQSocket) {
        self.socket = Mutex(socket)
    }

    /// Runs `body` with the socket while holding its lock; `nil` once it is closed. `body` must
    /// not block: send with `dontWait`.
    public func withSocket<Result, Failure: Error>(
        _ body: (ZMQSocket) throws(Failure) -> sending Result
    ) throws(Failure) -> sending Result? {
        try socket.withLock { (socket: inout sending ZMQSocket?) throws(Failure) -> sending Result? in
            guard let open = socket else { return nil }
            return try body(open)
        }
    }

    /// Closes the socket; later sends do nothing.
    public func close() {
        socket.withLock { socket in
            socket?.close()
            socket = nil
        }
    }
}
