import CDrivebusSupport
import Foundation
import Hummingbird
import NIOCore
import StatsCore
import StatsStore

/// How the stats HTTP API serves its routes.
public struct StatsHTTPConfiguration: Sendable {
    /// Exports running at once; more get 503 `stats.busy`. Each holds a SQLite reader and a thread.
    public var maxConcurrentExports: Int
    /// The size of the pieces an export is written in.
    public var chunkBytes: Int
    /// Chunks an export may run ahead of the client: its memory is about this × `chunkBytes`.
    public var bufferedChunks: Int
    /// `GET /metrics` (Prometheus text), which the service feeds from heartbeats; 404 while nil.
    public var metrics: (@Sendable () async -> String)?
    /// The `costs:` section: the own car's ledger and the rental tariffs (`/api/v1/costs`, `GET /`).
    public var costs: CostsConfiguration
    /// `trips.ascent_hysteresis_m`: route ranking counts ascent exactly as trips do.
    public var ascentHysteresisM: Double
    /// The largest body `POST /api/v1/routes/rank` and `POST /api/v1/costs/expenses` take; more gets 413.
    public var maxBodyBytes: Int
    /// The devices known now (config and `drivebus device`), for `GET /api/v1/devices`; without
    /// it, only the devices with stored fixes are listed.
    public var knownDevices: (@Sendable () async -> [KnownDevice])?
    /// `POST /api/v1/devices/{id}/setup`: a new token for a device added with `drivebus device`,
    /// and its setup as JSON (`device`, `app`, `code`, `svg`, `scan`, `by_hand`). 404 while nil;
    /// the service sets it only while stats listens on loopback.
    public var deviceSetup: (@Sendable (_ device: String) async throws(StatsError) -> [UInt8])?
    /// `POST /api/v1/devices/{id}/purge`: the device's data between two times taken out of the
    /// whole system (journal, the services' events, stats; docs/data.md), answered with what
    /// went as JSON. 404 while nil; the service sets it only while stats listens on loopback.
    public var devicePurge: (@Sendable (_ request: DevicePurgeRequest) async throws(StatsError) -> [UInt8])?
    /// The interactive map page at `/map`.
    public var map: MapPageConfiguration
    /// Stats listens on loopback only: a request must then name a loopback host (DNS rebinding),
    /// or one of `allowedHosts`.
    public var loopbackOnly: Bool
    /// Names besides this machine's that requests may be addressed to (a reverse proxy's).
    public var allowedHosts: [String]

    public init(
        maxConcurrentExports: Int = 4, chunkBytes: Int = 64 * 1024, bufferedChunks: Int = 4,
        metrics: (@Sendable () async -> String)? = nil, costs: CostsConfiguration = .init(), ascentHysteresisM: Double = 5,
        maxBodyBytes: Int = 16 * 1024 * 1024, knownDevices: (@Sendable () async -> [KnownDevice])? = nil,
        deviceSetup: (@Sendable (_ device: String) async throws(StatsError) -> [UInt8])? = nil,
        devicePurge: (@Sendable (_ request: DevicePurgeRequest) async throws(StatsError) -> [UInt8])? = nil, map: MapPageConfiguration = .init(),
        loopbackOnly: Bool = false, allowedHosts: [String] = []
    ) {
        self.map = map
        self.loopbackOnly = loopbackOnly
        self.allowedHosts = allowedHosts
        self.devicePurge = devicePurge
        self.knownDevices = knownDevices
        self.deviceSetup = deviceSetup
        self.maxConcurrentExports = maxConcurrentExports
        self.chunkBytes = chunkBytes
        self.bufferedChunks = bufferedChunks
        self.metrics = metrics
        self.costs = costs
        self.ascentHysteresisM = ascentHysteresisM
        self.maxBodyBytes = maxBodyBytes
    }
}

