import AsyncHTTPClient
import DrivebusSchema
import GeofenceCore
import Crypto
import Foundation
import NIOCore
import NIOHTTP1
import Synchronization

/// What one attempt at a webhook call came to.
enum AttemptResult: Sendable, Equatable {
    case delivered(status: Int)
    /// Worth another attempt: a network error, a timeout, 5xx or 429.
    case retry(status: Int?, error: String)
    /// Not worth another attempt: any other 4xx (or 3xx), which the receiver will answer the same way.
    case rejected(status: Int)
}

/// Makes webhook calls with a client of its own. Secrets sign the body and are never logged.
///
/// The shared client retries connection establishment after a refusal on its own, stacked on our
/// backoff: a receiver that came back waited for both. This one tries once per attempt, with a
/// short connect timeout, and our backoff decides when to try again.
///
/// The client is made at the first call: a system whose gates stay quiet (or that has none) never
/// starts its event loop threads, which is most of geofence's memory at rest.
final class WebhookSender: Sendable {
    private let made = Mutex<HTTPClient?>(nil)

    private var client: HTTPClient {
        made.withLock { made in
            if let client = made { return client }
            var configuration = HTTPClient.Configuration(redirectConfiguration: .disallow)
            configuration.connectionPool.retryConnectionEstablishment = false
            configuration.timeout.connect = .seconds(2)
            let client = HTTPClient(eventLoopGroup: HTTPClient.defaultEventLoopGroup, configuration: configuration)
            made = client
            return client
        }
    }

    /// Shuts the client down, if one was made.
    func shutdown() async throws {
        try await made.withLock { $0 }?.shutdown()
    }

    /// `X-Drivebus-Signature: sha256=<hex>` of the exact body, when the gate has a secret.
    static func signature(body: String, secret: String) -> String {
        let mac = HMAC<SHA256>.authenticationCode(for: Data(body.utf8), using: SymmetricKey(data: Data(secret.utf8)))
        return "sha256=" + mac.map { String(format: "%02x", $0) }.joined()
    }

    static func classify(status: Int) -> AttemptResult {
        switch status {
        case 200..<300: .delivered(status: status)
        case 429, 500..<600: .retry(status: status, error: "HTTP \(status)")
        default: .rejected(status: status)
        }
    }

    /// Exponential backoff: 0.25 s, doubling, capped at `cap`. A gate's cap is short (2 s): a gate
    /// call is worth something only for `max_age_s`, and a receiver that comes back should get it
    /// at once.
    static func backoff(afterAttempt attempt: Int, cap: TimeInterval = 2) -> TimeInterval {
        min(0.25 * pow(2, Double(min(max(0, attempt - 1), 20))), cap)
    }

    /// One attempt at `entry`, with the URL, method and headers from `webhook` (the config).
    func attempt(_ entry: OutboxEntry, webhook: Webhook) async -> AttemptResult {
        let values = (try? JSONDecoder().decode(GateValues.self, from: Data(entry.values.utf8)))
            ?? GateValues(gate: entry.gate, device: entry.device, zone: entry.zone, time: RFC3339.format(entry.fixTime), lat: 0, lon: 0, speedMps: nil)
        var request = HTTPClientRequest(url: webhook.url(for: values))
        request.method = HTTPMethod(rawValue: webhook.method)
        for (name, value) in webhook.headers.sorted(by: { $0.key < $1.key }) { request.headers.add(name: name, value: value) }
        if !request.headers.contains(name: "Content-Type") { request.headers.add(name: "Content-Type", value: "application/json") }
        request.headers.replaceOrAdd(name: "Idempotency-Key", value: entry.key)
        request.headers.replaceOrAdd(name: "User-Agent", value: "drivebus-geofence")
        if let secret = webhook.secret, !secret.isEmpty {
            request.headers.replaceOrAdd(name: "X-Drivebus-Signature", value: Self.signature(body: entry.body, secret: secret))
        }
        if webhook.method != "GET" && webhook.method != "HEAD" {
            request.body = .bytes(ByteBuffer(string: entry.body))
        }
        do {
            let response = try await client.execute(request, timeout: .milliseconds(Int64(webhook.timeoutS * 1000)))
            _ = try? await response.body.collect(upTo: 64 * 1024)
            return Self.classify(status: Int(response.status.code))
        } catch {
            return .retry(status: nil, error: String(describing: error))
        }
    }
}
