import CZMQ
import Glibc

/// One message: its frames, in order.
public typealias ZMQMessage = [[UInt8]]

/// Makes a value of each message a subscription receives, on the I/O thread, from the frames
/// where libzmq holds them: only what the value keeps is copied. One reader serves one
/// subscription and may keep state from message to message.
public protocol ZMQMessageReader: Sendable {
    associatedtype Message: Sendable
    /// Frame `index` of the message being received; `frame` is valid only during the call.
    /// Index 0 starts a new message (a receive that failed part-way leaves no `finish`).
    mutating func read(frame index: Int, _ frame: UnsafeRawBufferPointer)
    /// The message had `frameCount` frames, all read: its value, or `nil` to drop it.
    mutating func finish(frameCount: Int) -> Message?
    /// The values of the messages waiting on `socket`, at most `limit` of them. Left to the
    /// default: the requirement only lets it be compiled for each reader type, so that the calls
    /// per frame are direct (the subscription that calls it is generic in another module).
    mutating func receive(from socket: ZMQSocket, limit: Int) -> [Message]
}

extension ZMQMessageReader {
    @inlinable
    public mutating func receive(from socket: ZMQSocket, limit: Int) -> [Message] {
        var messages: [Message] = []
        for _ in 0..<limit {
            guard let frames = try? socket.receive({ index, frame in read(frame: index, frame) }) else { break }
            if let message = finish(frameCount: frames) { messages.append(message) }
        }
        return messages
    }
}

/// Copies every frame: the message as it came.
public struct ZMQFrameCopier: ZMQMessageReader {
    private var frames: ZMQMessage = []

    public init() {}

    public mutating func read(frame index: Int, _ frame: UnsafeRawBufferPointer) {
        if index == 0 {
            frames = []
            frames.reserveCapacity(4)  // a bus message has three frames, a request three or four
        }
        frames.append(Array(frame.assumingMemoryBound(to: UInt8.self)))
    }

    public mutating func finish(frameCount: Int) -> ZMQMessage? {
        defer { frames = [] }
        return frames
    }
}

public enum ZMQSocketType: Sendable {
    case pub, sub, xpub, xsub, req, rep, dealer, router, push, pull, pair

    var rawValue: Int32 {
        switch self {
        case .pub: ZMQ_PUB
        case .sub: ZMQ_SUB
        case .xpub: ZMQ_XPUB
        case .xsub: ZMQ_XSUB
        case .req: ZMQ_REQ
        case .rep: ZMQ_REP
        case .dealer: ZMQ_DEALER
        case .router: ZMQ_ROUTER
        case .push: ZMQ_PUSH
        case .pull: ZMQ_PULL
        case .pair: ZMQ_PAIR
        }
    }
}

/// Socket options used with `setOption`, by name.
public enum ZMQOption {
    public static let linger = ZMQ_LINGER
    public static let sendHighWaterMark = ZMQ_SNDHWM
    public static let receiveHighWaterMark = ZMQ_RCVHWM
    /// Queue messages only to completed connections.
    public static let immediate = ZMQ_IMMEDIATE
}

/// CURVE settings for a `tcp://` socket: a server holds its secret key, a client knows the
/// server's public key and has a key pair of its own.
public enum CurveRole: Sendable, Equatable {
    case server(CurveKeyPair)
    case client(serverPublicKey: String, own: CurveKeyPair)
}

/// A libzmq socket. Like the libzmq socket it wraps, it is not thread-safe: create it, use it and
/// close it on one thread (a `ZMQLoop`'s I/O thread, or a benchmark's own thread), or hand it
/// between threads only across a lock (`ZMQSendingSocket`).
public final class ZMQSocket {
    public let type: ZMQSocketType
    /// The last endpoint bound or connected, for error messages.
    public private(set) var endpoint: String?
    private var handle: UnsafeMutableRawPointer?
    // Keeps the context alive until every socket is closed: zmq_ctx_term waits for them.
    private let context: ZMQContext

