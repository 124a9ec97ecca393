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
    private let logger: Logger
    private let context = ZMQContext()

    public init(config: DrivebusConfig, logger: Logger) throws(ConfigError) {
        let usesTCP = [config.bus.inEndpoint, config.bus.outEndpoint].contains { $0?.hasPrefix("tcp://") == true }
        if usesTCP && config.bus.curve?.serverSecretKey == nil {
            throw ConfigError(path: "bus.curve.server_secret_key", reason: "is required on the machine that runs drivebus-bus")
        }
        self.endpoints = config.busEndpoints(asBroker: true)
        self.logger = logger
    }

    public func run() async throws {
        let (bound, boundContinuation) = AsyncStream.makeStream(of: Result<Void, any Error>.self)
        let (finished, finishedContinuation) = AsyncStream.makeStream(of: Void.self)
        let thread = Thread { [context, endpoints, logger] in
            defer { finishedContinuation.finish() }
            let frontend: ZMQSocket, backend: ZMQSocket
            do {
                frontend = try ZMQSocket(context, .xsub)
                backend = try ZMQSocket(context, .xpub)
                // Room for bursts; beyond it PUB/SUB drops and consumers replay.
                try frontend.setHighWaterMarks(send: 200_000, receive: 200_000)
                try backend.setHighWaterMarks(send: 200_000, receive: 200_000)
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
        thread.name = "zmq-proxy"
        thread.start()
        for await result in bound { try result.get() }
        logger.info("bus up", metadata: ["in": "\(endpoints.in.address)", "out": "\(endpoints.out.address)"])
        try? await gracefulShutdown()
        context.shutdown()
        for await _ in finished {}
    }
}
