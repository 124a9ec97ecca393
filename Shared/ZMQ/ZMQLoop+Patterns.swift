import Synchronization
import CZMQ
import Glibc

/// Where a socket attaches, and how it is secured. `tcp://` endpoints need `curve`.
public struct ZMQEndpoint: Sendable, Equatable {
    public var address: String
    public var curve: CurveRole?

    public init(_ address: String, curve: CurveRole? = nil) {
        self.address = address
        self.curve = curve
    }
}

/// A request received by a ROUTER socket: the routing frames that lead back to the requester
/// (up to and including the empty delimiter a REQ peer adds), and the request body.
public struct ZMQRequest: Sendable {
    public let route: ZMQMessage
    public let body: [UInt8]
}

extension ZMQLoop {
    /// Messages a callback drains from one socket before the loop serves the others again.
    public static let drainBatch = 1024

    /// Opens a socket on the I/O thread, applying CURVE before attaching it.
    public func openSocket(
        _ type: ZMQSocketType,
        bind endpoint: ZMQEndpoint? = nil,
        connect remote: ZMQEndpoint? = nil,
        lingerMilliseconds: Int32 = 0,
        highWaterMark: Int32? = nil,
        configure: (@Sendable (ZMQSocket) throws -> Void)? = nil
    ) async throws -> SocketID {
        try await perform { io in
            let socket = try Self.makeSocket(
                io, type, bind: endpoint, connect: remote, lingerMilliseconds: lingerMilliseconds, highWaterMark: highWaterMark,
                configure: configure)
            return io.register(socket)
        }
    }

    /// Makes a socket on the I/O thread: options first, then CURVE, then bind or connect.
    private static func makeSocket(
        _ io: IO, _ type: ZMQSocketType, bind endpoint: ZMQEndpoint?, connect remote: ZMQEndpoint?, lingerMilliseconds: Int32,
        highWaterMark: Int32?, configure: (@Sendable (ZMQSocket) throws -> Void)? = nil
    ) throws -> sending ZMQSocket {
        let socket = try ZMQSocket(io.context, type, lingerMilliseconds: lingerMilliseconds)
        if let highWaterMark { try socket.setHighWaterMarks(send: highWaterMark, receive: highWaterMark) }
        try configure?(socket)
        if let curve = (endpoint ?? remote)?.curve { try socket.setCurve(curve) }
        if let endpoint { try socket.bind(endpoint.address) }
        if let remote { try socket.connect(remote.address) }
        return socket
    }

    /// Opens a PUB socket that callers send on directly from any thread (see `ZMQSendingSocket`).
    /// Only a PUB or XPUB: it never blocks and never takes part of a message (at its high-water
    /// mark it drops the whole message). With `learnsSubscriptions` it is an XPUB, which tells
    /// the sender which topics anyone subscribed to. It is made and attached on the I/O thread,
    /// and closed when the loop stops.
    public func openPublishingSocket(
        bind endpoint: ZMQEndpoint? = nil,
        connect remote: ZMQEndpoint? = nil,
        lingerMilliseconds: Int32 = 0,
        highWaterMark: Int32? = nil,
        learnsSubscriptions: Bool = false
    ) async throws -> ZMQSendingSocket {
        try await perform { io in
            let socket = try Self.makeSocket(
                io, learnsSubscriptions ? .xpub : .pub, bind: endpoint, connect: remote, lingerMilliseconds: lingerMilliseconds,
                highWaterMark: highWaterMark
            ) { socket in
                // Nothing is queued for a peer that is not connected, and a lost connection ends
                // its pipe: an XPUB then hears the peer's subscriptions go, and hears them again
                // from the broker it reconnects to (else a restarted broker's subscribers that
                // left would stay known for ever, and their messages be made and queued).
                if remote != nil { try socket.setOption(ZMQ_IMMEDIATE, 1) }
            }
            let sending = ZMQSendingSocket(socket, learnsSubscriptions: learnsSubscriptions)
            io.closeWhenStopping(sending)
            return sending
        }
    }

