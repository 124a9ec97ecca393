import DrivebusJournal
import DrivebusKit
import Foundation
import IngestCore

/// `replay`, `publish`, `publish_packed`, `publish_motion`, `import_finished` and `purge` on `ipc://RUN/ingest.rpc`.
struct IngestRPC {
    let handler: IngestHandler
    let journal: Journal

    typealias ReplayRequest = IngestRPCMessages.Replay
    typealias PublishReply = IngestRPCMessages.Stored
    typealias ImportFinishedRequest = IngestRPCMessages.ImportFinished
    typealias CheckinRequest = IngestRPCMessages.Checkin

    static let maxReplay = 10_000

    /// A local tool's batches: parsed concurrently, journaled in the order they arrived, so an
    /// import may send its next batch before the last is answered.
    static let ordered: Set<String> = ["publish", PackedFixes.op, "publish_motion", "publish_visits"]

    var handlers: [String: RPCHandler] {
        let journal = journal, handler = handler
        return [
            // The reply is built by hand: each payload is already JSON and goes in as it is.
            "replay": { body in
                guard let request = try? BusJSON.decode(ReplayRequest.self, from: body) else {
                    return Self.failure(.badRequest("replay needs from_seq (an integer from 1) and an optional limit"))
                }
                let limit = min(max(request.limit ?? 1000, 1), Self.maxReplay)
                let entries: [Journal.Entry]
                do {
                    entries = try await Self.offPool { try journal.replay(fromSeq: max(request.fromSeq, 1), limit: limit) }
                } catch {
                    return Self.failure(.init(code: "ingest.journal_io", message: String(describing: error)))
                }
                var out = Array(#"{"ok":true,"last_seq":\#(journal.lastSeq),"messages":["#.utf8)
                for (index, entry) in entries.enumerated() {
                    if index > 0 { out.append(UInt8(ascii: ",")) }
                    JournalPage.appendElement(seq: entry.seq, topic: entry.topic, payload: entry.payload, to: &out)
                }
                out += Array("]}".utf8)
                return out
            },
            "publish": { body in await Self.stored { try await handler.publishLocal(body: body) } },
            "publish_motion": { body in await Self.stored { try await handler.publishMotionLocal(body: body) } },
            PackedFixes.op: { body in await Self.stored { try await handler.publishPacked(body: body) } },
            "publish_owntracks": RPC.handler(IngestRPCMessages.PublishOwnTracks.self) {
                (request: IngestRPCMessages.PublishOwnTracks) throws(RPCErrorBody) -> IngestRPCMessages.OwnTracksStored in
                do {
                    return try await handler.publishOwnTracks(request.messages)
                } catch {
                    throw Self.rpcError(error)
                }
            },
            "publish_visits": { body in await Self.stored { try await handler.publishVisitsLocal(body: body) } },
            "checkin": RPC.handler(CheckinRequest.self) { (request: CheckinRequest) throws(RPCErrorBody) -> PublishReply in
                do {
                    let seq = try await handler.checkinLocal(device: request.device, time: request.time)
                    return PublishReply(accepted: 1, duplicates: 0, lastSeq: seq)
                } catch {
                    throw Self.rpcError(error)
                }
            },
            "purge": RPC.handler(IngestRPCMessages.Purge.self) { (request: IngestRPCMessages.Purge) throws(RPCErrorBody) -> IngestRPCMessages.Purged in
                guard request.from <= request.to else { throw RPCErrorBody.badRequest("purge: from must not be after to") }
                do throws(Journal.Failure) {
                    let report = try await journal.remove(.init(
                        types: Journal.Removal.removableTypes, device: request.device, from: request.from, to: request.to, forgetKeys: request.resendOK))
                    return .init(records: report.records, segments: report.segments, bytesBefore: report.bytesBefore, bytesAfter: report.bytesAfter)
                } catch {
                    throw RPCErrorBody(code: error.code, message: error.description)
                }
            },
            "import_finished": RPC.handler(ImportFinishedRequest.self) { (request: ImportFinishedRequest) throws(RPCErrorBody) -> PublishReply in
                do {
                    let seq = try await handler.finishImport(device: request.device, file: request.file, fixes: request.fixes)
                    return PublishReply(accepted: 1, duplicates: 0, lastSeq: seq)
                } catch {
                    throw Self.rpcError(error)
                }
            },
        ]
    }

    /// The reply of a local tool's batch (`publish`, `publish_motion`, `publish_visits`).
    static func stored(_ store: () async throws -> (accepted: Int, duplicates: Int, lastSeq: UInt64)) async -> [UInt8] {
        do {
            let summary = try await store()
            return success(PublishReply(accepted: summary.accepted, duplicates: summary.duplicates, lastSeq: summary.lastSeq))
        } catch {
            return failure(rpcError(error))
        }
    }

    static func rpcError(_ error: any Error) -> RPCErrorBody {
        guard let error = error as? IngestError else { return RPCErrorBody(code: "ingest.internal", message: String(describing: error)) }
        return RPCErrorBody(code: error.code, message: error.message)
    }

    static func success<T: Codable & Sendable>(_ value: T) -> [UInt8] {
        (try? BusJSON.encode(RPCReply.success(value))) ?? []
    }

    static func failure(_ error: RPCErrorBody) -> [UInt8] {
        (try? BusJSON.encode(RPCReply<RPCEmpty>.failure(error))) ?? []
    }

    /// Runs blocking file reads on a thread of their own, not the cooperative pool.
    static func offPool<T: Sendable>(_ work: @escaping @Sendable () throws -> T) async throws -> T {
        try await withCheckedThrowingContinuation { continuation in
            Thread { continuation.resume(with: Result { try work() }) }.start()
        }
    }
}
