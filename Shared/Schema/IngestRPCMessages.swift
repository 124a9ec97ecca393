import Foundation

/// The requests and replies of ingest's RPC socket (`ipc://RUN/ingest.rpc`), shared by ingest and
/// the tools that call it (`drivebus import`, `drivebus checkin`, the followers' replay).
public enum IngestRPCMessages {
    /// `replay`: journal records from `from_seq` on.
    public struct Replay: Codable, Sendable {
        public var op = "replay"
        public var fromSeq: UInt64
        public var limit: Int?
        enum CodingKeys: String, CodingKey {
            case op
            case fromSeq = "from_seq"
            case limit
        }
        public init(fromSeq: UInt64, limit: Int?) {
            self.fromSeq = fromSeq
            self.limit = limit
        }
    }

    /// `purge`: a device's fixes, motion samples, transitions and stays between two times
    /// taken out of the journal (docs/data.md). Unless `resend_ok`, a purged record sent again
    /// is still a duplicate.
    public struct Purge: Codable, Sendable {
        public var op = "purge"
        public var device: String
        public var from: Date
        public var to: Date
        public var resendOK: Bool
        enum CodingKeys: String, CodingKey {
            case op, device, from, to
            case resendOK = "resend_ok"
        }
        public init(device: String, from: Date, to: Date, resendOK: Bool) {
            self.device = device
            self.from = from
            self.to = to
            self.resendOK = resendOK
        }
    }

    /// What `purge` took out of the journal.
    public struct Purged: Codable, Sendable {
        public var records: Int
        public var segments: Int
        public var bytesBefore: Int64
        public var bytesAfter: Int64
        enum CodingKeys: String, CodingKey {
            case records, segments
            case bytesBefore = "bytes_before"
            case bytesAfter = "bytes_after"
        }
        public init(records: Int, segments: Int, bytesBefore: Int64, bytesAfter: Int64) {
            self.records = records
            self.segments = segments
            self.bytesBefore = bytesBefore
            self.bytesAfter = bytesAfter
        }
    }

    /// `import_finished`: a file's import is done, which ends its trips.
    public struct ImportFinished: Codable, Sendable {
        public var op = "import_finished"
        public var device: String
        public var file: String
        public var fixes: Int
        public init(device: String, file: String, fixes: Int) {
            self.device = device
            self.file = file
            self.fixes = fixes
        }
    }

    /// `checkin`: a rider boarded a taxi at `time` (now when absent).
    public struct Checkin: Codable, Sendable {
        public var op = "checkin"
        public var device: String
        public var time: Date?
        public init(device: String, time: Date?) {
            self.device = device
            self.time = time
        }
    }

    /// What `publish`, `checkin` and `import_finished` answer.
    public struct Stored: Codable, Sendable, Equatable {
        public var accepted: Int
        public var duplicates: Int
        public var lastSeq: UInt64
        enum CodingKeys: String, CodingKey {
            case accepted, duplicates
            case lastSeq = "last_seq"
        }
        public init(accepted: Int, duplicates: Int, lastSeq: UInt64) {
            self.accepted = accepted
            self.duplicates = duplicates
            self.lastSeq = lastSeq
        }
    }

    /// `publish_owntracks`: OwnTracks messages that drivebus-mqtt received, each with the device
    /// its topic maps to and its payload as the app sent it.
    public struct PublishOwnTracks: Codable, Sendable {
        public var op = "publish_owntracks"
        public var messages: [Message]

        public struct Message: Codable, Sendable, Equatable {
            public var device: String
            public var payload: String
            public init(device: String, payload: String) {
                self.device = device
                self.payload = payload
            }
        }

        public init(messages: [Message]) { self.messages = messages }
    }

    /// What `publish_owntracks` answers: the records journaled or already there, the messages
    /// that hold nothing to keep (lwt, waypoints…), and each refused message with the reason.
    public struct OwnTracksStored: Codable, Sendable, Equatable {
        public struct Refusal: Codable, Sendable, Equatable {
            public var index: Int
            public var code: String
            public var field: String?
            public var message: String
            public init(index: Int, code: String, field: String?, message: String) {
                self.index = index
                self.code = code
                self.field = field
                self.message = message
            }
        }

        public var accepted: Int
        public var duplicates: Int
        public var ignored: Int
        public var refused: [Refusal]
        public var lastSeq: UInt64
        enum CodingKeys: String, CodingKey {
            case accepted, duplicates, ignored, refused
            case lastSeq = "last_seq"
        }
        public init(accepted: Int, duplicates: Int, ignored: Int, refused: [Refusal], lastSeq: UInt64) {
            self.accepted = accepted
            self.duplicates = duplicates
            self.ignored = ignored
            self.refused = refused
            self.lastSeq = lastSeq
        }
    }
}
