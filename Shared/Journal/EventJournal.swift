import DequeModule
import DrivebusSchema
import Foundation
import Glibc
import Synchronization

/// A service's journal of the events it derived: trips, scores, zone crossings, gate calls,
/// check-outs. Whatever a service publishes that another depends on is appended here first, so a
/// consumer that was down (stats, above all) replays what it missed instead of losing it.
///
/// One JSON object per line, `{"seq":N,"type":…,"device":…,"id":…,"time":…,"payload":{…}}`,
/// seqs 1, 2, 3… with no gaps across restarts. Readable with `tail`, and a torn last line (a
/// crash mid-write) is cut off when the journal is opened. Appends are written and synced on a
/// queue of their own, never on Swift's cooperative pool.
public final class EventJournal: Sendable {
    public enum Failure: Error, Sendable, Equatable, CustomStringConvertible {
        case io(String)
        case corrupt(String)
        case invalid(String)

        public var description: String {
            switch self {
            case .io(let why): "event journal write failed: \(why)"
            case .corrupt(let why): "event journal is corrupt: \(why)"
            case .invalid(let why): "event not journaled: \(why)"
            }
        }
    }

    /// Ids of this many recent events are remembered: an event derived again after a restart
    /// (the work after the last checkpoint is redone) is not journaled twice. Consumers
    /// deduplicate by id as well, so the window only has to cover one checkpoint interval.
    public static let recentIDs = 4096

    private struct State {
        var offsets: [Int64] = []  // offsets[seq - 1] is where event `seq` starts
        var end: Int64 = 0
        var recent: Deque<String> = []  // the last `recentIDs` ids, oldest first
        var recentSet: Set<String> = []
        var lastSeq: UInt64 { UInt64(offsets.count) }

        mutating func remember(_ id: String) {
            if recent.count == EventJournal.recentIDs { recentSet.remove(recent.removeFirst()) }
            recent.append(id)
            recentSet.insert(id)
        }
    }

    public let path: String
    private let fd: Int32
    private let state: Mutex<State>
    private let queue: DispatchQueue

    /// Opens (or creates) the journal at `path` and cuts off a torn last line.
    public init(path: String) throws(Failure) {
        self.path = path
        let fd = open(path, O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw .io("cannot open \(path): \(String(cString: strerror(errno)))") }
        var state = State()
        do throws(Failure) {
            try Self.scan(fd: fd) { (offset, event) throws(Failure) in
                guard event.seq == state.lastSeq + 1 else {
                    throw .corrupt("\(path): event seq \(event.seq) follows \(state.lastSeq)")
                }
                state.offsets.append(offset)
                state.remember(event.id)
            } end: { state.end = $0 }
        } catch {
            close(fd)
            throw error
        }
        if ftruncate(fd, off_t(state.end)) != 0 {
            close(fd)
            throw .io("cannot cut the torn tail of \(path): \(String(cString: strerror(errno)))")
        }
        self.fd = fd
        self.state = Mutex(state)
        queue = DispatchQueue(label: "drivebus.event-journal")
    }

    deinit { close(fd) }

    public var lastSeq: UInt64 { state.withLock { $0.lastSeq } }

    /// Appends the events whose ids are not among the recent ones, syncs, and returns them with
    /// their seqs, in order. Nothing is returned unless it is on disk.
    public func append(_ events: [DerivedEvent], time: Date) async throws(Failure) -> [LoggedEvent] {
        let result: Result<[LoggedEvent], Failure> = await withCheckedContinuation { continuation in
            queue.async { continuation.resume(returning: self.appendNow(events, time: time)) }
        }
        return try result.get()
    }

