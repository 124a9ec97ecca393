import DrivebusConfiguration
import DrivebusJournal
import DrivebusSchema
import Foundation
import Synchronization

/// An HTTP request, reduced to what ingest looks at, so the core is tested without a server.
public struct IngestRequest: Sendable {
    public var method: String
    public var path: String
    /// The raw query string, without `?`.
    public var query: String
    /// Header names in lower case.
    public var headers: [String: String]
    public var body: [UInt8]

    public init(method: String, path: String, query: String = "", headers: [String: String] = [:], body: [UInt8] = []) {
        self.method = method.uppercased()
        self.path = path
        self.query = query
        self.headers = Dictionary(headers.map { ($0.key.lowercased(), $0.value) }, uniquingKeysWith: { first, _ in first })
        self.body = body
    }
}

public struct IngestResponse: Sendable, Equatable {
    public var status: Int
    public var contentType: String
    public var body: [UInt8]

    public init(status: Int, contentType: String = "application/json", body: [UInt8]) {
        self.status = status
        self.contentType = contentType
        self.body = body
    }

    static func json(_ text: String, status: Int = 200) -> IngestResponse {
        IngestResponse(status: status, body: Array(text.utf8))
    }

    static func error(_ error: IngestError) -> IngestResponse {
        IngestResponse(status: error.status, body: error.json)
    }
}

/// One endpoint: its path, the methods it takes, and what answers it.
public struct IngestEndpoint: Sendable {
    public let path: String
    public let methods: [String]
    /// The largest body it takes; nil for `ingest.max_body_bytes` (the batch endpoints).
    public let maxBodyBytes: Int?
    let run: @Sendable (IngestRequest) async throws -> IngestResponse

    init(
        _ path: String, _ methods: [String], maxBodyBytes: Int? = IngestLimits.smallBodyBytes,
        _ run: @escaping @Sendable (IngestRequest) async throws -> IngestResponse
    ) {
        self.path = path
        self.methods = methods
        self.maxBodyBytes = maxBodyBytes
        self.run = run
    }
}

/// The ingest service's core: authenticates, parses, validates, journals, answers.
public final class IngestHandler: Sendable {
    /// Swapped whole when `drivebus device` changes the registry (see `reloadDevices`).
    private let directory: Mutex<DeviceDirectory>
    private var devices: DeviceDirectory { directory.withLock { $0 } }
    /// Reads the device list afresh: a local tool may have added a device a moment ago.
    private let latestDevices: (@Sendable () -> [DrivebusConfig.Device]?)?
    private let tokenDigest: @Sendable ([UInt8]) -> [UInt8]
    private let parsers: ClientParsers
    private let journal: Journal
    private let motion = MotionChanges()
    /// Local tools' batches reach the journal in the order they arrived (see `ArrivalOrder`).
    private let arrivalOrder: ArrivalOrder?
    /// Readings left out of fixes, for the heartbeat's counters and `/metrics`.
    public let droppedReadings = DroppedReadings()
    /// The open driving-school session of each device, so that a stop can name it. After a
    /// restart a stop without `session_id` closes whatever session consumers have open.
    private let sessions = Mutex<[String: String]>([:])

    /// - Parameters:
    ///   - devices: who may send; the config's `devices:` when nil.
    ///   - latestDevices: the list as it is now (config and registry), asked when a local tool
    ///     names a device not yet known.
    ///   - tokenDigest: SHA-256, for devices known by their token's digest.
    public init(
        config: DrivebusConfig, devices: [DrivebusConfig.Device]? = nil, latestDevices: (@Sendable () -> [DrivebusConfig.Device]?)? = nil,
        tokenDigest: @escaping @Sendable ([UInt8]) -> [UInt8] = { _ in [] },
        journal: Journal, arrivalOrder: ArrivalOrder? = nil, now: @escaping @Sendable () -> Date = { Date() }
    ) {
        self.arrivalOrder = arrivalOrder
        directory = Mutex(DeviceDirectory(devices ?? config.devices, digest: tokenDigest))
        self.tokenDigest = tokenDigest
        self.latestDevices = latestDevices
        parsers = ClientParsers(normalizer: Normalizer(now: now, dropped: droppedReadings))
        self.journal = journal
    }

    /// From the next request on, these devices and tokens are the ones admitted: a removed or
    /// rotated token is refused, a new device is heard.
    public func reloadDevices(_ devices: [DrivebusConfig.Device]) {
        let directory = DeviceDirectory(devices, digest: tokenDigest)
        self.directory.withLock { $0 = directory }
    }

