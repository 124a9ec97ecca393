import DrivebusJournal
import DrivebusSchema
import Foundation
import Logging
import ServiceLifecycle

/// A record of a sequenced stream.
public protocol StreamRecord: Sendable {
    var seq: UInt64 { get }
}

extension JournalMessage: StreamRecord {}
extension LoggedEvent: StreamRecord {}

/// A stream a consumer can follow: where its records appear live, who claims its last seq, and
/// how to replay it.
public struct StreamSource<Record: StreamRecord>: Sendable {
    /// The name the consumer keeps its cursor under: `journal`, `events.trips`…
    public let name: String
    /// The service that writes it: its heartbeat claims the last seq, its RPC replays.
    public let service: ServiceName
    /// The bus topic prefixes its records are published on.
    public let topics: [String]
    /// The heartbeat's `last_seq` key that holds the stream's last seq.
    public let heartbeatKey: String
    /// How many of its live messages a follower's socket holds, and how many go in each batch
    /// handed on (64 batches wait at most): beyond that newer ones are dropped, and replayed later.
    public let backlog: (highWaterMark: Int32, batchLimit: Int)
    /// The records a live bus message carries: none for one that is not of this stream; an
    /// error for one that should carry records and cannot be read.
    public let records: @Sendable (BusMessage) throws -> [Record]
    /// One page of records from `from` on, and the stream's last seq.
    public let replay: @Sendable (_ bus: BusClient, _ from: UInt64, _ limit: Int) async throws -> (records: [Record], lastSeq: UInt64)
}

extension StreamSource where Record == JournalMessage {
    /// The ingest journal: fixes, motion, check-ins, imports, sessions, followed in the pages
    /// ingest publishes for each commit (`JournalBroadcast`).
    public static var journal: StreamSource {
        StreamSource(
            // A page holds up to 32 KB: 400 in the socket and 64 batches of 16 after it are at
            // most about 46 MB. (With half as many, the batched system was slower, ingest busier,
            // as pages dropped and replayed would make it; a 500 MB import's peak memory was the
            // same either way.)
            name: "journal", service: .ingest, topics: [JournalPage.type], heartbeatKey: "journal", backlog: (400, 16),
            records: { message in try JournalPage.records(in: message) },
            replay: { bus, from, limit in
                let page = try await ReplayPage.fetch(from: from, limit: limit, bus: bus)
                return (page.messages, page.lastSeq)
            })
    }
}

extension StreamSource where Record == LoggedEvent {
    /// The events `service` derived and journaled (`EventLog`).
    public static func events(of service: ServiceName, types: [String]) -> StreamSource {
        StreamSource(
            name: "events.\(service.rawValue)", service: service, topics: types.map { $0 + "." }, heartbeatKey: "events",
            backlog: (10_000, ZMQLoop.drainBatch),
            records: { message in
                guard message.header.source == service.rawValue, let seq = message.header.logSeq else { return [] }
                return [
                    LoggedEvent(
                        seq: seq, type: message.header.type, device: message.device, id: message.header.id, time: message.header.time,
                        payload: message.payload)
                ]
            },
            replay: { bus, from, limit in try await EventsRPC.fetch(service, from: from, limit: limit, bus: bus) })
    }
}

/// Follows one stream for a consumer: subscribes, catches up from the consumer's checkpoint,
/// applies live records, fills gaps and lost tails by replay, exactly once and in order. The
/// decisions are `StreamCursor`'s; this does the I/O. Every consumer follows its streams with it.
public struct StreamFollower<Record: StreamRecord>: Sendable {
    /// Applies records in seq order; `live` says whether they came straight off the bus.
    /// Throwing stops the follower (and the service, whose supervisor restarts it).
    public typealias Apply = @Sendable (_ records: [Record], _ live: Bool) async throws -> Void
    /// Called with true before a replay or a group of live records is applied, and with false
    /// after: a consumer whose wall-clock ticks must not land in between holds them meanwhile.
    public typealias Hold = @Sendable (Bool) -> Void

    public let source: StreamSource<Record>
    public let bus: BusClient
    public let logger: Logger
    public var pageSize = 2000

