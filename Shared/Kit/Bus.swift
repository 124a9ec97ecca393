import DrivebusSchema
import DrivebusSettings
import DrivebusZMQ
import Foundation
import Synchronization

/// A process's connection to the bus: one I/O thread owning every socket, plus the helpers that
/// speak the envelope over it.
public final class BusClient: Sendable {
    public let loop: ZMQLoop
    public let settings: ProcessSettings
    public let endpoints: (in: ZMQEndpoint, out: ZMQEndpoint)

    public init(settings: ProcessSettings, name: String) {
        self.settings = settings
        self.loop = ZMQLoop(name: name)
        self.endpoints = settings.busEndpoints()
    }

    /// A publisher on `bus.in` whose messages carry `source`.
    public func makePublisher(source: String) async throws -> Publisher {
        // A publisher's queue absorbs bursts (an Overland batch of 1,000 fixes) while the broker
        // catches up; linger lets the last messages out at shutdown.
        // An XPUB: the broker passes every subscription on, so messages nobody subscribed to are
        // not even made (ingest's record-by-record topics, when only journal pages are followed).
        // 10,000 messages: a journal page is up to 32 KB, so at most 320 MB while the broker lags
        // (its proxy thread forwards far faster than ingest publishes).
        let socket = try await loop.openPublishingSocket(
            connect: endpoints.in, lingerMilliseconds: 2000, highWaterMark: 10_000, learnsSubscriptions: true)
        return Publisher(source: source, socket: socket)
    }

    /// Waits until the broker has handed `publisher` the subscriptions it holds, and says whether
    /// that happened within `timeout`.
    ///
    /// A PUB that has just connected drops what it publishes until then, so a service that
    /// publishes at once on start (the events a crash recovery re-derives) could lose them. This
    /// publishes probes on a topic of the publisher's own until one comes back through the broker.
    /// The broker sends the subscriptions it already holds first, on the same pipe, so every
    /// subscriber's prefixes have arrived by the time a probe returns.
    public func waitForRoute(_ publisher: Publisher, within timeout: Duration = .seconds(5)) async -> Bool {
        guard let probes = try? await subscribe(["svc.probe.\(publisher.source)"]) else { return false }
        let arrived = ProbeArrival()
        await withTaskGroup(of: Void.self) { group in
            // Listens until cancelled: cancelling a waiting stream is what closes its socket.
            group.addTask { for await _ in probes { arrived.flag.store(true, ordering: .releasing) } }
            let deadline = ContinuousClock.now + timeout
            var pause = Duration.milliseconds(10)
            while !arrived.flag.load(ordering: .acquiring), ContinuousClock.now < deadline {
                _ = try? publisher.publish("svc.probe", device: publisher.source, payload: RPCEmpty())
                guard (try? await Task.sleep(for: pause)) != nil else { break }
                pause = min(pause * 2, .milliseconds(200))  // a broker that is not up yet need not be flooded
            }
            group.cancelAll()
        }
        return arrived.flag.load(ordering: .acquiring)
    }

    /// Every bus message whose topic starts with one of `prefixes` ("" for all); frames that are
    /// not a valid envelope never reach the consumer. What a slow reader has not taken yet waits
    /// in memory, up to `highWaterMark` messages in the socket and `bufferLimit` batches after
    /// it; beyond that, newer messages are dropped, or the oldest ones with `keepsNewest`.
    public func subscribe(
        _ prefixes: [String], highWaterMark: Int32 = 100_000, bufferLimit: Int = 4096, batchLimit: Int = ZMQLoop.drainBatch,
        keepsNewest: Bool = false
    ) async throws -> BusSubscription {
        try await loop.subscribeToBus(
            endpoints.out, prefixes: prefixes, highWaterMark: highWaterMark, bufferLimit: bufferLimit, batchLimit: batchLimit,
            keepsNewest: keepsNewest)
    }

    /// Calls `op` on a service's RPC socket and decodes the reply.
    public func call<Request: Encodable, Result: Codable & Sendable>(
        _ service: ServiceName, _ request: Request, as result: Result.Type, timeout: Duration = .seconds(5)
    ) async throws -> Result {
        let body = try await loop.request(
            ZMQEndpoint(settings.layout.rpcEndpoint(service)), body: BusJSON.encode(request), timeout: timeout)
        return try BusJSON.decode(RPCReply<Result>.self, from: body).get()
    }

