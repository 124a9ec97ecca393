import ArgumentParser
import DrivebusConfiguration
import DrivebusKit
import DrivebusJournal
import Foundation
import GRDB

/// What a copy of `STATE/data` takes, and in which order. A running system keeps writing while
/// it is copied, so the copy must be a state the system could have crashed into: whatever reads
/// a file is copied before the file it reads. Consumers' checkpoints and databases (which name
/// journal positions) first, then the services' event journals, then ingest's journal last, so
/// that every position a copy names is in the copy. Restored, the services replay from there,
/// as after a crash (docs/data.md).
enum StateCopy {
    enum Kind: Int, Comparable {
        /// `<service>.checkpoint.json`: how far each consumer got. Before what it writes as it
        /// goes (geofence's outbox), as a crash between the two would leave them.
        case checkpoint
        /// Databases and the rest: read the journals.
        case reader
        /// `<service>.events`: written by consumers, read by stats.
        case eventJournal
        /// `journal/`, ingest's segments: read by every consumer (or `journal.log`, a journal from
        /// before segments that ingest has not started on since).
        case ingestJournal

        static func < (a: Kind, b: Kind) -> Bool { a.rawValue < b.rawValue }
    }

    struct File: Equatable {
        var name: String
        var kind: Kind
        /// SQLite databases are copied with SQLite's online backup, a snapshot, never byte by byte.
        var isDatabase: Bool
    }

    /// The files of `STATE/data` in copy order. SQLite's own side files go with their database.
    static func plan(_ names: [String]) -> [File] {
        names.compactMap { name -> File? in
            if ["-wal", "-shm", "-journal"].contains(where: { name.hasSuffix(".sqlite" + $0) }) { return nil }
            if name == "journal" || name == "journal.log" { return File(name: name, kind: .ingestJournal, isDatabase: false) }
            if name.hasSuffix(".events") { return File(name: name, kind: .eventJournal, isDatabase: false) }
            if name.hasSuffix(".checkpoint.json") { return File(name: name, kind: .checkpoint, isDatabase: false) }
            return File(name: name, kind: .reader, isDatabase: name.hasSuffix(".sqlite"))
        }.sorted { ($0.kind, $0.name) < ($1.kind, $1.name) }
    }
}

struct Backup: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Copy the state of a system, running or not, into a new directory (docs/data.md).",
        discussion: "The copy is consistent without stopping anything: `drivebus restore DIR` makes a system that answers as this one did when the copy was taken.")

    @OptionGroup var options: ConfigOption

    @Argument(help: "A directory that does not exist yet, or is empty.")
    var directory: String

    func run() throws {
        let config = try loadConfig(options)
        let source = config.layout.dataDir
        let target = directory + "/data"
        let manager = FileManager.default
        if let existing = try? manager.contentsOfDirectory(atPath: directory), !existing.isEmpty {
            throw refusal("backup", "\(directory) is not empty: a backup goes into a new directory")
        }
        guard let names = try? manager.contentsOfDirectory(atPath: source) else {
            throw refusal("backup", "no state to back up: \(source) cannot be read")
        }
        try manager.createDirectory(atPath: target, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        chmod(directory, 0o700)

        var lines: [String] = []
        var manifest: [[String: Any]] = []
        for file in StateCopy.plan(names) {
            let from = source + "/" + file.name, to = target + "/" + file.name
            var isDirectory: ObjCBool = false
            guard manager.fileExists(atPath: from, isDirectory: &isDirectory), !isDirectory.boolValue || file.name == "journal" else { continue }
            var entry: [String: Any] = ["name": file.name]
            if file.name == "journal" {
                try copySegments(from: from, to: to)
            } else if file.isDatabase {
                // A snapshot in one read transaction: the writer carries on meanwhile.
                var readOnly = Configuration()
                readOnly.readonly = true
                let database = try DatabaseQueue(path: from, configuration: readOnly)
                try database.backup(to: try DatabaseQueue(path: to))
                try database.close()
            } else {
                try copyBytes(from: from, to: to)
            }
            // A journal copied while it grew may end in half a record: cut it as a restart would.
            switch file.kind {
            case .ingestJournal where file.name == "journal":
                let journal = try Journal(path: to) { _ in }
                entry["last_seq"] = journal.lastSeq
                journal.shutdown()
            case .ingestJournal:
                break
            case .eventJournal:
                entry["last_seq"] = try EventJournal(path: to).lastSeq
            case .checkpoint, .reader:
                break
            }
            chmod(to, file.name == "journal" ? 0o700 : 0o600)
            let bytes = try byteCount(to)
            entry["bytes"] = bytes
            manifest.append(entry)
            lines.append("  \(file.name): \(bytes) bytes" + ((entry["last_seq"] as? UInt64).map { ", up to seq \($0)" } ?? ""))
        }
        // The config the system runs on, when it has a file: it holds the tokens, so 0600.
        if case .file(let path) = try DrivebusConfig.load(explicitPath: options.config).1 {
            try copyBytes(from: path, to: directory + "/drivebus.yaml")
            chmod(directory + "/drivebus.yaml", 0o600)
            lines.append("  drivebus.yaml: the config, from \(path)")
        }
        let record: [String: Any] = [
            "format": "drivebus-backup-1", "created": ISO8601DateFormatter().string(from: Date()), "state_dir": config.stateDir, "files": manifest,
        ]
        try JSONSerialization.data(withJSONObject: record, options: [.prettyPrinted, .sortedKeys])
            .write(to: URL(fileURLWithPath: directory + "/manifest.json"))
        chmod(directory + "/manifest.json", 0o600)
        print("drivebus backup: \(manifest.count) files of \(config.stateDir) into \(directory)")
        lines.forEach { print($0) }
    }
}

