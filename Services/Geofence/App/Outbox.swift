import Foundation
import GRDB

/// A webhook call waiting to be made, or made. The row is written before the first attempt, so a
/// crash never loses a gate opening, and it is keyed by the idempotency key (gate + triggering
/// fix), so nothing can put the same opening in twice.
struct OutboxEntry: Codable, Sendable, Equatable, FetchableRecord, PersistableRecord {
    static let databaseTableName = "outbox"

    enum State: String, Codable, Sendable { case pending, delivered, failed }

    var key: String
    var gate: String
    var device: String
    var zone: String
    var fixSeq: Int64
    var fixTime: Date
    var url: String
    var method: String
    /// JSON object of extra headers. The secret is not stored: it is looked up by gate at send time.
    var headers: String
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
        try migrator.migrate(database)
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
        try await database.read { db in
            try OutboxEntry.filter(Column("state") == OutboxEntry.State.pending.rawValue && Column("nextAttemptAt") <= time)
                .order(Column("nextAttemptAt")).fetchAll(db)
        }
    }

    func nextAttempt() async throws -> Date? {
        try await database.read { db in
            try Date.fetchOne(db, sql: "SELECT MIN(nextAttemptAt) FROM outbox WHERE state = ?", arguments: [OutboxEntry.State.pending.rawValue])
        }
    }

    func update(_ entry: OutboxEntry) async throws {
        try await database.write { db in try entry.update(db) }
    }

    func all() async throws -> [OutboxEntry] {
        try await database.read { db in try OutboxEntry.order(Column("createdAt")).fetchAll(db) }
    }
}