    public func shutdown() async {
        await loop.shutdown()
    }
}

extension ZMQLoop {
    /// Subscribes to `prefixes` at `endpoint` (the broker's XPUB, or a publisher's PUB), with each
    /// message decoded as an envelope on the I/O thread: see `subscribe(_:prefixes:…)` for the
    /// limits. Frames that are not a valid envelope never reach the consumer.
    public func subscribeToBus(
        _ endpoint: ZMQEndpoint, prefixes: [String], highWaterMark: Int32 = 100_000, bufferLimit: Int = 4096,
        batchLimit: Int = ZMQLoop.drainBatch, keepsNewest: Bool = false
    ) async throws -> BusSubscription {
        BusSubscription(
            groups: try await subscribe(
                endpoint, prefixes: prefixes, highWaterMark: highWaterMark, bufferLimit: bufferLimit, batchLimit: batchLimit,
                keepsNewest: keepsNewest, reader: BusFrameReader()))
    }
}

/// Makes envelopes of the frames where libzmq holds them. Only the payload is copied into a
/// message of its own; the header is read through one buffer kept for every message, and a
/// publisher's epoch, the same on all its messages, stays one `String`.
struct BusFrameReader: ZMQMessageReader {
    private var topic: String?
    private var header: EnvelopeHeader?
    private var payload: [UInt8] = []
    private var headerFrame: [UInt8] = []
    private var lastEpoch: String?

    mutating func read(frame index: Int, _ frame: UnsafeRawBufferPointer) {
        switch index {
        case 0:
            (header, payload) = (nil, [])
            topic = try? BusMessage.topic(frame)
        case 1 where topic != nil:
            headerFrame.removeAll(keepingCapacity: true)
            headerFrame.append(contentsOf: frame.assumingMemoryBound(to: UInt8.self))
            header = try? BusMessage.header(headerFrame, knownEpoch: lastEpoch)
        case 2 where header != nil:
            payload = Array(frame.assumingMemoryBound(to: UInt8.self))
        default:
            break
        }
    }

    mutating func finish(frameCount: Int) -> BusMessage? {
        // Taken, not copied: the message owns them from here.
        let (topic, header) = (self.topic.take(), self.header.take())
        var payload: [UInt8] = []
        swap(&payload, &self.payload)
        guard frameCount == 3, let topic, let header else { return nil }
        lastEpoch = header.epoch
        return BusMessage(topic: topic, header: header, payload: payload)
    }
}

/// Decoded bus messages, in arrival order.
public struct BusSubscription: AsyncSequence, Sendable {
    public typealias Element = BusMessage
    /// The same messages, in the groups the I/O thread received them together: what one upload
    /// published usually arrives as one group.
    public let groups: AsyncStream<[BusMessage]>

    init(groups: AsyncStream<[BusMessage]>) { self.groups = groups }

    public struct AsyncIterator: AsyncIteratorProtocol {
        var groups: AsyncStream<[BusMessage]>.AsyncIterator
        var pending: [BusMessage] = []
        var next = 0

        public mutating func next() async -> BusMessage? {
            while next == pending.count {
                guard let group = await groups.next() else { return nil }
                (pending, next) = (group, 0)
            }
            defer { next += 1 }
            return pending[next]
        }
    }

    public func makeAsyncIterator() -> AsyncIterator { AsyncIterator(groups: groups.makeAsyncIterator()) }
}

/// Publishes envelopes with a `seq` that counts up with no gaps for this process's epoch.
public final class Publisher: Sendable {
    public enum PublishError: Error, CustomStringConvertible {
        case invalidType(String)
        case invalidDevice(String)
        case encoding(String)

        public var code: String {
            switch self {
            case .invalidType: "publish.type"
            case .invalidDevice: "publish.device"
            case .encoding: "publish.encoding"
            }
        }

        public var description: String {
            switch self {
            case .invalidType(let t): "\(code): \"\(t)\" is not a valid event type"
            case .invalidDevice(let d): "\(code): \"\(d)\" is not a valid device id"
            case .encoding(let why): "\(code): \(why)"
            }
        }
    }

