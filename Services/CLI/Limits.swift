import ArgumentParser
import DrivebusConfiguration
import DrivebusKit
import DrivebusOSM
import DrivebusRoadLimits
import Foundation

struct Limits: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Posted speed limits from OpenStreetMap, for scoring (docs/speed-limits.md).",
        subcommands: [LimitsImport.self, LimitsStatus.self, LimitsAt.self])
}

struct LimitsImport: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "import",
        abstract: "Read the roads of an OpenStreetMap extract (.osm.pbf, or .osm XML for small areas) into the speed-limit index.",
        discussion: "It replaces the previous index at once when done; a damaged extract leaves it in use. The scorer picks the new one up within a minute, without a restart.")

    @OptionGroup var options: ConfigOption

    @Argument(help: "The extract: region.osm.pbf, or area.osm.")
    var file: String

    func run() throws {
        let config = try loadConfig(options)
        try config.layout.prepare()
        let output = config.layout.roadLimitsIndex
        let started = Date()
        let showProgress = isatty(STDERR_FILENO) == 1
        var lastShown = -1
        let summary: OSMRoadImport.Summary
        do throws(OSMImportError) {
            summary = try OSMRoadImport.run(input: file, output: output) { progress in
                guard showProgress, progress.bytesTotal > 0 else { return }
                let percent = progress.bytesRead * 100 / progress.bytesTotal
                let shown = progress.pass * 1000 + percent
                guard shown != lastShown else { return }
                lastShown = shown
                let bar = String(repeating: "#", count: percent / 4).padding(toLength: 25, withPad: " ", startingAt: 0)
                FileHandle.standardError.write(Data("\rpass \(progress.pass)/\(progress.passes) [\(bar)] \(percent)%".utf8))
            }
        } catch {
            if showProgress { FileHandle.standardError.write(Data("\n".utf8)) }
            FileHandle.standardError.write(Data("drivebus limits import: \(error.description)\n".utf8))
            FileHandle.standardError.write(Data("drivebus limits import: the previous index, if any, stays in use\n".utf8))
            throw ExitCode(1)
        }
        if showProgress { FileHandle.standardError.write(Data("\n".utf8)) }
        let seconds = Date().timeIntervalSince(started)
        let bytes = (try? FileManager.default.attributesOfItem(atPath: output)[.size] as? Int) ?? 0
        let rate = seconds >= 1 ? ", \(Int(Double(summary.roads) / seconds * 60)) roads/min" : ""
        print("""
            imported \(summary.roads) roads (\(summary.tagged) with a maxspeed) as \(summary.written) pieces of \(summary.points) points \
            in \(String(format: "%.1f", seconds)) s\(rate), peak memory \(peakMemoryMB()) MB
            index: \(output) (\(bytes / 1024) KiB)
            """)
        if summary.missingNodes > 0 {
            print("\(summary.missingNodes) node references were not in the extract (roads cut at its border); the roads were split there")
        }
    }

    /// This process's peak resident memory, from /proc.
    private func peakMemoryMB() -> Int {
        guard let status = try? String(contentsOfFile: "/proc/self/status", encoding: .utf8),
              let line = status.split(separator: "\n").first(where: { $0.hasPrefix("VmHWM:") }),
              let kB = Int(line.split(separator: " ").dropFirst().first ?? "")
        else { return 0 }
        return kB / 1024
    }
}

struct LimitsStatus: ParsableCommand {
    static let configuration = CommandConfiguration(commandName: "status", abstract: "Say which speed-limit index is in use.")

    @OptionGroup var options: ConfigOption

    func run() throws {
        let config = try loadConfig(options)
        let path = config.layout.roadLimitsIndex
        guard FileManager.default.fileExists(atPath: path) else {
            print("no speed-limit index: `drivebus limits import region.osm.pbf` makes one")
            return
        }
        let index = try RoadLimitIndex(path: path)
        let s = index.summary
        print("\(path): from \(s.source): \(s.ways) road pieces (\(s.taggedWays) with a maxspeed), \(s.points) points, \(s.bytes / 1024) KiB")
    }
}

struct LimitsAt: ParsableCommand {
    static let configuration = CommandConfiguration(commandName: "at", abstract: "Print the nearest roads to a position and their limits.")

    @OptionGroup var options: ConfigOption

    @Argument(help: "Latitude, degrees.") var lat: Double
    @Argument(help: "Longitude, degrees.") var lon: Double
    @Option(help: "How far to look, metres.") var radius: Double = 30

    func run() throws {
        let config = try loadConfig(options)
        guard abs(lat) <= 90, abs(lon) <= 180 else { throw ValidationError("lat must be within ±90 and lon within ±180") }
        let index = try RoadLimitIndex(path: config.layout.roadLimitsIndex)
        var nearest: [Int: Double] = [:]
        index.forEachSegment(nearLat: lat, lon: lon, radiusM: min(max(radius, 1), 500)) { hit in
            nearest[hit.way] = min(nearest[hit.way] ?? .infinity, hit.distanceM)
        }
        if nearest.isEmpty { print("no road within \(radius) m") }
        for (way, distance) in nearest.sorted(by: { $0.value < $1.value }) {
            let road = index.way(way)
            func text(_ limit: PostedLimit?) -> String {
                switch limit {
                case nil: "not tagged"
                case .unlimited: "none"
                case .kmh(let kmh): "\(kmh.formatted()) km/h"
                }
            }
            let limits = road.forward == road.backward || road.oneway
                ? text(road.forward) : "\(text(road.forward)) forward, \(text(road.backward)) backward"
            print("\(String(format: "%6.1f", distance)) m  \(road.roadClass.osmName)\(road.oneway ? " (one-way)" : ""): \(limits)")
        }
    }
}