/// The routes of issues 8 and 9, for `Application(router:configuration:)`. Every route takes `device`,
/// `from` and `to`; bad parameters get 400 `{"error":{"code","field","message"}}`.
public func makeStatsRouter(store: StatsStore, configuration: StatsHTTPConfiguration = .init()) -> Router<BasicRequestContext> {
    let router = Router(context: BasicRequestContext.self)
    router.add(middleware: BrowserGuard(loopbackOnly: configuration.loopbackOnly, allowedHosts: Set(configuration.allowedHosts)))
    let exports = ExportGate(limit: configuration.maxConcurrentExports)

    router.get("/api/v1/devices") { _, _ in
        let known = await configuration.knownDevices?() ?? []
        return Response(
            status: .ok, headers: [.contentType: "application/json"],
            body: .init(byteBuffer: ByteBuffer(bytes: try await store.devicesJSON(known))))
    }

    if let deviceSetup = configuration.deviceSetup {
        router.post("/api/v1/devices/:id/setup") { request, context in
            await respond(context) {
                try ActionGuard.check(request, action: "setup")
                var response = json(try await deviceSetup(try pathParameter("id", context)))
                response.headers[.cacheControl] = "no-store"
                return response
            }
        }
    }

    if let devicePurge = configuration.devicePurge {
        router.post("/api/v1/devices/:id/purge") { request, context in
            await respond(context) {
                try ActionGuard.check(request, action: "purge")
                let purge = try DevicePurgeRequest(device: try pathParameter("id", context), query: request.uri.query ?? "")
                var response = json(try await devicePurge(purge))
                response.headers[.cacheControl] = "no-store"
                return response
            }
        }
    }

    router.get("/api/v1/visits") { request, context in
        await respond(context) { json(try await store.visitsJSON(try query(request))) }
    }
    router.get("/api/v1/trips") { request, context in
        await respond(context) { json(try await store.tripsJSON(try query(request))) }
    }
    router.get("/api/v1/trips/:id") { request, context in
        await respond(context) {
            _ = try query(request)
            return json(try await store.tripJSON(id: try pathParameter("id", context)))
        }
    }
    router.get("/api/v1/gates/dead-letters") { request, context in
        await respond(context) { json(try await store.deadLettersJSON(try query(request))) }
    }
    router.get("/api/v1/stats/daily") { request, context in
        await respond(context) { json(try await store.periodsJSON(.day, try query(request))) }
    }
    router.get("/api/v1/stats/monthly") { request, context in
        await respond(context) { json(try await store.periodsJSON(.month, try query(request))) }
    }
    router.get("/api/v1/sessions/:candidate") { request, context in
        await respond(context) {
            json(try await store.sessionsJSON(candidate: try pathParameter("candidate", context), try query(request)))
        }
    }
    let streamed: [(String, StatsExport)] =
        StatsExport.Format.allCases.map { ("/api/v1/export/fixes.\($0.rawValue)", .fixes($0)) }
        + [.gpx, .geojson].map { ("/api/v1/export/trips.\($0.rawValue)", .trips($0)) }
        + [("/api/v1/map.geojson", .map)]
    for (path, export) in streamed {
        router.get(RouterPath(path)) { request, context in
            await respond(context) {
                let query = try query(request)
                try await store.validate(export, query)
                guard exports.hasRoom else { throw StatsError.busy }
                var response = stream(export, query, store: store, gate: exports, configuration: configuration)
                if export != .map {
                    response.headers[.contentDisposition] = "attachment; filename=\"\(export.filename(device: query.device))\""
                }
                return response
            }
        }
    }
    router.get("/map.svg") { request, context in
        await respond(context) {
            let parameters = StatsParameters(query: request.uri.query ?? "")
            let query = try StatsQuery.parse(parameters)
            let width = try parameters.integer("width", default: 1200, in: 100...10_000)
            let height = try parameters.integer("height", default: 900, in: 100...10_000)
            return Response(
                status: .ok, headers: [.contentType: "image/svg+xml"],
                body: .init(byteBuffer: ByteBuffer(bytes: try await store.mapSVG(query, width: width, height: height))))
        }
    }
    addCostsRankingAndDashboard(to: router, store: store, configuration: configuration)
    addMap(to: router, store: store, configuration: configuration.map)
    router.get("/metrics") { _, context in
        await respond(context) {
            guard let metrics = configuration.metrics else { throw StatsError.notFound("path", "metrics are not enabled") }
            return Response(
                status: .ok, headers: [.contentType: "text/plain; version=0.0.4; charset=utf-8"],
                body: .init(byteBuffer: ByteBuffer(string: await metrics())))
        }
    }
    return router
}

