import AsyncHTTPClient
import Crypto
import Foundation
import NIOCore
import NIOHTTP1

/// What one attempt at a webhook call came to.
enum AttemptResult: Sendable, Equatable {
    case delivered(status: Int)
    /// Worth another attempt: a network error, a timeout, 5xx or 429.
    case retry(status: Int?, error: String)
    /// Not worth another attempt: any other 4xx (or 3xx), which the receiver will answer the same way.
    case rejected(status: Int)
}

/// Makes webhook calls with AsyncHTTPClient. Secrets sign the body and are never logged.
struct WebhookSender: Sendable {
    let client: HTTPClient

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

    /// Exponential backoff: 0.5 s, doubling, capped at 60 s.
    static func backoff(afterAttempt attempt: Int) -> TimeInterval {
        min(0.5 * pow(2, Double(max(0, attempt - 1))), 60)
    }

    func attempt(_ entry: OutboxEntry, secret: String?, timeout: TimeInterval) async -> AttemptResult {
        var request = HTTPClientRequest(url: entry.url)
        request.method = HTTPMethod(rawValue: entry.method)
        let extra = (try? JSONDecoder().decode([String: String].self, from: Data(entry.headers.utf8))) ?? [:]
        for (name, value) in extra.sorted(by: { $0.key < $1.key }) { request.headers.add(name: name, value: value) }
        if !request.headers.contains(name: "Content-Type") { request.headers.add(name: "Content-Type", value: "application/json") }
        request.headers.replaceOrAdd(name: "Idempotency-Key", value: entry.key)
        request.headers.replaceOrAdd(name: "User-Agent", value: "drivebus-geofence")
        if let secret, !secret.isEmpty {
            request.headers.replaceOrAdd(name: "X-Drivebus-Signature", value: Self.signature(body: entry.body, secret: secret))
        }
        if entry.method != "GET" && entry.method != "HEAD" {
            request.body = .bytes(ByteBuffer(string: entry.body))
        }
        do {
            let response = try await client.execute(request, timeout: .milliseconds(Int64(timeout * 1000)))
            _ = try? await response.body.collect(upTo: 64 * 1024)
            return Self.classify(status: Int(response.status.code))
        } catch {
            return .retry(status: nil, error: String(describing: error))
        }
    }
}
