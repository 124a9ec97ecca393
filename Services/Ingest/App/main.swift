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
    // Called on the journal's writer thread after each group commit, in seq order.
    let journal = try Journal(path: config.layout.dataDir + "/journal.log") { entry, record in
        do {
            try publisher.publish(record.type, device: record.device, payloadJSON: entry.payload)
        } catch {
            logger.error("journaled seq \(entry.seq) not published: \(error)")
        }
    }
    logger.info("journal open", metadata: ["path": "\(journal.path)", "last_seq": "\(journal.lastSeq)"])
    let handler = IngestHandler(config: config, journal: journal)
    let listen = config.ingest.listen
    let http = Application(
        responder: IngestResponder(handler: handler, maxBodyBytes: config.ingest.maxBodyBytes),
        configuration: .init(address: .hostname(listen.host, port: listen.port), serverName: "drivebus-ingest"),
        logger: logger
    )
    return ServiceParts(
        // ServiceGroup stops services in reverse order: HTTP first, then the journal.
        services: [JournalCloser(journal: journal), http],
        rpc: IngestRPC(handler: handler, journal: journal).handlers,
        lastSeq: { ["journal": journal.lastSeq] }
    )
}

/// Hands every HTTP request to the core; the only HTTP-specific work is the body limit.
struct IngestResponder: HTTPResponder {
    typealias Context = BasicRequestContext
    let handler: IngestHandler
    let maxBodyBytes: Int

    func respond(to request: Request, context: Context) async throws -> Response {
        let body: ByteBuffer
        do {
            body = try await request.body.collect(upTo: maxBodyBytes)
        } catch {
            let tooLarge = IngestError.tooLarge("the body is larger than ingest.max_body_bytes (\(maxBodyBytes) bytes)", field: "body")
            return response(IngestResponse(status: 413, body: tooLarge.json))
        }
        var headers: [String: String] = [:]
        for field in request.headers { headers[field.name.canonicalName] = headers[field.name.canonicalName] ?? field.value }
        let answer = await handler.handle(IngestRequest(
            method: request.method.rawValue, path: request.uri.path, query: request.uri.query ?? "",
            headers: headers, body: Array(buffer: body)))
        return response(answer)
    }

    private func response(_ answer: IngestResponse) -> Response {
        Response(
            status: .init(code: answer.status),
            headers: [.contentType: answer.contentType],
            body: .init(byteBuffer: ByteBuffer(bytes: answer.body)))
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
