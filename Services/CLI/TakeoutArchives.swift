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

    static let kept: Set<TrackFormat> = [.locationHistory, .ownTracksRecorder, .gpx]

    init(_ files: [String]) throws {
        for file in files {
            guard Self.isZip(file) else {
                inputs.append(Input(path: file, name: file))
                continue
            }
            do {
                let archive = try Archive(url: URL(fileURLWithPath: file), accessMode: .read)
                let folder: URL
                if let made = self.folder {
                    folder = made
                } else {
                    (folder, interrupts) = try Self.makeFolder()
                    self.folder = folder
                }
                var found = 0
                for (index, entry) in archive.enumerated() where entry.type == .file {
                    let lower = entry.path.lowercased()
                    guard lower.hasSuffix(".json") || lower.hasSuffix(".rec") || lower.hasSuffix(".gpx") else { continue }
                    let target = folder.appendingPathComponent("\(inputs.count)-\(index)")
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

    /// The extracted entries go away with the import.
    func remove() {
        interrupts.forEach { $0.cancel() }
        if let folder { try? FileManager.default.removeItem(at: folder) }
    }

    /// Ctrl-C or SIGTERM in the middle of an import: the extracted history goes too, then the
    /// process ends as the signal would have ended it (a `defer` does not run then, and the
    /// history would stay in the temporary folder, in RAM where that is a tmpfs). Installed
    /// before the folder is made, so that no moment of the extraction is left out.
    private static func removeOnInterrupt(_ folder: URL) -> [any DispatchSourceSignal] {
        [SIGINT, SIGTERM].map { number in
            // On Linux, Dispatch installs its own handler for the signal (no SIG_IGN, which would
            // discard it before Dispatch sees it).
            let source = DispatchSource.makeSignalSource(signal: number, queue: .global())
            source.setEventHandler {
                try? FileManager.default.removeItem(at: folder)
                signal(number, SIG_DFL)
                // To the process, not this thread: Dispatch's threads block the signal.
                kill(getpid(), number)
            }
            source.resume()
            return source
        }
    }

    static func isZip(_ path: String) -> Bool {
        guard let handle = FileHandle(forReadingAtPath: path) else { return false }
        defer { try? handle.close() }
        return (try? handle.read(upToCount: 4)) == Data([0x50, 0x4B, 0x03, 0x04])
    }

    /// A folder only this user can read: extracted history is as private as the archive.
    static func makeFolder() throws -> (URL, interrupts: [any DispatchSourceSignal]) {
        let folder = URL(fileURLWithPath: NSTemporaryDirectory()).appendingPathComponent("drivebus-import-\(UUID().uuidString)")
        let interrupts = removeOnInterrupt(folder)
        try FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        return (folder, interrupts)
    }
}