    /// Subscribes to `prefixes` at `endpoint` (an XPUB or PUB) and yields what arrives, in
    /// batches: one batch is everything the I/O thread drained in one go (at most `batchLimit`
    /// messages), which spares the consumer a task switch per message.
    ///
    /// At most `bufferLimit` batches wait in the stream; beyond that newer ones are dropped, as
    /// the bus itself does under load, and consumers notice the gap in `seq` and replay. A
    /// reader that wants only the latest state (`keepsNewest`) has the oldest dropped instead.
    /// The I/O thread keeps the socket drained, so what a slow reader holds is bounded by
    /// `bufferLimit` × `batchLimit` messages, not by the socket's `highWaterMark`.
    public func subscribe(
        _ endpoint: ZMQEndpoint,
        prefixes: [String],
        highWaterMark: Int32 = 100_000,
        bufferLimit: Int = 4096,
        batchLimit: Int = ZMQLoop.drainBatch,
        keepsNewest: Bool = false
    ) async throws -> AsyncStream<[ZMQMessage]> {
        try await subscribe(
            endpoint, prefixes: prefixes, highWaterMark: highWaterMark, bufferLimit: bufferLimit, batchLimit: batchLimit,
            keepsNewest: keepsNewest, reader: ZMQFrameCopier())
    }

    /// The same, with each message made into a value by `reader` on the I/O thread, from its
    /// frames in place: a subscriber that keeps only parts of the frames copies only those.
    public func subscribe<Reader: ZMQMessageReader>(
        _ endpoint: ZMQEndpoint,
        prefixes: [String],
        highWaterMark: Int32 = 100_000,
        bufferLimit: Int = 4096,
        batchLimit: Int = ZMQLoop.drainBatch,
        keepsNewest: Bool = false,
        reader: Reader
    ) async throws -> AsyncStream<[Reader.Message]> {
        precondition(batchLimit > 0, "a batch limit of \(batchLimit) would never drain the socket")
        let (stream, continuation) = AsyncStream.makeStream(
            of: [Reader.Message].self, bufferingPolicy: keepsNewest ? .bufferingNewest(bufferLimit) : .bufferingOldest(bufferLimit))
        let id = try await perform { io -> SocketID in
            let socket = try ZMQSocket(io.context, .sub)
            try socket.setHighWaterMarks(send: highWaterMark, receive: highWaterMark)
            for prefix in prefixes { try socket.subscribe(prefix) }
            if let curve = endpoint.curve { try socket.setCurve(curve) }
            try socket.connect(endpoint.address)
            var reader = reader  // this subscription's own, kept on the I/O thread
            return io.register(
                socket,
                onReadable: { socket in
                    let batch = reader.receive(from: socket, limit: batchLimit)
                    if !batch.isEmpty { continuation.yield(batch) }
                },
                onClose: { continuation.finish() }
            )
        }
        continuation.onTermination = { [weak self] _ in self?.execute { $0.close(id) } }
        return stream
    }

    /// Binds a ROUTER socket that answers REQ and DEALER peers, and yields their requests. Answer
    /// each with `reply(to:with:on:)`; requests may be answered in any order.
    public func serveRequests(
        _ endpoint: ZMQEndpoint
    ) async throws -> (requests: AsyncStream<ZMQRequest>, socket: SocketID) {
        let (stream, continuation) = AsyncStream.makeStream(of: ZMQRequest.self, bufferingPolicy: .bufferingOldest(1024))
        let id = try await perform { io -> SocketID in
            let socket = try ZMQSocket(io.context, .router)
            if let curve = endpoint.curve { try socket.setCurve(curve) }
            try socket.bind(endpoint.address)
            return io.register(
                socket,
                onReadable: { socket in
                    for _ in 0..<ZMQLoop.drainBatch {
                        guard let message = try? socket.receive() else { return }
                        // [identity…, "", body]: anything else is not a request we can answer.
                        guard let delimiter = message.firstIndex(where: \.isEmpty), delimiter == message.count - 2 else { continue }
                        continuation.yield(ZMQRequest(route: Array(message[...delimiter]), body: message[message.count - 1]))
                    }
                },
                onClose: { continuation.finish() }
            )
        }
        return (stream, id)
    }

