import DrivebusRoadLimits
import DrivebusTrackFormats
import Foundation

/// Reads the roads of an OpenStreetMap extract and writes a speed-limit index.
///
/// A PBF is read in two passes so that memory follows the roads, not the extract: the first
/// keeps the ways with a `highway` for cars (their tags and node ids), the second keeps the
/// coordinates of just those nodes. About 16 bytes per road node at the peak, whatever else the
/// extract holds. OSM XML (for small areas) is read in one pass and keeps every node.
public enum OSMRoadImport {
    public struct Progress: Sendable, Equatable {
        public var pass: Int
        public var passes: Int
        public var bytesRead: Int
        public var bytesTotal: Int
    }

    public struct Summary: Sendable, Equatable {
        /// Ways with a `highway` for cars.
        public var roads = 0
        /// Of those, with a `maxspeed` (either direction).
        public var tagged = 0
        /// Road pieces written (a road missing some of its nodes is split at them).
        public var written = 0
        public var points = 0
        /// Node ids that roads use and the extract does not hold (cut at its border).
        public var missingNodes = 0
    }

    /// Imports `input` (`.osm.pbf`, or `.osm` XML) into the index at `output`, replacing it
    /// atomically only once the whole extract has been read: a damaged extract leaves the
    /// previous index in use.
    public static func run(
        input: String, output: String, progress: (Progress) -> Void = { _ in }
    ) throws(OSMImportError) -> Summary {
        var roads = Roads()
        if try isXML(input) {
            try readXML(input, into: &roads, progress: progress)
        } else {
            try readPBF(input, into: &roads, progress: progress)
        }
        var builder = RoadIndexBuilder()
        var summary = Summary(roads: roads.records.count, tagged: roads.records.filter { $0.road.isTagged }.count)
        do {
            summary.missingNodes = try roads.build(into: &builder)
            // The node ids and coordinates are in the builder now: free them before the cells.
            roads = Roads()
            summary.written = builder.wayCount
            summary.points = builder.pointCount
            try builder.write(to: output, source: URL(fileURLWithPath: input).lastPathComponent)
        } catch {
            throw .index(error.description)
        }
        return summary
    }

    private static func isXML(_ path: String) throws(OSMImportError) -> Bool {
        guard let handle = FileHandle(forReadingAtPath: path) else { throw .io(path: path, reason: "cannot be opened") }
        defer { try? handle.close() }
        let head = (try? handle.read(upToCount: 64)) ?? Data()
        return head.first(where: { ![0x20, 0x09, 0x0A, 0x0D, 0xEF, 0xBB, 0xBF].contains($0) }) == UInt8(ascii: "<")
    }

    // MARK: What both formats collect

    /// The roads kept so far: their tags' meaning and their node ids, then the nodes' coordinates.
    struct Roads {
        var records: [(road: RoadWay, reversed: Bool)] = []
        var refStarts: [Int] = [0]
        var refs: [Int64] = []
        /// Sorted unique node ids that the roads use, and their coordinates (Int32.min: not seen).
        var nodeIDs: [Int64] = []
        var latE7: [Int32] = []
        var lonE7: [Int32] = []

        mutating func add(_ road: (road: RoadWay, reversed: Bool), refs wayRefs: [Int64]) {
            records.append(road)
            refs += wayRefs
            refStarts.append(refs.count)
        }

        mutating func prepareNodes() {
            // Sorted and deduplicated in place: no hash set of every node id.
            nodeIDs = refs.sorted()
            var kept = 0
            for id in nodeIDs where kept == 0 || nodeIDs[kept - 1] != id {
                nodeIDs[kept] = id
                kept += 1
            }
            // A copy of the right size: the sorted copy of every reference is twice as big.
            nodeIDs = Array(nodeIDs[..<kept])
            latE7 = [Int32](repeating: .min, count: nodeIDs.count)
            lonE7 = latE7
        }

        /// Keeps a node's coordinates if a road uses it.
        @inline(__always)
        mutating func offer(id: Int64, latE7 lat: Int32, lonE7 lon: Int32) {
            // A position off the globe is damage: the node counts as missing.
            guard abs(Int(lat)) <= 900_000_000, abs(Int(lon)) <= 1_800_000_000, let k = slot(id) else { return }
            latE7[k] = lat
            lonE7[k] = lon
        }

