import DrivebusSchema
import Foundation
import Logging
import ServiceLifecycle
import Synchronization

/// Runs a pure core over the journal, exactly once per seq, across restarts:
/// - it follows the journal with a `StreamFollower` from the checkpoint's seq (catch-up, live,
///   gaps and lost tails filled by replay);
/// - what the core derives goes through the service's `EventLog`: journaled, then published;
/// - the state is checkpointed when a message was applied or a tick derived events since the
///   last save, right after a message that derived something, and at shutdown, but never while
///   derived events are not yet journaled: after a crash the journal replays the step, and the
///   events are derived again with the same ids (journaled once: `EventLog`). Saves are paced
///   (`CheckpointPacing`): at most one per `checkpointInterval`, and a large state (open trips)
///   less often. A tick that derived nothing is saved only every `idleCheckpointInterval`:
///   after a restart the next tick does the same again, and a system at rest does not rewrite
///   and sync four files every second.
/// `live` tells the core whether a message came straight off the bus or from a replay. (The
/// geofence does not use it to keep gates shut: it opens a gate for a recent fix from a phone,
/// live or replayed after a crash, and never for an old or imported one.)
public final class JournalConsumer<Core: Codable & Sendable>: Service, Sendable {
    /// What is checkpointed: the core's state and the last journal seq it has seen (including
    /// messages of types the core ignores).
    struct Checkpoint: Codable, Sendable {
        var lastSeq: UInt64
        var core: Core
    }

    /// Throwing means the step's effects could not be made durable (an outbox write failed):
    /// the consumer then stops without another checkpoint, and the service exits non-zero so that
    /// its supervisor restarts it and the journal replays the step.
    public typealias Apply = @Sendable (inout Core, JournalMessage, _ live: Bool) throws -> [DerivedEvent]
    public typealias Tick = @Sendable (inout Core, Date) throws -> [DerivedEvent]

    private let context: ServiceContext
    public let events: EventLog
    private let checkpoint: CheckpointFile
    private let state: Mutex<Checkpoint>
    private let apply: Apply
    private let tick: Tick
    private let tickInterval: Duration
    private let checkpointInterval: Duration
    private let seq = Atomic<UInt64>(0)
    private let replayed = Atomic<Int>(0)
    private let caughtUp = Atomic<Bool>(false)
    /// Above zero while a replay or a received group of messages is being applied. Ticks wait
    /// then: the wall clock must not decide between messages that belong together, such as the
    /// samples of one upload or a backlog being replayed, when the newest is not yet applied.
    private let holds = Atomic<Int>(0)
    /// A tick came while held; it runs as soon as the group or replay is done.
    private let tickOwed = Atomic<Bool>(false)
    /// Derived events computed but not yet journaled. Changed under the state lock, so that no
    /// checkpoint ever holds a state whose events could still be lost.
    private let unjournaled = Atomic<Int>(0)
    /// A step failed after changing the core: nothing is checkpointed from then on.
    private let poisoned = Atomic<Bool>(false)
    /// A save is queued and has not yet taken its snapshot: another request needs no save of
    /// its own, as that one will take the newer state.
    private let saveQueued = Atomic<Bool>(false)
    /// A prompt save was asked for: a waiting save it was folded into saves promptly too.
    private let promptQueued = Atomic<Bool>(false)
    /// Steps the checkpoint must keep: messages applied and ticks that derived events. Counted
    /// under the state lock, so a snapshot and its count go together.
    private let changes = Atomic<UInt64>(0)
    /// A tick ran since the last checkpoint (it may have changed the state without an event).
    private let ticked = Atomic<Bool>(false)
    /// What the last checkpoint held, when it was taken and its size (which sets the gap before
    /// the next). Written on the checkpoint queue; read there and by `apply`.
    private let lastSave: Mutex<(changes: UInt64, at: ContinuousClock.Instant, bytes: Int)>
    private let pacing: CheckpointPacing
    private let idleCheckpointInterval: Duration
    private let tickStateMatters: @Sendable (Core) -> Bool

