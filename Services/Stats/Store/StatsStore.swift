import DrivebusGeo
import DrivebusSchema
import Foundation
import StatsCore
import GRDB

/// One message from the bus, as the stats service keeps it.
public struct StoredEvent: Sendable, Equatable {
    /// The envelope's event id: the key that makes storage idempotent.
    public var id: String
    /// `fix`, `trip.ended`, `geofence.enter`, … (the header's `type`, not the topic).
    public var type: String
    public var device: String?
    public var source: String
    /// The envelope's time.
    public var time: Date
    /// The payload JSON, as published.
    public var payload: [UInt8]
    /// The payload of a `fix`, when the caller has decoded it already: storing is the hot path,
    /// and then it is not decoded again.
    public var fix: Fix?

    public init(id: String, type: String, device: String?, source: String, time: Date, payload: [UInt8], fix: Fix? = nil) {
        self.id = id
        self.type = type
        self.device = device
        self.source = source
        self.time = time
        self.payload = payload
        self.fix = fix
    }
}

/// The stats database: every event from the bus, plus the tables the HTTP API reads.
///
/// Writes go through one GRDB writer; reads use WAL snapshots, so exports never hold up storing.
public final class StatsStore: Sendable {
    public struct Configuration: Sendable {
        /// How hard a commit waits for the disk.
        public enum Durability: String, Sendable {
            /// `synchronous=FULL`: a batch that `store` returned from survives a power cut, so a
            /// checkpoint written after it never claims events that were lost.
            case full
            /// `synchronous=NORMAL`: faster, but the last commits can vanish on power loss.
            case normal
        }

        /// `STATE/data/drivebus.sqlite`.
        public var path: String
        /// Each device's home zone, for `is_home`, `distance_from_home_m` and `away_from_home_s`.
        public var homes: [String: Zone]
        /// Time between two fixes longer than this is unknown: not counted as away from home,
        /// and a new track segment in GPX exports (`stats.max_gap_s`).
        public var maxGapS: Double
        /// Douglas-Peucker tolerance for `map.geojson` and `map.svg`.
        public var mapToleranceM: Double
        public var durability: Durability
        /// SQLite reader connections: each streaming export holds one for its whole run.
        public var maxReaders: Int
        /// Whether stored trips are queued to be cut into the interactive map's tiles
        /// (`updateMap`); the benchmark turns it off to measure what the tiles cost.
        public var mapTiles: Bool

        public init(
            path: String, homes: [String: Zone] = [:], maxGapS: Double = 3600, mapToleranceM: Double = 10,
            durability: Durability = .full, maxReaders: Int = 8, mapTiles: Bool = true
        ) {
            self.mapTiles = mapTiles
            self.path = path
            self.homes = homes
            self.maxGapS = maxGapS
            self.mapToleranceM = mapToleranceM
            self.durability = durability
            self.maxReaders = maxReaders
        }
    }

    /// What one `store` call did, for logs and metrics.
    public struct Summary: Sendable, Equatable {
        /// Events new to the database.
        public var inserted = 0
        /// Events whose id was already stored, and fixes whose key (device, time, place) was.
        public var duplicates = 0
        /// Heartbeats, which are not kept.
        public var skipped = 0
        /// Events kept in `events` whose payload could not be projected (a bad or unexpected
        /// payload), with the first few reasons.
        public var unprojected = 0
        public var problems: [String] = []
        public init() {}
    }

    public let configuration: Configuration
    /// The circle each home zone is measured against (`Zone.circle`), worked out once.
    let homes: [String: HomeCircle]
    let pool: DatabasePool

    public init(_ configuration: Configuration) throws {
        self.configuration = configuration
        homes = configuration.homes.mapValues { HomeCircle(center: $0.circle.center, radiusM: $0.circle.radiusM) }
        var config = GRDB.Configuration()
        config.maximumReaderCount = max(2, configuration.maxReaders)
        config.busyMode = .timeout(10)
        let synchronous = configuration.durability == .full ? "FULL" : "NORMAL"
        config.prepareDatabase { db in
            try db.execute(sql: "PRAGMA synchronous = \(synchronous)")
        }
        let directory = (configuration.path as NSString).deletingLastPathComponent
        if !directory.isEmpty {
            try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        }
        // A DatabasePool always runs in WAL mode.
        pool = try DatabasePool(path: configuration.path, configuration: config)
        try StatsSchema.migrator.migrate(pool)
    }

