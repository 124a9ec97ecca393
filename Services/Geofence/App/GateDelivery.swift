import DrivebusKit
import Foundation
import GeofenceCore
import Logging
import ServiceLifecycle
import Synchronization

/// Delivers gate calls from the outbox: every due call is attempted, retried with backoff on
/// network errors, timeouts, 5xx and 429, and never sent again once it succeeded.
final class GateDelivery: Service, Sendable {
    private let context: ServiceContext
    private let outbox: Outbox
    private let events: EventLog
    private let gates: [String: Gate]
    private let sender: WebhookSender
    private let (wakeups, wake) = AsyncStream.makeStream(of: Void.self, bufferingPolicy: .bufferingNewest(1))
    private let inFlight = Mutex<Set<String>>([])
    /// Calls known to be delivered, even if recording that in the outbox failed.
    private let delivered = Mutex<Set<String>>([])

    init(context: ServiceContext, outbox: Outbox, events: EventLog, gates: [Gate], sender: WebhookSender) {
        self.context = context
        self.outbox = outbox
        self.events = events
        self.gates = Dictionary(gates.map { ($0.id, $0) }, uniquingKeysWith: { first, _ in first })
        self.sender = sender
    }

    /// Turns the engine's outputs into bus events, and writes gate calls to the outbox before
    /// anything is sent. Runs under the consumer's lock, in journal order.
    func route(_ outputs: [GeofenceOutput]) -> [DerivedEvent] {
        var events: [DerivedEvent] = []
        for output in outputs {
            switch output {
            case .transition(let transition):
                if let event = try? DerivedEvent(type: output.type, device: output.device, id: output.eventID, payload: transition) {
                    events.append(event)
                }
            case .gate(let call):
                let now = Date()
                let entry = OutboxEntry(
                    key: call.idempotencyKey, gate: call.gate, device: call.device, zone: call.zone, fixSeq: Int64(call.fixSeq ?? 0),
                    fixTime: call.time, url: call.url, method: call.method,
                    headers: String(decoding: (try? JSONEncoder().encode(call.headers)) ?? Data("{}".utf8), as: UTF8.self),
                    body: call.body, createdAt: now, attempts: 0, nextAttemptAt: now, state: .pending)
                do {
                    if try outbox.add(entry) { wake.yield() }
                } catch {
                    context.logger.error("gate \(call.gate) call for fix \(call.fixSeq ?? 0) not written to the outbox: \(error)")
                }
            }
        }
        return events
    }

    func run() async throws {
        // Calls left pending by a previous run are due now.
        wake.yield()
        var timer: Task<Void, Never>?
        try await withThrowingDiscardingTaskGroup { group in
            for await _ in wakeups.cancelOnGracefulShutdown() {
                let due = (try? await outbox.pending(dueBy: Date())) ?? []
                for entry in due where inFlight.withLock({ $0.insert(entry.key).inserted }) {
                    group.addTask { await self.attempt(entry) }
                }
                // Wake again when the next retry is due (a new call wakes us sooner).
                let next = (try? await outbox.nextAttempt()) ?? nil
                let wait = max(0.02, min(next.map { $0.timeIntervalSinceNow } ?? 1, 1))
                timer?.cancel()
                timer = Task { [wake] in
                    try? await Task.sleep(for: .milliseconds(Int(wait * 1000)))
                    if !Task.isCancelled { wake.yield() }
                }
            }
            timer?.cancel()
            // In-flight attempts are left to finish (each is bounded by its timeout): cancelling
            // one the gate already received would send it again at the next start.
        }
    }

