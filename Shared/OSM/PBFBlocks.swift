import CLibZ
import Foundation
import SwiftProtobuf

#if canImport(Glibc)
import Glibc
#endif

public enum OSMImportError: Error, Equatable, CustomStringConvertible {
    case io(path: String, reason: String)
    /// A damaged or truncated PBF: `block` is the 1-based number of the file block, `offset`
    /// where it starts in the file.
    case corruptBlock(path: String, block: Int, offset: Int, reason: String)
    /// A well-formed file this reader cannot read (a compression or a required feature).
    case unsupported(path: String, reason: String)
    /// An OSM XML file that is not well-formed, or not OSM.
    case xml(path: String, line: Int, reason: String)
    case index(String)

    public var description: String {
        switch self {
        case .io(let path, let reason): "\(path): \(reason)"
        case .corruptBlock(let path, let block, let offset, let reason): "\(path): block \(block) (at byte \(offset)) is damaged: \(reason)"
        case .unsupported(let path, let reason): "\(path): \(reason)"
        case .xml(let path, let line, let reason): "\(path): line \(line): \(reason)"
        case .index(let reason): reason
        }
    }
}

/// The blocks of an `.osm.pbf` file, read one at a time and inflated: a 4-byte big-endian size,
/// a `BlobHeader`, then a `Blob` of that header's size.
struct PBFBlocks {
    struct Block {
        var number: Int
        var offset: Int
        var type: String
        var data: Data
    }

    // The format's own limits: a header of at most 64 KiB, a block of at most 32 MiB.
    static let maxHeader = 64 * 1024
    static let maxBlob = 32 * 1024 * 1024

    let path: String
    let size: Int
    private let fd: Int32
    private(set) var offset = 0
    private var number = 0

    init(path: String) throws(OSMImportError) {
        self.path = path
        fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { throw .io(path: path, reason: String(cString: strerror(errno))) }
        var info = stat()
        fstat(fd, &info)
        size = Int(info.st_size)
    }

    func close() { _ = Glibc.close(fd) }

    /// Decodes one message of the format, or throws `failure` with what swift-protobuf said.
    /// `partial` for the block views, which lack the parts of a block a pass does not read.
    static func decode<M: SwiftProtobuf.Message>(
        _: M.Type, _ bytes: some ContiguousBytes, partial: Bool = true, or failure: (String) -> OSMImportError
    ) throws(OSMImportError) -> M {
        do {
            return try M(serializedBytes: bytes, partial: partial, options: decoding)
        } catch {
            throw failure("\(error)")
        }
    }

    static let decoding: BinaryDecodingOptions = {
        var options = BinaryDecodingOptions()
        options.discardUnknownFields = true
        return options
    }()

    /// The next block, inflated, or nil at the end of the file.
    mutating func next() throws(OSMImportError) -> Block? {
        let start = offset
        number += 1
        let corrupt = { [path, number] (reason: String) in OSMImportError.corruptBlock(path: path, block: number, offset: start, reason: reason) }
        guard let sizeBytes = try read(4) else {
            if offset == start { return nil }  // the end of the file, between blocks
            throw corrupt("the file ends inside the block's size")
        }
        let headerSize = sizeBytes.reduce(0) { $0 << 8 | Int($1) }
        guard headerSize > 0, headerSize <= Self.maxHeader else { throw corrupt("header size \(headerSize)") }
        guard let headerBytes = try read(headerSize) else { throw corrupt("the file ends inside the block header") }
        let header = try Self.decode(Drivebus_Osmpbf_BlobHeader.self, headerBytes, partial: false) { corrupt("block header: \($0)") }
        let blobSize = Int(header.datasize)
        guard blobSize > 0, blobSize <= Self.maxBlob else { throw corrupt("block size \(blobSize)") }
        guard let blobBytes = try read(blobSize) else { throw corrupt("the file ends inside the block") }
        let blob = try Self.decode(Drivebus_Osmpbf_Blob.self, blobBytes, partial: false) { corrupt("block: \($0)") }
        let data: Data
        if blob.hasRaw {
            data = blob.raw
        } else if blob.hasZlibData {
            let rawSize = Int(blob.rawSize)
            guard rawSize > 0, rawSize <= Self.maxBlob else { throw corrupt("uncompressed size \(rawSize)") }
            var out = Data(count: rawSize)
            var outSize = uLongf(rawSize)
            let status = out.withUnsafeMutableBytes { o in
                blob.zlibData.withUnsafeBytes { i in
                    uncompress(
                        o.baseAddress!.assumingMemoryBound(to: Bytef.self), &outSize,
                        i.baseAddress?.assumingMemoryBound(to: Bytef.self), uLong(i.count))
                }
            }
            guard status == Z_OK, Int(outSize) == rawSize else { throw corrupt("zlib data does not inflate (status \(status))") }
            data = out
        } else if blob.hasLzmaData || blob.hasZstdData || blob.hasLz4Data {
            throw .unsupported(path: path, reason: "block \(number) uses a compression other than zlib; convert with `osmium cat -o out.osm.pbf in.osm.pbf`")
        } else {
            throw corrupt("no data")
        }
        return Block(number: number, offset: start, type: header.type, data: data)
    }

    /// Exactly `count` bytes, or nil when the file ends first (the caller names the part).
    private mutating func read(_ count: Int) throws(OSMImportError) -> [UInt8]? {
        var bytes = [UInt8](repeating: 0, count: count)
        var got = 0
        while got < count {
            let n = bytes.withUnsafeMutableBytes { Glibc.read(fd, $0.baseAddress! + got, count - got) }
            if n < 0 {
                if errno == EINTR { continue }
                throw .io(path: path, reason: String(cString: strerror(errno)))
            }
            if n == 0 { break }
            got += n
        }
        offset += got
        return got == count ? bytes : nil
    }
}