    /// Stores a batch in one transaction. Idempotent by event id, and a fix by its key: storing
    /// again changes nothing, except that a fix purged or expired in between comes back (the
    /// recorder stores no record twice for that reason). Blocks the calling thread for the commit.
    @discardableResult
    public func store(_ batch: [StoredEvent]) throws -> Summary {
        try pool.write { db in try Projector.store(batch, in: db, mapTiles: configuration.mapTiles) }
    }

    /// The same, waiting on GRDB's writer queue instead of blocking the caller's thread.
    @discardableResult
    public func store(_ batch: [StoredEvent]) async throws -> Summary {
        try await pool.write { db in try Projector.store(batch, in: db, mapTiles: configuration.mapTiles) }
    }

    /// Stores a batch and, in the same transaction, the seq it completes in the stream named
    /// `cursor` (`journal`, `events.trips`…): the database is its own checkpoint, so a crash can
    /// never record a seq whose data is missing. A cursor never goes back: one written lower than
    /// it stands is kept where it stands. `state` is the caller's own state (the stats service's
    /// derivations) as of `state.seq`, kept in the same transaction for the same reason. It can
    /// lag the data: replaying from its seq derives again from records stored before, which the
    /// recorder does not store again.
    @discardableResult
    public func store(_ batch: [StoredEvent], cursor: String, seq: UInt64, state: (seq: UInt64, data: Data)? = nil) async throws -> Summary {
        try await pool.write { db in
            let summary = try Projector.store(batch, in: db, mapTiles: configuration.mapTiles)
            try db.execute(
                sql: "INSERT INTO cursors (name, value) VALUES (?, ?) ON CONFLICT(name) DO UPDATE SET value = max(value, excluded.value)",
                arguments: [cursor, Int64(seq)])
            if let state {
                try db.execute(
                    sql: "INSERT INTO cursors (name, value, state) VALUES ('derivations', ?, ?) ON CONFLICT(name) DO UPDATE SET value = excluded.value, state = excluded.state",
                    arguments: [Int64(state.seq), state.data])
            }
            return summary
        }
    }

    /// Where to resume: the seq of the last saved state and that state; without one, the last
    /// journal seq whose messages are all stored.
    public func journalCursor() async throws -> (seq: UInt64, state: Data?) {
        try await pool.read { db in
            if let row = try Row.fetchOne(db, sql: "SELECT value, state FROM cursors WHERE name = 'derivations'") {
                return (UInt64(row["value"] as Int64), row["state"] as Data?)
            }
            return (UInt64(try Int64.fetchOne(db, sql: "SELECT value FROM cursors WHERE name = 'journal'") ?? 0), nil)
        }
    }

    /// The last seq stored from the stream named `name`; 0 for none.
    public func cursor(_ name: String) async throws -> UInt64 {
        try await pool.read { db in UInt64(try Int64.fetchOne(db, sql: "SELECT value FROM cursors WHERE name = ?", arguments: [name]) ?? 0) }
    }

    /// Every event row's payload as text, for tests that check what a purge or expiry left.
    package func eventPayloads() async throws -> [String] {
        try await pool.read { db in try String.fetchAll(db, sql: "SELECT CAST(payload AS TEXT) FROM events ORDER BY id") }
    }

    /// Row counts per table, for tests, `health` and metrics.
    public func counts() async throws -> [String: Int] {
        try await pool.read { db in
            var counts: [String: Int] = [:]
            for table in StatsSchema.tables {
                counts[table] = try Int.fetchOne(db, sql: "SELECT count(*) FROM \(table)") ?? 0
            }
            return counts
        }
    }

    /// Closes the connections; later calls fail.
    public func close() throws { try pool.close() }

    func home(of device: String) -> HomeCircle? { homes[device] }
}

