import CDrivebusSupport
import CZMQ
import Foundation
import HeapModule
import Synchronization

/// The one thread that owns a process's ZeroMQ sockets.
///
/// libzmq sockets are not thread-safe, and their blocking calls must never run on Swift's
/// cooperative pool. So every socket lives on this dedicated thread, which waits in `zmq_poll`
/// on its sockets and on an eventfd. Async code talks to it by queueing commands (`perform`,
/// `send`), and receives messages through `AsyncStream`s fed from this thread. The exception is
/// a publisher's PUB socket (`openPublishingSocket`), which never blocks and is never polled:
/// callers send on it themselves under its lock, and the loop only closes it.
public final class ZMQLoop: Sendable {
    public struct SocketID: Hashable, Sendable {
        let raw: Int
    }

    public enum LoopError: Error, Sendable {
        /// The loop has shut down; nothing more can run on it.
        case stopped
    }

    private enum Command: Sendable {
        /// `nil` is passed when the loop stopped before the command could run.
        case run(@Sendable (IO?) -> Void)
        case send(SocketID, ZMQMessage)
        case stop
    }

    private struct Queue {
        var commands: [Command] = []
        var accepting = true
        var exited = false
        var exitWaiters: [@Sendable () -> Void] = []
    }

    public let context: ZMQContext
    public let name: String
    private let queue = Mutex(Queue())
    private let wakeFD: Int32
    private let droppedSends = Atomic<Int>(0)

    /// Starts the I/O thread.
    public init(name: String, context: ZMQContext = ZMQContext()) {
        self.name = name
        self.context = context
        let fd = drivebus_eventfd()
        precondition(fd >= 0, "eventfd failed: errno \(errno)")
        wakeFD = fd
        let thread = Thread { [self] in
            _ = drivebus_thread_name("zmq-\(name)")
            runLoop()
        }
        thread.start()
    }

    deinit { close(wakeFD) }

    /// Messages that could not be sent because a queue was full or the socket was gone. PUB sockets
    /// drop at their high-water mark by design; subscribers recover by replay.
    public var droppedSendCount: Int { droppedSends.load(ordering: .relaxed) }

    // MARK: Commands

    /// Runs `body` on the I/O thread and returns its result.
    public func perform<T: Sendable>(_ body: @escaping @Sendable (IO) throws -> T) async throws -> T {
        try await withCheckedThrowingContinuation { continuation in
            enqueue(.run { io in
                guard let io else { return continuation.resume(throwing: LoopError.stopped) }
                continuation.resume(with: Result { try body(io) })
            })
        }
    }

    /// Runs `body` on the I/O thread without waiting; it is dropped if the loop has stopped.
    public func execute(_ body: @escaping @Sendable (IO) -> Void) {
        enqueue(.run { io in if let io { body(io) } })
    }

    /// Runs `body` on the I/O thread, or with `nil` if the loop has stopped, so that callers
    /// waiting on a continuation are always resumed.
    func executeOrFail(_ body: @escaping @Sendable (IO?) -> Void) {
        enqueue(.run(body))
    }

    /// Queues `message` for sending on socket `id`, without waiting.
    public func send(_ message: ZMQMessage, on id: SocketID) {
        enqueue(.send(id, message))
    }

    /// Closes every socket, finishes every stream and ends the thread.
    public func shutdown() async {
        await withCheckedContinuation { continuation in
            whenExited { continuation.resume() }
        }
    }

    /// Like `shutdown()`, for code that is not async. Never call it on the cooperative pool.
    public func shutdownAndWait() {
        let done = DispatchSemaphore(value: 0)
        whenExited { done.signal() }
        done.wait()
    }

    private func whenExited(_ waiter: @escaping @Sendable () -> Void) {
        let runNow = queue.withLock { queue -> Bool in
            if queue.exited { return true }
            queue.exitWaiters.append(waiter)
            if queue.accepting {
                queue.accepting = false
                queue.commands.append(.stop)
            }
            return false
        }
        if runNow { waiter() } else { wake() }
    }

    private func enqueue(_ command: Command) {
        let (accepted, wasEmpty) = queue.withLock { queue -> (Bool, Bool) in
            guard queue.accepting else { return (false, false) }
            queue.commands.append(command)
            return (true, queue.commands.count == 1)
        }
        guard accepted else {
            if case .run(let body) = command { body(nil) }
            return
        }
        // One wake-up per batch: the loop drains the eventfd before taking the queue, so a
        // command added to a non-empty queue is always seen.
        if wasEmpty { wake() }
    }

    private func wake() {
        _ = drivebus_eventfd_signal(wakeFD)
    }

    // MARK: The I/O thread