func query(_ request: Request) throws(StatsError) -> StatsQuery {
    try StatsQuery.parse(StatsParameters(query: request.uri.query ?? ""))
}

private func pathParameter(_ name: String, _ context: BasicRequestContext) throws(StatsError) -> String {
    guard let raw = context.parameters.get(name), let value = raw.removingPercentEncoding, !value.isEmpty, value.utf8.count <= 256 else {
        throw StatsError.invalid(name, "must be 1 to 256 bytes of valid percent-encoded UTF-8")
    }
    return value
}

func json(_ bytes: [UInt8]) -> Response {
    Response(status: .ok, headers: [.contentType: "application/json"], body: .init(byteBuffer: ByteBuffer(bytes: bytes)))
}

func errorResponse(_ error: StatsError) -> Response {
    Response(
        status: .init(code: error.status), headers: [.contentType: "application/json"],
        body: .init(byteBuffer: ByteBuffer(bytes: error.json)))
}

/// Turns thrown errors into JSON answers: refusals with their status, anything else a 500.
func respond(_ context: BasicRequestContext, _ body: () async throws -> Response) async -> Response {
    do {
        return try await body()
    } catch let error as StatsError {
        return errorResponse(error)
    } catch {
        context.logger.error("stats request failed: \(error)")
        return errorResponse(StatsError(status: 500, code: "stats.internal", message: "the request failed on the server"))
    }
}

/// A streamed export: a thread of its own reads SQLite and writes chunks into a small bounded
/// pipe, and the response body sends them as the client takes them. The thread starts only when
/// the body is written, and stops when the client goes away.
private func stream(_ export: StatsExport, _ query: StatsQuery, store: StatsStore, gate: ExportGate, configuration: StatsHTTPConfiguration) -> Response {
    let chunkBytes = configuration.chunkBytes, buffered = configuration.bufferedChunks
    let body = ResponseBody { writer in
        let pipe = ChunkPipe(capacity: buffered)
        gate.enter()
        let thread = Thread {
            _ = drivebus_thread_name("stats-export")
            defer { gate.leave() }
            do {
                try store.export(export, query, chunkBytes: chunkBytes) { chunk in
                    guard pipe.send(chunk) else { throw StatsError.cancelled }
                }
                pipe.finish(nil)
            } catch {
                pipe.finish(error)
            }
        }
        thread.start()
        do {
            while let chunk = try await pipe.next() {
                try await writer.write(ByteBuffer(bytes: chunk))
            }
            try await writer.finish(nil)
        } catch {
            pipe.cancel()
            throw error
        }
    }
    return Response(status: .ok, headers: [.contentType: export.contentType], body: body)
}

/// Counts running exports.
private final class ExportGate: @unchecked Sendable {
    private let lock = NSLock()
    private var running = 0
    private let limit: Int

    init(limit: Int) { self.limit = max(1, limit) }

    /// Checked before answering, so that a refusal can still be a 503.
    var hasRoom: Bool { lock.withLock { running < limit } }
    func enter() { lock.withLock { running += 1 } }
    func leave() { lock.withLock { running -= 1 } }
}

/// A bounded hand-over from the export thread to async code. The thread blocks (on its own
/// thread, never the cooperative pool) while the pipe is full, so a slow client slows the read
/// instead of filling memory.
private final class ChunkPipe: @unchecked Sendable {
    private let condition = NSCondition()
    private var queue: [[UInt8]] = []
    private var finished = false
    private var failure: (any Error)?
    private var cancelled = false
    private var waiter: CheckedContinuation<[UInt8]?, any Error>?
    private let capacity: Int

    init(capacity: Int) { self.capacity = max(1, capacity) }

    /// From the producer thread; false once the reader has gone.
    func send(_ chunk: [UInt8]) -> Bool {
        condition.lock()
        while queue.count >= capacity && !cancelled { condition.wait() }
        if cancelled {
            condition.unlock()
            return false
        }
        if let waiter {
            self.waiter = nil
            condition.unlock()
            waiter.resume(returning: chunk)
        } else {
            queue.append(chunk)
            condition.unlock()
        }
        return true
    }

