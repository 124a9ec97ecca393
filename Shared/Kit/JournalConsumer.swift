import DrivebusSchema
import Foundation
import Logging
import ServiceLifecycle
import Synchronization

/// Runs a pure core over the journal, exactly once per seq, across restarts:
/// - on start it loads the checkpoint (the core's state, which includes its last seq), subscribes,
///   and replays from ingest everything after the checkpoint;
/// - live messages are applied in order; a seq gap (PUB/SUB dropped something) is filled by replay;
/// - the state is checkpointed every `checkpointInterval` and at shutdown.
/// `live` tells the core whether a message came straight off the bus or from a replay, which is
/// what keeps a replayed fix from opening a gate.
public final class JournalConsumer<Core: Codable & Sendable>: Service, Sendable {
    /// What is checkpointed: the core's state and the last journal seq it has seen (including
    /// messages of types the core ignores).
    struct Checkpoint: Codable, Sendable {
        var lastSeq: UInt64
        var core: Core
    }

    public typealias Apply = @Sendable (inout Core, JournalMessage, _ live: Bool) -> [DerivedEvent]
    public typealias Tick = @Sendable (inout Core, Date) -> [DerivedEvent]

    private let context: ServiceContext
    private let checkpoint: CheckpointFile
    private let state: Mutex<Checkpoint>
    private let apply: Apply
    private let tick: Tick
    private let tickInterval: Duration
    private let checkpointInterval: Duration
    private let seq = Atomic<UInt64>(0)
    private let replayed = Atomic<Int>(0)
    private let caughtUp = Atomic<Bool>(false)
    /// Set while a replay or a received group of messages is being applied. Ticks wait then: the
    /// wall clock must not decide between messages that belong together, such as the samples of
    /// one upload or a backlog being replayed, when the newest of them is not yet applied.
    private let replaying = Atomic<Bool>(false)
    private let applyingGroup = Atomic<Bool>(false)
    /// A tick came while held; it runs as soon as the group or replay is done.
    private let tickOwed = Atomic<Bool>(false)

    /// - Parameters:
    ///   - initial: the core for a first start, with no checkpoint.
    ///   - configure: applied to a core restored from a checkpoint, so that today's config wins.
    public init(
        context: ServiceContext, initial: Core, configure: (inout Core) -> Void = { _ in },
        decodingUserInfo: [CodingUserInfoKey: any Sendable] = [:],
        tickInterval: Duration = .seconds(1), checkpointInterval: Duration = .seconds(1),
        apply: @escaping Apply, tick: @escaping Tick = { _, _ in [] }
    ) throws {
        self.context = context
        checkpoint = CheckpointFile(layout: context.settings.layout, name: context.name.rawValue)
        var restored = try checkpoint.load(Checkpoint.self, userInfo: decodingUserInfo)
        if restored != nil { configure(&restored!.core) }
        state = Mutex(restored ?? Checkpoint(lastSeq: 0, core: initial))
        self.apply = apply
        self.tick = tick
        self.tickInterval = tickInterval
        self.checkpointInterval = checkpointInterval
        seq.store(restored?.lastSeq ?? 0, ordering: .relaxed)
        if let restored { context.logger.info("checkpoint restored", metadata: ["last_seq": "\(restored.lastSeq)"]) }
    }

    /// The last journal seq processed, for heartbeats and `health`.
    public var lastSeq: UInt64 { seq.load(ordering: .relaxed) }

    /// Whether the start-up replay is done and the subscription is known to reach ingest: from
    /// then on, new messages are applied live.
    public var isLive: Bool { caughtUp.load(ordering: .relaxed) }

    /// Journal messages applied from replays rather than live (a metric of lost or late messages).
    public var replayedCount: Int { replayed.load(ordering: .relaxed) }

    /// Runs `body` on the core's state, for RPC handlers that read it.
    public func withState<T>(_ body: (inout Core) -> T) -> T { state.withLock { body(&$0.core) } }

