import DrivebusConfiguration
import DrivebusKit
import DrivebusRoadLimits
import Foundation
import Logging
import ScorerCore
import ServiceLifecycle
import StatsCore
import StatsStore
import Synchronization
import TripsCore

/// Stats derives trips and scores itself from the journal as well (`DriveDerivations`): same
/// inputs, same ids, so the copies from the trips and scorer services deduplicate away, and a
/// trip is in the database as soon as its last fix is.
typealias StatsDerivations = DriveDerivations

/// Stores everything that happens, exactly once, whenever stats runs: it follows the ingest
/// journal and every service's event journal with a `StreamFollower` each. The database is its
/// own checkpoint: each stream's last stored seq (and the derivations) are written in the same
/// transaction as the data, so stats killed at any moment resumes where its data ends.
final class StatsRecorder: Service, Sendable {
    /// Every service that derives events stats keeps, and the types it publishes.
    static let eventSources: [StreamSource<LoggedEvent>] = [
        .events(of: .trips, types: ["trip"]),
        .events(of: .scorer, types: ["drive"]),
        .events(of: .geofence, types: ["geofence", "gate"]),
        .events(of: .checkout, types: ["taxi.checkout"]),
    ]

    private let context: ServiceContext
    private let store: StatsStore
    private let metrics: StatsMetrics
    private let seq = Atomic<UInt64>(0)
    private let journalLive = Atomic<Bool>(false)
    /// The journal cursor stats started with: a replay up to it stores no records.
    private let journalStoredThrough = Atomic<UInt64>(0)
    private let derivations: Mutex<StatsDerivations>
    /// When the derivations were last saved, the bytes that save wrote (which set the gap before
    /// the next), and the journal messages derived since.
    private let lastStateSave = Mutex((at: ContinuousClock.now, bytes: 0, messages: UInt64(0)))
    private let statePacing = CheckpointPacing()
    private let tripsConfiguration: TripsConfiguration
    private let scorerConfiguration: ScorerConfiguration
    private let retention: DrivebusConfig.Retention
    /// The scores stats derives use the same road limits as the scorer's.
    private let roadLimits: RoadLimitsWatcher
    /// Journal rows not stored yet, and a wake-up for the one task that stores them
    /// (`writeJournalRows`).
    private let pending = Mutex(PendingRows())
    private let wake: AsyncStream<Void>.Continuation
    private let wakes: AsyncStream<Void>

    /// What the journal follower derived and the writer has not stored yet.
    private struct PendingRows: Sendable {
        var rows: [StoredEvent] = []
        var last: UInt64 = 0
        var state: (seq: UInt64, data: Data)?
    }

    /// Fewer rows than this wait `gatherWindow` for more before they are stored.
    static let gatherRows = 1000
    static let gatherWindow = Duration.milliseconds(50)
    /// The follower waits while this many rows are not stored yet (a replay outruns SQLite).
    static let maxPendingRows = 8000

    init(context: ServiceContext, config: DrivebusConfig, store: StatsStore, metrics: StatsMetrics) {
        self.context = context
        tripsConfiguration = config.trips
        scorerConfiguration = config.scorer
        retention = config.retention
        self.store = store
        self.metrics = metrics
        derivations = Mutex(DriveDerivations(trips: config.trips, scorer: config.scorer))
        roadLimits = RoadLimitsWatcher(path: config.layout.roadLimitsIndex) { [logger = context.logger] change in
            logger.info("road limits: \(change)")
        }
        (wakes, wake) = AsyncStream.makeStream(bufferingPolicy: .bufferingNewest(1))
    }

    var lastSeq: UInt64 { seq.load(ordering: .relaxed) }
    /// Live once the ingest journal has caught up. The event streams catch up on their own:
    /// a service that is not running (yet) must not keep stats from serving.
    var isLive: Bool { journalLive.load(ordering: .relaxed) }

