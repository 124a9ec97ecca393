import Foundation

/// The `op` every RPC request carries; a handler then decodes its own parameters from the body.
public struct RPCRequestHead: Codable, Sendable {
    public var op: String
    public init(op: String) { self.op = op }

    /// The request's `op`. A body that starts `{"op":"NAME"` (as drivebus's own clients write
    /// it) is read at once: decoding a 5,000-fix `publish` to find its op cost 6 % of ingest's time
    /// during an import. Any other body is decoded whole.
    public static func op(of body: [UInt8]) -> String? {
        let prefix = Array(#"{"op":""#.utf8)
        if body.count > prefix.count, body.starts(with: prefix),
           let end = body[prefix.count...].firstIndex(of: UInt8(ascii: "\"")), end > prefix.count,
           body[prefix.count..<end].allSatisfy({ $0 >= 0x20 && $0 < 0x7F && $0 != UInt8(ascii: "\\") }) {
            return String(decoding: body[prefix.count..<end], as: UTF8.self)
        }
        return (try? BusJSON.decode(RPCRequestHead.self, from: body))?.op
    }
}

public struct RPCErrorBody: Codable, Sendable, Equatable, Error, CustomStringConvertible {
    /// Stable, dotted: `rpc.bad_request`, `rpc.unknown_op`, `ingest.journal_full`…
    public var code: String
    public var message: String

    public init(code: String, message: String) {
        self.code = code
        self.message = message
    }

    public var description: String { "\(code): \(message)" }

    public static func badRequest(_ message: String) -> RPCErrorBody { .init(code: "rpc.bad_request", message: message) }
    public static func unknownOp(_ op: String) -> RPCErrorBody { .init(code: "rpc.unknown_op", message: "unknown op \"\(op)\"") }
    public static func unavailable(_ message: String) -> RPCErrorBody { .init(code: "rpc.unavailable", message: message) }
}

/// A reply: `{"ok":true, …result's fields}` or `{"ok":false,"error":{"code","message"}}`.
public enum RPCReply<Result: Codable & Sendable>: Codable, Sendable {
    case success(Result)
    case failure(RPCErrorBody)

    private enum Keys: String, CodingKey { case ok, error }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: Keys.self)
        switch self {
        case .success(let result):
            try container.encode(true, forKey: .ok)
            // The result's fields go into the same object as `ok`.
            try result.encode(to: encoder)
        case .failure(let error):
            try container.encode(false, forKey: .ok)
            try container.encode(error, forKey: .error)
        }
    }

    public init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: Keys.self)
        if try container.decode(Bool.self, forKey: .ok) {
            self = .success(try Result(from: decoder))
        } else {
            self = .failure(try container.decode(RPCErrorBody.self, forKey: .error))
        }
    }

    public func get() throws(RPCErrorBody) -> Result {
        switch self {
        case .success(let result): return result
        case .failure(let error): throw error
        }
    }
}

/// For replies that carry nothing but `ok`.
public struct RPCEmpty: Codable, Sendable, Equatable {
    public init() {}
}

/// The reply to `health`, which every service answers.
public struct HealthReply: Codable, Sendable, Equatable {
    public var service: String
    public var status: String
    public var pid: Int32
    public var epoch: String
    public var startedAt: Date
    public var uptimeS: Double
    public var publishedSeq: UInt64
    public var lastSeq: [String: UInt64]

    public init(service: String, status: String, pid: Int32, epoch: String, startedAt: Date, uptimeS: Double, publishedSeq: UInt64, lastSeq: [String: UInt64]) {
        self.service = service
        self.status = status
        self.pid = pid
        self.epoch = epoch
        self.startedAt = startedAt
        self.uptimeS = uptimeS
        self.publishedSeq = publishedSeq
        self.lastSeq = lastSeq
    }

    enum CodingKeys: String, CodingKey {
        case service, status, pid, epoch
        case startedAt = "started_at"
        case uptimeS = "uptime_s"
        case publishedSeq = "published_seq"
        case lastSeq = "last_seq"
    }
}

/// The RPC ops every service with an event journal answers besides `events` (`EventLog`).
public enum EventsRPCMessages {
    /// `purge_events`: a device's events about the times between `from` and `to` become
    /// stand-ins in the service's event journal (docs/data.md).
    public struct Purge: Codable, Sendable {
        public var op = "purge_events"
        public var device: String
        public var from: Date
        public var to: Date
        public init(device: String, from: Date, to: Date) {
            self.device = device
            self.from = from
            self.to = to
        }
    }

    /// What `purge_events` did: `rows` counts what the service removed besides its event
    /// journal (geofence: `outbox`), by table.
    public struct Purged: Codable, Sendable, Equatable {
        public var events: Int
        public var bytesBefore: Int64
        public var bytesAfter: Int64
        public var rows: [String: Int]
        enum CodingKeys: String, CodingKey {
            case events, rows
            case bytesBefore = "bytes_before"
            case bytesAfter = "bytes_after"
        }
        public init(events: Int, bytesBefore: Int64, bytesAfter: Int64, rows: [String: Int] = [:]) {
            self.events = events
            self.bytesBefore = bytesBefore
            self.bytesAfter = bytesAfter
            self.rows = rows
        }
    }
}
