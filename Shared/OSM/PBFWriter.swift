import CLibZ
import Foundation
import SwiftProtobuf

/// Writes a minimal `.osm.pbf`: a header, then blocks of dense nodes and blocks of ways, each
/// zlib-compressed. For generated extracts (benchmarks, tests); the import reads it as any other.
public final class PBFWriter {
    private let handle: FileHandle
    private let path: String

    public init(path: String) throws(OSMImportError) {
        guard FileManager.default.createFile(atPath: path, contents: nil), let handle = FileHandle(forWritingAtPath: path) else {
            throw .io(path: path, reason: "cannot be created")
        }
        self.handle = handle
        self.path = path
        var header = Drivebus_Osmpbf_HeaderBlock()
        header.requiredFeatures = ["OsmSchema-V0.6", "DenseNodes"]
        header.writingprogram = "drivebus"
        try write(type: "OSMHeader", header)
    }

    /// One block of nodes, in id order.
    public func writeNodes(ids: [Int64], latE7: [Int32], lonE7: [Int32]) throws(OSMImportError) {
        var dense = Drivebus_Osmpbf_DenseNodes()
        var last = (id: Int64(0), lat: Int64(0), lon: Int64(0))
        for i in ids.indices {
            // Granularity 100 nanodegrees: 1e-7 degrees per unit.
            let current = (ids[i], Int64(latE7[i]), Int64(lonE7[i]))
            dense.id.append(current.0 - last.id)
            dense.lat.append(current.1 - last.lat)
            dense.lon.append(current.2 - last.lon)
            last = current
        }
        var group = Drivebus_Osmpbf_NodeGroup()
        group.dense = dense
        var block = Drivebus_Osmpbf_NodeBlock()
        block.primitivegroup = [group]
        // A PrimitiveBlock must have a string table; the nodes view has none, so an empty one
        // (field 1, length 0) goes in front: fields may come in any order.
        try write(type: "OSMData", block, prefix: [0x0A, 0x00])
    }

    /// One block of ways with their tags.
    public func writeWays(_ ways: [(id: Int64, refs: [Int64], tags: [(String, String)])]) throws(OSMImportError) {
        var strings: [String: UInt32] = ["": 0]
        var table = [Data()]
        func index(_ string: String) -> UInt32 {
            if let known = strings[string] { return known }
            strings[string] = UInt32(table.count)
            table.append(Data(string.utf8))
            return UInt32(table.count - 1)
        }
        var group = Drivebus_Osmpbf_WayGroup()
        for way in ways {
            var out = Drivebus_Osmpbf_Way()
            out.id = way.id
            out.keys = way.tags.map { index($0.0) }
            out.vals = way.tags.map { index($0.1) }
            var previous: Int64 = 0
            out.refs = way.refs.map { ref in defer { previous = ref }; return ref - previous }
            group.ways.append(out)
        }
        var block = Drivebus_Osmpbf_WayBlock()
        block.stringtable.s = table
        block.primitivegroup = [group]
        try write(type: "OSMData", block)
    }

    public func close() { try? handle.close() }

    private func write(type: String, _ message: some SwiftProtobuf.Message, prefix: [UInt8] = []) throws(OSMImportError) {
        do {
            let raw: Data = Data(prefix) + (try message.serializedBytes() as Data)
            var compressed = Data(count: Int(compressBound(uLong(raw.count))))
            var size = uLongf(compressed.count)
            let status = compressed.withUnsafeMutableBytes { out in
                raw.withUnsafeBytes { input in
                    compress2(out.baseAddress!.assumingMemoryBound(to: Bytef.self), &size, input.baseAddress!.assumingMemoryBound(to: Bytef.self), uLong(raw.count), 6)
                }
            }
            guard status == Z_OK else { throw OSMImportError.io(path: path, reason: "zlib status \(status)") }
            var blob = Drivebus_Osmpbf_Blob()
            blob.rawSize = Int32(raw.count)
            blob.zlibData = compressed.prefix(Int(size))
            let blobBytes: Data = try blob.serializedBytes()
            var header = Drivebus_Osmpbf_BlobHeader()
            header.type = type
            header.datasize = Int32(blobBytes.count)
            let headerBytes: Data = try header.serializedBytes()
            var length = UInt32(headerBytes.count).bigEndian
            try handle.write(contentsOf: Data(bytes: &length, count: 4) + headerBytes + blobBytes)
        } catch let error as OSMImportError {
            throw error
        } catch {
            throw .io(path: path, reason: "\(error)")
        }
    }
}