    func finish(_ error: (any Error)?) {
        condition.lock()
        finished = true
        failure = error
        let waiter = self.waiter
        self.waiter = nil
        condition.unlock()
        if let error { waiter?.resume(throwing: error) } else { waiter?.resume(returning: nil) }
    }

    func cancel() {
        condition.lock()
        cancelled = true
        let waiter = self.waiter
        self.waiter = nil
        condition.broadcast()
        condition.unlock()
        waiter?.resume(throwing: CancellationError())
    }

    /// The next chunk, nil at the end; rethrows the export's error.
    func next() async throws -> [UInt8]? {
        try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<[UInt8]?, any Error>) in
                condition.lock()
                if !queue.isEmpty {
                    let chunk = queue.removeFirst()
                    condition.signal()
                    condition.unlock()
                    continuation.resume(returning: chunk)
                } else if finished {
                    let failure = self.failure
                    condition.unlock()
                    if let failure { continuation.resume(throwing: failure) } else { continuation.resume(returning: nil) }
                } else if cancelled {
                    condition.unlock()
                    continuation.resume(throwing: CancellationError())
                } else {
                    waiter = continuation
                    condition.unlock()
                }
            }
        } onCancel: {
            cancel()
        }
    }
}

/// `POST /api/v1/devices/{id}/purge?from=…&to=…[&resend_ok=true]`: `from` and `to` are RFC 3339
/// times or days (a day `to` ends at its last millisecond, UTC), both required.
public struct DevicePurgeRequest: Sendable, Equatable {
    public var device: String
    public var from: Date
    public var to: Date
    public var resendOK: Bool

    public init(device: String, from: Date, to: Date, resendOK: Bool) {
        self.device = device
        self.from = from
        self.to = to
        self.resendOK = resendOK
    }

    public init(device: String, query: String) throws(StatsError) {
        var parameters = StatsParameters(query: query)
        for name in ["from", "to"] where try parameters.single(name) == nil { throw .invalid(name, "is required: an RFC 3339 time or a day YYYY-MM-DD") }
        let resendOK = try parameters.single("resend_ok")
        guard [nil, "true", "false"].contains(resendOK) else { throw .invalid("resend_ok", "must be true or false") }
        parameters.pairs.append(("device", device))
        let parsed = try StatsQuery.parse(parameters)
        guard let device = parsed.device, let from = parsed.from, let to = parsed.to else { throw .invalid("to", "is required") }
        self.device = device
        self.from = from
        // A day's end is the next day's start for the other routes, which stop before it; a
        // purge takes its range whole.
        self.to = (try parameters.single("to"))?.count == 10 ? to.addingTimeInterval(-0.001) : to
        self.resendOK = resendOK == "true"
    }
}

/// Keeps other sites out of a browser on this machine, for every route:
/// - DNS rebinding: while stats listens on loopback only, a request must name a loopback host
///   (a page of another name made to resolve to 127.0.0.1 still says its name), or any web page
///   could read the location history;
/// - cross-site writes: a request other than GET or HEAD sent by a page of another origin is
///   refused. Browsers say where a request comes from (`Origin`, `Sec-Fetch-Site`); `curl` and
///   scripts say nothing and are not held up. (A page could otherwise post expenses into the
///   ledger: a form's plain-text body needs no CORS preflight.)
struct BrowserGuard: RouterMiddleware {
    let loopbackOnly: Bool
    /// `stats.allowed_hosts`: a reverse proxy's public names, which its requests keep.
    let allowedHosts: Set<String>

