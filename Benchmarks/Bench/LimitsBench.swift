import ArgumentParser
import DrivebusOSM
import DrivebusRoadLimits
import Foundation

/// `drivebus-bench limits --ways N`: generates an `.osm.pbf` of a city grid with N road ways
/// (8 nodes each, 50 m apart with up to 4 m of seeded jitter, mixed classes and `maxspeed`
/// forms), plus half as many building ways and two unreferenced nodes per road node, as a real
/// extract mixes them; then imports it
/// in this process as `drivebus limits import` does, and reports ways/s, peak RSS and the index's
/// size against the roads' coordinates. Then a drive of `--lookups` noisy fixes along the grid is
/// matched to its roads (`RoadMatcher`, in-core): fixes/s and the share given the right limit.
/// With Debian's osmium-tool installed, `osmium tags-filter w/highway` over the same file is
/// timed as the peer.
struct LimitsBench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "limits", abstract: "Import a generated OSM extract and match a drive to its roads.")

    @Option(help: "Road ways in the generated extract.")
    var ways = 1_000_000

    @Option(help: "Fixes matched to roads.")
    var lookups = 1_000_000

    func run() async throws {
        let dir = NSTemporaryDirectory() + "drivebus-limits-bench-\(ProcessInfo.processInfo.processIdentifier)"
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let extract = dir + "/grid.osm.pbf", output = dir + "/roads.dbrl"
        let grid = Grid(roadWays: ways)
        let generated = try grid.write(to: extract)
        let fileBytes = (try FileManager.default.attributesOfItem(atPath: extract)[.size] as? Int) ?? 0

        let clock = ContinuousClock()
        let started = clock.now
        let summary = try OSMRoadImport.run(input: extract, output: output)
        let elapsed = seconds(clock.now - started)
        // Before the index is mapped: its pages would count as resident once read.
        let peakMB = ImportBench.peakRSSMegabytes() ?? -1
        let index = try RoadLimitIndex(path: output)
        var line: [String: Any] = [
            "name": "limits.import", "file_mb": Double(fileBytes / 10_000) / 100, "ways_in_file": generated.ways,
            "nodes_in_file": generated.nodes, "road_ways": summary.roads, "road_points": summary.points, "seconds": (elapsed * 1000).rounded() / 1000,
            "ways_per_min": Int(Double(generated.ways) / elapsed * 60), "road_ways_per_min": Int(Double(summary.roads) / elapsed * 60),
            "peak_rss_mb": peakMB, "index_bytes": index.summary.bytes,
            "index_vs_coordinates": (Double(index.summary.bytes) / Double(8 * summary.points) * 100).rounded() / 100,
        ]
        if FileManager.default.isExecutableFile(atPath: "/usr/bin/osmium") {
            let peerStart = clock.now
            let peer = Process()
            peer.executableURL = URL(fileURLWithPath: "/usr/bin/osmium")
            peer.arguments = ["tags-filter", "--overwrite", "--no-progress", "-o", dir + "/peer.osm.pbf", extract, "w/highway"]
            try peer.run()
            peer.waitUntilExit()
            let peerSeconds = seconds(clock.now - peerStart)
            line["peer"] = "osmium tags-filter w/highway"
            line["peer_seconds"] = (peerSeconds * 1000).rounded() / 1000
            line["time_vs_peer"] = (elapsed / peerSeconds * 100).rounded() / 100
        }
        report(line)

        // Matching: a drive around the grid's blocks at 1 Hz, 14 m a second, fixes drifting up
        // to 12 m across the street.
        let drive = grid.drive(fixes: lookups)
        var matcher = RoadMatcher()
        var right = 0
        let matchStart = clock.now
        for fix in drive {
            if matcher.match(lat: fix.lat, lon: fix.lon, accuracyM: 10, headingDeg: fix.course, speedMps: 14, in: index)?.limit == fix.limit { right += 1 }
        }
        let matchSeconds = seconds(clock.now - matchStart)
        report([
            "name": "limits.match", "fixes": drive.count, "fixes_per_s": Int(Double(drive.count) / matchSeconds),
            "right_limit_share": (Double(right) / Double(max(drive.count, 1)) * 1000).rounded() / 1000,
        ])
    }
}

/// xorshift64: the same file on every run, without Foundation's generators.
private struct SeededJitter {
    var state: UInt64

    /// A value in −limit…limit.
    mutating func next(_ limit: Int32) -> Int32 {
        state ^= state << 13
        state ^= state >> 7
        state ^= state << 17
        return Int32(truncatingIfNeeded: state % UInt64(2 * limit + 1)) - limit
    }
}

/// A square grid of streets, 50 m between nodes: each row and each column is cut into ways of 8
/// nodes. Streets take their class and limit from their row or column, so a drive knows the
/// limit it should get.
private struct Grid {
    static let spacingM = 50.0
    static let origin = (lat: 48.0, lon: 11.0)
    static let classes: [(highway: String, maxspeed: String?, limit: PostedLimit?)] = [
        ("residential", "30", .kmh(30)), ("residential", nil, nil), ("tertiary", "50", .kmh(50)), ("secondary", "50", .kmh(50)),
        ("primary", "70", .kmh(70)), ("residential", "20 mph", .kmh(32.2)), ("unclassified", "DE:urban", .kmh(50)), ("service", nil, nil),
    ]

