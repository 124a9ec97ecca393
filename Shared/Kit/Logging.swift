import Logging
import Synchronization

public enum DrivebusLogging {
    private static let bootstrapped = Mutex(false)

    /// Logs go to standard error, where systemd's journal or `drivebus up` collects them. Safe to
    /// call more than once; only the first call counts.
    public static func bootstrap(level: Logger.Level) {
        let first = bootstrapped.withLock { done in
            defer { done = true }
            return !done
        }
        guard first else { return }
        LoggingSystem.bootstrap { label in
            var handler = StreamLogHandler.standardError(label: label)
            handler.logLevel = level
            return handler
        }
    }
}
