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
        /// The earliest `LoggedEvent.expiry` of the events that are not stand-ins (a lower bound);
        /// nil when there are none. Unknown (`.none`) until a removal has read the whole file,
        /// after which appends keep it: a daily `expire` with nothing to do reads nothing.
        var oldestLive: Date??
        var lastSeq: UInt64 { UInt64(offsets.count) }

        mutating func remember(_ id: String) {
            if recent.count == EventJournal.recentIDs { recentSet.remove(recent.removeFirst()) }
            recent.append(id)
            recentSet.insert(id)
        }
    }

    public let path: String
    /// The open file. Replaced by `remove`; every read and write runs on `queue`, as does that.
    private let file: Mutex<Int32>
    private var fd: Int32 { file.withLock { $0 } }
    private let state: Mutex<State>
    private let queue: DispatchQueue

    /// Opens (or creates) the journal at `path` and cuts off a torn last line.
    public init(path: String) throws(Failure) {
        self.path = path
        let fd = open(path, O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw .io("cannot open \(path): \(String(cString: strerror(errno)))") }
        var state = State()
        do throws(Failure) {
            try Self.scan(fd: fd) { (offset, _, event) throws(Failure) in
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
        file = Mutex(fd)
        self.state = Mutex(state)
        queue = DispatchQueue(label: "drivebus.event-journal")
    }

    deinit { close(fd) }

    public var lastSeq: UInt64 { state.withLock { $0.lastSeq } }

    /// Appends the events whose ids are not among the recent ones, syncs, and returns them with
    /// their seqs, in order. Nothing is returned unless it is on disk.
    public func append(_ events: [DerivedEvent], time: Date) async throws(Failure) -> [LoggedEvent] {
        try await onQueue { () throws(Failure) in try self.appendNow(events, time: time).get() }
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
                // Its expiry is at least its time, now: no need to read its payload here.
                if case .some(let oldest) = state.oldestLive { state.oldestLive = .some(min(oldest ?? .distantFuture, entry.time)) }
            }
            state.end += Int64(bytes.count)
            return .success(logged)
        }
    }

    /// Up to `limit` events from `fromSeq` on, in order, read on the journal's queue.
    public func read(fromSeq: UInt64, limit: Int) async throws(Failure) -> [LoggedEvent] {
        try await onQueue { () throws(Failure) in try self.readNow(fromSeq: fromSeq, limit: limit) }
    }

    /// Up to `limit` events from `fromSeq` on, in order. On the queue only: a removal swaps the file.
    private func readNow(fromSeq: UInt64, limit: Int) throws(Failure) -> [LoggedEvent] {
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

    /// What `remove` did.
    public struct Removal: Sendable, Equatable {
        /// Events that became stand-ins.
        public var events = 0
        public var bytesBefore: Int64 = 0
        public var bytesAfter: Int64 = 0
    }

    /// Replaces `device`'s events about `from...to` (by the times in their payloads,
    /// `LoggedEvent.span`) with stand-ins of the same seq, id and time: type `removed`, payload
    /// `{"removed":"<type>"}`. The journal stays numbered 1, 2, 3…, a follower's position stays
    /// valid, and an event derived again is still known by its id and not journaled twice.
    ///
    /// The file is written again beside the old one (`.rewrite`, synced) and renamed over it, on
    /// the journal's queue: appends and reads wait meanwhile, and a crash leaves the old file or
    /// the new one (a leftover `.rewrite` is overwritten by the next removal).
    public func remove(device: String, from: Date, to: Date) async throws(Failure) -> Removal {
        try await onQueue { () throws(Failure) in
            try self.removeNow { event in event.device == device && event.span?.overlaps(from...to) == true }
        }
    }

    /// Retention: every event whose `LoggedEvent.expiry` is before `cutoff` becomes a stand-in,
    /// as with `remove`. Reads the file only when something may have expired.
    public func expire(before cutoff: Date) async throws(Failure) -> Removal {
        try await onQueue { () throws(Failure) in
            if case .some(let oldest) = self.state.withLock({ $0.oldestLive }), (oldest ?? .distantFuture) >= cutoff {
                let size = self.state.withLock { $0.end }
                return Removal(bytesBefore: size, bytesAfter: size)
            }
            return try self.removeNow { event in event.expiry < cutoff }
        }
    }

    /// Every file operation runs on the journal's queue, never on Swift's cooperative pool.
    private func onQueue<T: Sendable>(_ body: @escaping @Sendable () throws(Failure) -> T) async throws(Failure) -> T {
        let result: Result<T, Failure> = await withCheckedContinuation { continuation in
            queue.async { continuation.resume(returning: Result(catching: body)) }
        }
        return try result.get()
    }

    /// Rewrites the file with the events `matches` picks (stand-ins never) replaced by stand-ins.
    private func removeNow(_ matches: (LoggedEvent) -> Bool) throws(Failure) -> Removal {
        let oldFD = fd
        let rewrite = path + ".rewrite"
        let out = open(rewrite, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
        guard out >= 0 else { throw .io("cannot create \(rewrite): \(String(cString: strerror(errno)))") }
        var removal = Removal()
        var offsets: [Int64] = []
        var pending: [UInt8] = []
        var written: Int64 = 0
        var oldestLive: Date?
        func flush() throws(Failure) {
            if let error = pending.withUnsafeBytes({ writeFully(out, $0) }) { throw .io("\(rewrite): \(String(cString: strerror(error)))") }
            written += Int64(pending.count)
            pending.removeAll(keepingCapacity: true)
        }
        do throws(Failure) {
            try Self.scan(fd: oldFD) { (_, line, event) throws(Failure) in
                offsets.append(written + Int64(pending.count))
                if event.type != LoggedEvent.removedType, matches(event) {
                    LoggedEvent(seq: event.seq, type: LoggedEvent.removedType, device: event.device, id: event.id, time: event.time,
                                payload: Array(#"{"removed":"\#(event.type)"}"#.utf8)).writeLine(to: &pending)
                    removal.events += 1
                } else {
                    if event.type != LoggedEvent.removedType { oldestLive = min(oldestLive ?? .distantFuture, event.expiry) }
                    pending.append(contentsOf: line)
                    pending.append(UInt8(ascii: "\n"))
                }
                if pending.count >= 1 << 20 { try flush() }
            } end: { removal.bytesBefore = $0 }
            try flush()
            guard removal.events > 0 else {
                close(out)
                unlink(rewrite)
                removal.bytesAfter = removal.bytesBefore
                state.withLock { $0.oldestLive = .some(oldestLive) }
                return removal
            }
            guard fsync(out) == 0 else { throw .io("\(rewrite): \(String(cString: strerror(errno)))") }
        } catch {
            close(out)
            unlink(rewrite)
            throw error
        }
        close(out)
        let newFD = open(rewrite, O_RDWR | O_APPEND | O_CLOEXEC)
        guard newFD >= 0, rename(rewrite, path) == 0 else {
            let reason = String(cString: strerror(errno))
            if newFD >= 0 { close(newFD) }
            unlink(rewrite)
            throw .io("cannot replace \(path): \(reason)")
        }
        syncDirectory(of: path)
        file.withLock { $0 = newFD }
        state.withLock { state in
            state.offsets = offsets
            state.end = written
            state.oldestLive = .some(oldestLive)
        }
        close(oldFD)
        removal.bytesAfter = written
        return removal
    }

    /// Reads every complete line; what follows the last newline is a torn tail, where the file
    /// is cut.
    private static func scan(
        fd: Int32, _ body: (Int64, ArraySlice<UInt8>, LoggedEvent) throws(Failure) -> Void, end: (Int64) -> Void
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
                try body(offset, carry[lineStart..<newline], event)
                offset += Int64(newline - lineStart + 1)
                lineStart = newline + 1
            }
            carry.removeFirst(lineStart)
        }
        end(offset)
    }
}

extension LoggedEvent {
    /// The payload's fields that say when what it describes happened.
    static let timeFields = ["time", "start_time", "end_time", "checkin_time", "checkout_time", "last_time"]

    /// When what the event describes happened, from its payload's times (a trip's start to its
    /// end, a crossing's moment); nil if it names none. Not `time`, which is when it was derived.
    public var span: ClosedRange<Date>? {
        guard case .object(let object)? = try? JSONValue.parse(payload) else { return nil }
        let times = Self.timeFields.compactMap { field -> Date? in
            guard case .string(let text)? = object[field] else { return nil }
            return RFC3339.parse(text)
        }
        guard let first = times.min(), let last = times.max() else { return nil }
        return first...last
    }

    /// What retention goes by: the later of when what it describes ended (its span's end) and
    /// when it was derived. An event derived today about last year (an import) stays for the
    /// retention's length from today, so a consumer that was down has that long to read it.
    public var expiry: Date { max(span?.upperBound ?? time, time) }
}