    let side: Int
    let dLat = Grid.spacingM / 111_195.08
    let dLon = Grid.spacingM / (111_195.08 * cos(Grid.origin.lat * .pi / 180))

    init(roadWays: Int) {
        // 2 · side · (side − 1) / 7 ways.
        side = max(Int((Double(roadWays) * 3.5).squareRoot()) + 1, 9)
    }

    func nodeID(_ row: Int, _ column: Int) -> Int64 { Int64(1 + 3 * (row * side + column)) }

    /// The file; returns how many ways and nodes it holds.
    func write(to path: String) throws -> (ways: Int, nodes: Int) {
        let writer = try PBFWriter(path: path)
        defer { writer.close() }
        var ids: [Int64] = [], lats: [Int32] = [], lons: [Int32] = []
        func flushNodes() throws {
            try writer.writeNodes(ids: ids, latE7: lats, lonE7: lons)
            ids.removeAll(keepingCapacity: true)
            lats.removeAll(keepingCapacity: true)
            lons.removeAll(keepingCapacity: true)
        }
        // Seeded jitter of up to 4 m on every node, so that coordinate deltas vary as in a real
        // extract and the file is as hard to inflate and decode as one.
        var jitter = SeededJitter(state: 0x5EED)
        for row in 0..<side {
            for column in 0..<side {
                let lat = Int32(((Self.origin.lat + Double(row) * dLat) * 1e7).rounded())
                let lon = Int32(((Self.origin.lon + Double(column) * dLon) * 1e7).rounded())
                // The road node, then two building corners beside it that no road uses.
                for k in 0..<3 {
                    ids.append(nodeID(row, column) + Int64(k))
                    lats.append(lat + Int32(k * 60) + jitter.next(360))
                    lons.append(lon + Int32(k * 90) + jitter.next(540))
                }
                if ids.count >= 8000 { try flushNodes() }
            }
        }
        if !ids.isEmpty { try flushNodes() }

        var wayID: Int64 = 1
        var batch: [(id: Int64, refs: [Int64], tags: [(String, String)])] = []
        var total = 0
        func add(_ refs: [Int64], _ tags: [(String, String)]) throws {
            batch.append((wayID, refs, tags))
            wayID += 1
            total += 1
            if batch.count >= 8000 {
                try writer.writeWays(batch)
                batch.removeAll(keepingCapacity: true)
            }
        }
        for vertical in [false, true] {
            for line in 0..<side {
                let street = Self.classes[line % Self.classes.count]
                var tags = [("highway", street.highway), ("name", "Street \(line)")]
                if let maxspeed = street.maxspeed { tags.append(("maxspeed", maxspeed)) }
                var start = 0
                while start + 7 < side {
                    try add((start...start + 7).map { vertical ? nodeID($0, line) : nodeID(line, $0) }, tags)
                    // A building beside every other road way: a way the import must skip.
                    if start % 14 == 0 {
                        let corner = vertical ? nodeID(start, line) : nodeID(line, start)
                        try add([corner + 1, corner + 2, corner + 4, corner + 1], [("building", "yes")])
                    }
                    start += 7
                }
            }
        }
        if !batch.isEmpty { try writer.writeWays(batch) }
        return (total, 3 * side * side)
    }

    /// A drive around the grid: along a row, then a column, turning at street ends, with the
    /// limit each fix should get.
    func drive(fixes: Int) -> [(lat: Double, lon: Double, course: Double, limit: PostedLimit?)] {
        var out: [(Double, Double, Double, PostedLimit?)] = []
        out.reserveCapacity(fixes)
        var generator = SystemRandomNumberGenerator()
        let usable = (side - 1) / 7 * 7
        var position = (row: 0.0, column: 0.0)
        var vertical = false
        while out.count < fixes {
            // One street at a time: 0.28 of a node spacing a second (14 m/s).
            let line = vertical ? Int(position.column) : Int(position.row)
            let street = Self.classes[line % Self.classes.count]
            let steps = Int.random(in: 20...80, using: &generator)
            for _ in 0..<steps where out.count < fixes {
                if vertical { position.row = min(position.row + 0.28, Double(usable)) } else { position.column = min(position.column + 0.28, Double(usable)) }
                let drift = Double.random(in: -12...12, using: &generator) / Self.spacingM
                let lat = Self.origin.lat + (position.row + (vertical ? 0 : drift)) * dLat
                let lon = Self.origin.lon + (position.column + (vertical ? drift : 0)) * dLon
                out.append((lat, lon, vertical ? 0 : 90, street.limit))
            }
            // Turn onto the nearest crossing street.
            if vertical { position.row = position.row.rounded(); if position.row >= Double(usable) { position.row = 0 } }
            else { position.column = position.column.rounded(); if position.column >= Double(usable) { position.column = 0 } }
            vertical.toggle()
        }
        return out
    }
}
