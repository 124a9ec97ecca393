import CDrivebusSupport
import DrivebusSettings
import DrivebusZMQ
import Foundation
import Logging
import ServiceLifecycle

/// The bus itself: `zmq_proxy` from XSUB `bus.in` (where every service publishes) to XPUB
/// `bus.out` (where every subscriber, external tools included, connects).
///
/// The proxy blocks, so it runs on a thread of its own with a context of its own; shutting that
/// context down is what makes it return.
public final class Broker: Service, Sendable {
    private let endpoints: (in: ZMQEndpoint, out: ZMQEndpoint)
    /// The one client key CURVE connections may present (ZAP), for a bus over tcp://.
    private let allowedClientKey: [UInt8]?
    private let logger: Logger
    private let context = ZMQContext()

    public init(settings: ProcessSettings, logger: Logger) throws(ConfigError) {
        let usesTCP = [settings.bus.inEndpoint, settings.bus.outEndpoint].contains { $0?.hasPrefix("tcp://") == true }
        if usesTCP && settings.bus.curve?.serverSecretKey == nil {
            throw ConfigError(path: "bus.curve.server_secret_key", reason: "is required on the machine that runs drivebus-bus")
        }
        self.endpoints = settings.busEndpoints(asBroker: true)
        self.allowedClientKey = settings.bus.curve.flatMap { CurveKeyPair.decode(z85: $0.clientPublicKey) }
        if usesTCP && allowedClientKey == nil {
            throw ConfigError(path: "bus.curve.client_public_key", reason: "is not a valid Z85 key")
        }
        self.logger = logger
    }

    public func run() async throws {
        let (bound, boundContinuation) = AsyncStream.makeStream(of: Result<Void, any Error>.self)
        let (finished, finishedContinuation) = AsyncStream.makeStream(of: Void.self)
        if let allowedClientKey { try startZAP(allowing: allowedClientKey) }
        let thread = Thread { [context, endpoints, logger] in
            _ = drivebus_thread_name("zmq-proxy")
            defer { finishedContinuation.finish() }
            let frontend: ZMQSocket, backend: ZMQSocket
            do {
                frontend = try ZMQSocket(context, .xsub)
                backend = try ZMQSocket(context, .xpub)
                // Room for bursts; beyond it PUB/SUB drops and consumers replay. Per subscriber
                // that lags (a fast import), the bus holds at most 2,000 messages for it: a
                // journal page is up to 32 KB, so that is 64 MB at most, and the subscriber's
                // own queue comes after it. From each publisher it takes up to 20,000 while
                // the proxy thread is behind (it forwards far faster than ingest publishes).
                try frontend.setHighWaterMarks(send: 20_000, receive: 20_000)
                try backend.setHighWaterMarks(send: 2_000, receive: 2_000)
                if let curve = endpoints.in.curve { try frontend.setCurve(curve) }
                if let curve = endpoints.out.curve { try backend.setCurve(curve) }
                try frontend.bind(endpoints.in.address)
                try backend.bind(endpoints.out.address)
            } catch {
                boundContinuation.yield(.failure(error))
                boundContinuation.finish()
                return
            }
            boundContinuation.yield(.success(()))
            boundContinuation.finish()
            let ended = zmqProxy(frontend: frontend, backend: backend)
            if !ended.isTerminated { logger.error("proxy stopped: \(ended)") }
            frontend.close()
            backend.close()
        }
        thread.start()
        for await result in bound { try result.get() }
        logger.info("bus up", metadata: ["in": "\(endpoints.in.address)", "out": "\(endpoints.out.address)"])
        try? await gracefulShutdown()
        context.shutdown()
        for await _ in finished {}
    }

    /// CURVE alone lets in anyone who knows the server's public key. libzmq asks a ZAP handler
    /// (RFC 27) on `inproc://zeromq.zap.01` about every connection; this one admits only the
    /// configured client key. It must be bound before the CURVE sockets.
    private func startZAP(allowing clientKey: [UInt8]) throws {
        let zap = try ZMQSocket(context, .rep)
        try zap.bind("inproc://zeromq.zap.01")
        nonisolated(unsafe) let handler = zap  // owned by the thread below from here on
        let logger = logger
        let thread = Thread {
            _ = drivebus_thread_name("zmq-zap")
            defer { handler.close() }
            // A blocking receive on a thread of its own; context shutdown ends it with ETERM.
            while let request = try? handler.receive(dontWait: false) {
                // [version, request id, domain, address, identity, mechanism, credentials…]
                let allowed = request.count >= 7 && String(decoding: request[5], as: UTF8.self) == "CURVE" && request[6] == clientKey
                if !allowed {
                    let address = request.count > 3 ? String(decoding: request[3], as: UTF8.self) : "?"
                    logger.warning("bus connection refused: unknown CURVE client key", metadata: ["address": "\(address)"])
                }
                // Every request is answered, a malformed one with a refusal: a REP socket left
                // without its reply fails the next receive, and the handler's thread would end,
                // leaving libzmq to admit connections without asking.
                let version = request.first ?? Array("1.0".utf8), id = request.count > 1 ? request[1] : []
                _ = try? handler.send([version, id, Array((allowed ? "200" : "400").utf8), Array((allowed ? "OK" : "client key not allowed").utf8), [], []], dontWait: false)
            }
        }
        thread.start()
    }
}