    func run() async throws {
        let cursor = try await store.journalCursor()
        // The derivations resume where their saved state was taken. Without a state that decodes
        // (stats killed before its first save, or a state from an older build) they start from
        // the journal's beginning: fresh derivations fed from the middle would open a trip there.
        // Records already stored are only derived from again; derived rows stored again change
        // nothing (ids).
        var from: UInt64 = 0
        if let state = cursor.state {
            let decoder = JSONDecoder()
            decoder.userInfo = CheckpointConfiguration.userInfo(tripsConfiguration, scorerConfiguration)
            do {
                let restored = try decoder.decode(StatsDerivations.self, from: state)
                derivations.withLock { $0 = restored }
                from = cursor.seq
            } catch {
                context.logger.warning("saved derivations not usable, deriving from the journal's start: \(error)")
            }
        }
        seq.store(from, ordering: .relaxed)
        // Records up to here are stored (or were, and have been purged or expired since).
        journalStoredThrough.store(try await store.cursor("journal"), ordering: .relaxed)
        let heartbeats = try await context.bus.subscribe(["svc.heartbeat."])
        try await withThrowingDiscardingTaskGroup { group in
            group.addTask {
                for await beat in heartbeats.cancelOnGracefulShutdown() {
                    if let beat = try? beat.decode(Heartbeat.self) { self.metrics.record(beat) }
                }
            }
            group.addTask { await cancelWhenGracefulShutdown { await self.keepMapCurrent() } }
            if let days = retention.rawFixesDays { group.addTask { await cancelWhenGracefulShutdown { await self.expireFixes(olderThanDays: days) } } }
            for source in Self.eventSources {
                let from = try await store.cursor(source.name)
                group.addTask { try await self.follow(source, from: from) }
            }
            // The journal's follower and writer are both children, so that either one failing
            // cancels the other (and stats exits, to be restarted) instead of one waiting forever
            // for the other. At graceful shutdown the follower returns and the writer stores
            // what is pending, uncancelled, before it returns too.
            group.addTask { try await self.writeJournalRows() }
            let from = from
            group.addTask {
                defer { self.wake.finish() }
                try await StreamFollower(source: .journal, bus: self.context.bus, logger: self.context.logger).run(
                    from: from, cursor: { [self] in journalLive.store($0.isLive, ordering: .relaxed) }
                ) { messages, _ in try await self.storeJournal(messages) }
            }
        }
    }

    /// Cuts newly stored trips into the map's tiles once a second, up to 500 in a write: during
    /// an import, trips end by the hundred, and writing them together is what keeps the map
    /// cheap (docs/map.md). A failure is logged and tried again a second later.
    private func keepMapCurrent() async {
        while !Task.isCancelled {
            do {
                while try await store.updateMap(limit: 500) == 500, !Task.isCancelled {}
            } catch is CancellationError {
                return
            } catch {
                context.logger.warning("map tiles not updated: \(error)")
            }
            try? await Task.sleep(for: .seconds(1))
        }
    }

    /// `retention.raw_fixes_days`: at start and then every hour, fixes older than that leave the
    /// table of fixes (trips keep their tracks). A failure is logged and tried again next time.
    private func expireFixes(olderThanDays days: Double) async {
        var swept = false
        while !Task.isCancelled {
            let before = Date().addingTimeInterval(-days * 86_400)
            do {
                let removed = try await store.expireFixes(before: before)
                if !swept {
                    let emptied = try await store.emptyExpiredJournalFixRows(before: before)
                    if emptied > 0 { context.logger.info("retention applied to journal rows kept from expired fixes", metadata: ["rows": "\(emptied)"]) }
                    swept = true
                }
                if removed > 0 { context.logger.info("retention applied", metadata: ["fixes": "\(removed)", "before": "\(RFC3339.format(before))"]) }
            } catch is CancellationError {
                return
            } catch {
                context.logger.warning("retention not applied to fixes this time: \(error)")
            }
            try? await Task.sleep(for: .seconds(3600))
        }
    }

    private func follow(_ source: StreamSource<LoggedEvent>, from: UInt64) async throws {
        try await StreamFollower(source: source, bus: context.bus, logger: context.logger).run(from: from) { events, _ in
            // A purged event's stand-in moves the cursor and stores nothing.
            let rows = events.filter { $0.type != LoggedEvent.removedType }.map {
                StoredEvent(id: $0.id, type: $0.type, device: $0.device, source: source.service.rawValue, time: $0.time, payload: $0.payload)
            }
            try await self.flush(rows, cursor: source.name, seq: events.last!.seq)
        }
    }

