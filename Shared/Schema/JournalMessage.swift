import Foundation

/// A message from the ingest journal, live from the bus or replayed.
public struct JournalMessage: Sendable {
    public let seq: UInt64
    public let topic: String
    public let payload: [UInt8]

    public init(seq: UInt64, topic: String, payload: [UInt8]) {
        self.seq = seq
        self.topic = topic
        self.payload = payload
    }

    /// The topic without its device: `fix`, `taxi.checkin`…
    public var type: String {
        JournalTopics.typeIndex(of: topic).map { JournalTopics.types[$0] } ?? topic
    }

    /// The device the topic ends with: `car` in `fix.car`.
    public var device: String? {
        guard let index = JournalTopics.typeIndex(of: topic) else { return nil }
        // By bytes: topics are ASCII, and `dropFirst` on a `String` counts characters.
        return String(decoding: topic.utf8.dropFirst(JournalTopics.prefixes[index].utf8.count), as: UTF8.self)
    }
}

/// What ingest journals, decoded by type: the one conversion from a journal message to the
/// values the cores take.
public enum JournalPayload: Sendable {
    case fix(Fix)
    case motion(MotionSample)
    case transition(ClientTransition)
    case checkin(TaxiCheckin)
    case importFinished(ImportFinished)
    case sessionStarted(SessionStarted)
    case sessionStopped(SessionStopped)
    case visit(Visit)
}

extension JournalPayload {
    /// The time the record holds: a fix's, a motion sample's or a stay's start, an event's; nil
    /// for an import's end, which holds none. What purge and retention go by.
    public var time: Date? {
        switch self {
        case .fix(let fix): fix.time
        case .motion(let sample): sample.start
        case .transition(let transition): transition.time
        case .checkin(let checkin): checkin.time
        case .importFinished: nil
        case .sessionStarted(let session): session.time
        case .sessionStopped(let session): session.time
        case .visit(let visit): visit.start
        }
    }
}

extension JournalMessage {
    /// The payload decoded by its type; nil for a type this build does not know, or a payload
    /// that does not decode (which ingest never journals).
    public var decoded: JournalPayload? {
        switch type {
        case "fix": (try? BusJSON.decode(Fix.self, from: payload)).map(JournalPayload.fix)
        case "motion": (try? BusJSON.decode(MotionSample.self, from: payload)).map(JournalPayload.motion)
        case "client.transition": (try? BusJSON.decode(ClientTransition.self, from: payload)).map(JournalPayload.transition)
        case "taxi.checkin": (try? BusJSON.decode(TaxiCheckin.self, from: payload)).map(JournalPayload.checkin)
        case "import.finished": (try? BusJSON.decode(ImportFinished.self, from: payload)).map(JournalPayload.importFinished)
        case "session.started": (try? BusJSON.decode(SessionStarted.self, from: payload)).map(JournalPayload.sessionStarted)
        case "session.stopped": (try? BusJSON.decode(SessionStopped.self, from: payload)).map(JournalPayload.sessionStopped)
        case "visit": (try? BusJSON.decode(Visit.self, from: payload)).map(JournalPayload.visit)
        default: nil
        }
    }
}

/// Every type ingest journals. A consumer subscribes to all of them, so the journal seqs it sees
/// are contiguous and a gap is unmistakable.
public enum JournalTopics {
    public static let types = ["fix", "motion", "client.transition", "taxi.checkin", "import.finished", "session.started", "session.stopped", "visit"]
    public static let prefixes = types.map { $0 + "." }

    /// Which of `types` a topic is of, compared by bytes (every journal record asks, in every
    /// consumer).
    static func typeIndex(of topic: String) -> Int? {
        prefixes.firstIndex { topic.utf8.starts(with: $0.utf8) }
    }
}

/// An event a core derived, ready for the bus. Its id is computed from its inputs, so that a
/// re-processed journal yields the same ids and stores deduplicate.
public struct DerivedEvent: Sendable {
    public let type: String
    public let device: String?
    public let id: String
    public let payload: [UInt8]

    public init(type: String, device: String?, id: String, payload: some Encodable) throws {
        self.type = type
        self.device = device
        self.id = id
        self.payload = try BusJSON.encode(payload)
    }
}

/// A derived event as a service's event journal keeps it, and as its `events` RPC replays it.
public struct LoggedEvent: Sendable, Equatable {
    /// Its position in its source's event journal.
    public let seq: UInt64
    public let type: String
    public let device: String?
    /// Computed from the event's inputs, so a re-derived event has the same id.
    public let id: String
    /// When it was derived.
    public let time: Date
    public let payload: [UInt8]

    public init(seq: UInt64, type: String, device: String?, id: String, time: Date, payload: [UInt8]) {
        self.seq = seq
        self.type = type
        self.device = device
        self.id = id
        self.time = time
        self.payload = payload
    }

