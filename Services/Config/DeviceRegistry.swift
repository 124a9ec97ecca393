import DrivebusSchema
import DrivebusSettings
import Foundation

/// The devices added with `drivebus device add` (or created by an import): a JSON file under the
/// state directory, `data/devices.json`, mode 0600. The config file stays the user's own: the CLI
/// never rewrites it. Services take the config's `devices:` plus these; an id in both is the
/// config's. Only a SHA-256 of each token is kept: the token itself is shown once, when it is
/// made, and is nowhere at rest outside the config.
public struct DeviceRegistry: Sendable {
    public struct Entry: Codable, Sendable, Equatable {
        public var id: String
        /// The SHA-256 of the token, hex.
        public var tokenSHA256: String
        /// The app it was set up for (`owntracks`, `overland`, `traccar`, `gpslogger`), if any.
        public var app: String?
        public var addedAt: Date

        enum CodingKeys: String, CodingKey {
            case id, app
            case tokenSHA256 = "token_sha256"
            case addedAt = "added_at"
        }

        /// - Parameter tokenSHA256: the token's SHA-256, hex (`TokenDigest.hex`); the token itself
        ///   is not kept.
        public init(id: String, tokenSHA256: String, app: String?, addedAt: Date) {
            self.id = id
            self.tokenSHA256 = tokenSHA256
            self.app = app
            self.addedAt = addedAt
        }
    }

    public let path: String

    public init(layout: StateLayout) { path = layout.dataDir + "/devices.json" }

    public init(path: String) { self.path = path }

    /// The entries; none when the file does not exist yet. Any other failure to read it is an
    /// error: taken for "no devices", the next save would erase the list.
    public func load() throws(ConfigError) -> [Entry] {
        let data: Data
        do {
            data = try Data(contentsOf: URL(fileURLWithPath: path))
        } catch {
            var info = stat()
            if stat(path, &info) != 0, errno == ENOENT { return [] }
            throw ConfigError(path: path, reason: "cannot be read: \(error.localizedDescription)")
        }
        do {
            let decoder = JSONDecoder()
            decoder.dateDecodingStrategy = .iso8601
            let entries = try decoder.decode([Entry].self, from: data)
            for (index, entry) in entries.enumerated() where !DeviceID.isValid(entry.id) || Self.bytes(hex: entry.tokenSHA256)?.count != 32 {
                throw ConfigError(path: "\(path): [\(index)]", reason: "is not a device with a valid id and a token's SHA-256")
            }
            return entries
        } catch let error as ConfigError {
            throw error
        } catch {
            throw ConfigError(path: path, reason: "is not a device list: \(error)")
        }
    }

    /// Replaces the file in one rename, so a reader sees the old list or the new one, never half.
    public func save(_ entries: [Entry]) throws(ConfigError) {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.prettyPrinted, .sortedKeys]
        encoder.dateEncodingStrategy = .iso8601
        let directory = (path as NSString).deletingLastPathComponent
        let temporary = path + ".tmp-\(ProcessInfo.processInfo.processIdentifier)-\(UInt32.random(in: 0...UInt32.max))"
        do {
            try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
            let data = try encoder.encode(entries)
            guard FileManager.default.createFile(atPath: temporary, contents: data, attributes: [.posixPermissions: 0o600]) else {
                throw ConfigError(path: temporary, reason: "cannot be written")
            }
            guard rename(temporary, path) == 0 else {
                throw ConfigError(path: path, reason: "cannot be replaced: \(String(cString: strerror(errno)))")
            }
        } catch let error as ConfigError {
            try? FileManager.default.removeItem(atPath: temporary)
            throw error
        } catch {
            try? FileManager.default.removeItem(atPath: temporary)
            throw ConfigError(path: path, reason: "cannot be written: \(error)")
        }
    }

    /// Reads, changes and saves the list under an exclusive lock on `devices.json.lock`, so that
    /// two writers (`drivebus device`, an import creating its device, the dashboard's setup) never
    /// lose each other's change. Blocking: call it off the cooperative pool.
    public func update<T>(_ change: (inout [Entry]) throws(ConfigError) -> T) throws(ConfigError) -> T {
        let directory = (path as NSString).deletingLastPathComponent
        try? FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        let lock = open(path + ".lock", O_RDWR | O_CREAT | O_CLOEXEC, 0o600)
        guard lock >= 0 else { throw ConfigError(path: path + ".lock", reason: "cannot be opened: \(String(cString: strerror(errno)))") }
        defer { close(lock) }
        while flock(lock, LOCK_EX) != 0 {
            guard errno == EINTR else { throw ConfigError(path: path + ".lock", reason: "cannot be locked: \(String(cString: strerror(errno)))") }
        }
        var entries = try load()
        let result = try change(&entries)
        try save(entries)
        return result
    }

    public static func bytes(hex: String) -> [UInt8]? {
        let digits = Array(hex.utf8)
        guard digits.count % 2 == 0 else { return nil }
        var bytes: [UInt8] = []
        for index in stride(from: 0, to: digits.count, by: 2) {
            guard let byte = UInt8(String(decoding: digits[index..<index + 2], as: UTF8.self), radix: 16) else { return nil }
            bytes.append(byte)
        }
        return bytes
    }

    /// Gives the added device `id` a new token (and app, if given); returns the token, which is
    /// kept nowhere, and the entry; nil for a device not in `entries`. `digest` is
    /// `TokenDigest.hex` (SHA-256, in the kit).
    public static func rotate(
        _ id: String, in entries: inout [Entry], app: String? = nil, digest: (String) -> String
    ) -> (token: String, entry: Entry)? {
        guard let index = entries.firstIndex(where: { $0.id == id }) else { return nil }
        let token = newToken()
        entries[index].tokenSHA256 = digest(token)
        if let app { entries[index].app = app }
        return (token, entries[index])
    }

    /// A strong random token: 32 bytes from the system's generator, base64url without padding.
    public static func newToken() -> String {
        var generator = SystemRandomNumberGenerator()
        let bytes = (0..<32).map { _ in UInt8.random(in: 0...255, using: &generator) }
        return Data(bytes).base64EncodedString()
            .replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_").replacingOccurrences(of: "=", with: "")
    }
}

extension DrivebusConfig {
    /// The config's devices followed by the registry's that the config does not name. (A
    /// registry token is 256 random bits: it matches no one else's.)
    public func devices(with entries: [DeviceRegistry.Entry]) -> [Device] {
        let ids = Set(devices.map(\.id))
        var all = devices
        for entry in entries where !ids.contains(entry.id) {
            guard let digest = DeviceRegistry.bytes(hex: entry.tokenSHA256) else { continue }
            all.append(Device(id: entry.id, token: nil, tokenSHA256: digest))
        }
        return all
    }
}
