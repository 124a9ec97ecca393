import DrivebusConfiguration
import DrivebusJournal
import DrivebusKit
import Foundation
import Hummingbird
import IngestCore
import Logging
import ServiceLifecycle
import NIOCore

await ServiceRunner.main(.ingest, configuration: DrivebusConfig.self) { context, config in
    let publisher = context.publisher
    let logger = context.logger
    // Before segments, the journal was one file: it becomes the first segment.
    try Journal.adopt(singleFile: config.layout.dataDir + "/journal.log", into: config.layout.dataDir + "/journal")
    var journalOptions = Journal.Options()
    // A crash test's hook (CompactionCrashTests): a rewrite waits this long before its rename.
    if let pause = ProcessInfo.processInfo.environment["DRIVEBUS_TEST_REWRITE_PAUSE_MS"].flatMap(Int.init) {
        journalOptions.rewritePause = .milliseconds(pause)
    }
    // Called on the journal's writer thread after each commit, in seq order.
    let journal = try Journal(path: config.layout.dataDir + "/journal", options: journalOptions) { committed in
        JournalBroadcast.publish(committed, on: publisher, logger: logger)
    }
    logger.info("journal open", metadata: ["path": "\(journal.path)", "last_seq": "\(journal.lastSeq)"])
    let registry = DeviceRegistry(layout: config.layout)
    var entries: [DeviceRegistry.Entry] = []
    do { entries = try registry.load() } catch { logger.error("devices added with `drivebus device` are not loaded: \(error)") }
    let arrivalOrder = ArrivalOrder()
    let handler = IngestHandler(
        config: config, devices: config.devices(with: entries), latestDevices: { (try? registry.load()).map(config.devices(with:)) },
        tokenDigest: TokenDigest.sha256, journal: journal, arrivalOrder: arrivalOrder)
    let listen = config.ingest.listen
    let listening = ReadyFlag()
    let http = Application(
        router: makeIngestRouter(handler: handler, maxBodyBytes: config.ingest.maxBodyBytes),
        configuration: .init(address: .hostname(listen.host, port: listen.port), serverName: "drivebus-ingest"),
        onServerRunning: { _ in listening.set() },
        logger: logger
    )
    return ServiceParts(
        // ServiceGroup stops services in reverse order: HTTP first, then the journal.
        services: [
            JournalCloser(journal: journal), DeviceWatcher(registry: registry, config: config, handler: handler, logger: logger),
            JournalRetention(journal: journal, retention: config.retention, logger: logger), http,
        ],
        rpc: IngestRPC(handler: handler, journal: journal).handlers,
        lastSeq: { ["journal": journal.lastSeq] },
        ready: { listening.isSet },
        counters: { handler.droppedReadings.snapshot },
        ordered: (IngestRPC.ordered, arrivalOrder)
    )
}

/// Hummingbird's router over the core's endpoints. The HTTP work is here: the body limit, and
/// turning the core's answers and errors into responses.
func makeIngestRouter(handler: IngestHandler, maxBodyBytes: Int) -> Router<BasicRequestContext> {
    let router = Router()
    // A request no route takes gets the core's JSON answer: 405 with the allowed methods, or 404.
    router.add(middleware: UnroutedMiddleware(handler: handler))
    for endpoint in handler.endpoints {
        let limit = min(endpoint.maxBodyBytes ?? maxBodyBytes, maxBodyBytes)
        let limitName = endpoint.maxBodyBytes == nil || limit == maxBodyBytes ? "ingest.max_body_bytes" : "this endpoint's limit"
        for method in endpoint.methods {
            router.on(RouterPath(endpoint.path), method: HTTPRequest.Method(method)!) { request, _ -> Response in
                let body: ByteBuffer
                do {
                    body = try await request.body.collect(upTo: limit)
                } catch {
                    throw IngestHTTPError(error: .tooLarge("the body is larger than \(limitName) (\(limit) bytes)", field: "body"))
                }
                return Response(await handler.respond(endpoint, to: IngestRequest(request, body: body)))
            }
        }
    }
    return router
}

/// Refuses an over-long URL (414) or header block (431) before anything else, and answers a
/// request no route takes with the core's JSON.
struct UnroutedMiddleware: RouterMiddleware {
    let handler: IngestHandler

    func handle(_ request: Request, context: BasicRequestContext, next: (Request, BasicRequestContext) async throws -> Response) async throws -> Response {
        let target = request.uri.description.utf8.count
        guard target <= IngestLimits.urlBytes else {
            throw IngestHTTPError(error: IngestError(
                status: 414, code: "ingest.uri_too_long", message: "url: longer than the limit of \(IngestLimits.urlBytes) bytes", field: "url"))
        }
        let headerBytes = request.headers.reduce(0) { $0 + $1.name.rawName.utf8.count + $1.value.utf8.count + 4 }
        guard headerBytes <= IngestLimits.headerBytes else {
            throw IngestHTTPError(error: IngestError(
                status: 431, code: "ingest.headers_too_large", message: "headers: larger than the limit of \(IngestLimits.headerBytes) bytes", field: "headers"))
        }
        do {
            return try await next(request, context)
        } catch let error as HTTPError where error.status == .notFound {
            throw IngestHTTPError(error: handler.unrouted(IngestRequest(request, body: ByteBuffer())))
        }
    }
}