    public func run() async throws {
        // Subscribe first, so that nothing published during the catch-up is missed. Ingest's
        // heartbeat comes along: it proves the subscription reaches ingest, and it carries the
        // journal's last seq, which reveals a message lost at the tail of the stream.
        var groups = try await context.bus.subscribe(JournalTopics.prefixes + ["svc.heartbeat.ingest"])
            .groups.cancelOnGracefulShutdown().makeAsyncIterator()
        try await catchUp(to: nil)
        var claimed: UInt64 = 0
        try await withThrowingDiscardingTaskGroup { group in
            group.addTask { await self.periodic(self.tickInterval) { self.tickUnlessHeld() } }
            group.addTask { await self.periodic(self.checkpointInterval) { self.saveCheckpoint() } }
            while let messages = try await groups.next() {
                applyingGroup.store(true, ordering: .relaxed)
                defer {
                    applyingGroup.store(false, ordering: .relaxed)
                    runOwedTick()
                }
                for message in messages {
                    if message.topic == "svc.heartbeat.ingest" {
                        guard let journal = (try? message.decode(Heartbeat.self))?.lastSeq["journal"] else { continue }
                        // A seq an earlier heartbeat claimed and that has still not arrived was lost:
                        // everything before this heartbeat has passed through the same queue.
                        if claimed > lastSeq {
                            context.logger.notice("journal messages lost at the tail: replaying", metadata: ["from": "\(lastSeq + 1)", "to": "\(claimed)"])
                            try await catchUp(to: claimed)
                        }
                        claimed = journal
                        if !isLive {
                            try await catchUp(to: journal)
                            caughtUp.store(true, ordering: .relaxed)
                        }
                        continue
                    }
                    // Only ingest writes the journal; anything else on these topics is not journal data.
                    guard message.header.source == "ingest", let seq = Self.journalSeq(message) else { continue }
                    let last = lastSeq
                    if seq <= last { continue }
                    if seq > last + 1 {
                        context.logger.notice("journal gap: replaying", metadata: ["from": "\(last + 1)", "to": "\(seq - 1)"])
                        try await catchUp(to: seq - 1)
                        // An unfinished replay (shutdown, ingest away) leaves the gap open: the message
                        // must wait, or the seqs before it would be skipped for good.
                        guard lastSeq == seq - 1 else { continue }
                    }
                    apply(JournalMessage(seq: seq, topic: message.topic, payload: message.payload), live: true)
                }
            }
            group.cancelAll()
        }
        await flushCheckpoints()
    }

    private func tickUnlessHeld() {
        // Checked under the state lock: a group's flag is set before its first message takes the
        // lock, so a tick either comes before the whole group or is owed until it is done.
        process(state.withLock { checkpoint in
            guard !replaying.load(ordering: .relaxed), !applyingGroup.load(ordering: .relaxed) else {
                tickOwed.store(true, ordering: .relaxed)
                return []
            }
            return tick(&checkpoint.core, Date())
        })
    }

    /// Runs a tick that was held, now that the group or replay that held it is done.
    private func runOwedTick() {
        if tickOwed.exchange(false, ordering: .relaxed) { tickUnlessHeld() }
    }

    private func apply(_ message: JournalMessage, live: Bool) {
        // Replays and live messages can race for the same seq only before the catch-up ends.
        let events = state.withLock { checkpoint -> [DerivedEvent] in
            // Strictly in order: a message after a gap is never applied before the gap is filled.
            guard message.seq == checkpoint.lastSeq + 1 else { return [] }
            let events = apply(&checkpoint.core, message, live)
            checkpoint.lastSeq = message.seq
            seq.store(message.seq, ordering: .relaxed)
            return events
        }
        process(events)
        // Checkpoint right after publishing what a message produced: a crash can then re-publish
        // an event (same id, which stores deduplicate) but never lose one.
        if !events.isEmpty { saveCheckpoint() }
    }

    private func process(_ events: [DerivedEvent]) {
        for event in events {
            do {
                try context.publisher.publish(event.type, device: event.device, payloadJSON: event.payload, id: event.id)
            } catch {
                context.logger.error("event \(event.id) not published: \(error)")
            }
        }
    }

