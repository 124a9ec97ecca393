import DrivebusKit
import Foundation
import GeofenceCore
import Logging
import ServiceLifecycle
import Synchronization

/// Delivers gate calls from the outbox: every due call is attempted, retried with a short backoff
/// on network errors, timeouts, 5xx and 429 until it is delivered, refused (another 4xx) or too old
/// to be worth anything (`max_age_s`: dead-lettered as expired), and never sent again once it
/// succeeded.
final class GateDelivery: Service, Sendable {
    private let context: ServiceContext
    private let outbox: Outbox
    private let events: EventLog
    private let gates: [String: Gate]
    private let sender: WebhookSender
    private let (wakeups, wake) = AsyncStream.makeStream(of: Void.self, bufferingPolicy: .bufferingNewest(1))
    /// The calls being attempted, and how many attempts have ended. A list of due calls read
    /// before an attempt ended is stale: that call may have been delivered, refused or put off
    /// since, and must not be started again from the old row.
    private let attempts = Mutex<(inFlight: Set<String>, ended: Int)>(([], 0))
    /// Calls known to be delivered, even if recording that in the outbox failed.
    private let delivered = Mutex<Set<String>>([])

    init(context: ServiceContext, outbox: Outbox, events: EventLog, gates: [Gate], sender: WebhookSender) {
        self.context = context
        self.outbox = outbox
        self.events = events
        self.gates = Dictionary(gates.map { ($0.id, $0) }, uniquingKeysWith: { first, _ in first })
        self.sender = sender
    }

    /// An outbox write that failed even when retried: the step that asked for the call must not
    /// count as done.
    struct OutboxUnavailable: Error, CustomStringConvertible {
        let call: String
        let underlying: any Error
        var description: String { "gate call \(call) could not be written to the outbox: \(underlying)" }
    }

    /// Turns the engine's outputs into bus events, and writes gate calls to the outbox before
    /// anything is sent. Runs under the consumer's lock, in journal order. A write that fails
    /// three times over half a second throws: the consumer then stops without checkpointing, the
    /// supervisor restarts the service, and the journal replays the step, which asks again.
    func route(_ outputs: [GeofenceOutput]) throws -> [DerivedEvent] {
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
                    fixTime: call.time, values: String(decoding: (try? JSONEncoder().encode(call.values)) ?? Data("{}".utf8), as: UTF8.self),
                    body: call.body, createdAt: now, attempts: 0, nextAttemptAt: now, state: .pending)
                var failure: (any Error)?
                for pause in [0, 100_000, 400_000] as [useconds_t] {
                    if pause > 0 { usleep(pause) }  // only on the failure path
                    do {
                        if try outbox.add(entry) { wake.yield() }
                        failure = nil
                        break
                    } catch {
                        failure = error
                        context.logger.warning("outbox write failed for gate \(call.gate), retrying: \(error)")
                    }
                }
                if let failure { throw OutboxUnavailable(call: call.idempotencyKey, underlying: failure) }
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
                let endedBefore = attempts.withLock { $0.ended }
                let due = (try? await outbox.pending(dueBy: Date())) ?? []
                for entry in due {
                    let start = attempts.withLock { attempts -> Bool? in
                        guard attempts.ended == endedBefore else { return nil }
                        return attempts.inFlight.insert(entry.key).inserted
                    }
                    guard let start else {
                        wake.yield()  // an attempt ended since the list was read: read it again
                        break
                    }
                    // An attempt is not cancelled with the service (a sibling that failed cancels
                    // the group): one the gate already answered, cut short before its outcome is
                    // recorded, would be sent again at the next start.
                    if start { group.addTask { await Task { await self.attempt(entry) }.value } }
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
        try await sender.shutdown()
    }

