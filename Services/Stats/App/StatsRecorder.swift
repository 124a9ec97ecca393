import DrivebusConfiguration
import DrivebusKit
import ScorerCore
import TripsCore
import Foundation
import Logging
import ServiceLifecycle
import StatsCore
import StatsStore
import Synchronization

/// Stats derives trips and scores itself from the journal (`DriveDerivations`), so the database
/// holds every trip and score even if stats was down when they were published. Same inputs, same
/// ids: the copies that arrive over the bus are deduplicated away.
typealias StatsDerivations = DriveDerivations

/// Stores everything on the bus. Journal messages are stored exactly once and in order,
/// recovered by replay like every other consumer; the database is its own checkpoint (the last
/// journal seq and the derivations are written in the same transaction as the data).
final class StatsRecorder: Service, Sendable {
    private let context: ServiceContext
    private let store: StatsStore
    private let metrics: StatsMetrics
    private let seq = Atomic<UInt64>(0)
    private let live = Atomic<Bool>(false)
    private let derivations: Mutex<StatsDerivations>
    private nonisolated(unsafe) var lastStateSave = ContinuousClock.now  // only touched by run()

    private let tripsConfiguration: TripsConfiguration
    private let scorerConfiguration: ScorerConfiguration

    init(context: ServiceContext, config: DrivebusConfig, store: StatsStore, metrics: StatsMetrics) {
        self.context = context
        tripsConfiguration = config.trips
        scorerConfiguration = config.scorer
        self.store = store
        self.metrics = metrics
        derivations = Mutex(DriveDerivations(trips: config.trips, scorer: config.scorer))
    }

    var lastSeq: UInt64 { seq.load(ordering: .relaxed) }
    var isLive: Bool { live.load(ordering: .relaxed) }

    func run() async throws {
        let cursor = try await store.journalCursor()
        seq.store(cursor.seq, ordering: .relaxed)
        if let state = cursor.state, let restored = try? JSONDecoder().decode(StatsDerivations.self, from: state) {
            derivations.withLock {
                $0 = restored
                $0.scorer.configuration = scorerConfiguration
                $0.segmenter.configuration = tripsConfiguration
            }
        }
        let batches = try await context.bus.loop.subscribe(context.bus.endpoints.out, prefixes: [""])
        try await catchUp(to: nil)
        var claimed: UInt64 = 0
        for await frames in batches.cancelOnGracefulShutdown() {
            var pending: [StoredEvent] = []
            for message in frames.compactMap({ try? BusMessage(frames: $0) }) {
                if message.topic.hasPrefix("svc.heartbeat.") {
                    guard let beat = try? message.decode(Heartbeat.self) else { continue }
                    metrics.record(beat)
                    if beat.service == "ingest", let journal = beat.lastSeq["journal"] {
                        if claimed > lastSeq {
                            try await flush(&pending)
                            try await catchUp(to: claimed)
                        }
                        claimed = journal
                        if !isLive {
                            try await flush(&pending)
                            try await catchUp(to: journal)
                            live.store(true, ordering: .relaxed)
                        }
                    }
                    continue
                }
                if JournalTopics.types.contains(message.header.type) {
                    // Only ingest writes the journal.
                    // A fix is decoded here once, for its seq, the derivations and its row.
                    let fix = message.header.type == "fix" ? try? message.decode(Fix.self) : nil
                    guard message.header.source == "ingest", let journalSeq = fix?.seq ?? JournalConsumer<StatsDerivations>.journalSeq(message),
                          journalSeq > lastSeq else { continue }
                    if journalSeq > lastSeq + 1 {
                        try await flush(&pending)
                        try await catchUp(to: journalSeq - 1)
                        // An unfinished replay leaves the gap open: never store past it.
                        guard lastSeq == journalSeq - 1 else { continue }
                    }
                    pending += record(JournalMessage(seq: journalSeq, topic: message.topic, payload: message.payload), fix: fix, time: message.header.time)
                } else {
                    // Derived events from the other services; ids deduplicate them.
                    pending.append(StoredEvent(
                        id: message.header.id, type: message.header.type, device: message.device, source: message.header.source,
                        time: message.header.time, payload: message.payload))
                }
            }
            try await flush(&pending)
        }
    }

    /// The stored form of a journal message, plus what stats derives from it. Advances `seq`.
    private func record(_ message: JournalMessage, fix: Fix?, time: Date) -> [StoredEvent] {
        let derived = derivations.withLock { derivations in
            let (trips, scores) = derivations.handle(message, fix: fix, arrivedAt: Date())
            return trips + scores
        }
        seq.store(message.seq, ordering: .relaxed)
        return [StoredEvent(id: "journal:\(message.seq)", type: message.type, device: message.device, source: "ingest", time: time, payload: message.payload, fix: fix)]
            + derived.map { StoredEvent(id: $0.id, type: $0.type, device: $0.device, source: "stats", time: time, payload: $0.payload) }
    }

    private func flush(_ pending: inout [StoredEvent]) async throws {
        guard !pending.isEmpty else { return }
        // The derivations hold whole open trips: encoding them with every batch would make
        // storing quadratic in a trip's length, so they are saved at most once a second.
        var state: (seq: UInt64, data: Data)?
        if lastStateSave.duration(to: .now) >= .seconds(1) {
            state = derivations.withLock { derivations in (try? JSONEncoder().encode(derivations)).map { (lastSeq, $0) } }
            lastStateSave = .now
        }
        let started = ContinuousClock.now
        let summary = try await store.store(pending, journalSeq: lastSeq, state: state)
        metrics.stored(pending, summary: summary, took: started.duration(to: .now))
        pending.removeAll(keepingCapacity: true)
    }

    private func catchUp(to target: UInt64?) async throws {
        var attempt = 0
        while !Task.isShuttingDownGracefully {
            if let target, lastSeq >= target { return }
            let page: ReplayPage
            do {
                page = try await ReplayPage.fetch(from: lastSeq + 1, limit: 5000, bus: context.bus)
                attempt = 0
            } catch {
                attempt += 1
                if attempt == 1 || attempt % 30 == 0 { context.logger.warning("replay from ingest failed, retrying: \(error)") }
                let pause = Duration.milliseconds(min(200 * attempt, 2000))
                try? await cancelWhenGracefulShutdown { try await Task.sleep(for: pause) }
                continue
            }
            var pending: [StoredEvent] = []
            for message in page.messages where message.seq == lastSeq + 1 {
                let fix = message.type == "fix" ? try? BusJSON.decode(Fix.self, from: message.payload) : nil
                pending += record(message, fix: fix, time: Date())
            }
            try await flush(&pending)
            if page.messages.isEmpty || lastSeq >= page.lastSeq { return }
        }
    }
}
