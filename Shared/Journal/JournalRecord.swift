import DrivebusSchema
import Foundation
import Glibc

/// What the journal stores: one bus message's topic and payload, with `seq` filled in on commit.
public struct JournalRecord: Sendable {
    public typealias Kind = JournalPayload

    public let kind: Kind

    public init(_ kind: Kind) { self.kind = kind }

    public var device: String {
        switch kind {
        case .fix(let fix): fix.device
        case .motion(let sample): sample.device
        case .transition(let transition): transition.device
        case .checkin(let checkin): checkin.device
        case .importFinished(let finished): finished.device
        case .sessionStarted(let session): session.device
        case .sessionStopped(let session): session.device
        case .visit(let visit): visit.device
        }
    }

    /// The event type, which with the device makes the topic.
    public var type: String {
        switch kind {
        case .fix: "fix"
        case .motion: "motion"
        case .transition: "client.transition"
        case .checkin: "taxi.checkin"
        case .importFinished: "import.finished"
        case .sessionStarted: "session.started"
        case .sessionStopped: "session.stopped"
        case .visit: "visit"
        }
    }

    public var topic: String { Topic.make(type, device: device) }

    /// The same record for `device`: parsers work before authentication has named the device.
    public func assigned(to device: String) -> JournalRecord {
        switch kind {
        case .fix(var fix): fix.device = device; return JournalRecord(.fix(fix))
        case .motion(var sample): sample.device = device; return JournalRecord(.motion(sample))
        case .transition(var transition): transition.device = device; return JournalRecord(.transition(transition))
        case .checkin(var checkin): checkin.device = device; return JournalRecord(.checkin(checkin))
        case .importFinished(var finished): finished.device = device; return JournalRecord(.importFinished(finished))
        case .sessionStarted(var session): session.device = device; return JournalRecord(.sessionStarted(session))
        case .sessionStopped(var session): session.device = device; return JournalRecord(.sessionStopped(session))
        case .visit(var visit): visit.device = device; return JournalRecord(.visit(visit))
        }
    }

    func payload(seq: UInt64) -> [UInt8] {
        // Encoding these types cannot fail: their numbers were validated as finite.
        switch kind {
        case .fix(var fix):
            fix.seq = seq
            return BusJSON.encode(fix)
        case .motion(var sample):
            sample.seq = seq
            return try! BusJSON.encode(sample)
        case .transition(var transition):
            transition.seq = seq
            return try! BusJSON.encode(transition)
        case .checkin(var checkin):
            checkin.seq = seq
            return try! BusJSON.encode(checkin)
        case .importFinished(var finished):
            finished.seq = seq
            return try! BusJSON.encode(finished)
        case .sessionStarted(var session):
            // A session is known by the device and the journal seq that started it.
            if session.sessionID.isEmpty { session.sessionID = Self.sessionID(device: session.device, seq: seq) }
            return Self.withSeq(try! BusJSON.encode(session), seq)
        case .sessionStopped(let session):
            return Self.withSeq(try! BusJSON.encode(session), seq)
        case .visit(var visit):
            visit.seq = seq
            return try! BusJSON.encode(visit)
        }
    }

    /// The payload with `seq` written as a placeholder, and where its digits are: a fix or a
    /// motion sample is then numbered by splicing digits in, not encoded again.
    func payloadTemplate() -> (bytes: [UInt8], seqDigits: Range<Int>)? {
        let placeholder = Self.seqPlaceholder
        let bytes: [UInt8]
        switch kind {
        case .fix(var fix):
            fix.seq = placeholder
            bytes = BusJSON.encode(fix)
        case .motion(var sample):
            sample.seq = placeholder
            bytes = try! BusJSON.encode(sample)
        default:
            return nil
        }
        // Strings are escaped, so `"seq":` followed by the placeholder occurs only as the field.
        let start = bytes.withUnsafeBufferPointer { haystack -> Int? in
            Self.seqPlaceholderField.withUnsafeBufferPointer { needle -> Int? in
                guard haystack.count >= needle.count else { return nil }
                for start in 0...(haystack.count - needle.count) where haystack[start] == needle[0] {
                    if memcmp(haystack.baseAddress! + start, needle.baseAddress!, needle.count) == 0 { return start }
                }
                return nil
            }
        }
        guard let start else { return nil }
        return (bytes, (start + 6)..<(start + Self.seqPlaceholderField.count))
    }

    /// `"seq":` and the placeholder, made once rather than formatted again for every record.
    private static let seqPlaceholderField = Array(#""seq":\#(seqPlaceholder)"#.utf8)
    private static let seqPlaceholder = UInt64.max

    public static func sessionID(device: String, seq: UInt64) -> String { "\(device)-\(seq)" }

    /// Adds `"seq":N` to an encoded JSON object: every journaled payload carries its seq.
    static func withSeq(_ object: [UInt8], _ seq: UInt64) -> [UInt8] {
        guard object.count >= 2, object.first == UInt8(ascii: "{") else { return object }
        let rest = object.dropFirst()
        return Array(#"{"seq":\#(seq)"#.utf8) + (rest.first == UInt8(ascii: "}") ? [] : [UInt8(ascii: ",")]) + rest
    }

    var dedupKey: DedupKey? {
        switch kind {
        case .fix(let fix): DedupKey(fix)
        case .motion(let sample): DedupKey(sample)
        case .transition(let transition): DedupKey(transition)
        case .visit(let visit): DedupKey(visit)
        default: nil
        }
    }
}