    /// - Parameters:
    ///   - initial: the core for a first start, with no checkpoint.
    ///   - decodingUserInfo: what a checkpoint needs to decode: the configurations it leaves out
    ///     (`CheckpointConfiguration.userInfo`), so that today's config always wins.
    ///   - events: the service's event log, if other parts of it publish derived events too.
    ///   - checkpointInterval: the least time between two saves while messages arrive; a large
    ///     state is saved less often (`CheckpointPacing`).
    ///   - idleCheckpointInterval: how often what ticks alone changed is saved, as a safety net.
    ///   - tickStateMatters: whether the state after a tick holds something a restart cannot
    ///     observe again (a ride's silence, counted tick by tick), so that the tick is saved like a
    ///     message. By default a tick that derived no event is one the next tick after a restart
    ///     does again (a clock moving on, a trip closed by a timeout).
    public init(
        context: ServiceContext, initial: Core, events: EventLog? = nil,
        decodingUserInfo: [CodingUserInfoKey: any Sendable] = [:],
        tickInterval: Duration = .seconds(1), checkpointInterval: Duration = .seconds(1),
        idleCheckpointInterval: Duration = .seconds(300),
        tickStateMatters: @escaping @Sendable (Core) -> Bool = { _ in false },
        apply: @escaping Apply, tick: @escaping Tick = { _, _ in [] }
    ) throws {
        self.context = context
        self.events = try events ?? EventLog(context: context)
        checkpoint = CheckpointFile(layout: context.settings.layout, name: context.name.rawValue)
        let restored = try checkpoint.load(Checkpoint.self, userInfo: decodingUserInfo)
        state = Mutex(restored ?? Checkpoint(lastSeq: 0, core: initial))
        self.apply = apply
        self.tick = tick
        self.tickInterval = tickInterval
        self.checkpointInterval = checkpointInterval
        self.idleCheckpointInterval = idleCheckpointInterval
        pacing = CheckpointPacing(interval: checkpointInterval)
        lastSave = Mutex((changes: 0, at: .now, bytes: 0))
        self.tickStateMatters = tickStateMatters
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
        let follower = StreamFollower(source: .journal, bus: context.bus, logger: context.logger)
        try await withThrowingDiscardingTaskGroup { group in
            group.addTask { try await self.periodic(self.tickInterval) { try await self.tickUnlessHeld() } }
            group.addTask { try await self.periodic(self.checkpointInterval) { self.saveCheckpoint() } }
            group.addTask { for await _ in self.owedTicks { try await self.tickUnlessHeld() } }
            if let days = context.settings.derivedEventsDays {
                group.addTask {
                    await self.expireEvents(olderThanDays: days)
                    try await self.periodic(.seconds(86_400)) { await self.expireEvents(olderThanDays: days) }
                }
            }
            try await follower.run(
                from: lastSeq,
                hold: { [self] held in
                    if held {
                        holds.add(1, ordering: .relaxed)
                    } else if holds.subtract(1, ordering: .relaxed).newValue == 0, tickOwed.load(ordering: .relaxed) {
                        // Not run here, inside the follower's synchronous callback.
                        owedTickPending.yield()
                    }
                },
                cursor: { [self] cursor in caughtUp.store(cursor.isLive, ordering: .relaxed) }
            ) { messages, live in
                try await self.apply(messages, live: live)
                if !live { self.replayed.add(messages.count, ordering: .relaxed) }
            }
            group.cancelAll()
        }
        await flushCheckpoints()
    }

    /// `retention.derived_events_days`, at start and once a day: each run that finds something
    /// expired writes the whole event journal again (`trips.events` holds every trip's track), so
    /// a day's worth at a time, not an hour's. A failure is logged and tried again next time.
    private func expireEvents(olderThanDays days: Double) async {
        let cutoff = Date().addingTimeInterval(-days * 86_400)
        do {
            let removal = try await events.journal.expire(before: cutoff)
            if removal.events > 0 {
                context.logger.info("retention applied", metadata: ["events": "\(removal.events)", "before": "\(RFC3339.format(cutoff))"])
            }
        } catch {
            context.logger.warning("retention not applied to the event journal this time: \(error)")
        }
    }

    /// Wakes the owed-tick runner; a stream so that the follower's callback never waits.
    private let (owedTicks, owedTickPending) = AsyncStream.makeStream(of: Void.self, bufferingPolicy: .bufferingNewest(1))

    private func tickUnlessHeld() async throws {
        // Checked under the state lock: a group's hold is taken before its first message takes
        // the lock, so a tick either comes before the whole group or is owed until it is done.
        let events = try state.withLock { checkpoint throws -> [DerivedEvent] in
            guard holds.load(ordering: .relaxed) == 0, !poisoned.load(ordering: .relaxed) else {
                tickOwed.store(true, ordering: .relaxed)
                return []
            }
            tickOwed.store(false, ordering: .relaxed)
            let events = try poisonOnFailure { try tick(&checkpoint.core, Date()) }
            ticked.store(true, ordering: .relaxed)
            if events.isEmpty, tickStateMatters(checkpoint.core) { changes.add(1, ordering: .relaxed) }
            if !events.isEmpty {
                unjournaled.add(1, ordering: .relaxed)
                changes.add(1, ordering: .relaxed)
            }
            return events
        }
        try await journal(events)
    }

