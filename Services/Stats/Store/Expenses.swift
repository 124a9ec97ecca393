import DrivebusSchema
import Foundation
import StatsCore
import GRDB

/// What `POST /api/v1/costs/expenses` did.
public struct ExpensesAdded: Sendable, Equatable {
    /// Rows new to the ledger.
    public var added: Int
    /// Rows that were already there: the same ledger posted again.
    public var unchanged: Int
    /// Posted rows in the ledger now.
    public var stored: Int
}

extension StatsStore {
    /// Adds the rows of a JSON (`{"expenses":[{date, category, amount}]}`) or CSV
    /// (`date,category,amount`) body to the ledger, all or nothing: a bad row is refused with
    /// 400 `stats.invalid_expense` naming its row and field, and nothing is stored.
    ///
    /// Re-posting the same ledger changes nothing: a row's key is its `id` when given, else its
    /// date, category, amount and how many equal rows came before it in the same body.
    public func addExpenses(body: [UInt8], contentType: String?) async throws -> ExpensesAdded {
        let rows = try Ledger.parse(body: body, contentType: contentType)
        let now = milliseconds(Date())
        return try await pool.write { db in
            var added = 0
            let insert = try db.cachedStatement(sql: """
                INSERT OR IGNORE INTO expenses (key, day, date, category, amount, added_ms) VALUES (?, ?, ?, ?, ?, ?)
                """)
            for row in rows {
                try insert.execute(arguments: [row.key, row.day, row.date, row.category, row.amount.description, now])
                if db.changesCount > 0 { added += 1 }
            }
            let stored = try Int.fetchOne(db, sql: "SELECT count(*) FROM expenses") ?? 0
            return ExpensesAdded(added: added, unchanged: rows.count - added, stored: stored)
        }
    }

    /// `{"added","unchanged","stored"}`
    public func addExpensesJSON(body: [UInt8], contentType: String?) async throws -> [UInt8] {
        let result = try await addExpenses(body: body, contentType: contentType)
        var writer = JSONWriter()
        writer.beginObject()
        writer.key("added"); writer.number(UInt64(result.added))
        writer.key("stored"); writer.number(UInt64(result.stored))
        writer.key("unchanged"); writer.number(UInt64(result.unchanged))
        writer.endObject()
        return writer.bytes
    }

    /// The ledger (configured and posted expenses) dated in the range, oldest first.
    public func expensesJSON(_ query: StatsQuery, configuration costs: CostsConfiguration) async throws -> [UInt8] {
        let entries = try await pool.read { db in try Ledger.entries(db, query: query, costs: costs) }
        var writer = JSONWriter(capacity: 256 + 96 * entries.count)
        writer.beginObject()
        writer.key("currency"); writer.string(costs.currency)
        writer.key("expenses")
        writer.beginArray()
        for entry in entries {
            writer.beginObject()
            writer.key("amount"); writer.number(Money.double(entry.amount))
            writer.key("category"); writer.string(entry.category)
            writer.key("date"); writer.string(entry.date)
            writer.key("source"); writer.string(entry.fromConfig ? "config" : "posted")
            writer.endObject()
        }
        writer.endArray()
        writer.key("total"); writer.number(Money.double(Money.cents(entries.reduce(Decimal(0)) { $0 + $1.amount })))
        writer.endObject()
        return writer.bytes
    }
}

/// The own car's ledger: configured expenses plus posted ones.
enum Ledger {
    struct Entry: Sendable, Equatable {
        var date: String
        var day: Int64
        var category: String
        var amount: Decimal
        var fromConfig: Bool
    }

    /// A posted row, checked.
    struct Posted: Sendable, Equatable {
        var key: String
        var date: String
        var day: Int64
        var category: String
        var amount: Decimal
    }

    static let maxRows = 100_000

    /// Entries whose day (at UTC midnight) is in the range, oldest first.
    static func entries(_ db: Database, query: StatsQuery, costs: CostsConfiguration) throws -> [Entry] {
        var entries: [Entry] = []
        for expense in costs.ownCar.expenses {
            guard let day = LedgerRules.day(expense.date) else { continue }
            entries.append(Entry(date: expense.date, day: day, category: expense.category, amount: Money.decimal(expense.amount), fromConfig: true))
        }
        let rows = try Row.fetchCursor(db, sql: "SELECT day, date, category, amount FROM expenses ORDER BY day, key")
        while let row = try rows.next() {
            guard let amount = Money.parse(row[3] as String) else { continue }
            entries.append(Entry(date: row[1], day: row[0], category: row[2], amount: amount, fromConfig: false))
        }
        let from = query.fromMs, to = query.toMs
        return entries
            .filter { $0.day * PeriodQueries.dayMs >= from && $0.day * PeriodQueries.dayMs < to }
            .sorted { ($0.day, $0.fromConfig ? 0 : 1, $0.category) < ($1.day, $1.fromConfig ? 0 : 1, $1.category) }
    }