struct Restore: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Put a backup into an empty state directory; then start the system as usual.")

    @OptionGroup var options: ConfigOption

    @Argument(help: "A directory written by `drivebus backup`.")
    var directory: String

    func run() throws {
        let config = try loadConfig(options)
        let manager = FileManager.default
        guard let manifest = try? JSONSerialization.jsonObject(with: Data(contentsOf: URL(fileURLWithPath: directory + "/manifest.json"))) as? [String: Any],
              manifest["format"] as? String == "drivebus-backup-1" else {
            throw refusal("restore", "\(directory) is not a drivebus backup (no manifest.json of format drivebus-backup-1)")
        }
        let target = config.layout.dataDir
        if let existing = try? manager.contentsOfDirectory(atPath: target), let first = existing.sorted().first {
            throw refusal("restore", "\(target) already holds \(first): restore only into an empty state directory")
        }
        try config.layout.prepare()
        let names = try manager.contentsOfDirectory(atPath: directory + "/data").sorted()
        for name in names {
            let from = directory + "/data/" + name, to = target + "/" + name
            var isDirectory: ObjCBool = false
            if manager.fileExists(atPath: from, isDirectory: &isDirectory), isDirectory.boolValue {
                try manager.createDirectory(atPath: to, withIntermediateDirectories: false, attributes: [.posixPermissions: 0o700])
                for inner in try manager.contentsOfDirectory(atPath: from).sorted() { try copyBytes(from: from + "/" + inner, to: to + "/" + inner) }
            } else {
                try copyBytes(from: from, to: to)
                chmod(to, 0o600)
            }
        }
        print("drivebus restore: \(names.count) files into \(target), from the backup of \(manifest["created"] as? String ?? "?")")
        if manager.fileExists(atPath: directory + "/drivebus.yaml") {
            print("  the backup's config is \(directory)/drivebus.yaml; yours was left as it is")
        }
        print("  start the system as usual: each service takes up where the backup ends")
    }
}

/// Says why on standard error and exits 1 (a usage message would not help).
private func refusal(_ command: String, _ message: String) -> ExitCode {
    FileHandle.standardError.write(Data("drivebus \(command): \(message)\n".utf8))
    return ExitCode(1)
}

struct CopyFailure: Error, CustomStringConvertible {
    var description: String
}

/// Copies the journal's segments as they are now: sealed ones (with their index files, never
/// written again) in seq order, then the active one, which may end in half a record (the copy
/// is opened afterwards, which cuts it). Segments begun after the listing are not copied: the
/// copy is a prefix of the journal.
private func copySegments(from: String, to: String) throws {
    let manager = FileManager.default
    try manager.createDirectory(atPath: to, withIntermediateDirectories: false, attributes: [.posixPermissions: 0o700])
    let names = Set(try manager.contentsOfDirectory(atPath: from))
    let segments = names.filter { $0.hasSuffix(".seg") && UInt64($0.dropLast(4)) != nil }.sorted { UInt64($0.dropLast(4))! < UInt64($1.dropLast(4))! }
    for segment in segments {
        let index = String(segment.dropLast(4)) + ".idx"
        guard names.contains(index) else {
            try copyBytes(from: from + "/" + segment, to: to + "/" + segment)
            continue
        }
        // A sealed segment whose records are being removed (purge, retention) has both files
        // replaced by rename: copied again until neither changed while the pair was copied.
        func identity() -> [UInt64] {
            [segment, index].map { name in
                var status = stat()
                return stat(from + "/" + name, &status) == 0 ? UInt64(status.st_ino) : 0
            }
        }
        for attempt in 1...5 {
            let before = identity()
            try copyBytes(from: from + "/" + index, to: to + "/" + index)
            try copyBytes(from: from + "/" + segment, to: to + "/" + segment)
            if identity() == before { break }
            if attempt == 5 { throw CopyFailure(description: "\(from)/\(segment) kept changing while it was copied") }
        }
    }
}

/// The bytes of a file, or of the files of a directory.
private func byteCount(_ path: String) throws -> Int {
    let manager = FileManager.default
    var isDirectory: ObjCBool = false
    guard manager.fileExists(atPath: path, isDirectory: &isDirectory) else { return 0 }
    guard isDirectory.boolValue else { return (try manager.attributesOfItem(atPath: path)[.size] as? Int) ?? 0 }
    return try manager.contentsOfDirectory(atPath: path).reduce(0) { $0 + ((try manager.attributesOfItem(atPath: path + "/" + $1)[.size] as? Int) ?? 0) }
}

/// Copies a file as it is now, in pieces, without holding it whole.
private func copyBytes(from: String, to: String) throws {
    guard let input = FileHandle(forReadingAtPath: from) else { throw CopyFailure(description: "cannot read \(from)") }
    defer { try? input.close() }
    guard FileManager.default.createFile(atPath: to, contents: nil, attributes: [.posixPermissions: 0o600]),
          let output = FileHandle(forWritingAtPath: to) else { throw CopyFailure(description: "cannot write \(to)") }
    defer { try? output.close() }
    while let chunk = try input.read(upToCount: 1 << 20), !chunk.isEmpty {
        try output.write(contentsOf: chunk)
    }
    try output.synchronize()
}