    /// Applies a group of messages in order, taking the state lock once for a run of them rather
    /// than once a message (a page of fixes is a hundred). A run ends at a message that derived
    /// events, which are journaled before the next is applied, or after `maxRun` messages, so
    /// that a tick or an RPC reading the state never waits long.
    private func apply(_ messages: [JournalMessage], live: Bool) async throws {
        var next = messages.startIndex
        while next < messages.endIndex {
            let events = try state.withLock { checkpoint throws -> [DerivedEvent] in
                let runEnd = min(messages.endIndex, next + Self.maxRun)
                // The core and seq are taken out of the checkpoint once for the run: reached through
                // the generic `Checkpoint` inside the loop, each message looked its type up again.
                return try applyRun(messages[next..<runEnd], to: &checkpoint.core, lastSeq: &checkpoint.lastSeq, live: live, next: &next)
            }
            try await journal(events)
            // Checkpoint right after journaling what a message produced, so that a restart has less
            // to redo (a gate's cooldown, recorded with its firing, is not lost to a crash). A large
            // state waits for its gap: under a flood every few messages derive a score, and each save
            // encodes the whole state (open trips, the scorer's history), which kept a core busy.
            if !events.isEmpty, lastSave.withLock({ $0.bytes <= CheckpointPacing.promptBytes || $0.at.duration(to: .now) >= pacing.gap(afterSaving: $0.bytes) }) {
                saveCheckpoint(prompt: true)
            }
        }
    }

    /// Applies `messages` in order until one derives events, which it returns; `next` moves past
    /// each message taken. Runs under the state lock.
    private func applyRun(
        _ messages: ArraySlice<JournalMessage>, to core: inout Core, lastSeq: inout UInt64, live: Bool, next: inout Int
    ) throws -> [DerivedEvent] {
        for message in messages {
            next += 1
            // Strictly in order: a message after a gap is never applied before the gap is filled.
            guard message.seq == lastSeq + 1, !poisoned.load(ordering: .relaxed) else { continue }
            let events = try poisonOnFailure { try apply(&core, message, live) }
            lastSeq = message.seq
            seq.store(message.seq, ordering: .relaxed)
            changes.add(1, ordering: .relaxed)
            if !events.isEmpty {
                unjournaled.add(1, ordering: .relaxed)
                return events
            }
        }
        return []
    }

    /// The most messages applied under one taking of the state lock.
    private static var maxRun: Int { 256 }

    /// Runs a step under the state lock; if it throws, the core may be half changed, so nothing
    /// is checkpointed from then on.
    private func poisonOnFailure<T>(_ step: () throws -> T) throws -> T {
        do {
            return try step()
        } catch {
            poisoned.store(true, ordering: .relaxed)
            context.logger.critical("a step failed, stopping so that the journal replays it: \(error)")
            throw error
        }
    }

    /// Journals and publishes events computed under the lock (which counted them as unjournaled).
    /// If that fails the service must stop without checkpointing past them: the supervisor
    /// restarts it, and the journal replays the step.
    private func journal(_ events: [DerivedEvent]) async throws {
        guard !events.isEmpty else { return }
        do {
            try await self.events.publish(events)
        } catch {
            context.logger.critical("derived events not journaled, stopping so that the step is redone: \(error)")
            throw error
        }
        unjournaled.subtract(1, ordering: .relaxed)
    }