    // MARK: Parsing a posted ledger

    static func parse(body: [UInt8], contentType: String?) throws(StatsError) -> [Posted] {
        let type = contentType?.lowercased() ?? ""
        let first = body.first { ![UInt8(ascii: " "), UInt8(ascii: "\n"), UInt8(ascii: "\r"), UInt8(ascii: "\t")].contains($0) }
        let isJSON = type.contains("json") || (!type.contains("csv") && (first == UInt8(ascii: "{") || first == UInt8(ascii: "[")))
        let raw = isJSON ? try parseJSON(body) : try parseCSV(body)
        guard !raw.isEmpty else { throw StatsError(status: 400, code: "stats.invalid_body", message: "body: has no expense rows", field: "body") }
        guard raw.count <= maxRows else {
            throw StatsError(status: 400, code: "stats.invalid_body", message: "body: at most \(maxRows) rows at once", field: "body")
        }
        var seen: [String: Int] = [:]
        return raw.map { row in
            var row = row
            if !row.key.hasPrefix("id:") {
                // Equal rows in one body are distinct expenses; the same body again adds nothing.
                seen[row.key, default: 0] += 1
                row.key += "#\(seen[row.key]!)"
            }
            return row
        }
    }

    static func invalid(row: Int, field: String, _ reason: String) -> StatsError {
        StatsError(status: 400, code: "stats.invalid_expense", message: "row \(row): \(field): \(reason)", field: field, details: ["row": .number(Double(row))])
    }

    /// A checked row; `row` is its number for messages.
    static func make(row: Int, date: String?, category: String?, amount: Decimal?, amountText: String?, id: String?) throws(StatsError) -> Posted {
        guard let date, !date.isEmpty else { throw invalid(row: row, field: "date", "is required") }
        guard let day = LedgerRules.day(date) else { throw invalid(row: row, field: "date", "must be a date YYYY-MM-DD from 1970 to 9999, got \"\(date.prefix(40))\"") }
        guard let category, !category.isEmpty else { throw invalid(row: row, field: "category", "is required") }
        if let reason = LedgerRules.categoryProblem(category) { throw invalid(row: row, field: "category", reason) }
        guard let amount else {
            throw invalid(row: row, field: "amount", amountText.map { "must be a number such as 62.40, got \"\($0.prefix(40))\"" } ?? "is required")
        }
        guard abs(amount) <= 1_000_000_000 else { throw invalid(row: row, field: "amount", "must be from -1000000000 to 1000000000") }
        if let id {
            guard (1...128).contains(id.utf8.count) else { throw invalid(row: row, field: "id", "must be 1 to 128 bytes") }
            return Posted(key: "id:" + id, date: date, day: day, category: category, amount: amount)
        }
        return Posted(key: "\(date)|\(category)|\(amount)", date: date, day: day, category: category, amount: amount)
    }

    /// `{"expenses":[{date, category, amount, id?}]}` or a bare array; `row` counts from 1.
    static func parseJSON(_ body: [UInt8]) throws(StatsError) -> [Posted] {
        let root: JSONValue
        do { root = try JSONValue.parse(body) } catch {
            throw StatsError(status: 400, code: "stats.invalid_body", message: "body: not valid JSON: \(error)", field: "body")
        }
        var list: [JSONValue]
        switch root {
        case .array(let items): list = items
        case .object(let object):
            guard case .array(let items)? = object["expenses"] else {
                throw StatsError(status: 400, code: "stats.invalid_body", message: "body: expected {\"expenses\": [...]}", field: "expenses")
            }
            list = items
        default:
            throw StatsError(status: 400, code: "stats.invalid_body", message: "body: expected {\"expenses\": [...]}", field: "body")
        }
        var rows: [Posted] = []
        for (index, item) in list.enumerated() {
            let number = index + 1
            guard case .object(let object) = item else { throw invalid(row: number, field: "row", "must be an object {date, category, amount}") }
            func text(_ key: String) throws(StatsError) -> String? {
                switch object[key] {
                case nil, .null?: return nil
                case .string(let value)?: return value
                default: throw invalid(row: number, field: key, "must be a string")
                }
            }
            var amount: Decimal?, amountText: String?
            switch object["amount"] {
            case .number(let value)?:
                guard value.isFinite, abs(value) <= 1_000_000_000 else {
                    throw invalid(row: number, field: "amount", "must be from -1000000000 to 1000000000")
                }
                amountText = "\(value)"
                amount = Money.decimal(value)
            case .string(let value)?:
                amountText = value
                amount = Money.parse(value.trimmingCharacters(in: .whitespaces))
            case nil, .null?: break
            default: amountText = "a non-number"
            }
            rows.append(try make(row: number, date: try text("date"), category: try text("category"), amount: amount, amountText: amountText, id: try text("id")))
        }
        return rows
    }