    private func runLoop() {
        let io = IO(context: context)
        var items: [zmq_pollitem_t] = []
        var polled: [SocketID] = []
        var running = true
        while running {
            if io.pollSetChanged {
                (items, polled) = io.pollItems(wakeFD: wakeFD)
            }
            let rc = zmq_poll(&items, Int32(items.count), io.millisecondsUntilNextTimer())
            if rc < 0 {
                let errno = zmq_errno()
                if errno == EINTR { continue }
                break  // ETERM: the context is shutting down.
            }
            if items[0].revents & Int16(ZMQ_POLLIN) != 0 {
                _ = drivebus_eventfd_drain(wakeFD)
                let commands = queue.withLock { queue -> [Command] in
                    defer { queue.commands.removeAll(keepingCapacity: true) }
                    return queue.commands
                }
                for command in commands {
                    switch command {
                    case .run(let body): body(io)
                    case .send(let id, let message): send(message, on: id, io)
                    case .stop: running = false
                    }
                }
            }
            guard running else { break }
            for (index, id) in polled.enumerated() where items[index + 1].revents & Int16(ZMQ_POLLIN) != 0 {
                io.readable(id)
            }
            io.fireDueTimers()
        }
        io.closeAll()
        let (leftover, waiters) = queue.withLock { queue in
            queue.accepting = false
            queue.exited = true
            defer { queue.commands = []; queue.exitWaiters = [] }
            return (queue.commands, queue.exitWaiters)
        }
        for case .run(let body) in leftover { body(nil) }
        for waiter in waiters { waiter() }
    }

    private func send(_ message: ZMQMessage, on id: SocketID, _ io: IO) {
        guard let socket = io.socket(id), (try? socket.send(message)) == true else {
            droppedSends.add(1, ordering: .relaxed)
            return
        }
    }

    /// The loop's state, usable only on its I/O thread (inside `perform` and `execute` bodies and
    /// the callbacks they register).
    public final class IO {
        public let context: ZMQContext

        private struct Entry {
            let socket: ZMQSocket
            let onReadable: ((ZMQSocket) -> Void)?
            let onClose: (() -> Void)?
        }

        /// Ordered by deadline, then by when it was scheduled.
        private struct Timer: Comparable {
            let deadline: ContinuousClock.Instant
            let order: Int
            let action: () -> Void

            static func < (a: Timer, b: Timer) -> Bool { (a.deadline, a.order) < (b.deadline, b.order) }
            static func == (a: Timer, b: Timer) -> Bool { (a.deadline, a.order) == (b.deadline, b.order) }
        }

        private var entries: [SocketID: Entry] = [:]
        /// Sockets that other threads send on; the loop only closes them.
        private var sendingSockets: [ZMQSendingSocket] = []
        private var nextID = 0
        /// A heap: every request leaves its timeout here until it is due, a busy replaying
        /// consumer hundreds, and the loop asks for the earliest on every poll.
        private var timers = Heap<Timer>()
        private var timersScheduled = 0
        fileprivate var pollSetChanged = true

        init(context: ZMQContext) { self.context = context }

        /// Hands `socket` to the loop. `onReadable` runs whenever it has a message waiting and
        /// should drain it (a bounded number of messages keeps other sockets served); `onClose`
        /// runs when the socket is closed, at the latest when the loop stops.
        public func register(
            _ socket: ZMQSocket,
            onReadable: ((ZMQSocket) -> Void)? = nil,
            onClose: (() -> Void)? = nil
        ) -> SocketID {
            nextID += 1
            let id = SocketID(raw: nextID)
            entries[id] = Entry(socket: socket, onReadable: onReadable, onClose: onClose)
            if onReadable != nil { pollSetChanged = true }
            return id
        }

        public func socket(_ id: SocketID) -> ZMQSocket? { entries[id]?.socket }

        func closeWhenStopping(_ socket: ZMQSendingSocket) { sendingSockets.append(socket) }

        public func close(_ id: SocketID) {
            guard let entry = entries.removeValue(forKey: id) else { return }
            if entry.onReadable != nil { pollSetChanged = true }
            entry.socket.close()
            entry.onClose?()
        }

        /// Runs `action` on the I/O thread after `delay`.
        public func schedule(after delay: Duration, _ action: @escaping () -> Void) {
            timersScheduled += 1
            timers.insert(Timer(deadline: .now + delay, order: timersScheduled, action: action))
        }

        fileprivate func pollItems(wakeFD: Int32) -> ([zmq_pollitem_t], [SocketID]) {
            pollSetChanged = false
            let polled = entries.filter { $0.value.onReadable != nil }.map(\.key)
            var items = [zmq_pollitem_t(socket: nil, fd: wakeFD, events: Int16(ZMQ_POLLIN), revents: 0)]
            for id in polled {
                items.append(zmq_pollitem_t(socket: entries[id]!.socket.rawHandle, fd: 0, events: Int16(ZMQ_POLLIN), revents: 0))
            }
            return (items, polled)
        }

        fileprivate func readable(_ id: SocketID) {
            // A callback may have closed this socket earlier in the same round.
            guard let entry = entries[id] else { return }
            entry.onReadable?(entry.socket)
        }

        fileprivate func millisecondsUntilNextTimer() -> Int {
            guard let next = timers.min?.deadline else { return -1 }
            let remaining = ContinuousClock.now.duration(to: next)
            if remaining <= .zero { return 0 }
            let (seconds, attoseconds) = remaining.components
            return Int(seconds) * 1000 + Int(attoseconds / 1_000_000_000_000_000) + 1
        }

        fileprivate func fireDueTimers() {
            guard !timers.isEmpty else { return }
            let now = ContinuousClock.now
            // Those due now, taken out before any runs: an action may schedule another.
            var due: [Timer] = []
            while let first = timers.min, first.deadline <= now { due.append(timers.removeMin()) }
            for timer in due { timer.action() }
        }

        fileprivate func closeAll() {
            for id in Array(entries.keys) { close(id) }
            for socket in sendingSockets { socket.close() }
            sendingSockets = []
            timers = Heap()
        }
    }
}
