import DrivebusJournal
import DrivebusSchema
import DrivebusSettings
import DrivebusZMQ
import Foundation
import Logging
import ServiceLifecycle
import Synchronization

/// What a service's executable receives once the kit has set up config, logging, the bus and its
/// RPC socket.
public struct ServiceContext: Sendable {
    public let name: ServiceName
    public let settings: ProcessSettings
    public let logger: Logger
    public let bus: BusClient
    public let publisher: Publisher
}

/// Answers one RPC request body with a reply body.
public typealias RPCHandler = @Sendable (_ request: [UInt8]) async -> [UInt8]

/// What a service adds to the kit's own work (heartbeat, `health`).
public struct ServiceParts: Sendable {
    /// Long-running work; each runs until graceful shutdown.
    public var services: [any Service]
    /// RPC ops beyond `health`.
    public var rpc: [String: RPCHandler]
    /// The last sequence numbers processed, by stream, for heartbeats and `health`.
    public var lastSeq: @Sendable () -> [String: UInt64]
    /// False while the service is still catching up: `health` then says `starting`.
    public var ready: @Sendable () -> Bool
    /// What the service counts, for the heartbeat (and so `/metrics`).
    public var counters: @Sendable () -> [String: UInt64]
    /// RPC ops whose requests are numbered as they arrive (see `ArrivalOrder`).
    public var ordered: (ops: Set<String>, order: ArrivalOrder)?

    public init(
        services: [any Service] = [], rpc: [String: RPCHandler] = [:], lastSeq: @escaping @Sendable () -> [String: UInt64] = { [:] },
        ready: @escaping @Sendable () -> Bool = { true }, counters: @escaping @Sendable () -> [String: UInt64] = { [:] },
        ordered: (ops: Set<String>, order: ArrivalOrder)? = nil
    ) {
        self.ordered = ordered
        self.services = services
        self.rpc = rpc
        self.lastSeq = lastSeq
        self.ready = ready
        self.counters = counters
    }

    /// A service built around a journal consumer: its seqs and readiness are the consumer's, and
    /// its event journal is served to followers.
    public init<Core>(consumer: JournalConsumer<Core>, services: [any Service] = [], rpc: [String: RPCHandler] = [:]) {
        self.init(
            services: [consumer] + services, rpc: rpc.merging(consumer.events.rpc) { own, _ in own },
            lastSeq: { ["journal": consumer.lastSeq, "events": consumer.events.journal.lastSeq] }, ready: { consumer.isLive })
    }
}

/// A condition a service meets once and keeps, such as its HTTP listener being bound: until
/// then `health` says `starting`, so that "ok" means a client can connect.
public final class ReadyFlag: Sendable {
    private let flag = Atomic<Bool>(false)

    public init() {}

    public func set() { flag.store(true, ordering: .releasing) }
    public var isSet: Bool { flag.load(ordering: .acquiring) }
}

public enum RPC {
    /// Wraps a typed handler: decodes its request, encodes its result or error.
    public static func handler<Request: Decodable & Sendable, Result: Codable & Sendable>(
        _ request: Request.Type, _ body: @escaping @Sendable (Request) async throws(RPCErrorBody) -> Result
    ) -> RPCHandler {
        { bytes in
            let reply: RPCReply<Result>
            do {
                let decoded = try BusJSON.decode(Request.self, from: bytes)
                do throws(RPCErrorBody) {
                    reply = .success(try await body(decoded))
                } catch {
                    reply = .failure(error)
                }
            } catch {
                reply = .failure(.badRequest(String(describing: error)))
            }
            return encode(reply)
        }
    }

