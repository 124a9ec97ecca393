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
    static let drainBatch = 1024

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
            let socket = try ZMQSocket(io.context, type, lingerMilliseconds: lingerMilliseconds)
            if let highWaterMark { try socket.setHighWaterMarks(send: highWaterMark, receive: highWaterMark) }
            try configure?(socket)
            if let curve = (endpoint ?? remote)?.curve { try socket.setCurve(curve) }
            if let endpoint { try socket.bind(endpoint.address) }
            if let remote { try socket.connect(remote.address) }
            return io.register(socket)
        }
    }

    /// Subscribes to `prefixes` at `endpoint` (an XPUB or PUB) and yields what arrives, in
    /// batches: one batch is everything the I/O thread drained in one go (at most 1,024
    /// messages), which spares the consumer a task switch per message.
    ///
    /// At most `bufferLimit` batches wait in the stream; beyond that newer ones are dropped, as
    /// the bus itself does under load, and consumers notice the gap in `seq` and replay.
    public func subscribe(
        _ endpoint: ZMQEndpoint,
        prefixes: [String],
        highWaterMark: Int32 = 100_000,
        bufferLimit: Int = 4096
    ) async throws -> AsyncStream<[ZMQMessage]> {
        let (stream, continuation) = AsyncStream.makeStream(
            of: [ZMQMessage].self, bufferingPolicy: .bufferingOldest(bufferLimit))
        let id = try await perform { io -> SocketID in
            let socket = try ZMQSocket(io.context, .sub)
            try socket.setHighWaterMarks(send: highWaterMark, receive: highWaterMark)
            for prefix in prefixes { try socket.subscribe(prefix) }
            if let curve = endpoint.curve { try socket.setCurve(curve) }
            try socket.connect(endpoint.address)
            return io.register(
                socket,
                onReadable: { socket in
                    var batch: [ZMQMessage] = []
                    while batch.count < ZMQLoop.drainBatch, let message = try? socket.receive() {
                        batch.append(message)
                    }
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
    /// uses a fresh REQ socket, so a lost reply never wedges later calls.
    public func request(_ endpoint: ZMQEndpoint, body: [UInt8], timeout: Duration) async throws -> [UInt8] {
        try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<[UInt8], any Error>) in
            executeOrFail { io in
                guard let io else { return continuation.resume(throwing: ZMQLoop.LoopError.stopped) }
                do {
                    let socket = try ZMQSocket(io.context, .req)
                    if let curve = endpoint.curve { try socket.setCurve(curve) }
                    try socket.connect(endpoint.address)
                    guard try socket.send([body]) else {
                        throw ZMQError(errno: EAGAIN, operation: "request", endpoint: endpoint.address)
                    }
                    var outcome: Result<[UInt8], any Error>?
                    var id: SocketID?
                    // Closing the socket resumes the caller, exactly once: on the reply, on a
                    // timeout, or when the loop stops.
                    id = io.register(
                        socket,
                        onReadable: { socket in
                            do {
                                guard let reply = try socket.receive() else { return }
                                outcome = .success(reply.last ?? [])
                            } catch {
                                outcome = .failure(error)
                            }
                            if let id { io.close(id) }
                        },
                        onClose: {
                            continuation.resume(with: outcome ?? .failure(ZMQLoop.LoopError.stopped))
                        }
                    )
                    io.schedule(after: timeout) {
                        guard let id, io.socket(id) != nil else { return }
                        outcome = .failure(ZMQError(errno: ETIMEDOUT, operation: "request", endpoint: endpoint.address))
                        io.close(id)
                    }
                } catch {
                    continuation.resume(throwing: error)
                }
            }
        }
    }
}
