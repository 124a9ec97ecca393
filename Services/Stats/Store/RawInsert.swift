import Foundation
import StatsCore
import GRDB
import GRDBSQLite

/// A prepared INSERT run with SQLite's own bind calls: the fix path stores two rows per fix, and
/// building GRDB `StatementArguments` for them cost more than SQLite's work. The statement is
/// prepared and owned by GRDB; only binding and stepping happen here, inside GRDB's transaction.
struct RawInsert {
    private let statement: Statement
    private let handle: OpaquePointer
    private let connection: OpaquePointer?
    private static let transient = unsafeBitCast(OpaquePointer(bitPattern: -1), to: sqlite3_destructor_type.self)

    init(_ db: Database, sql: String) throws {
        statement = try db.cachedStatement(sql: sql)
        handle = statement.sqliteStatement
        connection = db.sqliteConnection
    }

    /// Binds with `bind` and runs; true when a row was inserted (false when OR IGNORE skipped it).
    func run(_ bind: (inout Binder) -> Void) throws -> Bool {
        sqlite3_reset(handle)
        sqlite3_clear_bindings(handle)
        var binder = Binder(handle: handle)
        bind(&binder)
        let code = sqlite3_step(handle)
        guard code == SQLITE_DONE else {
            let message = connection.map { String(cString: sqlite3_errmsg($0)) }
            sqlite3_reset(handle)
            throw DatabaseError(resultCode: ResultCode(rawValue: code), message: message, sql: statement.sql)
        }
        return connection.map { sqlite3_changes($0) > 0 } ?? false
    }

    /// Binds parameters in order; a nil leaves the parameter NULL.
    struct Binder {
        let handle: OpaquePointer
        private var index: CInt = 1

        init(handle: OpaquePointer) { self.handle = handle }

        mutating func text(_ value: String?) {
            defer { index += 1 }
            guard var value else { return }
            value.withUTF8 { bytes in
                // A non-null pointer even for "", which SQLite would otherwise store as NULL.
                withUnsafePointer(to: 0 as UInt8) { empty in
                    let start = bytes.baseAddress ?? empty
                    _ = start.withMemoryRebound(to: CChar.self, capacity: max(1, bytes.count)) {
                        sqlite3_bind_text(handle, index, $0, CInt(bytes.count), RawInsert.transient)
                    }
                }
            }
        }

        mutating func blob(_ value: [UInt8]) {
            defer { index += 1 }
            value.withUnsafeBytes { bytes in
                if let base = bytes.baseAddress {
                    _ = sqlite3_bind_blob(handle, index, base, CInt(bytes.count), RawInsert.transient)
                } else {
                    _ = sqlite3_bind_zeroblob(handle, index, 0)
                }
            }
        }

        mutating func integer(_ value: Int64?) {
            defer { index += 1 }
            if let value { sqlite3_bind_int64(handle, index, value) }
        }

        mutating func real(_ value: Double?) {
            defer { index += 1 }
            if let value, value.isFinite { sqlite3_bind_double(handle, index, value) }
        }
    }
}