    public let source: String
    /// This run's identity: a new epoch restarts `seq` at 1.
    public let epoch: String
    private let run = UInt64.random(in: 0...UInt64.max)
    private let socket: ZMQSendingSocket
    private let state = Mutex(State())

    private struct State {
        var seq: UInt64 = 0
        /// The last topic published, validated and encoded: a journal's records come in runs of
        /// one type and device.
        var topic: (type: String, device: String?, bytes: [UInt8])?
        /// The header frame, written afresh for each message into the same storage.
        var header: [UInt8] = []
    }

    /// Publishes on `socket`, a PUB socket.
    public init(source: String, socket: ZMQSendingSocket) {
        self.source = source
        self.epoch = UUID().uuidString.lowercased()
        self.socket = socket
    }

    /// The header `seq` of the last message published.
    public var lastSeq: UInt64 { state.withLock { $0.seq } }

    /// Publishes `payload` as `type[.device]`. `id` should be derived from the event's inputs
    /// for derived events, so that re-processing yields the same id. `time` is now unless given.
    /// Returns the message's `seq`, which it takes even when no subscriber wants it.
    @discardableResult
    public func publish(_ type: String, device: String? = nil, payload: some Encodable, id: String? = nil, time: Date? = nil) throws -> UInt64 {
        let bytes: [UInt8]
        do {
            bytes = try BusJSON.encode(payload)
        } catch {
            throw PublishError.encoding(String(describing: error))
        }
        return try publish(type, device: device, payloadJSON: bytes, id: id, time: time)
    }

    /// The hand-written types (fixes, motion) encode without a dynamic cast.
    @discardableResult
    public func publish(_ type: String, device: String? = nil, payload: some Encodable & FastJSONEncodable, id: String? = nil, time: Date? = nil) throws -> UInt64 {
        try publish(type, device: device, payloadJSON: BusJSON.encode(payload), id: id, time: time)
    }

    /// The header (its id, its time) is made only for a message that a subscriber wants: ingest
    /// publishes every record on its own topic too, which only tools such as `drivebus tail`
    /// follow.
    @discardableResult
    public func publish(
        _ type: String, device: String? = nil, payloadJSON: [UInt8], id: String? = nil, time: Date? = nil, logSeq: UInt64? = nil
    ) throws -> UInt64 {
        if let id, !id.utf8.allSatisfy({ (0x21...0x7E).contains($0) && $0 != UInt8(ascii: "\"") && $0 != UInt8(ascii: "\\") }) {
            throw PublishError.encoding("event id must be printable ASCII without quotes")
        }
        // Numbering and sending happen under one lock so that seq order is send order.
        return try state.withLock { state throws(PublishError) in
            let topic: [UInt8]
            if let last = state.topic, last.type == type, last.device == device {
                topic = last.bytes
            } else {
                guard Topic.isValidType(type) else { throw PublishError.invalidType(type) }
                if let device, !DeviceID.isValid(device) { throw PublishError.invalidDevice(device) }
                topic = Array(Topic.make(type, device: device).utf8)
                state.topic = (type, device, topic)
            }
            state.seq += 1
            let seq = state.seq
            // A PUB never blocks and never refuses a frame: at its high-water mark it drops the
            // message, as the bus does under load (subscribers see the gap in seq and replay).
            // A message no subscription covers is not made at all (its seq is used all the same,
            // as a PUB's filter would drop it).
            socket.withSocket(sendingOn: topic) { socket in
                state.header.removeAll(keepingCapacity: true)
                EnvelopeHeader.write(
                    id: id.map { .text($0) } ?? .numbered(run: run, seq: seq), type: type, source: source, seq: seq, epoch: epoch,
                    time: time ?? Date(), logSeq: logSeq, to: &state.header)
                _ = try? socket.send(frame: topic, more: true)
                _ = try? socket.send(frame: state.header, more: true)
                _ = try? socket.send(frame: payloadJSON, more: false)
            }
            return seq
        }
    }
}

/// Whether a start-up probe came back.
private final class ProbeArrival: Sendable {
    let flag = Atomic<Bool>(false)
}