    /// Saves the newest state that has all its events journaled. Saves are serialised on one
    /// queue of their own: two at once would interleave their writes, and file I/O does not
    /// belong on the cooperative pool.
    /// Under a flood, a message that derives something comes many times a second; each save
    /// encodes the whole state, so requests made while one waits are folded into it.
    /// `prompt` saves a change without waiting for the gap (a small state, after events);
    /// `force` saves what ticks changed too, whenever they ran (at shutdown).
    private func saveCheckpoint(prompt: Bool = false, force: Bool = false) {
        if prompt { promptQueued.store(true, ordering: .releasing) }
        guard !saveQueued.exchange(true, ordering: .acquiringAndReleasing) || force else { return }
        Self.checkpointQueue.async { [self] in
            saveQueued.store(false, ordering: .releasing)
            let prompt = promptQueued.exchange(false, ordering: .acquiringAndReleasing)
            let last = lastSave.withLock { $0 }
            let started = ContinuousClock.now
            // The periodic round that comes a whole gap later is on time, give or take its jitter
            // (so two saves may be 0.9 intervals apart).
            let since = last.at.duration(to: started) + checkpointInterval / 10
            guard let (snapshot, count) = state.withLock({ checkpoint -> (Checkpoint, UInt64)? in
                guard unjournaled.load(ordering: .relaxed) == 0, !poisoned.load(ordering: .relaxed) else { return nil }
                let count = changes.load(ordering: .relaxed)
                let tickedSince = ticked.load(ordering: .relaxed)
                let due = (count != last.changes && (force || prompt || pacing.isDue(since: since, afterSaving: last.bytes, messages: count - last.changes)))
                    || (tickedSince && (force || since >= idleCheckpointInterval))
                guard due else { return nil }
                ticked.store(false, ordering: .relaxed)
                return (checkpoint, count)
            }) else { return }
            do {
                let bytes = try checkpoint.save(snapshot)
                lastSave.withLock { $0 = (count, started, bytes) }
            } catch {
                ticked.store(true, ordering: .relaxed)  // what the ticks changed is still unsaved
                context.logger.error("checkpoint not saved: \(error)")
            }
        }
    }

    private static var checkpointQueue: DispatchQueue { DispatchQueue.checkpoints }

    /// Waits for the saves already queued; used once, at shutdown.
    private func flushCheckpoints() async {
        saveCheckpoint(force: true)
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            Self.checkpointQueue.async { continuation.resume() }
        }
    }

    /// Runs `body` every `interval` until cancelled.
    private func periodic(_ interval: Duration, _ body: @Sendable () async throws -> Void) async throws {
        while (try? await Task.sleep(for: interval)) != nil {
            try await body()
        }
    }
}

extension DispatchQueue {
    /// One serial queue for every checkpoint write in the process.
    static let checkpoints = DispatchQueue(label: "drivebus.checkpoints")
}

/// One page of ingest's `replay`.
public struct ReplayPage: Sendable {
    public let lastSeq: UInt64
    public let messages: [JournalMessage]

    public static func fetch(from: UInt64, limit: Int, bus: BusClient) async throws -> ReplayPage {
        let request = try BusJSON.encode(IngestRPCMessages.Replay(fromSeq: from, limit: limit))
        let reply = try await bus.loop.request(ZMQEndpoint(bus.settings.layout.rpcEndpoint(.ingest)), body: request, timeout: .seconds(10))
        return try ReplayPage(reply: reply)
    }

    /// Reads ingest's reply as it streams: a page holds up to thousands of payloads, each passed
    /// on as the bytes the journal holds rather than parsed into a tree and written again.
    public init(reply: [UInt8]) throws(RPCErrorBody) {
        var messages: [JournalMessage] = []
        lastSeq = try PageReply.read(reply, name: "replay", items: "messages") { (reader: inout JSONReader) throws(JSONReader.Failure) in
            if let message = try JournalPage.readElement(&reader) { messages.append(message) }
        }
        self.messages = messages
    }
}

/// A page of a replaying RPC (ingest's `replay`, a service's `events`):
/// `{"ok":true,"last_seq":N,"<items>":[…]}`, read as it streams.
enum PageReply {
    /// Calls `item` with the reader at each element of `items`; returns `last_seq`. Errors name
    /// the RPC: `<name>.failed` for a refusal, `rpc.bad_request` for a reply that is not a page.
    static func read(
        _ reply: [UInt8], name: String, items: StaticString, item: (inout JSONReader) throws(JSONReader.Failure) -> Void
    ) throws(RPCErrorBody) -> UInt64 {
        var ok = false
        var last: UInt64?
        do throws(JSONReader.Failure) {
            var reader = JSONReader(reply)
            try reader.readObject { (reader: inout JSONReader, key: JSONKey) throws(JSONReader.Failure) in
                switch key {
                case "ok": ok = try reader.readBool()
                case "last_seq": last = try reader.readUInt64()
                case _ where items ~= key: try reader.readArray(item)
                default: try reader.skipValue()
                }
            }
            try reader.finish()
        } catch {
            throw RPCErrorBody.badRequest("\(name) reply: \(error)")
        }
        guard ok else { throw RPCErrorBody(code: "\(name).failed", message: String(decoding: reply.prefix(300), as: UTF8.self)) }
        guard let last else { throw RPCErrorBody.badRequest("\(name) reply lacks last_seq") }
        return last
    }
}