    private func attempt(_ entry: OutboxEntry) async {
        defer {
            attempts.withLock { attempts in
                attempts.inFlight.remove(entry.key)
                attempts.ended += 1
            }
        }
        guard let gate = gates[entry.gate] else {
            await finish(entry, state: .failed, status: nil, error: "gate \(entry.gate) is no longer configured")
            return
        }
        if delivered.withLock({ $0.contains(entry.key) }) {
            await finish(entry, state: .delivered, status: entry.lastStatus, error: nil)
            return
        }
        // A gate must not open long after the arrival that asked for it: a call older than
        // max_age_s is not sent but dead-lettered.
        if Date().timeIntervalSince(entry.fixTime) > gate.maxAgeS {
            await finish(entry, state: .expired, status: entry.lastStatus, error: "expired: the fix is older than max_age_s (\(Int(gate.maxAgeS)) s)")
            return
        }
        var entry = entry
        entry.attempts += 1
        let result = await sender.attempt(entry, webhook: gate.webhook)
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
            switch state {
            case .delivered:
                let fired = GateFired(
                    gate: entry.gate, device: entry.device, zone: entry.zone, seq: seq, idempotencyKey: entry.key,
                    status: status ?? 0, latencyMs: entry.latencyMs ?? 0, attempts: entry.attempts, time: entry.finishedAt!)
                try await events.publish([DerivedEvent(type: "gate.fired", device: entry.device, id: "gate.fired:\(entry.key)", payload: fired)])
                context.logger.info("gate \(entry.gate) opened for \(entry.device)", metadata: ["status": "\(status ?? 0)", "attempts": "\(entry.attempts)"])
            case .failed, .expired:
                let type = state == .expired ? "gate.expired" : "gate.failed"
                let failed = GateFailed(
                    gate: entry.gate, device: entry.device, zone: entry.zone, seq: seq, idempotencyKey: entry.key,
                    status: status, error: error ?? "failed", attempts: entry.attempts, time: entry.finishedAt!)
                try await events.publish([DerivedEvent(type: type, device: entry.device, id: "\(type):\(entry.key)", payload: failed)])
                context.logger.warning("gate \(entry.gate) call for \(entry.device) dead-lettered after \(entry.attempts) attempts: \(error ?? "")")
            case .pending:
                break
            }
        } catch {
            context.logger.error("gate event not published: \(error)")
        }
    }

    /// The `outbox` RPC: every call with its state, for `drivebus status` and tests. No secrets
    /// and no headers are in it.
    static func outboxReply(_ outbox: Outbox) async -> [UInt8] {
        let rows = ((try? await outbox.all()) ?? []).map(OutboxCall.init)
        return (try? BusJSON.encode(RPCReply.success(OutboxCall.Reply(calls: rows)))) ?? []
    }

    /// The `dead_letters` RPC: the calls given up on, for `drivebus status`.
    static func deadLettersReply(_ outbox: Outbox) async -> [UInt8] {
        let rows = ((try? await outbox.deadLetters()) ?? []).map(OutboxCall.init)
        return (try? BusJSON.encode(RPCReply.success(OutboxCall.Reply(calls: rows)))) ?? []
    }
}

/// A call as the `outbox` and `dead_letters` RPCs show it. No secrets and no headers are in it.
struct OutboxCall: Codable, Sendable {
    let key, gate, device, state: String
    let attempts: Int
    let lastStatus: Int?
    let lastError: String?
    let finishedAt: Date?

    enum CodingKeys: String, CodingKey {
        case key, gate, device, state, attempts
        case lastStatus = "last_status"
        case lastError = "last_error"
        case finishedAt = "finished_at"
    }

    init(_ entry: OutboxEntry) {
        key = entry.key
        gate = entry.gate
        device = entry.device
        state = entry.state.rawValue
        attempts = entry.attempts
        lastStatus = entry.lastStatus
        lastError = entry.lastError
        finishedAt = entry.finishedAt
    }

    struct Reply: Codable, Sendable { let calls: [OutboxCall] }
}