    public init(source: StreamSource<Record>, bus: BusClient, logger: Logger) {
        self.source = source
        self.bus = bus
        self.logger = logger
    }

    /// Runs until graceful shutdown. `cursor` reports the cursor after every step, for the
    /// consumer's `health`.
    public func run(
        from lastApplied: UInt64, hold: Hold = { _ in }, cursor report: @escaping @Sendable (StreamCursor) -> Void = { _ in },
        apply: Apply
    ) async throws {
        var cursor = StreamCursor(lastApplied: lastApplied)
        // Subscribe first, so that nothing published during the catch-up is missed. The source's
        // heartbeat comes along: it proves the subscription reaches it, and it claims the last
        // seq, which reveals records lost at the tail of the stream.
        let heartbeat = "svc.heartbeat.\(source.service.rawValue)"
        // A small backlog: what falls behind it is replayed from the source. A consumer that
        // lags a fast import then holds a few megabytes instead of the import (a 2 GB history
        // held gigabytes in every consumer).
        var groups = try await bus.subscribe(
            source.topics + [heartbeat], highWaterMark: source.backlog.highWaterMark, bufferLimit: 64, batchLimit: source.backlog.batchLimit)
            .groups.cancelOnGracefulShutdown().makeAsyncIterator()
        // The catch-up is held like any replay: the wall clock must not decide between records
        // of a backlog while later ones are still to be applied.
        hold(true)
        do {
            try await replay(&cursor, through: nil, hold: hold, apply: apply)
        } catch {
            hold(false)
            throw error
        }
        hold(false)
        report(cursor)
        var unreadable = 0
        while let messages = try await groups.next() {
            hold(true)
            defer { hold(false) }
            var batch: [Record] = []
            for message in messages {
                if message.topic == heartbeat {
                    guard let claimed = (try? message.decode(Heartbeat.self))?.lastSeq[source.heartbeatKey] else { continue }
                    try await flush(&batch, apply)
                    if let target = cursor.heartbeat(claims: claimed) {
                        if cursor.isLive { logger.notice("\(source.name): records lost at the tail, replaying", metadata: ["through": "\(target)"]) }
                        try await replay(&cursor, through: target, hold: hold, apply: apply)
                        cursor.replayEnded()
                    }
                    continue
                }
                let records: [Record]
                do {
                    records = try source.records(message)
                } catch {
                    // Left out: the next message or heartbeat shows the gap, and it is replayed.
                    // Said once, then every 1,000th: a publisher of another format would fail them all.
                    if unreadable % 1000 == 0 {
                        logger.error("\(source.name): a live message could not be read, its records will be replayed: \(error)", metadata: ["unreadable": "\(unreadable + 1)"])
                    }
                    unreadable += 1
                    continue
                }
                for record in records {
                    var step = cursor.received(record.seq)
                    if case .fill(let through) = step {
                        try await flush(&batch, apply)
                        logger.notice("\(source.name): gap, replaying", metadata: ["from": "\(cursor.lastApplied + 1)", "through": "\(through)"])
                        try await replay(&cursor, through: through, hold: hold, apply: apply)
                        step = cursor.afterFill(record.seq)
                    }
                    if step == .apply {
                        batch.append(record)
                        cursor.applied(record.seq)
                    }
                }
            }
            try await flush(&batch, apply)
            report(cursor)
        }
    }

    private func flush(_ batch: inout [Record], _ apply: Apply) async throws {
        guard !batch.isEmpty else { return }
        try await apply(batch, true)
        batch.removeAll(keepingCapacity: true)
    }