    func handle(_ request: Request, context: BasicRequestContext, next: (Request, BasicRequestContext) async throws -> Response) async throws -> Response {
        func header(_ name: String) -> String? { request.headers.first { $0.name.canonicalName == name }?.value }
        let host = request.head.authority ?? header("host")
        if loopbackOnly, let host, !isAllowed(host) {
            return errorResponse(StatsError(
                status: 403, code: "stats.forbidden", message: "this server answers only to names of this machine and stats.allowed_hosts", field: "Host"))
        }
        if request.method != .get, request.method != .head {
            if let site = header("sec-fetch-site"), !["same-origin", "none"].contains(site) {
                return errorResponse(StatsError(status: 403, code: "stats.forbidden", message: "not from this server's own pages", field: "Sec-Fetch-Site"))
            }
            if let origin = header("origin"), !isOwn(origin: origin, host: host) {
                return errorResponse(StatsError(status: 403, code: "stats.forbidden", message: "not from this server's own pages", field: "Origin"))
            }
        }
        return try await next(request, context)
    }

    /// This machine's names (`*.localhost` too, which browsers keep on loopback) and the allowed.
    func isAllowed(_ host: String) -> Bool {
        let name = Self.name(of: host)
        return ActionGuard.isLoopback(host) || name.hasSuffix(".localhost") || allowedHosts.contains(name)
    }

    /// A page of this server: the origin the request was addressed to, or, behind a proxy that
    /// rewrote `Host`, one of its allowed names.
    func isOwn(origin: String, host: String?) -> Bool {
        guard let separator = origin.range(of: "://"), ["http", "https"].contains(origin[..<separator.lowerBound]) else { return false }
        let authority = String(origin[separator.upperBound...])
        return authority == host || allowedHosts.contains(Self.name(of: authority))
    }

    /// A `Host` or origin authority without its port, lower-case.
    static func name(of authority: String) -> String {
        let lower = authority.lowercased()
        if lower.hasPrefix("[") { return String(lower.prefix { $0 != "]" }) + "]" }
        return String(lower.split(separator: ":", maxSplits: 1, omittingEmptySubsequences: false).first ?? "")
    }
}

/// Who may ask for a new setup code or a purge: only this machine's own dashboard. Those routes
/// exist only while stats listens on loopback, so no other machine reaches them; the rest keeps
/// other sites out of a browser on this machine.
public enum ActionGuard {
    /// A request's headers, with HTTP/1.1's Host, which arrives as its authority.
    static func check(_ request: Request, action: String) throws(StatsError) {
        try check(request.headers.map { ($0.name.canonicalName, $0.value) } + (request.head.authority.map { [("host", $0)] } ?? []), action: action)
    }

    /// `action` is what the request must name in `X-Drivebus-Action`: `setup`, `purge`.
    public static func check(_ headers: [(name: String, value: String)], action: String) throws(StatsError) {
        func header(_ name: String) -> String? { headers.first { $0.name == name }?.value }
        func refuse(_ field: String, _ message: String) -> StatsError {
            StatsError(status: 403, code: "stats.forbidden", message: message, field: field)
        }
        // A header an HTML form cannot send, and another site's script cannot without a CORS
        // preflight, which nothing here answers.
        guard header("x-drivebus-action") == action else { throw refuse("X-Drivebus-Action", "send X-Drivebus-Action: \(action)") }
        // DNS rebinding: a page of another name made to resolve to 127.0.0.1 still says its name.
        guard let host = header("host"), isLoopback(host) else { throw refuse("Host", "only this machine's dashboard may ask for a \(action)") }
        if let site = header("sec-fetch-site"), !["same-origin", "none"].contains(site) { throw refuse("Sec-Fetch-Site", "not from this dashboard") }
        if let origin = header("origin"), origin != "http://" + host { throw refuse("Origin", "not from this dashboard") }
    }

    /// `127.0.0.1:8091`, `localhost:8091`, `[::1]:8091`, with or without the port.
    public static func isLoopback(_ host: String) -> Bool {
        var name = Substring(host.lowercased())
        if name.hasPrefix("[") {
            guard let close = name.firstIndex(of: "]") else { return false }
            name = name[name.index(after: name.startIndex)..<close]
            return name == "::1"
        }
        if let colon = name.lastIndex(of: ":") { name = name[..<colon] }
        if name == "localhost" { return true }
        let parts = name.split(separator: ".", omittingEmptySubsequences: false)
        return parts.count == 4 && parts[0] == "127" && parts.allSatisfy { UInt8($0) != nil }
    }
}