    /// The endpoints, for the service's HTTP router; `handle` serves the same table without one.
    public var endpoints: [IngestEndpoint] {
        [
            IngestEndpoint("/healthz", ["GET"]) { [journal] _ in .json(#"{"status":"ok","last_seq":\#(journal.lastSeq)}"#) },
            IngestEndpoint("/owntracks", ["POST"], ownTracks),
            IngestEndpoint("/pub", ["POST"], ownTracks),
            IngestEndpoint("/overland", ["POST"], maxBodyBytes: nil, overland),
            IngestEndpoint("/", ["GET", "POST"], osmand),
            IngestEndpoint("/osmand", ["GET", "POST"], osmand),
            IngestEndpoint("/gpslogger", ["GET", "POST"], gpsLogger),
            IngestEndpoint("/api/v1/fixes", ["POST"], maxBodyBytes: nil, nativeFixes),
            IngestEndpoint("/api/v1/motion", ["POST"], maxBodyBytes: nil, nativeMotion),
            IngestEndpoint("/api/v1/sessions/start", ["POST"], sessionStart),
            IngestEndpoint("/api/v1/sessions/stop", ["POST"], sessionStop),
            IngestEndpoint("/api/v1/taxi/checkin", ["POST"], checkin),
        ]
    }

    /// Answers a request with its endpoint; every error becomes a JSON answer naming the field.
    public func respond(_ endpoint: IngestEndpoint, to request: IngestRequest) async -> IngestResponse {
        do {
            return try await endpoint.run(request)
        } catch let error as IngestError {
            return .error(error)
        } catch {
            return .error(IngestError(status: 500, code: "ingest.internal", message: String(describing: error)))
        }
    }

    /// The answer for a request no endpoint takes: 405 naming the methods the path allows, or 404.
    public func unrouted(_ request: IngestRequest) -> IngestError {
        let allowed = endpoints.filter { $0.path == request.path }.flatMap(\.methods)
        guard allowed.isEmpty else {
            return IngestError(status: 405, code: "ingest.method_not_allowed", message: "use \(allowed.joined(separator: " or "))", field: "method")
        }
        return IngestError(status: 404, code: "ingest.not_found", message: "no endpoint \(request.path)", field: "path")
    }

    /// Routes and answers a request, as the HTTP router does.
    public func handle(_ request: IngestRequest) async -> IngestResponse {
        guard let endpoint = endpoints.first(where: { $0.path == request.path && $0.methods.contains(request.method) }) else {
            return .error(unrouted(request))
        }
        return await respond(endpoint, to: request)
    }

    // MARK: Endpoints

    private func ownTracks(_ request: IngestRequest) async throws -> IngestResponse {
        let device = try authenticate(request, parameters: try queryParameters(request))
        try await store(try parsers.ownTracks(request.body, device: device, headers: request.headers))
        return .json("[]")
    }

    private func overland(_ request: IngestRequest) async throws -> IngestResponse {
        let device = try authenticate(request, parameters: try queryParameters(request))
        try await store(try parsers.overland(request.body, device: device))
        return .json(#"{"result":"ok"}"#)
    }

    private func osmand(_ request: IngestRequest) async throws -> IngestResponse {
        let method = request.method
        let isJSON = method == "POST" && (request.headers["content-type"]?.contains("json") == true || request.body.first == UInt8(ascii: "{"))
        let parameters = try allParameters(request, bodyIsForm: method == "POST" && !isJSON)
        let parsed = try parsers.osmand(parameters: parameters, body: request.body, isJSON: isJSON)
        let device: String
        if let token = DeviceDirectory.token(headers: request.headers, parameters: parameters) {
            device = try authenticate(token: token)
        } else if let id = parsed.clientID {
            // As in Traccar: the id is the credential, for devices configured to allow it.
            guard let known = devices.device(forID: id.value) else {
                throw IngestError.unauthorized("unknown device id \"\(id.value)\" (or it is not allowed to authenticate by id)", field: id.field)
            }
            device = known
        } else {
            throw IngestError.unauthorized("no device: send id (or deviceid) or a token", field: "id")
        }
        try await store(parsed.records.map { $0.assigned(to: device) })
        return IngestResponse(status: 200, contentType: "text/plain", body: [])
    }

    private func gpsLogger(_ request: IngestRequest) async throws -> IngestResponse {
        let parameters = try allParameters(request, bodyIsForm: request.method == "POST")
        let device = try authenticate(request, parameters: parameters)
        try await store(try parsers.gpsLogger(parameters, device: device))
        return IngestResponse(status: 200, contentType: "text/plain", body: Array("OK".utf8))
    }

    private func nativeFixes(_ request: IngestRequest) async throws -> IngestResponse {
        let device = try authenticate(request, parameters: try queryParameters(request))
        return try await nativeReply(try await store(try parsers.nativeFixes(request.body, device: device)))
    }

    private func nativeMotion(_ request: IngestRequest) async throws -> IngestResponse {
        let device = try authenticate(request, parameters: try queryParameters(request))
        return try await nativeReply(try await store(try parsers.nativeMotion(request.body, device: device)))
    }

    private func sessionStart(_ request: IngestRequest) async throws -> IngestResponse {
        let device = try authenticate(request, parameters: try queryParameters(request))
        let outcomes = try await store(try parsers.sessionStart(request.body, device: device))
        guard case .journaled(let seq)? = outcomes.first else { throw IngestError.invalid("body", "the session was not started") }
        let id = JournalRecord.sessionID(device: device, seq: seq)
        sessions.withLock { $0[device] = id }
        return .json(#"{"session_id":"\#(id)","last_seq":\#(seq)}"#)
    }

    private func sessionStop(_ request: IngestRequest) async throws -> IngestResponse {
        let device = try authenticate(request, parameters: try queryParameters(request))
        let open = sessions.withLock { $0[device] }
        let outcomes = try await store(try parsers.sessionStop(request.body, device: device, open: open))
        guard case .journaled(let seq)? = outcomes.first else { throw IngestError.invalid("body", "the session was not stopped") }
        // Forgotten once the stop is journaled: a refused stop leaves the session open, so the
        // next stop still names it. (A session started meanwhile is not the one stopped.)
        sessions.withLock { if $0[device] == open { $0[device] = nil } }
        return .json(#"{"last_seq":\#(seq)}"#)
    }

    private func checkin(_ request: IngestRequest) async throws -> IngestResponse {
        let device = try authenticate(request, parameters: try queryParameters(request))
        return try await nativeReply(try await store(try parsers.checkin(request.body, device: device)))
    }

    /// Whether a device a local tool names is known, looking at the latest list once if not:
    /// `drivebus import` creates its device and sends at once, before the watcher's next look.
    private func isKnownLocally(_ device: String) -> Bool {
        if devices.isKnown(device) { return true }
        guard let latest = latestDevices?() else { return false }
        reloadDevices(latest)
        return devices.isKnown(device)
    }

    /// The `publish` RPC: a native batch from a local tool (such as `drivebus import`) that names
    /// its device. The ipc socket is reachable only by this machine's drivebus user. The body is
    /// parsed once, for its device and its fixes.
    public func publishLocal(body: [UInt8]) async throws -> (accepted: Int, duplicates: Int, lastSeq: UInt64) {
        if let batch = NativeBatch.read(body) { return try await storeLocal(batch) }
        return try await storeLocal(body) { [parsers] root, device in try parsers.nativeFixes(root: root, device: device, source: .import) }
    }

    /// The `publish_packed` RPC: `drivebus import`'s fixes, in binary (`PackedFixes`).
    public func publishPacked(body: [UInt8]) async throws -> (accepted: Int, duplicates: Int, lastSeq: UInt64) {
        let batch: NativeBatch
        do throws(PackedFixes.Failure) {
            batch = NativeBatch(packed: try PackedFixes.decode(body))
        } catch {
            throw IngestError.invalid(error.field, error.reason)
        }
        guard batch.items.count <= IngestLimits.batchItems else {
            throw IngestError.tooLarge("a batch holds at most \(IngestLimits.batchItems) fixes, got \(batch.items.count)", field: "fixes")
        }
        return try await storeLocal(batch)
    }

    /// A local tool's fixes, read already, for the device they name (which must be known).
    private func storeLocal(_ batch: NativeBatch) async throws -> (accepted: Int, duplicates: Int, lastSeq: UInt64) {
        guard isKnownLocally(batch.device) else { throw IngestError.invalid("device", "unknown device \"\(batch.device)\"") }
        return summarize(try await store(try parsers.nativeFixes(batch, source: .import)))
    }

    /// The `publish_motion` RPC: motion samples from a local tool (a location history's
    /// activities, through `drivebus import`).
    public func publishMotionLocal(body: [UInt8]) async throws -> (accepted: Int, duplicates: Int, lastSeq: UInt64) {
        try await storeLocal(body) { [parsers] root, device in try parsers.nativeMotion(root: root, device: device) }
    }

    /// A local tool's batch: its body parsed once, for the device it names (which must be known)
    /// and for its records.
    private func storeLocal(
        _ body: [UInt8], records: (JSONFields, String) throws -> [JournalRecord]
    ) async throws -> (accepted: Int, duplicates: Int, lastSeq: UInt64) {
        let root = try JSONFields.object(try JSONFields.parse(body), path: "")
        guard let device = try root.string("device") else { throw IngestError.invalid("device", "is required") }
        guard isKnownLocally(device) else { throw IngestError.invalid("device", "unknown device \"\(device)\"") }
        return summarize(try await store(try records(root, device)))
    }

    /// The `publish_owntracks` RPC: OwnTracks messages from drivebus-mqtt, each decoded as a POST
    /// to `/owntracks` is (same units, leniency and errors), journaled in one group. A refused
    /// message costs only itself; the answer says which and why.
    public func publishOwnTracks(_ messages: [IngestRPCMessages.PublishOwnTracks.Message]) async throws(IngestError) -> IngestRPCMessages.OwnTracksStored {
        var records: [JournalRecord] = []
        var ignored = 0
        var refused: [IngestRPCMessages.OwnTracksStored.Refusal] = []
        for (index, message) in messages.enumerated() {
            do throws(IngestError) {
                guard isKnownLocally(message.device) else { throw .invalid("device", "unknown device \"\(message.device)\"") }
                let parsed: [JournalRecord]
                do {
                    parsed = try parsers.ownTracks(Array(message.payload.utf8), device: message.device, headers: [:])
                } catch let error as IngestError {
                    throw error
                } catch {
                    throw IngestError.invalid("payload", String(describing: error))
                }
                if parsed.isEmpty { ignored += 1 }
                records += parsed
            } catch {
                refused.append(.init(index: index, code: error.code, field: error.field, message: error.message))
            }
        }
        let summary = summarize(try await store(records))
        return .init(accepted: summary.accepted, duplicates: summary.duplicates, ignored: ignored, refused: refused, lastSeq: summary.lastSeq)
    }

    /// The `publish_visits` RPC: a location history's visits, from `drivebus import`.
    public func publishVisitsLocal(body: [UInt8]) async throws -> (accepted: Int, duplicates: Int, lastSeq: UInt64) {
        try await storeLocal(body) { [parsers] root, device in try parsers.visits(root: root, device: device) }
    }

    /// The `checkin` RPC (`drivebus checkin`): journals `taxi.checkin.<device>` at `time` or now.
    public func checkinLocal(device: String, time: Date?) async throws(IngestError) -> UInt64 {
        guard isKnownLocally(device) else { throw .invalid("device", "unknown device \"\(device)\"") }
        let at = time ?? parsers.normalizer.now()
        try parsers.normalizer.checkTime(at, field: "time")
        let records = [JournalRecord(.checkin(TaxiCheckin(device: device, time: Normalizer.milliseconds(at))))]
        return summarize(try await store(records)).lastSeq
    }

    /// Journals `import.finished.<device>`.
    public func finishImport(device: String, file: String, fixes: Int) async throws(IngestError) -> UInt64 {
        guard isKnownLocally(device) else { throw IngestError.invalid("device", "unknown device \"\(device)\"") }
        return summarize(try await store([JournalRecord(.importFinished(ImportFinished(device: device, file: file, fixes: fixes)))])).lastSeq
    }

    // MARK: Helpers

    @discardableResult
    private func store(_ records: [JournalRecord]) async throws(IngestError) -> [Journal.Outcome] {
        guard !records.isEmpty else { return [] }
        // Parsed and encoded concurrently, queued for the journal in arrival order: a request
        // numbered by the RPC service waits here for the ones before it. Motion samples are
        // filtered against the last ones journaled, so they are encoded in turn.
        let turn = arrivalOrder.flatMap { order in ArrivalOrder.current.map { (order, $0) } }
        let hasMotion = records.contains { if case .motion = $0.kind { true } else { false } }
        let early = hasMotion ? nil : journal.prepare(records)
        if let (order, number) = turn { await order.turn(number) }
        // Only motion is filtered: without any, the records are kept as they are, not copied.
        let kept = hasMotion ? motion.filter(records) : records
        do {
            let outcomes = try await journal.append(early ?? journal.prepare(kept)) { if let (order, number) = turn { order.leave(number) } }
            if hasMotion { motion.commit(kept, outcomes) }
            return outcomes
        } catch .overloaded {
            throw .overloaded("the journal cannot keep up; retry shortly")
        } catch {
            throw IngestError(status: 503, code: error.code, message: error.description)
        }
    }

    private func summarize(_ outcomes: [Journal.Outcome]) -> (accepted: Int, duplicates: Int, lastSeq: UInt64) {
        var accepted = 0, duplicates = 0
        // A batch of nothing but duplicates answers the journal's end: everything it holds is in.
        var lastSeq: UInt64 = outcomes.contains { if case .journaled = $0 { true } else { false } } ? 0 : journal.lastSeq
        for outcome in outcomes {
            switch outcome {
            case .journaled(let seq):
                accepted += 1
                lastSeq = seq
            case .duplicate:
                duplicates += 1
            }
        }
        return (accepted, duplicates, lastSeq)
    }

    private func nativeReply(_ outcomes: [Journal.Outcome]) async throws(IngestError) -> IngestResponse {
        let summary = summarize(outcomes)
        return .json(#"{"accepted":\#(summary.accepted),"duplicates":\#(summary.duplicates),"last_seq":\#(summary.lastSeq)}"#)
    }

    private func authenticate(_ request: IngestRequest, parameters: Parameters) throws(IngestError) -> String {
        guard let token = DeviceDirectory.token(headers: request.headers, parameters: parameters) else {
            throw .unauthorized("a device token is required (Authorization: Bearer, Basic auth, or token=)")
        }
        return try authenticate(token: token)
    }

    private func authenticate(token: String) throws(IngestError) -> String {
        guard let device = devices.device(forToken: token) else { throw .unauthorized("unknown token") }
        return device
    }

    private func queryParameters(_ request: IngestRequest) throws(IngestError) -> Parameters {
        guard let parameters = Parameters(urlEncoded: request.query[...]) else { throw IngestError.invalid("query", "malformed percent-encoding") }
        try Self.checkLabels(parameters)
        return parameters
    }

    /// Every parameter value is at most a label long.
    private static func checkLabels(_ parameters: Parameters) throws(IngestError) {
        for (name, value) in parameters.pairs where value.utf8.count > IngestLimits.labelBytes {
            throw IngestLimits.tooLong(name, limit: IngestLimits.labelBytes)
        }
    }

    private func allParameters(_ request: IngestRequest, bodyIsForm: Bool) throws(IngestError) -> Parameters {
        var parameters = try queryParameters(request)
        if bodyIsForm, !request.body.isEmpty {
            guard let form = Parameters(urlEncoded: String(decoding: request.body, as: UTF8.self)[...]) else {
                throw IngestError.invalid("body", "malformed form encoding")
            }
            try Self.checkLabels(form)
            parameters.append(form)
        }
        return parameters
    }
}

/// Overland and Traccar Client repeat the current activity with every location; only changes
/// become motion samples. Samples sent to the native API are kept as they are.
package final class MotionChanges: Sendable {
    /// Each device's activity as the journal has it last: the newest journaled change, by seq.
    private let last = Mutex<[String: (activity: MotionSample.Activity, seq: UInt64)]>([:])

    /// The records to journal: a repeated activity is left out.
    package init() {}

    package func filter(_ records: [JournalRecord]) -> [JournalRecord] {
        var current = last.withLock { $0.mapValues(\.activity) }
        return records.filter { record in
            guard case .motion(let sample) = record.kind, sample.source != .api else { return true }
            guard current[sample.device] != sample.activity else { return false }
            current[sample.device] = sample.activity
            return true
        }
    }

    /// Remembers the changes among `kept` that the journal took (not its duplicates), unless a
    /// newer seq of the device is remembered already: two requests of one phone may commit in
    /// another order than the journal's, and the next real change must not look like a repeat.
    package func commit(_ kept: [JournalRecord], _ outcomes: [Journal.Outcome]) {
        var newest: [String: (activity: MotionSample.Activity, seq: UInt64)] = [:]
        for (record, outcome) in zip(kept, outcomes) {
            guard case .motion(let sample) = record.kind, sample.source != .api, case .journaled(let seq) = outcome else { continue }
            newest[sample.device] = (sample.activity, seq)
        }
        guard !newest.isEmpty else { return }
        last.withLock { last in
            for (device, change) in newest where (last[device]?.seq ?? 0) < change.seq { last[device] = change }
        }
    }
}