    /// - Parameter lingerMilliseconds: how long `close` may wait to flush queued messages. Always
    ///   set, because libzmq's default (forever) can hang a process at exit.
    public init(_ context: ZMQContext, _ type: ZMQSocketType, lingerMilliseconds: Int32 = 0) throws(ZMQError) {
        guard let handle = zmq_socket(context.handle, type.rawValue) else {
            throw ZMQError.last("zmq_socket")
        }
        self.context = context
        self.type = type
        self.handle = handle
        try setOption(ZMQ_LINGER, lingerMilliseconds)
    }

    deinit { close() }

    public func close() {
        if let handle {
            zmq_close(handle)
            self.handle = nil
        }
    }

    var rawHandle: UnsafeMutableRawPointer? { handle }

    private func open(_ operation: String) throws(ZMQError) -> UnsafeMutableRawPointer {
        guard let handle else { throw ZMQError(errno: ENOTSOCK, operation: operation, endpoint: endpoint) }
        return handle
    }

    // MARK: Endpoints

    public func bind(_ endpoint: String) throws(ZMQError) {
        self.endpoint = endpoint
        if zmq_bind(try open("zmq_bind"), endpoint) != 0 { throw ZMQError.last("zmq_bind", endpoint) }
    }

    public func connect(_ endpoint: String) throws(ZMQError) {
        self.endpoint = endpoint
        if zmq_connect(try open("zmq_connect"), endpoint) != 0 { throw ZMQError.last("zmq_connect", endpoint) }
    }

    // MARK: Options

    public func setOption(_ option: Int32, _ value: Int32) throws(ZMQError) {
        var value = value
        let rc = zmq_setsockopt(try open("zmq_setsockopt"), option, &value, MemoryLayout<Int32>.size)
        if rc != 0 { throw ZMQError.last("zmq_setsockopt(\(option))", endpoint) }
    }

    public func setOption(_ option: Int32, bytes: [UInt8]) throws(ZMQError) {
        let handle = try open("zmq_setsockopt")
        let rc = bytes.withUnsafeBytes { zmq_setsockopt(handle, option, $0.baseAddress, $0.count) }
        if rc != 0 { throw ZMQError.last("zmq_setsockopt(\(option))", endpoint) }
    }