enum StatsSchema {
    static let tables = ["events", "fixes", "fix_days", "devices", "trips", "scores", "sessions", "geofence_transitions", "gate_calls", "checkouts", "expenses"]

    static var migrator: DatabaseMigrator {
        var migrator = DatabaseMigrator()
        migrator.registerMigration("v1") { db in
            // Times are integer milliseconds since 1970 UTC: the bus's resolution, exact to compare.
            try db.execute(sql: """
                CREATE TABLE events (
                    id TEXT PRIMARY KEY NOT NULL,
                    type TEXT NOT NULL,
                    device TEXT,
                    source TEXT NOT NULL,
                    time_ms INTEGER NOT NULL,
                    payload BLOB NOT NULL
                );
                CREATE TABLE fixes (
                    device TEXT NOT NULL,
                    time_ms INTEGER NOT NULL,
                    lat REAL NOT NULL,
                    lon REAL NOT NULL,
                    accuracy_m REAL,
                    altitude_m REAL,
                    speed_mps REAL,
                    course_deg REAL,
                    seq INTEGER,
                    PRIMARY KEY (device, time_ms, lat, lon)
                ) WITHOUT ROWID;
                CREATE TABLE devices (
                    device TEXT PRIMARY KEY NOT NULL,
                    first_ms INTEGER NOT NULL,
                    last_ms INTEGER NOT NULL
                );
                CREATE TABLE trips (
                    trip_id TEXT PRIMARY KEY NOT NULL,
                    device TEXT NOT NULL,
                    start_ms INTEGER NOT NULL,
                    end_ms INTEGER NOT NULL,
                    duration_s REAL,
                    distance_m REAL,
                    max_speed_mps REAL,
                    avg_speed_mps REAL,
                    ascent_m REAL,
                    descent_m REAL,
                    start_lat REAL, start_lon REAL,
                    end_lat REAL, end_lon REAL,
                    fix_count INTEGER,
                    first_seq INTEGER,
                    last_seq INTEGER,
                    track TEXT NOT NULL,
                    event_id TEXT NOT NULL
                );
                CREATE INDEX trips_by_start ON trips(start_ms);
                CREATE INDEX trips_by_device ON trips(device, start_ms);
                CREATE TABLE scores (
                    trip_id TEXT PRIMARY KEY NOT NULL,
                    device TEXT,
                    start_ms INTEGER,
                    score REAL,
                    distance_m REAL,
                    events TEXT NOT NULL,
                    counts TEXT NOT NULL,
                    events_per_100km REAL,
                    speed_variation REAL,
                    session_id TEXT,
                    candidate TEXT,
                    event_id TEXT NOT NULL
                );
                CREATE INDEX scores_by_session ON scores(session_id);
                CREATE TABLE sessions (
                    session_id TEXT PRIMARY KEY NOT NULL,
                    device TEXT NOT NULL,
                    candidate TEXT NOT NULL,
                    instructor TEXT,
                    note TEXT,
                    start_ms INTEGER NOT NULL,
                    end_ms INTEGER
                );
                CREATE INDEX sessions_by_candidate ON sessions(candidate, start_ms);
                CREATE INDEX sessions_by_device ON sessions(device, start_ms);
                CREATE TABLE geofence_transitions (
                    id TEXT PRIMARY KEY NOT NULL,
                    device TEXT NOT NULL,
                    zone TEXT NOT NULL,
                    event TEXT NOT NULL,
                    time_ms INTEGER NOT NULL,
                    lat REAL, lon REAL,
                    seq INTEGER,
                    dwell_s REAL
                );
                CREATE INDEX geofence_by_device ON geofence_transitions(device, time_ms);
                CREATE TABLE gate_calls (
                    id TEXT PRIMARY KEY NOT NULL,
                    outcome TEXT NOT NULL,
                    gate TEXT NOT NULL,
                    device TEXT,
                    zone TEXT,
                    seq INTEGER,
                    idempotency_key TEXT,
                    status INTEGER,
                    latency_ms REAL,
                    attempts INTEGER,
                    error TEXT,
                    time_ms INTEGER NOT NULL
                );
                CREATE INDEX gate_calls_by_device ON gate_calls(device, time_ms);
                CREATE TABLE checkouts (
                    id TEXT PRIMARY KEY NOT NULL,
                    device TEXT NOT NULL,
                    checkin_ms INTEGER,
                    checkout_ms INTEGER NOT NULL,
                    reason TEXT,
                    confidence TEXT,
                    ride_s REAL,
                    ride_distance_m REAL
                );
                CREATE INDEX checkouts_by_device ON checkouts(device, checkout_ms);
                """)
        }
        migrator.registerMigration("v2-cursors") { db in
            try db.execute(sql: "CREATE TABLE cursors (name TEXT PRIMARY KEY NOT NULL, value INTEGER NOT NULL, state BLOB)")
        }
        migrator.registerMigration("v3-expenses") { db in
            // The own car's ledger as posted (issue 9). `key` makes re-posting a ledger idempotent;
            // `amount` is the exact decimal text, `day` the date's days since 1970.
            try db.execute(sql: """
                CREATE TABLE expenses (
                    key TEXT PRIMARY KEY NOT NULL,
                    day INTEGER NOT NULL,
                    date TEXT NOT NULL,
                    category TEXT NOT NULL,
                    amount TEXT NOT NULL,
                    added_ms INTEGER NOT NULL
                );
                CREATE INDEX expenses_by_day ON expenses(day);
                """)
        }
        migrator.registerMigration("v4-score-components") { db in
            // `drive.scored` explains its score (issue 15): the components as the scorer sent them.
            try db.execute(sql: "ALTER TABLE scores ADD COLUMN components TEXT NOT NULL DEFAULT '[]'")
        }
        migrator.registerMigration("v5-device-battery") { db in
            // The dashboard's devices show the battery of each device's latest fix that had one.
            try db.execute(sql: "ALTER TABLE devices ADD COLUMN battery REAL")
            try db.execute(sql: "ALTER TABLE devices ADD COLUMN battery_ms INTEGER")
        }
        migrator.registerMigration("v6-visits") { db in
            // Stays at places from imported location histories (`visit` on the bus).
            try db.execute(sql: """
                CREATE TABLE visits (
                    device TEXT NOT NULL,
                    start_ms INTEGER NOT NULL,
                    end_ms INTEGER NOT NULL,
                    lat REAL NOT NULL,
                    lon REAL NOT NULL,
                    name TEXT,
                    address TEXT,
                    place_id TEXT,
                    semantic_type TEXT,
                    seq INTEGER,
                    PRIMARY KEY (device, start_ms, lat, lon)
                ) WITHOUT ROWID;
                """)
        }
        migrator.registerMigration("v7-map-tiles") { db in
            // The interactive map's level of detail (issue 20), filled from the trips so far.
            try db.execute(sql: MapLevels.schema)
            try db.execute(sql: "INSERT INTO map_pending (trip_id) SELECT trip_id FROM trips ORDER BY start_ms")
        }
        migrator.registerMigration("v8-speeding-distance") { db in
            // Speeding against posted limits (issue 16): how far above the limit, out of how far
            // with a known limit. Null for scores from before.
            try db.execute(sql: "ALTER TABLE scores ADD COLUMN speeding_m REAL")
            try db.execute(sql: "ALTER TABLE scores ADD COLUMN limit_known_m REAL")
        }
        migrator.registerMigration("v9-fix-days") { db in
            // A day's figures that come from its fixes (their count, the time away from home),
            // kept when `retention.raw_fixes_days` lets the fixes go (issue 21), with the day's
            // last fix, from which the clock of time away runs on past midnight.
            try db.execute(sql: """
                CREATE TABLE fix_days (
                    device TEXT NOT NULL, day INTEGER NOT NULL, fixes INTEGER NOT NULL, away_s REAL,
                    last_ms INTEGER, last_lat REAL, last_lon REAL,
                    PRIMARY KEY (device, day)) WITHOUT ROWID
                """)
        }
        return migrator
    }
}

/// A home as stats measures it: a circle.
struct HomeCircle: Sendable, Equatable {
    var center: Coordinate
    var radiusM: Double
}
