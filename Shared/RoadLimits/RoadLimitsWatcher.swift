import CDrivebusSupport
import Foundation
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// Keeps the newest speed-limit index of a path loaded: it checks the file every `interval` on a
/// thread of its own (opening an index reads and checks it all, which has no place on Swift's
/// cooperative pool), so `drivebus limits import` takes effect without a restart. A file that
/// fails to open is reported and the index already loaded stays in use.
public final class RoadLimitsWatcher: Sendable {
    public enum Change: Sendable, CustomStringConvertible {
        case loaded(RoadLimitIndex.Summary)
        case removed
        case failed(RoadIndexError)

        public var description: String {
            switch self {
            case .loaded(let s): "loaded \(s.source): \(s.ways) road pieces (\(s.taggedWays) with a maxspeed), \(s.bytes / 1024) KiB"
            case .removed: "the index was removed; no road limits"
            case .failed(let error): "not loaded, the previous index stays in use: \(error)"
            }
        }
    }

    private struct Seen: Equatable {
        var inode: UInt64
        var modifiedS: Int
        var modifiedNs: Int
        var size: Int
    }

    private let state = Mutex<(index: RoadLimitIndex?, seen: Seen?)>((nil, nil))
    private let path: String
    private let onChange: @Sendable (Change) -> Void

    /// Loads the index now (the caller waits: a service does this once, before it replays), then
    /// keeps checking every `interval`.
    public init(path: String, interval: Duration = .seconds(10), onChange: @escaping @Sendable (Change) -> Void) {
        self.path = path
        self.onChange = onChange
        refresh()
        let thread = Thread { [weak self] in
            _ = drivebus_thread_name("road-limits")
            let seconds = Double(interval.components.seconds) + Double(interval.components.attoseconds) / 1e18
            // Holds the watcher only while checking, so that it can go away between checks.
            repeat {
                Thread.sleep(forTimeInterval: max(seconds, 0.05))
            } while self.map { $0.refresh(); return true } ?? false
        }
        thread.start()
    }

    /// The index in use, nil when none has been imported.
    public var current: RoadLimitIndex? { state.withLock { $0.index } }

    /// Whether the index in use is another than `index` (a cheap identity check, for every
    /// message). The caller then sets `current`: only then, since setting the scorer's index
    /// rebuilds its tuning.
    public func differs(from index: RoadLimitIndex?) -> Bool { current !== index }

    private func refresh() {
        var info = stat()
        guard stat(path, &info) == 0 else {
            let had = state.withLock { current -> Bool in
                defer { current = (nil, nil) }
                return current.index != nil
            }
            if had { onChange(.removed) }
            return
        }
        let seen = Seen(inode: UInt64(info.st_ino), modifiedS: Int(info.st_mtim.tv_sec), modifiedNs: Int(info.st_mtim.tv_nsec), size: Int(info.st_size))
        guard state.withLock({ $0.seen != seen }) else { return }
        do {
            let index = try RoadLimitIndex(path: path)
            state.withLock { $0 = (index, seen) }
            onChange(.loaded(index.summary))
        } catch {
            // Not tried again until the file changes.
            state.withLock { $0.seen = seen }
            onChange(.failed(error))
        }
    }
}