    private func appendNow(_ events: [DerivedEvent], time: Date) -> Result<[LoggedEvent], Failure> {
        state.withLock { state in
            var bytes: [UInt8] = []
            var logged: [LoggedEvent] = []
            var starts: [Int] = []  // where each line starts in `bytes`
            var ids = Set<String>()
            for event in events where !state.recentSet.contains(event.id) && ids.insert(event.id).inserted {
                guard Topic.isValidType(event.type), event.device.map(DeviceID.isValid) ?? true, LoggedEvent.isValidID(event.id) else {
                    return .failure(.invalid("type \(event.type.debugDescription), device or id \(event.id.debugDescription) is not valid"))
                }
                let entry = LoggedEvent(
                    seq: state.lastSeq + UInt64(logged.count) + 1, type: event.type, device: event.device, id: event.id, time: time,
                    payload: event.payload)
                starts.append(bytes.count)
                entry.writeLine(to: &bytes)
                logged.append(entry)
            }
            guard !logged.isEmpty else { return .success([]) }
            let written = bytes.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
            guard written == bytes.count, fdatasync(fd) == 0 else {
                let reason = String(cString: strerror(errno))
                // A partial line would be cut off at the next open; cut it now so the next
                // append starts on a line of its own.
                _ = ftruncate(fd, off_t(state.end))
                return .failure(.io("\(path): \(reason)"))
            }
            for (entry, start) in zip(logged, starts) {
                state.offsets.append(state.end + Int64(start))
                state.remember(entry.id)
            }
            state.end += Int64(bytes.count)
            return .success(logged)
        }
    }

    /// Up to `limit` events from `fromSeq` on, in order, read on the journal's queue.
    public func read(fromSeq: UInt64, limit: Int) async throws(Failure) -> [LoggedEvent] {
        let result: Result<[LoggedEvent], Failure> = await withCheckedContinuation { continuation in
            queue.async {
                do throws(Failure) {
                    continuation.resume(returning: .success(try self.readNow(fromSeq: fromSeq, limit: limit)))
                } catch {
                    continuation.resume(returning: .failure(error))
                }
            }
        }
        return try result.get()
    }

    /// Up to `limit` events from `fromSeq` on, in order.
    public func readNow(fromSeq: UInt64, limit: Int) throws(Failure) -> [LoggedEvent] {
        let range: (start: Int64, end: Int64)? = state.withLock { state in
            guard fromSeq >= 1, fromSeq <= state.lastSeq else { return nil }
            let last = min(state.lastSeq, fromSeq + UInt64(max(limit, 1)) - 1)
            return (state.offsets[Int(fromSeq - 1)], last < state.lastSeq ? state.offsets[Int(last)] : state.end)
        }
        guard let (start, end) = range else { return [] }
        guard end > start else { return [] }
        var buffer = [UInt8](repeating: 0, count: Int(end - start))
        let count = buffer.withUnsafeMutableBytes { pread(fd, $0.baseAddress, $0.count, off_t(start)) }
        guard count == buffer.count else { throw .io("\(path): short read at \(start)") }
        var events: [LoggedEvent] = []
        var lineStart = 0
        for index in buffer.indices where buffer[index] == UInt8(ascii: "\n") {
            guard let event = LoggedEvent(line: buffer[lineStart..<index]) else {
                throw .corrupt("\(path): unreadable line at byte \(start + Int64(lineStart))")
            }
            events.append(event)
            lineStart = index + 1
        }
        return events
    }

    /// Reads every complete line; what follows the last newline is a torn tail, where the file
    /// is cut.
    private static func scan(
        fd: Int32, _ body: (Int64, LoggedEvent) throws(Failure) -> Void, end: (Int64) -> Void
    ) throws(Failure) {
        var offset: Int64 = 0
        var carry: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 1 << 20)
        var readAt: Int64 = 0
        while true {
            let count = chunk.withUnsafeMutableBytes { pread(fd, $0.baseAddress, $0.count, off_t(readAt)) }
            guard count >= 0 else { throw .io("read failed: \(String(cString: strerror(errno)))") }
            if count == 0 { break }
            readAt += Int64(count)
            carry += chunk[0..<count]
            var lineStart = 0
            while let newline = carry[lineStart...].firstIndex(of: UInt8(ascii: "\n")) {
                // Only the last line can be torn, and a torn line has no newline yet.
                guard let event = LoggedEvent(line: carry[lineStart..<newline]) else {
                    throw .corrupt("unreadable line at byte \(offset)")
                }
                try body(offset, event)
                offset += Int64(newline - lineStart + 1)
                lineStart = newline + 1
            }
            carry.removeFirst(lineStart)
        }
        end(offset)
    }
}
