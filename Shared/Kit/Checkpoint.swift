import Foundation
import Glibc

/// A service's state on disk, `STATE/data/<name>.checkpoint.json`, replaced atomically (write a
/// temporary file, fsync it, rename it over the old one, fsync the directory), so a crash leaves
/// either the old checkpoint or the new one, never half of one.
public struct CheckpointFile: Sendable {
    public let path: String

    public init(layout: StateLayout, name: String) {
        path = "\(layout.dataDir)/\(name).checkpoint.json"
    }

    /// - Parameter userInfo: for states that need context to decode (the geofence engine needs
    ///   its configuration, which is never written to disk because it holds secrets).
    public func load<State: Decodable>(_ type: State.Type, userInfo: [CodingUserInfoKey: any Sendable] = [:]) throws -> State? {
        guard let data = FileManager.default.contents(atPath: path) else { return nil }
        let decoder = JSONDecoder()
        decoder.userInfo = userInfo
        return try decoder.decode(State.self, from: data)
    }

    /// Returns the bytes written.
    @discardableResult
    public func save(_ state: some Encodable) throws -> Int {
        let data = try JSONEncoder().encode(state)
        let temporary = path + ".tmp.\(getpid())"
        let fd = open(temporary, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw POSIXError(POSIXErrorCode(rawValue: errno) ?? .EIO) }
        defer { close(fd) }
        var written = 0
        while written < data.count {
            let n = data.withUnsafeBytes { write(fd, $0.baseAddress! + written, $0.count - written) }
            if n < 0 {
                if errno == EINTR { continue }
                throw POSIXError(POSIXErrorCode(rawValue: errno) ?? .EIO)
            }
            written += n
        }
        guard fsync(fd) == 0, rename(temporary, path) == 0 else { throw POSIXError(POSIXErrorCode(rawValue: errno) ?? .EIO) }
        let directory = open((path as NSString).deletingLastPathComponent, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        if directory >= 0 {
            _ = fsync(directory)
            close(directory)
        }
        return data.count
    }
}

/// How soon a state may be saved again after a save of `bytes`: not before `interval`, and no
/// faster on average than `bytesPerSecond`. A state that holds whole open trips grows with the
/// drive (1.4 MB after five hours of it): saved every second, that was 1.4 MB/s of writes and 3 %
/// of a core, per service, for as long as the drive went on; at 64 KiB/s still 4 MB a minute,
/// which a home server's SD card takes for every hour of driving. A restart replays what came
/// since the save, which is cheap while a phone sends a fix a second; under a flood (an import)
/// `maxMessagesBetweenSaves` bounds it.
public struct CheckpointPacing: Sendable {
    /// A state this small is saved right after the events it produced, whatever the gap: it
    /// costs next to nothing, and it holds what must not be lost (a gate's cooldown).
    public static let promptBytes = 16 << 10

    public var interval: Duration
    public var bytesPerSecond: Int
    /// Messages applied since the last save that make the next one due whatever the gap.
    public var maxMessagesBetweenSaves: UInt64

    public init(interval: Duration = .seconds(1), bytesPerSecond: Int = 16 << 10, maxMessagesBetweenSaves: UInt64 = 200_000) {
        self.interval = interval
        self.bytesPerSecond = bytesPerSecond
        self.maxMessagesBetweenSaves = maxMessagesBetweenSaves
    }

    public func gap(afterSaving bytes: Int) -> Duration {
        max(interval, .milliseconds(Int64(bytes) * 1000 / Int64(max(bytesPerSecond, 1))))
    }

    /// Whether a save is due `since` the last one, of `bytes`, with `messages` applied meanwhile.
    public func isDue(since: Duration, afterSaving bytes: Int, messages: UInt64) -> Bool {
        since >= gap(afterSaving: bytes) || messages >= maxMessagesBetweenSaves
    }
}