    /// Replays until `target` (or the stream's end) has been applied, waiting for the source
    /// while it cannot be reached.
    private func replay(_ cursor: inout StreamCursor, through target: UInt64?, hold: Hold, apply: Apply) async throws {
        var attempt = 0
        while !Task.isShuttingDownGracefully {
            // Cancelled (a sibling task failed, and the service is to exit and be restarted),
            // every request and every pause would end at once: this loop would spin a core for
            // ever, and the service never exit.
            try Task.checkCancellation()
            let from = cursor.lastApplied + 1
            if let target, from > target { return }
            let page: (records: [Record], lastSeq: UInt64)
            do {
                // A stopping consumer does not wait out the request's timeout for a source that is down.
                page = try await cancelWhenGracefulShutdown { try await source.replay(bus, from, pageSize) }
                attempt = 0
            } catch {
                if Task.isShuttingDownGracefully { return }
                try Task.checkCancellation()
                // The source may be starting too: wait for it rather than give up. Meanwhile the
                // consumer's clock goes on deciding, as it would with no replay under way.
                attempt += 1
                if attempt == 1 || attempt % 30 == 0 { logger.warning("\(source.name): replay failed, retrying: \(error)") }
                hold(false)
                let pause = Duration.milliseconds(min(200 * attempt, 2000))
                try? await cancelWhenGracefulShutdown { try await Task.sleep(for: pause) }
                hold(true)
                continue
            }
            let next = page.records.filter { record in cursor.applied(record.seq) }
            if !next.isEmpty { try await apply(next, false) }
            if page.records.isEmpty || cursor.lastApplied >= page.lastSeq { return }
            // A page that did not start where asked is a source that lost records: say so once
            // rather than loop on it.
            if next.isEmpty {
                logger.error("\(source.name): replay from \(from) returned no usable records; waiting for the next heartbeat")
                return
            }
        }
    }
}

/// The `events` RPC: pages of a service's event journal, `{"op":"events","from_seq":N,"limit":L}`.
/// Replies `{"ok":true,"last_seq":N,"events":[…]}`, each event as the journal holds it.
public enum EventsRPC {
    static let maxPage = 10_000

    static func handler(_ journal: EventJournal) -> RPCHandler {
        { body in
            struct Request: Decodable {
                let fromSeq: UInt64
                let limit: Int?
                enum CodingKeys: String, CodingKey {
                    case fromSeq = "from_seq"
                    case limit
                }
            }
            guard let request = try? BusJSON.decode(Request.self, from: body) else {
                return RPC.encode(RPCReply<RPCEmpty>.failure(.badRequest("events needs from_seq (an integer from 1) and an optional limit")))
            }
            let limit = min(max(request.limit ?? 1000, 1), maxPage)
            let events: [LoggedEvent]
            do {
                events = try await journal.read(fromSeq: max(request.fromSeq, 1), limit: limit)
            } catch {
                return RPC.encode(RPCReply<RPCEmpty>.failure(.init(code: "events.io", message: String(describing: error))))
            }
            var out = Array(#"{"ok":true,"last_seq":\#(journal.lastSeq),"events":["#.utf8)
            for (index, event) in events.enumerated() {
                if index > 0 { out.append(UInt8(ascii: ",")) }
                event.writeLine(to: &out)
                out.removeLast()  // the newline
            }
            out += Array("]}".utf8)
            return out
        }
    }

    /// Up to `limit` events of `service`'s journal from seq `from` on, and its last seq.
    public static func fetch(_ service: ServiceName, from: UInt64, limit: Int, bus: BusClient) async throws -> (records: [LoggedEvent], lastSeq: UInt64) {
        let request = Array(#"{"op":"events","from_seq":\#(from),"limit":\#(limit)}"#.utf8)
        let reply = try await bus.loop.request(ZMQEndpoint(bus.settings.layout.rpcEndpoint(service)), body: request, timeout: .seconds(10))
        return try page(reply: reply)
    }

    /// Reads a reply as it streams, each event's payload kept as its bytes (as `ReplayPage` does).
    public static func page(reply: [UInt8]) throws(RPCErrorBody) -> (records: [LoggedEvent], lastSeq: UInt64) {
        var events: [LoggedEvent] = []
        var unreadable = false
        let last = try PageReply.read(reply, name: "events", items: "events") { (reader: inout JSONReader) throws(JSONReader.Failure) in
            if let event = LoggedEvent(line: try reader.readRawValue()[...]) { events.append(event) } else { unreadable = true }
        }
        guard !unreadable else { throw RPCErrorBody.badRequest("events reply holds an unreadable event") }
        return (events, last)
    }
}
