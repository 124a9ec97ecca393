#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// Why the bytes of a track could not be read (the file, not its contents).
public struct ByteSourceError: Error, Sendable, Equatable, CustomStringConvertible {
    public let message: String
    public init(_ message: String) { self.message = message }
    public var description: String { message }
}

/// Where a reader gets its bytes, a piece at a time: a file is never read into memory whole.
public protocol ByteSource: AnyObject {
    /// Fills the start of `buffer` and returns how many bytes it wrote; 0 means the end.
    func read(into buffer: UnsafeMutableRawBufferPointer) throws(ByteSourceError) -> Int
}

/// Bytes already in memory: an HTTP body.
public final class MemoryByteSource: ByteSource {
    private let bytes: [UInt8]
    private var offset = 0

    public init(_ bytes: [UInt8]) { self.bytes = bytes }

    public func read(into buffer: UnsafeMutableRawBufferPointer) throws(ByteSourceError) -> Int {
        let count = min(buffer.count, bytes.count - offset)
        guard count > 0 else { return 0 }
        bytes.withUnsafeBytes { source in
            buffer.copyMemory(from: UnsafeRawBufferPointer(rebasing: source[offset..<(offset + count)]))
        }
        offset += count
        return count
    }
}

/// Chunks handed over one at a time by `next`, which returns `nil` at the end: for bytes that
/// arrive in pieces from somewhere else.
public final class ChunkByteSource: ByteSource {
    private let nextChunk: () throws(ByteSourceError) -> [UInt8]?
    private var chunk: [UInt8] = []
    private var offset = 0
    private var ended = false

    public init(_ next: @escaping () throws(ByteSourceError) -> [UInt8]?) { nextChunk = next }

    public func read(into buffer: UnsafeMutableRawBufferPointer) throws(ByteSourceError) -> Int {
        while offset == chunk.count {
            guard !ended, let next = try nextChunk() else {
                ended = true
                return 0
            }
            chunk = next
            offset = 0
        }
        let count = min(buffer.count, chunk.count - offset)
        chunk.withUnsafeBytes { source in
            buffer.copyMemory(from: UnsafeRawBufferPointer(rebasing: source[offset..<(offset + count)]))
        }
        offset += count
        return count
    }
}

/// A file, read with `read(2)` as the reader asks for more.
public final class FileByteSource: ByteSource {
    private let descriptor: Int32
    private let owned: Bool
    /// The file's size when it was opened, if it is a regular file: for progress.
    public let size: Int?

    /// Opens `path` for reading; the descriptor is closed when the source goes away.
    public init(path: String) throws(ByteSourceError) {
        let descriptor = open(path, O_RDONLY | O_CLOEXEC)
        guard descriptor >= 0 else { throw ByteSourceError("cannot open the file: \(Self.reason(errno))") }
        self.descriptor = descriptor
        owned = true
        size = Self.size(of: descriptor)
    }

    /// Reads from a descriptor the caller keeps open (and closes) itself.
    public init(fileDescriptor: Int32) {
        descriptor = fileDescriptor
        owned = false
        size = Self.size(of: fileDescriptor)
    }

    deinit {
        if owned { close(descriptor) }
    }

    public func read(into buffer: UnsafeMutableRawBufferPointer) throws(ByteSourceError) -> Int {
        guard let base = buffer.baseAddress, buffer.count > 0 else { return 0 }
        while true {
            #if canImport(Darwin)
            let count = Darwin.read(descriptor, base, buffer.count)
            #elseif canImport(Musl)
            let count = Musl.read(descriptor, base, buffer.count)
            #else
            let count = Glibc.read(descriptor, base, buffer.count)
            #endif
            if count >= 0 { return count }
            if errno == EINTR { continue }
            throw ByteSourceError("cannot read the file: \(Self.reason(errno))")
        }
    }

    private static func size(of descriptor: Int32) -> Int? {
        var status = stat()
        guard fstat(descriptor, &status) == 0, (status.st_mode & S_IFMT) == S_IFREG else { return nil }
        return Int(status.st_size)
    }

    private static func reason(_ code: Int32) -> String {
        guard let text = strerror(code) else { return "error \(code)" }
        return String(cString: text)
    }
}

/// Reads a source into a growing array, a piece at a time, through one scratch buffer.
final class ChunkedReader {
    let source: ByteSource
    private let scratch: UnsafeMutableRawBufferPointer

    init(_ source: ByteSource, chunk: Int = 64 << 10) {
        self.source = source
        scratch = UnsafeMutableRawBufferPointer.allocate(byteCount: max(1, chunk), alignment: 1)
    }

    deinit { scratch.deallocate() }

    /// Appends the next piece to `bytes`; returns its length, 0 at the end.
    func read(appendingTo bytes: inout [UInt8]) throws(TrackFormatError) -> Int {
        let count: Int
        do { count = max(0, min(scratch.count, try source.read(into: scratch))) } catch {
            throw TrackFormatError(location: "", message: error.message)
        }
        bytes.append(contentsOf: UnsafeRawBufferPointer(rebasing: scratch[..<count]))
        return count
    }
}

/// Counts what passes through, so that a caller can show progress.
final class CountingSource: ByteSource {
    let base: ByteSource
    private(set) var count = 0

    init(_ base: ByteSource) { self.base = base }

    func read(into buffer: UnsafeMutableRawBufferPointer) throws(ByteSourceError) -> Int {
        let read = try base.read(into: buffer)
        count += read
        return read
    }
}