    public func reply(to request: ZMQRequest, with body: [UInt8], on socket: SocketID) {
        send(request.route + [body], on: socket)
    }

    /// Sends one request to a REP or ROUTER peer and waits up to `timeout` for the reply. Each call
    /// uses a fresh REQ socket, so a lost reply never wedges later calls. Cancelling the task ends
    /// the wait at once with `CancellationError` (a service stopping does not wait out the timeout).
    public func request(_ endpoint: ZMQEndpoint, body: [UInt8], timeout: Duration) async throws -> [UInt8] {
        let pending = PendingRequest()
        return try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<[UInt8], any Error>) in
                executeOrFail { io in
                    guard let io else { return continuation.resume(throwing: ZMQLoop.LoopError.stopped) }
                    guard !pending.cancelled else { return continuation.resume(throwing: CancellationError()) }
                    do {
                        let socket = try ZMQSocket(io.context, .req)
                        if let curve = endpoint.curve { try socket.setCurve(curve) }
                        try socket.connect(endpoint.address)
                        guard try socket.send([body]) else {
                            throw ZMQError(errno: EAGAIN, operation: "request", endpoint: endpoint.address)
                        }
                        // Closing the socket resumes the caller, exactly once: on the reply, on a
                        // timeout, on cancellation, or when the loop stops.
                        pending.socket = io.register(
                            socket,
                            onReadable: { socket in
                                do {
                                    guard let reply = try socket.receive() else { return }
                                    pending.finish(.success(reply.last ?? []), io)
                                } catch {
                                    pending.finish(.failure(error), io)
                                }
                            },
                            onClose: {
                                continuation.resume(with: pending.takeOutcome() ?? .failure(ZMQLoop.LoopError.stopped))
                            }
                        )
                        // Weakly: the timer outlives the request, and must not keep its reply
                        // (a replay page, half a megabyte) alive for the rest of the timeout.
                        io.schedule(after: timeout) { [weak pending] in
                            pending?.finish(.failure(ZMQError(errno: ETIMEDOUT, operation: "request", endpoint: endpoint.address)), io)
                        }
                    } catch {
                        continuation.resume(throwing: error)
                    }
                }
            }
        } onCancel: {
            executeOrFail { io in
                pending.cancelled = true
                if let io { pending.finish(.failure(CancellationError()), io) }
            }
        }
    }
}

/// One `request` in flight. Touched only on the loop's thread, so it needs no lock.
private final class PendingRequest: @unchecked Sendable {
    var socket: ZMQLoop.SocketID?
    var outcome: Result<[UInt8], any Error>?
    var cancelled = false

    /// Records the first outcome and closes the socket, which resumes the caller.
    func finish(_ result: Result<[UInt8], any Error>, _ io: ZMQLoop.IO) {
        guard let socket, io.socket(socket) != nil, outcome == nil else { return }
        outcome = result
        io.close(socket)
    }

    /// The outcome, handed over to the caller and no longer held here.
    func takeOutcome() -> Result<[UInt8], any Error>? {
        defer { outcome = nil }
        return outcome
    }
}

/// Requests to one ROUTER peer over a single DEALER connection, several in flight: they arrive
/// in the order they were sent (one connection is one queue), and each answer is matched to its
/// request by a number the peer's ROUTER hands back in the envelope. `ZMQLoop.request` opens a
/// connection per request instead, and two of those may overtake each other.
public final class PipelinedRequester: @unchecked Sendable {
    /// An answer to come.
    public final class Answer: Sendable {
        private enum State {
            case waiting(CheckedContinuation<[UInt8], any Error>?)
            case done(Result<[UInt8], any Error>)
        }
        private let state = Mutex(State.waiting(nil))