        func slot(_ id: Int64) -> Int? {
            var low = 0, high = nodeIDs.count
            while low < high {
                let mid = (low + high) / 2
                if nodeIDs[mid] < id { low = mid + 1 } else { high = mid }
            }
            return low < nodeIDs.count && nodeIDs[low] == id ? low : nil
        }

        /// Adds every road to the index, split where a node is missing; returns how many node
        /// references were missing.
        mutating func build(into builder: inout RoadIndexBuilder) throws(RoadIndexError) -> Int {
            var missing = 0
            builder.reserveCapacity(points: refs.count, ways: records.count)
            var lats: [Int32] = [], lons: [Int32] = []
            func flush(_ record: (road: RoadWay, reversed: Bool)) throws(RoadIndexError) {
                if lats.count >= 2 {
                    if record.reversed {
                        lats.reverse()
                        lons.reverse()
                    }
                    try builder.add(record.road, latE7: lats, lonE7: lons)
                }
                lats.removeAll(keepingCapacity: true)
                lons.removeAll(keepingCapacity: true)
            }
            for (w, record) in records.enumerated() {
                for r in refStarts[w]..<refStarts[w + 1] {
                    if let k = slot(refs[r]), latE7[k] != .min {
                        lats.append(latE7[k])
                        lons.append(lonE7[k])
                    } else {
                        missing += 1
                        try flush(record)
                    }
                }
                try flush(record)
            }
            return missing
        }
    }

    /// Builds the tag lookup for one way from key/value strings.
    static let wantedKeys: Set<String> = ["highway", "maxspeed", "maxspeed:forward", "maxspeed:backward", "oneway", "junction", "area"]

    // MARK: PBF

    /// `HistoricalInformation` (a full-history `.osh.pbf`) is not among them: every old version
    /// of a road would be read as a road of its own.
    static let readableFeatures: Set<String> = ["OsmSchema-V0.6", "DenseNodes"]

    private static func readPBF(_ path: String, into roads: inout Roads, progress: (Progress) -> Void) throws(OSMImportError) {
        // Pass 1: the roads.
        var blocks = try PBFBlocks(path: path)
        defer { blocks.close() }
        var sawHeader = false
        while let block = try blocks.next() {
            progress(Progress(pass: 1, passes: 2, bytesRead: blocks.offset, bytesTotal: blocks.size))
            let corrupt = { (reason: String) in
                OSMImportError.corruptBlock(path: path, block: block.number, offset: block.offset, reason: reason)
            }
            if block.type == "OSMHeader" {
                let header = try PBFBlocks.decode(Drivebus_Osmpbf_HeaderBlock.self, block.data) { corrupt("header: \($0)") }
                for feature in header.requiredFeatures where !readableFeatures.contains(feature) {
                    throw .unsupported(path: path, reason: "the file requires the feature \(feature)")
                }
                sawHeader = true
                continue
            }
            guard block.type == "OSMData" else { continue }
            guard sawHeader else { throw corrupt("data before the file's header: not an OSM PBF file") }
            let ways = try PBFBlocks.decode(Drivebus_Osmpbf_WayBlock.self, block.data, or: corrupt)
            let strings = ways.stringtable.s
            var wanted: [UInt32: String] = [:]
            for (i, string) in strings.enumerated() where string.count <= 17 {
                let key = String(decoding: string, as: UTF8.self)
                if wantedKeys.contains(key) { wanted[UInt32(i)] = key }
            }
            guard let highway = wanted.first(where: { $0.value == "highway" })?.key else { continue }
            for group in ways.primitivegroup {
                for way in group.ways where way.keys.contains(highway) {
                    guard way.keys.count == way.vals.count else { throw corrupt("way \(way.id): keys and values differ in number") }
                    var tags: [String: String] = [:]
                    for (key, value) in zip(way.keys, way.vals) {
                        guard let name = wanted[key] else { continue }
                        guard Int(value) < strings.count else { throw corrupt("way \(way.id): tag value \(value) is not in the string table") }
                        tags[name] = String(decoding: strings[Int(value)], as: UTF8.self)
                    }
                    guard let road = OSMRoadTags.road({ tags[$0] }) else { continue }
                    var id: Int64 = 0
                    roads.add(road, refs: way.refs.map { delta in id &+= delta; return id })
                }
            }
        }
        guard sawHeader else { throw .corruptBlock(path: path, block: 1, offset: 0, reason: "no OSMHeader block: not an OSM PBF file") }

        // Pass 2: the coordinates of the roads' nodes.
        roads.prepareNodes()
        var second = try PBFBlocks(path: path)
        defer { second.close() }
        while let block = try second.next() {
            progress(Progress(pass: 2, passes: 2, bytesRead: second.offset, bytesTotal: second.size))
            guard block.type == "OSMData" else { continue }
            let nodes = try PBFBlocks.decode(Drivebus_Osmpbf_NodeBlock.self, block.data) {
                .corruptBlock(path: path, block: block.number, offset: block.offset, reason: $0)
            }
            let granularity = Int64(nodes.granularity), latOffset = nodes.latOffset, lonOffset = nodes.lonOffset
            // Nanodegrees to 1e-7 degrees.
            func e7(_ offset: Int64, _ value: Int64) -> Int32 {
                Int32(clamping: (offset &+ granularity &* value) / 100)
            }
            for group in nodes.primitivegroup {
                for node in group.nodes {
                    roads.offer(id: node.id, latE7: e7(latOffset, node.lat), lonE7: e7(lonOffset, node.lon))
                }
                guard group.hasDense else { continue }
                let dense = group.dense
                guard dense.id.count == dense.lat.count, dense.id.count == dense.lon.count else {
                    throw .corruptBlock(path: path, block: block.number, offset: block.offset, reason: "dense nodes: ids and coordinates differ in number")
                }
                var id: Int64 = 0, lat: Int64 = 0, lon: Int64 = 0
                for i in dense.id.indices {
                    id &+= dense.id[i]
                    lat &+= dense.lat[i]
                    lon &+= dense.lon[i]
                    roads.offer(id: id, latE7: e7(latOffset, lat), lonE7: e7(lonOffset, lon))
                }
            }
        }
    }

