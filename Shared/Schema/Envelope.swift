import Foundation

/// The second frame of every bus message.
/// `{"v":1,"id":UUID,"type":"trip.ended","source":"trips","seq":N,"epoch":BOOT_ID,"time":RFC3339}`
public struct EnvelopeHeader: Codable, Sendable, Equatable {
    public static let version = 1

    public var v: Int
    /// Unique per event. Derived events use an id computed from their inputs, so re-processing
    /// produces the same id and stores deduplicate.
    public var id: String
    /// The topic without its device suffix, e.g. `trip.ended`.
    public var type: String
    /// The publishing service, e.g. `trips`.
    public var source: String
    /// Counts up from 1 with no gaps per (source, epoch).
    public var seq: UInt64
    /// Identifies one run of the publisher; a new epoch restarts `seq`.
    public var epoch: String
    public var time: Date
    /// For a derived event its source keeps: its seq in that service's event journal, which
    /// counts up from 1 with no gaps across restarts, so a follower can replay what it missed.
    public var logSeq: UInt64?

    enum CodingKeys: String, CodingKey {
        case v, id, type, source, seq, epoch, time
        case logSeq = "log_seq"
    }

    public init(
        id: String = UUID().uuidString.lowercased(), type: String, source: String, seq: UInt64, epoch: String, time: Date, logSeq: UInt64? = nil
    ) {
        self.v = Self.version
        self.id = id
        self.type = type
        self.source = source
        self.seq = seq
        self.epoch = epoch
        self.time = time
        self.logSeq = logSeq
    }

    /// Hand-written encoding: the header is on every message and its fields are plain ASCII that
    /// the publisher validated, so no escaping is needed.
    public func encoded() -> [UInt8] {
        var out = [UInt8]()
        write(to: &out)  // which makes room for the whole header at once
        return out
    }

    /// Appends the encoding to `out`.
    public func write(to out: inout [UInt8]) {
        Self.write(v: v, id: .text(id), type: type, source: source, seq: seq, epoch: epoch, time: time, logSeq: logSeq, to: &out)
    }

    /// An id as a header is written with it.
    public enum WrittenID {
        case text(String)
        /// `EventID.make(run:seq:)`'s, written in place without making a `String` of it.
        case numbered(run: UInt64, seq: UInt64)
    }

