import Foundation
import DrivebusKit
import GRDB

/// A webhook call waiting to be made, or made. The row is written before the first attempt, so a
/// crash never loses a gate opening, and it is keyed by the idempotency key (gate + triggering
/// fix), so nothing can put the same opening in twice.
///
/// No secret is at rest here: the row holds the gate's id, the body and the template values; the
/// URL, method and headers (an API key, a bearer token) come from the configuration at send time.
struct OutboxEntry: Codable, Sendable, Equatable, FetchableRecord, PersistableRecord {
    static let databaseTableName = "outbox"

    /// `failed` and `expired` are the dead letters: given up on, visible in `drivebus status`.
    enum State: String, Codable, Sendable { case pending, delivered, failed, expired }

    var key: String
    var gate: String
    var device: String
    var zone: String
    var fixSeq: Int64
    var fixTime: Date
    /// `GateValues` as JSON: what the URL template is filled with at send time.
    var values: String
    var body: String
    var createdAt: Date
    var attempts: Int
    var nextAttemptAt: Date
    var state: State
    var lastStatus: Int?
    var lastError: String?
    var finishedAt: Date?
    var latencyMs: Double?
}

/// The webhook outbox, `STATE/data/outbox.sqlite` (WAL).
final class Outbox: Sendable {
    private let database: DatabaseQueue

    init(path: String) throws {
        var configuration = Configuration()
        configuration.journalMode = .wal
        // Deleted content is overwritten, so no URL or header from before v2 lingers in free pages.
        configuration.prepareDatabase { db in try db.execute(sql: "PRAGMA secure_delete = ON") }
        database = try DatabaseQueue(path: path, configuration: configuration)
        var migrator = DatabaseMigrator()
        migrator.registerMigration("v1") { db in
            try db.create(table: OutboxEntry.databaseTableName) { table in
                table.primaryKey("key", .text)
                table.column("gate", .text).notNull()
                table.column("device", .text).notNull()
                table.column("zone", .text).notNull()
                table.column("fixSeq", .integer).notNull()
                table.column("fixTime", .datetime).notNull()
                table.column("url", .text).notNull()
                table.column("method", .text).notNull()
                table.column("headers", .text).notNull()
                table.column("body", .text).notNull()
                table.column("createdAt", .datetime).notNull()
                table.column("attempts", .integer).notNull()
                table.column("nextAttemptAt", .datetime).notNull().indexed()
                table.column("state", .text).notNull()
                table.column("lastStatus", .integer)
                table.column("lastError", .text)
                table.column("finishedAt", .datetime)
                table.column("latencyMs", .double)
            }
        }
        migrator.registerMigration("v2-no-secrets") { db in
            // URL and headers were stored before: a gate's API key at rest. They go; a call still
            // pending renders its URL from today's config with the values the row has.
            try db.execute(sql: """
                CREATE TABLE outbox_v2 (
                    key TEXT PRIMARY KEY NOT NULL, gate TEXT NOT NULL, device TEXT NOT NULL, zone TEXT NOT NULL,
                    fixSeq INTEGER NOT NULL, fixTime DATETIME NOT NULL, "values" TEXT NOT NULL, body TEXT NOT NULL,
                    createdAt DATETIME NOT NULL, attempts INTEGER NOT NULL, nextAttemptAt DATETIME NOT NULL, state TEXT NOT NULL,
                    lastStatus INTEGER, lastError TEXT, finishedAt DATETIME, latencyMs DOUBLE);
                INSERT INTO outbox_v2 SELECT key, gate, device, zone, fixSeq, fixTime,
                    json_object('gate', gate, 'device', device, 'zone', zone, 'time', strftime('%Y-%m-%dT%H:%M:%fZ', fixTime), 'lat', 0, 'lon', 0),
                    body, createdAt, attempts, nextAttemptAt, state, lastStatus, lastError, finishedAt, latencyMs FROM outbox;
                DROP TABLE outbox;
                ALTER TABLE outbox_v2 RENAME TO outbox;
                CREATE INDEX outbox_on_nextAttemptAt ON outbox(nextAttemptAt);
                """)
        }
        let migrated = try database.read { db in try !migrator.hasCompletedMigrations(db) }
        try migrator.migrate(database)
        if migrated { try database.vacuum() }
    }

    /// Adds `entry` unless its key is already there. Returns whether it was added.
    @discardableResult
    func add(_ entry: OutboxEntry) throws -> Bool {
        try database.write { db in
            try entry.insert(db, onConflict: .ignore)
            return db.changesCount > 0
        }
    }

    // The delivery loop's calls are async: GRDB runs them on its own queue, off the cooperative pool.

    func pending(dueBy time: Date) async throws -> [OutboxEntry] {
        let due = Self.storageText(time)
        return try await database.read { db in
            try OutboxEntry.filter(Column("state") == OutboxEntry.State.pending.rawValue && Column("nextAttemptAt") <= due)
                .order(Column("nextAttemptAt")).fetchAll(db)
        }
    }

    /// A date as GRDB stores it, `2026-11-21 18:42:54.123` (UTC), written without binding a
    /// `Date`: GRDB formats those with Foundation's DateFormatter, which loads ICU's data, 5.8 MB
    /// of an idle geofence's memory, for the question the delivery loop asks every few seconds.
    static func storageText(_ date: Date) -> String {
        var bytes = Array(RFC3339.format(date).utf8.dropLast())  // no "Z"
        bytes[10] = UInt8(ascii: " ")  // for the "T"
        return String(decoding: bytes, as: UTF8.self)
    }

    func nextAttempt() async throws -> Date? {
        try await database.read { db in
            try Date.fetchOne(db, sql: "SELECT MIN(nextAttemptAt) FROM outbox WHERE state = ?", arguments: [OutboxEntry.State.pending.rawValue])
        }
    }

    func update(_ entry: OutboxEntry) async throws {
        try await database.write { db in try entry.update(db) }
    }

    /// Calls given up on: failed or expired.
    func deadLetters() async throws -> [OutboxEntry] {
        try await database.read { db in
            try OutboxEntry.filter([OutboxEntry.State.failed.rawValue, OutboxEntry.State.expired.rawValue].contains(Column("state")))
                .order(Column("createdAt")).fetchAll(db)
        }
    }

    /// A purge: `device`'s calls for fixes from `from` to `to` that were made or given up.
    /// Pending calls stay and are made: they are for fixes of the last minutes, and taking one
    /// back would leave someone at a closed gate. Returns how many went.
    func purge(device: String, from: Date, to: Date) async throws -> Int {
        try await database.write { db in
            try OutboxEntry.filter(
                Column("device") == device && Column("fixTime") >= from && Column("fixTime") <= to
                    && Column("state") != OutboxEntry.State.pending.rawValue
            ).deleteAll(db)
        }
    }

    func all() async throws -> [OutboxEntry] {
        try await database.read { db in try OutboxEntry.order(Column("createdAt")).fetchAll(db) }
    }
}
