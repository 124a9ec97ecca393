import DrivebusKit
import Foundation
import Testing

/// A fresh directory under /tmp with a short path, so ipc socket paths stay under 107 bytes.
final class TempDir {
    let path: String

    init() {
        var template = Array("/tmp/dbt-XXXXXX".utf8CString)
        path = template.withUnsafeMutableBufferPointer { String(cString: mkdtemp($0.baseAddress!)!) }
    }

    func file(_ name: String, _ contents: String) -> String {
        let full = path + "/" + name
        _ = FileManager.default.createFile(atPath: full, contents: Data(contents.utf8))
        return full
    }

    deinit { try? FileManager.default.removeItem(atPath: path) }
}

/// Where the built executables are: `$DRIVEBUS_BIN_DIR`, or beside the test bundle, which is
/// where `swift build` puts them.
let binDirectory: String = {
    if let dir = ProcessInfo.processInfo.environment["DRIVEBUS_BIN_DIR"] { return dir }
    let exe = (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")) ?? CommandLine.arguments[0]
    var url = URL(fileURLWithPath: exe).deletingLastPathComponent()
    // The bundle may be a directory (macOS-style) or the executable itself (Linux).
    while !FileManager.default.isExecutableFile(atPath: url.appendingPathComponent("drivebus").path) && url.path != "/" {
        url.deleteLastPathComponent()
    }
    return url.path
}()

/// A child process with captured output.
final class Child: @unchecked Sendable {
    let process = Process()
    private let out = Pipe()
    private let err = Pipe()
    private let lock = NSLock()
    private var stdoutData = Data()
    private var stderrData = Data()

    init(_ executable: String, _ arguments: [String], cwd: String? = nil, environment: [String: String]? = nil) throws {
        process.executableURL = URL(fileURLWithPath: binDirectory + "/" + executable)
        process.arguments = arguments
        if let cwd { process.currentDirectoryURL = URL(fileURLWithPath: cwd) }
        if let environment { process.environment = environment }
        process.standardOutput = out
        process.standardError = err
        out.fileHandleForReading.readabilityHandler = { [weak self] handle in
            let data = handle.availableData
            self?.lock.withLock { self?.stdoutData.append(data) }
        }
        err.fileHandleForReading.readabilityHandler = { [weak self] handle in
            let data = handle.availableData
            self?.lock.withLock { self?.stderrData.append(data) }
        }
        try process.run()
    }

    var pid: Int32 { process.processIdentifier }
    var stdout: String { lock.withLock { String(decoding: stdoutData, as: UTF8.self) } }
    var stderr: String { lock.withLock { String(decoding: stderrData, as: UTF8.self) } }

    func signal(_ signal: Int32) { kill(process.processIdentifier, signal) }

    /// Waits for the process to exit, polling so no thread is blocked.
    func exitStatus(within timeout: Duration = .seconds(30)) async throws -> Int32 {
        let deadline = ContinuousClock.now + timeout
        while process.isRunning {
            guard ContinuousClock.now < deadline else {
                Issue.record("\(process.executableURL!.lastPathComponent) did not exit within \(timeout); stderr:\n\(stderr)")
                signal(SIGKILL)
                throw CancellationError()
            }
            try await Task.sleep(for: .milliseconds(20))
        }
        // Let the readability handlers take the last bytes.
        try await Task.sleep(for: .milliseconds(50))
        return process.terminationStatus
    }

    deinit {
        if process.isRunning { kill(process.processIdentifier, SIGKILL) }
    }
}

/// Runs a command to completion.
func run(_ executable: String, _ arguments: [String], cwd: String? = nil, environment: [String: String]? = nil) async throws -> (status: Int32, stdout: String, stderr: String) {
    let child = try Child(executable, arguments, cwd: cwd, environment: environment)
    let status = try await child.exitStatus()
    return (status, child.stdout, child.stderr)
}

/// True while `pid` is a live process (a zombie left for a reaper counts as gone).
func isAlive(_ pid: Int32) -> Bool {
    guard let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8) else { return false }
    // The state is the field after the parenthesised command name.
    guard let close = stat.lastIndex(of: ")") else { return false }
    let state = stat[stat.index(close, offsetBy: 2)]
    return state != "Z" && state != "X"
}

/// Polls `condition` until it holds or `timeout` passes.
func eventually(within timeout: Duration = .seconds(10), _ condition: () async throws -> Bool) async rethrows -> Bool {
    let deadline = ContinuousClock.now + timeout
    while ContinuousClock.now < deadline {
        if try await condition() { return true }
        try? await Task.sleep(for: .milliseconds(50))
    }
    return try await condition()
}