    /// The endpoint actually bound, e.g. the port chosen for `tcp://127.0.0.1:0`.
    public func lastEndpoint() throws(ZMQError) -> String {
        var buffer = [CChar](repeating: 0, count: 1024)
        var size = buffer.count
        guard zmq_getsockopt(try open("zmq_getsockopt"), ZMQ_LAST_ENDPOINT, &buffer, &size) == 0 else {
            throw ZMQError.last("zmq_getsockopt(ZMQ_LAST_ENDPOINT)", endpoint)
        }
        return String(decoding: buffer.prefix(while: { $0 != 0 }).map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }

    /// Queue limits in messages; 0 means unlimited.
    public func setHighWaterMarks(send: Int32, receive: Int32) throws(ZMQError) {
        try setOption(ZMQ_SNDHWM, send)
        try setOption(ZMQ_RCVHWM, receive)
    }

    /// SUB only: receive messages whose first frame starts with `prefix` ("" for all).
    public func subscribe(_ prefix: String) throws(ZMQError) {
        try setOption(ZMQ_SUBSCRIBE, bytes: Array(prefix.utf8))
    }

    /// Applies CURVE security; call before bind or connect.
    public func setCurve(_ role: CurveRole) throws(ZMQError) {
        switch role {
        case .server(let keys):
            try setOption(ZMQ_CURVE_SERVER, 1)
            try setOption(ZMQ_CURVE_SECRETKEY, bytes: Array(keys.secretKey.utf8))
        case .client(let serverPublicKey, let own):
            try setOption(ZMQ_CURVE_SERVERKEY, bytes: Array(serverPublicKey.utf8))
            try setOption(ZMQ_CURVE_PUBLICKEY, bytes: Array(own.publicKey.utf8))
            try setOption(ZMQ_CURVE_SECRETKEY, bytes: Array(own.secretKey.utf8))
        }
    }

    // MARK: Sending

    /// Sends every frame of `message`. Returns `false` when the socket would block (a full queue,
    /// or no peer yet) and nothing was sent.
    @discardableResult
    public func send(_ message: ZMQMessage, dontWait: Bool = true) throws(ZMQError) -> Bool {
        for index in message.indices {
            // libzmq accepts the remaining frames once it took the first, so EAGAIN can only
            // happen on frame 0 and no partial message is left behind.
            guard try send(frame: message[index], more: index < message.count - 1, dontWait: dontWait) else { return false }
        }
        return true
    }

    /// Sends one frame; `more` marks that further frames of the same message follow.
    @discardableResult
    public func send(frame: UnsafeRawBufferPointer, more: Bool, dontWait: Bool = true) throws(ZMQError) -> Bool {
        let handle = try open("zmq_send")
        var flags = dontWait ? ZMQ_DONTWAIT : 0
        if more { flags |= ZMQ_SNDMORE }
        while true {
            if zmq_send(handle, frame.baseAddress, frame.count, flags) >= 0 { return true }
            let errno = zmq_errno()
            if errno == EINTR { continue }
            if errno == EAGAIN { return false }
            throw ZMQError(errno: errno, operation: "zmq_send", endpoint: endpoint)
        }
    }

    /// The same for a frame in an array.
    @discardableResult
    public func send(frame: [UInt8], more: Bool, dontWait: Bool = true) throws(ZMQError) -> Bool {
        // `withUnsafeBytes` rethrows untyped errors; the `Result` keeps the type.
        try frame.withUnsafeBytes { bytes in
            Result { () throws(ZMQError) in try send(frame: bytes, more: more, dontWait: dontWait) }
        }.get()
    }

    // MARK: Receiving

    /// Receives one whole message, each frame copied into an array. Returns `nil` when nothing
    /// is waiting (with `dontWait`).
    public func receive(dontWait: Bool = true) throws(ZMQError) -> ZMQMessage? {
        var copier = ZMQFrameCopier()
        guard let count = try receive(dontWait: dontWait, { index, frame in copier.read(frame: index, frame) }) else { return nil }
        return copier.finish(frameCount: count)
    }

    /// Receives one message and hands each frame's bytes to `body` without copying them. Returns
    /// the number of frames, or `nil` when nothing is waiting.
    public func receive(
        dontWait: Bool = true,
        _ body: (_ index: Int, _ frame: UnsafeRawBufferPointer) -> Void
    ) throws(ZMQError) -> Int? {
        let handle = try open("zmq_msg_recv")
        var message = zmq_msg_t()
        zmq_msg_init(&message)
        defer { zmq_msg_close(&message) }
        var index = 0
        while true {
            // Only the first frame may would-block: the rest of a message arrives with it.
            let flags: Int32 = (dontWait && index == 0) ? ZMQ_DONTWAIT : 0
            if zmq_msg_recv(&message, handle, flags) < 0 {
                let errno = zmq_errno()
                if errno == EINTR { continue }
                if errno == EAGAIN && index == 0 { return nil }
                throw ZMQError(errno: errno, operation: "zmq_msg_recv", endpoint: endpoint)
            }
            body(index, UnsafeRawBufferPointer(start: zmq_msg_data(&message), count: zmq_msg_size(&message)))
            index += 1
            if zmq_msg_more(&message) == 0 { return index }
        }
    }
}

/// Blocks the calling thread in `zmq_proxy` until the context is shut down. Run it only on a
/// dedicated thread.
public func zmqProxy(frontend: ZMQSocket, backend: ZMQSocket) -> ZMQError {
    zmq_proxy(frontend.rawHandle, backend.rawHandle, nil)
    return ZMQError.last("zmq_proxy", frontend.endpoint)
}