    /// Ids are printable ASCII without quotes or backslashes, as the bus header requires.
    public static func isValidID(_ id: String) -> Bool {
        !id.isEmpty && id.utf8.count <= 256
            && id.utf8.allSatisfy { (0x21...0x7E).contains($0) && $0 != UInt8(ascii: "\"") && $0 != UInt8(ascii: "\\") }
    }

    /// One JSON line. Type, device and id are validated ASCII, and the payload is JSON already.
    public func writeLine(to out: inout [UInt8]) {
        out.append(contentsOf: #"{"seq":"#.utf8)
        out.append(contentsOf: String(seq).utf8)
        out.append(contentsOf: #","type":""#.utf8)
        out.append(contentsOf: type.utf8)
        if let device {
            out.append(contentsOf: #"","device":""#.utf8)
            out.append(contentsOf: device.utf8)
        }
        out.append(contentsOf: #"","id":""#.utf8)
        out.append(contentsOf: id.utf8)
        out.append(contentsOf: #"","time":""#.utf8)
        RFC3339.write(time, to: &out)
        out.append(contentsOf: #"","payload":"#.utf8)
        out.append(contentsOf: payload)
        out.append(contentsOf: "}\n".utf8)
    }

    /// Reads one line as `writeLine` wrote it (without its newline); nil if it is not one.
    /// The payload keeps its bytes: read as it streams, not parsed into a tree and written again
    /// (a trip's event holds its whole track).
    public init?(line: ArraySlice<UInt8>) {
        var seq: UInt64?, type: String?, device: String?, id: String?, time: Date?, payload: [UInt8]?
        var reader = JSONReader(Array(line))
        do throws(JSONReader.Failure) {
            try reader.readObject { (reader: inout JSONReader, key: JSONKey) throws(JSONReader.Failure) in
                switch key {
                case "seq": seq = try reader.readUInt64()
                case "type": type = try reader.readString()
                case "device": device = reader.readNull() ? nil : try reader.readString()
                case "id": id = try reader.readString()
                case "time": time = RFC3339.parse(try reader.readString())
                case "payload": payload = try reader.readRawValue()
                default: try reader.skipValue()
                }
            }
            try reader.finish()
        } catch {
            return nil
        }
        guard let seq, seq >= 1, let type, let id, let time, let payload else { return nil }
        self.init(seq: seq, type: type, device: device, id: id, time: time, payload: payload)
    }

    /// The bus topic it was published on.
    public var topic: String { Topic.make(type, device: device) }

    /// The type of a purged event's stand-in (`EventJournal.remove`). Followers skip it.
    public static let removedType = "removed"
}

/// Cores leave their configuration out of their checkpoints: a checkpoint holds state only, so
/// today's config always wins and no setting (or secret) is written to disk twice. The decoder
/// hands the configuration back in through its `userInfo`.
public enum CheckpointConfiguration {
    public static func key<Configuration>(for type: Configuration.Type) -> CodingUserInfoKey {
        CodingUserInfoKey(rawValue: "drivebus.configuration.\(String(reflecting: type))")!
    }

    /// The configuration the decoder was given for `type`; decoding fails without one.
    public static func read<Configuration>(_ type: Configuration.Type, from decoder: any Decoder) throws -> Configuration {
        guard let configuration = decoder.userInfo[key(for: type)] as? Configuration else {
            throw DecodingError.dataCorrupted(DecodingError.Context(
                codingPath: decoder.codingPath, debugDescription: "decode with userInfo[CheckpointConfiguration.key(for: \(type).self)] set"))
        }
        return configuration
    }

    /// `userInfo` for a decoder of checkpoints that need these configurations.
    public static func userInfo<each Configuration: Sendable>(_ configurations: repeat each Configuration) -> [CodingUserInfoKey: any Sendable] {
        var info: [CodingUserInfoKey: any Sendable] = [:]
        for configuration in repeat each configurations {
            info[key(for: type(of: configuration))] = configuration
        }
        return info
    }
}

/// Journal records carried together, each `{"seq":…,"topic":…,"payload":…}`: the `messages` of
/// a replay page, and the bus's `journal.page`, where ingest publishes what each commit added.
/// Journal followers take pages instead of a message per record: a batch of a hundred fixes is
/// then a message or two for the broker and every consumer to pass on, not a hundred
/// (docs/events.md). The payloads are JSON already and go in and out as their bytes.
public enum JournalPage {
    /// The bus type of a page of live records; its `log_seq` is the page's first record's seq.
    public static let type = "journal.page"
    /// A live page holds records up to this many bytes (a larger record goes alone). The bus's
    /// queues count messages, not bytes, so this bounds what a lagging follower's queue holds.
    /// 32 KB holds a batch of a hundred fixes from a phone in one page: at 16 KB it took two,
    /// and every message costs the bus and each follower the same whatever it holds (the batched
    /// system ran 84,212 → 90,449 fixes/s, medians of three alternating; README).
    public static let maxBytes = 32 * 1024

    /// A live page's payload: `{"messages":[…]}`.
    public struct Builder {
        private var bytes: [UInt8] = []
        private var firstSeq: UInt64?

        public init() {}

        private var isEmpty: Bool { firstSeq == nil }

        /// Whether `payloadBytes` more would take a non-empty page past `maxBytes`.
        public func isFull(adding payloadBytes: Int) -> Bool {
            !isEmpty && bytes.count + payloadBytes + 64 > JournalPage.maxBytes
        }

        public mutating func append(seq: UInt64, topic: String, payload: [UInt8]) {
            if firstSeq == nil {
                firstSeq = seq
                bytes.reserveCapacity(min(JournalPage.maxBytes, payload.count * 2 + 64))
                bytes += #"{"messages":["#.utf8
            } else {
                bytes.append(UInt8(ascii: ","))
            }
            JournalPage.appendElement(seq: seq, topic: topic, payload: payload, to: &bytes)
        }

        /// The finished payload and its first seq; the builder is empty again after.
        public mutating func take() -> (firstSeq: UInt64, payload: [UInt8])? {
            guard let firstSeq else { return nil }
            bytes += "]}".utf8
            defer { self = Builder() }
            return (firstSeq, bytes)
        }
    }

    /// Appends one element. Topics are printable ASCII without quotes (`Topic`), so they go in
    /// without escaping. `payload_bytes` frames the payload (an object), so that a reader takes
    /// it without scanning it: every consumer decodes it anyway.
    public static func appendElement(seq: UInt64, topic: String, payload: [UInt8], to out: inout [UInt8]) {
        out += #"{"seq":"#.utf8
        out.appendDecimal(seq)
        out += #","topic":""#.utf8
        out += topic.utf8
        out += #"","payload_bytes":"#.utf8
        out.appendDecimal(UInt64(payload.count))
        out += #","payload":"#.utf8
        out += payload
        out.append(UInt8(ascii: "}"))
    }

    /// Reads one element; nil for one that lacks a part. A payload framed by `payload_bytes`
    /// is taken as framed (ingest wrote both; a count that lands inside the payload makes the
    /// page fail to read, and a follower replays it); one whose frame does not fit, or that has
    /// none, is read through.
    public static func readElement(_ reader: inout JSONReader) throws(JSONReader.Failure) -> JournalMessage? {
        let start = reader.offset
        if let message = readElementAsWritten(&reader) { return message }
        reader.rewind(to: start)
        var seq: UInt64?, topic: String?, payload: [UInt8]?, payloadBytes: UInt64?
        try reader.readObject { (reader: inout JSONReader, key: JSONKey) throws(JSONReader.Failure) in
            switch key {
            case "seq": seq = try reader.readUInt64()
            case "topic": topic = try reader.readString()
            case "payload_bytes": payloadBytes = try reader.readUInt64()
            case "payload":
                // A frame that does not fit throws before the reader moves.
                if let payloadBytes, payloadBytes <= UInt64(Int.max), let framed = try? reader.readRawObject(byteCount: Int(payloadBytes)) {
                    payload = framed
                } else {
                    payload = try reader.readRawValue()
                }
            default: try reader.skipValue()
            }
        }
        guard let seq, let topic, let payload else { return nil }
        return JournalMessage(seq: seq, topic: topic, payload: payload)
    }

    /// Reads an element laid out as `appendElement` writes it, each key one comparison of bytes
    /// (as `Fix(readingAsWritten:)` reads a fix); nil for anything else, which `readElement` then
    /// reads the general way.
    private static func readElementAsWritten(_ reader: inout JSONReader) -> JournalMessage? {
        guard reader.take(#"{"seq":"#), let seq = try? reader.readUInt64(),
              reader.take(#","topic":"#), let topic = try? reader.readString(),
              reader.take(#","payload_bytes":"#), let count = try? reader.readUInt64(), count <= UInt64(Int.max),
              reader.take(#","payload":"#), let payload = try? reader.readRawObject(byteCount: Int(count)),
              reader.take("}")
        else { return nil }
        return JournalMessage(seq: seq, topic: topic, payload: payload)
    }

    /// The journal records a live bus message carries: none for one that is not a page of
    /// ingest's (only ingest writes the journal; anything else on this topic is not journal
    /// data); an error for a page that cannot be read.
    public static func records(in message: BusMessage) throws(JSONReader.Failure) -> [JournalMessage] {
        guard message.header.source == "ingest", message.topic == type else { return [] }
        return try decode(message.payload)
    }

    /// The records of a live page's payload, in its order.
    public static func decode(_ bytes: [UInt8]) throws(JSONReader.Failure) -> [JournalMessage] {
        var messages: [JournalMessage] = []
        var reader = JSONReader(bytes)
        try reader.readObject { (reader: inout JSONReader, key: JSONKey) throws(JSONReader.Failure) in
            switch key {
            case "messages": try reader.readArray { (reader: inout JSONReader) throws(JSONReader.Failure) in
                if let message = try readElement(&reader) { messages.append(message) }
            }
            default: try reader.skipValue()
            }
        }
        try reader.finish()
        return messages
    }
}