    // MARK: XML

    private static func readXML(_ path: String, into roads: inout Roads, progress: (Progress) -> Void) throws(OSMImportError) {
        let source: FileByteSource
        do { source = try FileByteSource(path: path) } catch { throw .io(path: path, reason: error.description) }
        let reader = XMLPullReader(source: source)
        var nodes: [Int64: (Int32, Int32)] = [:]
        var inWay = false
        var wayRefs: [Int64] = []
        var tags: [String: String] = [:]
        var sawRoot = false
        do {
            while let node = try reader.next() {
                switch node {
                case .start where reader.depth == 1:
                    guard reader.isNamed("osm") else { throw OSMImportError.xml(path: path, line: reader.line, reason: "not an OSM file (root <\(reader.localName)>)") }
                    sawRoot = true
                case .start where reader.isNamed("node"):
                    guard let id = try reader.attribute("id").flatMap({ Int64($0) }),
                          let lat = try reader.attribute("lat").flatMap({ Double($0) }), abs(lat) <= 90,
                          let lon = try reader.attribute("lon").flatMap({ Double($0) }), abs(lon) <= 180
                    else { continue }  // a deleted node in a change file has no position
                    nodes[id] = (Int32((lat * 1e7).rounded()), Int32((lon * 1e7).rounded()))
                case .start where reader.isNamed("way"):
                    inWay = true
                    wayRefs.removeAll(keepingCapacity: true)
                    tags.removeAll(keepingCapacity: true)
                case .start where inWay && reader.isNamed("nd"):
                    guard let ref = try reader.attribute("ref").flatMap({ Int64($0) }) else {
                        throw OSMImportError.xml(path: path, line: reader.line, reason: "<nd> without a numeric ref")
                    }
                    wayRefs.append(ref)
                case .start where inWay && reader.isNamed("tag"):
                    if let key = try reader.attribute("k"), wantedKeys.contains(key) { tags[key] = try reader.attribute("v") }
                case .end where reader.isNamed("way"):
                    inWay = false
                    if let road = OSMRoadTags.road({ tags[$0] }) { roads.add(road, refs: wayRefs) }
                default:
                    break
                }
            }
        } catch let error as XMLReadError {
            throw .xml(path: path, line: error.line, reason: error.message)
        } catch let error as OSMImportError {
            throw error
        } catch {
            throw .io(path: path, reason: "\(error)")
        }
        guard sawRoot else { throw .xml(path: path, line: 1, reason: "not an OSM file") }
        progress(Progress(pass: 1, passes: 1, bytesRead: source.size ?? 0, bytesTotal: source.size ?? 0))
        roads.prepareNodes()
        for (k, id) in roads.nodeIDs.enumerated() {
            if let (lat, lon) = nodes[id] {
                roads.latE7[k] = lat
                roads.lonE7[k] = lon
            }
        }
    }
}