    static func encode<Result>(_ reply: RPCReply<Result>) -> [UInt8] {
        (try? BusJSON.encode(reply)) ?? Array(#"{"ok":false,"error":{"code":"rpc.internal","message":"reply could not be encoded"}}"#.utf8)
    }
}

/// Runs a service process: config, logging, instance lock, bus, heartbeat and RPC, until SIGTERM
/// or SIGINT, then a graceful shutdown.
public enum ServiceRunner {
    public static func run<Config: ServiceConfiguration>(
        _ name: ServiceName,
        configPath: String?,
        configuration: Config.Type,
        build: @Sendable (ServiceContext, Config) async throws -> ServiceParts = { _, _ in ServiceParts() }
    ) async -> Int32 {
        // Foundation's default time zone is the machine's, which it resolves through ICU's zone
        // data (up to 2.4 MB resident in each process) the first time anything makes a Calendar, as
        // Hummingbird's date header does. Nothing in a service shows local time through Foundation
        // (days and timestamps are UTC; log lines take their time from the C library), so UTC.
        NSTimeZone.default = TimeZone(secondsFromGMT: 0)!
        let loaded: Config
        let origin: ConfigOrigin
        do {
            (loaded, origin) = try Config.load(explicitPath: configPath)
        } catch {
            printError("\(name.executable): \(error)")
            return 2
        }
        let config = loaded.process
        DrivebusLogging.bootstrap(level: config.logLevel)
        var logger = Logger(label: "drivebus.\(name.rawValue)")
        logger[metadataKey: "service"] = "\(name.rawValue)"

        let lock: InstanceLock
        do {
            try config.layout.prepare()
            lock = try InstanceLock(name, layout: config.layout)
        } catch {
            printError("\(name.executable): \(error)")
            return 2
        }
        let bus = BusClient(settings: config, name: name.rawValue)
        do {
            // The lock is held until the services have stopped.
            defer { withExtendedLifetime(lock) {} }
            try await runServices(name, config: config, origin: origin, bus: bus, logger: logger) { try await build($0, loaded) }
            await bus.shutdown()
            logger.info("stopped")
            return 0
        } catch {
            logger.critical("failed: \(error)")
            await bus.shutdown()
            return 1
        }
    }

    private static func runServices(
        _ name: ServiceName, config: ProcessSettings, origin: ConfigOrigin, bus: BusClient, logger: Logger,
        build: @Sendable (ServiceContext) async throws -> ServiceParts
    ) async throws {
        let publisher = try await bus.makePublisher(source: name.rawValue)
        // The bus process runs the broker itself, which starts with its services.
        if name != .bus { await waitForRoute(publisher, bus: bus, logger: logger) }
        let rpcEndpoint = ZMQEndpoint(config.layout.rpcEndpoint(name))
        let (requests, rpcSocket) = try await bus.loop.serveRequests(rpcEndpoint)
        let context = ServiceContext(name: name, settings: config, logger: logger, bus: bus, publisher: publisher)
        let parts = try await build(context)
        let status = ServiceStatus(name: name, publisher: publisher, lastSeq: parts.lastSeq, ready: parts.ready, counters: parts.counters)

        var handlers = parts.rpc
        handlers["health"] = { _ in RPC.encode(RPCReply.success(status.health())) }
        let rpc = RPCService(loop: bus.loop, socket: rpcSocket, requests: requests, handlers: handlers, ordered: parts.ordered, logger: logger)
        let heartbeat = HeartbeatService(
            publisher: publisher, interval: .milliseconds(Int(config.heartbeatIntervalS * 1000)), status: status, logger: logger)

        logger.info("started", metadata: [
            "config": "\(origin)", "state_dir": "\(config.stateDir)", "rpc": "\(rpcEndpoint.address)", "pid": "\(getpid())",
        ])
        let group = ServiceGroup(
            services: [rpc, heartbeat] + parts.services,
            gracefulShutdownSignals: [.sigterm, .sigint],
            logger: logger
        )
        try await group.run()
    }

    private static func waitForRoute(_ publisher: Publisher, bus: BusClient, logger: Logger) async {
        let started = ContinuousClock.now
        if await bus.waitForRoute(publisher) {
            logger.debug("bus route ready", metadata: ["after_ms": "\(Int(started.duration(to: .now).inSeconds * 1000))"])
        } else {
            // The broker may be starting too. The PUB connects when it is up; what is published
            // before then reaches no subscriber.
            logger.warning("bus broker did not answer a probe within 5 s; starting anyway")
        }
    }

