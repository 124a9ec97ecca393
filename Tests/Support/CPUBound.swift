import Foundation

/// Runs a CPU-heavy test's body on a thread of its own instead of Swift's cooperative pool.
///
/// The pool has a thread per core, two here. A test that computes for seconds on it starves the
/// system tests running beside it, whose waits have deadlines: under load, tests that take
/// milliseconds alone waited 22 s for a turn, and a 20 s wait failed. The tests given to this
/// executor take turns on its one thread, so together they never hold more than one core, and
/// task-locals (the current test, for `#expect`) come along. Only a nonisolated caller moves: a
/// body isolated to an actor runs where that actor does.
public func offThePool<T>(_ body: () async throws -> T) async rethrows -> T {
    try await withTaskExecutorPreference(CPUBoundExecutor.shared, operation: body)
}

private final class CPUBoundExecutor: TaskExecutor, @unchecked Sendable {
    static let shared = CPUBoundExecutor()

    private let condition = NSCondition()
    private var jobs: [UnownedJob] = []

    private init() {
        let thread = Thread { [unowned self] in self.run() }
        thread.name = "cpu-bound-tests"
        thread.stackSize = 8 << 20  // a cooperative thread's: the tests recurse as deep there
        thread.start()
    }

    func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        condition.withLock {
            jobs.append(job)
            condition.signal()
        }
    }

    private func run() {
        while true {
            let job = condition.withLock {
                while jobs.isEmpty { condition.wait() }
                return jobs.removeFirst()
            }
            job.runSynchronously(on: asUnownedTaskExecutor())
        }
    }
}