    private func attempt(_ entry: OutboxEntry) async {
        defer { inFlight.withLock { _ = $0.remove(entry.key) } }
        guard let gate = gates[entry.gate] else {
            await finish(entry, state: .failed, status: nil, error: "gate \(entry.gate) is no longer configured")
            return
        }
        if delivered.withLock({ $0.contains(entry.key) }) {
            await finish(entry, state: .delivered, status: entry.lastStatus, error: nil)
            return
        }
        // A gate must not open long after the arrival that asked for it: retries and calls left
        // over from an earlier run expire with the fix's max_age_s.
        if Date().timeIntervalSince(entry.fixTime) > gate.maxAgeS {
            await finish(entry, state: .failed, status: entry.lastStatus, error: "expired: the fix is older than max_age_s (\(Int(gate.maxAgeS)) s)")
            return
        }
        var entry = entry
        entry.attempts += 1
        let result = await sender.attempt(entry, secret: gate.webhook.secret, timeout: gate.webhook.timeoutS)
        switch result {
        case .delivered(let status):
            delivered.withLock { _ = $0.insert(entry.key) }
            entry.lastStatus = status
            entry.latencyMs = (Date().timeIntervalSince(entry.createdAt) * 1000 * 10).rounded() / 10
            await finish(entry, state: .delivered, status: status, error: nil)
        case .rejected(let status):
            await finish(entry, state: .failed, status: status, error: "HTTP \(status), not retried")
        case .retry(let status, let error):
            // `retries` counts the attempts after the first.
            guard entry.attempts <= gate.webhook.retries else {
                await finish(entry, state: .failed, status: status, error: error)
                return
            }
            entry.lastStatus = status
            entry.lastError = error
            entry.nextAttemptAt = Date().addingTimeInterval(WebhookSender.backoff(afterAttempt: entry.attempts))
            do {
                try await outbox.update(entry)
            } catch {
                context.logger.error("outbox update failed for \(entry.gate): \(error)")
            }
            wake.yield()
        }
    }

    private func finish(_ entry: OutboxEntry, state: OutboxEntry.State, status: Int?, error: String?) async {
        var entry = entry
        entry.state = state
        entry.lastStatus = status
        entry.lastError = error
        entry.finishedAt = Date()
        do {
            // Recorded before anything else, so that a success is never sent again.
            try await outbox.update(entry)
        } catch {
            context.logger.error("outbox update failed for \(entry.gate): \(error)")
        }
        let seq = entry.fixSeq > 0 ? UInt64(entry.fixSeq) : nil
        do {
            if state == .delivered {
                let fired = GateFired(
                    gate: entry.gate, device: entry.device, zone: entry.zone, seq: seq, idempotencyKey: entry.key,
                    status: status ?? 0, latencyMs: entry.latencyMs ?? 0, attempts: entry.attempts, time: entry.finishedAt!)
                try await events.publish([DerivedEvent(type: "gate.fired", device: entry.device, id: "gate.fired:\(entry.key)", payload: fired)])
                context.logger.info("gate \(entry.gate) opened for \(entry.device)", metadata: ["status": "\(status ?? 0)", "attempts": "\(entry.attempts)"])
            } else {
                let failed = GateFailed(
                    gate: entry.gate, device: entry.device, zone: entry.zone, seq: seq, idempotencyKey: entry.key,
                    status: status, error: error ?? "failed", attempts: entry.attempts, time: entry.finishedAt!)
                try await events.publish([DerivedEvent(type: "gate.failed", device: entry.device, id: "gate.failed:\(entry.key)", payload: failed)])
                context.logger.warning("gate \(entry.gate) call for \(entry.device) failed after \(entry.attempts) attempts: \(error ?? "")")
            }
        } catch {
            context.logger.error("gate event not published: \(error)")
        }
    }

    /// The `outbox` RPC: every call with its state, for `drivebus status` and tests. No secrets
    /// and no headers are in it.
    static func outboxReply(_ outbox: Outbox) async -> [UInt8] {
        struct Row: Codable, Sendable {
            let key, gate, device, state: String
            let attempts: Int
            let lastStatus: Int?
            enum CodingKeys: String, CodingKey {
                case key, gate, device, state, attempts
                case lastStatus = "last_status"
            }
        }
        struct Reply: Codable, Sendable { let calls: [Row] }
        let rows = ((try? await outbox.all()) ?? []).map {
            Row(key: $0.key, gate: $0.gate, device: $0.device, state: $0.state.rawValue, attempts: $0.attempts, lastStatus: $0.lastStatus)
        }
        return (try? BusJSON.encode(RPCReply.success(Reply(calls: rows)))) ?? []
    }
}