    /// `date,category,amount[,id]` with an optional header line (columns then go by name).
    /// Fields may be quoted as in RFC 4180. `row` is the line number, the header being line 1.
    static func parseCSV(_ body: [UInt8]) throws(StatsError) -> [Posted] {
        guard let text = String(validating: body, as: UTF8.self) else {
            throw StatsError(status: 400, code: "stats.invalid_body", message: "body: is not UTF-8", field: "body")
        }
        var rows: [Posted] = []
        var columns: (date: Int, category: Int, amount: Int, id: Int?) = (0, 1, 2, nil)
        var sawFirst = false
        for (index, line) in text.split(separator: "\n", omittingEmptySubsequences: false).enumerated() {
            let number = index + 1
            var line = Substring(line)
            if line.hasSuffix("\r") { line = line.dropLast() }
            if line.trimmingCharacters(in: .whitespaces).isEmpty { continue }
            guard let fields = csvFields(line) else { throw invalid(row: number, field: "row", "has an unterminated quote") }
            if !sawFirst {
                sawFirst = true
                let names = fields.map { $0.trimmingCharacters(in: .whitespaces).lowercased() }
                if names.contains("date") {
                    guard let date = names.firstIndex(of: "date"), let category = names.firstIndex(of: "category"),
                          let amount = names.firstIndex(of: "amount") else {
                        throw invalid(row: number, field: "header", "must name the columns date, category and amount")
                    }
                    columns = (date, category, amount, names.firstIndex(of: "id"))
                    continue
                }
            }
            let needed = max(columns.date, columns.category, columns.amount, columns.id ?? 0) + 1
            guard fields.count >= needed else {
                throw invalid(row: number, field: "row", "has \(fields.count) columns, expected date,category,amount")
            }
            func field(_ column: Int) -> String? {
                let value = fields[column].trimmingCharacters(in: .whitespaces)
                return value.isEmpty ? nil : value
            }
            let amountText = field(columns.amount)
            rows.append(try make(
                row: number, date: field(columns.date), category: field(columns.category),
                amount: amountText.flatMap(Money.parse), amountText: amountText, id: columns.id.flatMap(field)))
        }
        return rows
    }

    /// One CSV line's fields; nil when a quote is not closed.
    static func csvFields(_ line: Substring) -> [String]? {
        var fields: [String] = []
        var current = ""
        // Whether `current` holds anything but spaces and tabs: kept as characters arrive, since
        // trimming it at every quote made a line of many quotes quadratic (found by the fuzzer).
        var currentIsBlank = true
        var quoted = false, wasQuoted = false
        var iterator = line.makeIterator()
        while let character = iterator.next() {
            if quoted {
                if character == "\"" {
                    // A doubled quote is a quote; a single one ends the quoted part.
                    var lookahead = iterator
                    if lookahead.next() == "\"" {
                        current.append("\"")
                        currentIsBlank = false
                        iterator = lookahead
                    } else {
                        quoted = false
                    }
                } else {
                    current.append(character)
                    if character != " " && character != "\t" { currentIsBlank = false }
                }
            } else if character == "," {
                fields.append(current)
                current = ""
                currentIsBlank = true
                wasQuoted = false
            } else if character == "\"", !wasQuoted, currentIsBlank {
                current = ""
                quoted = true
                wasQuoted = true
            } else {
                current.append(character)
                if character != " " && character != "\t" { currentIsBlank = false }
            }
        }
        guard !quoted else { return nil }
        fields.append(current)
        return fields
    }
}