    static func printError(_ line: String) {
        FileHandle.standardError.write(Data((line + "\n").utf8))
    }
}

/// The facts `health` and the heartbeat report.
struct ServiceStatus: Sendable {
    let name: ServiceName
    let publisher: Publisher
    let lastSeq: @Sendable () -> [String: UInt64]
    let ready: @Sendable () -> Bool
    let counters: @Sendable () -> [String: UInt64]
    let startedAt = Date()
    private let started = ContinuousClock.now

    init(
        name: ServiceName, publisher: Publisher, lastSeq: @escaping @Sendable () -> [String: UInt64], ready: @escaping @Sendable () -> Bool,
        counters: @escaping @Sendable () -> [String: UInt64]
    ) {
        self.name = name
        self.publisher = publisher
        self.lastSeq = lastSeq
        self.ready = ready
        self.counters = counters
    }

    var uptimeS: Double { started.duration(to: .now).inSeconds }

    func health() -> HealthReply {
        HealthReply(
            service: name.rawValue, status: ready() ? "ok" : "starting", pid: getpid(), epoch: publisher.epoch, startedAt: startedAt,
            uptimeS: (uptimeS * 1000).rounded() / 1000, publishedSeq: publisher.lastSeq, lastSeq: lastSeq())
    }
}

/// Publishes `svc.heartbeat.<service>` on a fixed interval.
struct HeartbeatService: Service {
    let publisher: Publisher
    let interval: Duration
    let status: ServiceStatus
    let logger: Logger

    func run() async throws {
        while !Task.isShuttingDownGracefully && !Task.isCancelled {
            let health = status.health()
            let beat = Heartbeat(
                service: health.service, pid: health.pid, epoch: health.epoch, startedAt: health.startedAt,
                uptimeS: health.uptimeS, status: health.status, publishedSeq: health.publishedSeq, lastSeq: health.lastSeq,
                counters: status.counters())
            do {
                try publisher.publish("svc.heartbeat", device: status.name.rawValue, payload: beat)
            } catch {
                logger.error("heartbeat not published: \(error)")
            }
            try? await cancelWhenGracefulShutdown { try await Task.sleep(for: interval) }
        }
    }
}

/// Serves the ROUTER socket at `RUN/<service>.rpc`; requests are answered concurrently.
struct RPCService: Service {
    let loop: ZMQLoop
    let socket: ZMQLoop.SocketID
    let requests: AsyncStream<ZMQRequest>
    let handlers: [String: RPCHandler]
    let ordered: (ops: Set<String>, order: ArrivalOrder)?
    let logger: Logger

    func run() async {
        await withDiscardingTaskGroup { group in
            for await request in requests.cancelOnGracefulShutdown() {
                // Numbered here, where requests are still in the order they arrived.
                let op = ordered.map { _ in RPCRequestHead.op(of: request.body) }
                let number = ordered.flatMap { ordered in op?.flatMap { ordered.ops.contains($0) ? ordered.order.number() : nil } }
                group.addTask {
                    let reply = await ArrivalOrder.$current.withValue(number) { await dispatch(request.body, op: op) }
                    if let number { ordered?.order.leave(number) }
                    loop.reply(to: request, with: reply, on: socket)
                }
            }
        }
    }

    /// `op`: the body's op, when the caller read it already.
    func dispatch(_ body: [UInt8], op known: String?? = nil) async -> [UInt8] {
        guard let op = known ?? RPCRequestHead.op(of: body) else {
            return RPC.encode(RPCReply<RPCEmpty>.failure(.badRequest("expected a JSON object with a string \"op\"")))
        }
        guard let handler = handlers[op] else {
            return RPC.encode(RPCReply<RPCEmpty>.failure(.unknownOp(op)))
        }
        return await handler(body)
    }
}
