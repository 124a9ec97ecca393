import DrivebusTrackFormats
import Foundation
import IngestCore
import ZIPFoundation

/// The files to import, with the `.zip` archives among them (a Google Takeout download) opened:
/// each entry that holds a location history, an OwnTracks Recorder file or a GPX track, by its
/// content, is extracted into a private temporary folder and imported as
/// `takeout.zip!Takeout/Location History/Records.json`. Other entries (settings, photos) are
/// skipped.
struct TakeoutArchives {
    struct Input {
        /// Where to read it.
        var path: String
        /// How to name it in messages.
        var name: String
    }

    private(set) var inputs: [Input] = []
    /// An archive could not be opened or read.
    private(set) var failed = false
    private var folder: URL?
    /// Remove the folder on SIGINT or SIGTERM (`removeOnInterrupt`); cancelled by `remove`.
    private var interrupts: [any DispatchSourceSignal] = []
    /// Held while an entry is extracted, and by an interrupt until the process ends: the folder
    /// goes only while nothing writes into it (extracting makes it again if it is gone).
    private let extracting = NSLock()

    static let kept: Set<TrackFormat> = [.locationHistory, .ownTracksRecorder, .gpx]

    init(_ files: [String]) throws {
        let planned = URL(fileURLWithPath: NSTemporaryDirectory()).appendingPathComponent("drivebus-import-\(UUID().uuidString)")
        for file in files {
            guard Self.isZip(file) else {
                inputs.append(Input(path: file, name: file))
                continue
            }
            do {
                let archive = try Archive(url: URL(fileURLWithPath: file), accessMode: .read)
                // The handlers come before the folder, so that no moment of the extraction is
                // left out; made once, as Dispatch's handler stays installed for good.
                if interrupts.isEmpty { interrupts = Self.removeOnInterrupt(planned, extracting: extracting) }
                if folder == nil {
                    // Under the lock too: an interrupt that came first must not find no folder,
                    // and then have it made just before the process ends.
                    extracting.lock()
                    defer { extracting.unlock() }
                    // Only this user can read it: extracted history is as private as the archive.
                    try FileManager.default.createDirectory(at: planned, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
                    folder = planned
                }
                var found = 0
                for (index, entry) in archive.enumerated() where entry.type == .file {
                    let lower = entry.path.lowercased()
                    guard lower.hasSuffix(".json") || lower.hasSuffix(".rec") || lower.hasSuffix(".gpx") else { continue }
                    let target = planned.appendingPathComponent("\(inputs.count)-\(index)")
                    extracting.lock()
                    defer { extracting.unlock() }
                    _ = try archive.extract(entry, to: target)
                    guard let format = try? TrackFiles.format(ofFile: target.path), Self.kept.contains(format) else {
                        try? FileManager.default.removeItem(at: target)
                        continue
                    }
                    inputs.append(Input(path: target.path, name: "\(file)!\(entry.path)"))
                    found += 1
                }
                if found == 0 { print("\(file): no location history, OwnTracks Recorder file or GPX track in the archive") }
            } catch {
                print("\(file): cannot read the archive: \(error)")
                failed = true
            }
        }
    }

    /// The extracted entries go away with the import. An interrupt meanwhile removes them too,
    /// and ends the process as the signal would.
    func remove() {
        if let folder { try? FileManager.default.removeItem(at: folder) }
        interrupts.forEach { $0.cancel() }
    }

    /// Ctrl-C or SIGTERM in the middle of an import: the extracted history goes too, then the
    /// process ends as the signal would have ended it (a `defer` does not run then, and the
    /// history would stay in the temporary folder, in RAM where that is a tmpfs). An entry
    /// being extracted is finished first (`extracting`).
    private static func removeOnInterrupt(_ folder: URL, extracting: NSLock) -> [any DispatchSourceSignal] {
        let sources = interruptions.map { number in
            // On Linux, Dispatch installs its own handler for the signal (no SIG_IGN, which would
            // discard it before Dispatch sees it).
            let source = DispatchSource.makeSignalSource(signal: number, queue: .global())
            source.setEventHandler {
                extracting.lock()  // never given back: the signal below ends the process
                try? FileManager.default.removeItem(at: folder)
                signal(number, SIG_DFL)
                // To this thread, unblocked here (Dispatch's threads block it): sent to the process,
                // it could find every thread blocking it for a moment and wait in the queue that
                // Dispatch's signalfd reads, running this handler again instead of ending.
                var only = sigset_t()
                sigemptyset(&only)
                sigaddset(&only, number)
                pthread_sigmask(SIG_UNBLOCK, &only, nil)
                pthread_kill(pthread_self(), number)
            }
            source.resume()
            return source
        }
        waitUntilHandled(interruptions)
        return sources
    }

    /// The signals that end an import early: Ctrl-C, and a stop by a service manager.
    private static let interruptions = [SIGINT, SIGTERM]

    /// Waits until Dispatch's handler is installed for each of `signals`. `resume` only asks
    /// Dispatch's manager thread to install it, so a signal sent at once (the folder is already
    /// there to see) would still end the process with the default action, leaving the history
    /// behind. This is libdispatch on Linux (glibc's `sigaction`); patience is bounded, two
    /// seconds on a starved machine, after which the import goes on as it did before this wait.
    private static func waitUntilHandled(_ signals: [Int32]) {
        let deadline = DispatchTime.now() + .seconds(2)
        func installed(_ number: Int32) -> Bool {
            var action = sigaction()
            sigaction(number, nil, &action)
            return action.__sigaction_handler.sa_handler != nil  // SIG_DFL is the null pointer
        }
        while !signals.allSatisfy(installed), DispatchTime.now() < deadline { usleep(100) }
    }

    static func isZip(_ path: String) -> Bool {
        guard let handle = FileHandle(forReadingAtPath: path) else { return false }
        defer { try? handle.close() }
        return (try? handle.read(upToCount: 4)) == Data([0x50, 0x4B, 0x03, 0x04])
    }
}