extension IngestRequest {
    init(_ request: Request, body: ByteBuffer) {
        var headers: [String: String] = [:]
        for field in request.headers { headers[field.name.canonicalName] = headers[field.name.canonicalName] ?? field.value }
        self.init(method: request.method.rawValue, path: request.uri.path, query: request.uri.query ?? "", headers: headers, body: Array(buffer: body))
    }
}

extension Response {
    init(_ answer: IngestResponse) {
        self.init(
            status: .init(code: answer.status), headers: [.contentType: answer.contentType], body: .init(byteBuffer: ByteBuffer(bytes: answer.body)))
    }
}

/// An ingest error thrown in the HTTP stack: it answers as JSON naming the field.
struct IngestHTTPError: HTTPResponseError {
    let error: IngestError

    var status: HTTPResponse.Status { .init(code: error.status) }

    func response(from request: Request, context: some RequestContext) throws -> Response {
        Response(IngestResponse(status: error.status, body: error.json))
    }
}

/// Stops the journal's writer at shutdown, after the HTTP server has stopped taking requests.
struct JournalCloser: Service {
    let journal: Journal

    func run() async throws {
        try? await gracefulShutdown()
        // The writer finishes what it was handed; blocking here is brief and happens once.
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            Thread { journal.shutdown(); continuation.resume() }.start()
        }
    }
}

/// Picks up `drivebus device add|remove|rotate-token` within a second, without a restart: the
/// registry file is checked twice a second (on a dispatch queue, not the cooperative pool) and
/// reloaded whole when it was replaced. A file that does not parse keeps the devices in force.
struct DeviceWatcher: Service {
    let registry: DeviceRegistry
    let config: DrivebusConfig
    let handler: IngestHandler
    let logger: Logger

    static let interval = Duration.milliseconds(500)
    private static let queue = DispatchQueue(label: "drivebus.ingest.devices")

    func run() async throws {
        await cancelWhenGracefulShutdown {
            // Unseen at first: a change between the service's first load and here is not missed.
            var seen: [Int]?? = .none
            while !Task.isCancelled {
                try? await Task.sleep(for: Self.interval)
                let identity = await Self.onQueue { Self.identity(registry.path) }
                guard identity != seen else { continue }
                seen = identity
                let loaded = await Self.onQueue { () -> Result<[DeviceRegistry.Entry], ConfigError> in
                    Result { () throws(ConfigError) in try registry.load() }
                }
                switch loaded {
                case .success(let entries):
                    let devices = config.devices(with: entries)
                    handler.reloadDevices(devices)
                    logger.info("devices reloaded", metadata: ["devices": "\(devices.count)"])
                case .failure(let error):
                    logger.error("devices not reloaded, the previous ones stay: \(error)")
                }
            }
        }
    }

    /// Inode, size and modification time: a rename or a rewrite changes at least one.
    static func identity(_ path: String) -> [Int]? {
        var info = stat()
        guard stat(path, &info) == 0 else { return nil }
        return [Int(info.st_ino), Int(info.st_size), Int(info.st_mtim.tv_sec), Int(info.st_mtim.tv_nsec)]
    }

    static func onQueue<T: Sendable>(_ work: @escaping @Sendable () -> T) async -> T {
        await withCheckedContinuation { continuation in queue.async { continuation.resume(returning: work()) } }
    }
}

/// Applies `retention:` to the journal: at start, then every hour, expired fixes and motion
/// samples become stand-ins in sealed segments (`Journal.remove`), in the background, while ingest
/// takes new ones. A failure is logged and tried again at the next run.
struct JournalRetention: Service {
    let journal: Journal
    let retention: DrivebusConfig.Retention
    let logger: Logger

    static let interval = Duration.seconds(3600)

    func run() async throws {
        // Nothing to expire: wait for the end (a service that returns would stop the group).
        guard !retention.expiring(now: Date()).isEmpty else { return try await gracefulShutdown() }
        await cancelWhenGracefulShutdown {
            while !Task.isCancelled {
                for (type, before) in retention.expiring(now: Date()) {
                    do {
                        let report = try await journal.remove(.init(types: [type], device: nil, from: .distantPast, to: before))
                        if report.records > 0 {
                            logger.info("retention applied", metadata: [
                                "type": "\(type)", "before": "\(RFC3339.format(before))", "records": "\(report.records)",
                                "segments": "\(report.segments)", "bytes_freed": "\(report.bytesBefore - report.bytesAfter)",
                            ])
                        }
                    } catch {
                        logger.error("retention not applied to \(type) this time: \(error)")
                    }
                }
                try? await Task.sleep(for: Self.interval)
            }
        }
    }
}