    /// The encoding of the header of these fields, appended to `out`, for a header that is written
    /// and not kept: a publisher's, into one buffer it reuses for every header. Written in one
    /// growth of `out` (this is on every message).
    public static func write(
        v: Int = version, id: WrittenID, type: String, source: String, seq: UInt64, epoch: String, time: Date, logSeq: UInt64?,
        to out: inout [UInt8]
    ) {
        var (type, source, epoch) = (type, source, epoch)
        let idLength = switch id {
        case .text(let text): text.utf8.count
        case .numbered: EventID.length
        }
        // 75 bytes of names and punctuation, at most 21 + 20 + 20 of numbers, 24 of time.
        let room = 160 + idLength + type.utf8.count + source.utf8.count + epoch.utf8.count
        out.append(addingCapacity: room) { out in
            func literal(_ text: StaticString) {
                out.append(copying: UnsafeRawBufferPointer(start: text.utf8Start, count: text.utf8CodeUnitCount))
            }
            func copy(_ value: inout String) {
                value.withUTF8 { out.append(copying: UnsafeRawBufferPointer($0)) }
            }
            literal(#"{"v":"#)
            out.appendDecimal(Int64(v))
            literal(#","id":""#)
            switch id {
            case .text(var text): copy(&text)
            case .numbered(let run, let seq): EventID.write(run: run, seq: seq, to: &out)
            }
            literal(#"","type":""#)
            copy(&type)
            literal(#"","source":""#)
            copy(&source)
            literal(#"","seq":"#)
            out.appendDecimal(seq)
            literal(#","epoch":""#)
            copy(&epoch)
            literal(#"","time":""#)
            RFC3339.write(time, to: &out)
            out.append(UInt8(ascii: "\""))
            if let logSeq {
                literal(#","log_seq":"#)
                out.appendDecimal(logSeq)
            }
            out.append(UInt8(ascii: "}"))
        }
    }
}

public enum EnvelopeError: Error, Sendable, Equatable, CustomStringConvertible {
    case frameCount(Int)
    case topic(String)
    case header(String)
    case unsupportedVersion(Int)
    case payload(String)

    /// A stable code for logs and metrics.
    public var code: String {
        switch self {
        case .frameCount: "envelope.frame_count"
        case .topic: "envelope.topic"
        case .header: "envelope.header"
        case .unsupportedVersion: "envelope.version"
        case .payload: "envelope.payload"
        }
    }

    public var description: String {
        switch self {
        case .frameCount(let n): "\(code): expected 3 frames [topic, header, payload], got \(n)"
        case .topic(let t): "\(code): topic is not printable ASCII: \(t.debugDescription)"
        case .header(let why): "\(code): \(why)"
        case .unsupportedVersion(let v): "\(code): header v=\(v) is newer than this build understands (1)"
        case .payload(let why): "\(code): \(why)"
        }
    }
}

/// One message on the bus, with its payload still as JSON bytes: consumers decode only the types
/// they handle, and ignore the rest.
public struct BusMessage: Sendable {
    public var topic: String
    public var header: EnvelopeHeader
    public var payload: [UInt8]

    public init(topic: String, header: EnvelopeHeader, payload: [UInt8]) {
        self.topic = topic
        self.header = header
        self.payload = payload
    }

    /// The three frames `[topic, header JSON, payload JSON]`.
    public var frames: [[UInt8]] { [Array(topic.utf8), header.encoded(), payload] }

    public init(frames: [[UInt8]]) throws(EnvelopeError) {
        guard frames.count == 3 else { throw .frameCount(frames.count) }
        let topic = frames[0].withUnsafeBytes { frame in Result { () throws(EnvelopeError) in try Self.topic(frame) } }
        self.init(topic: try topic.get(), header: try Self.header(frames[1]), payload: frames[2])
    }

    /// The topic frame's text: printable ASCII, not empty.
    public static func topic(_ frame: UnsafeRawBufferPointer) throws(EnvelopeError) -> String {
        let bytes = frame.assumingMemoryBound(to: UInt8.self)
        guard !bytes.isEmpty, bytes.allSatisfy({ (0x21...0x7E).contains($0) }) else {
            throw .topic(String(decoding: bytes, as: UTF8.self))
        }
        return String(decoding: bytes, as: UTF8.self)
    }

    /// The header frame's envelope header, of this major version. `knownEpoch`, the epoch of the
    /// last header from the same publisher, is kept rather than made again when it is the same.
    public static func header(_ frame: [UInt8], knownEpoch: String? = nil) throws(EnvelopeError) -> EnvelopeHeader {
        let header: EnvelopeHeader
        do {
            header = try BusJSON.read(whole: frame) { (reader: inout JSONReader) throws(JSONReader.Failure) in
                try EnvelopeHeader(reading: &reader, knownEpoch: knownEpoch)
            }
        } catch {
            throw .header(String(describing: error))
        }
        // Newer minor fields are fine (unknown keys are ignored); a newer major version is not.
        guard header.v == EnvelopeHeader.version else { throw .unsupportedVersion(header.v) }
        return header
    }

    public func decode<T: Decodable & FastJSONDecodable>(_ type: T.Type) throws(EnvelopeError) -> T {
        do {
            return try BusJSON.decode(type, from: payload)
        } catch {
            throw .payload("\(topic): \(error)")
        }
    }

    public func decode<T: Decodable>(_ type: T.Type) throws(EnvelopeError) -> T {
        do {
            return try BusJSON.decode(type, from: payload)
        } catch {
            throw .payload("\(topic): \(error)")
        }
    }

    /// The device id at the end of the topic, for topics that carry one.
    public var device: String? {
        // By bytes: topics are ASCII, and `count` and `dropFirst` on a `String` count characters.
        let topic = topic.utf8, type = header.type.utf8
        guard topic.count > type.count + 1, topic.starts(with: type), topic.dropFirst(type.count).first == UInt8(ascii: ".") else { return nil }
        return String(decoding: topic.dropFirst(type.count + 1), as: UTF8.self)
    }
}

/// Topic spelling: the event type, most general part first, then the device id where there is one.
public enum Topic {
    public static func make(_ type: String, device: String? = nil) -> String {
        guard let device else { return type }
        return "\(type).\(device)"
    }

    /// Event types are dot-separated lowercase words: `fix`, `trip.ended`, `svc.heartbeat`.
    public static func isValidType(_ type: String) -> Bool {
        guard type.utf8.count <= 64 else { return false }
        var previous = UInt8(ascii: ".")  // so that a leading dot is an empty part
        for byte in type.utf8 {
            if byte == UInt8(ascii: ".") {
                if previous == UInt8(ascii: ".") { return false }
            } else if !((0x61...0x7A).contains(byte) || byte == UInt8(ascii: "_")) {
                return false
            }
            previous = byte
        }
        return previous != UInt8(ascii: ".")  // also refuses the empty type
    }
}

/// Device ids match `[A-Za-z0-9_-]{1,64}`, so they are safe in topics, file names and SQL.
public enum DeviceID {
    /// Every fix's device is checked as it is decoded, in every consumer: over the string's
    /// bytes, not through a generic `StringProtocol` call (which looked its metadata up each time).
    public static func isValid(_ id: String) -> Bool {
        var id = id
        return id.withUTF8(isValid(bytes:))
    }

    public static func isValid(_ id: Substring) -> Bool { isValid(String(id)) }

    private static func isValid(bytes: UnsafeBufferPointer<UInt8>) -> Bool {
        guard (1...64).contains(bytes.count) else { return false }
        for byte in bytes {
            let valid = (0x30...0x39).contains(byte) || (0x41...0x5A).contains(byte) || (0x61...0x7A).contains(byte)
                || byte == UInt8(ascii: "_") || byte == UInt8(ascii: "-")
            if !valid { return false }
        }
        return true
    }
}