    /// Replays from ingest until `target` (or the journal's end) has been applied.
    private func catchUp(to target: UInt64?) async throws {
        replaying.store(true, ordering: .relaxed)
        defer {
            replaying.store(false, ordering: .relaxed)
            runOwedTick()
        }
        var attempt = 0
        while !Task.isShuttingDownGracefully {
            let from = lastSeq + 1
            if let target, from > target { return }
            let page: ReplayPage
            do {
                page = try await ReplayPage.fetch(from: from, limit: 2000, bus: context.bus)
                attempt = 0
            } catch {
                // Ingest may be starting too: wait for it rather than give up.
                attempt += 1
                if attempt == 1 || attempt % 30 == 0 { context.logger.warning("replay from ingest failed, retrying: \(error)") }
                let pause = Duration.milliseconds(min(200 * attempt, 2000))
                // While ingest cannot be reached the clock goes on deciding, as it would with no
                // replay under way.
                replaying.store(false, ordering: .relaxed)
                runOwedTick()
                try? await cancelWhenGracefulShutdown { try await Task.sleep(for: pause) }
                replaying.store(true, ordering: .relaxed)
                continue
            }
            for message in page.messages {
                apply(message, live: false)
                replayed.add(1, ordering: .relaxed)
            }
            if page.messages.isEmpty || lastSeq >= page.lastSeq { return }
        }
    }

    /// Saves the newest state. Saves are serialised on one queue of their own: two at once
    /// would interleave their writes, and file I/O does not belong on the cooperative pool.
    private func saveCheckpoint() {
        Self.checkpointQueue.async { [self] in
            let snapshot = state.withLock { $0 }
            do {
                try checkpoint.save(snapshot)
            } catch {
                context.logger.error("checkpoint not saved: \(error)")
            }
        }
    }

    private static var checkpointQueue: DispatchQueue { DispatchQueue.checkpoints }

    /// Waits for the saves already queued; used once, at shutdown.
    private func flushCheckpoints() async {
        saveCheckpoint()
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            Self.checkpointQueue.async { continuation.resume() }
        }
    }

    /// Runs `body` every `interval` until the task is cancelled, which is how it ends.
    private func periodic(_ interval: Duration, _ body: @Sendable () -> Void) async {
        while (try? await Task.sleep(for: interval)) != nil {
            body()
        }
    }

    /// The journal seq in a journaled payload.
    public static func journalSeq(_ message: BusMessage) -> UInt64? {
        if message.topic.hasPrefix("fix.") { return (try? message.decode(Fix.self))?.seq }
        return (try? message.decode(SeqOnly.self))?.seq
    }
}

extension DispatchQueue {
    /// One serial queue for every checkpoint write in the process.
    static let checkpoints = DispatchQueue(label: "drivebus.checkpoints")
}

/// Every journaled payload carries its journal seq.
private struct SeqOnly: Decodable { let seq: UInt64? }

/// One page of ingest's `replay`.
public struct ReplayPage: Sendable {
    public let lastSeq: UInt64
    public let messages: [JournalMessage]

    public static func fetch(from: UInt64, limit: Int, bus: BusClient) async throws -> ReplayPage {
        let request = Array(#"{"op":"replay","from_seq":\#(from),"limit":\#(limit)}"#.utf8)
        let reply = try await bus.loop.request(ZMQEndpoint(bus.settings.layout.rpcEndpoint(.ingest)), body: request, timeout: .seconds(10))
        guard case .object(let root) = try JSONValue.parse(reply) else { throw RPCErrorBody.badRequest("replay reply is not an object") }
        guard case .bool(true)? = root["ok"] else {
            throw RPCErrorBody(code: "replay.failed", message: String(decoding: reply.prefix(300), as: UTF8.self))
        }
        guard case .number(let last)? = root["last_seq"], case .array(let items)? = root["messages"] else {
            throw RPCErrorBody.badRequest("replay reply lacks last_seq or messages")
        }
        let messages = items.compactMap { item -> JournalMessage? in
            guard case .object(let entry) = item, case .number(let seq)? = entry["seq"], case .string(let topic)? = entry["topic"],
                  let payload = entry["payload"] else { return nil }
            return JournalMessage(seq: UInt64(seq), topic: topic, payload: payload.encoded)
        }
        return ReplayPage(lastSeq: UInt64(last), messages: messages)
    }
}