        /// Waits for the answer (or the error: timeout, loop stopped). One waiter: await it once.
        public var value: [UInt8] {
            get async throws {
                try await withCheckedThrowingContinuation { continuation in
                    let done = state.withLock { state -> Result<[UInt8], any Error>? in
                        if case .done(let result) = state { return result }
                        if case .waiting(.some) = state { preconditionFailure("an answer is awaited once") }
                        state = .waiting(continuation)
                        return nil
                    }
                    if let done { continuation.resume(with: done) }
                }
            }
        }

        fileprivate func finish(_ result: Result<[UInt8], any Error>) {
            let waiter = state.withLock { state -> CheckedContinuation<[UInt8], any Error>? in
                guard case .waiting(let waiter) = state else { return nil }
                state = .done(result)
                return waiter
            }
            waiter?.resume(with: result)
        }
    }

    // Touched only on the loop's thread.
    private var socket: ZMQLoop.SocketID?
    private var waiting: [UInt64: Answer] = [:]
    private var nextID: UInt64 = 0
    private let loop: ZMQLoop
    private let endpoint: ZMQEndpoint

    public init(loop: ZMQLoop, endpoint: ZMQEndpoint) {
        self.loop = loop
        self.endpoint = endpoint
    }

    /// Queues `body` to be sent after every request queued before it, and returns at once; its
    /// answer comes within `timeout` or fails.
    public func send(_ body: [UInt8], timeout: Duration) -> Answer {
        let answer = Answer()
        loop.executeOrFail { [self] io in
            guard let io else { return answer.finish(.failure(ZMQLoop.LoopError.stopped)) }
            do {
                let socket = try open(io)
                nextID += 1
                let id = nextID
                guard try io.socket(socket)?.send([withUnsafeBytes(of: id.littleEndian) { Array($0) }, [], body]) == true else {
                    throw ZMQError(errno: EAGAIN, operation: "request", endpoint: endpoint.address)
                }
                waiting[id] = answer
                io.schedule(after: timeout) { [self] in
                    waiting.removeValue(forKey: id)?.finish(.failure(ZMQError(errno: ETIMEDOUT, operation: "request", endpoint: endpoint.address)))
                }
            } catch {
                answer.finish(.failure(error))
            }
        }
        return answer
    }

    /// Sends `body` and waits up to `timeout` for its answer.
    public func request(_ body: [UInt8], timeout: Duration) async throws -> [UInt8] {
        try await send(body, timeout: timeout).value
    }

    /// Closes the connection; requests still waiting fail.
    public func close() {
        loop.executeOrFail { [self] io in
            if let socket, let io { io.close(socket) }
            socket = nil
        }
    }

    private func open(_ io: ZMQLoop.IO) throws -> ZMQLoop.SocketID {
        if let socket { return socket }
        let dealer = try ZMQSocket(io.context, .dealer)
        if let curve = endpoint.curve { try dealer.setCurve(curve) }
        try dealer.connect(endpoint.address)
        let id = io.register(
            dealer,
            onReadable: { [self] socket in
                for _ in 0..<ZMQLoop.drainBatch {
                    // [request number, "", answer]; an answer to a request that timed out is dropped.
                    guard let message = try? socket.receive() else { return }
                    guard message.count == 3, message[0].count == 8, message[1].isEmpty else { continue }
                    let id = UInt64(littleEndian: message[0].withUnsafeBytes { $0.loadUnaligned(as: UInt64.self) })
                    waiting.removeValue(forKey: id)?.finish(.success(message[2]))
                }
            },
            onClose: { [self] in
                let stranded = waiting
                waiting = [:]
                for answer in stranded.values { answer.finish(.failure(ZMQLoop.LoopError.stopped)) }
            }
        )
        socket = id
        return id
    }
}