    /// Stores journal messages and what stats derives from them. Those up to
    /// `journalStoredThrough` were stored before (the derivations resume from a saved state that
    /// lags the data): they are only derived from, so that a record purged or expired since is
    /// not brought back.
    private func storeJournal(_ messages: [JournalMessage]) async throws {
        let now = Date()
        let storedThrough = journalStoredThrough.load(ordering: .relaxed)
        var rows: [StoredEvent] = []
        rows.reserveCapacity(messages.count)
        for message in messages {
            // Decoded here once, for the derivations and the fix's row.
            let payload = message.decoded
            var fix: Fix?
            if case .fix(let decoded)? = payload { fix = decoded }
            let derived: [DerivedEvent] = payload.map { payload in
                derivations.withLock { derivations in
                    if roadLimits.differs(from: derivations.scorer.roadLimits) { derivations.scorer.roadLimits = roadLimits.current }
                    let events = derivations.handle(payload, arrivedAt: now)
                    return events.trips + events.scores
                }
            } ?? []
            // A record's row carries the time it holds, so that purging or expiring that time
            // finds it (an imported day arrives years after it was recorded).
            if message.seq > storedThrough {
                rows.append(StoredEvent(
                    id: "journal:\(message.seq)", type: message.type, device: message.device, source: "ingest", time: payload?.time ?? now,
                    payload: message.payload, fix: fix))
            }
            rows += derived.map { StoredEvent(id: $0.id, type: $0.type, device: $0.device, source: "stats", time: now, payload: $0.payload) }
        }
        guard let last = messages.last?.seq else { return }
        // The derivations hold whole open trips: encoding them with every batch would make
        // storing quadratic in a trip's length, so they are saved at most once a second, and a
        // large state less often (`CheckpointPacing`).
        let state: (seq: UInt64, data: Data)? = lastStateSave.withLock { saved in
            saved.messages += UInt64(messages.count)
            guard statePacing.isDue(since: saved.at.duration(to: .now), afterSaving: saved.bytes, messages: saved.messages),
                  let data = derivations.withLock({ try? JSONEncoder().encode($0) }) else { return nil }
            // SQLite writes the state twice: into its log, then into the database.
            saved = (.now, 2 * data.count, 0)
            return (last, data)
        }
        let waiting = pending.withLock { pending in
            pending.rows += rows
            pending.last = last
            if let state { pending.state = state }
            return pending.rows.count
        }
        wake.yield()
        if waiting >= Self.maxPendingRows {
            while pending.withLock({ $0.rows.count }) >= Self.maxPendingRows { try await Task.sleep(for: .milliseconds(2)) }
        }
    }

    /// Stores the journal's rows, the only task that does. A phone posting one fix at a time
    /// makes live groups of one fix, and a transaction for each cost stats 65-77 µs of CPU a fix
    /// (synchronous=FULL); gathered for 50 ms they cost about half. The cursor moves in the same
    /// transaction as the rows, so rows not stored when stats stops are replayed from the
    /// journal at its next start, as after a crash. Ends once the follower has finished `wake`
    /// and what it left is stored; throws what storing threw.
    private func writeJournalRows() async throws {
        for await _ in wakes {
            if pending.withLock({ $0.rows.count }) < Self.gatherRows { try? await Task.sleep(for: Self.gatherWindow) }
            try await storePending()
        }
        try await storePending()
    }

    private func storePending() async throws {
        let batch = pending.withLock { pending in
            defer { pending = PendingRows() }
            return pending
        }
        // A replay of records stored before can leave nothing to store: the seq moves on all
        // the same (the database's cursor is already past it, and a lower one written with
        // derived rows or a state leaves it there).
        if !batch.rows.isEmpty || batch.state != nil {
            try await flush(batch.rows, cursor: "journal", seq: batch.last, state: batch.state)
        }
        if batch.last > 0 { seq.store(batch.last, ordering: .relaxed) }
    }

    private func flush(_ rows: [StoredEvent], cursor: String, seq: UInt64, state: (seq: UInt64, data: Data)? = nil) async throws {
        let started = ContinuousClock.now
        let summary = try await store.store(rows, cursor: cursor, seq: seq, state: state)
        metrics.stored(rows, summary: summary, took: started.duration(to: .now))
    }
}

